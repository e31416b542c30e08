"""Every op that is not element-wise: sources, matmul, reductions, softmax, views, gathers, host
calls, function calls and collectives, one `OpDef` each.

Their kernels are kernel templates (codegen), not one-line expressions, so only the sources that
fuse into element-wise kernels carry Triton code. Ops whose CPU semantics need the executor's
own state (engine inputs, the seeded counters, run-time indices, PyTorch operators) leave `cpu`
to the executor, which the registry test checks.
"""

from __future__ import annotations

from typing import Any

from .core import (FLOATS, INTEGERS, NO_GRADIENT, Kind, Op, OpDef, Shape, ShapeError, TritonCtx, attrs_of, broadcast,
                   dim_expr)


def _norm_dim(d: int, rank: int) -> int:
    r = max(rank, 1)
    if not -r <= d < r:
        raise ShapeError(f"dimension {d} out of range for rank {rank}")
    return d % r


def numel(shape: Shape) -> int | None:
    total = 1
    for d in shape:
        if not isinstance(d, int):
            return None
        total *= d
    return total


def index_shape(shape: Shape, items: Any) -> Shape:
    out: list = []
    for axis, item in enumerate(items):
        kind = item[0]
        size = shape[axis]
        if kind == "i":             # ("i", constant index)
            if isinstance(size, int) and not -size <= item[1] < size:
                raise ShapeError(f"index {item[1]} out of bounds for dimension {axis} of size {size}")
        elif kind == "d":           # ("d", input position): a run-time index
            pass
        else:                       # ("s", lo, hi, step)
            _, lo, hi, step = item
            if isinstance(size, int):
                out.append(len(range(size)[slice(lo, hi, step)]))
            elif lo is None and hi is None and step in (None, 1):
                out.append(size)
            elif isinstance(hi, int) and hi >= 0 and (lo is None or isinstance(lo, int) and lo >= 0) \
                    and (step is None or isinstance(step, int) and step > 0):
                # A constant window of a symbolic dim (`x[:, 0:1]`): its length whenever the dim
                # reaches `hi` (specialisation recomputes it from the real size).
                out.append(len(range(lo or 0, hi, step or 1)))
            elif hi is None and isinstance(lo, int) and lo > 0 and step in (None, 1):
                out.append(dim_expr(f"({size})-{lo}"))          # x[1:] of a symbolic dim
            else:
                out.append(f"{size}[{'' if lo is None else lo}:{'' if hi is None else hi}:{'' if step is None else step}]")
    out.extend(shape[len(items):])
    return tuple(out)


# --- shape rules ---------------------------------------------------------------------------------
def _declared(node, ins):
    return node.dtype, node.shape


def _same(node, ins):
    return ins[0]


def _matmul(node, ins):
    (da, a), (db, b) = ins
    if da != db or not a or not b:
        raise ShapeError(f"`matmul` of {da}{list(a)} and {db}{list(b)}")
    ka, kb = a[-1], (b[-2] if len(b) >= 2 else b[0])
    if ka != kb:
        raise ShapeError(f"matmul inner dimensions differ: {list(a)} @ {list(b)} ({ka} vs {kb})")
    batch = broadcast(a[:-2], b[:-2]) if (len(a) > 2 or len(b) > 2) else ()
    if node.attr("widened"):        # float32 results of 16-bit operands (passes/split_products.py)
        if da not in ("bfloat16", "float16"):
            raise ShapeError(f"a widened `matmul` takes 16-bit operands, not {da}")
        da = "float32"
    return da, batch + (a[-2:-1] if len(a) >= 2 else ()) + (b[-1:] if len(b) >= 2 else ())


def _reduce(node, ins):
    dtype, shape = ins[0]
    dim, keep = node.attr("dim"), node.attr("keepdim", False)
    if dim is None:
        return dtype, tuple(1 for _ in shape) if keep else ()
    if not shape:
        return dtype, shape
    d = _norm_dim(dim, len(shape))
    return dtype, tuple((1 if i == d else s) for i, s in enumerate(shape) if keep or i != d)


