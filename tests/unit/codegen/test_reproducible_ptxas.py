"""Bit-identical kernels: Blackwell's ptxas (CUDA 12.9, bundled with Triton 3.6) gave one of two
cubins for the same PTX of a bf16 matmul, run to run, ordering some of its work by heap address;
`build._reproducible_ptxas` makes the programs a compiling process starts run without address-space
randomisation, and the cubin is then the same every time."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
COMPILE = """
import hashlib, sys
from xgbuild.compiler.codegen.launch_abi import Variant
from xgbuild.compiler.codegen.templates import emit
from xgbuild.compiler.driver import compile_source
from xgbuild.tuner.compile_job import compile_job
from xgbuild.tuner.jobs import plan
from xgbuild.tuner.space import default_config
src = "extern Tensor[bfloat16, M, K] A\\nextern Tensor[bfloat16, N, K] W\\ndef main() {\\n    return A @ transpose(W, 0, 1)\\n}\\n"
jobs, _ = plan(compile_source(src, "m.xg").optimized.main, {"M": 128, "N": 64, "K": 32})
job = next(j for j in jobs if j.spec.kind == "matmul")
cfg = default_config(job.problem)
em = emit(job.spec, cfg, Variant.generic())
out = compile_job(em.source, em.name, em.params, em.constexprs, em.div16, em.aligned, 100, cfg["num_warps"], cfg["num_stages"])
print(hashlib.sha256(out["cubin"]).hexdigest())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="address-space randomisation is a Linux personality flag")
def test_programs_started_after_a_compile_run_without_address_randomisation():
    code = ("from xgbuild.compiler.codegen import build\nassert build._reproducible_ptxas()\n"
            "import subprocess\nprint(subprocess.run(['cat', '/proc/self/personality'], capture_output=True, "
            "text=True).stdout)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    assert res.returncode == 0, res.stderr
    assert int(res.stdout.strip(), 16) & 0x0040000


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="address-space randomisation is a Linux personality flag")
def test_a_bf16_matmul_compiles_to_the_same_sm100_cubin_every_time(tmp_path):
    """Six fresh processes, each with an empty Triton cache: one cubin (without the fix, two
    distinct ones came out of most such runs)."""
    procs = []
    for i in range(6):
        env = {**os.environ, "PYTHONPATH": str(REPO), "TRITON_CACHE_DIR": str(tmp_path / f"triton-{i}")}
        procs.append(subprocess.Popen([sys.executable, "-c", COMPILE], stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=env))
    digests = set()
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-2000:]
        digests.add(out.strip().splitlines()[-1])
    assert len(digests) == 1, digests
