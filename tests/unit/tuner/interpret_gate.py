"""The tuner's correctness gate with the real kernels, under Triton's interpreter (CPU): every job of
a program runs its predicted config on the job's own seeded inputs (`JobData`, as a measuring GPU
draws them) and is judged against the job's float64 reference, as a measured build judges each
candidate. Kernels that compute a value the reference takes from outside the
kernel (an arange from the column index, a padding's mask from it, a row value through a reshape)
must agree with it (`gate.agrees`, each output within its dtype's tolerance): on an H200 every
candidate of such jobs failed the gate. Prints, per program,
each job's verdict as JSON. A script, not a test: TRITON_INTERPRET must be set before Triton is
imported, so the test runs it in a fresh process.

    python tests/unit/tuner/interpret_gate.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from xgbuild.runtime import interpret

HERE = Path(__file__).resolve().parent


def verdicts(graph) -> list[dict]:
    from xgbuild.compiler.codegen.build import load_function
    from xgbuild.compiler.codegen.launch import bind, grid_for, holds
    from xgbuild.compiler.codegen.launch_abi import Compiled, KernelPlan, Variant, arguments
    from xgbuild.compiler.codegen.templates import emit
    from xgbuild.dtypes import TORCH_DTYPES
    from xgbuild.tuner.gate import agrees, gate_dtypes
    from xgbuild.tuner.jobs import plan, tuning_env
    from xgbuild.tuner.policy import Policy
    from xgbuild.tuner.tuner import JobData, Tuner
    from xgbuild.build.target import target_profile

    jobs, _ = plan(graph, tuning_env(graph, {}))
    tuner = Tuner(target_profile("H100"), policy=Policy.PREDICT)
    out = []
    for job in jobs:
        if job.spec.kind == "extern":
            continue
        config = tuner.tune(job).config
        data = JobData(job, seed=0)
        value = data.value_fn("cpu")
        binding = job.sites[0][0]
        dtypes = [TORCH_DTYPES[job.graph.node(n).dtype] for n in binding.outputs]
        outs = [torch.full(tuple(job.graph.node(n).shape), float("nan") if dt.is_floating_point else 0, dtype=dt)
                for n, dt in zip(binding.outputs, dtypes)]   # poisoned: an unwritten element fails
        for variant in (job.fast_variant(config), Variant.generic()):
            em = emit(job.spec, config, variant)
            compiled = Compiled(variant, config, em.params, em.div16, (load_function(em), em))
            launch = bind(KernelPlan(job.spec, binding, [compiled]), job.graph, value, outs)
            if holds(compiled, launch, job.spec):
                break
        interpret.launch(compiled, grid_for(compiled, job.spec, launch), arguments(compiled, launch))
        ref = data.reference()
        why = next((w for o, r, d in zip(outs, ref, gate_dtypes(job.spec)) if (w := agrees(o, r, d))), None)
        out.append({"job": job.ident, "kind": job.spec.kind, "ops": [n.op for n in job.spec.nodes], "why": why})
    return out


def main() -> None:
    interpret.enable()
    sys.path.insert(0, str(HERE.parent / "passes"))
    sys.path.insert(0, str(HERE.parent / "codegen"))
    from interpret_row_passes import CROSS_ENTROPY
    from test_pad_products import CROSS_ENTROPY as PADDED

    from xgbuild.compiler.driver import compile_source
    from xgbuild.compiler.passes import pad_products as pp
    report = {"cross_entropy": verdicts(compile_source(CROSS_ENTROPY, "ce.xg").optimized.main)}
    pp.MIN_FLOPS, pp.MIN_DIM = 0, 256           # pad the small head as GPT-2's is padded
    report["padded_head"] = verdicts(compile_source(PADDED, "head.xg").optimized.main)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
