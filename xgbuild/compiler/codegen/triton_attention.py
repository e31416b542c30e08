"""The attention template: naive attention, `softmax(chain(q @ kT), dim=-1) @ v`, as one flash-style
Triton kernel. The [T, S] scores and probabilities never go to memory.

One program computes a BLOCK_M x BLOCK_DV tile of the output for one batch index: it walks the
keys in blocks of BLOCK_N, computes that block's scores (`tl.dot`, float32 accumulators; float32
operands with exact "ieee" products, as the matmul template), rounds them to the product's dtype,
evaluates the score chain on the tile with the same element-wise op code as every other kernel
(operands it reads are loaded at the tile's rows and columns through their strides; index
expressions, a causal mask from IOTAs, are computed from the row and column indices), and folds
the block into an online softmax: a running row max and sum in float32 and an accumulator rescaled
whenever the max grows. Columns past S are -inf. A row whose every score is -inf ends 0 / 0 = NaN,
what `torch.softmax` (the CPU reference, and the unfused row kernel) gives such a row.

Config knobs: `BLOCK_M`, `BLOCK_N` (key block), `BLOCK_D` (a chunk of the head dim D: with the
variant's `single` assumption, D <= BLOCK_D and q's tile is loaded once; otherwise the score
product loops over D in chunks), `BLOCK_DV` (the output columns a program covers; more programs
cover a wider v), warps and stages.

Causal block skipping: when the softmax's input is `where(col <= row, x, fill)`, with `col`/`row`
IOTAs along the key/query dims and `fill` -inf or at most -1e8, a program stops at the first key
block lying wholly above its rows' diagonal. Every row keeps its key 0, so its max is one of its
kept scores and exp(fill - max) is 0 for the skipped ones: the result is unchanged. Programs run
the longest rows first.
"""

from __future__ import annotations

from .emitter import TL, Emitted, Emitter
from .spec import KernelSpec

# A masked fill at most this is a skipped score's exact zero after exp (float32 underflows below
# exp(-104)), whatever the kept scores within 1e8 - 104 of it are.
VERY_NEGATIVE = -1e8


def parts(spec: KernelSpec) -> tuple[int, int, int]:
    """Local indices of q @ kT, softmax and p @ v."""
    mms = [k for k, n in enumerate(spec.nodes) if n.op == "matmul"]
    sm = next(k for k, n in enumerate(spec.nodes) if n.op == "softmax")
    return mms[0], sm, mms[-1]


def causal(spec: KernelSpec) -> bool:
    """Is the softmax's input `where(col <= row, scores, very negative)` (see the module doc)?"""
    _mm1, sm, _mm2 = parts(spec)
    a = spec.nodes[sm].args[0]
    if a[0] != "n" or spec.nodes[a[1]].op != "where":
        return False
    mask, _then, fill = spec.nodes[a[1]].args
    if fill[0] != "c" or mask[0] != "n":
        return False
    value = fill[1]
    if isinstance(value, str):
        if value != "-inf":
            return False
    elif not float(value) <= VERY_NEGATIVE:
        return False
    cmp = spec.nodes[mask[1]]
    if cmp.op not in ("le", "ge") or any(x[0] != "n" or spec.nodes[x[1]].op != "iota" for x in cmp.args):
        return False
    levels = tuple(spec.nodes[x[1]].level for x in cmp.args)
    return levels == (("col", "row") if cmp.op == "le" else ("row", "col"))


def _dot(a: str, b: str, acc: str | None, dtype: str) -> str:
    extra = ', input_precision="ieee"' if dtype == "float32" else ""
    return f"tl.dot({a}, {b}{', ' + acc if acc else ''}{extra})"