def _normalize(node, ins):
    _norm_dim(node.attr("dim", -1), len(ins[0][1]))
    return ins[0]


def _transpose(node, ins):
    dtype, shape = ins[0]
    d0, d1 = _norm_dim(node.attr("dim0"), len(shape)), _norm_dim(node.attr("dim1"), len(shape))
    s = list(shape)
    s[d0], s[d1] = s[d1], s[d0]
    return dtype, tuple(s)


def _reshape(node, ins):
    before, after = numel(ins[0][1]), numel(node.shape)
    if before is not None and after is not None and before != after:
        raise ShapeError(f"cannot reshape {list(ins[0][1])} ({before} elements) into {list(node.shape)}")
    return ins[0][0], node.shape


def _index(node, ins):
    return ins[0][0], index_shape(ins[0][1], node.attr("items"))


def _unindex(node, ins):
    expected = index_shape(node.shape, node.attr("items"))
    if tuple(expected) != tuple(ins[0][1]):
        raise ShapeError(f"`unindex` of {list(ins[0][1])} into {list(node.shape)} needs {list(expected)}")
    return ins[0][0], node.shape


def _gather(node, ins):
    (dtype, table), (idx_dtype, idx) = ins
    if not table:
        raise ShapeError("`gather` needs a table of rank 1 or more, got a scalar")
    if idx_dtype not in INTEGERS:
        raise ShapeError(f"`gather` indices must be integers, got {idx_dtype}")
    return dtype, tuple(idx) + tuple(table[1:])


def _scatter_add(node, ins):
    (idx_dtype, idx), (dtype, src) = ins
    rows = node.attr("rows")
    if idx_dtype not in INTEGERS or len(idx) != 1:
        raise ShapeError(f"`scatter_add` needs integer indices [N], got {idx_dtype}{list(idx)}")
    if dtype not in FLOATS or len(src) != 2:
        raise ShapeError(f"`scatter_add` needs floating-point rows [N, D] to add, got {dtype}{list(src)}")
    if src[0] != idx[0]:
        raise ShapeError(f"`scatter_add` needs one index per row: {list(idx)} indices for rows {list(src)}")
    if not isinstance(rows, int) or isinstance(rows, bool) or rows < 1:
        raise ShapeError(f"`scatter_add` needs a positive static row count, got {rows!r}")
    return dtype, (rows, src[1])


# --- VJPs (A: passes/autodiff.py's adjoint builder) ------------------------------------------------
def _vjp_identity(A, n, g, ins):
    A.accumulate(ins[0].id, g)


def _vjp_matmul(A, n, g, ins):
    a, b = ins

    def t(nid: int) -> int:
        m = A.node(nid)
        if len(m.shape) < 2:
            return nid
        shape = m.shape[:-2] + (m.shape[-1], m.shape[-2])
        r = len(m.shape)
        return A.add(Op.TRANSPOSE, (nid,), m, shape=shape, attrs=attrs_of(dim0=r - 2, dim1=r - 1))

    def mm(p: int, q: int) -> int:
        pn, qn = A.node(p), A.node(q)
        batch = broadcast(pn.shape[:-2], qn.shape[:-2]) if (len(pn.shape) > 2 or len(qn.shape) > 2) else ()
        shape = batch + (pn.shape[-2:-1] if len(pn.shape) >= 2 else ()) + (qn.shape[-1:] if len(qn.shape) >= 2 else ())
        return A.add(Op.MATMUL, (p, q), n, shape=shape)

    g_ = g
    a_id, b_id = a.id, b.id
    # Treat 1-D operands as matrices: [K] -> [1, K] (left) or [K, 1] (right).
    if len(a.shape) == 1:
        a_id = A.add(Op.RESHAPE, (a.id,), a, shape=(1, a.shape[0]))
        g_ = A.add(Op.RESHAPE, (g_,), A.node(g_), shape=A.node(g_).shape[:-1] + (1,) + A.node(g_).shape[-1:]) \
            if len(b.shape) >= 2 else A.add(Op.RESHAPE, (g_,), A.node(g_), shape=(1,))
    if len(b.shape) == 1:
        b_id = A.add(Op.RESHAPE, (b.id,), b, shape=(b.shape[0], 1))
        g_ = A.add(Op.RESHAPE, (g_,), A.node(g_), shape=A.node(g_).shape + (1,))
    if len(a.shape) == 1 and len(b.shape) == 1:
        g_ = A.add(Op.RESHAPE, (g,), A.node(g), shape=(1, 1))
    ga = mm(g_, t(b_id))
    gb = mm(t(a_id), g_)
    if len(a.shape) == 1:
        ga = A.add(Op.RESHAPE, (A.sum_to(ga, (1, a.shape[0])),), a, shape=a.shape)
    if len(b.shape) == 1:
        gb = A.add(Op.RESHAPE, (A.sum_to(gb, (b.shape[0], 1)),), b, shape=b.shape)
    A.accumulate(a.id, ga)
    A.accumulate(b.id, gb)


