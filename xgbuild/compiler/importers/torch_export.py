"""PyTorch in: capture with `torch.export`, translate the ATen graph into XG's Graph IR.

`import_torch(model, example_inputs, example_kwargs=...)` exports the model (non-strict), then
walks the ATen graph with the op table of `aten_table.py`. Parameters, buffers and lifted constants
become weight INPUTs named by their state-dict names; the caller's tensors become inputs named as
`forward`'s parameters (torch_inputs.py); constants among them are fixed at capture. Symbolic sizes
(`torch.export.Dim`) become IR symbols named after the `Dim`s. Higher-order `wrap_*` ops
(`torch.set_grad_enabled`, `torch.autocast` regions) are inlined: their subgraph is walked with its
placeholders bound to the operands. In-place ops are translated as their functional form, the
written tensor rebound (torch_inplace.py). An op the table lacks, after one retry on the graph
`run_decompositions()` gives, is reported with every other such op of both graphs and the module
path (`nn_module_stack`) that uses it, in one error. An exception from XG's own code is an
XG0900 internal error, one line.
"""

from __future__ import annotations

import re
import warnings
from dataclasses import replace
from typing import Any, Sequence

import torch

from ...errors import XGError, user_stacklevel
from ...hw import GpuProfile
from ..frontend.codes import MODEL_DTYPE, MODEL_INPUT, MODEL_OUTPUT, MODEL_TRAINING, NOT_CAPTURED
from ..frontend.diagnostics import plain_error
from ..ir.graph import Dim, Op
from . import aten_ops, aten_shape_ops  # noqa: F401 (they register their translations)
from .aten_table import TABLE
from .builder import IRBuilder, TranslationError, Ref, is_node, xg_dtype
from ..ops.extern_allow import ExternRefused, check_call
from .extern_args import dumps, template
from .imported import ImportedProgram, Unsupported, UnsupportedOps, finish, internal_error
from .torch_inplace import Aliases, functional, is_inplace
from .torch_inputs import ExampleCall, complete_dynamic_shapes, dim_names, example_call, function_module


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

class _AsFunctional:
    """An in-place op's fx node seen as its functional op: the translations read `node.target`."""

    def __init__(self, node: torch.fx.Node, target: Any) -> None:
        self._node = node
        self.target = target

    def __getattr__(self, name: str) -> Any:
        return getattr(self._node, name)


