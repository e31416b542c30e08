"""Casts move across views to the narrow side, so no kernel exists only to change a dtype.

The precision policy (precision.py) makes every product take bfloat16 operands and give a
bfloat16 result, and everything else compute in float32. Between the two sit views: attention's
heads are `transpose(reshape(qkv[:, 0:D], [B, T, H, DH]))` of a float32 projection, cast to
bfloat16 for `q @ kT`; the backward pass casts each bfloat16 `attn_grad` to float32, transposes it
back and places it in the projection's gradient. A cast read through a view (or a view read
through a cast) is a kernel of its own: a GPT-2-small training step launched 120 of them, writing
float32 copies of bfloat16 values and bfloat16 copies of float32 ones (1.9 ms of 32 on an H200;
24 remained, the heads merged for the output projection, a reshape of a transposed value: the
merge-heads pass after this one has the attention kernel write those). A cast
commutes with every view (it changes no element's position, and casts 0 to 0), so:

- A widening cast read through views (`view(cast_w(y))`, y narrower) becomes `cast_w(view(y))`
  where a fusable kernel (element-wise, row reduction) reads the view: that kernel loads the
  narrow value through the view's strides and widens it in registers.
- A narrowing cast of a widened value read through views, `cast_n(view(cast_w(y)))` with y of
  the narrow dtype, is `view(y)` exactly (widening is exact): no kernel at all.
- A value whose every reader, through views, is the same narrowing cast (the projection above,
  read only as bfloat16 heads) is cast once where it is made, `view(cast_n(x))` for each: the
  cast joins the kernel making x, which writes half the bytes, and the views read that.
- A value whose slices along its first dim are all read as the same narrowing cast, two or more
  (a weight stacked over the layers, each layer's slice cast to bfloat16 for its products), is
  cast whole once, right after it is made, and each slice's cast is that slice of it: one kernel
  instead of one per layer (GPT-2 small's step launched 48 such casts, each a few microseconds of
  work), the same bytes moved. Its other readers (the optimizer) read it as before.

Views here are RESHAPE, TRANSPOSE and constant INDEX (the scheduler's: read through strides), and
UNINDEX (a gather kernel's input, read through strides) in the first two rules. A rewrite is made
only where every chain of views it leaves reads memory through strides (`_strided`): a reshape of
a transposed value would be a copy.

Needs: a verified graph in program order. Leaves: the same values at every node id still read
(a replaced node's readers read its replacement); dce drops what nothing reads.
"""

from __future__ import annotations

from dataclasses import replace

from ...dtypes import FLOAT_DTYPES, ITEMSIZE
from ..ir.graph import Node, Op, Program, tree_ids, tree_map
from ..ir.strides import contiguous_strides, view_strides
from ..ops import op_def
from .fork_casts import FUSABLE
from .rewrite import Inserter

STRIDED = (Op.RESHAPE, Op.TRANSPOSE, Op.INDEX)          # read through strides by any kernel
VIEWLIKE = STRIDED + (Op.UNINDEX,)


def _is_view(n: Node, kinds=VIEWLIKE) -> bool:
    """A view of its one input at constant positions."""
    if n.op not in kinds or len(n.inputs) != 1:
        return False
    return n.op not in (Op.INDEX, Op.UNINDEX) or all(item[0] in ("i", "s") for item in n.attr("items"))


def _wider(a: str, b: str) -> bool:
    """Float dtype `a` holds every value of float dtype `b` exactly, and is wider."""
    return a in FLOAT_DTYPES and b in FLOAT_DTYPES and ITEMSIZE[a] > ITEMSIZE[b]


def _strided(shape: tuple, chain: list[Node]) -> bool:
    """Whether `chain` (views, first applied first) of a dense value of `shape` reads memory
    through strides at every step; an UNINDEX is a kernel reading its input so and writing a
    dense value."""
    if not all(isinstance(d, int) for n in chain for d in tuple(n.shape)) or \
            not all(isinstance(d, int) for d in shape):
        return not any(n.op is Op.RESHAPE for n in chain)
    shape = tuple(shape)
    strides = contiguous_strides(shape)
    for n in chain:
        if n.op is Op.TRANSPOSE:
            a, b = (d % len(shape) for d in (n.attr("dim0"), n.attr("dim1")))
            s = list(strides)
            s[a], s[b] = s[b], s[a]
            strides = tuple(s)
        elif n.op is Op.INDEX:
            out = []
            items = n.attr("items")
            for axis, item in enumerate(items):
                if item[0] == "s":
                    step = item[3] if item[3] is not None else 1
                    if step <= 0:
                        return False
                    out.append(strides[axis] * step)
            strides = tuple(out) + tuple(strides[len(items):])
        elif n.op is Op.RESHAPE:
            new = view_strides(shape, strides, tuple(n.shape))
            if new is None:
                return False
            strides = tuple(new)
        else:                                   # UNINDEX: its output is dense
            strides = contiguous_strides(tuple(n.shape))
        shape = tuple(n.shape)
        if len(strides) != len(shape):
            return False
    return True


