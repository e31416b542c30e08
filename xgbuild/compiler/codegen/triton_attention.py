"""The attention template: naive attention, `softmax(chain(q @ kT), dim=-1) @ v`, as one flash-style
Triton kernel. The [T, S] scores and probabilities never go to memory.

One program computes a BLOCK_M x BLOCK_DV tile of the output for one batch index: it walks the
keys in blocks of BLOCK_N, computes that block's scores (`tl.dot`, float32 accumulators; float32
operands with exact "ieee" products, as the matmul template), keeps them in float32, evaluates
the score chain on the tile with the same element-wise op code as every other kernel
(operands it reads are loaded at the tile's rows and columns through their strides; index
expressions, a causal mask from IOTAs, are computed from the row and column indices), and folds
the block into an online softmax: a running row max and sum in float32 and an accumulator rescaled
whenever the max grows. Columns past S are -inf. A row whose every score is -inf ends 0 / 0 = NaN,
what `torch.softmax` (the CPU reference, and the unfused row kernel) gives such a row.

Config knobs: `BLOCK_M`, `BLOCK_N` (key block), `BLOCK_D` (a chunk of the head dim D: with the
variant's `single` assumption, D <= BLOCK_D and q's tile is loaded once; otherwise the score
product loops over D in chunks), `BLOCK_DV` (the output columns a program covers; more programs
cover a wider v), `TF32X3` (float32 operands: both products as three TF32 tensor-core products
instead of exact FMA; the tuner admits it only as accurate as float32's own), warps and stages.

Causal block skipping: when the softmax's input is `where(col <= row, x, fill)`, with `col`/`row`
integer IOTAs along the key/query dims and `fill` a constant, a program stops at the first key
block lying wholly above its rows' diagonal. Every skipped key scores exactly `fill` in every row
of the program, so the skipped keys are accounted for in closed form after the loop: their count
times exp(fill - max) joins the softmax's sum, and only if that weight is not 0 for some row (a
finite fill such as -1e9 above a row's kept scores, never with -inf) are their v rows read and
added. The result is the unfused program's. Programs run the longest rows first.

Scores in float32: a 16-bit score product is never stored, so it is not rounded to its dtype
before the chain reads it, as element-wise chains keep their 16-bit intermediates in float32 and
round only where the program casts or stores (`emitter.compute_dtype`); FlashAttention, cuDNN and
torch.compile's fused attention score in float32 alike. Rounding each score cost about 18% of a
kernel of this one's structure on an H200 (GPT-2's causal 8 x 12 x 1024 x 64: 65.0 -> 53.4 us,
cuDNN 49.7; docs/codegen.md), and the unrounded scores are the closer to the float64 reference.
The flash backward kernels recompute the same float32 scores (`triton_flash.py`), so their
probabilities are the forward's.

When the attention is differentiated (passes/flash.py), its gradient's `attn_lse` of the same
scores is a second output: each row's max plus the log of its sum, as the loop ends with them.
"""

from __future__ import annotations

from .emitter import TL, Emitted, Emitter
from .spec import KernelSpec

INTEGERS = {"int8", "int16", "int32", "int64", "uint8"}
LOG2E = 1.4426950408889634


def parts(spec: KernelSpec) -> tuple[int, int, int]:
    """Local indices of q @ kT, softmax and p @ v."""
    mms = [k for k, n in enumerate(spec.nodes) if n.op == "matmul"]
    sm = next(k for k, n in enumerate(spec.nodes) if n.op == "softmax")
    return mms[0], sm, mms[-1]


def causal(spec: KernelSpec) -> bool:
    """Is the softmax's input `where(col <= row, scores, fill)` over integer IOTAs (see the module doc)?"""
    return causal_fill(spec) is not None


def causal_fill(spec: KernelSpec) -> float | None:
    """The constant fill of a causal softmax input (see `causal`), else None."""
    _mm1, sm, _mm2 = parts(spec)
    a = spec.nodes[sm].args[0]
    if a[0] != "n" or spec.nodes[a[1]].op != "where":
        return None
    mask, _then, fill = spec.nodes[a[1]].args
    if fill[0] != "c" or mask[0] != "n":
        return None
    try:
        value = float(fill[1])              # "-inf" and numbers alike
    except (TypeError, ValueError):
        return None
    if value != value:
        return None                         # NaN
    cmp = spec.nodes[mask[1]]
    if cmp.op not in ("le", "ge") or any(x[0] != "n" or spec.nodes[x[1]].op != "iota"
                                         or spec.nodes[x[1]].dtype not in INTEGERS for x in cmp.args):
        return None
    levels = tuple(spec.nodes[x[1]].level for x in cmp.args)
    return value if levels == (("col", "row") if cmp.op == "le" else ("row", "col")) else None


def _rounded(value: float, dtype: str) -> float:
    """`value` as a tensor of `dtype` holds it (the where's fill, rounded as on the CPU)."""
    import torch
    from ...dtypes import TORCH_DTYPES
    return float(torch.tensor(value, dtype=TORCH_DTYPES[dtype]).float())


