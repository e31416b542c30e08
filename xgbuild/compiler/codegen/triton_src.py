"""Triton source of the element-wise and row-reduction kernels (for one spec, config and variant);
the matmul kernel's is in `triton_matmul.py`, the attention kernel's in `triton_attention.py`, the
shared core (parameters, op code) in `emitter.py`. `templates/` calls each for its kernel kind."""

from __future__ import annotations

from dataclasses import dataclass, field

from .emitter import FLOAT, TL, Emitted, Emitter, compute_dtype, literal
from .spec import KernelSpec

# Ops whose Triton code reads the element's linear index (an IOTA, counter-based random numbers):
# the column form computes on [BLOCK_N, ROWS] tiles and has no single linear index to give them.
INDEXED_OPS = frozenset({"iota", "rand", "randn"})
REDUCTIONS = frozenset({"sum", "mean", "max", "min"})


# --- element-wise --------------------------------------------------------------------------------

def elementwise(e: Emitter) -> Emitted:
    spec, w = e.spec, e.w
    e.pointer_params()
    rank = spec.rank
    numel = e.int_param("numel", hint16=True)
    rows = e.config.get("ROWBLOCK", 0) and rank >= 2
    cols = e.config.get("COLS", 0) if rows else 0
    tile = f"[{e.config['BLOCK'] // cols}, {cols}]" if cols else "[BLOCK]"
    if cols:
        # Row tiles: a program takes BLOCK // COLS rows (indices of the leading dims, `outer`) by
        # COLS positions along the last (`L` long, `col`): a division per row rather than per
        # element, and the last dim contiguous, so its loads and stores vectorise (attention's
        # heads, 64 long, placed into a [B, T, 3, H, DH] gradient).
        last = e.int_param("L", hint16=True)
        r = e.config["BLOCK"] // cols
        w.line(f"pid = tl.program_id(0).to({e.idx})")
        w.line(f"blocks = tl.cdiv({last}, {cols})")
        w.line(f"outer = (pid // blocks) * {r} + tl.arange(0, {r}).to({e.idx})")
        w.line(f"col = (pid % blocks) * {cols} + tl.arange(0, {cols}).to({e.idx})")
        w.line(f"lin = outer[:, None] * {last} + col[None, :]")
        w.line(f"mask = (outer < {numel} // {last})[:, None] & (col < {last})[None, :]")
    elif rows:
        # Row blocks: a program takes BLOCK elements of one index of the leading dims (`outer`)
        # along the last (`L` long): no division per element, the leading indices are scalars
        # (a row-broadcast operand is one address), the last is contiguous (`col`).
        last = _row_blocks(e, "BLOCK", "col")
        w.line(f"lin = outer * {last} + col")
        w.line(f"mask = col < {last}")
    else:
        w.line(f"lin = tl.program_id(0).to({e.idx}) * BLOCK + tl.arange(0, BLOCK)")
        w.line(f"mask = lin < {numel}")
    unravelled = False

    def unravel() -> None:
        nonlocal unravelled
        if not unravelled:
            unravelled = True
            if cols:
                # The leading indices of each row, then given the tile's shape (each constant along
                # a row), the last the tile's columns.
                e.unravel("outer", 0, rank - 1, "i")
                for d in range(rank - 1):
                    w.line(f"i{d} = tl.broadcast_to(i{d}[:, None], {tile})")
                w.line(f"i{rank - 1} = tl.broadcast_to(col[None, :], {tile})")
            elif rows:
                # The leading indices from the scalar `outer`, then given the block's shape (loads
                # and index arithmetic take blocks; every lane holds the same value, no division).
                e.unravel("outer", 0, rank - 1, "i")
                for d in range(rank - 1):
                    w.line(f"i{d} = tl.full([BLOCK], 0, {e.idx}) + i{d}")
                w.line(f"i{rank - 1} = col")
            else:
                e.unravel("lin", 0, rank, "i")

    loaded: dict[int, str] = {}

    def load(j: int) -> str:
        if j in loaded:
            return loaded[j]
        level = spec.operands[j][1]
        v = w.tmp("x")
        if level == "scalar":
            w.line(f"{v} = {e.load(j, '0', None)}")
        elif e.layout(j) == "dense":
            w.line(f"{v} = {e.load(j, 'lin', 'mask')}")
        else:
            unravel()
            off = e.dot((f"i{d}", e.stride(j, d)) for d in range(rank))
            # Broadcast along every dim: one value, a scalar load.
            w.line(f"{v} = {e.load(j, off, 'mask') if off else e.load(j, '0', None)}")
        loaded[j] = v
        return v

    vals: dict[int, str] = {}
    for k, n in enumerate(spec.nodes):
        if n.op == "unindex":
            unravel()
            vals[k] = _unindex(e, k, n)
            continue
        if n.op == "gather":
            unravel()
            vals[k] = _gather(e, k, n, e.arg(n.args[1], vals, load))
            continue
        index = "lin"
        if n.op == "iota" and ("last", True) in n.attrs:    # an arange along the last dim
            unravel()
            index = f"i{rank - 1}"
        v = w.tmp("v")
        w.line(f"{v} = {e.op(n, [e.arg(a, vals, load) for a in n.args], index=index)}")
        vals[k] = v
    for i, out in enumerate(spec.outputs):
        value = vals[out]
        if spec.nodes[out].op == "full":
            value = f"tl.full({tile}, {value}, {TL[compute_dtype(spec.nodes[out].dtype)]})"
        e.store(i, "lin", value, "mask")
    return e.finish({"BLOCK": e.config["BLOCK"]})


