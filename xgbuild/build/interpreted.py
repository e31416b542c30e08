"""The build's check of generated kernels without a GPU: a program's (or graph's) kernels, tuned by
the cost model and emitted as an engine carries them, run under Triton's interpreter and compared
with the float64 CPU reference. TRITON_INTERPRET must be on before Triton is imported: run it as
`python -m xgbuild.build.interpreted FILE.xg NAME=SIZE ...`, or call `runtime.interpret.enable()`
first in a fresh process.
"""

from __future__ import annotations

from typing import Any


def check_program(path: str, dims: dict[str, int], target: str = "H100", seed: int = 0) -> list[dict]:
    """Runs a program's kernels (tuned variants and generic ones, as an engine carries them) under the
    interpreter at `dims` on two input sets (the second replayed where it can be), and compares
    every output with the float64 CPU reference."""
    from ..compiler.driver import compile_file
    from ..runtime.tensor_io import random_inputs
    from .package import engine_of

    compiled = compile_file(path)
    engine = engine_of(compiled)
    sig = {s["name"]: (s["dtype"], tuple(dims.get(d, 16) if isinstance(d, str) else d for d in s["shape"]))
           for s in engine.signature}
    return check_graph(compiled.optimized.main, [random_inputs(sig, seed + trial) for trial in (0, 1)], dims,
                       target)


def check_graph(graph: Any, inputs: dict | list[dict], dims: dict[str, int], target: str = "H100",
                choose: Any = None, check: bool = False, device: str = "cpu") -> list[dict]:
    """`check_program` for a graph and its input sets (imported models pass their weights among them):
    kernels tuned (predicted) at `dims`, run at the inputs' shapes, against the float64 reference.
    `choose(job, config)`: the config to run instead of the predicted one (a test's); `check`: run
    in check mode, each report entry then carrying the run's NaN/Inf flag word (`flag`); `device`:
    "cuda" runs the same Triton functions compiled for the local GPU (a GPU test's), not
    interpreted."""
    import torch
    import triton

    from ..compiler.codegen.build import load_function
    from ..compiler.codegen.launch_abi import Compiled, ExternStep, KernelPlan, Variant
    from ..compiler.codegen.templates import emit
    from ..compiler.passes.specialize import bind_symbols, specialize
    from ..runtime.cpu import CpuExecutor
    from ..runtime.gpu import KernelExecutor
    from ..runtime.interpret import launch
    from ..tuner.jobs import plan, tuning_env
    from ..tuner.policy import Policy
    from ..tuner.space import default_config
    from ..tuner.tuner import Tuner
    from .target import target_profile

    jobs, launches = plan(graph, tuning_env(graph, dims))
    tuner = Tuner(target_profile(target), policy=Policy.PREDICT)
    variants: dict[str, list[Compiled]] = {}
    for job in jobs:
        w = tuner.tune(job)
        tuned = w.config if choose is None else choose(job, w.config)
        out = []
        for cfg, v in ((tuned, job.fast_variant(tuned)), (default_config(job.problem), Variant.generic())):
            em = emit(job.spec, cfg, v)
            fn = load_function(em)
            if device != "cpu":
                # As the engine's cubins are compiled: no int argument specialised on its value
                # (Triton's JIT would make a 1 a constant, and `_udiv`'s magic numbers with it).
                fn = triton.jit(fn.fn, do_not_specialize=[p for p, ty in em.params if not ty.startswith("*")])
            out.append(Compiled(v, cfg, em.params, em.div16, (fn, em)))
        variants[job.ident] = out
    specs = {job.ident: job.spec for job in jobs}
    plans = [ExternStep(b) if ident == "extern" else KernelPlan(specs[ident], b, variants[ident])
             for ident, b in launches]
    chosen: list[str] = []

    def run(c, grid, args):
        chosen.append("generic" if c.variant == Variant.generic() else "tuned")
        launch(c, grid, args)

    # Several input sets through one executor: later runs replay the first one's launches (the
    # deploy path's fast path) wherever the program allows it.
    executor = KernelExecutor(plans, run, torch.device(device), replay=True)
    executor.check_outputs = check
    report = []
    for trial, values in enumerate([inputs] if isinstance(inputs, dict) else list(inputs)):
        sg = specialize(graph, bind_symbols(graph, {k: tuple(v.shape) for k, v in values.items()}))
        got = executor.run(sg, {k: v.to(device) for k, v in values.items()})
        ref = CpuExecutor(float64=True, check=False).run(sg, values).values
        for nid, v in got.items():
            v, r = v.cpu(), ref[nid]
            if v.dtype.is_floating_point:
                # Non-finite reference values (softmax of a row masked with -inf is NaN) must be
                # matched exactly; the error is over the rest, and infinite on any mismatch.
                vd, rd = v.double(), r.double()
                finite = torch.isfinite(rd)
                same = (vd == rd) | (torch.isnan(vd) & torch.isnan(rd))
                if bool((~finite & ~same).any()):
                    err = float("inf")
                else:
                    err = ((vd[finite] - rd[finite]).norm() / rd[finite].norm().clamp_min(1e-30)).item()
            else:
                err = float((v != r.to(v.dtype)).double().mean().item()) if v.numel() else 0.0
            report.append({"node": nid, "dtype": str(v.dtype).replace("torch.", ""), "shape": list(v.shape),
                           "rel_err": err, "variants": chosen, "replayed": bool(trial and executor._replays)})
            if check:
                report[-1]["flag"] = int(executor.flags.item())
    return report


if __name__ == "__main__":
    import json
    import sys

    from ..runtime.interpret import enable
    enable()
    dims = dict((k, int(v)) for k, v in (a.split("=") for a in sys.argv[2:]))
    print(json.dumps(check_program(sys.argv[1], dims)))
