"""The flash kernels: attention's backward ops (ops/attention.py) as Triton, each recomputing its
score blocks from q and kT in registers; nothing of size [T, S] is read or written.

- `attn_lse`: one program per block of BLOCK_M query rows walks the key blocks (up to the diagonal
  when causal) with an online max and sum, and writes each row's log-sum-exp. Keys past the last
  block visited score `fill` in every row of the program and join the sum in closed form (a
  finite fill; -inf adds nothing), as the forward attention kernel does.
- `attn_grad` of q: one program per query block walks the key blocks up to the diagonal:
  p = exp(t - lse), dp = dO @ v^T, ds = p * (dp - delta) where the score was kept, times scale,
  rounded to q's dtype; dq += ds @ k.
- `attn_grad` of k and of v: one program per block of BLOCK_N keys walks the query blocks from the
  diagonal down: dk += ds^T @ q, dv += p^T @ dO (p rounded to v's dtype). The two of one
  attention are one kernel ("kv"): each block's scores and probabilities computed once for both. The query rows above
  the diagonal see these keys masked: they add nothing to dk, and to dv only their fill's weight
  exp(fill - lse) (0 unless the fill is close to the row's scores: computed, then added only if
  some row's is not 0). Where the three gradients are placed into one tensor (a fused qkv
  projection's, [B, T, 3, H, DH]: placement.py `placed_grads`), this kernel writes that tensor:
  dk and dv through their slots' strides, and its key block's rows of dq, which dq's kernel wrote
  before it, copied into dq's slot. An element-wise kernel reading the three and writing the
  tensor (75 MB a layer in GPT-2 small's step, 21.7 us on an H200) is gone.

With float32 scores, probabilities are taken in base 2: the scale times log2(e) folded into the
scores (one FMA a score: `t = s * scale2`, the fill scaled alike), lse times log2(e) as loaded, then
`exp2(t - lse)`. On an H200 for GPT-2 small's step (12 causal attentions of 8 x 12 heads, T 1024,
D 64) dk+dv went 1.70 -> 1.45 ms and dq 0.90 -> 0.75 ms.

Scores stay float32, unrounded, as the forward attention kernel keeps them. Other products take
the operands' dtype with float32 accumulators (exact "ieee" products for float32, as the matmul
template); every program works on whole heads (D, DV <= BLOCK_D, BLOCK_DV).
"""

from __future__ import annotations

from .emitter import TL, Emitted, Emitter, literal
from .spec import KernelSpec
from .triton_attention import LOG2E


def role(spec: KernelSpec) -> str:
    """"lse", or which operands' gradients the kernel makes: "q", "k", "v" or "kv" (both)."""
    n = spec.nodes[0]
    return "lse" if n.op == "attn_lse" else "".join(dict(m.attrs)["wrt"] for m in spec.nodes
                                                    if m.op == "attn_grad")


def _dot(a: str, b: str, acc: str | None, dtype: str) -> str:
    extra = {"float32": ', input_precision="ieee"', "float64": ", out_dtype=tl.float64"}.get(dtype, "")
    return f"tl.dot({a}, {b}{', ' + acc if acc else ''}{extra})"


