"""Tensor files without torch: what the deploy runtime (and, under it, `tensor_io`) reads and writes.

`.npz` and `.safetensors` are read into numpy arrays (bfloat16 as its uint16 bits, beside its XG
dtype name: numpy has no bfloat16) with the same checks `tensor_io.load_tensors` makes: a regular
file only, every header before any data (shapes and dtypes against the engine's signature, sizes
against the container's and the host's memory), never a pickle. They are written atomically and
byte for byte as `tensor_io.save_tensors` writes them (`.safetensors` in the library's own layout),
so the torch runtime and the deploy runtime give the same files and checksums. `.pt` needs torch.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import re
import secrets
import stat
import sys
import zipfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from ..dtypes import ITEMSIZE
from ..packager.weights import MAX_HEADER, SAFETENSORS_DTYPES, TensorSpec, safetensors_header

SUFFIXES = (".npz", ".safetensors", ".pt", ".pth")
FORMAT_NAMES = {".npz": ".npz archive", ".safetensors": "safetensors file",
                ".pt": "PyTorch tensor file", ".pth": "PyTorch tensor file"}
NPY_MAX_HEADER = 10000          # numpy's own default

# numpy's storage dtype for each XG dtype (bfloat16: its bits) and CUDA Array Interface typestrs.
NUMPY_DTYPES = {"bool": np.bool_, "int8": np.int8, "int16": np.int16, "int32": np.int32, "int64": np.int64,
                "uint8": np.uint8, "float16": np.float16, "bfloat16": np.uint16, "float32": np.float32,
                "float64": np.float64}
TYPESTR = {name: np.dtype(dt).str for name, dt in NUMPY_DTYPES.items() if name != "bfloat16"}
SAFETENSORS_CODES = {name: code for code, (name, _size) in SAFETENSORS_DTYPES.items()}


class TensorIOError(Exception):
    """A tensor file could not be read or written; the message is one line naming the file."""


@dataclass
class HostArray:
    """A host tensor without torch: a C-contiguous numpy array and its XG dtype (bfloat16 is held
    as uint16 bits)."""
    array: np.ndarray
    dtype: str

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.array.shape)


def c_array(a: Any, dtype: Any = None) -> np.ndarray:
    """`a` as a C-contiguous numpy array, copied only when it is not one, its rank kept (numpy's
    `ascontiguousarray` makes a 0-d array 1-d)."""
    a = np.asarray(a, dtype=dtype)
    return a if a.flags.c_contiguous else a.copy(order="C")


def host_empty(shape, dtype: str) -> np.ndarray:
    return np.empty(tuple(shape), dtype=NUMPY_DTYPES[dtype])


def as_host(name: str, value: Any) -> HostArray:
    """A numpy array (ml_dtypes' bfloat16 too), a Python scalar or a HostArray as a HostArray."""
    if isinstance(value, HostArray):
        return HostArray(c_array(value.array), value.dtype)
    if isinstance(value, bool):
        return HostArray(np.array(value), "bool")
    if isinstance(value, int):
        return HostArray(np.array(value, dtype=np.int64), "int64")
    if isinstance(value, float):
        return HostArray(np.array(value, dtype=np.float32), "float32")
    if isinstance(value, np.ndarray):
        if value.dtype.name == "bfloat16":          # ml_dtypes
            return HostArray(c_array(value).view(np.uint16), "bfloat16")
        if value.dtype.name not in ITEMSIZE:
            raise TensorIOError(f"input `{name}`: numpy dtype {value.dtype} is not an XG dtype "
                                f"({', '.join(ITEMSIZE)}; bfloat16 as ml_dtypes.bfloat16 or HostArray(uint16 bits, "
                                "'bfloat16'))")
        array = value if value.dtype.isnative else value.astype(value.dtype.newbyteorder("="))
        return HostArray(c_array(array), value.dtype.name)
    raise TensorIOError(f"input `{name}` is a {type(value).__name__}; pass a numpy array, a HostArray or a number")

# An XG external name: the lexer's NAME token that is not a keyword (`frontend/lexer.py`).
NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
KEYWORDS = frozenset({"import", "def", "return", "if", "else", "with", "match", "extern", "true", "false",
                       "and", "or", "not", "for", "in"})

# 1980-01-01 is the earliest time a zip entry can carry; a fixed stamp keeps `.npz` bytes stable.
ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)



# {name: (XG dtype, shape)}, symbols (str) standing for any size: what the caller will accept.
Expected = Mapping[str, tuple[str, tuple]]



