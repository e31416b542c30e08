"""Engine inputs and outputs as files: `.npz`, `.safetensors`, `.pt`/`.pth`.

Owns what `xgrun --inputs FILE --output FILE` and `xg.run_engine` read and write:

- `load_tensors` reads a file into `{name: CPU tensor}`. Nothing is ever unpickled: `.npz` is read
  with `allow_pickle=False`, `.pt` with `torch.load(weights_only=True)`. Every way a file can be
  wrong (not the format its suffix says, truncated, an object array, a pickled payload, a name that
  is not an XG identifier, a dtype XG lacks) is one `TensorIOError` line naming the file.
  Only a regular file is read (a FIFO or a device is refused without blocking), and each format's
  headers come first: shapes and dtypes against the caller's signature, sizes against the
  container's (a zip member's, the file's) and the host's memory, before any data is inflated.
- `save_tensors` writes atomically and byte-for-byte deterministically, so output files can be
  compared and cached by digest; it replaces only a regular file, never a FIFO, device or link.
- `random_inputs` makes seeded inputs that are the same bits on every machine; `describe` gives the
  shape, dtype and a content checksum of a tensor for logs and `--json`.
"""

from __future__ import annotations

import hashlib
import math
import os
import sys
import warnings
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import BinaryIO

import safetensors.torch
import torch

from ..dtypes import TORCH_DTYPES, XG_NAMES, xg_dtype  # noqa: F401 (re-exported)
from ..packager.weights import SAFETENSORS_DTYPES
# The checks and formats every reader shares, torch or not (the deploy runtime reads without it).
from .host_io import (KEYWORDS as _KEYWORDS, NAME_RE as _NAME_RE, SUFFIXES, Budget as _Budget,  # noqa: F401
                      Expected, FORMAT_NAMES as _FORMAT_NAMES, TensorIOError,
                      check_output as _check_output, fd_path as _fd_path, format_hint as _hint,
                      host_memory as _host_memory, open_regular as _open_regular, read_npz,
                      safetensors_specs as _safetensors_specs, suffix_of as _suffix, summarize as _summarize,
                      write_atomic as _write_atomic, write_npz)


# ---------------------------------------------------------------------------------------- reading

def load_tensors(path: Path, *, role: str = "inputs file", expected: Expected | None = None,
                 max_bytes: int | None = None) -> dict[str, torch.Tensor]:
    """Read `path` into `{name: tensor}`: CPU, contiguous, in the file's dtype, names in file order.

    `role` only words the error messages ("inputs file", "expected outputs file", ...). Every
    format's headers are read first: with `expected`, a name it lacks or a dtype, rank or fixed dim
    that differs is refused before any data is read, as is a total over `max_bytes` (default: this
    host's memory) or a header that disagrees with the container's sizes (a zip member's, the file's).
    """
    path = Path(path)
    suffix = _suffix(path, role)
    where = f"{role} {path}"
    invalid = f"{where} is not a valid {_FORMAT_NAMES[suffix]}"
    with _open_regular(path, role) as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            raise TensorIOError(f"{invalid}: the file is empty")
        budget = _Budget(where, expected, _host_memory() if max_bytes is None else max_bytes)
        try:
            raw = _READERS[suffix](f, size, budget)
        except TensorIOError:
            raise
        except OSError as e:
            raise TensorIOError(f"cannot read {where}: {e.strerror or e}") from None
        # Parsers fail in many ways (ValueError, RuntimeError, UnpicklingError, SafetensorError, ...);
        # the user needs to know the file is bad and why, not the parser's traceback.
        except Exception as e:  # noqa: BLE001
            raise TensorIOError(f"{invalid}: {_summarize(e)}{_hint(f, suffix)}") from None
    out: dict[str, torch.Tensor] = {}
    for name, t in raw:
        if name in out:
            raise TensorIOError(f"{where}: name {name!r} appears twice")
        if isinstance(t, torch.Tensor) and t.device.type != "cpu":      # a .pt may hold a meta tensor
            raise TensorIOError(f"{where}: tensor {name!r} is on device {t.device.type}"
                                + (", which holds no data" if t.device.type == "meta" else ""))
        out[name] = _checked(where, name, t)
        if suffix in (".pt", ".pth"):                  # the pickle gave shapes only now
            budget.admit(name, XG_NAMES.get(t.dtype, str(t.dtype)), tuple(t.shape))
    return out