class _Translator:
    def __init__(self, ep: torch.export.ExportedProgram, name: str, input_names: Sequence[str],
                 dim_names: dict[tuple[str, int], str], eager: bool = False) -> None:
        self.ep = ep
        self.input_names = list(input_names)       # the parameter each user input of the graph fills
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
        self.storage: dict[int, Aliases] = {}       # id(fx graph) -> which of its nodes share storage

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
        from torch.export.graph_signature import ConstantArgument, InputKind
        sig = self.ep.graph_signature
        by_name = {n.name: n for n in self.ep.graph.nodes if n.op == "placeholder"}
        specs = list(sig.input_specs)
        user_specs = [s for s in specs if s.kind == InputKind.USER_INPUT]
        if len(user_specs) != len(self.input_names):     # inputs torch.export flattened: its names
            self.input_names = [s.arg.name for s in user_specs]
        user_name = {s.arg.name: n for s, n in zip(user_specs, self.input_names)}
        for spec in specs:
            node = by_name[spec.arg.name]
            val = node.meta.get("val")
            if spec.kind == InputKind.USER_INPUT:
                name = user_name[spec.arg.name]
                if isinstance(spec.arg, ConstantArgument):       # None, a bool ...: fixed at capture
                    self.values[node.name] = spec.arg.value
                    continue
                if not isinstance(val, torch.Tensor):
                    raise plain_error(MODEL_INPUT, detail=f"input `{name}` is a {type(val).__name__}; "
                                      "xg.compile takes tensor inputs only")
                for axis, d in enumerate(val.shape):
                    if isinstance(d, torch.SymInt) and d.node.expr.is_symbol:
                        sym = str(d.node.expr)
                        if sym not in self.symbols:
                            self.symbols[sym] = self.dim_names.get((name, axis), sym)
                            hint = d.node.hint
                            if hint is not None:
                                self.example_dims[self.symbols[sym]] = int(hint)
                self.values[node.name] = self.b.input(name, xg_dtype(val.dtype), self.shape_of(node))
                self.inputs.append(name)
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
            name = spec.target if spec.target not in self.input_names else f"weight.{spec.target}"
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

    def mutations(self) -> None:
        """A model that writes into its inputs or buffers (the graph signature says so) cannot
        be an engine, which computes a fixed function of its inputs."""
        from torch.export.graph_signature import OutputKind
        for spec in self.ep.graph_signature.output_specs:
            if spec.kind == OutputKind.USER_INPUT_MUTATION:
                raise plain_error(MODEL_INPUT, detail=f"the model writes into its input `{spec.target}` in place",
                                  help="an engine never modifies its inputs: clone the input inside the model "
                                       "before writing into it")
            if spec.kind != OutputKind.USER_OUTPUT:
                raise plain_error(MODEL_TRAINING, detail="the model updates its buffers while running (a module "
                                  "in training mode?)", help="call model.eval() before xg.compile")

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
        self.mutations()
        self.placeholders()
        return self.output(self.walk(self.ep.graph, self.ep.graph_module))

    def walk(self, graph: torch.fx.Graph, module: torch.nn.Module) -> torch.fx.Node:
        """Translate one graph's ops, its placeholders already bound; returns its output node."""
        for node in graph.nodes:
            if node.op == "placeholder":
                continue
            if node.op == "output":
                return node
            if node.op == "get_attr":
                self.values[node.name] = self.attribute(module, node)
                continue
            if node.op != "call_function":
                self.unsupported.append(Unsupported(f"{node.op} {node.target}", self.where(node)))
                continue
            self.call(node)
        raise TranslationError("a graph with no output")

    def attribute(self, module: torch.nn.Module, node: torch.fx.Node) -> Any:
        """A `get_attr` node: in an exported graph, the body of a higher-order op (tensors are
        lifted to inputs)."""
        value: Any = module
        for part in str(node.target).split("."):
            value = getattr(value, part, None)
        if not isinstance(value, torch.fx.GraphModule):
            self.unsupported.append(Unsupported(f"get_attr {node.target}", self.where(node),
                                                f"a {type(value).__name__}, not a subgraph"))
            return None
        return value

    def call(self, node: torch.fx.Node) -> None:
        """One `call_function` node: a higher-order op inlined, an in-place op as its functional
        form, any other through the table. What XG cannot translate becomes an unsupported entry,
        or under `fallback="eager"` an EXTERN node where PyTorch can run it."""
        key = _key(node.target)
        if isinstance(node.target, torch._ops.HigherOrderOperator):
            try:
                self.values[node.name] = self.inline(node)
            except TranslationError as exc:
                self.unsupported.append(Unsupported(key, self.where(node), str(exc)))
                self.values[node.name] = None
            return
        self.b.src = self.line(node)
        handler, seen_as, written = TABLE.get(key), node, None
        if is_inplace(node.target):
            pure = functional(node.target)
            if pure is not None and _key(pure) in TABLE:
                handler, seen_as = TABLE[_key(pure)], _AsFunctional(node, pure)
            try:
                written = self.written(node)
            except TranslationError as exc:
                self.unsupported.append(Unsupported(key, self.where(node), str(exc)))
                self.values[node.name] = None
                return
        args = torch.fx.node.map_arg(node.args, lambda n: self.values.get(n.name))
        kwargs = torch.fx.node.map_arg(node.kwargs, lambda n: self.values.get(n.name))
        if handler is None and self.eager and not self.unsupported:
            try:
                self.bind(node, self.extern(node), written)
                self.fallbacks.append(Unsupported(str(node.target), self.where(node)))
            except TranslationError as exc:
                self.unsupported.append(Unsupported(key, self.where(node), f"no eager fallback: {exc}"))
                self.values[node.name] = None
            return
        if handler is None:
            self.unsupported.append(Unsupported(key, self.where(node)))
            self.values[node.name] = None
            return
        if self.unsupported:
            # Keep looking for more unsupported ops; nothing built after the first one is used.
            self.values[node.name] = None
            return
        try:
            self.bind(node, _translate(handler, self, seen_as, args, kwargs), written)
        except TranslationError as exc:
            if self.eager:
                try:                        # a form of the op the table cannot express: PyTorch runs it
                    self.bind(node, self.extern(node), written)
                    self.fallbacks.append(Unsupported(str(node.target), self.where(node), str(exc)))
                    return
                except TranslationError as again:
                    exc = TranslationError(f"{exc}; no eager fallback: {again}")
            self.unsupported.append(Unsupported(key, self.where(node), str(exc)))
            self.values[node.name] = None

    def written(self, node: torch.fx.Node) -> set[torch.fx.Node]:
        """The nodes an in-place op rebinds (torch_inplace.py), or a TranslationError saying why
        translating it as its functional form would be wrong."""
        graph = node.graph
        if id(graph) not in self.storage:
            self.storage[id(graph)] = Aliases(graph)
        return self.storage[id(graph)].written(node)

    def bind(self, node: torch.fx.Node, value: Any, written: set[torch.fx.Node] | None) -> None:
        """The value of `node`; for an in-place op also of every node that is the tensor it
        wrote, so later uses of any of them read the new value."""
        self.values[node.name] = value
        for n in written or ():
            self.values[n.name] = value

    def inline(self, node: torch.fx.Node) -> tuple:
        """A higher-order `wrap_*` op (`wrap_with_set_grad_enabled`, `wrap_with_autocast` ...)
        whose body is a subgraph: the body's ops translated here, its placeholders bound to the
        op's operands. Its outputs are the op's result, a tuple."""
        name = getattr(node.target, "__name__", str(node.target))
        at = next((i for i, a in enumerate(node.args) if isinstance(a, torch.fx.Node) and a.op == "get_attr"), None)
        if not name.startswith("wrap") or at is None:
            raise TranslationError(f"the higher-order op `{name}` is not one XG can inline (a wrap_* op whose "
                                   "body is a subgraph)")
        body = self.values.get(node.args[at].name)
        if not isinstance(body, torch.fx.GraphModule):
            raise TranslationError(f"the body of `{name}` is not a subgraph")
        if name == "wrap_with_autocast" and len(node.args) > 2 and node.args[2]:
            raise TranslationError("an enabled torch.autocast region: XG does not apply autocast's dtype casts "
                                   "(the decomposed graph makes them explicit)")
        operands = [self.values.get(a.name) if isinstance(a, torch.fx.Node) else a for a in node.args[at + 1:]]
        slots = [n for n in body.graph.nodes if n.op == "placeholder"]
        if len(slots) != len(operands):
            raise TranslationError(f"the body of `{name}` takes {len(slots)} inputs, the op gives it {len(operands)}")
        outer = self.values
        self.values = {p.name: v for p, v in zip(slots, operands)}
        try:
            out = self.walk(body.graph, body)
            results = out.args[0] if isinstance(out.args[0], (tuple, list)) else (out.args[0],)
            return tuple(self.values.get(a.name) if isinstance(a, torch.fx.Node) else a for a in results)
        finally:
            self.values = outer

    def extern(self, node: torch.fx.Node) -> Any:
        """An EXTERN node per tensor the operator returns: the engine calls it through `torch.ops`
        (an in-place op's functional form: PyTorch must not write into XG's buffers)."""
        if not isinstance(node.target, torch._ops.OpOverload):
            raise TranslationError(f"{node.target} is not a PyTorch operator")
        call = node.target
        if is_inplace(call):
            call = functional(call)
            if call is None:
                raise TranslationError(f"{node.target} writes in place and has no functional form")
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
        except TranslationError:
            raise
        except ValueError as exc:                   # an argument `dumps` cannot write down
            raise TranslationError(f"it takes {exc}") from None
        try:                                        # what a deploy host will accept (runtime/extern.py)
            check_call(str(call), args, len(inputs))
        except ExternRefused as exc:
            raise TranslationError(str(exc)) from None
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
                                   call=str(call), args=args,
                                   output=i if isinstance(val, (tuple, list)) else None))
        return tuple(refs) if isinstance(val, (tuple, list)) else refs[0]

    def output(self, node: torch.fx.Node) -> dict:
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