class Budget:
    """Checks each tensor a header declares, before its data is read: against the caller's
    expected signature and against a total byte budget."""

    def __init__(self, where: str, expected: Expected | None, max_bytes: int) -> None:
        self.where, self.expected, self.left, self.max_bytes = where, expected, max_bytes, max_bytes

    def admit(self, name: object, dtype: str, shape: tuple) -> None:
        if self.expected is not None and isinstance(name, str):
            if name not in self.expected:
                raise TensorIOError(f"{self.where}: unknown input `{name}`; the engine takes "
                                    f"{', '.join(f'`{n}`' for n in self.expected) or 'no inputs'}")
            want_dtype, want_shape = self.expected[name]
            if dtype in ITEMSIZE and dtype != want_dtype:
                raise TensorIOError(f"{self.where}: input `{name}` has dtype {dtype}, the engine expects "
                                    f"{want_dtype} (XG never converts implicitly)")
            if len(shape) != len(want_shape):
                raise TensorIOError(f"{self.where}: input `{name}` must have rank {len(want_shape)} "
                                    f"(shape {list(want_shape)}), got shape {list(shape)}")
            for axis, (w, d) in enumerate(zip(want_shape, shape)):
                if isinstance(w, int) and w != d:
                    raise TensorIOError(f"{self.where}: input `{name}` must have shape {list(want_shape)}, "
                                        f"got {list(shape)} (dimension {axis} must be {w})")
        if dtype in ITEMSIZE:
            self.left -= math.prod(shape) * ITEMSIZE[dtype]
            if self.left < 0:
                raise TensorIOError(f"{self.where}: its tensors declare more than {self.max_bytes} bytes "
                                    "(this host's memory); refused before reading them")


def host_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):     # not POSIX: no budget beyond the file's own
        return 1 << 62


_O_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
KIND_NAMES = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
               (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def open_regular(path: Path, role: str) -> BinaryIO:
    """`path` opened for reading, once it is known to be a regular file. O_NONBLOCK keeps a FIFO
    from blocking the open; the check is on the opened file, so a swap after it changes nothing."""
    try:
        fd = os.open(path, os.O_RDONLY | _O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0))
    except FileNotFoundError:
        raise TensorIOError(f"{role} {path} does not exist") from None
    except OSError as e:
        # A socket cannot be opened at all (ENXIO): say what it is rather than the errno.
        with contextlib.suppress(OSError):
            if stat.S_ISSOCK(os.stat(path).st_mode):
                raise TensorIOError(f"{role} {path} is not a regular file (a socket)") from None
        raise TensorIOError(f"cannot read {role} {path}: {e.strerror or e}") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        kind = next((f" ({name})" for test, name in KIND_NAMES if test(mode)), "")
        raise TensorIOError(f"{role} {path} is not a regular file{kind}")
    if _O_NONBLOCK:
        os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def fd_path(f: BinaryIO) -> str:
    """A path that opens the very file `f` has open (Linux's /proc), for libraries that take a path."""
    proc = f"/proc/self/fd/{f.fileno()}"
    if not os.path.exists(proc):
        raise TensorIOError("sliced loading needs /proc/self/fd (Linux)")
    return proc



def suffix_of(path: Path, role: str) -> str:
    suffix = path.suffix.lower()
    if suffix not in SUFFIXES:
        raise TensorIOError(f"{role} {path}: unknown suffix {path.suffix or '(none)'!r}; "
                            f"supported: {', '.join(SUFFIXES)}")
    return suffix


def format_hint(f: BinaryIO, suffix: str) -> str:
    """" (it looks like ...)" when the first bytes point to another format; a guess, never an error."""
    actual = None
    with contextlib.suppress(Exception):
        f.seek(0)
        head = f.read(9)
        if head.startswith(b"PK\x03\x04"):
            with zipfile.ZipFile(f) as zf:
                names = zf.namelist()
            actual = (".pt" if any(n.endswith("data.pkl") for n in names)
                      else ".npz" if names and all(n.endswith(".npy") for n in names) else None)
        elif head[8:9] == b"{" and int.from_bytes(head[:8], "little") < 10**8:  # safetensors header
            actual = ".safetensors"
    if actual is None or actual == suffix.replace(".pth", ".pt"):
        return ""
    return f" (it looks like a {FORMAT_NAMES[actual]}; name it {actual})"


# torch's weights_only refusal is a paragraph around one useful line; these are the other lines.
_TORCH_BOILERPLATE = ("Weights only load failed", "Please file an issue", "Check the documentation")


