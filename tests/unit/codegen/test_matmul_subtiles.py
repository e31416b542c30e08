"""Matmul epilogues over column slices of the tile (`SUBTILES`): under Triton's interpreter each
form (a program a tile, persistent, persistent with descriptors) at 2 and 4 slices matches
float64 and raises check mode's flag for a NaN in its last slice; the space gives slices to heavy
epilogues only, never narrower than 16 columns; on sm_90 a sliced GELU epilogue spills nothing."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "runtime"))
from interpreted import interpreted_report  # noqa: E402

from xgbuild.compiler.codegen.templates.base import Problem  # noqa: E402
from xgbuild.compiler.codegen.templates.matmul import SLICE_ELEMENTS_PER_THREAD, TEMPLATE, epilogue_ops  # noqa: E402
from xgbuild.hw import load_profile  # noqa: E402


@pytest.fixture(scope="module")
def report() -> dict:
    return interpreted_report(HERE / "interpret_subtiles.py")


@pytest.mark.parametrize("form", ["tiles", "persistent", "descriptors"])
@pytest.mark.parametrize("parts", [2, 4])
def test_sliced_epilogue_matches_float64_and_flags_nan(report, form, parts):
    got = report[f"{form} {parts}"]
    assert got["split"], got
    assert got["variants"] == ["tuned"], got
    assert all(err < 1e-5 for err in got["errors"]), got
    assert got["flags"] == {"clean": 0, "nan": 1}, got


def _problem(ops: int) -> Problem:
    m, n, k = 8192, 3072, 768
    return Problem("matmul", "bfloat16", 2.0 * m * n * k + ops * m * n, 1e8, batch=1, m=m, n=n, k=k,
                   elem_bytes=2, b_transposed=True)


def test_space_slices_heavy_epilogues_only():
    hw = load_profile("H100")
    light, heavy = _problem(2), _problem(45)
    assert epilogue_ops(heavy) == pytest.approx(45)
    assert not any("SUBTILES" in c for c in TEMPLATE.full_space(light, hw))
    sliced = [c for c in TEMPLATE.full_space(heavy, hw) if "SUBTILES" in c]
    assert sliced
    for c in TEMPLATE.full_space(heavy, hw):
        parts = c.get("SUBTILES", 1)
        per_thread = c["BLOCK_M"] * c["BLOCK_N"] / (32 * c["num_warps"] * parts)
        assert c["BLOCK_N"] // parts >= 16
        assert per_thread <= SLICE_ELEMENTS_PER_THREAD or c["BLOCK_N"] // parts == 16, c
    big = next(c for c in sliced if (c["BLOCK_M"], c["BLOCK_N"], c["num_warps"]) == (128, 256, 8))
    assert big["SUBTILES"] == 8


def test_sliced_gelu_epilogue_does_not_spill_on_sm90(tmp_path):
    """A product with a bias and a tanh GELU as its epilogue (heavy: over HEAVY_EPILOGUE_OPS, under
    schedule.MAX_EPILOGUE) at 128x128 over 8 warps, in the space's slices (4 of 16 elements a
    thread): ptxas spills nothing. (GELU's 47-op backward epilogue spilled 2.1 KB a thread whole at
    that tile; it is an element-wise kernel of its own now.)"""
    import re
    import subprocess

    import triton

    from xgbuild.compiler.codegen.build import compile_emitted
    from xgbuild.compiler.codegen.schedule import MAX_EPILOGUE
    from xgbuild.compiler.codegen.templates import emit
    from xgbuild.compiler.codegen.templates.matmul import HEAVY_EPILOGUE_OPS
    from xgbuild.compiler.driver import compile_source
    from xgbuild.tuner.jobs import plan, tuning_env

    src = """extern Tensor[bfloat16, 256, 64] X
extern Tensor[bfloat16, 64, 256] W
extern Tensor[float32, 256] B
def main() {
    a = cast(X @ W, float32) + B
    return 0.5 * a * (1.0 + tanh(0.7978845608028654 * (a + 0.044715 * a * a * a)))
}
"""
    g = compile_source(src).optimized.main
    jobs, _ = plan(g, tuning_env(g, {}))
    (job,) = [j for j in jobs if j.spec.kind == "matmul"]
    assert HEAVY_EPILOGUE_OPS <= epilogue_ops(job.problem) <= MAX_EPILOGUE
    sliced = [c for c in TEMPLATE.full_space(job.problem, load_profile("H100"))
              if (c["BLOCK_M"], c["BLOCK_N"], c["BLOCK_K"], c["num_warps"], c["num_stages"]) == (128, 128, 64, 8, 3)
              and "PROGRAMS" not in c]
    assert [c["SUBTILES"] for c in sliced] == [4]
    kernel = compile_emitted(emit(job.spec, sliced[0], job.fast_variant(sliced[0])), 90, 8, 3)
    ptx = tmp_path / "k.ptx"
    ptx.write_text(kernel.asm["ptx"])
    ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    res = subprocess.run([str(ptxas), "-v", "--gpu-name", "sm_90a", str(ptx), "-o", str(tmp_path / "k.o")],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    spills = [int(x) for x in re.findall(r"(\d+) bytes spill stores", res.stderr)]
    assert spills and max(spills) == 0, res.stderr
