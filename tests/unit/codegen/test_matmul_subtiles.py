"""Matmul epilogues over column slices of the tile (`SUBTILES`): under Triton's interpreter each
form (a program a tile, persistent, persistent with descriptors) at 2 and 4 slices matches
float64 and raises check mode's flag for a NaN in its last slice; the space gives slices to heavy
epilogues only, never narrower than 16 columns; on sm_90 slicing takes GELU's backward epilogue
from spilling to none."""

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


def test_sliced_gelu_backward_epilogue_does_not_spill_on_sm90(tmp_path):
    """The GELU backward's product (47 epilogue ops) at 128x128 over 8 warps spilled 2.1 KB a
    thread whole; in the space's slices (4 of 16 elements a thread) ptxas spills nothing."""
    import re
    import subprocess

    import triton

    from xgbuild.compiler.codegen.build import compile_emitted
    from xgbuild.compiler.codegen.templates import emit
    from xgbuild.compiler.driver import compile_file
    from xgbuild.compiler.frontend import CheckOptions
    from xgbuild.compiler.frontend.constants import normalize
    from xgbuild.tuner.jobs import plan, tuning_env

    g = compile_file("models/train.xg", CheckOptions(consts=normalize({"L": 1, "D": 64, "H": 2, "T": 32, "B": 2}))).optimized.main
    jobs, _ = plan(g, tuning_env(g, {}))
    job = max((j for j in jobs if j.spec.kind == "matmul"), key=lambda j: len(j.spec.nodes))
    assert epilogue_ops(job.problem) >= 40
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