def summarize(e: BaseException) -> str:
    """One short line from a parser exception: its first informative sentence."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    informative = [line for line in lines if not line.startswith(_TORCH_BOILERPLATE)]
    line = (informative or lines or [type(e).__name__])[0].split(". ")[0].removesuffix(".")
    if str(e).startswith("Weights only load failed"):
        line = f"refused by the weights-only unpickler ({line})"
    return line if len(line) <= 200 else line[:197] + "..."



def check_output(path: Path, where: str) -> None:
    """Refuse to replace anything but a regular file: the new file would take the place of a FIFO,
    a device or a link (never write through it, as os.replace swaps names), which is not what a
    user who named one meant; a directory would fail late."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    except OSError as e:
        raise TensorIOError(f"cannot write {where}: {e.strerror or e}") from None
    if stat.S_ISLNK(mode):
        raise TensorIOError(f"cannot write {where}: it is a symbolic link; XG replaces output files "
                            "whole and does not replace links (name the link's target, or remove it)")
    if not stat.S_ISREG(mode):
        kind = next((name for test, name in KIND_NAMES if test(mode)), "not a regular file")
        raise TensorIOError(f"cannot write {where}: it is {kind}, not a regular file")


def write_atomic(path: Path, where: str, write: Callable[[BinaryIO], None]) -> None:
    # Write a temp file in the same directory and os.replace it over the target: a reader (or a
    # crash) sees the old file or the new one, never half of one. os.open with mode 0o666 lets the
    # umask apply, as for a plain open(); mkstemp would leave the output 0600.
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        raise TensorIOError(f"cannot write {where}: {e.strerror or e}") from None
    except TensorIOError:
        raise
    except Exception as e:  # noqa: BLE001 - a library refusing the data, said in one line
        raise TensorIOError(f"cannot write {where}: {summarize(e)}") from None
    finally:
        tmp.unlink(missing_ok=True)  # a no-op once os.replace has moved it



def read_npz(f: BinaryIO, size: int, budget: Budget) -> list[tuple[str, np.ndarray]]:
    with zipfile.ZipFile(f) as zf:
        infos = zf.infolist()
        # Every member's .npy header first: its dtype and shape, checked against the caller's
        # signature, and the size they imply against the size the zip records (which bounds what
        # inflating it can produce), before any array is inflated.
        for info in infos:
            if not info.filename.endswith(".npy"):
                raise ValueError(f"entry {info.filename!r} is not a .npy array")
            with zf.open(info) as member:
                version = np.lib.format.read_magic(member)
                read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                               else np.lib.format.read_array_header_2_0)
                shape, _, dtype = read_header(member, max_header_size=NPY_MAX_HEADER)
                offset = member.tell()
            name = info.filename[:-4]
            if dtype.hasobject:
                raise ValueError("Object arrays cannot be loaded when allow_pickle=False")
            if dtype.name not in ITEMSIZE:  # also catches strings, structs, datetimes
                raise ValueError(f"array {name!r} has dtype {dtype}, which XG lacks")
            if offset + math.prod(shape) * dtype.itemsize != info.file_size:
                raise ValueError(f"array {name!r} is {dtype}{list(shape)} by its header, "
                                 f"{math.prod(shape) * dtype.itemsize} bytes, but its zip entry holds "
                                 f"{info.file_size - offset}")
            budget.admit(name, dtype.name, tuple(shape))
        out = []
        for info in infos:
            with zf.open(info) as member:
                array = np.lib.format.read_array(member, allow_pickle=False, max_header_size=NPY_MAX_HEADER)
            if not array.dtype.isnative:
                array = array.astype(array.dtype.newbyteorder("="))
            out.append((info.filename[:-4], array))
    return out



def safetensors_specs(f: BinaryIO, size: int) -> list[TensorSpec]:
    head = f.read(8)
    length = int.from_bytes(head, "little") if len(head) == 8 else 0
    head += f.read(min(length, MAX_HEADER, max(size - 8, 0)))
    return safetensors_header(head, size)[1]