def load_tensor_shards(path: Path, split: dict[str, int], rank: int, world: int, *,
                       role: str = "inputs file", only: set[str] | None = None
                       ) -> tuple[dict[str, torch.Tensor], dict[str, tuple[int, ...]]]:
    """One rank's inputs: whole tensors, except that for each `name -> dim` in `split` only this
    rank's slice along dim (of `world` equal ones). Returns (tensors, whole shapes of the split ones).
    With `only` (a pipeline rank's inputs), the others are `meta` tensors: shape and dtype, no data.

    From `.safetensors` only the slice's bytes are read (the file is memory-mapped), so no rank
    holds a whole split input, nor an input it does not read; other formats are read whole, then
    sliced.
    """
    path = Path(path)
    if _suffix(path, role) != ".safetensors" or (not split and only is None):
        whole = load_tensors(path, role=role)
        shapes = {k: tuple(v.shape) for k, v in whole.items() if k in split}
        for k in shapes:
            whole[k] = _slice_of(f"{role} {path}", k, whole[k], split[k], rank, world).clone()
        if only is not None:
            whole = {k: (v if k in only else torch.empty(v.shape, dtype=v.dtype, device="meta"))
                     for k, v in whole.items()}
        return whole, shapes
    out, shapes = {}, {}
    with _open_regular(path, role) as file:
        try:
            _safetensors_specs(file, os.fstat(file.fileno()).st_size)      # its header, checked first
            with safetensors.safe_open(_fd_path(file), framework="pt") as f:
                for name in f.keys():
                    if only is not None and name not in only:
                        view = f.get_slice(name)
                        dtype = _SAFETENSORS_DTYPES.get(view.get_dtype())
                        if dtype is None:
                            raise TensorIOError(f"{role} {path}: tensor {name!r} has dtype {view.get_dtype()}, "
                                                f"which XG does not support (XG dtypes: {', '.join(TORCH_DTYPES)})")
                        out[name] = torch.empty(tuple(view.get_shape()), dtype=dtype, device="meta")
                        continue
                    if name not in split:
                        out[name] = _checked(f"{role} {path}", name, f.get_tensor(name))
                        continue
                    view = f.get_slice(name)
                    shape = tuple(view.get_shape())
                    lo, hi = _bounds(f"{role} {path}", name, shape, split[name], rank, world)
                    index = (slice(None),) * split[name] + (slice(lo, hi),)
                    out[name] = _checked(f"{role} {path}", name, view[index])
                    shapes[name] = shape
        except TensorIOError:
            raise
        except Exception as e:  # noqa: BLE001  (the parser's many error types, as in load_tensors)
            raise TensorIOError(f"{role} {path} is not a valid safetensors file: {_summarize(e)}") from None
    return out, shapes


# safetensors' dtype names (the header's) for the dtypes XG reads.
_SAFETENSORS_DTYPES = {code: TORCH_DTYPES[name] for code, (name, _) in SAFETENSORS_DTYPES.items()}


def _bounds(where: str, name: str, shape: tuple[int, ...], dim: int, rank: int, world: int) -> tuple[int, int]:
    if dim >= len(shape) or shape[dim] % world:
        size = shape[dim] if dim < len(shape) else "no such dimension"
        raise TensorIOError(f"{where}: `{name}` {list(shape)} is split along dimension {dim} over {world} ranks, "
                            f"which needs a multiple of {world} ({size})")
    step = shape[dim] // world
    return rank * step, (rank + 1) * step


def _slice_of(where: str, name: str, t: torch.Tensor, dim: int, rank: int, world: int) -> torch.Tensor:
    lo, hi = _bounds(where, name, tuple(t.shape), dim, rank, world)
    return t.narrow(dim, lo, hi - lo)


_NPY_MAX_HEADER = 10000          # numpy's own default


def _read_npz(f: BinaryIO, size: int, budget: _Budget) -> list[tuple[str, torch.Tensor]]:
    return [(name, torch.from_numpy(array)) for name, array in read_npz(f, size, budget)]


def _read_safetensors(f: BinaryIO, size: int, budget: _Budget) -> list[tuple[str, torch.Tensor]]:
    for spec in _safetensors_specs(f, size):
        if spec.dtype not in TORCH_DTYPES:
            raise ValueError(f"tensor {spec.name!r} has dtype {spec.dtype}, which XG does not support")
        budget.admit(spec.name, spec.dtype, spec.shape)
    # Read the bytes rather than mmap: the file may be replaced while the engine runs.
    f.seek(0)
    return list(safetensors.torch.load(f.read(size)).items())