def _placement(v: Node) -> tuple[tuple, tuple[int, int]] | None:
    """For an UNINDEX that places its input at one constant index of one axis (every other item a
    whole slice): ((its shape, that axis), (axis, index)); None for any other view."""
    if v.op is not Op.UNINDEX:
        return None
    items = v.attr("items")
    picks = [(axis, item[1]) for axis, item in enumerate(items) if item[0] == "i"]
    whole = all(item[0] == "i" or tuple(item[1:]) == (None, None, None) for item in items)
    if len(picks) != 1 or not whole:
        return None
    axis, index = picks[0]
    size = v.shape[axis]
    if not isinstance(size, int):
        return None
    return (tuple(v.shape), axis), (axis, index % size)


def cast_views(program: Program) -> Program:
    g = program.main
    by_id = dict(g.by_id)
    users = g.users()
    outputs = set(tree_ids(g.output))

    def downstream(nid: int, prefix: list[Node]) -> list[list[Node]]:
        """Each chain of strided views from `nid` to a reader that is not one, `prefix` first."""
        chains = []
        for u in users.get(nid, ()):
            un = by_id[u]
            if _is_view(un, STRIDED):
                chains.extend(downstream(u, prefix + [un]))
            else:
                chains.append(prefix)
        return chains or [prefix]

    def reads_strided(base: int, chain: list[Node], leaf: int | None) -> bool:
        """`chain` over `base`, then (when `leaf` is replaced by it) every chain of views after it."""
        start = _dense_source(base)
        if start is None:
            return False
        src, pre = start
        tails = downstream(leaf, []) if leaf is not None else [[]]
        return all(_strided(tuple(by_id[src].shape), pre + chain + tail) for tail in tails)

    def _dense_source(nid: int):
        """(the first value up `nid`'s views that a kernel or input makes, the views from it)."""
        pre: list[Node] = []
        n = by_id[nid]
        while n.op in STRIDED:
            if not _is_view(n, STRIDED):
                return None
            pre.insert(0, n)
            n = by_id[n.inputs[0]]
        return n.id, pre

    narrowed = _cast_at_source(g, by_id, users, outputs, downstream, reads_strided)
    stacked, wholes = _cast_whole(g, by_id, users, outputs)
    whole: dict[int, int] = {}                     # stacked value -> its cast, in the new graph

    out: list[Node] = []
    new = Inserter(by_id, out)
    alias: dict[int, int] = {}
    # old id -> (base id in the new graph, the views to apply, base's dtype, exact): the value at
    # the old id (exact) or its cast to the base's dtype (not exact), as views of a narrow base.
    narrow: dict[int, tuple[int, list[Node], str, bool]] = {}
    made: dict[tuple[int, int], int] = {}          # (old view id, rebuilt input) -> the rebuilt view
    widened: dict[tuple, int] = {}                 # (old view id, reader's remat) -> cast_w(rebuilt view)
    # A widened placement (cast_w of an UNINDEX that fills one index of one axis) or a sum of
    # disjoint ones: new id -> (its narrow value, the (axis, index) pairs it fills, its frame).
    placed: dict[int, tuple[int, frozenset, tuple]] = {}

    def build(base: int, chain: list[Node]) -> int:
        cur = base
        for v in chain:
            key = (v.id, cur)
            if key not in made:
                attrs = dict(v.attrs)
                made[key] = new.add(v.op, (cur,), v.src, shape=tuple(v.shape), **attrs)
            cur = made[key]
        return cur

    for n in g.nodes:
        if alias:
            n = replace(n, inputs=tuple(alias.get(i, i) for i in n.inputs))
        if n.op is Op.CAST and n.id in stacked:
            v = by_id[n.inputs[0]]
            alias[n.id] = build(whole[v.inputs[0]], [v])     # cast(x[l]) = cast(x)[l]
            continue
        if n.op is Op.CAST and n.inputs[0] in narrow and n.id not in outputs:
            base, chain, dtype, exact = narrow[n.inputs[0]]
            if dtype == n.dtype and (not exact or reads_strided(base, chain, n.id)):
                alias[n.id] = build(base, chain)          # cast_n(view(cast_w(y))) = view(y)
                continue
        if op_def(n.op).kind in FUSABLE and any(i in narrow and narrow[i][3] and narrow[i][1] for i in n.inputs):
            ins = list(n.inputs)
            for k, i in enumerate(ins):
                if i not in narrow or not narrow[i][3] or not narrow[i][1]:
                    continue
                base, chain, _, _ = narrow[i]
                # A recomputed reader's (autodiff's remat marks) cast is recomputed too: the
                # scheduler keeps such values out of the forward pass's kernels and with each other.
                remat = {"remat": n.attr("remat")} if n.attr("remat") else {}
                key = (i, n.attr("remat"))
                if key not in widened:
                    if not reads_strided(base, chain, None):
                        continue
                    narrow_value = build(base, chain)
                    widened[key] = new.add(Op.CAST, (narrow_value,), n.src, dtype=by_id[i].dtype, **remat)
                    spot = _placement(chain[-1])
                    if spot is not None:
                        placed[widened[key]] = (narrow_value, frozenset([spot[1]]), spot[0])
                ins[k] = widened[key]
            n = replace(n, inputs=tuple(ins))
        if n.op is Op.ADD and n.id not in outputs and all(i in placed for i in n.inputs):
            (a, sa, fa), (b, sb, fb) = (placed[i] for i in n.inputs)
            if fa == fb and not sa & sb and by_id[a].dtype == by_id[b].dtype and \
                    all(by_id[i].dtype == n.dtype for i in n.inputs):
                # Disjoint placements: one addend is 0 wherever the other is not, so the narrow sum
                # is exact (x + 0 is x in every dtype) and its widening is the wide sum, bit for bit.
                remat = {"remat": n.attr("remat")} if n.attr("remat") else {}
                total = new.add(Op.ADD, (a, b), n.src, **remat)
                alias[n.id] = c = new.add(Op.CAST, (total,), n.src, dtype=n.dtype, **remat)
                placed[c] = (total, sa | sb, fa)
                narrow[c] = (total, [], by_id[total].dtype, True)
                continue
        out.append(n)
        by_id[n.id] = n
        if n.op is Op.CAST and n.inputs and _wider(n.dtype, by_id[n.inputs[0]].dtype) and n.shape:
            narrow[n.id] = (n.inputs[0], [], by_id[n.inputs[0]].dtype, True)
        elif _is_view(n) and n.inputs[0] in narrow and n.id not in outputs:
            base, chain, dtype, exact = narrow[n.inputs[0]]
            if exact or n.op is not Op.UNINDEX:
                narrow[n.id] = (base, chain + [n], dtype, exact)
        if n.id in wholes:
            whole[n.id] = new.add(Op.CAST, (n.id,), n.src, dtype=wholes[n.id])
        if n.id in narrowed and n.id not in narrow:
            remat = {"remat": n.attr("remat")} if n.attr("remat") else {}
            c = new.add(Op.CAST, (n.id,), n.src, dtype=narrowed[n.id], **remat)
            narrow[n.id] = (c, [], narrowed[n.id], False)
    g2 = g.with_nodes(out, tree_map(g.output, lambda i: alias.get(i, i)))
    return program.replace_main(g2)