def _row_blocks(e: Emitter, block: str, lane: str) -> str:
    """Program ids over blocks of `block` positions along a last dim `L` (a launch size), for each
    index of the dims before it: `outer` (that index, linear, a scalar) and `lane` (the block's
    positions along L, contiguous: its loads vectorise). Returns L's parameter; the grid is
    `templates.base.row_blocks_grid`."""
    last = e.int_param("L", hint16=True)
    e.w.line(f"pid = tl.program_id(0).to({e.idx})")
    e.w.line(f"blocks = tl.cdiv({last}, {block})")
    e.w.line("outer = pid // blocks")
    e.w.line(f"{lane} = (pid % blocks) * {block} + tl.arange(0, {block})")
    return last


def unindex_params(k: int, items: tuple, shape: tuple, index) -> dict[str, int]:
    """The integer arguments of local node k, an `unindex` into `shape`: per slice item the first
    output position it covers, the step's size, the count and whether it runs backwards; per
    index item the position (run-time ones read by `index(pos)`, negative ones counted from the
    end). The kernel and the CPU executor (`cpu.index_view`) place the same elements."""
    out: dict[str, int] = {}
    for a, item in enumerate(items):
        size = int(shape[a])
        if item[0] == "s":
            picks = range(size)[slice(item[1], item[2], item[3])]
            rev = picks.step < 0
            out[f"u{k}_{a}_lo"] = picks[-1] if rev and len(picks) else (picks.start if len(picks) else 0)
            out[f"u{k}_{a}_st"] = abs(picks.step)
            out[f"u{k}_{a}_n"] = len(picks)
            out[f"u{k}_{a}_rev"] = int(rev)
        else:
            out[f"u{k}_{a}_at"] = int(item[1]) if item[0] == "i" else int(index(item[1]))
    return out


def _unindex(e: Emitter, k: int, n) -> str:
    """Node k, an `unindex`: the input's element where INDEX read this output element, else 0.
    Output dims covered by a slice map to an input dim, index items to none, the rest one to one."""
    w, spec = e.w, e.spec
    items = dict(n.attrs)["items"]
    inside = w.tmp("inside")
    w.line(f"{inside} = mask")
    src: list[str] = []                   # the input's index along each of its dims
    for a, item in enumerate(items):
        if item[0] == "s":
            # The step (and so its size and direction) is the slice's own, known here: only where it
            # starts and how many it takes depend on the run's sizes. A whole dim (`:`) is the identity.
            step = item[3] if item[3] is not None else 1
            if step == 1 and item[1] in (None, 0) and item[2] is None:
                src.append(f"i{a}")
                continue
            lo, cnt = e.int_param(f"u{k}_{a}_lo"), e.int_param(f"u{k}_{a}_n")
            st = abs(int(step))
            d, q = w.tmp("ud"), w.tmp("uq")          # (not `d2`, `q3`: those name parameters)
            w.line(f"{d} = i{a} - {lo}")
            if st == 1:
                w.line(f"{inside} = {inside} & ({d} >= 0) & ({d} < {cnt})")
                w.line(f"{q} = {d}")
            else:
                w.line(f"{inside} = {inside} & ({d} >= 0) & ({d} % {st} == 0) & ({d} < {cnt} * {st})")
                w.line(f"{q} = {d} // {st}")
            src.append(f"({cnt} - 1 - {q})" if step < 0 else q)
        else:
            w.line(f"{inside} = {inside} & (i{a} == {e.int_param(f'u{k}_{a}_at')})")
    src += [f"i{a}" for a in range(len(items), spec.rank)]
    x = n.args[0]
    v = w.tmp("v")
    if x[0] == "c":
        w.line(f"{v} = tl.where({inside}, {literal(x[1], x[2])}, 0)")
    elif spec.operands[x[1]][1] == "scalar":
        w.line(f"{v} = tl.where({inside}, {e.load(x[1], '0', None)}, 0)")
    else:
        off = e.dot((s, e.stride(x[1], d)) for d, s in enumerate(src)) or "0"
        w.line(f"{v} = {e.load(x[1], off, inside)}")
    return v


