"""Strides of row-major values and of views of them (torch's rules), for the passes that must
know whether a chain of views reads memory through strides alone and for the runtime's arrays."""

from __future__ import annotations

import math
from typing import Sequence


def contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    out, acc = [], 1
    for size in reversed(shape):
        out.append(acc)
        acc *= max(int(size), 1)
    return tuple(reversed(out))



def view_strides(old: Sequence[int], strides: Sequence[int], new: Sequence[int]) -> tuple[int, ...] | None:
    """The strides of `new` viewing memory laid out as (`old`, `strides`), or None where no view
    can (ATen's `computeStride`: dims of `new` must split or merge runs of `old` whose strides chain)."""
    if math.prod(old) == 0 or not old:
        return contiguous_strides(new)
    out = [0] * len(new)
    view_d = len(new) - 1
    chunk = strides[-1]
    tensor_numel = view_numel = 1
    for d in range(len(old) - 1, -1, -1):
        tensor_numel *= old[d]
        if d == 0 or (old[d - 1] != 1 and strides[d - 1] != tensor_numel * chunk):
            while view_d >= 0 and (view_numel < tensor_numel or new[view_d] == 1):
                out[view_d] = view_numel * chunk
                view_numel *= new[view_d]
                view_d -= 1
            if view_numel != tensor_numel:
                return None
            if d > 0:
                chunk = strides[d - 1]
                tensor_numel = view_numel = 1
    return tuple(out) if view_d == -1 else None


__all__ = ["contiguous_strides", "view_strides"]


def static_slot(items: Sequence[tuple]) -> tuple[int, int] | None:
    """(dim, index) of index items that take one static index of one dim and every other dim
    whole (an `unindex` placing a value into one slot); None otherwise."""
    ints = [(d, it[1]) for d, it in enumerate(items) if it[0] == "i"]
    whole = all(tuple(it) == ("s", None, None, None) for it in items if it[0] != "i")
    if len(ints) != 1 or not whole or not isinstance(ints[0][1], int) or ints[0][1] < 0:
        return None
    return ints[0]


def transposed_axes(pairs: Sequence[tuple[int, int]], rank: int) -> tuple[int, ...]:
    """Which dim of a value each dim of it is, seen through transposes of dims `pairs` in turn."""
    axes = list(range(rank))
    for a, b in pairs:
        a, b = a % rank, b % rank
        axes[a], axes[b] = axes[b], axes[a]
    return tuple(axes)


def slot_strides(strides: Sequence[int], dim: int, axes: Sequence[int]) -> tuple[int, ...]:
    """The strides of one slot along `dim` of a tensor of `strides`, seen as the value placed
    there, whose dims the slot's are through `axes` (`transposed_axes`)."""
    rest = [s for d, s in enumerate(strides) if d != dim]
    out = [0] * len(axes)
    for j, a in enumerate(axes):
        out[a] = rest[j]
    return tuple(out)
