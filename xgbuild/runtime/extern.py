"""EXTERN nodes: a PyTorch operator the engine calls eagerly (`xg.compile(..., fallback="eager")`).

The node names the operator (`aten.cumsum.default`) and keeps its arguments as a JSON template in
which `{"$t": i}` is the node's i-th tensor input, `{"$dtype": "float32"}` a dtype and
`{"$device": null}` the device the engine runs on (compiler/importers/extern_args.py writes
them). Every executor (CPU, CPU float64 reference, CUDA) calls the operator through `torch.ops`,
so a saved engine runs in `xgrun` as well.

An engine file is data anyone who can write it can edit, so an EXTERN node is trusted for
nothing: its operator must be on the allow-list of pure ATen ops and its arguments must fit the
operator's schema (compiler/ops/extern_allow.py), checked for the whole program when an engine is
loaded (`admit`) and again at each call, which first runs the operator on the `meta` device so a
call that would allocate far more than the node's result is refused before it allocates. An
engine read from a file that uses the fallback at all runs only when the user opts in
(`xgrun --allow-fallback`, `allow_fallback=True`): `admit(graph, allowed)`.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ..compiler.ir.graph import Graph, Node, Op
from ..compiler.ops.extern_allow import ExternRefused, check_call, operator
from ..errors import EngineError, ExecutionError
from ..dtypes import TORCH_DTYPES, XG_NAMES

OPT_IN = ("run it only if you trust where it came from: `xgrun --allow-fallback`, or "
          "`allow_fallback=True` when loading it from Python")
MAX_RESULTS = 1 << 16          # results of one call (split/unbind return lists)
SLACK_BYTES = 1 << 20           # a call may allocate this much beyond its inputs and result


def resolve(name: str) -> Any:
    """The allowed `torch.ops.aten.<op>.<overload>` named `name`; an ExecutionError for any other."""
    try:
        return operator(name)
    except ExternRefused as exc:
        raise ExecutionError(f"the engine calls a PyTorch operator XG does not allow: {exc}") from None


def admit(graph: Graph, allowed: bool, what: str = "this engine") -> None:
    """Refuse a program that calls PyTorch operators (EXTERN) unless `allowed`; check every such
    call against the allow-list and its schema either way, before anything runs. An `EngineError`
    naming the node says why. `allowed`: the user opted in (or the engine was built in this
    process, or a trusted signature vouches for it)."""
    calls = [n for n in graph.nodes if n.op is Op.EXTERN]
    if not calls:
        return
    if not allowed:
        names = sorted({str(n.attr("call"))[:80] for n in calls})
        raise EngineError(f"{what} calls {len(calls)} PyTorch operator(s) through the eager fallback "
                          f"({', '.join(names[:5])}{' ...' if len(names) > 5 else ''}), which runs code outside "
                          f"XG's kernels; {OPT_IN}")
    for n in calls:
        try:
            check_node(n)
        except ExternRefused as exc:
            raise EngineError(f"{what} is refused: node %{n.id} {exc}") from None


def check_node(n: Node) -> tuple[Any, list, dict]:
    """The node's operator and argument templates, checked (`ExternRefused` if not acceptable)."""
    op, args, kwargs = check_call(n.attr("call"), n.attr("args"), len(n.inputs))
    out = n.attr("output")
    if out is not None and not (type(out) is int and 0 <= out < MAX_RESULTS):
        raise ExternRefused(f"`{n.attr('call')}` has output index {str(out)[:20]}, not one of its results")
    return op, args, kwargs