def _dot(a: str, b: str, acc: str | None, dtype: str, x3: bool = False) -> str:
    """tl.dot in float32 accumulators; float32 operands exact ("ieee": FMA) or, with `x3`, as
    three TF32 tensor-core products (hi*hi + hi*lo + lo*hi)."""
    extra = f', input_precision="{"tf32x3" if x3 else "ieee"}"' if dtype == "float32" else ""
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
    x3 = bool(cfg.get("TF32X3", 0))
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
    before_loop: dict[int, str] = {}
    for j, (_dt, level) in enumerate(spec.operands):
        if level == "scalar":           # run-time scalars (a scale): loaded once, before the loop
            before_loop[j] = f"x{j}"
            w.line(f"x{j} = {e.load(j, '0', None)}")
    w.line('m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)')
    w.line("l_i = tl.zeros([BLOCK_M], tl.float32)")
    w.line("acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)")

    def key_block(interior: bool) -> None:
        """One key block's scores, chain and online-softmax step; `interior`: no key past N and
        (causal) none right of the diagonal, so nothing is masked."""
        cols = None if interior else "n_ok"
        w.line("rn = n0 + tl.arange(0, BLOCK_N)")
        if not interior:
            w.line("n_ok = rn < N")
        kmask = "(rd < K)[:, None]" + ("" if interior else " & n_ok[None, :]")
        if v.single:
            w.line(f"kt = tl.load(k_base + rd[:, None] * {skd} + rn[None, :] * {skn}, mask={kmask}, other=0)")
            w.line(f"s = {_dot('q', 'kt', None, qk_dt, x3)}")
        else:
            w.line("s = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)")
            w.line("for d0 in range(0, K, BLOCK_D):")
            w.indent += 1
            w.line("dd = d0 + rd")
            w.line(f"q = tl.load(q_base + rm[:, None] * {sqm} + dd[None, :] * {sqd}, "
                   "mask=m_ok[:, None] & (dd < K)[None, :], other=0)")
            w.line(f"kt = tl.load(k_base + dd[:, None] * {skd} + rn[None, :] * {skn}, "
                   f"mask={kmask.replace('rd', 'dd')}, other=0)")
            w.line(f"s = {_dot('q', 'kt', 's', qk_dt, x3)}")
            w.indent -= 1
        # The scores stay float32: a 16-bit product is not rounded to its dtype before the chain
        # reads it (module doc).
        loaded = dict(before_loop)

        def load(j: int) -> str:
            """Operand j read by the chain, at this tile's rows and columns (broadcast where its stride is 0)."""
            if j not in loaded:
                t = w.tmp("x")
                sm_, sn_ = e.stride(j, nb), e.stride(j, nb + 1)
                if sm_ == "0" and sn_ == "0":
                    w.line(f"{t} = {e.load(j, offset(j), None)}")
                elif sm_ == "0":
                    w.line(f"{t} = {e.load(j, offset(j, f'rn * {sn_}'), cols)}[None, :]")
                elif sn_ == "0":
                    w.line(f"{t} = {e.load(j, offset(j, f'rm * {sm_}'), 'm_ok')}[:, None]")
                else:
                    tile = f"rm[:, None] * {sm_} + rn[None, :] * {sn_}"
                    both = "m_ok[:, None]" + ("" if interior else " & n_ok[None, :]")
                    w.line(f"{t} = {e.load(j, offset(j, tile), both)}")
                loaded[j] = t
            return loaded[j]

        vals: dict[int, str] = {mm1: "s"}
        for k in range(mm1 + 1, sm):
            n = spec.nodes[k]
            if interior and k == causal_where:      # every score here is kept: the where's `then`
                vals[k] = e.arg(n.args[1], vals, load)
                continue
            if interior and k not in kept:          # read only by the causal where's mask
                continue
            t = w.tmp("v")
            if n.op == "iota":
                index = "rm[:, None]" if n.level == "row" else "rn[None, :]"
                w.line(f"{t} = {index}.to({TL[n.dtype]})")
            else:
                w.line(f"{t} = {e.op(n, [e.arg(a, vals, load) for a in n.args])}")
            vals[k] = t
        x = e.arg(spec.nodes[sm].args[0], vals, load)
        # Online softmax over the key blocks, in base 2 (one FMA and an exp2 per score); columns
        # past S take no part.
        if interior:
            w.line(f"x = {x}")
        else:
            w.line(f'x = tl.where(n_ok[None, :], {x}, float("-inf"))')
        w.line("m_new = tl.maximum(m_i, tl.max(x, axis=1))")
        w.line('m_use = tl.where(m_new == float("-inf"), 0.0, m_new)     # an all -inf block so far: nothing to scale')
        w.line(f"alpha = tl.exp2((m_i - m_use) * {LOG2E!r})")
        w.line(f"p = tl.exp2(x * {LOG2E!r} - (m_use * {LOG2E!r})[:, None])")
        w.line("l_i = l_i * alpha + tl.sum(p, axis=1)")
        vmask = "v_ok[None, :]" if interior else "n_ok[:, None] & v_ok[None, :]"
        w.line(f"vv = tl.load(v_base + rn[:, None] * {svn} + rv[None, :] * {svd}, mask={vmask}, other=0)")
        w.line("acc = acc * alpha[:, None]")
        w.line(f"acc = {_dot(f'p.to({TL[v_dt]})', 'vv', 'acc', v_dt, x3)}")
        w.line("m_i = m_new")

    causal_where = spec.nodes[sm].args[0][1] if skip else None
    # The chain's nodes an interior block evaluates: what the softmax reads, through the causal
    # where's `then` side only.
    kept: set[int] = set()
    stack = [spec.nodes[causal_where].args[1] if skip else spec.nodes[sm].args[0]]
    while stack:
        a = stack.pop()
        if a[0] == "n" and a[1] not in kept:
            kept.add(a[1])
            stack += list(spec.nodes[a[1]].args)

    w.line("hi = " + ("tl.minimum(N, (pid_m + 1) * BLOCK_M)" if skip else "N"))
    # Interior key blocks first: wholly inside the keys and (causal) wholly left of the program's
    # first row, so no score in them is masked: their loads take no bounds masks and the causal
    # `where` is not evaluated. Then the blocks up to the diagonal (or N), masked.
    w.line("lo = " + ("tl.minimum(pid_m * BLOCK_M, N)" if skip else "N") + " // BLOCK_N * BLOCK_N")
    for interior in (True, False):
        w.line("for n0 in range(0, lo, BLOCK_N):" if interior else "for n0 in range(lo, hi, BLOCK_N):")
        w.indent += 1
        key_block(interior)
        w.indent -= 1


    fill = causal_fill(spec) if skip else None
    if fill is not None and fill != float("-inf"):
        # The keys past the last block visited score `fill` in every row here (module doc).
        w.line("end = tl.minimum(N, tl.cdiv(hi, BLOCK_N) * BLOCK_N)")
        w.line("n_skip = N - end")
        w.line(f"f = {_rounded(fill, spec.nodes[spec.nodes[sm].args[0][1]].dtype)!r}   # the fill, as the where holds it")
        w.line("m_fin = tl.where(n_skip > 0, tl.maximum(m_i, f), m_i)")
        w.line("alpha = tl.where(n_skip > 0, tl.exp(m_i - m_fin), 1.0)")
        w.line("w_f = tl.where(n_skip > 0, tl.exp(f - m_fin), 0.0)")
        w.line("l_i = l_i * alpha + n_skip.to(tl.float32) * w_f")
        w.line("m_i = m_fin")
        w.line("acc = acc * alpha[:, None]")
        w.line("if tl.max(w_f, axis=0) > 0:")
        w.indent += 1
        w.line("vsum = tl.zeros([BLOCK_DV], tl.float32)")
        w.line("for n0 in range(end, N, BLOCK_N):")
        w.indent += 1
        w.line("rn = n0 + tl.arange(0, BLOCK_N)")
        w.line(f"vv = tl.load(v_base + rn[:, None] * {svn} + rv[None, :] * {svd}, "
               "mask=(rn < N)[:, None] & v_ok[None, :], other=0)")
        w.line("vsum += tl.sum(vv.to(tl.float32), axis=0)")
        w.indent -= 1
        w.line("acc += w_f[:, None] * vsum[None, :]")
        w.indent -= 1
    if ("safe", True) in spec.nodes[sm].attrs:
        # A safe softmax: a row whose every score is -inf (l_i == 0 exactly then) gives zeros.
        w.line("out = tl.where(l_i[:, None] > 0, acc / l_i[:, None], 0.0)")
    else:
        w.line("out = tl.where(N > 0, acc / l_i[:, None], 0.0)     # no keys at all: an empty sum, as torch")
    if spec.strided_out:
        # Written as a view of the output (heads merged: [B, T, H * D] of the [B, H, T, D] result,
        # templates/attention.py): through the strides of that buffer seen in the domain's shape.
        # The head dim is contiguous there (placement.merged_heads): its stride is not a parameter,
        # so the stores vectorise; the others are hinted multiples of 16 where they are.
        where = e.dot([(f"bi{d}", e.int_param(f"q0_s{d}", hint16=True)) for d in range(nb)]
                      + [("rm[:, None]", e.int_param(f"q0_s{nb}", hint16=True)), ("rv[None, :]", "1")])
    else:
        where = "bid * M * DV + rm[:, None] * DV + rv[None, :]"
    e.store(0, where, "out", "m_ok[:, None] & v_ok[None, :]")
    if any(n.op == "attn_lse" for n in spec.nodes):
        # Each row's log-sum-exp of the scores, for the gradient (ops/attention.py `attn_lse`):
        # -inf for a row with no weight; written by the programs of the first block of v's columns.
        w.line('lse = tl.where(l_i > 0, m_i + tl.log(l_i), float("-inf"))')
        e.store(1, "bid * M + rm", "lse", "m_ok & (pid_v == 0)")
    return e.finish({"BLOCK_M": cfg["BLOCK_M"], "BLOCK_N": cfg["BLOCK_N"], "BLOCK_D": cfg["BLOCK_D"],
                     "BLOCK_DV": cfg["BLOCK_DV"]})