def _vjp_reduce(A, n, g, ins):
    x = ins[0]
    dim, keep = n.attr("dim"), n.attr("keepdim", False)
    if dim is None:
        keep_shape = tuple(1 for _ in x.shape)
    else:
        keep_shape = tuple(1 if i == dim else s for i, s in enumerate(x.shape))
    gk = g if keep or not x.shape else A.add(Op.RESHAPE, (g,), A.node(g), shape=keep_shape)
    over = attrs_of(dim=dim, keepdim=True) if dim is not None else attrs_of(dim=None, keepdim=True)
    if n.op is Op.SUM:
        A.accumulate(x.id, A.expand(gk, x))
        return
    if n.op is Op.MEAN:
        # The count of reduced elements, as a value: sum a tensor of ones over the same dims
        # (shapes may be symbolic until the first run, so it cannot be a constant).
        ones = A.add(Op.FULL, (), x, attrs=attrs_of(value=1.0))
        count = A.add(Op.SUM, (ones,), x, shape=keep_shape, attrs=over)
        A.accumulate(x.id, A.expand(A.add(Op.DIV, (gk, count), A.node(gk), shape=keep_shape), x))
        return
    # max / min: the gradient goes to the extreme elements, shared equally between ties.
    yk = n.id if keep or not x.shape else A.add(Op.RESHAPE, (n.id,), n, shape=keep_shape)
    hit = A.add(Op.EQ, (x.id, yk), x, dtype="bool")
    ones = A.add(Op.CAST, (hit,), x)
    ties = A.add(Op.SUM, (ones,), x, shape=keep_shape, attrs=over)
    share = A.add(Op.DIV, (gk, ties), A.node(gk), shape=keep_shape)
    A.accumulate(x.id, A.add(Op.MUL, (ones, share), x))


def _row_sum(A, n, v: int) -> int:
    d = n.attr("dim")
    keep = tuple(1 if i == d else s for i, s in enumerate(n.shape))
    return A.add(Op.SUM, (v,), n, shape=keep, attrs=attrs_of(dim=d, keepdim=True))


def _bmul(A, a: int, c: int, like) -> int:
    return A.add(Op.MUL, (a, c), like, shape=broadcast(A.node(a).shape, A.node(c).shape))


def _vjp_softmax(A, n, g, ins):                 # y * (g - sum(g * y))
    s = _row_sum(A, n, _bmul(A, g, n.id, n))
    A.accumulate(ins[0].id, _bmul(A, n.id, A.add(Op.SUB, (g, s), n), n))


def _vjp_log_softmax(A, n, g, ins):             # g - exp(y) * sum(g)
    s = _row_sum(A, n, g)
    A.accumulate(ins[0].id, A.add(Op.SUB, (g, _bmul(A, A.add(Op.EXP, (n.id,), n), s, n)), n))


def _vjp_transpose(A, n, g, ins):
    A.accumulate(ins[0].id, A.add(Op.TRANSPOSE, (g,), ins[0], attrs=n.attrs))


def _vjp_reshape(A, n, g, ins):
    A.accumulate(ins[0].id, A.add(Op.RESHAPE, (g,), ins[0]))