def _gather(e: Emitter, k: int, n, idx: str) -> str:
    """Node k, a `gather`: the table's element in row `idx` (this element's index, loaded at the
    domain's leading positions), the rest of the domain's dims lining up with the table's after its
    rows. An index outside the table reads nothing (the load is masked, the row clamped to 0) and
    gives 0: engines refuse such index inputs, read with the run's checks after it."""
    w, spec = e.w, e.spec
    lead = dict(n.attrs)["lead"]
    t = n.args[0][1]
    rows = e.int_param(f"g{k}_rows")
    ok, row = w.tmp("ok"), w.tmp("row")
    w.line(f"{ok} = mask & ({idx} >= 0) & ({idx} < {rows})")
    w.line(f"{row} = tl.where({ok}, {idx}, 0).to({e.idx})")
    cols = [(f"i{lead + d - 1}", e.stride(t, d)) for d in range(1, spec.rank - lead + 1)]
    off = e.dot([(row, e.stride(t, 0))] + cols) or "0"
    v = w.tmp("v")
    w.line(f"{v} = {e.load(t, off, ok)}")
    return v


# --- row reductions ------------------------------------------------------------------------------

def _identity(agg: str, dtype: str) -> str:
    """The value a reduction of `agg` ("sum", "mean", "max", "min") starts from, in compute `dtype`."""
    if agg in ("sum", "mean"):
        return "0"
    low = agg == "max"
    if dtype in FLOAT:
        return '-float("inf")' if low else 'float("inf")'
    if dtype == "bool":
        return "False" if low else "True"
    if dtype == "uint8":
        return "0" if low else "255"
    bits = {"int8": 8, "int16": 16, "int32": 32, "int64": 64}[dtype]
    return str(-(2 ** (bits - 1))) if low else str(2 ** (bits - 1) - 1)