def _capture(model: torch.nn.Module, call: ExampleCall, dynamic_shapes: Any) -> torch.export.ExportedProgram:
    try:
        return torch.export.export(model, call.args, kwargs=call.kwargs, dynamic_shapes=dynamic_shapes, strict=False)
    except Exception as exc:  # noqa: BLE001 (torch.export raises many kinds; all mean "not capturable")
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        help = "xg.compile needs a model that torch.export.export(model, example_inputs) accepts"
        if "cache" in f"{type(exc).__name__} {exc}".lower() or _uses_cache(model, call):
            help = ("a key/value cache (DynamicCache) is no tensor XG can take or return: compile the model "
                    "without it, with example_kwargs={'use_cache': False} or model.config.use_cache = False")
        text = str(exc)
        if "Constraints violated" in text:
            # torch.export says which guard a dynamic dim failed and how to declare it instead.
            why = [ln.strip(" -") for ln in text.splitlines() if ln.strip().startswith("- Not all values")]
            fixes = text.split("Suggested fixes:", 1)[1].strip().split("\n\n")[0].splitlines() \
                if "Suggested fixes:" in text else []
            fixes = [f.strip() for f in fixes if f.strip()]
            first = "; ".join([first.replace(' For more information, run with TORCH_LOGS="+dynamic".', "")]
                              + why[:2])
            help = ("declare the dynamic dims as torch.export suggests (" + "; ".join(fixes[:4])
                    + "), or leave that dim static") if fixes else \
                "leave that dim static, or give the Dim a range the model's code holds for"
        raise plain_error(NOT_CAPTURED, detail=f"{type(exc).__name__}: {first}", help=help) from None


