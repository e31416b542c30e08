"""Division by a run-time size in the kernels' index arithmetic: with 32-bit indices, the launch
passes each size's magic number beside it (`launch.div_magic`) and every lane divides by a multiply
(`_udiv`); 64-bit variants keep `//`. The quotients are exact for every dividend a 32-bit index
takes (`interpret_magic.py`, under Triton's interpreter); the magic numbers are launch ints that
keep a launch in the 32-bit variant and out of the tuning key."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "runtime"))
sys.path.insert(0, str(HERE))
from interpreted import interpreted_report  # noqa: E402

from interpret_magic import DIVISORS  # noqa: E402

from xgbuild.compiler.codegen.launch_abi import Variant  # noqa: E402
from xgbuild.compiler.codegen.templates import emit  # noqa: E402
from xgbuild.compiler.driver import compile_source  # noqa: E402
from xgbuild.tuner.jobs import plan  # noqa: E402

# Heads placed from [B, T, 3, H, DH] into [3, H, B, T, DH]: an element-wise kernel that unravels
# its linear index through four run-time sizes.
PLACE = """extern Tensor[float32, B, T, 3, H, DH] X
def main() {
    return transpose(transpose(X, 1, 3), 0, 2) * 2.0
}
"""


@pytest.fixture(scope="module")
def report() -> dict:
    return interpreted_report(HERE / "interpret_magic.py")


def test_every_quotient_is_exact(report):
    assert set(report) == {str(d) for d in DIVISORS}
    assert all(r["n"] > 250 and r["wrong"] == 0 for r in report.values()), report


def _source(wide: bool) -> str:
    graph = compile_source(PLACE).optimized.main
    (job,), _ = plan(graph, {"B": 2, "T": 5, "H": 3, "DH": 7})
    variant = Variant(wide=wide)
    return emit(job.spec, {"BLOCK": 128}, variant).source


def test_32_bit_indices_divide_by_a_multiply_the_launch_passes():
    src = _source(wide=False)
    head, body = src.split("def xg_", 1)[1].split("\n", 1)
    dims = sorted(set(re.findall(r"_udiv\([^,]+, (d\d+)m, \1s\)", body)))
    assert len(dims) >= 3
    assert all(f"{d}m" in head and f"{d}s" in head for d in dims)
    assert not re.search(r"// d\d+", body) and not re.search(r"% d\d+", body)


def test_the_magic_numbers_are_int32_launch_ints_outside_the_tuning_key():
    from xgbuild.compiler.codegen.launch import div_magic
    from xgbuild.compiler.codegen.launch_abi import INT32_MAX
    for d in (1, 3, 768, 2304, 50257, 2**31 - 1):
        m, s = div_magic(d)
        assert -INT32_MAX - 1 <= m <= INT32_MAX and (d - 1).bit_length() == s
    graph = compile_source(PLACE).optimized.main
    (job,), _ = plan(graph, {"B": 2, "T": 5, "H": 3, "DH": 7})
    assert {"d1m", "d1s"} <= set(job.sizes)
    assert not any(k.endswith(("m", "s")) and k[0] == "d" for k in job.shape_part()["sizes"])
    assert not job.fast_variant({"BLOCK": 128}).wide


def test_64_bit_indices_keep_the_division():
    body = _source(wide=True).split("def xg_", 1)[1]
    assert "_udiv(" not in body
    assert re.search(r"// d\d+", body)
