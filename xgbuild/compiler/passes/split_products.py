"""Products of a long K whose output tiles leave SMs idle, in parts along K (split-K), summed in a
fixed order.

A weight's gradient in a training step is `x^T @ dy`: K is the batch's tokens (8192 in GPT-2
small's step), M and N the weight's dims. Its output is few tiles, each a long walk along K:
- A [768, 768] gradient is 36 tiles of 128x128: 36 of an H200's 132 SMs walk all of K while the
  rest idle. The product is split along K into S parts, a batched product of S x 36 tiles.
- A [3072, 768] one is 144 tiles: a wave and 12 tiles, and the second wave costs as much as the
  first (75 us on an H200; cuBLAS 55). The rows that fill whole waves stay one product (the top,
  [2816, 768] on 132 SMs) and only the tail's rows (256) are split along K: their 12 tiles become
  S x 12 short ones, run after the top.

The forms, for `A @ B` ([M, K] @ [K, N], 16-bit operands, static shapes):
- split: P = A' @ B', A' [S, M, K/S] and B' [S, K/S, N] views of A and B split along K, a batched
  product *widened* (`matmul` attr `widened`: float32 results, each part's accumulator kept,
  not rounded to the operands' dtype); then cast(P[0] + P[1] + ...), the parts added in order
  in float32 and rounded once, as the whole product rounds its accumulator: one element-wise
  kernel (views of P).
- tail (rows, or columns when the waves' tiles are whole columns): top = A[:cut] @ B, the whole
  product's rounding; P as above over A[cut:], its parts summed and cast (one element-wise kernel
  over the tail's [m - cut, n]); then unindex(top) + unindex(tail), each zero outside its rows, in
  one element-wise kernel of two reads (x + 0 is x: the two side by side, bit for bit). Adding
  the parts in the placing kernel instead (nine masked reads an element) took 14.9 us for
  [3072, 768], three times its bytes' time.
Every addition's order is fixed by the shapes (no atomics): a run gives the same bits every time;
the value differs from the whole product's by the float32 sums' rounding only.

The form is chosen by a wave model over the Program's GPU profile (`plan`): tiles of 128x128
(what large products take) in waves over the SMs, each wave K (or K/S) steps at the chip's bf16
rate per SM, plus the float32 parts written and read back, the top read and the output written
again, and a launch per extra kernel. A form is taken only when the model gives it MIN_GAIN over
the product whole: the tiles the tuner picks (and programs sharing an SM) blur the waves, so a
close call stays one product. A part's K is a whole number of 64-wide k-steps, at least 512.

Measured on an H200 (`transpose(X) @ DY`, K = 8192, through `xg.run_engine`, GPU time): 768x768
28.1 us whole, 26.0 split in 2 (cuBLAS 26.6); 3072x768 split whole along K in 2 or 4 was slower
(75.3 -> 80.2, 81.4 us): the waves, not K, were what to split.

Programs of one GPU only: on several, the operands are laid out over the GPUs (a data-parallel
weight gradient's K is the sharded batch) and a view splitting K has no layout rule.

Needs: a verified graph; runs after autodiff (the products it splits are gradients' too) and
before `fork-casts`. Leaves: the product's value at its node id (a cast, or the tail form's add).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from xgbuild.hw import GpuProfile

from ..ir.graph import Node, Op, Program, attrs_of

DTYPES = ("bfloat16", "float16")
TILE = 128                  # the output tile the wave model assumes (M and N)
K_STEP = 64                 # a part's K is a whole number of these
MIN_PART_K = 512            # no part shorter than this: its tile would be mostly prologue
PARTS = (2, 4, 8, 16)
MIN_GAIN = 1.15             # the model's time whole over its time split, at least
LAUNCH_S = 3e-6             # one more kernel, with its ramp up and down
PARTIAL_BYTES = 4           # a float32 partial product
MAX_TAIL = 0.5              # a tail of more than this fraction of a wave is left whole
ALL = ("s", None, None, None)


@dataclass(frozen=True)
class Plan:
    parts: int = 1          # K in this many parts (1: the product whole)
    axis: int = -1          # the tail's axis (0 rows, 1 columns), -1: split whole
    cut: int = 0            # where the tail starts along `axis`


def _rate(hw: GpuProfile) -> float:
    """bf16 FLOP/s of one SM."""
    measured = hw.measured.bf16_matmul_flops_per_s
    return (measured if measured else hw.peak_flops.bf16) / hw.sm_count


def _waves_s(tiles: int, k: int, hw: GpuProfile) -> float:
    return math.ceil(tiles / hw.sm_count) * 2.0 * TILE * TILE * k / _rate(hw)


def seconds(m: int, n: int, k: int, plan: Plan, hw: GpuProfile) -> float:
    """The wave model's time of an [m, k] @ [k, n] 16-bit product made as `plan` says."""
    mt, nt = math.ceil(m / TILE), math.ceil(n / TILE)
    if plan.parts == 1:
        return _waves_s(mt * nt, k, hw)
    part = k // plan.parts
    if plan.axis < 0:
        # The parts written, then read back and summed, and the sum written (the whole
        # product's own 16-bit write is in either form: left out of both).
        moved = (2 * plan.parts + 1) * m * n * PARTIAL_BYTES
        return _waves_s(mt * nt * plan.parts, part, hw) + moved / hw.hbm_bandwidth_bytes_per_s + LAUNCH_S
    size, other = (m, n) if plan.axis == 0 else (n, m)
    top_tiles = plan.cut // TILE * math.ceil(other / TILE)
    tail_tiles = math.ceil((size - plan.cut) / TILE) * math.ceil(other / TILE)
    tail = (size - plan.cut) * other
    # The parts written and read, the top read again and the whole output written again.
    moved = 2 * plan.parts * tail * PARTIAL_BYTES + plan.cut * other * 2 + m * n * 2
    return (_waves_s(top_tiles, k, hw) + _waves_s(tail_tiles * plan.parts, part, hw)
            + moved / hw.hbm_bandwidth_bytes_per_s + 2 * LAUNCH_S)