def _uses_cache(model: torch.nn.Module, call: ExampleCall) -> bool:
    """Whether a transformers model would build a key/value cache in this call."""
    if "use_cache" in call.kwargs:
        return bool(call.kwargs["use_cache"])
    return bool(getattr(getattr(model, "config", None), "use_cache", False))


def import_torch(model_or_fn: Any, example_inputs: Sequence[Any] | None = None, *, example_kwargs: Any = None,
                 dynamic_shapes: Any = None, target: str = "H100", num_gpu: int = 1, verify_each: bool = False,
                 fallback: str = "error", profile: GpuProfile | None = None) -> ImportedProgram:
    """The model as an ImportedProgram, captured at `model(*example_inputs, **example_kwargs)`.
    An op with no translation (after one retry on the decomposed graph) is an `UnsupportedOps`
    error, or with `fallback="eager"` an EXTERN node the engine calls through PyTorch, with one
    warning listing every such op. `profile`: the target's profile as the caller loaded it (from
    the settings' hw directory), kept on the IR Program. XG's own failures are XG0900 errors."""
    try:
        return _import(model_or_fn, example_inputs, example_kwargs, dynamic_shapes, target, num_gpu, verify_each,
                       fallback, profile)
    except XGError:
        raise
    except Exception as bug:  # noqa: BLE001 (XG's own bug: one line naming it, never a traceback)
        raise internal_error("importing the PyTorch model", bug) from None


