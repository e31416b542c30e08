"""The launch ABI's values: what a compiled kernel variant assumes, what one launch passes it.

Every kernel takes its sizes as integer arguments, so one compiled kernel serves every shape; the
tuning config fixes the tile sizes. A `Variant` states what the compiled code may assume about the
arguments of a launch, and `launch.holds` checks it before launching:

- `wide`: index arithmetic in int64 (else every offset must fit in int32);
- `layouts`: per operand, "dense" (laid out like the domain: one linear index addresses it) or one
  entry per domain dim: an int stride baked into the code (0 for broadcast, 1 for contiguous) or
  None (passed at run time);
- `aligned`: every pointer is 16-byte aligned and every run-time stride and size named in
  `Emitted.div16` is a multiple of 16 (Triton then vectorises loads); `unaligned` names the sizes
  and strides left out of that promise (not multiples of 16 at the tuning shape: a 50257-wide LM
  head's N), so one odd size no longer costs every other operand its vector loads;
- `single` (rowwise): a row fits one tile, so it is loaded once; (attention) the head dim fits
  BLOCK_D, so q's tile is loaded once;
- `even_k` (matmul): K is a multiple of BLOCK_K, so the K loop needs no mask.

The generic variant (`Variant.generic`) assumes nothing: it is the fallback every engine carries.
Binding, variant choice and grids, which differ by kernel kind, are in `launch.py` and the
templates; the runtime and the tuner both launch through them, so build and run agree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    import torch

from .spec import Binding, KernelSpec

INT32_MAX = 2**31 - 1
GRID_YZ_MAX = 65535      # CUDA's limit on a grid's y and z extents


@dataclass(frozen=True)
class Variant:
    wide: bool = True
    layouts: tuple = ()           # per operand: "dense" or tuple[int | None, ...]; () = all run-time strides
    aligned: bool = False
    single: bool = False
    even_k: bool = False
    unaligned: tuple[str, ...] = ()     # (aligned variants) sizes and strides never hinted as multiples of 16

    @classmethod
    def generic(cls) -> "Variant":
        return cls()

    def hinted(self, name: str) -> bool:
        """May the code assume the size or stride `name` (one the template would hint) is a multiple of 16?"""
        return self.aligned and name not in self.unaligned

    def to_json(self) -> dict:
        d = {"wide": self.wide, "layouts": [lay if lay == "dense" else list(lay) for lay in self.layouts],
             "aligned": self.aligned, "single": self.single, "even_k": self.even_k}
        if self.unaligned:                  # absent when empty: the JSON (and keys) of earlier variants stay
            d["unaligned"] = list(self.unaligned)
        return d

    @classmethod
    def from_json(cls, d: dict) -> "Variant":
        return cls(bool(d["wide"]), tuple(lay if lay == "dense" else tuple(lay) for lay in d["layouts"]),
                   bool(d["aligned"]), bool(d["single"]), bool(d["even_k"]),
                   tuple(str(x) for x in d.get("unaligned", ())))


@dataclass
class Compiled:
    """One compiled variant of a kernel: what to assume, its config, and how to launch it."""
    variant: Variant
    config: dict[str, int]
    params: list[tuple[str, str]]
    div16: list[str]
    handle: Any                     # a KernelBinary (CUDA) or a Triton JITFunction (interpreter)


@dataclass
class KernelPlan:
    spec: KernelSpec
    binding: Binding
    variants: list[Compiled]        # fastest first; the last is the generic one


@dataclass
class ExternStep:
    """A PyTorch operator the engine calls eagerly between kernels (an EXTERN node)."""
    node: int


@dataclass
class Launch:
    """What one kernel launch needs, computed from the tensors of this run."""
    tensors: dict[str, torch.Tensor]
    ints: dict[str, int]     # sizes and strides by parameter name (matmul: also `batch`)
    layouts: list            # per operand: ("dense"|strides tuple, shape tuple) as seen in this run


@dataclass(frozen=True)
class Frame:
    """How a kernel kind lines one launch's operands up with its domain (`KernelTemplate.frame`)."""
    kdom: tuple                                             # the domain in the kernel's dim order
    align: Callable[[int, str, torch.Tensor], torch.Tensor]  # operand j at `level` -> lined up
    sizes: Callable[[dict], dict[str, int]]                 # the bound tensors -> size arguments
    unravel: tuple                                          # the sizes kernels unravel (d0, d1, ...)
    out_perm: tuple | None = None                           # full outputs' strides taken in this order
    # output i -> its buffer seen as the domain's dims (None: as it is): strides passed as q{i}_s{d}
    out_view: Callable[[int, torch.Tensor], torch.Tensor | None] | None = None


def align(t: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """`t` broadcast to `shape` (numpy rules: leading dims added)."""
    if t.dim() < len(shape):
        t = t.reshape((1,) * (len(shape) - t.dim()) + tuple(t.shape))
    return t.expand(shape)


def arguments(c: Compiled, launch: Launch) -> list:
    """The launch's arguments in the order of `c`'s parameters."""
    args = []
    for name, _ty in c.params:
        args.append(launch.tensors[name] if name in launch.tensors else launch.ints[name])
    return args