def _read_pt(f: BinaryIO, size: int, budget: _Budget) -> list[tuple[str, torch.Tensor]]:
    # Only torch's zip format (torch.save's since 1.6): the legacy format allocates each storage at
    # the size its pickle claims before reading it, so a small file could claim gigabytes. In the
    # zip, every record must be stored (not compressed) and lie within the file: what loading
    # allocates is then bounded by the file's own size. Shapes come from the pickle, once loaded.
    if not zipfile.is_zipfile(f):
        raise ValueError("it is not in torch's zip format (torch.save writes it since PyTorch 1.6)")
    with zipfile.ZipFile(f) as zf:
        for info in zf.infolist():
            if info.compress_type != zipfile.ZIP_STORED or info.file_size != info.compress_size \
                    or info.header_offset + info.file_size > size:
                raise ValueError(f"record {info.filename!r} is compressed or claims more bytes than the file has")
    f.seek(0)
    # weights_only=True: a .pt file is a pickle, and a pickle can run arbitrary code when loaded.
    with warnings.catch_warnings():
        # torch warns about pickle protocols it did not write; the load itself decides what is safe.
        warnings.filterwarnings("ignore", message="Detected pickle protocol")
        obj = torch.load(f, map_location="cpu", weights_only=True)
    if not isinstance(obj, dict):
        raise ValueError(f"it holds a {type(obj).__name__}, not a dict of name -> tensor")
    for name, value in obj.items():
        if not isinstance(value, torch.Tensor):
            raise ValueError(f"entry {name!r} is of type {type(value).__name__}, not a tensor")
    return list(obj.items())


_READERS = {".npz": _read_npz, ".safetensors": _read_safetensors, ".pt": _read_pt, ".pth": _read_pt}


def _checked(where: str, name: object, t: torch.Tensor) -> torch.Tensor:
    """Check one loaded entry is an XG-usable tensor, and return it as a compact CPU tensor."""
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name) or name in _KEYWORDS:
        raise TensorIOError(f"{where}: name {name!r} is not an XG identifier "
                            "(letters, digits and `_`, not starting with a digit, not a keyword)")
    if t.layout != torch.strided:
        raise TensorIOError(f"{where}: tensor {name!r} has layout {t.layout}; only dense tensors are supported")
    if t.dtype not in XG_NAMES:
        raise TensorIOError(f"{where}: tensor {name!r} has dtype {t.dtype}, which XG does not support "
                            f"(XG dtypes: {', '.join(TORCH_DTYPES)})")
    return _compact(t.detach().cpu())


def _compact(t: torch.Tensor) -> torch.Tensor:
    """`t` contiguous and owning exactly its own bytes (not a view into a larger storage)."""
    if t.is_contiguous() and t.storage_offset() == 0 and t.untyped_storage().nbytes() == t.nbytes:
        return t
    return t.clone(memory_format=torch.contiguous_format)


# ---------------------------------------------------------------------------------------- writing

def save_tensors(path: Path, tensors: Mapping[str, torch.Tensor | float | int | bool], *,
                 role: str = "output file") -> None:
    """Write `tensors` to `path` (format by suffix), atomically, with the same bytes for the same tensors.

    Python scalars become 0-d tensors: bool -> bool, int -> int64, float -> float32 (XG's default
    float). Tensors on other devices are copied to the CPU. `.npz` cannot hold bfloat16 (numpy
    has no such dtype), so that is refused rather than silently widened.
    """
    path = Path(path)
    suffix = _suffix(path, role)
    where = f"{role} {path}"
    _check_output(path, where)
    prepared: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for name in sorted(tensors, key=str):
        t = _checked(where, name, _as_tensor(where, name, tensors[name]))
        # Two names sharing memory would make the .pt alias them and safetensors refuse them.
        if t.numel() and t.untyped_storage().data_ptr() in seen:
            t = t.clone()
        seen.add(t.untyped_storage().data_ptr())
        if suffix == ".npz" and t.dtype == torch.bfloat16:
            raise TensorIOError(f"{where}: tensor {name!r} is bfloat16, which .npz cannot store; "
                                "use .safetensors or .pt")
        prepared[name] = t
    _write_atomic(path, where, lambda f: _WRITERS[suffix](f, prepared))


_SCALAR_DTYPES = {bool: torch.bool, int: torch.int64, float: torch.float32}


