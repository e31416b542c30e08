"""Runs engine kernels with Triton's interpreter on CPU tensors: the numerics of the generated code
checked on hosts without a GPU (tests, `XG_SPMD_KERNELS=interpret` ranks, and the build's
interpreted checks in xgbuild/build/interpreted.py).

TRITON_INTERPRET must be set before Triton is first imported, so callers run this in a fresh
process (`python -m xgbuild.build.interpreted` or a subprocess that sets the variable first).
"""

from __future__ import annotations

from typing import Any

from ..settings import use_triton_interpreter


def enable() -> None:
    """Turns the interpreter on; must run before `triton` is imported in this process."""
    use_triton_interpreter()
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
    from .plans import plans_from_manifest as plans

    def interpreted(spec, v: dict) -> Compiled:
        variant, cfg = Variant.from_json(v["variant"]), dict(v["config"])
        em = emit(spec, cfg, variant)
        return Compiled(variant, cfg, em.params, em.div16, (load_function(em), em))
    return plans(manifest, None, interpreted)