def rowwise(e: Emitter) -> Emitted:
    spec, w, v = e.spec, e.w, e.variant
    e.pointer_params()
    nrow, rank = spec.row_dims, spec.rank
    e.int_param("R")
    cols = e.int_param("C", hint16=True)
    w.line(f"row = tl.program_id(0).to({e.idx})")
    w.line("cols = tl.arange(0, BLOCK_N)")

    # Row indices (for what is addressed through strides) and per-operand row offsets, computed
    # once: they do not change along a row.
    strided = [j for j, (_dt, level) in enumerate(spec.operands) if level != "scalar" and e.layout(j) != "dense"]
    if strided or spec.strided_out:
        e.unravel("row", 0, nrow, "ri")
    for j in strided:
        w.line(f"ro{j} = {e.dot((f'ri{d}', e.stride(j, d)) for d in range(nrow)) or '0'}")

    def col_offset(j: int, c: str) -> str:
        """Operand j's offset along the columns `c` (a linear index over the reduced dims)."""
        return e.dot((idx, e.stride(j, d)) for d, idx in e.split(c, nrow, rank).items())

    # Reductions (and softmax's two hidden ones) in passes over the row (`row_passes`); full-level
    # values are recomputed from memory inside each pass.
    plan = row_passes(spec)
    reductions = [r for p in plan.passes for r in p]

    row_vals: dict[int, str] = {}      # row-level nodes computed so far
    single = v.single

    def full_scope(c: str, cmask: str):
        """Computes full-level node values at columns `c`; returns (values dict, loader)."""
        vals: dict[int, str] = {}
        loaded: dict[int, str] = {}

        def load(j: int) -> str:
            if j in loaded:
                return loaded[j]
            level = spec.operands[j][1]
            t = w.tmp("x")
            if level == "scalar":
                w.line(f"{t} = {e.load(j, '0', None)}")
            elif level == "row":
                off = "row" if e.layout(j) == "dense" else f"ro{j}"
                w.line(f"{t} = {e.load(j, off, None)}")
            elif e.layout(j) == "dense":
                w.line(f"{t} = {e.load(j, f'row * {cols} + {c}', cmask)}")
            else:
                co = col_offset(j, c)
                off = " + ".join(x for x in (f"ro{j}", co) if x)
                # Stride 0 along the row: one value per row, a scalar load broadcast over the tile.
                w.line(f"{t} = {e.load(j, off, cmask if co else None)}")
            loaded[j] = t
            return t

        def value(k) -> str:
            if isinstance(k, tuple):          # an operand read directly by a reduction
                return load(k[1])
            if k in row_vals:
                return row_vals[k]
            if k in vals:
                return vals[k]
            n = spec.nodes[k]
            if n.op in ("softmax", "log_softmax"):
                x = value(n.args[0][1]) if n.args[0][0] == "n" else e.arg(n.args[0], vals, load)
                m, s = f"smax{k}", f"ssum{k}"
                t = w.tmp("v")
                if n.op == "softmax" and ("safe", True) in n.attrs:   # a row of -inf alone: zeros
                    w.line(f'{t} = tl.where({m} == float("-inf"), 0.0, tl.exp(({x}) - {m}) / {s})')
                elif n.op == "softmax":
                    w.line(f"{t} = tl.exp(({x}) - {m}) / {s}")
                else:
                    w.line(f"{t} = ({x}) - {m} - tl.log({s})")
                vals[k] = t
                return t
            xs = [value(a[1]) if a[0] == "n" else e.arg(a, vals, load) for a in n.args]
            t = w.tmp("v")
            w.line(f"{t} = {e.op(n, xs, index=c)}")
            vals[k] = t
            return t

        return value

    def online_exp(k: int, agg: str, x: str) -> str:
        """exp(x) as online sum (k, agg) computes its terms: softmax's `tl.exp`, else its exp node's."""
        if agg == "expsum":
            return f"tl.exp({x})"
        return e.op(spec.nodes[spec.nodes[k].args[0][1]], [x])

    def emit_reduction_step(k: int, agg: str, value, c: str, cmask: str, acc: str | None) -> str:
        """The reduction of one tile (acc is None in the single-tile form)."""
        a = spec.nodes[k].args[0]
        x = value(a[1]) if a[0] == "n" else value(("o", a[1]))
        n = spec.nodes[k]
        dt = compute_dtype(spec.nodes[a[1]].dtype if a[0] == "n" else spec.operands[a[1]][0])
        if agg == "expsum":
            x = f"tl.exp(({x}) - smax{k})"
            agg_ = "sum"
        else:
            agg_ = agg
        masked = f"tl.where({cmask}, {x}, {_identity(agg_, dt)})"
        t = w.tmp("m")
        w.line(f"{t} = {masked}")
        nan_check = agg_ in ("max", "min") and dt in FLOAT and n.op in ("max", "min")
        if acc is not None:
            _fold(w, acc, agg_, t, nan_check)
        return t

    def finish_reduction(k: int, agg: str, name: str, tile_or_acc: str, has_nan: str | None) -> None:
        n = spec.nodes[k]
        reduction = n.op in REDUCTIONS          # not softmax's hidden max and sum: those stay float32
        _finish(w, name, tile_or_acc, "sum" if agg == "expsum" else agg, cols, has_nan,
                n.dtype if reduction else None)
        if reduction:
            row_vals[k] = name

    def compute_row_nodes() -> None:
        """Row-level element-wise nodes whose inputs are all available."""
        for k, n in enumerate(spec.nodes):
            if n.level != "row" or k in row_vals or n.op in REDUCTIONS:
                continue
            if all(a[0] != "n" or a[1] in row_vals for a in n.args):
                xs = [row_vals[a[1]] if a[0] == "n" else e.arg(a, {}, row_loader) for a in n.args]
                t = f"rv{k}"
                w.line(f"{t} = {e.op(n, xs, index='row')}")
                row_vals[k] = t

    row_loaded: dict[int, str] = {}

    def row_loader(j: int) -> str:
        if j not in row_loaded:
            level = spec.operands[j][1]
            t = f"y{j}"
            if level == "scalar":
                w.line(f"{t} = {e.load(j, '0', None)}")
            else:
                off = "row" if e.layout(j) == "dense" else f"ro{j}"
                w.line(f"{t} = {e.load(j, off, None)}")
            row_loaded[j] = t
        return row_loaded[j]

    compute_row_nodes()
    full_outputs = [(i, k) for i, k in enumerate(spec.outputs) if spec.nodes[k].level == "full"]
    permuted = spec.strided_out                               # softmax over a dim other than the last

    def out_offset(i: int, c: str) -> str:
        """Where full-level output i's element (row, c) goes: dense, or through its strides."""
        if not permuted:
            return f"row * {cols} + {c}"
        index = {d: f"ri{d}" for d in range(nrow)} | e.split(c, nrow, rank)
        return " + ".join(f"{idx} * {e.int_param(f'q{i}_s{d}')}" for d, idx in sorted(index.items()))
    if single:
        w.line(f"cmask = cols < {cols}")
        value = full_scope("cols", "cmask")
        for k, agg, name in reductions:
            tile = emit_reduction_step(k, agg, value, "cols", "cmask", None)
            nan = None
            if agg in ("max", "min") and spec.nodes[k].op in ("max", "min") and \
                    compute_dtype(_in_dtype(spec, k)) in FLOAT:
                nan = w.tmp("nan")
                w.line(f"{nan} = {tile} != {tile}")
            finish_reduction(k, agg, name, tile, nan)
            compute_row_nodes()
        for i, k in full_outputs:
            e.store(i, out_offset(i, "cols"), value(k), "cmask")
    else:
        def nan_checked(k: int, agg: str) -> bool:
            return agg in ("max", "min") and compute_dtype(_in_dtype(spec, k)) in FLOAT \
                and spec.nodes[k].op in ("max", "min")

        rescaled = plan.rescaled
        for reds in plan.passes:
            # One walk along the row for the reductions of a pass. A sum of exp(x - max) whose max
            # is in the same pass (`row_passes`) runs online, lane by lane: each lane keeps its sum
            # against its own running max, one exp an element (exp(-|x - m|): the element's term
            # when x <= m, else the old sum's rescale, the new term being 1), no reduction across
            # lanes inside the loop; the lanes' sums are rescaled to the row's max once, at the end.
            for k, agg, _name in reds:
                _accumulator(w, f"acc{k}_{agg}", "sum" if agg == "expsum" else agg,
                             compute_dtype(_in_dtype(spec, k)), "[BLOCK_N]", nan_checked(k, agg))
            w.line(f"for c0 in range(0, {cols}, BLOCK_N):")
            w.indent += 1
            w.line("c = c0 + cols")
            w.line(f"cmask = c < {cols}")
            value = full_scope("c", "cmask")
            for k, agg, _name in reds:
                if (k, agg) in plan.online:
                    continue                        # folded with its max, below
                acc = f"acc{k}_{agg}"
                if (k, agg) in rescaled:
                    old = w.tmp("old")
                    w.line(f"{old} = {acc}")
                tile = emit_reduction_step(k, agg, value, "c", "cmask", acc)
                if (k, agg) not in rescaled:
                    continue
                d = w.tmp("d")
                w.line(f"{d} = -tl.abs({tile} - {old})")
                for (ke, agge), (km, _m) in plan.online.items():
                    if km != k:
                        continue
                    t, s_ = w.tmp("e"), f"acc{ke}_{agge}"
                    w.line(f"{t} = {online_exp(ke, agge, d)}")
                    # -inf (and the masked lanes) add nothing; NaN makes the sum NaN, as in two walks.
                    w.line(f'{s_} = tl.where({tile} == float("-inf"), {s_}, '
                           f"tl.where({tile} > {old}, {s_} * {t} + 1.0, {s_} + {t}))")
            w.indent -= 1
            for k, agg, name in reds:
                acc = f"acc{k}_{agg}"
                if (k, agg) in plan.online:
                    km, m = plan.online[(k, agg)]
                    lanes = f"acc{km}_max"
                    w.line(f'{acc} = tl.where({lanes} == float("-inf"), 0.0, '
                           f"{acc} * {online_exp(k, agg, f'{lanes} - {m}')})")
                finish_reduction(k, agg, name, acc, f"{acc}_nan" if nan_checked(k, agg) else None)
                if (k, agg) in plan.online:
                    # NaN where two walks give NaN in every element: the max is NaN (exp(x - NaN)),
                    # or the row is -inf alone (exp(-inf + inf)); the online sum skipped those.
                    w.line(f'{name} = tl.where(({m} != {m}) | (({m} == float("-inf")) & ({cols} > 0)), '
                           f'float("nan"), {name})')
            compute_row_nodes()
        if full_outputs:
            w.line(f"for c0 in range(0, {cols}, BLOCK_N):")
            w.indent += 1
            w.line("c = c0 + cols")
            w.line(f"cmask = c < {cols}")
            value = full_scope("c", "cmask")
            for i, k in full_outputs:
                e.store(i, out_offset(i, "c"), value(k), "cmask")
            w.indent -= 1
    for i, k in enumerate(spec.outputs):
        if spec.nodes[k].level != "full":
            e.store(i, "row", row_vals[k], None, block=False)
    return e.finish({"BLOCK_N": e.config["BLOCK_N"]})


