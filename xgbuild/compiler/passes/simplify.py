"""Algebraic identities that let index expressions reach the kernels that compute them.

Imported attention masks arrive built the way `transformers` builds them: positions as
`arange(T) + 0`, the causal part `new_ones(...) & (col <= row)`, and the padding part and-ed in,
`where(causal & padding, scores, -inf)`. As written, the whole [B, 1, T, S] mask is one tensor:
its own kernel writes it, and the attention kernel reads a tile of it at every key block, with no
way to see that most of it is a causal mask it could compute from its row and column indices (and
whose empty blocks it could skip). Three exact rewrites undo that:

- `stop_gradient(x)` is `x` (autodiff, which it was for, has run); so is `cast(x)` to `x`'s own
  dtype (a program written for several dtypes, `cast(o, float32)` of a float32 `o`, would
  otherwise copy `o` in a kernel of its own).
- `x + 0`, `x - 0`, `x * 1` of integers, `true & x`, `false | x` (of the op's own shape and dtype)
  are `x`: integer and boolean arithmetic is exact, so nothing rounds differently. Floats are
  left alone (`-0.0 + 0.0` is `+0.0`).
- `where(a & b, x, c)`, with `c` a scalar and exactly one of `a`, `b` an index expression (a
  function of IOTAs and constants alone), is `where(i, where(o, x, c), c)` with `i` the index
  expression outside: both pick `x` exactly where `a & b` holds and `c` elsewhere. The attention
  kernel then sees a causal `where` around the softmax's input and a padding mask it reads as a
  vector along the keys (`o` is [B, 1, 1, S]).

Needs: a verified graph in program order. Leaves: the same values at every node id still read;
the and-node stays for its other readers (dce drops it when none are left).
"""

from __future__ import annotations

from dataclasses import replace

from ..ir.graph import BINARY, UNARY, Node, Op, Program, tree_map
from ..ir.shapes import infer

INTEGERS = {"int8", "int16", "int32", "int64", "uint8"}
# Index expressions: element-wise ops and reshapes of IOTAs and constants.
_INDEX_OPS = UNARY | BINARY | {Op.WHERE, Op.RESHAPE, Op.CAST}


def simplify(program: Program) -> Program:
    g = program.main
    by_id: dict[int, Node] = {}
    next_id = max((n.id for n in g.nodes), default=-1) + 1
    alias: dict[int, int] = {}
    out: list[Node] = []
    index_only: dict[int, bool] = {}

    def is_index(i: int) -> bool:
        if i not in index_only:
            n = by_id[i]
            index_only[i] = n.op in (Op.IOTA, Op.CONST, Op.FULL) or (
                n.op in _INDEX_OPS and bool(n.inputs) and all(is_index(j) for j in n.inputs))
        return index_only[i]

    def scalar_value(i: int):
        n = by_id[i]
        if n.op in (Op.CONST, Op.FULL) and tuple(n.shape) == ():
            return n.attr("value")
        return None

    def add(n: Node) -> None:
        by_id[n.id] = n
        out.append(n)

    for n in g.nodes:
        n = replace(n, inputs=tuple(alias.get(i, i) for i in n.inputs))
        if n.op is Op.STOP_GRADIENT:            # the identity, once autodiff has run
            alias[n.id] = n.inputs[0]
            continue
        if n.op is Op.CAST and by_id[n.inputs[0]].dtype == n.dtype and \
                tuple(by_id[n.inputs[0]].shape) == tuple(n.shape):
            alias[n.id] = n.inputs[0]           # a cast to the value's own dtype
            continue
        same = _identity_operand(n, by_id, scalar_value)
        if same is not None:
            alias[n.id] = same
            continue
        if n.op is Op.WHERE:
            split = _split_where(n, by_id, scalar_value, is_index)
            if split is not None:
                inner_cond, outer_cond = split
                x, c = n.inputs[1], n.inputs[2]
                dtype, shape = infer(Node(next_id, Op.WHERE, (inner_cond, x, c), n.dtype, n.shape, (), n.src),
                                     [(by_id[i].dtype, by_id[i].shape) for i in (inner_cond, x, c)])
                inner = Node(next_id, Op.WHERE, (inner_cond, x, c), dtype, tuple(shape), (), n.src)
                next_id += 1
                add(inner)
                n = replace(n, inputs=(outer_cond, inner.id, c))
        add(n)
    return program.replace_main(g.with_nodes(out, tree_map(g.output, lambda i: alias.get(i, i))))


def _identity_operand(n: Node, by_id: dict[int, Node], scalar_value) -> int | None:
    """The input `n` equals exactly (same shape and dtype), or None."""
    if len(n.inputs) != 2 or n.op not in (Op.ADD, Op.SUB, Op.MUL, Op.AND, Op.OR):
        return None
    a, b = n.inputs
    for keep, other, commutes in ((a, b, True), (b, a, n.op is not Op.SUB)):
        if not commutes:
            continue
        k = by_id[keep]
        if k.dtype != n.dtype or tuple(k.shape) != tuple(n.shape):
            continue
        value = scalar_value(other)
        if value is None:
            continue
        if n.dtype in INTEGERS and type(value) is int and (
                (n.op in (Op.ADD, Op.SUB) and value == 0) or (n.op is Op.MUL and value == 1)):
            return keep
        if n.dtype == "bool" and type(value) is bool and (
                (n.op is Op.AND and value is True) or (n.op is Op.OR and value is False)):
            return keep
    return None


def _split_where(n: Node, by_id: dict[int, Node], scalar_value, is_index) -> tuple[int, int] | None:
    """(inner condition, outer condition) for `where(a & b, x, c)` as the module doc says, or None."""
    cond = by_id[n.inputs[0]]
    if cond.op is not Op.AND or cond.dtype != "bool" or scalar_value(n.inputs[2]) is None:
        return None
    a, b = cond.inputs
    if any(by_id[i].dtype != "bool" for i in (a, b)):
        return None
    ia, ib = is_index(a), is_index(b)
    if ia == ib:
        return None
    return (b, a) if ia else (a, b)
