"""PyTorch in: capture with `torch.export`, translate the ATen graph into XG's Graph IR.

`import_torch(model, example_inputs)` exports the model (non-strict), then walks the ATen graph
with the op table of `aten_table.py`. Parameters, buffers and lifted constants become weight INPUTs
named by their state-dict names; the caller's tensors become inputs named as `forward`'s
arguments. Symbolic sizes (`torch.export.Dim`) become IR symbols named after the `Dim`s.
An op the table lacks, after one retry on the graph `run_decompositions()` gives, is reported
with every other such op and the module path (`nn_module_stack`) that uses it, in one error.
"""

from __future__ import annotations

import inspect
import re
import warnings
from typing import Any, Sequence

import torch

from ...errors import XGError
from ...hw import GpuProfile
from ..frontend.codes import MODEL_DTYPE, MODEL_INPUT, MODEL_OUTPUT, MODEL_TRAINING, NOT_CAPTURED
from ..frontend.diagnostics import plain_error
from ..ir.graph import Dim, Op
from . import aten_ops, aten_shape_ops  # noqa: F401 (they register their translations)
from .aten_table import TABLE
from .builder import IRBuilder, TranslationError, Ref, is_node, xg_dtype
from .extern_args import dumps, template
from .imported import ImportedProgram, Unsupported, UnsupportedOps, finish



def _translate(handler, t, node: torch.fx.Node, args: Any, kwargs: Any) -> Any:
    """One op's translation. A translation that fails by XG's own bug (an IndexError, a TypeError ...)
    is reported like an op XG cannot translate, naming the bug, so the model's unsupported-op error
    (or `fallback="eager"`) deals with it and no traceback reaches the user."""
    try:
        return handler(t, node, list(args), dict(kwargs))
    except TranslationError:
        raise
    except (ArithmeticError, AttributeError, IndexError, KeyError, TypeError, ValueError) as bug:
        raise TranslationError(f"internal error in XG's translation ({type(bug).__name__}: {bug}); "
                               f"please report it") from None

class _Module(torch.nn.Module):
    """A plain function as a module, so that functions export like models."""

    def __init__(self, fn) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


def _dim_names(dynamic_shapes: Any, arg_names: list[str]) -> dict[tuple[int, int], str]:
    """(input position, axis) -> the name of the `Dim` the caller gave it."""
    out: dict[tuple[int, int], str] = {}
    if dynamic_shapes is None:
        return out
    specs = [dynamic_shapes.get(n) for n in arg_names] if isinstance(dynamic_shapes, dict) else list(dynamic_shapes)
    for i, spec in enumerate(specs):
        items = spec.items() if isinstance(spec, dict) else enumerate(spec or ())
        for axis, d in items:
            name = getattr(d, "__name__", None)
            if name:
                out[(i, int(axis))] = re.sub(r"\W", "_", name)
    return out


