"""ONNX in: an `.onnx` file (through the `onnx` package) into XG's Graph IR.

Every ONNX value is either a graph tensor (an IR node) or a static value known at import time
(`Static`: initializers, constants, and whatever is computed from them and from shapes alone,
symbolic dims included, as sympy expressions). Static values fold at import; one that reaches a
tensor op becomes a weight INPUT (large) or a CONST (a scalar). Graph inputs that are not
initializers are the engine's inputs; `dim_param`s become IR symbols. Every op the table in
`onnx_ops.py` lacks is reported at once, with the node that uses it. `Static` and the ONNX dtype
tables are in onnx_values.py, which the op tables share.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import sympy
import torch

from ...errors import CompileError
from ...hw import GpuProfile
from ..frontend.codes import BAD_ONNX, MODEL_DTYPE, MODEL_INPUT, MODEL_OUTPUT, Code
from ..frontend.diagnostics import plain_error
from ..ir.graph import Dim, Op
from . import composites as C
from .builder import IRBuilder, TranslationError, Ref, is_node
from .imported import ImportedProgram, Unsupported, UnsupportedOps, finish
from .onnx_values import NP_DTYPES, ONNX_DTYPES, Static


class OnnxImportError(CompileError):
    """The file is missing, unreadable, not ONNX (`unreadable`), or not a model XG can import."""

    def __init__(self, code: Code, message: str) -> None:
        err = plain_error(code, detail=message)
        super().__init__(str(err), err.diagnostics)
        self.unreadable = code is BAD_ONNX


class OnnxTranslator:
    def __init__(self, model, name: str) -> None:
        self.model = model
        self.name = name
        self.b = IRBuilder("main")
        self.values: dict[str, Any] = {}
        self.weights: dict[str, torch.Tensor] = {}
        self.inputs: list[str] = []
        self.ranges: dict[str, tuple[int, int]] = {}
        self.example_dims: dict[str, int] = {}
        self.unsupported: list[Unsupported] = []
        self._materialized: dict[int, Ref] = {}
        self.opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 13)

    # --- values ---------------------------------------------------------------------------------
    def tensor(self, v: Any, hint: str = "value") -> Ref:
        """An IR node for `v`: static values become CONSTs (scalars) or weight INPUTs."""
        if is_node(v):
            return v
        if not isinstance(v, Static):
            raise TranslationError(f"{hint} is missing")
        key = id(v)
        if key in self._materialized:
            return self._materialized[key]
        if v.symbolic:
            ref = self._sizes_as_data(v)
            self._materialized[key] = ref
            return ref
        arr = np.asarray(v.array.astype(NP_DTYPES.get(v.dtype, np.float32)))
        if arr.ndim == 0 and v.dtype != "bfloat16":
            ref = self.b.const(arr.item(), v.dtype)
        else:
            name = self._weight_name(hint)
            self.weights[name] = torch.from_numpy(np.ascontiguousarray(arr).copy())
            ref = self.b.input(name, v.dtype, tuple(arr.shape))
        self._materialized[key] = ref
        return ref

    def _sizes_as_data(self, v: Static) -> Ref:
        """Sizes (symbolic dims and expressions of them) used as run-time tensor data, e.g. a
        sequence length cast to float and divided by: each element computed from its symbols."""
        b = self.b
        elems = [b.reshape(self.size_scalar(sympy.sympify(e)), (1,)) for e in v.array.reshape(-1)]
        dt = "int64" if all(b.dtype(e) == "int64" for e in elems) else "float32"
        elems = [b.cast(e, dt) for e in elems]
        flat = C.cat(b, elems, 0) if len(elems) > 1 else elems[0]
        return b.cast(b.reshape(flat, tuple(v.array.shape)), v.dtype)

    def size_scalar(self, e: sympy.Expr) -> Ref:
        """A 0-d tensor holding the value of the size expression `e` at run time: its symbols'
        values (which exist in the IR only as dims) combined by its arithmetic, so that `seq - 1`
        is right where an IOTA of that length would be empty."""
        b = self.b
        if e.is_Integer:
            return b.const(int(e), "int64")
        if e.is_Number:
            return b.const(float(e), "float32")
        if e.is_Symbol:
            return C.size_value(b, e.name)
        if e.is_Add or e.is_Mul:
            acc = self.size_scalar(e.args[0])
            for a in e.args[1:]:
                acc = b.binary(Op.ADD if e.is_Add else Op.MUL, acc, self.size_scalar(a))
            return acc
        if isinstance(e, sympy.floor):
            num, den = sympy.fraction(sympy.together(e.args[0]))
            if den.is_Integer and den > 0:
                return b.op(Op.DIV, [self.size_scalar(sympy.expand(num)), b.const(int(den), "int64")])
        if e.is_Pow and e.exp == -1:
            return b.binary(Op.DIV, 1.0, self.size_scalar(e.base))
        raise TranslationError(f"the size expression {e} as tensor data")

    def _weight_name(self, hint: str) -> str:
        base = re.sub(r"[^\w.]", "_", hint) or "const"
        name, i = base, 1
        taken = set(self.weights) | set(self.inputs)
        while name in taken:
            name, i = f"{base}_{i}", i + 1
        return name

    def shape(self, v: Any) -> tuple:
        if isinstance(v, Static):
            return tuple(v.array.shape)
        return self.b.shape(v)

    def dtype(self, v: Any) -> str:
        return v.dtype if isinstance(v, Static) else self.b.dtype(v)

    # --- the walk -------------------------------------------------------------------------------
    def run(self) -> dict:
        from onnx import numpy_helper
        g = self.model.graph
        inits = {t.name for t in g.initializer}
        for t in g.initializer:
            arr = numpy_helper.to_array(t)
            dt = ONNX_DTYPES.get(t.data_type)
            if dt is None:
                raise OnnxImportError(MODEL_DTYPE, f"initializer `{t.name}` has ONNX element type {t.data_type}, which XG "
                                      "has no dtype for")
            self.values[t.name] = Static(arr, dt)
        for inp in g.input:
            if inp.name in inits:
                continue
            tt = inp.type.tensor_type
            dt = ONNX_DTYPES.get(tt.elem_type)
            if dt is None:
                raise OnnxImportError(MODEL_INPUT, f"input `{inp.name}` has ONNX element type {tt.elem_type}, which XG has "
                                      "no dtype for")
            dims: list[Dim] = []
            for axis, d in enumerate(tt.shape.dim):
                if d.HasField("dim_value"):
                    dims.append(int(d.dim_value))
                else:
                    sym = re.sub(r"\W", "_", d.dim_param) if d.dim_param else f"{inp.name}_{axis}"
                    dims.append(sym)
            name = re.sub(r"[^\w.]", "_", inp.name)
            self.values[inp.name] = self.b.input(name, dt, tuple(dims))
            self.inputs.append(name)
        from . import onnx_ops, onnx_shape_ops  # noqa: F401 (they register their translations)
        from .onnx_table import TABLE
        # Every node whose inputs translated is tried, so that one error names all the ops XG
        # cannot translate; a node downstream of one that failed is skipped silently.
        failed: set[str] = set()
        for node in g.node:
            where = f"node `{node.name or node.output[0]}`"
            handler = TABLE.get(node.op_type) if node.domain in ("", "ai.onnx") else None
            if handler is None:
                op = node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"
                self.unsupported.append(Unsupported(op, where))
                failed.update(node.output)
                continue
            if failed.intersection(node.input):
                failed.update(node.output)
                continue
            args = [self.values.get(i) if i else None for i in node.input]
            attrs = _attrs(node)
            self.b.src = (0, 0, node.name or node.op_type)
            try:
                outs = _translate(handler, self, node, args, attrs)
            except TranslationError as exc:
                self.unsupported.append(Unsupported(node.op_type, where, str(exc)))
                failed.update(node.output)
                continue
            outs = outs if isinstance(outs, (tuple, list)) else (outs,)
            for name, v in zip(node.output, outs):
                if name:
                    self.values[name] = v
        if self.unsupported:
            return {}
        leaves = []
        for out in g.output:
            v = self.values.get(out.name)
            try:
                leaves.append({"t": int(self.tensor(v, out.name))})
            except TranslationError as exc:
                raise OnnxImportError(MODEL_OUTPUT, f"graph output `{out.name}`: {exc}") from None
        return leaves[0] if len(leaves) == 1 else {"tuple": leaves}


def _translate(handler, t: OnnxTranslator, node, args: list, attrs: dict) -> Any:
    """One node's translation. One that fails by XG's own bug (an IndexError, a TypeError ...) is
    reported like an op XG cannot translate, naming the bug, with every other such op of the
    model, instead of a traceback."""
    try:
        return handler(t, node, args, attrs)
    except TranslationError:
        raise
    except (ArithmeticError, AttributeError, IndexError, KeyError, TypeError, ValueError) as bug:
        raise TranslationError(f"internal error in XG's translation ({type(bug).__name__}: {bug}); "
                               "please report it") from None


def _attrs(node) -> dict[str, Any]:
    from onnx import helper
    out = {}
    for a in node.attribute:
        v = helper.get_attribute_value(a)
        out[a.name] = v.decode() if isinstance(v, bytes) else v
    return out


def load_onnx(path: Path | str):
    import onnx
    path = Path(path)
    if not path.is_file():
        raise OnnxImportError(BAD_ONNX, f"cannot read {path}: no such file")
    try:
        model = onnx.load(str(path))
    except Exception as exc:  # noqa: BLE001 (protobuf raises several kinds on corrupt bytes)
        raise OnnxImportError(BAD_ONNX, f"{path} is not a readable ONNX model ({type(exc).__name__}: "
                              f"{str(exc).splitlines()[0] if str(exc) else 'corrupt protobuf'})") from None
    if not model.graph.node and not model.graph.output:
        raise OnnxImportError(BAD_ONNX, f"{path} holds no ONNX graph")
    try:
        onnx.checker.check_model(model)
    except Exception as exc:  # noqa: BLE001 (onnx's ValidationError and friends)
        raise OnnxImportError(BAD_ONNX, f"{path} is not a valid ONNX model: {str(exc).splitlines()[0]}") from None
    return model


def import_onnx(path: Path | str, *, target: str = "H100", num_gpu: int = 1, dims: dict[str, int] | None = None,
                verify_each: bool = False, profile: GpuProfile | None = None) -> ImportedProgram:
    """The ONNX model as an ImportedProgram; `profile`: the target's, as the caller loaded it."""
    model = load_onnx(path)
    name = Path(path).name
    t = OnnxTranslator(model, name)
    output = t.run()
    if t.unsupported:
        raise UnsupportedOps(f"{name}", t.unsupported)
    graph = t.b.build(output)
    from onnx import printer        # helper.printable_graph is deprecated (a DeprecationWarning per import)
    source = printer.to_text(model.graph)
    return finish(graph, name=f"{name}.txt", source=source, weights=t.weights, inputs=t.inputs, ranges=t.ranges,
                  example_dims=dict(dims or {}), target=target, num_gpu=num_gpu, verify_each=verify_each,
                  profile=profile)
