"""The scatter template: `scatter_add(idx, src, rows=M)` (ops/structural.py) as one Triton kernel.

Each program owns a [BLOCK_M, BLOCK_N] tile of the table, rows m0..m0+BLOCK_M, and walks the
indices in blocks of BLOCK_K in order. A block holding no index of its rows is skipped after one
load of BLOCK_K indices; otherwise the block's one-hot tile is built in registers,
`(idx[k] - m0 == r)`, and multiplied into the tile's accumulator with src's [BLOCK_K, BLOCK_N]
block: a product whose every term is 0 or a src value, so the sum is exact up to the float32
accumulator (float64 for float64 rows) and rounds once when stored. Every table row is written by
one program, which sums its rows' contributions in a fixed order: the result is bit-identical run
to run, with no atomics. An index outside [0, M) adds nothing.

With V table rows, N indices spread over them and BLOCK_M rows a program, a block of BLOCK_K
indices holds one of the program's rows with probability 1 - (1 - BLOCK_M / V)^BLOCK_K: for GPT-2's
embedding (V = 50257, 8192 tokens) 10 to 30%, so most of the one-hot product is never computed.
"""

from __future__ import annotations

from .emitter import TL, Emitted, Emitter
from .spec import FLOAT


def scatter(e: Emitter) -> Emitted:
    spec, w, cfg = e.spec, e.w, e.config
    e.pointer_params()
    src_dt = spec.operands[1][0]
    if src_dt not in FLOAT:
        raise NotImplementedError(f"no GPU scatter_add of {src_dt} rows")
    e.int_param("M")
    e.int_param("N", hint16=True)
    e.int_param("K")
    s_idx = e.stride(0, 0)
    s_row, s_col = e.stride(1, 0), e.stride(1, 1)
    acc_dt = "tl.float64" if src_dt == "float64" else "tl.float32"
    w.line("pid = tl.program_id(0)")
    w.line("num_pid_n = tl.cdiv(N, BLOCK_N)")
    w.line("pid_m = pid // num_pid_n")
    w.line("pid_n = pid % num_pid_n")
    w.line(f"m0 = pid_m.to({e.idx}) * BLOCK_M")
    w.line("rm = tl.arange(0, BLOCK_M)")
    w.line(f"rn = pid_n.to({e.idx}) * BLOCK_N + tl.arange(0, BLOCK_N)")
    w.line("rn_ok = rn < N")
    w.line("rk = tl.arange(0, BLOCK_K)")
    w.line(f"acc = tl.zeros((BLOCK_M, BLOCK_N), dtype={acc_dt})")
    w.line("for kk in range(0, tl.cdiv(K, BLOCK_K)):")
    w.indent += 1
    w.line(f"ks = (kk * BLOCK_K + rk).to({e.idx})")
    w.line("k_ok = ks < K")
    w.line(f"t = tl.load(p0 + ks * {s_idx}, mask=k_ok, other=-1)")
    # The index's row within this program's tile, or -1: compared in the index's own dtype first,
    # so a 64-bit index past the table never wraps into it.
    w.line("rel = tl.where((t >= m0) & (t < m0 + BLOCK_M) & (t < M), t - m0, -1).to(tl.int32)")
    w.line("if tl.max(rel, axis=0) >= 0:")
    w.indent += 1
    # (A select, not a cast of the comparison: Triton's interpreter casts booleans to bf16 as 0.)
    w.line(f"a = tl.where(rm[:, None] == rel[None, :], 1.0, 0.0).to({TL[src_dt]})")
    w.line(f"b = tl.load(p1 + ks[:, None] * {s_row} + rn[None, :] * {s_col}, "
           "mask=k_ok[:, None] & rn_ok[None, :], other=0)")
    if src_dt == "float32":
        w.line('acc = tl.dot(a, b, acc, input_precision="ieee")')
    elif src_dt == "float64":
        w.line("acc = tl.dot(a, b, acc, out_dtype=tl.float64)")
    else:
        w.line("acc = tl.dot(a, b, acc)")
    w.indent -= 2
    w.line("rows = m0 + rm")
    w.line("mask = (rows[:, None] < M) & rn_ok[None, :]")
    e.store(0, "rows[:, None] * N + rn[None, :]", "acc", "mask")
    return e.finish({"BLOCK_M": cfg["BLOCK_M"], "BLOCK_N": cfg["BLOCK_N"], "BLOCK_K": cfg["BLOCK_K"]})
