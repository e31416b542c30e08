"""Fusion: partition a specialised or symbolic Graph IR into kernels.

Four kernel kinds. `attention` is recognised first, as a pattern; the others are chosen greedily
in topological order:
- `attention`: `softmax(epilogue(q @ kT), dim=-1) @ v` in one flash-style kernel, so the scores
  and probabilities never go to memory (see `_attention_patterns` for what matches);
- `matmul`: one MATMUL plus an epilogue of element-wise consumers of its output shape (bias,
  activation, residual, cast), and of an element-wise kernel of that shape whose values the
  epilogue alone reads (recomputed values the backward pass needs next to a gradient product);
- `rowwise`: one reduction over the last dimension (sum/mean/max/min, softmax, log_softmax) plus
  an element-wise prologue on its input and an epilogue on its row shape (RMSNorm, softmax, …);
- `elementwise`: a chain of element-wise ops over one output shape. UNINDEX (the gradient of an
  indexed read) starts one: each output element is the input's element where INDEX read it, or 0.
  GATHER (an embedding lookup) starts one too: each output element loads its row's index, then
  the table's element in that row.
EXTERN (a PyTorch operator run eagerly, `fallback="eager"`) is a step of its own between kernels,
and so is each of attention's backward ops (`flash`: ATTN_LSE, ATTN_GRAD, templates/flash.py; the
gradients of k and v of one attention share a kernel, which writes them, with dq copied in, into
the slots of a fused qkv projection's gradient where the three are placed there: `placed_grads`)
and each SCATTER_ADD (`scatter`: an embedding's gradient, templates/scatter.py).
Views (RESHAPE of a contiguous value, TRANSPOSE, constant INDEX) are not kernels: a kernel reads
its inputs through their strides. CONST nodes are folded into the kernels that read them. Every
other node must land in a kernel: an op with no kernel path is an error, never a CPU fallback.
Which nodes may join a kernel of a kind is that kind's template's call (`templates/`: `joins`,
`takes_reduction`, `prologue_of_reduction`); the scheduled kernels are `kernel.py`'s types.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..ir.graph import BINARY, COLLECTIVE, UNARY, Graph, Node, Op, tree_ids
from ..ir.shapes import index_axis, numel
from ..passes.flash import find_attention
from .kernel import Kernel, Schedule, ScheduleError, row_value_through_view
from .placement import merged_heads, placed_grads
from .templates import KernelTemplate, template

ELEMENTWISE = UNARY | BINARY | {Op.WHERE, Op.FULL, Op.IOTA, Op.RANDN, Op.RAND}
SOURCES = {Op.FULL, Op.IOTA, Op.RANDN, Op.RAND}     # element-wise ops that read no tensor
ROW_ANCHORS = {Op.SUM, Op.MEAN, Op.MAX, Op.MIN, Op.SOFTMAX, Op.LOG_SOFTMAX}
# Collectives are the identity within one process (the many-GPU plan replaces them).
VIEWS = {Op.RESHAPE, Op.TRANSPOSE, Op.INDEX, *COLLECTIVE}
# Element-wise ops that read an input at other positions than their own: each starts a kernel (it is
# never fused after that input), its consumers join it, and only the element-wise template places it.
GATHERS = {Op.UNINDEX, Op.GATHER}
# Attention's backward ops (passes/flash.py): a kernel each, recomputing the scores.
FLASH = {Op.ATTN_LSE, Op.ATTN_GRAD}
# Rows added into a table at run-time indices: a kernel each (templates/scatter.py).
SCATTERS = {Op.SCATTER_ADD}


# Float dtypes a widening cast starts from, which a strided reduction's prologue may load.
FLOAT_NARROW = {"bfloat16", "float16", "float32"}
# A matmul's epilogue runs on its accumulator tile in registers; past this many ops the values it
# keeps alive beside the accumulator spill at the tile sizes a product needs. Measured on an H200:
# GPT-2 small's GELU-gradient product with its 45-op epilogue (the recomputed tanh-GELU terms)
# took 0.214 ms at best (a 64x64 tile; 0.57 ms at 128x256), where the product alone and the same
# ops as an element-wise kernel take about 0.06 + 0.05. A heavier epilogue is that kernel instead.
MAX_EPILOGUE = 24

# Attention: operand and score dtypes the fused kernel takes (tl.dot in float32 accumulators).
ATTENTION_DTYPES = {"bfloat16", "float16", "float32"}
# Element-wise ops on the score tile. RAND/RANDN number elements by the domain's linear index,
# which a tile of the fused kernel does not have; FULL/IOTA have no input to chain through.
SCORE_OPS = UNARY | BINARY | {Op.WHERE}
# Ops of an index expression evaluated in the kernel (a causal mask: IOTAs compared).
INDEX_OPS = UNARY | BINARY | {Op.WHERE, Op.FULL}


def _strided_prologue(graph: Graph, users: dict, prod: Kernel, n: Node, x: Node, out_ids: set) -> bool:
    """May element-wise kernel `prod`, which makes x, become the prologue of n, a reduction of x
    over dims other than the last? Only when n alone reads what it makes: a lone widening cast, or
    element-wise ops all of x's shape (a strided kernel's prologue is of its whole domain), of
    which casts may have other readers (split-reductions' exported casts: the reduction's kernel
    writes them, each element once, as the column form walks its domain once)."""
    if prod.kind != "elementwise" or len(x.shape) == 0 or any(m in out_ids for m in prod.nodes):
        return False
    inside = set(prod.nodes)
    if any(u not in inside and u != n.id and (graph.node(m).op is not Op.CAST or m == x.id)
           for m in prod.nodes for u in users[m]):
        return False
    if prod.nodes == [x.id] and x.op is Op.CAST:
        return graph.node(x.inputs[0]).dtype in FLOAT_NARROW and x.dtype in ("float32", "float64")
    nodes = [graph.node(m) for m in prod.nodes]
    return all(tuple(m.shape) == tuple(x.shape) and m.op in ELEMENTWISE and m.op not in SOURCES
               and m.op not in GATHERS for m in nodes)


def _lse_key(graph: Graph, x) -> tuple:
    """What identifies one attention's scores: q, kT, the scale (its node, or its value for a
    constant), the causal fill and the scores' dtype; of an `Attention` (passes/flash.py) or of an
    `attn_lse` node."""
    if isinstance(x, Node):
        q, kt, scale = x.inputs
        causal, fill = bool(x.attr("causal", False)), x.attr("fill")
    else:
        q, kt, scale, causal, fill = x.q, x.kt, x.scale, x.causal, x.fill
    if scale is None:
        scale_key: tuple = ("c", 1.0)
    else:
        s = graph.node(scale)
        scale_key = ("c", float(s.attr("value"))) if s.op is Op.CONST and tuple(s.shape) == () else ("n", scale)
    return q, kt, scale_key, causal, fill if causal else None, x.dtype


def _operand_cast(graph: Graph, users: dict, n: Node, outputs: set[int]) -> bool:
    """A cast read only by products (through views): no kernel downstream could compute it, so a
    matmul's epilogue writes it beside the value it casts, which is written anyway (the GELU
    gradient: float32 for its bias's column sum, bfloat16 for the next products)."""
    if n.op is not Op.CAST or n.id in outputs:
        return False

    def products_only(nid: int) -> bool:
        return bool(users[nid]) and all(
            graph.node(u).op is Op.MATMUL or (graph.node(u).op in VIEWS and u not in outputs and products_only(u))
            for u in users[nid])
    return products_only(n.id)


