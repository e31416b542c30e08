"""Runs engine kernels with Triton's interpreter on CPU tensors: the numerics of the generated code
checked on hosts without a GPU (tests, and `xgbuild` debugging).

TRITON_INTERPRET must be set before Triton is first imported, so callers run this in a fresh
process (`python -m xgbuild.runtime.interpret` or a subprocess that sets the variable first).
"""

from __future__ import annotations

import os
from typing import Any


def enable() -> None:
    """Turns the interpreter on; must run before `triton` is imported in this process."""
    os.environ["TRITON_INTERPRET"] = "1"
    import triton.runtime.interpreter as interp

    if getattr(interp, "_xg_patched", False):
        return
    original = interp._patch_lang_tensor

    def patched(tensor: Any, scope: Any) -> None:
        original(tensor, scope)
        # Triton 3.6 holds scalars as 1-element arrays, and numpy >= 2.4 refuses int() on those:
        # a loop bound from an int argument would fail. Read the one element instead.
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    interp._patch_lang_tensor = patched

    # Triton 3.6's interpreter holds bfloat16 as uint16 and multiplies those integers in `tl.dot`.
    # Widen bfloat16 operands to float32 first: exact products summed in float32, as tensor cores do.
    dot = interp.InterpreterBuilder.create_dot

    def create_dot(self: Any, a: Any, b: Any, d: Any, input_precision: Any, max_num_imprecise_acc: Any) -> Any:
        import triton.language as tl

        def widen(x: Any) -> Any:
            if x.dtype.scalar != tl.bfloat16:
                return x
            data = interp._convert_float(x.data, tl.bfloat16, tl.float32, None).view(interp.np.float32)
            return interp.TensorHandle(data, tl.float32)
        return dot(self, widen(a), widen(b), d, input_precision, max_num_imprecise_acc)

    interp.InterpreterBuilder.create_dot = create_dot
    interp._xg_patched = True


def launch(compiled: Any, grid: tuple, args: list) -> None:
    """`KernelExecutor` launch function: `compiled.handle` is (jit function, Emitted)."""
    fn, emitted = compiled.handle
    fn[grid](*args, **emitted.constexprs)


def plans_from_manifest(manifest: dict) -> list:
    """An engine's launch plans with each variant's Triton source (re-emitted from its spec and
    config, as the build compiled it) as an interpreted function instead of a cubin."""
    from ..compiler.codegen.build import load_function
    from ..compiler.codegen.launch_abi import Compiled, Variant
    from ..compiler.codegen.templates import emit
    from ..tuner.link import plans_from_manifest as plans

    def interpreted(spec, v: dict) -> Compiled:
        variant, cfg = Variant.from_json(v["variant"]), dict(v["config"])
        em = emit(spec, cfg, variant)
        return Compiled(variant, cfg, em.params, em.div16, (load_function(em), em))
    return plans(manifest, None, interpreted)


def check_program(path: str, dims: dict[str, int], target: str = "H100", seed: int = 0) -> list[dict]:
    """Runs a program's kernels (tuned variants and generic ones, as an engine carries them) under the
    interpreter at `dims` on two input sets (the second replayed where it can be), and compares
    every output with the float64 CPU reference."""
    from ..compiler.driver import compile_file
    from .engine import Engine
    from .tensor_io import random_inputs

    compiled = compile_file(path)
    engine = Engine.from_compiled(compiled)
    sig = {s["name"]: (s["dtype"], tuple(dims.get(d, 16) if isinstance(d, str) else d for d in s["shape"]))
           for s in engine.signature}
    return check_graph(compiled.optimized.main, [random_inputs(sig, seed + trial) for trial in (0, 1)], dims,
                       target)


def check_graph(graph: Any, inputs: dict | list[dict], dims: dict[str, int], target: str = "H100") -> list[dict]:
    """`check_program` for a graph and its input sets (imported models pass their weights among them):
    kernels tuned (predicted) at `dims`, run at the inputs' shapes, against the float64 reference."""
    import torch

    from ..compiler.codegen.build import load_function
    from ..compiler.codegen.launch_abi import Compiled, ExternStep, KernelPlan, Variant
    from ..compiler.codegen.templates import emit
    from ..compiler.passes.specialize import bind_symbols, specialize
    from ..hw import load_profile
    from ..tuner.jobs import plan, tuning_env
    from ..tuner.space import default_config
    from ..tuner.tuner import Tuner
    from .cpu import CpuExecutor
    from .gpu import KernelExecutor

    jobs, launches = plan(graph, tuning_env(graph, dims))
    tuner = Tuner(load_profile(target), policy="predict")
    variants: dict[str, list[Compiled]] = {}
    for job in jobs:
        w = tuner.tune(job)
        out = []
        for cfg, v in ((w.config, job.fast_variant(w.config)), (default_config(job.problem), Variant.generic())):
            em = emit(job.spec, cfg, v)
            out.append(Compiled(v, cfg, em.params, em.div16, (load_function(em), em)))
        variants[job.ident] = out
    specs = {job.ident: job.spec for job in jobs}
    plans = [ExternStep(b) if ident == "extern" else KernelPlan(specs[ident], b, variants[ident]) for ident, b in launches]
    chosen: list[str] = []

    def run(c, grid, args):
        chosen.append("generic" if c.variant == Variant.generic() else "tuned")
        launch(c, grid, args)

    # Several input sets through one executor: later runs replay the first one's launches (the
    # deploy path's fast path) wherever the program allows it.
    executor = KernelExecutor(plans, run, torch.device("cpu"), replay=True)
    report = []
    for trial, values in enumerate([inputs] if isinstance(inputs, dict) else list(inputs)):
        sg = specialize(graph, bind_symbols(graph, {k: tuple(v.shape) for k, v in values.items()}))
        got = executor.run(sg, values)
        ref = CpuExecutor(float64=True, check=False).run(sg, values).values
        for nid, v in got.items():
            r = ref[nid]
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
    return report


if __name__ == "__main__":
    import json
    import sys

    enable()
    dims = dict((k, int(v)) for k, v in (a.split("=") for a in sys.argv[2:]))
    print(json.dumps(check_program(sys.argv[1], dims)))
