"""The matmul template: a tiled Triton GEMM over batch dims with an element-wise epilogue.

Config knobs besides the tile (`BLOCK_M/N/K`, `GROUP_M`, warps, stages), each 0 when absent:
- `TMA`: A and B tiles through tensor descriptors (Hopper's bulk copy engine, built on the device
  in Triton's global scratch; out-of-bounds reads come back as zeros, so no wrapped indices and no
  K mask). An operand stored transposed (B as an `nn.Linear` weight [N, K], A^T in a backward
  pass) is read [N, K] and transposed in registers. Taken only where the variant guarantees what a
  descriptor needs: 16-byte aligned pointers and strides, int32 sizes and a unit stride along one
  dim; otherwise the pointer path is emitted.
- `PROGRAMS`: a persistent kernel: that many programs (the target's SM count; the launch grid is
  the smaller of it and the tiles) walk the tiles in one flattened loop, letting Triton overlap a
  tile's epilogue with the next one's loads. 0 = one program a tile.
Where B is stored [N, K], the search space pairs every 16-bit tile config with a persistent TMA
twin (`templates/matmul.py`): on an H200 it ran an `nn.Linear` 4096x3072x2048 12% faster than the
pointer kernel (0.0768 ms, cuBLAS 0.0720) and GPT-2's 50257-wide tied LM head 10% faster, while
with B stored [K, N] the pointer kernel stayed ahead (docs/codegen.md); measurement picks per job.
- `SUBTILES`: the epilogue runs over that many column slices of the tile, one after another
  (the accumulator halved with `tl.split`), so a long epilogue's temporaries are live for one
  slice at a time; the space sets it for heavy epilogues only (`templates/matmul.py`).
- `TF32X3` (float32 operands): three TF32 tensor-core products (hi*hi + hi*lo + lo*hi) instead of
  exact-product FMA. The tuner admits it only where its error is no worse than float32's own
  (see tuner.py's correctness gate).
Integer operands accumulate in int64 (the low bits of the exact sum: what wrapping fixed-width
arithmetic gives) over an outer-product loop: there is no integer tensor-core path for them.
"""

from __future__ import annotations

from .emitter import TL, Emitted, Emitter

INTS = {"int8", "int16", "int32", "int64", "uint8"}


def matmul(e: Emitter) -> Emitted:
    spec, w, v, cfg = e.spec, e.w, e.variant, e.config
    e.pointer_params()
    rank = spec.rank
    nb = rank - 2
    ja, jb = spec.matmul
    a_dt = spec.operands[ja][0]
    if a_dt not in ("bfloat16", "float16", "float32", "float64") and a_dt not in INTS:
        raise NotImplementedError(f"no GPU matmul for {a_dt} operands")
    for name in ("M", "N", "K"):
        e.int_param(name, hint16=name != "M")
    sam, sak = e.stride(ja, nb), e.stride(ja, nb + 1)
    sbk, sbn = e.stride(jb, nb), e.stride(jb, nb + 1)
    integer = a_dt in INTS
    tma = _tma_layout(e, cfg, a_dt, (sam, sak), (sbk, sbn))
    persistent = cfg.get("PROGRAMS", 0) > 0

    w.line("num_pid_m = tl.cdiv(M, BLOCK_M)")
    w.line("num_pid_n = tl.cdiv(N, BLOCK_N)")
    w.line("group = GROUP_M * num_pid_n")
    if persistent:
        e.int_param("batch")
        w.line("tiles = num_pid_m * num_pid_n")
        if tma and nb == 0:
            _descriptors(e, ja, jb, tma, (sam, sak), (sbk, sbn), "0", "0")
        # Check mode inside the flattened loop: per-row sums carried across tiles (`Emitter.store`),
        # the flag raised once at the end; a check per tile (a block reduction and a predicated
        # store) cost the LM head 13-30% on an H200, a second copy of the loop its shared memory.
        e.check_mode = "carry"
        top = len(w.lines)
        w.line("for t in tl.range(tl.program_id(0), tiles * batch, tl.num_programs(0), flatten=True):")
        w.indent += 1
        w.line(f"bid = (t // tiles).to({e.idx})")
        w.line("pid = t % tiles")
        _tile(e, nb, tma, integer, a_dt, (sam, sak), (sbk, sbn))
        w.indent -= 1
        e.check_mode = "branch"
        for z, i in dict.fromkeys(e.carried):      # (one sum per output, however many slices)
            w.lines.insert(top, "    " * w.indent + f"{z} = tl.zeros((BLOCK_M,), dtype=tl.float32)")
            top += 1
            w.line(f"tl.store(flags, 1, mask=(tl.sum({z}) != tl.sum({z})) & (((checks >> {i}) & 1) != 0))")
    else:
        w.line("pid = tl.program_id(0)")
        w.line(f"bid = tl.program_id(1).to({e.idx})")
        _tile(e, nb, tma, integer, a_dt, (sam, sak), (sbk, sbn))
    constexprs = {"BLOCK_M": cfg["BLOCK_M"], "BLOCK_N": cfg["BLOCK_N"], "BLOCK_K": cfg["BLOCK_K"],
                  "GROUP_M": cfg["GROUP_M"]}
    return e.finish(constexprs)