def _flash_key(n: Node) -> tuple:
    """What a dk and a dv `attn_grad` share when one kernel may make both."""
    return n.inputs, tuple((k, v) for k, v in n.attrs if k != "wrt")


def _delta_chain(graph: Graph, users: dict, n: Node, outputs: set[int]) -> list[int] | None:
    """For dq's `attn_grad` n: the nodes of its delta, `sum(cast?(dO) * cast?(o), dim=-1)`
    (passes/flash.py), when nothing else reads them but the delta itself, and dO is n's; in an
    order they can be computed in, the sum last. None otherwise."""
    d = graph.node(n.inputs[5])
    if d.op is not Op.SUM or d.attr("keepdim") or not d.inputs or d.id in outputs:
        return None
    prod = graph.node(d.inputs[0])
    if prod.op is not Op.MUL or d.attr("dim") != len(prod.shape) - 1 or users[prod.id] != [d.id] \
            or prod.id in outputs:
        return None
    casts, leaves = [], []
    for i in prod.inputs:
        x = graph.node(i)
        if x.op is Op.CAST and users[x.id] == [prod.id] and x.id not in outputs and x.id not in casts:
            casts.append(x.id)
            x = graph.node(x.inputs[0])
        leaves.append(x)
    g = graph.node(n.inputs[3])
    if len(leaves) != 2 or g.id not in (leaves[0].id, leaves[1].id) or leaves[0].id == leaves[1].id:
        return None
    o = leaves[1] if leaves[0].id == g.id else leaves[0]
    if tuple(o.shape) != tuple(g.shape) or o.dtype not in ("bfloat16", "float16", "float32", "float64"):
        return None
    return casts + [prod.id, d.id]          # (the casts come before the product that reads them)


# Ops the epilogue of a product with a short K does not take: libdevice's erf (the exact GELU) is a
# polynomial per range and an exp, about 30 instructions, and an epilogue's code repeats for each
# of a thread's accumulator elements (128 of a 128x256 tile over 8 warps), against a main loop of
# few K steps. On an H200, Whisper's MLP product (K = 512) with its GELU epilogue took 108 us a
# layer (113 with the epilogue in slices), where torch.compile's product ran 41 us and its GELU
# kernel 36: as an element-wise kernel of its own, the GELU took the engine from 2.58 to 2.39 ms
# (BERT base, K = 768: 2.77 -> 2.37 with the merged-heads change). Products of a long K (the
# benchmark MLP's 4096) keep it, unmeasured either way.
UNROLLED_EPILOGUE = frozenset({Op.GELU, Op.ERF})
SHORT_K = 2048