def load_host_tensors(path: Path, *, role: str = "inputs file", expected: Expected | None = None,
                      max_bytes: int | None = None) -> dict[str, HostArray]:
    """`tensor_io.load_tensors` without torch: `.npz` or `.safetensors` into `{name: HostArray}`,
    names in file order, with the same checks and messages. `.pt` is refused: reading it takes torch."""
    path = Path(path)
    suffix = suffix_of(path, role)
    where = f"{role} {path}"
    if suffix in (".pt", ".pth"):
        raise TensorIOError(f"{where}: reading a PyTorch file needs torch, which the deploy runtime does "
                            "without; pass .npz or .safetensors")
    invalid = f"{where} is not a valid {FORMAT_NAMES[suffix]}"
    with open_regular(path, role) as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            raise TensorIOError(f"{invalid}: the file is empty")
        budget = Budget(where, expected, host_memory() if max_bytes is None else max_bytes)
        try:
            raw = (read_npz(f, size, budget) if suffix == ".npz" else
                   [(n, HostArray(a, d)) for n, a, d in read_safetensors_arrays(f, size, budget)])
        except TensorIOError:
            raise
        except OSError as e:
            raise TensorIOError(f"cannot read {where}: {e.strerror or e}") from None
        except Exception as e:  # noqa: BLE001 (a parser's many error types: the file is bad, and why)
            raise TensorIOError(f"{invalid}: {summarize(e)}{format_hint(f, suffix)}") from None
    out: dict[str, HostArray] = {}
    for name, a in raw:
        if not isinstance(name, str) or not NAME_RE.fullmatch(name) or name in KEYWORDS:
            raise TensorIOError(f"{where}: name {name!r} is not an XG identifier "
                                "(letters, digits and `_`, not starting with a digit, not a keyword)")
        if name in out:
            raise TensorIOError(f"{where}: name {name!r} appears twice")
        out[name] = a if isinstance(a, HostArray) else HostArray(c_array(a), a.dtype.name)
    return out


def read_safetensors_arrays(f: BinaryIO, size: int, budget: Budget) -> list[tuple[str, np.ndarray, str]]:
    """(name, numpy array, XG dtype) of each tensor in a safetensors file, its header checked first."""
    specs = safetensors_specs(f, size)
    for spec in specs:
        budget.admit(spec.name, spec.dtype, spec.shape)
    f.seek(0)
    data = np.empty(size, dtype=np.uint8)   # read, not mapped (the file may be replaced while the engine
    if f.readinto(memoryview(data)) != size:    # runs), once: the arrays are views of this buffer
        raise ValueError("the file changed size while it was read")
    base = 8 + int.from_bytes(data[:8].tobytes(), "little")
    out = []
    for spec in specs:
        flat = np.frombuffer(data, dtype=NUMPY_DTYPES[spec.dtype], count=math.prod(spec.shape),
                             offset=base + spec.start).reshape(spec.shape)
        out.append((spec.name, flat if flat.flags.aligned else flat.copy(), spec.dtype))
    return out


def safetensors_bytes(tensors: Mapping[str, HostArray]) -> bytes:
    """A safetensors file's bytes (`safetensors_pieces` joined)."""
    return b"".join(bytes(p) for p in safetensors_pieces(tensors))


def safetensors_pieces(tensors: Mapping[str, HostArray]) -> list:
    """A safetensors file, in pieces to write one after another (no copy of the data), as the library writes it (`safetensors.torch.save`, no metadata): tensors
    ordered by dtype (the library's enum order, descending) then name; the header padded with
    spaces to 8 bytes.
    A test holds the two byte for byte."""
    order = sorted(tensors, key=lambda n: (-_ST_RANK[tensors[n].dtype], n))
    header, offset = {}, 0
    for name in order:
        a = tensors[name]
        n = a.array.nbytes
        header[name] = {"dtype": SAFETENSORS_CODES[a.dtype], "shape": list(a.shape), "data_offsets": [offset, offset + n]}
        offset += n
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return [len(text).to_bytes(8, "little") + text, *(_le_bytes(tensors[n].array) for n in order)]


# The safetensors library's Dtype enum order (its sort key), for the dtypes XG has.
_ST_RANK = {"bool": 0, "uint8": 1, "int8": 2, "int16": 5, "float16": 7, "bfloat16": 8, "int32": 9,
            "float32": 11, "float64": 12, "int64": 13}


def _le_bytes(a: np.ndarray) -> memoryview:
    """The little-endian bytes of `a`'s elements in C order, without a copy where it has them."""
    if sys.byteorder == "big" and a.dtype.itemsize > 1:
        a = a.astype(a.dtype.newbyteorder("<"))
    return memoryview(c_array(a).reshape(-1).view(np.uint8))