@dataclass
class RowPlan:
    """The looped row form's walks along the row (`row_passes`)."""
    passes: list[list[tuple[int, str, str]]]      # (node, "sum" | "mean" | "max" | "min" | "expsum", name)
    # A sum of exp(x - m) folded online with the max m of its pass, over the values m reduces:
    # (node, agg) -> (m's node, m's row value).
    online: dict[tuple[int, str], tuple[int, str]] = field(default_factory=dict)

    @property
    def rescaled(self) -> set[tuple[int, str]]:
        """The maxes the online sums fold with."""
        return {(m, "max") for m, _ in self.online.values()}


def row_passes(spec: KernelSpec) -> RowPlan:
    """Groups a row kernel's reductions into walks along the row. A reduction joins the current
    walk when every row value its input needs comes from an earlier walk (independent ones, as
    cross-entropy's log-sum-exp and its target's logit, read each element once), or when the one
    it needs from this walk is a max m and it sums exp(y - m) with y the value m reduces: softmax's
    hidden sum, and the `m + log(sum(exp(x - m)))` a log-sum-exp spells out. Those run online
    (FlashAttention's rescaling), so a softmax's statistics take one walk, not two."""
    nodes = spec.nodes
    needs_memo: dict[int, frozenset] = {}

    def needs(a: tuple) -> frozenset:
        """The reductions (node, agg) whose row values computing arg `a` needs."""
        if a[0] != "n":
            return frozenset()
        k = a[1]
        if k not in needs_memo:
            n = nodes[k]
            if n.op in REDUCTIONS:
                out = frozenset({(k, n.op)})
            elif n.op in ("softmax", "log_softmax"):
                out = frozenset({(k, "max"), (k, "expsum")}) | needs(n.args[0])
            else:
                out = frozenset().union(*(needs(x) for x in n.args))
            needs_memo[k] = out
        return needs_memo[k]

    same_memo: dict[tuple, bool] = {}

    def same(a: tuple, b: tuple) -> bool:
        """Whether args a and b compute the same value (the same ops over the same operands)."""
        if a == b:
            return True
        if a[0] != "n" or b[0] != "n":
            return False
        if (a, b) not in same_memo:
            x, y = nodes[a[1]], nodes[b[1]]
            same_memo[(a, b)] = (x.op, x.dtype, x.level, x.attrs, len(x.args)) == \
                (y.op, y.dtype, y.level, y.attrs, len(y.args)) \
                and x.op not in REDUCTIONS and x.op not in ("softmax", "log_softmax") \
                and all(same(p, q) for p, q in zip(x.args, y.args))
        return same_memo[(a, b)]

    def online_of(k: int, agg: str) -> tuple[int, str] | None:
        """(the max's node, its row value) when reduction (k, agg) sums exp(y - max), y the value
        the max reduces."""
        n = nodes[k]
        if agg == "expsum":
            return k, f"smax{k}"
        if n.op != "sum" or n.args[0][0] != "n":
            return None
        ex = nodes[n.args[0][1]]
        if ex.op != "exp" or ex.args[0][0] != "n":
            return None
        sub = nodes[ex.args[0][1]]
        exact = ("float32", "float64")
        if sub.op != "sub" or len(sub.args) != 2 or sub.args[1][0] != "n" or ex.dtype not in exact \
                or sub.dtype not in exact or ex.dtype != sub.dtype:
            return None
        m = nodes[sub.args[1][1]]
        if m.op != "max" or m.dtype not in exact or not same(sub.args[0], m.args[0]):
            return None
        return sub.args[1][1], f"red{sub.args[1][1]}"

    reductions: list[tuple[int, str, str]] = []
    for k, n in enumerate(nodes):
        if n.op in REDUCTIONS:
            reductions.append((k, n.op, f"red{k}"))
        elif n.op in ("softmax", "log_softmax"):
            reductions.append((k, "max", f"smax{k}"))
            reductions.append((k, "expsum", f"ssum{k}"))
    plan = RowPlan([])
    done: set = set()
    current: list[tuple[int, str, str]] = []
    for k, agg, name in reductions:
        n = nodes[k]
        need = needs(n.args[0]) | ({(k, "max")} if agg == "expsum" else set())
        inside = {(r[0], r[1]) for r in current}
        pair = online_of(k, agg) if need & inside else None
        if pair is not None and (pair[0], "max") in inside and need - done == {(pair[0], "max")} \
                and compute_dtype(_in_dtype(spec, pair[0])) in FLOAT:
            plan.online[(k, agg)] = pair
        elif need & inside:
            plan.passes.append(current)
            done |= inside
            current = []
        current.append((k, agg, name))
    if current:
        plan.passes.append(current)
    return plan


