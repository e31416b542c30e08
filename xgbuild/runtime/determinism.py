"""Whether an engine gives bit-identical outputs run after run on the same GPU, and if not, why.

Read from the engine itself, so engines built before this question was asked answer it too:

- its kernels' PTX: a floating-point atomic add (`atom`/`red`/`cp.reduce.async.bulk` with `.add`
  and an `.f16`/`.bf16`/`.f32`/`.f64` type) adds in whatever order the threads arrive, which
  changes the rounding from run to run; split-K with atomic accumulation is one. XG's codegen
  emits none today (compiler/codegen: no `tl.atomic_*`, no split-K); integer atomics give the same
  result in any order. A variant without PTX is judged by its kernel kind, all of which XG emits
  without atomics;
- its eager PyTorch calls (`fallback="eager"`): those whose CUDA kernels PyTorch documents as
  nondeterministic (`torch.use_deterministic_algorithms`), which accumulate with atomics;
- many GPUs: the sums of NCCL's collectives keep one order for a given NCCL version, topology
  and message size (not a documented guarantee), so a note, not a refusal.

Everything else XG runs is deterministic: fixed tile orders, counter-based `randn`, CUDA graph
replays of the same kernels.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..compiler.ir.graph import Graph, Op

# Atomic instructions (PTX ISA: atom, red, cp.reduce.async.bulk): order-dependent when they add
# floating-point values (each add rounds; min, max and integer adds give one answer in any order).
_ATOMIC = re.compile(rb"\b(?:atom|red|cp\.reduce\.async\.bulk)(?:\.[\w:]+)+")
_FLOAT_TYPES = frozenset({b"f16", b"bf16", b"f16x2", b"bf16x2", b"f32", b"f64"})
# Kernel kinds XG's codegen emits (compiler/codegen/templates), none of them with atomics.
ATOMIC_FREE_KINDS = frozenset({"elementwise", "rowwise", "matmul", "attention", "flash", "scatter", "local"})
# PyTorch operators whose CUDA kernels accumulate with atomics (torch.use_deterministic_algorithms).
NONDETERMINISTIC_TORCH = frozenset({
    "index_add", "index_put", "scatter_add", "scatter_reduce", "put", "index_reduce", "embedding_bag",
    "embedding_dense_backward", "_embedding_bag_backward", "histc", "bincount", "kthvalue", "median",
    "ctc_loss", "nll_loss2d_forward", "grid_sampler_2d_backward", "upsample_bilinear2d_backward",
    "upsample_linear1d_backward", "upsample_bicubic2d_backward", "upsample_trilinear3d_backward",
    "adaptive_avg_pool2d_backward", "adaptive_avg_pool3d_backward", "adaptive_max_pool2d_backward",
    "max_pool3d_with_indices_backward", "avg_pool3d_backward", "reflection_pad1d_backward",
    "reflection_pad2d_backward", "replication_pad1d_backward", "replication_pad2d_backward",
    "replication_pad3d_backward", "cumsum",
})
# `scatter` is nondeterministic only with a reduce.
_SCATTER_REDUCE = ("aten.scatter.reduce", "aten.scatter.value_reduce")


@dataclass(frozen=True)
class Determinism:
    deterministic: bool
    reasons: tuple[str, ...] = ()      # why not (empty when deterministic)
    notes: tuple[str, ...] = ()        # what it rests on

    def line(self) -> str:
        """`inspect`'s line."""
        if not self.deterministic:
            return "not deterministic: " + "; ".join(self.reasons)
        return "deterministic (run-to-run bit-identical on the same GPU)" + "".join(f"; {n}" for n in self.notes)

    def to_json(self) -> dict:
        return {"deterministic": self.deterministic, "reasons": list(self.reasons), "notes": list(self.notes)}


def determinism(manifest: dict, graph: Graph, entries: dict[str, bytes]) -> Determinism:
    """The verdict for an engine's manifest, program and bundle entries (paths -> bytes)."""
    reasons: list[str] = []
    for kernel in manifest.get("kernels", []):
        why = _kernel_atomics(kernel, entries)
        if why:
            reasons.append(f"kernel {kernel.get('name', '?')} {why}")
    for n in graph.nodes:
        if n.op is Op.EXTERN:
            call = str(n.attr("call"))
            base = call.removeprefix("aten.").split(".")[0].rstrip("_")
            if base in NONDETERMINISTIC_TORCH or call in _SCATTER_REDUCE:
                reasons.append(f"eager op %{n.id} {call} accumulates with atomics on CUDA")
    notes = []
    if manifest.get("num_gpu", 1) > 1 and any(n.op in (Op.ALL_REDUCE, Op.REDUCE_SCATTER) for n in graph.nodes):
        notes.append("across GPUs, as NCCL's sums are (same NCCL version, topology and sizes)")
    return Determinism(not reasons, tuple(reasons), tuple(notes))


def _kernel_atomics(kernel: dict, entries: dict[str, bytes]) -> str | None:
    """Why one kernel table entry is nondeterministic, or None."""
    for v in kernel.get("variants", []):
        ptx = entries.get(v.get("ptx", ""))
        if ptx is None:
            if kernel.get("kind") not in ATOMIC_FREE_KINDS:
                return f"(kind {kernel.get('kind')!r}) carries no PTX to check for atomics"
            continue
        for found in _ATOMIC.finditer(ptx):
            parts = set(found.group().split(b"."))
            if b"add" in parts and parts & _FLOAT_TYPES:
                return f"adds with floating-point atomics (`{found.group().decode(errors='replace')}` in its PTX)"
    return None