def _vjp_index(A, n, g, ins):
    A.accumulate(ins[0].id, A.add(Op.UNINDEX, (g, *n.inputs[1:]), ins[0], attrs=n.attrs))


def _vjp_unindex(A, n, g, ins):
    A.accumulate(ins[0].id, A.add(Op.INDEX, (g, *n.inputs[1:]), ins[0], attrs=n.attrs))


# --- CPU semantics ---------------------------------------------------------------------------------
def _cpu_const(node, args, dt):
    import torch
    return torch.tensor(node.attr("value"), dtype=dt)


def _cpu_full(node, args, dt):
    import torch
    return torch.full(node.shape, node.attr("value"), dtype=dt)


def _cpu_iota(node, args, dt):
    import torch
    return torch.arange(node.shape[0], dtype=dt)


def _cpu_scatter_add(node, args, dt):
    """Each row of src added into row idx[i] of zeros [rows, D], in the order of i; an index outside
    [0, rows) adds nothing (as a one-hot product's row of zeros). Sums in float32 (float64 for
    float64 rows), rounded once to the rows' dtype, as the kernel does."""
    import torch
    idx, src = args
    rows = int(node.attr("rows"))
    acc = torch.float64 if src.dtype == torch.float64 else torch.float32
    idx = idx.to(torch.int64)
    keep = (idx >= 0) & (idx < rows)
    out = torch.zeros((rows, src.shape[1]), dtype=acc, device=src.device)
    return out.index_add_(0, idx[keep], src[keep].to(acc)).to(src.dtype)


def _cpu_matmul(node, args, dt):
    import torch
    if node.attr("widened"):        # the float32 accumulator kept (16-bit products are exact in it)
        return torch.matmul(args[0].float(), args[1].float())
    return torch.matmul(args[0], args[1])


_REDUCERS = {Op.SUM: "sum", Op.MEAN: "mean", Op.MAX: "amax", Op.MIN: "amin"}


def _cpu_reduce(node, args, dt):
    import torch
    fn = getattr(torch, _REDUCERS[node.op])
    dim, keep = node.attr("dim"), node.attr("keepdim", False)
    x = args[0]
    if dim is None:
        out = fn(x)
        return out.reshape((1,) * x.dim()) if keep else out
    if x.dim() == 0:
        return x
    return fn(x, dim=dim, keepdim=keep)


def _cpu_softmax(node, args, dt):
    import torch
    out = torch.softmax(args[0], dim=node.attr("dim"))
    if node.attr("safe", False):        # a row of -inf alone gives zeros (torch's _safe_softmax)
        empty = (args[0] == float("-inf")).all(dim=node.attr("dim"), keepdim=True)
        out = out.masked_fill(empty, 0.0)
    return out


def _cpu_log_softmax(node, args, dt):
    import torch
    return torch.log_softmax(args[0], dim=node.attr("dim"))


def _cpu_transpose(node, args, dt):
    return args[0].transpose(node.attr("dim0"), node.attr("dim1"))


def _cpu_reshape(node, args, dt):
    return args[0].reshape(node.shape)


def _cpu_identity(node, args, dt):
    return args[0]              # one process holds every shard, every stage, every microbatch


# --- Triton code of the sources that fuse into element-wise kernels ---------------------------------
def _tri_full(c: TritonCtx) -> str:
    return c.literal(c.attrs["value"], c.out_dtype)


def _tri_iota(c: TritonCtx) -> str:
    return f"({c.index}).to({c.tl(c.dtype)})"


def _uniforms(c: TritonCtx) -> tuple[str, str]:
    seed = c.a
    if seed.lstrip("-").isdigit():          # a constant seed
        seed = f"tl.full([], {seed}, tl.int64)"
    return f"_uniform({seed}, {c.index}, 0)", f"_uniform({seed}, {c.index}, 1)"


def _tri_rand(c: TritonCtx) -> str:
    return f"({_uniforms(c)[0]}).to({c.tl(c.dtype)})"