def columns_fit(spec: KernelSpec) -> bool:
    """Whether a row-reduction spec can run in the column form: reductions and element-wise ops
    only (no softmax, no op reading the element's index), every output a row value or, over a
    permuted domain, an element-wise value stored through its strides (a strided reduction's
    prologue writing a cast of what it reduces)."""
    return spec.row_dims >= 1 and all(n.op not in INDEXED_OPS and n.op not in ("softmax", "log_softmax")
                                      for n in spec.nodes) \
        and any(n.op in REDUCTIONS for n in spec.nodes) \
        and all(spec.nodes[k].level == "row" or spec.strided_out for k in spec.outputs)


def rowwise_columns(e: Emitter) -> Emitted:
    """The row-reduction kernel's column form (config `ROWS` > 0): one program reduces `ROWS`
    adjacent rows at once, walking the reduced dim in [BLOCK_N, ROWS] tiles. Where adjacent rows
    are adjacent in memory and the reduced dim is strided (a bias's gradient, `sum(g, dim=0)` of a
    [T, D] gradient), a tile's loads are coalesced along the rows, where the one-row form walks
    each strided column alone. Same reduction order per row as the looped form (BLOCK_N lanes,
    then a tree over them), so the same bits for the same BLOCK_N."""
    spec, w = e.spec, e.w
    e.pointer_params()
    nrow, rank = spec.row_dims, spec.rank
    cols = e.int_param("C", hint16=True)
    # A program takes ROWS rows along the last kept dim (`L` long) of one index of the others,
    # `outer`: those rows are contiguous, so their loads vectorise, and the outer index is one
    # scalar (grid: cdiv(L, ROWS) programs per outer index; `RowwiseTemplate.grid`).
    last = _row_blocks(e, "ROWS", "lane")
    w.line(f"row = outer * {last} + lane")
    w.line(f"rmask = lane < {last}")
    w.line("lanes = tl.arange(0, BLOCK_N)")
    e.unravel("outer", 0, nrow - 1, "ri")
    w.line(f"ri{nrow - 1} = lane")
    tiled = [j for j, (_dt, level) in enumerate(spec.operands) if level != "scalar"]
    for j in tiled:
        if e.layout(j) == "dense":
            w.line(f"ro{j} = row * {cols}" if spec.operands[j][1] == "full" else f"ro{j} = row")
        else:
            w.line(f"ro{j} = {e.dot((f'ri{d}', e.stride(j, d)) for d in range(nrow)) or '0'}")

    def col_offset(j: int, c: str) -> str:
        if e.layout(j) == "dense":
            return c
        return e.dot((idx, e.stride(j, d)) for d, idx in e.split(c, nrow, rank).items())

    row_vals: dict[int, str] = {}
    row_loaded: dict[int, str] = {}

    def row_loader(j: int) -> str:
        if j not in row_loaded:
            t = f"y{j}"
            if spec.operands[j][1] == "scalar":
                w.line(f"{t} = {e.load(j, '0', None)}")
            else:
                w.line(f"{t} = {e.load(j, f'ro{j}', 'rmask')}")
            row_loaded[j] = t
        return row_loaded[j]

    def compute_row_nodes() -> None:
        for k, n in enumerate(spec.nodes):
            if n.level != "row" or k in row_vals or n.op in REDUCTIONS:
                continue
            if all(a[0] != "n" or a[1] in row_vals for a in n.args):
                xs = [row_vals[a[1]] if a[0] == "n" else e.arg(a, {}, row_loader) for a in n.args]
                row_vals[k] = f"rv{k}"
                w.line(f"rv{k} = {e.op(n, xs)}")

    loaded: dict[int, str] = {}         # operand -> its tile, loaded in the current walk

    def load(j: int) -> str:
        if j not in loaded:
            t = w.tmp("x")
            level = spec.operands[j][1]
            if level == "scalar":
                w.line(f"{t} = {e.load(j, '0', None)}")
            elif level == "row":
                w.line(f"{t} = {e.load(j, f'ro{j}', 'rmask')}[None, :]")
            else:
                co = col_offset(j, "c")
                off = f"ro{j}[None, :] + ({co})[:, None]" if co else f"ro{j}[None, :] + 0 * c[:, None]"
                w.line(f"{t} = {e.load(j, off, 'tmask')}")
            loaded[j] = t
        return loaded[j]

    def walk() -> dict[int, str]:
        """Opens a loop over the reduced dim in [BLOCK_N, ROWS] tiles; returns its tile values."""
        w.line(f"for c0 in range(0, {cols}, BLOCK_N):")
        w.indent += 1
        w.line("c = c0 + lanes")
        w.line(f"tmask = (c < {cols})[:, None] & rmask[None, :]")
        loaded.clear()
        return {}

    def value(kk: int, vals: dict[int, str]) -> str:
        if kk in row_vals:
            return f"{row_vals[kk]}[None, :]"
        if kk not in vals:
            m = spec.nodes[kk]
            xs = [value(a[1], vals) if a[0] == "n" else e.arg(a, vals, load) for a in m.args]
            vals[kk] = w.tmp("v")
            w.line(f"{vals[kk]} = {e.op(m, xs)}")
        return vals[kk]

    # Element-wise outputs (a strided reduction's prologue writing the cast of what it reduces;
    # `columns_fit`), stored through their strides in the first walk where the row values they
    # read are known: each element once.
    full_outputs = [(i, k) for i, k in enumerate(spec.outputs) if spec.nodes[k].level != "row"]
    stored: set[int] = set()

    def ready(kk: int) -> bool:
        if kk in row_vals:
            return True
        m = spec.nodes[kk]
        return m.op not in REDUCTIONS and m.level != "row" and all(a[0] != "n" or ready(a[1]) for a in m.args)

    def out_offset(i: int) -> str:
        index = {d: f"ri{d}" for d in range(nrow)}
        # (`lane_out`: unit stride along the rows, so the tile's stores vectorise along them.)
        rows = " + ".join(idx if d == nrow - 1 and spec.lane_out else f"{idx} * {e.int_param(f'q{i}_s{d}', True)}"
                          for d, idx in sorted(index.items()))
        along = " + ".join(f"{idx} * {e.int_param(f'q{i}_s{d}', True)}"
                           for d, idx in sorted(e.split("c", nrow, rank).items()))
        return f"({rows})[None, :] + ({along})[:, None]"

    def store_full(vals: dict[int, str]) -> None:
        for i, k in full_outputs:
            if i not in stored and ready(k):
                e.store(i, out_offset(i), value(k, vals), "tmask")
                stored.add(i)

    compute_row_nodes()
    for k, n in enumerate(spec.nodes):
        if n.op not in REDUCTIONS:
            continue
        dt = compute_dtype(_in_dtype(spec, k))
        agg = n.op
        init = _identity(agg, dt)
        acc = f"acc{k}"
        nan = agg in ("max", "min") and dt in FLOAT
        _accumulator(w, acc, agg, dt, "[BLOCK_N, ROWS]", nan)
        vals = walk()
        a = n.args[0]
        x = value(a[1], vals) if a[0] == "n" else load(a[1])
        t = w.tmp("m")
        w.line(f"{t} = tl.where(tmask, {x}, {init})")
        _fold(w, acc, agg, t, nan)
        store_full(vals)
        w.indent -= 1
        row_vals[k] = f"red{k}"
        _finish(w, row_vals[k], acc, agg, cols, f"{acc}_nan" if nan else None, n.dtype)
        compute_row_nodes()
    if len(stored) < len(full_outputs):       # outputs of the row values too: one more walk
        store_full(walk())
        w.indent -= 1
    for i, k in enumerate(spec.outputs):
        if spec.nodes[k].level == "row":
            e.store(i, "row", row_vals[k], "rmask")
    return e.finish({"BLOCK_N": e.config["BLOCK_N"], "ROWS": e.config["ROWS"]})