def _cast_at_source(g, by_id, users, outputs, downstream, reads_strided) -> dict[int, str]:
    """Values read only through strided views by narrowing casts to one dtype: id -> that dtype."""
    found: dict[int, str] = {}
    for x in g.nodes:
        if x.op in (Op.INPUT, Op.CONST) or x.dtype not in FLOAT_DTYPES or x.id in outputs or _is_view(x, STRIDED) \
                or not x.shape:
            continue
        leaves: list[tuple[int, list[Node]]] = []
        ok = True

        def walk(nid: int, chain: list[Node]) -> None:
            nonlocal ok
            for u in users.get(nid, ()):
                un = by_id[u]
                if _is_view(un, STRIDED) and u not in outputs:
                    walk(u, chain + [un])
                elif un.op is Op.CAST and u not in outputs:
                    leaves.append((u, chain))
                else:
                    ok = False
        walk(x.id, [])
        if not ok or not any(chain for _, chain in leaves):
            continue
        dtypes = {by_id[u].dtype for u, _ in leaves}
        if len(dtypes) != 1:
            continue
        d = dtypes.pop()
        if not _wider(x.dtype, d):
            continue
        if all(_strided(tuple(x.shape), chain + tail) for u, chain in leaves for tail in downstream(u, [])):
            found[x.id] = d
    return found


def _cast_whole(g, by_id, users, outputs) -> tuple[dict[int, int], dict[int, str]]:
    """Casts of a value's slices that cast the whole value between them: (cast id -> the value,
    the value -> the dtype they cast to).

    A float value x with a static first dim, read (among other readers) through constant INDEX
    views `x[l]` (an index on the first dim, every other dim whole) read only by narrowing casts to
    one dtype, two or more, whose indices l cover the first dim."""
    found: dict[int, int] = {}
    wholes: dict[int, str] = {}
    for x in g.nodes:
        if x.dtype not in FLOAT_DTYPES or len(x.shape) < 2 or not isinstance(x.shape[0], int) or _is_view(x):
            continue
        casts: list[int] = []
        picked: set[int] = set()
        dtypes: set[str] = set()
        for u in users.get(x.id, ()):
            v = by_id[u]
            if not _is_view(v, (Op.INDEX,)) or u in outputs:
                continue
            first, *rest = v.attr("items")
            if first[0] != "i" or any(item != ("s", None, None, None) for item in rest):
                continue
            readers = users.get(u, ())
            if not readers or any(by_id[r].op is not Op.CAST or r in outputs or
                                  not _wider(x.dtype, by_id[r].dtype) for r in readers):
                continue
            casts.extend(readers)
            picked.add(first[1] % x.shape[0])
            dtypes.update(by_id[r].dtype for r in readers)
        if len(casts) >= 2 and len(dtypes) == 1 and picked == set(range(x.shape[0])):
            found.update((c, x.id) for c in casts)
            wholes[x.id] = dtypes.pop()
    return found, wholes


__all__ = ["cast_views"]