def _tile(e: Emitter, nb: int, tma: tuple[bool, bool] | None, integer: bool, a_dt: str,
          a_strides: tuple[str, str], b_strides: tuple[str, str]) -> None:
    """One output tile, `pid` (and `bid`, the batch) given: its product and epilogue."""
    spec, w, v, cfg = e.spec, e.w, e.variant, e.config
    ja, jb = spec.matmul
    (sam, sak), (sbk, sbn) = a_strides, b_strides
    persistent = cfg.get("PROGRAMS", 0) > 0
    w.line("first_m = (pid // group) * GROUP_M")
    w.line("size_m = tl.minimum(num_pid_m - first_m, GROUP_M)")
    w.line("pid_m = first_m + ((pid % group) % size_m)")
    w.line("pid_n = (pid % group) // size_m")
    w.line(f"rm = pid_m.to({e.idx}) * BLOCK_M + tl.arange(0, BLOCK_M)")
    w.line(f"rn = pid_n.to({e.idx}) * BLOCK_N + tl.arange(0, BLOCK_N)")
    e.unravel("bid", 0, nb, "bi")           # batch indices

    def batch_offset(j: int) -> str:
        return e.dot((f"bi{d}", e.stride(j, d)) for d in range(nb)) or "0"

    acc_dt = "tl.int64" if integer else ("tl.float64" if a_dt == "float64" else "tl.float32")
    w.line(f"acc = tl.zeros((BLOCK_M, BLOCK_N), dtype={acc_dt})")
    if tma:
        if nb or not persistent:
            _descriptors(e, ja, jb, tma, (sam, sak), (sbk, sbn), batch_offset(ja), batch_offset(jb))
        w.line("for kk in range(0, tl.cdiv(K, BLOCK_K)):")
        w.indent += 1
        a_rows, b_rows = tma
        w.line("a = a_desc.load([pid_m * BLOCK_M, kk * BLOCK_K])" if a_rows else
               "a = a_desc.load([kk * BLOCK_K, pid_m * BLOCK_M]).T")
        w.line("b = b_desc.load([kk * BLOCK_K, pid_n * BLOCK_N])" if b_rows else
               "b = b_desc.load([pid_n * BLOCK_N, kk * BLOCK_K]).T")
        _dot(w, a_dt, cfg)
        w.indent -= 1
    elif integer:
        # One outer product per k: rank-1 updates in int64.
        w.line("am = rm % M")
        w.line("bn = rn % N")
        w.line(f"a_ptrs = p{ja} + {batch_offset(ja)} + am * {sam}")
        w.line(f"b_ptrs = p{jb} + {batch_offset(jb)} + bn * {sbn}")
        w.line("for kk in range(0, K):")
        w.indent += 1
        w.line(f"a = tl.load(a_ptrs + kk * {sak}).to(tl.int64)")
        w.line(f"b = tl.load(b_ptrs + kk * {sbk}).to(tl.int64)")
        w.line("acc += a[:, None] * b[None, :]")
        w.indent -= 1
    else:
        # Wrapped indices keep every load in bounds without masks on M and N (rows past the end
        # read valid memory and are never stored).
        w.line("am = tl.max_contiguous(tl.multiple_of(rm % M, BLOCK_M), BLOCK_M)")
        w.line("bn = tl.max_contiguous(tl.multiple_of(rn % N, BLOCK_N), BLOCK_N)")
        w.line("rk = tl.arange(0, BLOCK_K)")
        w.line(f"a_ptrs = p{ja} + {batch_offset(ja)} + am[:, None] * {sam} + rk[None, :] * {sak}")
        w.line(f"b_ptrs = p{jb} + {batch_offset(jb)} + rk[:, None] * {sbk} + bn[None, :] * {sbn}")
        w.line("for kk in range(0, tl.cdiv(K, BLOCK_K)):")
        w.indent += 1
        if v.even_k:
            w.line("a = tl.load(a_ptrs)")
            w.line("b = tl.load(b_ptrs)")
        else:
            w.line("kmask = rk < K - kk * BLOCK_K")
            w.line("a = tl.load(a_ptrs, mask=kmask[None, :], other=0)")
            w.line("b = tl.load(b_ptrs, mask=kmask[:, None], other=0)")
        _dot(w, a_dt, cfg)
        w.line(f"a_ptrs += BLOCK_K * {sak}")
        w.line(f"b_ptrs += BLOCK_K * {sbk}")
        w.indent -= 1
    _epilogue(e, nb, batch_offset)


