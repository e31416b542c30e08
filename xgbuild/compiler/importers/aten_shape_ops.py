"""The ATen shape, source, convolution and pooling ops, registered into `aten_table.TABLE`.

Target shapes of views come from the node's `meta["val"]` (export resolved `-1` and symbolic sizes).
"""

from __future__ import annotations

from ..ir.graph import Op
from ..ir.shapes import FLOATS
from . import composites as C
from .aten_table import arg, op, out_dtype, pads, pair
from .builder import TranslationError, is_node

# --- shapes ---------------------------------------------------------------------------------------
@op("aten.view", "aten.reshape", "aten._unsafe_view", "aten.flatten", "aten.unflatten", "aten.squeeze",
    "aten.unsqueeze", "aten.view_as")
def _reshape(t, node, args, kwargs):
    return t.b.reshape(args[0], t.shape_of(node))


@op("aten.permute")
def _permute(t, node, args, kwargs):
    return t.b.permute(args[0], args[1])


@op("aten.transpose")
def _transpose(t, node, args, kwargs):
    return t.b.transpose(args[0], int(args[1]), int(args[2]))


@op("aten.expand", "aten.expand_as", "aten.broadcast_to")
def _expand(t, node, args, kwargs):
    return t.b.expand(args[0], t.shape_of(node))


@op("aten.select")
def _select(t, node, args, kwargs):
    return t.b.select(args[0], int(args[1]), int(args[2]))


@op("aten.slice")
def _slice(t, node, args, kwargs):
    x = args[0]
    dim = int(arg(args, kwargs, 1, "dim", 0))
    start, end = arg(args, kwargs, 2, "start"), arg(args, kwargs, 3, "end")
    step = int(arg(args, kwargs, 4, "step", 1))
    size = t.b.shape(x)[dim]
    if not all(isinstance(v, (int, type(None))) for v in (start, end)):
        if step != 1 or not all(isinstance(v, (int, str, type(None))) for v in (start, end)):
            raise TranslationError("slice with symbolic bounds and a step")
        if end == size or end is None:
            end = None
        if isinstance(end, str) or isinstance(start, str):
            if isinstance(start, int) and start < 0 or isinstance(end, int) and end < 0:
                raise TranslationError("slice of a symbolic size with a negative bound")
            return C.slice_dyn(t.b, x, dim, start or 0, end if end is not None else size)
    if end is not None and isinstance(size, int) and end >= size:
        end = None
    if end is not None and end >= 2**62:
        end = None
    return t.b.slice(x, dim, start, end, step)


@op("aten.narrow")
def _narrow(t, node, args, kwargs):
    x, dim, start, length = args
    return t.b.slice(x, int(dim), int(start), int(start) + int(length))


@op("aten.split", "aten.split_with_sizes", "aten.chunk", "aten.unbind")
def _split(t, node, args, kwargs):
    x = args[0]
    name = str(node.target.overloadpacket)
    dim = int(arg(args, kwargs, 2 if name != "aten.unbind" else 1, "dim", 0))
    if name == "aten.unbind":
        return tuple(t.b.select(x, dim, i) for i in range(t.b.shape(x)[dim]))
    outs, start = [], 0
    for v in node.meta["val"]:
        n = int(v.shape[dim])
        outs.append(t.b.slice(x, dim, start, start + n))
        start += n
    return tuple(outs)


@op("_operator.getitem")
def _getitem(t, node, args, kwargs):
    seq, i = args
    if not isinstance(seq, (tuple, list)):
        raise TranslationError("indexing a value that is not a tuple")
    return seq[i]


@op("aten.stack")
def _stack(t, node, args, kwargs):
    dim = int(arg(args, kwargs, 1, "dim", 0))
    dt = out_dtype(node)
    xs = [t.b.unsqueeze(t.b.cast(x, dt), dim) for x in args[0]]
    return C.cat(t.b, xs, dim)


@op("aten.repeat")
def _repeat(t, node, args, kwargs):
    """x.repeat(r0, r1, …): a broadcast over a new axis before each repeated dim, then a reshape."""
    x, reps = args[0], [int(r) for r in args[1]]
    shape = list(t.b.shape(x))
    shape = [1] * (len(reps) - len(shape)) + shape
    x = t.b.reshape(x, tuple(shape))
    inter = tuple(d for s, r in zip(shape, reps) for d in (1, s))
    wide = tuple(d for s, r in zip(shape, reps) for d in (r, s))
    return t.b.reshape(t.b.expand(t.b.reshape(x, inter), wide), t.shape_of(node))