def attention(e: Emitter) -> Emitted:
    spec, w, v, cfg = e.spec, e.w, e.variant, e.config
    e.pointer_params()
    nb = spec.rank - 2
    jq, jk, jv = spec.matmul
    qk_dt, v_dt = spec.operands[jq][0], spec.operands[jv][0]
    if {qk_dt, v_dt} - {"bfloat16", "float16", "float32"}:
        raise NotImplementedError(f"no GPU attention for {qk_dt} / {v_dt} operands")
    mm1, sm, _mm2 = parts(spec)
    skip = causal(spec)
    e.int_param("M")
    for name in ("N", "K", "DV"):
        e.int_param(name, hint16=True)

    w.line("num_m = tl.cdiv(M, BLOCK_M)")
    w.line("pid = tl.program_id(0)")
    w.line(f"bid = tl.program_id(1).to({e.idx})")
    w.line("pid_m = pid % num_m")
    if skip:
        w.line("pid_m = num_m - 1 - pid_m          # the longest rows first")
    w.line("pid_v = pid // num_m")
    w.line(f"rm = pid_m.to({e.idx}) * BLOCK_M + tl.arange(0, BLOCK_M)")
    w.line(f"rv = pid_v.to({e.idx}) * BLOCK_DV + tl.arange(0, BLOCK_DV)")
    w.line("rd = tl.arange(0, BLOCK_D)")
    w.line("m_ok = rm < M")
    w.line("v_ok = rv < DV")
    e.unravel("bid", 0, nb, "bi")

    def offset(j: int, rest: str = "") -> str:
        """Operand j's offset: its batch index's, plus `rest`."""
        return " + ".join(x for x in (e.dot((f"bi{d}", e.stride(j, d)) for d in range(nb)), rest) if x) or "0"

    def base(j: int) -> str:
        return f"p{j} + {offset(j)}"

    sqm, sqd = e.stride(jq, nb), e.stride(jq, nb + 1)
    skd, skn = e.stride(jk, nb), e.stride(jk, nb + 1)
    svn, svd = e.stride(jv, nb), e.stride(jv, nb + 1)
    w.line(f"q_base = {base(jq)}")
    w.line(f"k_base = {base(jk)}")
    w.line(f"v_base = {base(jv)}")
    if v.single:      # D <= BLOCK_D: q's tile is loaded once
        w.line(f"q = tl.load(q_base + rm[:, None] * {sqm} + rd[None, :] * {sqd}, "
               "mask=m_ok[:, None] & (rd < K)[None, :], other=0)")
    loaded: dict[int, str] = {}
    for j, (_dt, level) in enumerate(spec.operands):
        if level == "scalar":           # run-time scalars (a scale): loaded once, before the loop
            loaded[j] = f"x{j}"
            w.line(f"x{j} = {e.load(j, '0', None)}")
    w.line('m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)')
    w.line("l_i = tl.zeros([BLOCK_M], tl.float32)")
    w.line("acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)")
    hi = "tl.minimum(N, (pid_m + 1) * BLOCK_M)" if skip else "N"
    w.line(f"for n0 in range(0, {hi}, BLOCK_N):")
    w.indent += 1
    w.line("rn = n0 + tl.arange(0, BLOCK_N)")
    w.line("n_ok = rn < N")
    if v.single:
        w.line(f"kt = tl.load(k_base + rd[:, None] * {skd} + rn[None, :] * {skn}, "
               "mask=(rd < K)[:, None] & n_ok[None, :], other=0)")
        w.line(f"s = {_dot('q', 'kt', None, qk_dt)}")
    else:
        w.line("s = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)")
        w.line("for d0 in range(0, K, BLOCK_D):")
        w.indent += 1
        w.line("dd = d0 + rd")
        w.line(f"q = tl.load(q_base + rm[:, None] * {sqm} + dd[None, :] * {sqd}, "
               "mask=m_ok[:, None] & (dd < K)[None, :], other=0)")
        w.line(f"kt = tl.load(k_base + dd[:, None] * {skd} + rn[None, :] * {skn}, "
               "mask=(dd < K)[:, None] & n_ok[None, :], other=0)")
        w.line(f"s = {_dot('q', 'kt', 's', qk_dt)}")
        w.indent -= 1
    # The product rounds to its dtype before the chain reads it, as on the CPU.
    if spec.nodes[mm1].dtype in ("bfloat16", "float16"):
        w.line(f"s = s.to({TL[spec.nodes[mm1].dtype]}).to(tl.float32)")

    def load(j: int) -> str:
        """Operand j read by the chain, at this tile's rows and columns (broadcast where its stride is 0)."""
        if j not in loaded:
            t = w.tmp("x")
            sm_, sn_ = e.stride(j, nb), e.stride(j, nb + 1)
            if sm_ == "0" and sn_ == "0":
                w.line(f"{t} = {e.load(j, offset(j), None)}")
            elif sm_ == "0":
                w.line(f"{t} = {e.load(j, offset(j, f'rn * {sn_}'), 'n_ok')}[None, :]")
            elif sn_ == "0":
                w.line(f"{t} = {e.load(j, offset(j, f'rm * {sm_}'), 'm_ok')}[:, None]")
            else:
                tile = f"rm[:, None] * {sm_} + rn[None, :] * {sn_}"
                w.line(f"{t} = {e.load(j, offset(j, tile), 'm_ok[:, None] & n_ok[None, :]')}")
            loaded[j] = t
        return loaded[j]

    vals: dict[int, str] = {mm1: "s"}
    for k in range(mm1 + 1, sm):
        n = spec.nodes[k]
        t = w.tmp("v")
        if n.op == "iota":
            index = "rm[:, None]" if n.level == "row" else "rn[None, :]"
            w.line(f"{t} = {index}.to({TL[n.dtype]})")
        else:
            w.line(f"{t} = {e.op(n, [e.arg(a, vals, load) for a in n.args])}")
        vals[k] = t
    x = e.arg(spec.nodes[sm].args[0], vals, load)
    # Online softmax over the key blocks; columns past S take no part.
    w.line(f'x = tl.where(n_ok[None, :], {x}, float("-inf"))')
    w.line("m_new = tl.maximum(m_i, tl.max(x, axis=1))")
    w.line('m_use = tl.where(m_new == float("-inf"), 0.0, m_new)     # an all -inf block so far: nothing to scale')
    w.line("alpha = tl.exp(m_i - m_use)")
    w.line("p = tl.exp(x - m_use[:, None])")
    w.line("l_i = l_i * alpha + tl.sum(p, axis=1)")
    w.line(f"vv = tl.load(v_base + rn[:, None] * {svn} + rv[None, :] * {svd}, mask=n_ok[:, None] & v_ok[None, :], other=0)")
    w.line("acc = acc * alpha[:, None]")
    w.line(f"acc = {_dot(f'p.to({TL[v_dt]})', 'vv', 'acc', v_dt)}")
    w.line("m_i = m_new")
    w.indent -= 1
    w.line("out = acc / l_i[:, None]")
    e.store(0, "bid * M * DV + rm[:, None] * DV + rv[None, :]", "out", "m_ok[:, None] & v_ok[None, :]")
    return e.finish({"BLOCK_M": cfg["BLOCK_M"], "BLOCK_N": cfg["BLOCK_N"], "BLOCK_D": cfg["BLOCK_D"],
                     "BLOCK_DV": cfg["BLOCK_DV"]})