def call(n: Node, tensors: list[torch.Tensor], device: torch.device, memo: dict | None = None,
         dtype: torch.dtype | None = None) -> torch.Tensor:
    """The node's value: its operator called on `tensors` (the node's inputs, in order), of `dtype`
    (default: the node's; the float64 reference passes float64). An operator with several results
    has one node per result; with a run's `memo` it is called once for all."""
    key = (n.attr("call"), n.attr("args"))
    if memo is not None and n.attr("output") is not None:
        for ins, out in memo.get(key, ()):
            if len(ins) == len(tensors) and all(a is b for a, b in zip(ins, tensors)):
                return _pick(n, out, dtype)
    try:
        fn, args, kwargs = check_node(n)
    except ExternRefused as exc:
        raise ExecutionError(f"node %{n.id} is refused: {exc}") from None
    if len(tensors) != len(n.inputs):
        raise ExecutionError(f"node %{n.id} `{n.attr('call')}` got {len(tensors)} inputs, expected {len(n.inputs)}")

    def build(v: Any, ts: list, dev: torch.device) -> Any:
        if isinstance(v, list):
            return [build(x, ts, dev) for x in v]
        if isinstance(v, dict):
            if "$t" in v:
                return ts[v["$t"]]
            if "$dtype" in v:
                return TORCH_DTYPES[v["$dtype"]]
            if "$device" in v:
                return dev
        return v
    try:
        _dry_run(n, fn, args, kwargs, tensors, build, dtype)
        out = fn(*build(args, tensors, device), **{k: build(v, tensors, device) for k, v in kwargs.items()})
    except (RuntimeError, TypeError, ValueError, IndexError, NotImplementedError) as exc:
        raise ExecutionError(f"the eager PyTorch operator `{n.attr('call')}` (node %{n.id}) failed: "
                             f"{str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__}") from None
    if memo is not None and n.attr("output") is not None:
        memo.setdefault(key, []).append((list(tensors), out))
    return _pick(n, out, dtype)


def _dry_run(n: Node, fn: Any, args: list, kwargs: dict, tensors: list[torch.Tensor], build, dtype) -> None:
    """Run the call on `meta` tensors (shapes only, nothing allocated) and refuse it when its
    results would be far larger than the node's result and its inputs: a forged size argument
    (`repeat`, `constant_pad_nd`, `one_hot` ...) must not exhaust memory."""
    meta = [torch.empty(t.shape, dtype=t.dtype, device="meta") for t in tensors]
    out = fn(*build(args, meta, torch.device("meta")),
             **{k: build(v, meta, torch.device("meta")) for k, v in kwargs.items()})
    outs = out if isinstance(out, (tuple, list)) else [out]
    want = dtype or TORCH_DTYPES[n.dtype]
    declared = math.prod(int(d) for d in n.shape) * want.itemsize if all(isinstance(d, int) for d in n.shape) else 0
    budget = 4 * max(declared, sum(t.numel() * t.element_size() for t in tensors)) + SLACK_BYTES
    for o in outs:
        if isinstance(o, torch.Tensor) and o.numel() * o.element_size() > budget:
            raise ValueError(f"it would allocate {o.numel() * o.element_size()} bytes for a result of "
                             f"{list(o.shape)}, far more than the engine declares for node %{n.id} "
                             f"({list(n.shape)})")


def _pick(n: Node, out: Any, dtype: torch.dtype | None) -> torch.Tensor:
    """The node's result out of what the operator returned, checked against the compiled dtype and shape."""
    index = n.attr("output")
    if index is not None:
        if not isinstance(out, (tuple, list)) or not 0 <= index < len(out):
            raise ExecutionError(f"the eager PyTorch operator `{n.attr('call')}` (node %{n.id}) has no result {index}")
        out = out[index]
    want = dtype or TORCH_DTYPES[n.dtype]
    if isinstance(out, torch.Tensor) and out.dtype != want and out.is_floating_point() and want.is_floating_point:
        out = out.to(want)          # e.g. an explicit dtype argument under the float64 reference
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != tuple(n.shape) or out.dtype != want:
        got = f"{XG_NAMES.get(out.dtype, out.dtype)}{list(out.shape)}" if isinstance(out, torch.Tensor) \
            else type(out).__name__
        raise ExecutionError(f"the eager PyTorch operator `{n.attr('call')}` (node %{n.id}) returned {got}, "
                             f"but the engine was compiled for {XG_NAMES.get(want, want)}{list(n.shape)}")
    return out