def _import(model_or_fn: Any, example_inputs: Any, example_kwargs: Any, dynamic_shapes: Any, target: str,
            num_gpu: int, verify_each: bool, fallback: str, profile: GpuProfile | None) -> ImportedProgram:
    if isinstance(model_or_fn, torch.nn.Module):
        model, name = model_or_fn, type(model_or_fn).__name__
    elif callable(model_or_fn):
        model, name = function_module(model_or_fn), getattr(model_or_fn, "__name__", "function")
    else:
        raise XGError(f"xg.compile takes a torch.nn.Module or a function, got {type(model_or_fn).__name__}")
    call = example_call(model.forward, example_inputs, example_kwargs)
    for path, module in model.named_modules():
        if isinstance(module, torch.nn.modules.batchnorm._BatchNorm) and module.training:
            raise plain_error(MODEL_TRAINING, detail=f"module `{path}` ({type(module).__name__}) is in training "
                              "mode: batch norm would update its statistics", help="call model.eval() before xg.compile")
    dynamic_shapes = complete_dynamic_shapes(dynamic_shapes, call)
    ep = _capture(model, call, dynamic_shapes)
    dims = dim_names(dynamic_shapes, call.names)

    def translator(graph: torch.export.ExportedProgram, eager: bool = False) -> tuple[_Translator, dict]:
        t = _Translator(graph, name, call.names, dims, eager=eager)
        return t, t.run()

    t, output = translator(ep)
    graphs, report = [ep], list(t.unsupported)
    if t.unsupported:
        try:
            decomposed = ep.run_decompositions()
            retry, retry_output = translator(decomposed)
        except Exception:  # noqa: BLE001 (the retry is best effort; the first report stands)
            retry = None
        if retry is not None:
            graphs.append(decomposed)
            report += [replace(u, graph="decomposed") for u in retry.unsupported]
            if not retry.unsupported:
                t, output = retry, retry_output
    if t.unsupported and fallback == "eager":
        report = []
        for i, graph in enumerate(graphs):      # the first graph both can run, ops left to PyTorch
            t, output = translator(graph, eager=True)
            report += [replace(u, graph="decomposed" if i else "") for u in t.unsupported]
            if not t.unsupported:
                break
        if t.unsupported:
            raise UnsupportedOps(f"model {name}", report)
        warnings.warn(f"xg.compile: {len(t.fallbacks)} op{'s' if len(t.fallbacks) != 1 else ''} of model {name} "
                      "run in PyTorch eager (fallback='eager'), between XG's kernels: "
                      + "; ".join(f"{u.op} at {u.where}" for u in t.fallbacks), stacklevel=user_stacklevel())
    elif t.unsupported:
        raise UnsupportedOps(f"model {name}", report)
    graph = t.b.build(output)
    imported = finish(graph, name=f"{name}.aten.py", source=str(ep.graph_module.code), weights=t.weights,
                      inputs=t.inputs, ranges=t.ranges, example_dims=t.example_dims, target=target, num_gpu=num_gpu,
                      verify_each=verify_each, out_spec=ep.call_spec.out_spec, profile=profile,
                      params=call.params, fixed=call.fixed)
    drawn = [n for n in imported.optimized.main.nodes if n.op in (Op.RAND, Op.RANDN)]
    if drawn:
        # aten.rand feeding only what eval mode discards (a layer-drop coin) is gone by now; one
        # whose value is used would draw from XG's generator, not PyTorch's: refused.
        raise UnsupportedOps(f"model {name}", [
            Unsupported(f"aten.{n.op.value}", (n.src[2] if n.src else name) or name,
                        "the model draws random numbers that reach its outputs (dropout or noise in eval "
                        "mode?); XG cannot reproduce PyTorch's generator") for n in drawn])
    return imported


__all__ = ["import_torch"]
