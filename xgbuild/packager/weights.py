"""Weights inside an engine: one `weights.safetensors` entry, written canonically, read checked.

Imported models carry their parameters and buffers as graph INPUTs that the engine binds itself.
The blob is a pure function of the tensors (names sorted, contiguous copies, no metadata), so the
same model and weights give the same engine bytes; the manifest names it by its sha256.

`safetensors_header` reads the header of any safetensors file (an engine's weights, a user's inputs)
without the library: its length, nesting and entries are checked, and every tensor's offsets against
its dtype and shape and against the file's size, so that a caller can compare shapes with what it
expects before a byte of data is read. `load_weights` loads an engine's weights only once their
header matches what the manifest declares, tensor for tensor. Reading and checking need neither
torch nor Triton (a deploy host's engine reader); writing and loading the tensors import torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..compiler.ir.serialize import bounded_json
from ..compiler.ir.verify import shape_problem
from ..errors import EngineError
from .manifest import sha256

if TYPE_CHECKING:
    import torch

PATH = "weights.safetensors"
MAX_HEADER = 100 << 20            # the library's own limit

# safetensors' dtype names for the dtypes XG has, with their sizes.
SAFETENSORS_DTYPES = {"BOOL": ("bool", 1), "U8": ("uint8", 1), "I8": ("int8", 1), "I16": ("int16", 2),
                      "I32": ("int32", 4), "I64": ("int64", 8), "F16": ("float16", 2),
                      "BF16": ("bfloat16", 2), "F32": ("float32", 4), "F64": ("float64", 8)}


@dataclass(frozen=True)
class TensorSpec:
    """One tensor as a safetensors header declares it: XG dtype, shape, bytes [start, end) of the data."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    start: int
    end: int


def safetensors_header(head: bytes, file_size: int) -> tuple[int, list[TensorSpec]]:
    """(bytes before the data, the tensors in file order) of a safetensors file of `file_size`
    bytes that starts with `head` (at least the 8-byte length and the header it gives).

    Raises `ValueError` with a one-line reason for anything a reader could not trust.
    """
    if len(head) < 8:
        raise ValueError("shorter than the 8-byte header length")
    length = int.from_bytes(head[:8], "little")
    if length > MAX_HEADER or 8 + length > file_size:
        raise ValueError(f"its header claims {length} bytes, more than the file or the "
                         f"{MAX_HEADER}-byte limit allows")
    if len(head) < 8 + length:
        raise ValueError("its header is cut short")
    document = bounded_json(bytes(head[8:8 + length]), "its header")
    if not isinstance(document, dict):
        raise ValueError("its header is not a JSON object")
    specs, cursor = [], 0
    entries = sorted(((k, v) for k, v in document.items() if k != "__metadata__"),
                     key=lambda kv: _offsets(kv[0], kv[1])[0])
    for name, record in entries:
        begin, end = _offsets(name, record)
        if set(record) != {"dtype", "shape", "data_offsets"}:
            raise ValueError(f"its record for {name!r} does not hold exactly dtype, shape, data_offsets")
        if record["dtype"] not in SAFETENSORS_DTYPES:
            raise ValueError(f"tensor {name!r} has dtype {str(record['dtype'])[:20]!r}, which XG does not support")
        dtype, size = SAFETENSORS_DTYPES[record["dtype"]]
        problem = shape_problem(record["shape"])
        if problem is None and any(isinstance(d, str) for d in record["shape"]):
            problem = "a dim is not an integer"
        if problem:
            raise ValueError(f"tensor {name!r} has a malformed shape ({problem})")
        shape = tuple(record["shape"])
        if begin != cursor:
            raise ValueError(f"tensor {name!r}'s data starts at {begin}, not where the previous one ends ({cursor})")
        if end - begin != math.prod(shape) * size:
            raise ValueError(f"tensor {name!r} is {dtype}{list(shape)}, {math.prod(shape) * size} bytes, but its "
                             f"data offsets give {end - begin}")
        specs.append(TensorSpec(name, dtype, shape, begin, end))
        cursor = end
    if 8 + length + cursor != file_size:
        raise ValueError(f"its header accounts for {8 + length + cursor} bytes, but the file has {file_size}")
    return 8 + length, specs


def _offsets(name: str, record: object) -> tuple[int, int]:
    offsets = record.get("data_offsets") if isinstance(record, dict) else None
    if not (isinstance(offsets, list) and len(offsets) == 2
            and all(type(o) is int and o >= 0 for o in offsets) and offsets[0] <= offsets[1]):
        raise ValueError(f"tensor {name!r} has malformed data offsets")
    return offsets[0], offsets[1]


def weights_blob(tensors: dict[str, "torch.Tensor"]) -> tuple[bytes, dict]:
    """The safetensors bytes and the manifest's `weights` entry for `tensors`."""
    from safetensors.torch import save
    # Copies: safetensors refuses tensors that share memory (tied weights) or are not contiguous.
    ordered = {name: tensors[name].detach().cpu().contiguous().clone() for name in sorted(tensors)}
    blob = save(ordered)
    entry = {"path": PATH, "sha256": sha256(blob),
             "tensors": [{"name": n, "dtype": str(t.dtype).rsplit(".", 1)[-1], "shape": list(t.shape)}
                         for n, t in ordered.items()]}
    return blob, entry


def check_weights(blob: bytes, declared: list[dict], where: str) -> None:
    """Refuse, as an `EngineError`, weights whose header does not hold exactly the tensors the
    manifest declares (`declared`: its `weights.tensors`), with their dtypes and shapes."""
    try:
        _, specs = safetensors_header(blob[:8 + MAX_HEADER], len(blob))
    except ValueError as exc:
        raise EngineError(f"{where}: {PATH} is not a valid safetensors file: {exc}") from None
    found = {s.name: (s.dtype, list(s.shape)) for s in specs}
    wanted = {t["name"]: (t["dtype"], list(t["shape"])) for t in declared}
    if found != wanted:
        name = next((n for n in sorted(set(found) | set(wanted)) if found.get(n) != wanted.get(n)))
        raise EngineError(f"{where}: {PATH} holds {name!r} as {found.get(name, 'nothing')}, but the "
                          f"manifest declares {wanted.get(name, 'nothing')}")


def load_weights(blob: bytes) -> dict[str, "torch.Tensor"]:
    """The tensors of weights already checked with `check_weights` (the engine loader does)."""
    from safetensors.torch import load
    # A stored entry is a read-only view of the mapped engine: torch gets its own copy, which it
    # may write (safetensors' reader takes bytes).
    return load(blob if isinstance(blob, bytes) else bytes(blob))