def flash(e: Emitter) -> Emitted:
    spec, w, cfg = e.spec, e.w, e.config
    e.pointer_params()
    node = spec.nodes[0]
    what = role(spec)
    attrs = dict(node.attrs)
    causal = bool(attrs.get("causal", False))
    fill = attrs.get("fill")
    nb = spec.rank - 2
    qdt = spec.operands[0][0]
    if qdt not in ("bfloat16", "float16", "float32", "float64"):
        raise NotImplementedError(f"no GPU attention backward for {qdt} operands")
    scale_arg = node.args[-1]
    ct = "float64" if (scale_arg[2] if scale_arg[0] == "c" else spec.operands[scale_arg[1]][0]) == "float64" \
        else "float32"
    CT = TL[ct]
    AT = "tl.float64" if qdt == "float64" else "tl.float32"     # the products' accumulators
    e.int_param("M")
    for name in ("N", "K", "DV"):
        e.int_param(name, hint16=True)

    def offset(j: int, rest: str = "") -> str:
        return " + ".join(x for x in (e.dot((f"bi{d}", e.stride(j, d)) for d in range(nb)), rest) if x) or "0"

    def rows_block(var: str, start: str, block: str, limit: str, interior: bool = False) -> None:
        """`var`: a block's indices from `start`; `var`_ok their bounds mask (none for an interior
        block, wholly in bounds)."""
        w.line(f"{var} = {start} + tl.arange(0, {block})")
        if not interior:
            w.line(f"{var}_ok = {var} < {limit}")

    w.line("pid = tl.program_id(0)")
    w.line(f"bid = tl.program_id(1).to({e.idx})")
    e.unravel("bid", 0, nb, "bi")
    if scale_arg[0] == "c":
        w.line(f"scale = {literal(scale_arg[1], ct)}")
    else:
        w.line(f"scale = tl.load(p{scale_arg[1]} + 0).to({CT})")
    w.line(f"q_base = p0 + {offset(0)}")
    w.line(f"k_base = p1 + {offset(1)}")
    sqm, sqd = e.stride(0, nb), e.stride(0, nb + 1)
    skd, skn = e.stride(1, nb), e.stride(1, nb + 1)
    w.line("rd = tl.arange(0, BLOCK_D)")
    w.line("rd_ok = rd < K")
    # dq computing its rows' delta itself (templates/flash.py): operand 5 is o, and the delta's
    # dtype is the `sum` output's, or o's compute dtype when nothing else reads the delta.
    own_delta = next((m.dtype for m in spec.nodes if m.op == "sum"), None) if ("delta", "o") in node.attrs else None
    if what != "lse":
        for j, name in ((2, "v"), (3, "o"), (4, "l"), (5, "x")):
            w.line(f"{name}_base = p{j} + {offset(j)}")
        svn, svd = e.stride(2, nb), e.stride(2, nb + 1)
        som, sod = e.stride(3, nb), e.stride(3, nb + 1)
        slm, sxm = e.stride(4, nb), e.stride(5, nb)
        w.line("rv = tl.arange(0, BLOCK_DV)")
        w.line("rv_ok = rv < DV")
        vdt = spec.operands[2][0]
    fill_lit = literal(fill, ct) if causal else None
    # Probabilities in base 2 (float32): p = exp2(s * scale * log2(e) - lse * log2(e)), one FMA
    # and an exp2 a score; scores and the fill are kept in those units, lse scaled as loaded.
    base2 = ct == "float32" and what != "lse"
    if base2:
        w.line(f"scale2 = scale * {LOG2E!r}")
        fill2 = literal(float(fill) * LOG2E, ct) if causal and fill is not None else fill_lit
    finite_fill = causal and fill is not None and float(fill) != float("-inf")

    exp = "tl.exp2" if base2 else "tl.exp"

    def tile(var: str, base: str, r: str, c: str, sr: str, sc: str, inside: str = "") -> None:
        """`var` = the [r, c] tile at `base` (strides sr, sc), masked by `r_ok` and `c_ok` (only
        the head dim's when `inside` names the dim known to be in bounds)."""
        mask = " & ".join(f"{x}_ok{ix}" for x, ix in ((r, "[:, None]"), (c, "[None, :]")) if x != inside)
        w.line(f"{var} = tl.load({base} + {r}[:, None] * {sr} + {c}[None, :] * {sc}, mask={mask}, other=0)")

    def load_q(rows: str, inside: bool = False) -> None:
        tile("q", "q_base", rows, "rd", sqm, sqd, rows if inside else "")

    def load_kt(cols: str, inside: bool = False) -> None:
        tile("kt", "k_base", "rd", cols, skd, skn, cols if inside else "")

    def load_vt(cols: str, inside: bool = False) -> None:
        tile("vt", "v_base", "rv", cols, svd, svn, cols if inside else "")

    def load_do(rows: str, inside: bool = False) -> None:
        tile("do", "o_base", rows, "rv", som, sod, rows if inside else "")

    def row_stats(rows: str, delta: bool, inside: bool = False, natural: bool = False) -> None:
        """lse (times log2(e) in base 2, unless `natural`) and delta of the rows."""
        mask = "" if inside else f", mask={rows}_ok, other=0"
        units = f" * {LOG2E!r}" if base2 and not natural else ""
        w.line(f"lse = tl.load(l_base + {rows} * {slm}{mask}).to({CT}){units}")
        if delta:
            w.line(f"delta = tl.load(x_base + {rows} * {sxm}{mask}).to({CT})")

    def scores(rows: str, cols: str, mask_fill: bool, interior: bool = False) -> None:
        """t: the block's scores (module doc), the causal mask applied with its fill if asked (an
        interior block, every key at or before every query, has none)."""
        w.line(f"s = {_dot('q', 'kt', None, qdt)}")
        # Unrounded float32 scores, as the forward attention kernel's (triton_attention.py).
        w.line(f"t = s.to({CT}) * {'scale2' if base2 else 'scale'}")
        if causal and not interior:
            w.line(f"keep = {cols}[None, :] <= {rows}[:, None]")
            if mask_fill:
                w.line(f"t = tl.where(keep, t, {fill2 if base2 else fill_lit})")

    def ds_block(rows: str, cols: str, interior: bool = False) -> None:
        """ds: the scores' gradient on the block, zero where masked or out of bounds, times scale,
        in q's dtype (an interior block: in bounds and unmasked, no `where`)."""
        w.line(f"dp = {_dot('do', 'vt', None, vdt)}")
        if interior:
            w.line(f"ds = p * (dp.to({CT}) - delta[:, None]) * scale")
        else:
            ok = f"{rows}_ok[:, None] & {cols}_ok[None, :]" + (" & keep" if causal else "")
            w.line(f"ds = tl.where({ok}, p * (dp.to({CT}) - delta[:, None]), 0.0) * scale")
        w.line(f"ds = ds.to({TL[qdt]})")

    if what in ("lse", "q"):
        w.line("num_m = tl.cdiv(M, BLOCK_M)")
        w.line("pid_m = num_m - 1 - pid          # the longest rows first" if causal else "pid_m = pid")
        rows_block("rm", f"pid_m.to({e.idx}) * BLOCK_M", "BLOCK_M", "M")
        load_q("rm")
        w.line("hi = " + ("tl.minimum(N, (pid_m + 1) * BLOCK_M)" if causal else "N"))
        if what == "lse":
            w.line(f'm_i = tl.full([BLOCK_M], float("-inf"), {CT})')
            w.line(f"l_i = tl.zeros([BLOCK_M], {CT})")
        elif own_delta:
            # delta = sum(dO * o) over each row, from the dO tile this program holds and o's
            # (in the delta's dtype, as its ops were), written for dk and dv when they read it.
            load_do("rm")
            row_stats("rm", False)
            tile("yo", "x_base", "rm", "rv", sxm, e.stride(5, nb + 1))
            DT = TL[own_delta]
            w.line(f"delta = tl.sum(do.to({DT}) * yo.to({DT}), axis=1)")
            if len(spec.outputs) > 1:
                e.store(1, "bid * M + rm", "delta", "rm_ok")
            w.line(f"delta = delta.to({CT})")
            w.line(f"acc = tl.zeros([BLOCK_M, BLOCK_D], {AT})")
        else:
            load_do("rm")
            row_stats("rm", True)
            w.line(f"acc = tl.zeros([BLOCK_M, BLOCK_D], {AT})")
        def q_block(interior: bool) -> None:
            rows_block("rn", "n0", "BLOCK_N", "N", interior)
            load_kt("rn", inside=interior)
            scores("rm", "rn", False, interior=interior)
            w.line(f"p = {exp}(t - lse[:, None])")
            load_vt("rn", inside=interior)
            ds_block("rm", "rn", interior=interior)
            w.line(f"acc = {_dot('ds', 'tl.trans(kt)', 'acc', qdt)}")

        if what == "q":
            # Key blocks wholly in bounds and (causal) at or before every row of this block need no
            # mask: [0, n_in) of them, when the rows themselves are in bounds; the rest are masked.
            w.line("n_all = N // BLOCK_N * BLOCK_N")
            diag = "(pid_m * BLOCK_M + 1) // BLOCK_N * BLOCK_N" if causal else "n_all"
            w.line(f"n_in = tl.where((pid_m + 1) * BLOCK_M <= M, tl.minimum({diag}, n_all), 0)")
            for start, stop, interior in (("0", "n_in", True), ("n_in", "hi", False)):
                w.line(f"for n0 in range({start}, {stop}, BLOCK_N):")
                w.indent += 1
                q_block(interior)
                w.indent -= 1
        else:
            w.line("for n0 in range(0, hi, BLOCK_N):")
            w.indent += 1
            rows_block("rn", "n0", "BLOCK_N", "N")
            load_kt("rn")
            scores("rm", "rn", True)
            w.line('t = tl.where(rn_ok[None, :], t, float("-inf"))')
            w.line("m_new = tl.maximum(m_i, tl.max(t, axis=1))")
            w.line('m_use = tl.where(m_new == float("-inf"), 0.0, m_new)')
            w.line("l_i = l_i * tl.exp(m_i - m_use) + tl.sum(tl.exp(t - m_use[:, None]), axis=1)")
            w.line("m_i = m_new")
            w.indent -= 1
        if what == "lse":
            if finite_fill:
                # The keys past the last block visited score the fill in every row here.
                w.line("end = tl.minimum(N, tl.cdiv(hi, BLOCK_N) * BLOCK_N)")
                w.line("n_skip = N - end")
                w.line(f"m_fin = tl.where(n_skip > 0, tl.maximum(m_i, {fill_lit}), m_i)")
                w.line('m_use = tl.where(m_fin == float("-inf"), 0.0, m_fin)')
                w.line(f"l_i = l_i * tl.exp(m_i - m_use) + tl.where(n_skip > 0, n_skip.to({CT}) * "
                       f"tl.exp({fill_lit} - m_use), 0.0)")
                w.line("m_i = m_fin")
            w.line('out = tl.where(l_i > 0, m_i + tl.log(l_i), float("-inf"))')
            e.store(0, "bid * M + rm", "out", "rm_ok")
        else:
            e.store(0, "bid * M * K + rm[:, None] * K + rd[None, :]", "acc", "rm_ok[:, None] & rd_ok[None, :]")
        return e.finish({"BLOCK_M": cfg["BLOCK_M"], "BLOCK_N": cfg["BLOCK_N"], "BLOCK_D": cfg["BLOCK_D"],
                         "BLOCK_DV": cfg["BLOCK_DV"]})

    # dk, dv (or both, "kv"): one program per key block, down the query blocks from the diagonal.
    # `acc` is dk's accumulator ([keys, D], the op's layout), `acc_v` dv's. (Computing the block's
    # scores transposed, k @ qT, so that p and ds are the products' left operands untransposed,
    # measured 8% slower on an H200: 0.158 against 0.146 ms for GPT-2 small's.)
    rows_block("rn", f"pid.to({e.idx}) * BLOCK_N", "BLOCK_N", "N")
    load_kt("rn")
    wants_k, wants_v = "k" in what, "v" in what
    if wants_k:
        load_vt("rn")
        w.line(f"acc = tl.zeros([BLOCK_N, BLOCK_D], {AT})")
    if wants_v:
        w.line(f"acc_v = tl.zeros([BLOCK_N, BLOCK_DV], {AT})")
    w.line("lo = " + ("tl.minimum(pid * BLOCK_N, M) // BLOCK_M * BLOCK_M" if causal else "0"))
    # Query blocks wholly in bounds and (causal) at or after every key of this block need no
    # mask: [m_in, m_out); those from lo before them (the diagonal's) and after (a partial last
    # block) are masked. A partial key block has no interior.
    w.line("m_all = M // BLOCK_M * BLOCK_M")
    first = "tl.cdiv(pid * BLOCK_N + BLOCK_N - 1, BLOCK_M) * BLOCK_M" if causal else "lo"
    w.line(f"m_in = tl.where(pid * BLOCK_N + BLOCK_N <= N, tl.minimum({first}, M), M)")
    w.line("m_out = tl.maximum(m_in, m_all)")

    def kv_block(interior: bool) -> None:
        rows_block("rm", "m0", "BLOCK_M", "M", interior)
        load_q("rm", inside=interior)
        scores("rm", "rn", True, interior=interior)
        row_stats("rm", wants_k, inside=interior)
        if interior:
            w.line(f"p = {exp}(t - lse[:, None])")
        else:
            w.line(f"p = tl.where(rm_ok[:, None] & rn_ok[None, :], {exp}(t - lse[:, None]), 0.0)")
        load_do("rm", inside=interior)
        if wants_v:
            w.line(f"acc_v = {_dot(f'tl.trans(p.to({TL[vdt]}))', 'do', 'acc_v', vdt)}")
        if wants_k:
            ds_block("rm", "rn", interior=interior)
            w.line(f"acc = {_dot('tl.trans(ds)', 'q', 'acc', qdt)}")

    for start, stop, interior in (("lo", "m_in", False), ("m_in", "m_out", True), ("m_out", "M", False)):
        w.line(f"for m0 in range({start}, {stop}, BLOCK_M):")
        w.indent += 1
        kv_block(interior)
        w.indent -= 1

    def masked_rows() -> None:
        """Opens a loop over the query blocks above the diagonal: `wt`, each row's weight."""
        w.line("for m0 in range(0, lo, BLOCK_M):")
        w.indent += 1
        rows_block("rm", "m0", "BLOCK_M", "M")
        row_stats("rm", False, natural=True)
        w.line(f"wt = tl.where(rm_ok, tl.exp({fill_lit} - lse), 0.0).to({TL[vdt]}).to({AT})")

    if wants_v and finite_fill:
        # Query rows above the diagonal block see every key here masked: weight exp(fill - lse),
        # the same for each key; added (as the forward's product reads it, rounded to v's dtype)
        # only when some row's is not 0.
        w.line(f"wmax = tl.max(tl.zeros([BLOCK_M], {AT}), axis=0)")
        masked_rows()
        w.line("wmax = tl.maximum(wmax, tl.max(wt, axis=0))")
        w.indent -= 1
        w.line("if wmax > 0:")
        w.indent += 1
        w.line(f"vsum = tl.zeros([BLOCK_DV], {AT})")
        masked_rows()
        load_do("rm")
        w.line(f"vsum += tl.sum(wt[:, None] * do.to({AT}), axis=0)")
        w.indent -= 1
        w.line("acc_v += vsum[None, :]")
        w.indent -= 1
    place = next((m for m in spec.nodes if m.op == "place"), None)
    if place is not None:
        # One output, the slots tensor (placement.py `slots_of`): dk and dv into their slots,
        # through the slots' strides (the head dim contiguous), and this key block's rows of dq,
        # which the kernel before this one made, copied into dq's (queries and keys are as long).
        sq, sk, sv = dict(place.attrs)["slots"]
        slot = e.int_param("SLOT", hint16=True)
        where = e.dot([(f"bi{d}", e.int_param(f"q0_s{d}", hint16=True)) for d in range(nb)]
                      + [("rn[:, None]", e.int_param(f"q0_s{nb}", hint16=True))])
        jq = place.args[2][1]
        w.line(f"dq_base = p{jq} + {offset(jq)}")
        tile("dq", "dq_base", "rn", "rd", e.stride(jq, nb), e.stride(jq, nb + 1))
        for value, index, cols in (("acc", sk, "rd"), ("acc_v", sv, "rv"), ("dq", sq, "rd")):
            e.store(0, f"{where} + {index} * {slot} + {cols}[None, :]", value, f"rn_ok[:, None] & {cols}_ok[None, :]")
        return e.finish({"BLOCK_M": cfg["BLOCK_M"], "BLOCK_N": cfg["BLOCK_N"], "BLOCK_D": cfg["BLOCK_D"],
                         "BLOCK_DV": cfg["BLOCK_DV"]})
    if wants_k:
        e.store(0, "bid * N * K + rn[:, None] * K + rd[None, :]", "acc", "rn_ok[:, None] & rd_ok[None, :]")
    if wants_v:
        e.store(1 if wants_k else 0, "bid * N * DV + rn[:, None] * DV + rv[None, :]", "acc_v",
                "rn_ok[:, None] & rv_ok[None, :]")
    return e.finish({"BLOCK_M": cfg["BLOCK_M"], "BLOCK_N": cfg["BLOCK_N"], "BLOCK_D": cfg["BLOCK_D"],
                     "BLOCK_DV": cfg["BLOCK_DV"]})