@op("aten.cat", "aten.concat", "aten.concatenate")
def _cat(t, node, args, kwargs):
    xs = [x for x in args[0] if x is not None]
    dim = int(arg(args, kwargs, 1, "dim", 0))
    dt = out_dtype(node)
    return C.cat(t.b, [t.b.cast(x, dt) for x in xs], dim)


# --- sources --------------------------------------------------------------------------------------
@op("aten.arange")
def _arange(t, node, args, kwargs):
    # (end), (start, end) or (start, end, step); the length comes from the node's own shape, so an
    # end that is a symbolic size (`arange(x.shape[0])` under a dynamic batch) needs nothing more.
    start = args[0] if len(args) >= 2 else 0
    step = args[2] if len(args) >= 3 else 1
    start, step = kwargs.get("start", start), kwargs.get("step", step)
    for name, v in (("start", start), ("step", step)):
        if not isinstance(v, (int, float)) or isinstance(v, bool):
            raise TranslationError(f"arange with a {name} that is not a constant number ({v!r})")
    n = t.shape_of(node)[0]
    dt = out_dtype(node)
    ramp = t.b.iota(n, "int64" if dt not in FLOATS else dt)
    if start != 0 or step != 1:
        ramp = t.b.binary(Op.ADD, t.b.binary(Op.MUL, ramp, step), start)
    return t.b.cast(ramp, dt)


@op("aten.full", "aten.zeros", "aten.ones", "aten.full_like", "aten.zeros_like", "aten.ones_like",
    "aten.new_zeros", "aten.new_ones", "aten.new_full", "aten.scalar_tensor")
def _full(t, node, args, kwargs):
    name = str(node.target.overloadpacket)
    if "zeros" in name:
        value = 0
    elif "ones" in name:
        value = 1
    elif name == "aten.scalar_tensor":
        value = args[0]
    elif name in ("aten.full", "aten.full_like"):
        value = args[1]
    else:
        value = args[2]
    if is_node(value):
        raise TranslationError("a fill value that is a tensor")
    return t.b.full(value, out_dtype(node), t.shape_of(node))


@op("aten.rand", "aten.randn", "aten.rand_like", "aten.randn_like")
def _random(t, node, args, kwargs):
    """Random draws that only feed computation the model discards in eval mode (a layer-drop
    coin): a RAND / RANDN node. One that survives dead-code elimination (its value reaches an
    output) is refused after the passes: PyTorch's generator cannot be reproduced."""
    name = str(node.target.overloadpacket)
    seed = t.b.const(len(t.b.b.nodes), "int64")
    kind = Op.RANDN if "randn" in name else Op.RAND
    return t.b.add(kind, [seed], out_dtype(node), t.shape_of(node))


# --- convolution, padding, pooling -----------------------------------------------------------------
def _per_dim(v, nd: int) -> tuple[int, ...]:
    v = list(v) if isinstance(v, (list, tuple)) else [v]
    return tuple(int(x) for x in (v * nd if len(v) == 1 else v))