def _short_k(graph: Graph, k: Kernel) -> bool:
    """Is matmul kernel k's reduced dim static and below SHORT_K?"""
    a = graph.node(graph.node(k.anchor).inputs[0])
    kdim = a.shape[-1] if a.shape else 1
    return isinstance(kdim, int) and kdim < SHORT_K


# A value recomputed for the backward pass (`remat`) may join an earlier kernel when it is at most
# this fraction of the kernel's domain: a row kernel's per-row values ([T, 1], a LayerNorm's
# 1 / sqrt(var + eps) and its cube from the saved variance) held until the backward cost a few
# KB, where a kernel of their own was a launch each (25 in GPT-2 small's training step).
TINY_REMAT = 1 / 64


def _tiny(n: Node, k: Kernel) -> bool:
    size, domain = numel(n.shape), numel(k.shape)
    return size is not None and domain is not None and size <= domain * TINY_REMAT


def _is_last_dim_reduction(n: Node, x: Node) -> bool:
    if n.op in (Op.SOFTMAX, Op.LOG_SOFTMAX):
        return n.attr("dim") == len(x.shape) - 1
    dim = n.attr("dim")
    return len(x.shape) >= 1 and (dim == len(x.shape) - 1 or (dim is None and len(x.shape) == 1))


def _reduced_dims(n: Node, x: Node) -> tuple[int, ...] | None:
    """The dims of `x` a reduction `n` reduces; None for softmax over a dim other than the last."""
    dim = n.attr("dim")
    if n.op in (Op.SOFTMAX, Op.LOG_SOFTMAX):
        return (dim % len(x.shape),) if x.shape else None
    if dim is None:
        return tuple(range(len(x.shape)))
    return (dim % len(x.shape),) if x.shape else ()


@dataclass
class AttentionPattern:
    nodes: list[int]        # q @ kT, the score chain, softmax, casts, p @ v: topological
    tree: list[int]         # index expressions the chain reads, computed in the kernel: topological


def _index_tree(graph: Graph, nid: int, rank: int, acc: list[int]) -> bool:
    """Whether node `nid` is a function of row/column indices and constants alone (IOTAs along a
    score dim, through reshapes that add size-1 dims); collects its nodes into `acc`."""
    n = graph.node(nid)
    if n.op is Op.CONST:
        return True
    if len(n.shape) > 2 and any(size != 1 for size in n.shape[:-2]):
        return False                    # varies along a batch dim
    if _leading_ones(graph, n):     # [T, S] -> [1, .., T, S]: the same value at each (row, col)
        if not _index_tree(graph, n.inputs[0], rank, acc):
            return False
        if nid not in acc:
            acc.append(nid)
        return True
    if n.op is Op.IOTA or (n.op is Op.RESHAPE and graph.node(n.inputs[0]).op is Op.IOTA):
        if index_axis(n, rank) is None:
            return False
        for i in ([n.inputs[0]] if n.op is Op.RESHAPE else []) + [nid]:
            if i not in acc:
                acc.append(i)
        return True
    if n.op not in INDEX_OPS:
        return False
    if not all(_index_tree(graph, i, rank, acc) for i in n.inputs):
        return False
    if nid not in acc:
        acc.append(nid)
    return True


def _leading_ones(graph: Graph, n: Node) -> bool:
    """A reshape of a non-IOTA that only adds leading size-1 dims."""
    if n.op is not Op.RESHAPE:
        return False
    src = graph.node(n.inputs[0])
    k = len(n.shape) - len(src.shape)
    return src.op is not Op.IOTA and k > 0 and tuple(n.shape[k:]) == tuple(src.shape) \
        and all(d == 1 for d in n.shape[:k])