def _tma_layout(e: Emitter, cfg: dict, a_dt: str, a_strides: tuple[str, str], b_strides: tuple[str, str]
                ) -> tuple[bool, bool] | None:
    """Whether A and B are read through tensor descriptors, as (A stored [M, K], B stored [K, N]):
    False for an operand stored transposed (an `nn.Linear` weight is B stored [N, K]), whose tile
    is loaded that way and transposed in registers. None (pointers) unless the config asks for TMA
    and the variant guarantees what a descriptor needs: a 16-byte aligned base, int32 sizes, one
    unit stride and the other a multiple of 16 bytes (a baked stride is checked here, a run-time
    one must be hinted: the aligned variant hints it unless the tuning shape's was not)."""
    v = e.variant
    if not cfg.get("TMA", 0) or not v.aligned or v.wide or a_dt not in ("bfloat16", "float16", "float32"):
        return None
    size = {"bfloat16": 2, "float16": 2, "float32": 4}[a_dt]

    def aligned(stride: str) -> bool:
        if stride.isdigit():
            return int(stride) > 0 and int(stride) * size % 16 == 0
        return v.hinted(stride)

    def rows_of(outer: str, inner: str) -> bool | None:
        """True: stored with the second dim contiguous; False: with the first; None: neither."""
        if inner == "1" and aligned(outer):
            return True
        if outer == "1" and aligned(inner):
            return False
        return None

    a_rows, b_rows = rows_of(*a_strides), rows_of(*b_strides)
    return None if a_rows is None or b_rows is None else (a_rows, b_rows)


def _descriptors(e: Emitter, ja: int, jb: int, tma: tuple[bool, bool], a_strides: tuple[str, str],
                 b_strides: tuple[str, str], a_off: str, b_off: str) -> None:
    (sam, sak), (sbk, sbn) = a_strides, b_strides
    a_rows, b_rows = tma
    e.w.line(f"a_desc = tl.make_tensor_descriptor(p{ja} + {a_off}, " + (
        f"shape=[M, K], strides=[{sam}, 1], block_shape=[BLOCK_M, BLOCK_K])" if a_rows else
        f"shape=[K, M], strides=[{sak}, 1], block_shape=[BLOCK_K, BLOCK_M])"))
    e.w.line(f"b_desc = tl.make_tensor_descriptor(p{jb} + {b_off}, " + (
        f"shape=[K, N], strides=[{sbk}, 1], block_shape=[BLOCK_K, BLOCK_N])" if b_rows else
        f"shape=[N, K], strides=[{sbn}, 1], block_shape=[BLOCK_N, BLOCK_K])"))