@op("aten.conv1d", "aten.conv2d", "aten.conv3d", "aten.convolution")
def _conv(t, node, args, kwargs):
    """Convolutions of 1 to 3 spatial dims; PyTorch's padding is symmetric per dim, or "valid" /
    "same" (stride 1: the extra padding goes after, as PyTorch does)."""
    name = str(node.target.overloadpacket)
    x, w = args[0], args[1]
    nd = t.b.rank(w) - 2
    if name == "aten.convolution":
        _, _, bias, stride, padding, dilation, transposed, _out_pad, groups = args[:9]
        if transposed:
            raise TranslationError("transposed convolution")
    else:
        bias = arg(args, kwargs, 2, "bias")
        stride, padding = arg(args, kwargs, 3, "stride", 1), arg(args, kwargs, 4, "padding", 0)
        dilation, groups = arg(args, kwargs, 5, "dilation", 1), arg(args, kwargs, 6, "groups", 1)
    stride, dilation = _per_dim(stride, nd), _per_dim(dilation, nd)
    if padding == "valid":
        spans = [(0, 0)] * nd
    elif padding == "same":
        if any(s != 1 for s in stride):
            raise TranslationError("padding='same' with a stride other than 1")
        total = [d * (k - 1) for d, k in zip(dilation, t.b.shape(w)[2:])]
        spans = [(p // 2, p - p // 2) for p in total]
    elif isinstance(padding, str):
        raise TranslationError(f"convolution padding={padding!r}")
    else:
        spans = [(p, p) for p in _per_dim(padding, nd)]
    return C.conv(t.b, x, w, bias, stride, spans, dilation, int(groups))


@op("aten.pad", "aten.constant_pad_nd", "aten.reflection_pad1d", "aten.reflection_pad2d",
    "aten.reflection_pad3d", "aten.replication_pad1d", "aten.replication_pad2d", "aten.replication_pad3d")
def _pad(t, node, args, kwargs):
    """F.pad's (last dim first) amounts per dim: constant (any value), reflect, replicate."""
    name = str(node.target.overloadpacket)
    x, amounts = args[0], [int(p) for p in args[1]]
    if name == "aten.pad":
        mode, value = arg(args, kwargs, 2, "mode", "constant"), arg(args, kwargs, 3, "value", None)
    elif name == "aten.constant_pad_nd":
        mode, value = "constant", arg(args, kwargs, 2, "value", 0)
    else:
        mode, value = ("reflect" if "reflection" in name else "replicate"), None
    if mode == "circular":
        raise TranslationError("circular padding")
    if len(amounts) % 2 or len(amounts) // 2 > t.b.rank(x):
        raise TranslationError(f"padding amounts {amounts} for a rank-{t.b.rank(x)} tensor")
    pairs = [(amounts[i], amounts[i + 1]) for i in range(0, len(amounts), 2)][::-1]
    pairs = [(0, 0)] * (t.b.rank(x) - len(pairs)) + pairs
    if is_node(value):
        raise TranslationError("a padding value that is a tensor")
    value = 0 if value is None else value
    return C.pad(t.b, x, pairs, value, mode)


# --- indexing -------------------------------------------------------------------------------------
@op("aten.index")
def _index(t, node, args, kwargs):
    x, indices = args[0], list(args[1])
    for i in indices:
        if i is not None and not is_node(i):
            raise TranslationError("an index that is not a tensor")
    return C.advanced_index(t.b, x, indices)


@op("aten.index_select")
def _index_select(t, node, args, kwargs):
    return C.take(t.b, args[0], int(args[1]), args[2])


@op("aten.gather", "aten.take_along_dim")
def _gather(t, node, args, kwargs):
    name = str(node.target.overloadpacket)
    if name == "aten.take_along_dim":
        x, idx, dim = args[0], args[1], arg(args, kwargs, 2, "dim")
        if dim is None:
            raise TranslationError("take_along_dim without a dim")
    else:
        x, dim, idx = args[0], int(args[1]), args[2]
        if kwargs.get("sparse_grad"):
            raise TranslationError("gather with sparse_grad=True")
    return C.gather_elements(t.b, x, int(dim), idx)


@op("aten.max_pool2d", "aten.max_pool2d_with_indices")
def _max_pool(t, node, args, kwargs):
    k = pair(args[1])
    stride = arg(args, kwargs, 2, "stride") or k
    out = C.pool2d(t.b, args[0], "max", k, pair(stride), pads(arg(args, kwargs, 3, "padding", 0)),
                   pair(arg(args, kwargs, 4, "dilation", 1)), bool(arg(args, kwargs, 5, "ceil_mode", False)))
    return (out, None) if "indices" in str(node.target.overloadpacket) else out


@op("aten.avg_pool2d")
def _avg_pool(t, node, args, kwargs):
    k = pair(args[1])
    stride = arg(args, kwargs, 2, "stride") or k
    return C.pool2d(t.b, args[0], "avg", k, pair(stride), pads(arg(args, kwargs, 3, "padding", 0)),
                    ceil_mode=bool(arg(args, kwargs, 4, "ceil_mode", False)),
                    count_include_pad=bool(arg(args, kwargs, 5, "count_include_pad", True)),
                    divisor=arg(args, kwargs, 6, "divisor_override"))


@op("aten.adaptive_avg_pool2d", "aten._adaptive_avg_pool2d")
def _adaptive_avg(t, node, args, kwargs):
    return C.adaptive_avg_pool2d(t.b, args[0], pair(args[1]))


@op("aten.adaptive_avg_pool1d")
def _adaptive_avg_1d(t, node, args, kwargs):
    """Over the last dim, as the 2-D pooling of a height of one."""
    x = args[0]
    shape = t.b.shape(x)
    out = int(args[1][0] if isinstance(args[1], (list, tuple)) else args[1])
    y = C.adaptive_avg_pool2d(t.b, t.b.reshape(x, shape[:-1] + (1, shape[-1])), (1, out))
    return t.b.reshape(y, shape[:-1] + (out,))