class _Translator:
    def __init__(self, ep: torch.export.ExportedProgram, name: str, dim_names: dict[tuple[int, int], str],
                 eager: bool = False) -> None:
        self.ep = ep
        self.eager = eager                          # ops with no translation become EXTERN nodes
        self.b = IRBuilder("main")
        self.name = name
        self.dim_names = dim_names
        self.symbols: dict[str, str] = {}          # sympy symbol -> IR symbol name
        self.values: dict[str, Any] = {}
        self.weights: dict[str, torch.Tensor] = {}
        self.inputs: list[str] = []
        self.ranges: dict[str, tuple[int, int]] = {}
        self.example_dims: dict[str, int] = {}
        self.unsupported: list[Unsupported] = []
        self.fallbacks: list[Unsupported] = []      # ops left to PyTorch (fallback="eager")
        self.aliases: dict[tuple, Ref] = {}         # (storage, shape, strides, dtype) -> weight input

    # --- sizes ----------------------------------------------------------------------------------
    def dim(self, d: Any) -> Dim:
        if isinstance(d, int):
            return d
        if isinstance(d, torch.SymInt):
            expr = d.node.expr
            if expr.is_number:
                return int(expr)
            text = str(expr)
            for sym, new in sorted(self.symbols.items(), key=lambda kv: -len(kv[0])):
                text = re.sub(rf"\b{re.escape(sym)}\b", new, text)
            return text.replace(" ", "")
        raise TranslationError(f"a size of type {type(d).__name__}")

    def shape_of(self, node: torch.fx.Node) -> tuple[Dim, ...]:
        return tuple(self.dim(d) for d in node.meta["val"].shape)

    # --- placeholders ---------------------------------------------------------------------------
    def placeholders(self) -> None:
        from torch.export.graph_signature import InputKind
        sig = self.ep.graph_signature
        user = 0
        by_name = {n.name: n for n in self.ep.graph.nodes if n.op == "placeholder"}
        specs = list(sig.input_specs)
        user_names = set()
        for spec in specs:
            if spec.kind == InputKind.USER_INPUT:
                user_names.add(spec.arg.name)
        for spec in specs:
            node = by_name[spec.arg.name]
            val = node.meta.get("val")
            if spec.kind == InputKind.USER_INPUT:
                if not isinstance(val, torch.Tensor):
                    raise plain_error(MODEL_INPUT, detail=f"input `{spec.arg.name}` is a {type(val).__name__}; "
                                      "xg.compile takes tensor inputs only")
                for axis, d in enumerate(val.shape):
                    if isinstance(d, torch.SymInt) and d.node.expr.is_symbol:
                        sym = str(d.node.expr)
                        if sym not in self.symbols:
                            self.symbols[sym] = self.dim_names.get((user, axis), sym)
                            hint = d.node.hint
                            if hint is not None:
                                self.example_dims[self.symbols[sym]] = int(hint)
                self.values[node.name] = self.b.input(node.name, xg_dtype(val.dtype), self.shape_of(node))
                self.inputs.append(node.name)
                user += 1
                continue
            if spec.kind in (InputKind.PARAMETER, InputKind.BUFFER):
                tensor = self.ep.state_dict.get(spec.target)
                if tensor is None:
                    tensor = self.ep.constants[spec.target]
            elif spec.kind == InputKind.CONSTANT_TENSOR:
                tensor = self.ep.constants[spec.target]
            else:
                raise plain_error(MODEL_INPUT, detail=f"the model takes a {spec.kind.name.lower()} input "
                                  f"`{spec.arg.name}`, which XG cannot import")
            name = spec.target if spec.target not in user_names else f"weight.{spec.target}"
            tensor = tensor.detach()
            alias = (tensor.data_ptr(), tuple(tensor.shape), tuple(tensor.stride()), tensor.dtype)
            if tensor.numel() and alias in self.aliases:      # tied weights: one input, stored once
                self.values[node.name] = self.aliases[alias]
                continue
            if xg_dtype(tensor.dtype) is None:
                raise plain_error(MODEL_DTYPE, detail=f"weight `{name}` has dtype {tensor.dtype}, which XG has no type for")
            self.weights[name] = tensor
            self.values[node.name] = self.b.input(name, xg_dtype(tensor.dtype), tuple(tensor.shape))
            self.aliases[alias] = self.values[node.name]

    # --- the walk -------------------------------------------------------------------------------
    def where(self, node: torch.fx.Node) -> str:
        stack = node.meta.get("nn_module_stack") or {}
        if stack:
            path, cls = list(stack.values())[-1]
            cls_name = cls.rsplit(".", 1)[-1] if isinstance(cls, str) else getattr(cls, "__name__", str(cls))
            return f"{path} ({cls_name})" if path else f"{self.name} (top level)"
        return f"{self.name} (top level)"

    def line(self, node: torch.fx.Node) -> tuple:
        trace = node.meta.get("stack_trace") or ""
        lines = re.findall(r"line (\d+)", trace)
        stack = node.meta.get("nn_module_stack") or {}
        path = list(stack.values())[-1][0] if stack else ""
        return (int(lines[-1]) if lines else 0, 0, path or self.name)

    def run(self) -> dict:
        self.placeholders()
        output: dict | None = None
        for node in self.ep.graph.nodes:
            if node.op == "placeholder":
                continue
            if node.op == "output":
                output = self.output(node)
                continue
            if node.op != "call_function":
                self.unsupported.append(Unsupported(f"{node.op} {node.target}", self.where(node)))
                continue
            self.b.src = self.line(node)
            args = torch.fx.node.map_arg(node.args, lambda n: self.values.get(n.name))
            kwargs = torch.fx.node.map_arg(node.kwargs, lambda n: self.values.get(n.name))
            key = _key(node.target)
            handler = TABLE.get(key)
            if handler is None and self.eager and not self.unsupported:
                try:
                    self.values[node.name] = self.extern(node)
                    self.fallbacks.append(Unsupported(str(node.target), self.where(node)))
                    continue
                except TranslationError as exc:
                    self.unsupported.append(Unsupported(key, self.where(node), f"no eager fallback: {exc}"))
                    self.values[node.name] = None
                    continue
            if handler is None:
                self.unsupported.append(Unsupported(key, self.where(node)))
                self.values[node.name] = None
                continue
            if self.unsupported:
                # Keep looking for more unsupported ops; nothing built after the first one is used.
                self.values[node.name] = None
                continue
            try:
                self.values[node.name] = _translate(handler, self, node, args, kwargs)
            except TranslationError as exc:
                if self.eager:
                    try:                        # a form of the op the table cannot express: PyTorch runs it
                        self.values[node.name] = self.extern(node)
                        self.fallbacks.append(Unsupported(str(node.target), self.where(node), str(exc)))
                        continue
                    except TranslationError as again:
                        exc = TranslationError(f"{exc}; no eager fallback: {again}")
                self.unsupported.append(Unsupported(key, self.where(node), str(exc)))
                self.values[node.name] = None
        assert output is not None
        return output

    def extern(self, node: torch.fx.Node) -> Any:
        """An EXTERN node per tensor the operator returns: the engine calls it through `torch.ops`."""
        if not isinstance(node.target, torch._ops.OpOverload):
            raise TranslationError(f"{node.target} is not a PyTorch operator")
        inputs: list[Ref] = []

        def tensor_index(v: Any) -> int | None:
            if isinstance(v, torch.fx.Node):
                ref = self.values.get(v.name)
                if isinstance(v.meta.get("val"), torch.SymInt):
                    raise TranslationError("it takes a size that depends on a dynamic dim")
                if not is_node(ref):
                    raise TranslationError(f"its argument `{v.name}` is not a tensor XG computed")
                if ref not in inputs:
                    inputs.append(ref)
                return inputs.index(ref)
            if isinstance(v, torch.SymInt):
                raise TranslationError("it takes a size that depends on a dynamic dim")
            return None
        try:
            args = dumps(template(list(node.args), tensor_index),
                         {k: template(v, tensor_index) for k, v in node.kwargs.items()})
        except ValueError as exc:
            raise TranslationError(f"it takes {exc}") from None
        val = node.meta.get("val")
        outs = list(val) if isinstance(val, (tuple, list)) else [val]
        refs = []
        for i, v in enumerate(outs):
            if not isinstance(v, torch.Tensor):
                raise TranslationError(f"it returns a {type(v).__name__}")
            dtype = xg_dtype(v.dtype)
            if dtype is None:
                raise TranslationError(f"it returns a {v.dtype} tensor, which XG has no type for")
            refs.append(self.b.add(Op.EXTERN, inputs, dtype, tuple(self.dim(d) for d in v.shape),
                                   call=str(node.target), args=args,
                                   output=i if isinstance(val, (tuple, list)) else None))
        return tuple(refs) if isinstance(val, (tuple, list)) else refs[0]

    def output(self, node: torch.fx.Node) -> dict:
        from torch.export.graph_signature import OutputKind
        kinds = [s.kind for s in self.ep.graph_signature.output_specs]
        if any(k != OutputKind.USER_OUTPUT for k in kinds):
            raise plain_error(MODEL_TRAINING, detail="the model updates its buffers while running (a module in "
                              "training mode?)", help="call model.eval() before xg.compile")
        leaves = []
        for arg in node.args[0]:
            v = self.values.get(arg.name) if isinstance(arg, torch.fx.Node) else arg
            if not is_node(v):
                if self.unsupported:
                    return {"tuple": []}
                raise plain_error(MODEL_OUTPUT, detail=f"the model returns a {type(v).__name__}; xg.compile "
                                  "supports models that return tensors")
            leaves.append({"t": int(v)})
        spec = self.ep.call_spec.out_spec
        if spec is not None and spec.is_leaf() and len(leaves) == 1:
            return leaves[0]
        return {"tuple": leaves}