def _dot(w, a_dt: str, cfg: dict) -> None:
    if a_dt == "float32":
        precision = "tf32x3" if cfg.get("TF32X3", 0) else "ieee"
        w.line(f'acc = tl.dot(a, b, acc, input_precision="{precision}")')
    elif a_dt == "float64":      # no fp64 tensor-core path in Triton: FMA over a broadcast product
        w.line("acc += tl.sum(a[:, :, None] * b[None, :, :], axis=1)")
    else:
        w.line("acc = tl.dot(a, b, acc)")


def _epilogue(e: Emitter, nb: int, batch_offset) -> None:
    """The tile's element-wise epilogue and stores; with `SUBTILES` > 1, once per column slice of
    the accumulator (split in halves, `tl.split`), so that a long epilogue's temporaries are live
    for one slice at a time: GELU's backward over a 128x128 fp32 tile spilled 2 KB a thread on
    sm_90 whole."""
    w, cfg = e.w, e.config
    parts = cfg.get("SUBTILES", 0) or 1
    if parts == 1:
        w.line("mask = (rm[:, None] < M) & (rn[None, :] < N)")
        _epilogue_part(e, nb, batch_offset, "acc", "rn", "mask")
        return
    names, width = ["acc"], cfg["BLOCK_N"]
    while len(names) < parts:
        halves = []
        for name in names:
            w.line(f"{name}0, {name}1 = tl.split(tl.permute(tl.reshape({name}, (BLOCK_M, 2, {width // 2})), (0, 2, 1)))")
            halves += [f"{name}0", f"{name}1"]
        names, width = halves, width // 2
    for h, name in enumerate(names):
        w.line(f"rn_{h} = pid_n.to({e.idx}) * BLOCK_N + {h * width} + tl.arange(0, {width})")
        w.line(f"mask_{h} = (rm[:, None] < M) & (rn_{h}[None, :] < N)")
        _epilogue_part(e, nb, batch_offset, name, f"rn_{h}", f"mask_{h}")


def _epilogue_part(e: Emitter, nb: int, batch_offset, acc: str, rn: str, mask: str) -> None:
    """The epilogue over the columns `rn` of the tile, their product `acc`, stores masked by `mask`."""
    spec, w = e.spec, e.w
    loaded: dict[int, str] = {}

    def load(j: int) -> str:
        if j not in loaded:
            t = w.tmp("x")
            level = spec.operands[j][1]
            if level == "scalar":
                w.line(f"{t} = {e.load(j, '0', None)}")
            elif e.layout(j) == "dense":
                w.line(f"{t} = {e.load(j, f'bid * M * N + rm[:, None] * N + {rn}[None, :]', mask)}")
            else:
                sm, sn = e.stride(j, nb), e.stride(j, nb + 1)
                base = batch_offset(j)
                if sm == "0" and sn == "0":
                    w.line(f"{t} = {e.load(j, base, None)}")
                elif sm == "0":       # a row vector (bias): one load along N, broadcast down the tile
                    w.line(f"{t} = {e.load(j, f'{base} + {rn} * {sn}', f'{rn} < N')}[None, :]")
                elif sn == "0":       # a column vector
                    w.line(f"{t} = {e.load(j, f'{base} + rm * {sm}', 'rm < M')}[:, None]")
                else:
                    w.line(f"{t} = {e.load(j, f'{base} + rm[:, None] * {sm} + {rn}[None, :] * {sn}', mask)}")
            loaded[j] = t
        return loaded[j]

    vals: dict[int, str] = {}
    for k, n in enumerate(spec.nodes):
        if n.op == "matmul":
            # The product rounds to its dtype before any epilogue reads it, as on the CPU.
            if n.dtype in ("bfloat16", "float16"):
                w.line(f"{acc} = {acc}.to({TL[n.dtype]}).to(tl.float32)")
            elif n.dtype in INTS and n.dtype != "int64":
                w.line(f"{acc} = {acc}.to({TL[n.dtype]})")
            vals[k] = acc
            continue
        t = w.tmp("v")
        w.line(f"{t} = {e.op(n, [e.arg(a, vals, load) for a in n.args])}")
        vals[k] = t
    for i, k in enumerate(spec.outputs):
        e.store(i, f"bid * M * N + rm[:, None] * N + {rn}[None, :]", vals[k], mask)