def _accumulator(w, acc: str, agg: str, dt: str, shape: str, nan: bool) -> None:
    """A reduction's accumulator tile (float32 for 16-bit floats; max and min in the compute
    dtype) from its identity, and its NaN-seen tile where max/min must keep a NaN."""
    acc_dt = TL[dt] if agg in ("max", "min") else ("tl.float32" if dt in FLOAT and dt != "float64" else TL[dt])
    w.line(f"{acc} = tl.full({shape}, {_identity(agg, dt)}, {acc_dt})")
    if nan:
        w.line(f"{acc}_nan = tl.zeros({shape}, tl.int1)")


def _fold(w, acc: str, agg: str, tile: str, nan: bool) -> None:
    """Adds a masked tile into a reduction's accumulator (and its NaN-seen tile for max/min)."""
    if agg in ("sum", "mean"):
        w.line(f"{acc} = {acc} + {tile}")
        return
    w.line(f"{acc} = {'tl.maximum' if agg == 'max' else 'tl.minimum'}({acc}, {tile})")
    if nan:
        w.line(f"{acc}_nan = {acc}_nan | ({tile} != {tile})")


def _finish(w, name: str, acc: str, agg: str, cols: str, nan_tile: str | None, out_dtype: str | None) -> None:
    """`name` = the accumulator reduced over its first axis (a mean divided by the row length, NaN
    where the NaN-seen tile saw one), rounded to `out_dtype` where that is narrower than the
    compute dtype or not a float (None: left in the compute dtype)."""
    fn = {"sum": "tl.sum", "mean": "tl.sum", "max": "tl.max", "min": "tl.min"}[agg]
    w.line(f"{name} = {fn}({acc}, axis=0)")
    if agg == "mean":
        w.line(f"{name} = {name} / {cols}")
    if nan_tile:
        w.line(f'{name} = tl.where(tl.max({nan_tile}.to(tl.int32), axis=0) > 0, float("nan"), {name})')
    if out_dtype is not None:
        dt = compute_dtype(out_dtype)
        if dt not in FLOAT or out_dtype != dt:
            w.line(f"{name} = {name}.to({TL[out_dtype]}).to({TL[dt]})")


def _in_dtype(spec: KernelSpec, k: int) -> str:
    a = spec.nodes[k].args[0]
    return spec.nodes[a[1]].dtype if a[0] == "n" else spec.operands[a[1]][0]