def _parts(k: int) -> list[int]:
    return [s for s in PARTS if not k % (s * K_STEP) and k // s >= MIN_PART_K]


def plans(m: int, n: int, k: int, hw: GpuProfile) -> list[Plan]:
    """The forms worth modelling: whole; split whole in each part count; and where whole waves
    leave a short tail, the tail split so its tiles fill at most one wave."""
    out = [Plan()] + [Plan(s) for s in _parts(k)]
    mt, nt = math.ceil(m / TILE), math.ceil(n / TILE)
    full, tail = divmod(mt * nt, hw.sm_count)
    if full and 0 < tail <= MAX_TAIL * hw.sm_count:
        for axis, (size, across) in enumerate(((m, nt), (n, mt))):
            cut = full * hw.sm_count // across * TILE       # whole tiles of the axis in the waves
            if 0 < cut < size:
                tail_tiles = math.ceil((size - cut) / TILE) * across
                out += [Plan(s, axis, cut) for s in _parts(k) if tail_tiles * s <= hw.sm_count]
    return out


def plan(m: int, n: int, k: int, hw: GpuProfile) -> Plan:
    """The form to make the product in: the whole product unless another is worth MIN_GAIN."""
    whole = seconds(m, n, k, Plan(), hw)
    best = min(plans(m, n, k, hw), key=lambda p: (seconds(m, n, k, p, hw), p.parts))
    return best if whole >= MIN_GAIN * seconds(m, n, k, best, hw) else Plan()


def _static(shape) -> bool:
    return all(isinstance(s, int) for s in shape)


class _Builder:
    """Appends nodes with fresh ids to `out`."""

    def __init__(self, out: list[Node], next_id: int, src) -> None:
        self.out, self.next_id, self.src = out, next_id, src

    def add(self, op: Op, inputs: tuple, dtype: str, shape: tuple, attrs=()) -> int:
        self.out.append(Node(self.next_id, op, inputs, dtype, tuple(shape), attrs, self.src))
        self.next_id += 1
        return self.next_id - 1

    def index(self, x: int, dtype: str, shape: tuple, items: tuple) -> int:
        return self.add(Op.INDEX, (x,), dtype, shape, attrs_of(items=items))


def _a_parts(b: _Builder, a: Node, by_id, parts: int, lo: int, hi: int) -> int:
    """A's rows lo:hi in `parts` along K: [parts, hi - lo, K / parts], a view."""
    m, k = a.shape
    part, rows = k // parts, hi - lo
    if a.op is Op.TRANSPOSE and len(by_id[a.inputs[0]].shape) == 2:     # x^T: x [K, M] split by rows
        x = by_id[a.inputs[0]]
        v = b.add(Op.RESHAPE, (x.id,), x.dtype, (parts, part, m))
        if rows != m:
            v = b.index(v, x.dtype, (parts, part, rows), (ALL, ALL, ("s", lo, hi, None)))
        return b.add(Op.TRANSPOSE, (v,), x.dtype, (parts, rows, part), attrs_of(dim0=1, dim1=2))
    v = b.add(Op.RESHAPE, (a.id,), a.dtype, (m, parts, part))
    if rows != m:
        v = b.index(v, a.dtype, (rows, parts, part), (("s", lo, hi, None),))
    return b.add(Op.TRANSPOSE, (v,), a.dtype, (parts, rows, part), attrs_of(dim0=0, dim1=1))


def _b_parts(b: _Builder, bn: Node, by_id, parts: int, lo: int, hi: int) -> int:
    """B's columns lo:hi in `parts` along K: [parts, K / parts, hi - lo], a view."""
    k, n = bn.shape
    part, cols = k // parts, hi - lo
    if bn.op is Op.TRANSPOSE and len(by_id[bn.inputs[0]].shape) == 2:   # y^T: y [N, K] split by columns
        y = by_id[bn.inputs[0]]
        v = b.add(Op.RESHAPE, (y.id,), y.dtype, (n, parts, part))
        if cols != n:
            v = b.index(v, y.dtype, (cols, parts, part), (("s", lo, hi, None),))
        v = b.add(Op.TRANSPOSE, (v,), y.dtype, (parts, cols, part), attrs_of(dim0=0, dim1=1))
        return b.add(Op.TRANSPOSE, (v,), y.dtype, (parts, part, cols), attrs_of(dim0=1, dim1=2))
    v = b.add(Op.RESHAPE, (bn.id,), bn.dtype, (parts, part, n))
    if cols != n:
        v = b.index(v, bn.dtype, (parts, part, cols), (ALL, ALL, ("s", lo, hi, None)))
    return v


def _rewrite(b: _Builder, n: Node, a: Node, bn: Node, by_id, p: Plan) -> Node:
    """The nodes of plan `p` for product n = a @ bn appended; returns n's replacement (a cast)."""
    (m, k), (_, cols) = a.shape, bn.shape
    if p.axis < 0:
        lo_a, hi_a, lo_b, hi_b = 0, m, 0, cols
    elif p.axis == 0:
        lo_a, hi_a, lo_b, hi_b = p.cut, m, 0, cols
    else:
        lo_a, hi_a, lo_b, hi_b = 0, m, p.cut, cols
    rows, width = hi_a - lo_a, hi_b - lo_b
    pa = _a_parts(b, a, by_id, p.parts, lo_a, hi_a)
    pb = _b_parts(b, bn, by_id, p.parts, lo_b, hi_b)
    prod = b.add(Op.MATMUL, (pa, pb), "float32", (p.parts, rows, width), attrs_of(widened=True))
    total = b.index(prod, "float32", (rows, width), (("i", 0),))
    for i in range(1, p.parts):
        total = b.add(Op.ADD, (total, b.index(prod, "float32", (rows, width), (("i", i),))), "float32", (rows, width))
    if p.axis < 0:
        return replace(n, op=Op.CAST, inputs=(total,), attrs=())
    # The top ([:cut] of the axis) as its own product; top and tail each placed into [m, cols] (zero
    # elsewhere) and added: x + 0 is x, so the sum is the two side by side, bit for bit.
    tail = b.add(Op.CAST, (total,), n.dtype, (rows, width))
    whole = ("s", 0, p.cut, None)
    if p.axis == 0:
        ta = b.index(a.id, a.dtype, (p.cut, k), (whole,))
        top = b.add(Op.MATMUL, (ta, bn.id), n.dtype, (p.cut, cols))
        top_items, tail_items = (whole,), (("s", p.cut, m, None),)
    else:
        tb = b.index(bn.id, bn.dtype, (k, p.cut), (ALL, whole))
        top = b.add(Op.MATMUL, (a.id, tb), n.dtype, (m, p.cut))
        top_items, tail_items = (ALL, whole), (ALL, ("s", p.cut, cols, None))
    placed = b.add(Op.UNINDEX, (top,), n.dtype, (m, cols), attrs_of(items=top_items))
    placed_tail = b.add(Op.UNINDEX, (tail,), n.dtype, (m, cols), attrs_of(items=tail_items))
    return replace(n, op=Op.ADD, inputs=(placed, placed_tail), attrs=())


def split_products(program: Program) -> Program:
    hw = program.profile
    g = program.main
    # On several GPUs the products' operands are laid out over them (a data-parallel weight
    # gradient's K is the sharded batch): the views that split K have no layout rule there.
    if hw is None or hw.sm_count <= 0 or program.num_gpu > 1:
        return program
    by_id = g.by_id
    out: list[Node] = []
    b = _Builder(out, max((n.id for n in g.nodes), default=-1) + 1, None)
    changed = False
    for n in g.nodes:
        if n.op is Op.MATMUL and not n.attr("widened") and n.dtype in DTYPES and len(n.inputs) == 2:
            a, bn = (by_id[i] for i in n.inputs)
            if len(a.shape) == 2 and len(bn.shape) == 2 and _static(a.shape) and _static(bn.shape):
                p = plan(a.shape[0], bn.shape[1], a.shape[1], hw)
                if p.parts > 1:
                    b.src = n.src
                    out.append(_rewrite(b, n, a, bn, by_id, p))
                    changed = True
                    continue
        out.append(n)
    return program.replace_main(g.with_nodes(out, g.output)) if changed else program


__all__ = ["split_products", "plan", "plans", "seconds", "Plan"]