def _key(target: Any) -> str:
    if isinstance(target, torch._ops.OpOverload):
        return str(target.overloadpacket)          # "aten.linear"
    return f"{getattr(target, '__module__', '')}.{getattr(target, '__name__', str(target))}"


def _capture(model: torch.nn.Module, args: tuple, dynamic_shapes: Any) -> torch.export.ExportedProgram:
    try:
        return torch.export.export(model, args, dynamic_shapes=dynamic_shapes, strict=False)
    except Exception as exc:  # noqa: BLE001 (torch.export raises many kinds; all mean "not capturable")
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise plain_error(NOT_CAPTURED, detail=f"{type(exc).__name__}: {first}",
                          help="xg.compile needs a model that torch.export.export(model, example_inputs) "
                               "accepts") from None


def import_torch(model_or_fn: Any, example_inputs: Sequence[Any], *, dynamic_shapes: Any = None,
                 target: str = "H100", num_gpu: int = 1, verify_each: bool = False,
                 fallback: str = "error", profile: GpuProfile | None = None) -> ImportedProgram:
    """The model as an ImportedProgram. An op with no translation (after one retry on the
    decomposed graph) is an `UnsupportedOps` error, or with `fallback="eager"` an EXTERN node the
    engine calls through PyTorch, with one warning listing every such op. `profile`: the target's
    profile as the caller loaded it (from the settings' hw directory), kept on the IR Program."""
    if isinstance(example_inputs, torch.Tensor):
        example_inputs = (example_inputs,)
    if not isinstance(example_inputs, (tuple, list)) or not example_inputs:
        raise XGError("example_inputs must be a non-empty tuple of tensors, e.g. example_inputs=(x,)")
    for i, x in enumerate(example_inputs):
        if not isinstance(x, torch.Tensor):
            raise XGError(f"example_inputs[{i}] is a {type(x).__name__}; pass tensors")
    if isinstance(model_or_fn, torch.nn.Module):
        model, name = model_or_fn, type(model_or_fn).__name__
        fn = model.forward
    elif callable(model_or_fn):
        model, name = _Module(model_or_fn), getattr(model_or_fn, "__name__", "function")
        fn = model_or_fn
    else:
        raise XGError(f"xg.compile takes a torch.nn.Module or a function, got {type(model_or_fn).__name__}")
    try:
        arg_names = [p for p in inspect.signature(fn).parameters]
    except (TypeError, ValueError):
        arg_names = []
    for path, module in model.named_modules():
        if isinstance(module, torch.nn.modules.batchnorm._BatchNorm) and module.training:
            raise plain_error(MODEL_TRAINING, detail=f"module `{path}` ({type(module).__name__}) is in training "
                              "mode: batch norm would update its statistics", help="call model.eval() before xg.compile")
    args = tuple(x.detach() for x in example_inputs)
    ep = _capture(model, args, dynamic_shapes)
    dim_names = _dim_names(dynamic_shapes, arg_names)
    t = _Translator(ep, name, dim_names)
    output = t.run()
    if t.unsupported:
        first = t.unsupported
        try:
            t = _Translator(ep.run_decompositions(), name, dim_names)
            output = t.run()
        except Exception:  # noqa: BLE001 (the retry is best effort; the first report stands)
            t.unsupported = first
        if t.unsupported and fallback == "eager":
            t = _Translator(ep, name, dim_names, eager=True)
            output = t.run()
            if t.unsupported:
                raise UnsupportedOps(f"model {name}", t.unsupported)
            warnings.warn(f"xg.compile: {len(t.fallbacks)} op{'s' if len(t.fallbacks) != 1 else ''} of model {name} "
                          "run in PyTorch eager (fallback='eager'), between XG's kernels: "
                          + "; ".join(f"{u.op} at {u.where}" for u in t.fallbacks), stacklevel=3)
        elif t.unsupported:
            raise UnsupportedOps(f"model {name}", first)
    graph = t.b.build(output)
    return finish(graph, name=f"{name}.aten.py", source=str(ep.graph_module.code), weights=t.weights, inputs=t.inputs,
                  ranges=t.ranges, example_dims=t.example_dims, target=target, num_gpu=num_gpu,
                  verify_each=verify_each, out_spec=ep.call_spec.out_spec, profile=profile)


__all__ = ["import_torch"]