def _tri_randn(c: TritonCtx) -> str:
    u1, u2 = _uniforms(c)
    return f"(tl.sqrt(-2.0 * tl.log({u1})) * tl.cos(6.283185307179586 * {u2})).to({c.tl(c.dtype)})"


def _source(op: Op, arity: int, attrs: tuple[str, ...] = (), cpu=None, triton=None) -> OpDef:
    return OpDef(op, Kind.SOURCE, arity, _declared, attrs=attrs, vjp=NO_GRADIENT, cpu=cpu, triton=triton)


def _collective(op: Op, attrs: tuple[str, ...] = (), arity: int | None = 1) -> OpDef:
    return OpDef(op, Kind.COLLECTIVE, arity, _same, attrs=attrs, vjp=_vjp_identity, cpu=_cpu_identity)


def _reduction(op: Op, builtin: str) -> OpDef:
    return OpDef(op, Kind.REDUCE, 1, _reduce, builtin=builtin, vjp=_vjp_reduce, cpu=_cpu_reduce)


DEFS = (
    _source(Op.INPUT, 0, ("name",)),
    _source(Op.PARAM, 0, ("index",)),
    _source(Op.CONST, 0, ("value",), cpu=_cpu_const),
    _source(Op.FULL, 0, ("value",), cpu=_cpu_full, triton=_tri_full),
    _source(Op.RANDN, 1, triton=_tri_randn),
    _source(Op.RAND, 1, triton=_tri_rand),
    _source(Op.IOTA, 0, cpu=_cpu_iota, triton=_tri_iota),
    OpDef(Op.MATMUL, Kind.CONTRACT, 2, _matmul, vjp=_vjp_matmul, cpu=_cpu_matmul),
    _reduction(Op.SUM, "sum"),
    _reduction(Op.MEAN, "mean"),
    _reduction(Op.MAX, "max"),
    _reduction(Op.MIN, "min"),
    OpDef(Op.SOFTMAX, Kind.NORMALIZE, 1, _normalize, attrs=("dim",), builtin="softmax",
          vjp=_vjp_softmax, cpu=_cpu_softmax),
    OpDef(Op.LOG_SOFTMAX, Kind.NORMALIZE, 1, _normalize, attrs=("dim",), builtin="log_softmax",
          vjp=_vjp_log_softmax, cpu=_cpu_log_softmax),
    OpDef(Op.TRANSPOSE, Kind.VIEW, 1, _transpose, attrs=("dim0", "dim1"), vjp=_vjp_transpose, cpu=_cpu_transpose),
    OpDef(Op.RESHAPE, Kind.VIEW, 1, _reshape, vjp=_vjp_reshape, cpu=_cpu_reshape),
    # One input plus one per run-time index in `items` (ir/verify.py counts them).
    OpDef(Op.INDEX, Kind.VIEW, None, _index, attrs=("items",), vjp=_vjp_index),
    OpDef(Op.UNINDEX, Kind.VIEW, None, _unindex, attrs=("items",), vjp=_vjp_unindex),
    OpDef(Op.GATHER, Kind.GATHER, 2, _gather),
    # Made by passes/lookups.py from a one-hot product's transpose, after autodiff: no VJP yet.
    OpDef(Op.SCATTER_ADD, Kind.SCATTER, 2, _scatter_add, attrs=("rows",), cpu=_cpu_scatter_add),
    OpDef(Op.EXTERN, Kind.HOST, None, _declared, attrs=("call", "args")),
    OpDef(Op.CALL, Kind.FUNCTION, None, _declared, attrs=("func",)),
    OpDef(Op.PROJ, Kind.FUNCTION, 1, _declared, attrs=("index",)),
    _collective(Op.SHARD, ("dim",)),
    _collective(Op.ALL_GATHER, ("dim",)),
    _collective(Op.ALL_REDUCE),
    _collective(Op.REDUCE_SCATTER, ("dim",)),
    _collective(Op.ALL_TO_ALL, ("src", "dim")),
    # (x) with a `stage` attribute, or (g, x) without one before passes/stage.py (ir/verify.py).
    _collective(Op.STAGE, arity=None),
    _collective(Op.MICROBATCH, ("dim", "parts")),
)