def _as_tensor(where: str, name: object, value: object) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value
    if type(value) is int and not -2**63 <= value < 2**63:
        raise TensorIOError(f"{where}: value {name!r} = {value} does not fit in int64")
    if type(value) in _SCALAR_DTYPES:
        return torch.tensor(value, dtype=_SCALAR_DTYPES[type(value)])
    raise TensorIOError(f"{where}: value {name!r} is of type {type(value).__name__}; "
                        "expected a torch.Tensor or a Python bool, int or float")


def _write_npz(f: BinaryIO, tensors: Mapping[str, torch.Tensor]) -> None:
    write_npz(f, {name: t.numpy() for name, t in tensors.items()})


def _write_pt(f: BinaryIO, tensors: Mapping[str, torch.Tensor]) -> None:
    # A file object, not a path: given a path, torch names the archive's top folder after the file.
    torch.save(dict(tensors), f)


_WRITERS: dict[str, Callable[[BinaryIO, Mapping[str, torch.Tensor]], object]] = {
    ".npz": _write_npz, ".pt": _write_pt, ".pth": _write_pt,
    ".safetensors": lambda f, tensors: f.write(safetensors.torch.save(dict(tensors))),
}


# ------------------------------------------------------------------------- random inputs, describe

def random_inputs(signature: Mapping[str, tuple[str, tuple[int, ...]]], seed: int,
                  ranges: Mapping[str, tuple[int, int]] | None = None) -> dict[str, torch.Tensor]:
    """Seeded inputs for `{name: (xg dtype, shape)}`: the same bits for the same seed on any machine.

    Floats are standard normal rounded to float32 then cast; ints uniform in [-8, 8) (uint8 in
    [0, 16)); bools fair coin flips. Each input has its own generator, seeded from sha256 of
    (seed, name), so adding or renaming one input leaves the others' values unchanged. An integer
    input with a range [lo, hi) in `ranges` (indices into a table) is drawn uniformly from it.
    Refused, before anything is allocated, when they would not fit in this host's memory.
    """
    total = sum(math.prod(shape) * TORCH_DTYPES[dtype].itemsize for dtype, shape in signature.values()
                if dtype in TORCH_DTYPES)
    if total > _host_memory():
        raise TensorIOError(f"random inputs for this engine would take {total} bytes, more than this host's "
                            f"memory ({_host_memory()}); pass --inputs, or smaller --dim sizes")
    out = {}
    for name, (dtype_name, shape) in signature.items():
        if dtype_name not in TORCH_DTYPES:
            raise ValueError(f"input {name!r}: unknown dtype {dtype_name!r} (XG dtypes: {', '.join(TORCH_DTYPES)})")
        dtype, shape = TORCH_DTYPES[dtype_name], tuple(shape)
        digest = hashlib.sha256(f"xg.random_inputs\0{seed}\0{name}".encode()).digest()
        g = torch.Generator(device="cpu").manual_seed(int.from_bytes(digest[:8], "little") >> 1)
        if dtype.is_floating_point:
            # Drawn in float64, then rounded: torch's float32 randn takes a SIMD path on AVX2/AVX-512
            # CPUs whose bits differ from its scalar path; the float64 one is the same everywhere.
            t = torch.randn(shape, generator=g, dtype=torch.float64).to(torch.float32).to(dtype)
        elif dtype == torch.bool:
            t = torch.randint(0, 2, shape, generator=g, dtype=torch.int64).to(torch.bool)
        else:
            low, high = (0, 16) if dtype == torch.uint8 else (-8, 8)
            if ranges and name in ranges:
                low, high = ranges[name]
            t = torch.randint(low, high, shape, generator=g, dtype=torch.int64).to(dtype)
        out[name] = t
    return out


def describe(t: torch.Tensor) -> dict[str, object]:
    """`{"shape": [...], "dtype": xg name, "checksum": 16 hex}`; the checksum is sha256 of the raw
    little-endian element bytes, so it is the same on every run and machine."""
    dtype = xg_dtype(t.dtype)
    data = t.detach().cpu().contiguous()
    if data.dtype == torch.bfloat16:  # numpy has no bfloat16; the same 2 bytes as int16
        data = data.view(torch.int16)
    array = data.numpy()
    if sys.byteorder == "big":
        array = array.astype(array.dtype.newbyteorder("<"))
    return {"shape": list(t.shape), "dtype": dtype, "checksum": hashlib.sha256(array.tobytes()).hexdigest()[:16]}
