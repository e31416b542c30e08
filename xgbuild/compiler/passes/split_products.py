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

from ..ir.graph import Node, Op, Program
from .rewrite import FULL, Inserter

DTYPES = ("bfloat16", "float16")
TILE = 128                  # the output tile the wave model assumes (M and N)
K_STEP = 64                 # a part's K is a whole number of these
MIN_PART_K = 512            # no part shorter than this: its tile would be mostly prologue
PARTS = (2, 4, 8, 16)
MIN_GAIN = 1.15             # the model's time whole over its time split, at least
LAUNCH_S = 3e-6             # one more kernel, with its ramp up and down
PARTIAL_BYTES = 4           # a float32 partial product
MAX_TAIL = 0.5              # a tail of more than this fraction of a wave is left whole


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


def _plan_of(n: Node, by_id: dict[int, Node], hw: GpuProfile) -> Plan:
    """The plan for node `n`: whole unless it is a static 2-D 16-bit product the model splits."""
    if n.op is not Op.MATMUL or n.attr("widened") or n.dtype not in DTYPES or len(n.inputs) != 2:
        return Plan()
    a, b = (by_id[i] for i in n.inputs)
    if len(a.shape) != 2 or len(b.shape) != 2 or not _static(a.shape) or not _static(b.shape):
        return Plan()
    return plan(a.shape[0], b.shape[1], a.shape[1], hw)


def _k_parts(add, s: Node, k_dim: int, parts: int, lo: int, hi: int, k_last: bool, src) -> int:
    """A view of 2-D `s` (K its dim `k_dim`) split into `parts` along K, its other dim cut to
    lo:hi: [parts, hi - lo, K / parts] if `k_last` (A's orientation), else [parts, K / parts,
    hi - lo] (B's)."""
    other = s.shape[1 - k_dim]
    part = s.shape[k_dim] // parts
    cut = ("s", lo, hi, None)
    if k_dim == 0:              # [K, X] -> [parts, part, X][..., lo:hi]
        v = add(Op.RESHAPE, (s.id,), src, s.dtype, (parts, part, other))
        if hi - lo != other:
            v = add(Op.INDEX, (v,), src, items=(FULL, FULL, cut))
        return add(Op.TRANSPOSE, (v,), src, dim0=1, dim1=2) if k_last else v
    v = add(Op.RESHAPE, (s.id,), src, s.dtype, (other, parts, part))        # [X, K] -> [X, parts, part]
    if hi - lo != other:
        v = add(Op.INDEX, (v,), src, items=(cut,))
    v = add(Op.TRANSPOSE, (v,), src, dim0=0, dim1=1)
    return v if k_last else add(Op.TRANSPOSE, (v,), src, dim0=1, dim1=2)


def _stored(x: Node, by_id: dict[int, Node]) -> tuple[Node, bool]:
    """The tensor a 2-D operand is read from and whether it is stored transposed: a TRANSPOSE of a
    2-D value (a gradient's x^T, an `nn.Linear` weight's W^T) is split as that value."""
    if x.op is Op.TRANSPOSE and len(by_id[x.inputs[0]].shape) == 2:
        return by_id[x.inputs[0]], True
    return x, False


def _rewrite(new: Inserter, n: Node, a: Node, bn: Node, p: Plan) -> Node:
    """The nodes of plan `p` for product n = a @ bn appended; returns n's replacement (a cast, or
    the tail form's add)."""
    add, by_id, src = new.add, new.by_id, n.src
    (m, k), (_, cols) = a.shape, bn.shape
    lo_a, lo_b = (p.cut, 0) if p.axis == 0 else (0, p.cut if p.axis == 1 else 0)
    sa, a_t = _stored(a, by_id)         # A [M, K]: K is dim 1, or dim 0 of x for x^T
    sb, b_t = _stored(bn, by_id)        # B [K, N]: K is dim 0, or dim 1 of y for y^T
    pa = _k_parts(add, sa, 0 if a_t else 1, p.parts, lo_a, m, True, src)
    pb = _k_parts(add, sb, 1 if b_t else 0, p.parts, lo_b, cols, False, src)
    prod = add(Op.MATMUL, (pa, pb), src, widened=True)
    total = add(Op.INDEX, (prod,), src, items=(("i", 0),))
    for i in range(1, p.parts):
        total = add(Op.ADD, (total, add(Op.INDEX, (prod,), src, items=(("i", i),))), src)
    if p.axis < 0:
        return replace(n, op=Op.CAST, inputs=(total,), attrs=())
    # The top ([:cut] of the axis) as its own product; top and tail each placed into [m, cols] (zero
    # elsewhere) and added: x + 0 is x, so the sum is the two side by side, bit for bit.
    tail = add(Op.CAST, (total,), src, n.dtype)
    top_items = (FULL,) * p.axis + (("s", 0, p.cut, None),)
    tail_items = (FULL,) * p.axis + (("s", p.cut, (m, cols)[p.axis], None),)
    if p.axis == 0:
        top = add(Op.MATMUL, (add(Op.INDEX, (a.id,), src, items=top_items), bn.id), src)
    else:
        top = add(Op.MATMUL, (a.id, add(Op.INDEX, (bn.id,), src, items=top_items)), src)
    placed = add(Op.UNINDEX, (top,), src, shape=(m, cols), items=top_items)
    placed_tail = add(Op.UNINDEX, (tail,), src, shape=(m, cols), items=tail_items)
    return replace(n, op=Op.ADD, inputs=(placed, placed_tail), attrs=())


def split_products(program: Program) -> Program:
    hw = program.profile
    g = program.main
    # On several GPUs the products' operands are laid out over them (a data-parallel weight
    # gradient's K is the sharded batch): the views that split K have no layout rule there.
    if hw is None or hw.sm_count <= 0 or program.num_gpu > 1:
        return program
    out: list[Node] = []
    new = Inserter(dict(g.by_id), out)
    for n in g.nodes:
        p = _plan_of(n, new.by_id, hw)
        out.append(_rewrite(new, n, *(new.by_id[i] for i in n.inputs), p) if p.parts > 1 else n)
    changed = len(out) > len(g.nodes)     # (a rewrite adds nodes)
    return program.replace_main(g.with_nodes(out, g.output)) if changed else program


__all__ = ["split_products", "plan", "plans", "seconds", "Plan"]