def _attention_patterns(graph: Graph, users: dict[int, list[int]]) -> list[AttentionPattern]:
    """Naive attention, `softmax(chain(q @ kT), dim=-1) [cast] @ v`, where the chain is element-wise
    ops on the score shape (casts, scaling, masking with `where`, adding a bias) and every score
    and probability value has exactly one user on the way (no graph outputs; a training step that
    reuses the probabilities keeps today's kernels). Operands are float16/bfloat16/float32."""
    outs = set(tree_ids(graph.output))

    def only_user(nid: int, user: int) -> bool:
        return nid not in outs and users[nid] == [user]

    found: list[AttentionPattern] = []
    for sm in graph.nodes:
        shape = tuple(sm.shape)
        if sm.op is not Op.SOFTMAX or len(shape) < 2 or sm.attr("dim") != len(shape) - 1 \
                or sm.dtype not in ATTENTION_DTYPES:
            continue

        def chain_to(nid: int, user: int) -> list[int] | None:
            n = graph.node(nid)
            if not only_user(nid, user) or tuple(n.shape) != shape or n.dtype not in ATTENTION_DTYPES:
                return None
            if n.op is Op.MATMUL:
                a, b = (graph.node(i) for i in n.inputs)
                ok = len(a.shape) >= 2 and len(b.shape) >= 2 and a.dtype == b.dtype and a.dtype in ATTENTION_DTYPES
                return [nid] if ok else None
            if n.op not in SCORE_OPS:
                return None
            paths = [p for i in dict.fromkeys(n.inputs) if (p := chain_to(i, nid)) is not None]
            return paths[0] + [nid] if len(paths) == 1 else None

        chain = chain_to(sm.inputs[0], sm.id)
        if chain is None:
            continue
        tail, cur = [sm.id], sm
        while cur.id not in outs and len(users[cur.id]) == 1:
            u = graph.node(users[cur.id][0])
            if u.op is Op.CAST and u.dtype in ATTENTION_DTYPES and tuple(u.shape) == shape:
                tail.append(u.id)
                cur = u
                continue
            break
        if cur.id in outs or len(users[cur.id]) != 1:
            continue
        mm2 = graph.node(users[cur.id][0])
        if mm2.op is not Op.MATMUL or mm2.inputs[0] != cur.id or mm2.inputs[1] == cur.id:
            continue
        v = graph.node(mm2.inputs[1])
        if len(v.shape) < 2 or v.dtype != cur.dtype or mm2.dtype not in ATTENTION_DTYPES:
            continue
        inside = set(chain)
        tree: list[int] = []
        for c in chain[1:]:
            for i in graph.node(c).inputs:
                if i not in inside:
                    acc: list[int] = []
                    if graph.node(i).op is not Op.CONST and _index_tree(graph, i, len(shape), acc):
                        tree += [t for t in acc if t not in tree]
        order = {n.id: k for k, n in enumerate(graph.nodes)}
        found.append(AttentionPattern(chain + tail + [mm2.id], sorted(tree, key=order.__getitem__)))
    # Patterns may share a node (p @ v of one taken as the q @ kT of the next, in
    # `softmax(softmax(q @ kT) @ v) @ w`): the earlier one wins, the later one stays unfused.
    kept: list[AttentionPattern] = []
    claimed: set[int] = set()
    for p in found:
        if claimed.isdisjoint(p.nodes):
            kept.append(p)
            claimed.update(p.nodes)
    return kept