def write_npz(f: BinaryIO, arrays: Mapping[str, np.ndarray]) -> None:
    # Written by hand rather than np.savez: savez stamps each entry with the current time.
    with zipfile.ZipFile(f, "w", compression=zipfile.ZIP_STORED) as zf:
        for name, array in arrays.items():
            info = zipfile.ZipInfo(name + ".npy", date_time=ZIP_EPOCH)
            info.create_system = 3  # Unix; the default depends on the writing platform
            info.external_attr = 0o100644 << 16
            # Entries over 2 GiB need zip64 headers, and zipfile must know before it streams.
            with zf.open(info, "w", force_zip64=array.nbytes > 2**30) as out:
                np.lib.format.write_array(out, array, allow_pickle=False)


def save_host_tensors(path: Path, tensors: Mapping[str, HostArray], *, role: str = "output file") -> None:
    """`tensor_io.save_tensors` without torch, for `.npz` and `.safetensors`: the same bytes."""
    path = Path(path)
    suffix = suffix_of(path, role)
    where = f"{role} {path}"
    if suffix in (".pt", ".pth"):
        raise TensorIOError(f"{where}: writing a PyTorch file needs torch; write .npz or .safetensors")
    check_output(path, where)
    ordered = {name: tensors[name] for name in sorted(tensors, key=str)}
    for name, a in ordered.items():
        if suffix == ".npz" and a.dtype == "bfloat16":
            raise TensorIOError(f"{where}: tensor {name!r} is bfloat16, which .npz cannot store; use .safetensors")
    if suffix == ".npz":
        write_atomic(path, where, lambda f: write_npz(f, {n: a.array for n, a in ordered.items()}))
    else:
        write_atomic(path, where, lambda f: [f.write(piece) for piece in safetensors_pieces(ordered)])


def describe_host(a: HostArray) -> dict[str, object]:
    """`tensor_io.describe` of a HostArray: the same checksum (sha256 of the little-endian bytes)."""
    return {"shape": list(a.shape), "dtype": a.dtype, "checksum": hashlib.sha256(_le_bytes(a.array)).hexdigest()[:16]}


def random_host_inputs(signature: Mapping[str, tuple[str, tuple[int, ...]]], seed: int,
                       ranges: Mapping[str, tuple[int, int]] | None = None) -> dict[str, HostArray]:
    """Seeded inputs from numpy's PCG64, the same bits on any machine (not `tensor_io.random_inputs`'
    values, which come from torch's generator): floats standard normal rounded to float32 then
    cast, ints uniform in [-8, 8) ([0, 16) for uint8; an index input's range where given), bools
    fair coin flips; each input seeded from sha256 of (seed, name)."""
    total = sum(math.prod(shape) * ITEMSIZE[dtype] for dtype, shape in signature.values() if dtype in ITEMSIZE)
    if total > host_memory():
        raise TensorIOError(f"random inputs for this engine would take {total} bytes, more than this host's "
                            f"memory ({host_memory()}); pass --inputs, or smaller --dim sizes")
    out = {}
    for name, (dtype, shape) in signature.items():
        if dtype not in ITEMSIZE:
            raise TensorIOError(f"input {name!r}: unknown dtype {dtype!r}")
        digest = hashlib.sha256(f"xg.random_inputs\0{seed}\0{name}".encode()).digest()
        g = np.random.Generator(np.random.PCG64(int.from_bytes(digest[:8], "little") >> 1))
        shape = tuple(shape)
        if dtype in ("float16", "bfloat16", "float32", "float64"):
            x = g.standard_normal(shape).astype(np.float32)
            array = bf16_bits(x) if dtype == "bfloat16" else x.astype(NUMPY_DTYPES[dtype])
        elif dtype == "bool":
            array = g.integers(0, 2, shape).astype(np.bool_)
        else:
            low, high = (0, 16) if dtype == "uint8" else (-8, 8)
            if ranges and name in ranges:
                low, high = ranges[name]
            array = g.integers(low, high, shape).astype(NUMPY_DTYPES[dtype])
        out[name] = HostArray(c_array(array), dtype)
    return out


def bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bits, rounded to nearest even (as torch's .to(torch.bfloat16))."""
    u = c_array(x, np.float32).view(np.uint32)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(x)
    return np.where(nan, np.uint16(0x7FC0), rounded) if nan.any() else rounded


def float_view(a: HostArray) -> np.ndarray:
    """A floating HostArray's values as numpy floats (bfloat16 widened exactly to float32)."""
    if a.dtype == "bfloat16":
        return (a.array.astype(np.uint32) << 16).view(np.float32)
    return a.array