def schedule(graph: Graph) -> Schedule:
    kernels: list[Kernel] = []
    owner: dict[int, int] = {}
    views: set[int] = set()
    base: dict[int, int] = {}          # view node -> the node whose memory it reads
    deps: dict[int, set[int]] = {}     # kernel -> kernels it reads from
    users = graph.users()

    def source(i: int) -> int:
        return base.get(i, i)

    patterns = _attention_patterns(graph, users)
    pattern_at = {p.nodes[-1]: p for p in patterns}          # created at its last node, p @ v
    reserved = {nid for p in patterns for nid in p.nodes[:-1]}
    # Index expressions needed only by attention kernels (which compute them) get no kernel.
    inlined = {t for p in patterns for t in p.tree}
    changed = True
    while changed:
        changed = False
        for t in list(inlined):
            if t in tree_ids(graph.output) or any(u not in inlined and u not in reserved for u in users[t]):
                inlined.discard(t)
                changed = True

    def reaches(a: int, b: int) -> bool:
        """Does kernel a read (transitively) from kernel b?"""
        stack, seen = [a], set()
        while stack:
            k = stack.pop()
            if k == b:
                return True
            if k not in seen:
                seen.add(k)
                stack.extend(deps.get(k, ()))
        return False

    def producers(n: Node, exclude: int | None = None) -> set[int]:
        out = set()
        for i in n.inputs:
            k = owner.get(source(i))
            if k is not None and k != exclude:
                out.add(k)
        return out

    def can_join(k: Kernel, n: Node) -> bool:
        rules = _template(k)
        if n.op not in ELEMENTWISE or n.op in SOURCES or rules is None:
            return False
        if k.kind == "matmul" and n.op in UNROLLED_EPILOGUE and _short_k(graph, k):
            return False
        if n.attr("remat") and any(not graph.node(x).attr("remat") for x in k.nodes) and not _tiny(n, k):
            return False        # a value recomputed for the backward pass stays out of earlier kernels
        inner = [i for i in n.inputs if owner.get(i) == owner_index(k)]
        # A value of the kernel read through a view would be read from the memory it writes; a
        # row kernel's row value between its kept ([T, 1]) and row ([T]) forms is read in place.
        if any(i in views and owner.get(source(i)) == owner_index(k) and not _row_form_view(graph, k, i)
               for i in n.inputs):
            return False
        fits = rules.joins(k, tuple(n.shape), inner, graph, users) or (
            k.kind == "matmul" and tuple(n.shape) == tuple(k.shape) and _operand_cast(graph, users, n, out_ids))
        # Joining must not make the kernel read a value that itself needs this kernel (a cycle).
        return fits and not any(reaches(p, owner_index(k)) for p in producers(n, owner_index(k)))

    def owner_index(k: Kernel) -> int:
        return next(i for i, kk in enumerate(kernels) if kk is k)

    position = {n.id: p for p, n in enumerate(graph.nodes)}

    def can_merge(a: int, b: int) -> bool:
        """Kernel b's nodes may join kernel a: both element-wise over one shape, no third kernel
        on a path between them (the merged kernel would feed and read it), and neither reads a
        value the other computes through a view (a reshape, transpose or collective: other
        positions, or another rank's piece) or with a gathering op (read at other positions)."""
        ka, kb = kernels[a], kernels[b]
        if ka is None or kb is None or ka.kind != "elementwise" or kb.kind != "elementwise" or ka.extern \
                or kb.extern or tuple(ka.shape) != tuple(kb.shape):
            return False
        if any(reaches(p, b) for p in deps[a] if p != b) or any(reaches(p, a) for p in deps[b] if p != a):
            return False
        for k_re, k_other in ((ka, kb), (kb, ka)):
            # Recomputed values stay out of earlier kernels: a kernel with a node before the first
            # clone that something else reads before it too (a forward kernel) would compute the
            # clones early and keep them. One whose early nodes only its own nodes and later ones
            # read (the backward pass's, from just before the clones) takes them.
            first = min((position[x] for x in k_re.nodes if graph.node(x).attr("remat")), default=None)
            if first is None:
                continue
            inside = set(k_other.nodes)
            if any(position[x] < first and not graph.node(x).attr("remat")
                   and any(u not in inside and position[u] < first for u in users[x]) for x in k_other.nodes):
                return False
        for k_from, k_other in ((ka, b), (kb, a)):
            for nid in k_from.nodes:
                g = graph.node(nid)
                if any(owner.get(source(i)) == k_other for i in g.inputs if g.op in GATHERS or i in views):
                    return False
        return True

    def merge(a: int, b: int) -> None:
        """Kernel b's nodes join kernel a (in program order); kernels reading b read a."""
        kb = kernels[b]
        kernels[a].nodes[:] = sorted(kernels[a].nodes + kb.nodes, key=position.__getitem__)
        for nid in kb.nodes:
            owner[nid] = a
        deps[a] = (deps[a] | deps.pop(b, set())) - {a, b}
        kernels[b] = None
        for k, d in deps.items():
            if b in d:
                d.discard(b)
                if k != a:
                    d.add(a)

    def row_epilogue(n: Node) -> tuple[int | None, list[int]]:
        """(the row kernel n joins, the element-wise kernels that join it with n) when n, of a row
        kernel's whole domain, reads that kernel's values (an RMSNorm's `x * rsqrt(mean(x^2))`)
        and each of its other inputs is made by no kernel yet, or by an element-wise kernel of the
        same domain that n alone reads outside itself and that reads nothing of the row kernel's
        (Llama's `x.float()` for the product, forked from the one the reduction squares). Joining
        the element-wise kernel instead (the other order) left the row kernel writing its row
        values and that kernel reading them and the row again: two kernels where one does."""
        if n.id in out_ids:
            return None, []
        rows = [owner[i] for i in n.inputs if owner.get(i) is not None and kernels[owner[i]].kind == "rowwise"]
        if len(set(rows)) != 1:
            return None, []
        r = rows[0]
        k = kernels[r]
        # (Kernels of recomputed values keep the rules of `can_join` and `can_merge` alone.)
        if tuple(n.shape) != tuple(k.shape) or n.attr("remat") or any(graph.node(x).attr("remat") for x in k.nodes) \
                or not can_join(k, n):
            return None, []
        absorbed: list[int] = []
        for i in n.inputs:
            e = owner.get(source(i))
            if e is None or e == r or e in absorbed:
                continue
            ke = kernels[e]
            inside = set(ke.nodes)
            if i in views or ke.kind != "elementwise" or tuple(ke.shape) != tuple(k.shape) or inside & out_ids \
                    or any(graph.node(x).op in GATHERS or graph.node(x).attr("remat") for x in ke.nodes) \
                    or any(u not in inside and u != n.id for x in ke.nodes for u in users[x]) \
                    or reaches(e, r) or any(reaches(p, e) for p in deps[r] if p != e):
                return None, []
            absorbed.append(e)
        return r, absorbed

    def row_sibling(idx: int) -> None:
        """A row kernel reading the same rows as an earlier one, neither on a path through a third
        kernel to the other, joins it: cross-entropy's target logit `sum(onehot * x)` beside its
        log-sum-exp, both over the [tokens, vocab] logits, read them once (`triton_src.row_passes`
        walks the row once for the independent reductions) instead of once each."""
        k = kernels[idx]
        shape = tuple(k.shape)

        def full_reads(kk: Kernel) -> set[int]:
            inside = set(kk.nodes)
            return {i for m in kk.nodes for i in graph.node(m).inputs
                    if i not in inside and tuple(graph.node(i).shape) == shape}
        reads = full_reads(k)
        if not reads or any(graph.node(x).attr("remat") for x in k.nodes):
            return
        for sib, ks in enumerate(kernels):
            if sib == idx or ks is None or ks.kind != "rowwise" or tuple(ks.shape) != shape \
                    or ks.reduce_dims != k.reduce_dims or not reads & full_reads(ks) \
                    or any(graph.node(x).attr("remat") for x in ks.nodes):
                continue
            if any(reaches(p, sib) for p in deps[idx] if p != sib) \
                    or any(reaches(p, idx) for p in deps[sib] if p != idx):
                continue
            # (Values of one read by the other through a view would be read from memory the
            # merged kernel writes.)
            if any(owner.get(source(i)) in (sib, idx) and i in views
                   for m in k.nodes + ks.nodes for i in graph.node(m).inputs):
                continue
            merge(sib, idx)
            return

    def lone_source(i: int, n: Node) -> bool:
        """Is `i` a source in a kernel of its own that only `n` reads?"""
        k = owner.get(i)
        return k is not None and graph.node(i).op in SOURCES and kernels[k].nodes == [i] \
            and all(u == n.id for u in users[i]) and i not in out_ids

    def new_kernel(k: Kernel, n: Node) -> None:
        kernels.append(k)
        idx = len(kernels) - 1
        owner[n.id] = idx
        deps[idx] = producers(n, idx)

    out_ids = set(tree_ids(graph.output))
    strided: dict[tuple, list[int]] = {}     # reductions over other dims, by (shape, dims)
    strided_reads: dict[int, set[int]] = {}  # the values such a kernel reads (through views)
    flash_k: dict[tuple, int] = {}      # a dk kernel by its operands and attributes (`_flash_key`)
    # Attentions whose gradient recomputes the log-sum-exp (passes/flash.py), by output; their
    # kernels by what an `attn_lse` of the same scores reads (`_lse_key`).
    differentiated = find_attention(graph) if any(n.op is Op.ATTN_LSE for n in graph.nodes) else {}
    attention_of: dict[tuple, int] = {}
    heads_of = {v: p.nodes[-1] for p in patterns for v in merged_heads(graph, users, p.nodes[-1], out_ids)}
    # Attention's gradients placed into one tensor (`placed_grads`): placing node -> the grads.
    grads_of: dict[tuple, dict[str, int]] = {}
    for n in graph.nodes:
        if n.op is Op.ATTN_GRAD:
            grads_of.setdefault(_flash_key(n), {})[n.attr("wrt")] = n.id
    placed_at: dict[int, tuple[dict[str, int], list[int], int]] = {}
    position = {n.id: k for k, n in enumerate(graph.nodes)}
    for grads in grads_of.values():
        found = placed_grads(graph, users, grads, out_ids, position)
        # (dv joins dk's kernel when dk comes first, `flash_k` below; dq's kernel, which dk and dv's
        # copies from, comes before theirs)
        if found is not None and position[grads["q"]] < position[grads["k"]] < position[grads["v"]]:
            placed_at |= {nid: (grads, found[0], found[1]) for nid in found[0]}
    for n in graph.nodes:
        if n.op in (Op.INPUT, Op.CONST) or n.id in inlined or n.id in reserved:
            continue
        if n.id in pattern_at:
            p = pattern_at[n.id]
            kernels.append(Kernel("attention", n.id, list(p.nodes), tuple(n.shape), inlined=list(p.tree)))
            idx = len(kernels) - 1
            if n.id in differentiated and differentiated[n.id].dtype == "float32":
                attention_of[_lse_key(graph, differentiated[n.id])] = idx
            deps[idx] = set()
            for nid in p.nodes:
                owner[nid] = idx
            for nid in p.nodes:
                deps[idx] |= producers(graph.node(nid), idx)
            continue
        if n.id in placed_at:
            # dk and dv's kernel writes them into their slots and copies dq into its own: the
            # placing nodes wait for the last (the tensor), when all three gradients have kernels.
            grads, nodes, top = placed_at[n.id]
            if n.id != top:
                continue
            idx = owner[grads["k"]]
            if owner.get(grads["v"]) != idx or owner.get(grads["q"]) in (None, idx):
                raise ScheduleError("internal: attention's gradients placed into one tensor without their kernels")
            for m in nodes:
                kernels[idx].nodes.append(m)
                owner[m] = idx
                deps[idx] |= producers(graph.node(m), idx)
            continue
        if n.op in VIEWS and n.id in heads_of:
            # The attention kernel writes its output as this view of it (`merged_heads`).
            idx = owner[heads_of[n.id]]
            kernels[idx].nodes.append(n.id)
            owner[n.id] = idx
            continue
        if n.op in VIEWS:
            views.add(n.id)
            base[n.id] = source(n.inputs[0])
            continue
        if n.op is Op.MATMUL:
            new_kernel(Kernel("matmul", n.id, [n.id], tuple(n.shape)), n)
            continue
        if n.op in ROW_ANCHORS:
            x = graph.node(n.inputs[0])
            dims = _reduced_dims(n, x)
            if dims is None:
                raise ScheduleError(f"`{n.op.value}` over a dimension other than the last has no GPU kernel yet"
                                    + (f" (line {n.src[0]})" if n.src else ""))
            if not _is_last_dim_reduction(n, x) or len(x.shape) == 0:
                # A reduction over other dims (or all of them): its own kernel, reading through
                # strides. An element-wise kernel of its input's shape that only it reads is its
                # prologue: a lone widening cast (cast-views moved it there from a view: the
                # kernel loads the narrow value), or the ops split-reductions rebuilt in a split
                # shape (LayerNorm's weight gradient).
                pidx = owner.get(x.id)
                prod = kernels[pidx] if pidx is not None else None
                if prod is not None and _strided_prologue(graph, users, prod, n, x, out_ids):
                    kernels[pidx] = Kernel("rowwise", n.id, prod.nodes + [n.id], tuple(x.shape), dims)
                    owner[n.id] = pidx
                else:
                    new_kernel(Kernel("rowwise", n.id, [n.id], tuple(x.shape), dims), n)
                    pidx = len(kernels) - 1
                # Another strided reduction of the same shape reading a tensor of that size this
                # one reads too (LayerNorm's bias and weight gradients, both of dy): one kernel, one
                # launch, the second pass over the tile from cache.
                key = (tuple(x.shape), tuple(dims))
                size = numel(x.shape)
                reads = {source(i) for m in kernels[pidx].nodes for i in graph.node(m).inputs
                         if size is not None and numel(graph.node(source(i)).shape) == size} - set(kernels[pidx].nodes)
                for sib in strided.get(key, ()):
                    ks = kernels[sib]
                    if ks is None or ks.kind != "rowwise" or not reads & strided_reads[sib] \
                            or any(reaches(p, sib) for p in deps[pidx] if p != sib) \
                            or any(reaches(p, pidx) for p in deps[sib] if p != pidx):
                        continue
                    merge(sib, pidx)
                    strided_reads[sib] |= reads
                    break
                else:
                    strided.setdefault(key, []).append(pidx)
                    strided_reads[pidx] = reads
                continue
            pidx = owner.get(x.id)
            last = (len(x.shape) - 1,)
            rules = _template(kernels[pidx]) if pidx is not None else None
            if rules is not None and rules.takes_reduction(kernels[pidx], tuple(x.shape)) \
                    and not any(reaches(p, pidx) for p in producers(n, pidx)):
                # Another reduction over the same rows: the row is already in registers.
                kernels[pidx].nodes.append(n.id)
                owner[n.id] = pidx
                continue
            if pidx is not None:
                prod = kernels[pidx]
                # Absorb the producer as a prologue when it is an element-wise kernel of the same
                # shape whose output this reduction alone needs.
                if rules is not None and rules.prologue_of_reduction(prod, tuple(x.shape)) and \
                        all(u == n.id or owner.get(u) == pidx for u in users[x.id]) and \
                        not any(graph.node(i).op in GATHERS for i in prod.nodes):
                    kernels[pidx] = Kernel("rowwise", n.id, prod.nodes + [n.id], tuple(x.shape), last)
                    owner[n.id] = pidx
                    row_sibling(pidx)
                    continue
            new_kernel(Kernel("rowwise", n.id, [n.id], tuple(x.shape), last), n)
            row_sibling(len(kernels) - 1)
            continue
        if n.op is Op.EXTERN:
            new_kernel(Kernel("extern", n.id, [n.id], tuple(n.shape)), n)
            continue
        if n.op is Op.ATTN_LSE and _lse_key(graph, n) in attention_of:
            # The forward attention kernel computed each row's log-sum-exp: it writes it too.
            idx = attention_of[_lse_key(graph, n)]
            kernels[idx].nodes.append(n.id)
            owner[n.id] = idx
            continue
        if n.op in FLASH:
            # dv beside dk: one program per key block walks the query blocks once for both.
            pair = flash_k.get(_flash_key(n)) if n.op is Op.ATTN_GRAD and n.attr("wrt") == "v" else None
            if pair is not None:
                kernels[pair].nodes.append(n.id)
                owner[n.id] = pair
                continue
            chain = _delta_chain(graph, users, n, out_ids) \
                if n.op is Op.ATTN_GRAD and n.attr("wrt") == "q" else None
            kd = owner.get(chain[-1]) if chain else None
            if kd is not None and kernels[kd].kind == "rowwise" and sorted(kernels[kd].nodes) == sorted(chain):
                # dq's kernel loads each query block's dO anyway: it computes their rows' delta
                # (reading o) and writes it for dk and dv, in the delta's kernel's place.
                kernels[kd] = Kernel("flash", n.id, chain + [n.id], tuple(n.shape))
                owner[n.id] = kd
                deps[kd] = (deps[kd] | producers(n, kd)) - {kd}
                continue
            new_kernel(Kernel("flash", n.id, [n.id], tuple(n.shape)), n)
            if n.op is Op.ATTN_GRAD and n.attr("wrt") == "k":
                flash_k[_flash_key(n)] = len(kernels) - 1
            continue
        if n.op in SCATTERS:
            new_kernel(Kernel("scatter", n.id, [n.id], tuple(n.shape)), n)
            continue
        if n.op in GATHERS:
            # Reads an input at other positions than its own: never fused after that input.
            new_kernel(Kernel("elementwise", None, [n.id], tuple(n.shape)), n)
            continue
        if n.op not in ELEMENTWISE:
            raise ScheduleError(f"`{n.op.value}` has no GPU kernel yet" + (f" (line {n.src[0]})" if n.src else ""))
        # A node of a row kernel's whole domain that reads the kernel's row values is its
        # epilogue, with the element-wise kernels of its other inputs (see `row_epilogue`).
        row_idx, absorbed = row_epilogue(n)
        if row_idx is not None:
            kernels[row_idx].nodes.append(n.id)
            owner[n.id] = row_idx
            deps[row_idx] |= producers(n, row_idx)
            for e in absorbed:
                merge(row_idx, e)
            continue
        # A source only this node reads (fork-casts gives each reader its own) is tried last: the
        # node joins the kernel of what it really reads, and the source's kernel merges into it.
        lone = [i for i in n.inputs if lone_source(i, n)]
        for i in [i for i in n.inputs if i not in lone] + lone:
            idx = owner.get(i)
            if idx is not None and can_join(kernels[idx], n):
                kernels[idx].nodes.append(n.id)
                owner[n.id] = idx
                deps[idx] |= producers(n, idx)
                for j in n.inputs:          # another input's element-wise kernel comes along
                    other = owner.get(j)        # (a value read directly: never through a view)
                    if other is None or other == idx:
                        continue
                    # (a lone source joins any element-wise or row kernel: n was its only reader)
                    if (j in lone and kernels[idx].kind in ("elementwise", "rowwise")) or can_merge(idx, other):
                        merge(idx, other)
                break
        else:
            new_kernel(Kernel("elementwise", None, [n.id], tuple(n.shape)), n)
    # An element-wise kernel whose values one matmul's epilogue alone reads (the backward pass's
    # recomputed GELU terms, read by the gradient product's epilogue) is computed in that
    # epilogue, from its own inputs at the product's tile, instead of going to memory.
    for ei, e in enumerate(kernels):
        if e is None or e.kind != "elementwise" or any(graph.node(x).op in GATHERS for x in e.nodes):
            continue
        inside = set(e.nodes)
        readers = [u for x in e.nodes for u in users[x] if u not in inside]
        read_by = {owner.get(u) for u in readers}
        if len(read_by) != 1 or inside & out_ids or any(u in views for u in readers):
            continue
        mi = read_by.pop()
        m = kernels[mi] if mi is not None else None
        if m is None or m.kind != "matmul" or tuple(e.shape) != tuple(m.shape) or m.anchor in readers:
            continue
        m.nodes[1:1] = sorted(e.nodes, key=position.__getitem__)
        for x in e.nodes:
            owner[x] = mi
        deps[mi] = (deps[mi] | deps.pop(ei, set())) - {ei, mi}
        kernels[ei] = None
    for mi, m in enumerate(list(kernels)):
        if m is None or m.kind != "matmul" or len(m.nodes) - 1 <= MAX_EPILOGUE:
            continue
        # The epilogue becomes an element-wise kernel reading the product from memory.
        kernels.append(Kernel("elementwise", None, m.nodes[1:], tuple(m.shape)))
        ei = len(kernels) - 1
        del m.nodes[1:]
        for x in kernels[ei].nodes:
            owner[x] = ei
        deps[ei] = {p for x in kernels[ei].nodes for p in producers(graph.node(x), ei)}
        deps[mi] = producers(graph.node(m.anchor), mi)
        for k, d in deps.items():
            if mi in d and k not in (mi, ei):
                d.add(ei)
    order = [i for i in _topological(len(kernels), deps) if kernels[i] is not None]
    remap = {old: new for new, old in enumerate(order)}
    return Schedule(graph, [kernels[i] for i in order], {n: remap[k] for n, k in owner.items()}, views, inlined)


def _row_form_view(graph: Graph, k: Kernel, i: int) -> bool:
    return row_value_through_view(graph, k, i, set(k.nodes)) is not None


def _template(k: Kernel) -> KernelTemplate | None:
    """The template whose fusion rules kernel `k` follows (None for a PyTorch operator's step)."""
    return None if k.extern else template(k.kind)


def _topological(count: int, deps: dict[int, set[int]]) -> list[int]:
    order: list[int] = []
    state: dict[int, int] = {}

    def visit(k: int) -> None:
        if state.get(k) == 2:
            return
        if state.get(k) == 1:
            raise ScheduleError("internal: kernel dependencies form a cycle")
        state[k] = 1
        for d in sorted(deps.get(k, ())):
            if d != k:
                visit(d)
        state[k] = 2
        order.append(k)

    for k in range(count):
        visit(k)
    return order
