"""GPU hardware profiles: the typed, validated view of the `hw/*.toml` data files.

Owns: reading one TOML file per GPU from the hw directory (the one passed, `Settings.hw_dir` as
the entry points hand it down, or else the built-in profiles in the repo's `hw/`; never the
environment), checking every field's type and range, resolving a target name or alias
case-insensitively, and the canonical dict of a profile that cache keys and engine manifests
embed. It knows nothing about kernels or cost models: the tuner and the planner read the numbers.

Every value in a file carries a citation in its `[sources]` table, keyed by field name (dotted for
table members: `"peak_flops.bf16"`). Only `name` and `aliases`, which are XG's own naming, need
none. Peak FLOP/s are dense (no 2:4 sparsity); a peak of 0 means the GPU has no such mode.

Parsed directories are cached per (directory, each file's name, mtime and size), so repeated loads
are cheap and an edited file is re-read; that cache is the only module state.
"""

from __future__ import annotations

import difflib
import functools
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping

from xgbuild.settings import BUILTIN_HW_DIR


class HardwareProfileError(ValueError):
    """A profile file is malformed: invalid TOML, a missing, unknown or ill-typed field, a bad value."""


class UnknownTargetError(ValueError):
    """No profile has the requested name or alias."""


@dataclass(frozen=True)
class PeakFlops:
    """Dense peak throughput in FLOP/s per math mode; 0 where the GPU lacks the mode."""

    fp32: float  # CUDA cores, no tensor cores
    tf32: float
    bf16: float
    fp16: float
    fp8: float


@dataclass(frozen=True)
class Interconnect:
    """How one GPU reaches its peers (`kind`, e.g. NVLink4, or PCIe4 when there is no NVLink) and its host."""

    kind: str
    bandwidth_bytes_per_s: float       # per GPU, both directions together
    pcie_gen: int
    pcie_bandwidth_bytes_per_s: float  # x16, both directions together


@dataclass(frozen=True)
class Measured:
    """Optional figures measured on real hardware; the peaks above stay the datasheet values."""

    copy_bandwidth_bytes_per_s: float | None = None  # device-to-device copy, bytes read + written
    bf16_matmul_flops_per_s: float | None = None     # a large bf16 matmul
    usable_memory_bytes: int | None = None           # what the driver reports as total memory


# XG dtype (or math-mode name) -> PeakFlops field.
_DTYPE_MODES = {
    "float32": "fp32", "fp32": "fp32", "tf32": "tf32",
    "bfloat16": "bf16", "bf16": "bf16", "float16": "fp16", "fp16": "fp16",
    "float8": "fp8", "float8_e4m3": "fp8", "float8_e5m2": "fp8", "fp8": "fp8",
}


@dataclass(frozen=True)
class GpuProfile:
    """One GPU target. Equality and hashing ignore `aliases` and `sources`, like `to_dict`."""

    name: str
    vendor: str
    arch: str                          # "sm_90"
    compute_capability: tuple[int, int]
    sm_count: int
    max_shared_memory_per_sm_bytes: int
    max_shared_memory_per_block_bytes: int  # the opt-in maximum for one block
    registers_per_sm: int              # 32-bit registers
    max_registers_per_thread: int
    max_threads_per_sm: int
    warp_size: int
    l2_bytes: int
    memory_kind: str                   # "HBM3", "GDDR6X", ...
    hbm_bytes: int                     # device memory, decimal datasheet capacity
    hbm_bandwidth_bytes_per_s: float
    clock_boost_mhz: int
    peak_flops: PeakFlops
    interconnect: Interconnect
    measured: Measured = Measured()
    aliases: tuple[str, ...] = field(default=(), compare=False)
    sources: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}),
                                       compare=False, repr=False)

    @property
    def sm(self) -> int:
        """The arch number: 90 for "sm_90"."""
        return int(self.arch.removeprefix("sm_"))

    def to_dict(self) -> dict[str, Any]:
        """A canonical JSON-able dict of every field but `aliases` and `sources` (no paths)."""
        out: dict[str, Any] = {name: getattr(self, name) for name in _SCALAR_FIELDS}
        out["compute_capability"] = list(self.compute_capability)
        out["peak_flops"] = {k: float(getattr(self.peak_flops, k)) for k in _PEAK_FIELDS}
        out["interconnect"] = {k: getattr(self.interconnect, k) for k in _INTERCONNECT_FIELDS}
        out["measured"] = {k: getattr(self.measured, k) for k in _MEASURED_FIELDS}
        return out

    def peak_flops_for(self, dtype: str, *, tf32: bool = False) -> float:
        """Dense peak FLOP/s for matmuls in `dtype`; float32 uses TF32 tensor cores only if asked."""
        mode = _DTYPE_MODES.get(dtype.lower())
        if mode is None:
            known = ", ".join(sorted(_DTYPE_MODES))
            raise ValueError(f"no peak FLOP/s for dtype {dtype!r}; known dtypes: {known}")
        if mode == "fp32" and tf32:
            mode = "tf32"
        peak = getattr(self.peak_flops, mode)
        if peak <= 0:
            raise ValueError(f"{self.name} has no {mode} math mode (peak_flops.{mode} = 0)")
        return peak


_SCALAR_FIELDS = ("name", "vendor", "arch", "sm_count", "max_shared_memory_per_sm_bytes",
                  "max_shared_memory_per_block_bytes", "registers_per_sm",
                  "max_registers_per_thread", "max_threads_per_sm", "warp_size", "l2_bytes",
                  "memory_kind", "hbm_bytes", "hbm_bandwidth_bytes_per_s", "clock_boost_mhz")
_INT_FIELDS = ("sm_count", "max_shared_memory_per_sm_bytes", "max_shared_memory_per_block_bytes",
               "registers_per_sm", "max_registers_per_thread", "max_threads_per_sm", "warp_size",
               "l2_bytes", "hbm_bytes", "clock_boost_mhz")
_PEAK_FIELDS = ("fp32", "tf32", "bf16", "fp16", "fp8")
_INTERCONNECT_FIELDS = ("kind", "bandwidth_bytes_per_s", "pcie_gen", "pcie_bandwidth_bytes_per_s")
_MEASURED_FIELDS = ("copy_bandwidth_bytes_per_s", "bf16_matmul_flops_per_s", "usable_memory_bytes")
# Every top-level field but `name` and `aliases` (XG's own naming, not facts about the hardware)
# needs a citation, as does each member of the tables.
_SOURCED_FIELDS = ("vendor", "arch", "compute_capability") + tuple(
    f for f in _SCALAR_FIELDS if f not in ("name", "vendor", "arch"))
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


class _Table:
    """Typed reads from one TOML table; every error names the file and the dotted field."""

    def __init__(self, path: Path, data: Mapping[str, Any], prefix: str = "") -> None:
        self.path, self.data, self.prefix, self.seen = path, data, prefix, set()

    def fail(self, key: str, problem: str) -> HardwareProfileError:
        return HardwareProfileError(f"{self.path}: field `{self.prefix}{key}` {problem}")

    def get(self, key: str, kinds: tuple[type, ...], what: str, required: bool = True) -> Any:
        self.seen.add(key)
        if key not in self.data:
            if required:
                raise self.fail(key, "is missing")
            return None
        value = self.data[key]
        # bool is an int subclass: `sm_count = true` must not pass as 1.
        if isinstance(value, bool) or not isinstance(value, kinds):
            raise self.fail(key, f"must be {what}, got {type(value).__name__} {value!r}")
        return value

    def text(self, key: str) -> str:
        value = self.get(key, (str,), "a string")
        if not value.strip():
            raise self.fail(key, "must not be empty")
        return value

    def integer(self, key: str, minimum: int = 1, required: bool = True) -> int | None:
        value = self.get(key, (int,), "an integer", required)
        if value is not None and value < minimum:
            raise self.fail(key, f"must be at least {minimum}, got {value}")
        return value

    def number(self, key: str, minimum: float = 0.0, strict: bool = True,
               required: bool = True) -> float | None:
        value = self.get(key, (int, float), "a number", required)
        if value is None:
            return None
        if not minimum <= value < float("inf") or (strict and value == minimum):
            bound = "greater than" if strict else "at least"
            raise self.fail(key, f"must be finite and {bound} {minimum:g}, got {value!r}")
        return float(value)

    def table(self, key: str, required: bool = True) -> _Table | None:
        value = self.get(key, (dict,), "a table", required)
        return None if value is None else _Table(self.path, value, f"{self.prefix}{key}.")

    def no_extras(self) -> None:
        for key in sorted(set(self.data) - self.seen):
            raise self.fail(key, "is not a known field")


def _parse(path: Path) -> GpuProfile:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise HardwareProfileError(f"{path}: invalid TOML: {exc}") from None
    top = _Table(path, data)
    name = top.text("name")
    if not _NAME_RE.fullmatch(name):
        raise top.fail("name", f"must be letters, digits, '-', '_' or '.', got {name!r}")
    aliases = top.get("aliases", (list,), "a list of strings", required=False) or []
    if not all(isinstance(a, str) and a.strip() for a in aliases):
        raise top.fail("aliases", f"must be a list of non-empty strings, got {aliases!r}")
    cc = top.get("compute_capability", (list,), "a list [major, minor]")
    if len(cc) != 2 or not all(type(x) is int and x >= 0 for x in cc) or cc[0] < 1:
        raise top.fail("compute_capability", f"must be [major, minor] with major >= 1, got {cc!r}")
    arch = top.text("arch")
    if arch != f"sm_{cc[0]}{cc[1]}":
        raise top.fail("arch", f"is {arch!r} but compute_capability {cc} means 'sm_{cc[0]}{cc[1]}'")
    texts = {key: top.text(key) for key in ("vendor", "memory_kind")}
    ints = {key: top.integer(key) for key in _INT_FIELDS}
    if ints["warp_size"] & (ints["warp_size"] - 1):
        raise top.fail("warp_size", f"must be a power of two, got {ints['warp_size']}")
    for small, big in (("max_shared_memory_per_block_bytes", "max_shared_memory_per_sm_bytes"),
                       ("max_registers_per_thread", "registers_per_sm")):
        if ints[small] > ints[big]:
            raise top.fail(small, f"({ints[small]}) exceeds `{big}` ({ints[big]})")
    hbm_bandwidth = top.number("hbm_bandwidth_bytes_per_s")

    peaks_t = top.table("peak_flops")
    # fp32 runs on the CUDA cores every GPU has; a tensor-core mode may be absent (0).
    peaks = PeakFlops(**{k: peaks_t.number(k, strict=(k == "fp32")) for k in _PEAK_FIELDS})
    link_t = top.table("interconnect")
    link = Interconnect(kind=link_t.text("kind"),
                        bandwidth_bytes_per_s=link_t.number("bandwidth_bytes_per_s"),
                        pcie_gen=link_t.integer("pcie_gen"),
                        pcie_bandwidth_bytes_per_s=link_t.number("pcie_bandwidth_bytes_per_s"))
    measured_t = top.table("measured", required=False) or _Table(path, {}, "measured.")
    measured = Measured(
        copy_bandwidth_bytes_per_s=measured_t.number("copy_bandwidth_bytes_per_s", required=False),
        bf16_matmul_flops_per_s=measured_t.number("bf16_matmul_flops_per_s", required=False),
        usable_memory_bytes=measured_t.integer("usable_memory_bytes", required=False))

    sources_t = top.table("sources")
    needed = list(_SOURCED_FIELDS) + [f"peak_flops.{k}" for k in _PEAK_FIELDS]
    needed += [f"interconnect.{k}" for k in _INTERCONNECT_FIELDS]
    needed += [f"measured.{k}" for k in _MEASURED_FIELDS if k in measured_t.data]
    sources = {key: sources_t.text(key) for key in needed}
    for table in (peaks_t, link_t, measured_t, sources_t, top):
        table.no_extras()
    return GpuProfile(
        name=name, arch=arch, compute_capability=(cc[0], cc[1]), **texts, **ints,
        hbm_bandwidth_bytes_per_s=hbm_bandwidth, peak_flops=peaks, interconnect=link,
        measured=measured, aliases=tuple(aliases),
        sources=MappingProxyType(dict(sorted(sources.items()))))


def _key(name: str) -> str:
    """Lookup form of a name: case-folded, without spaces, '-' and '_' ("RTX-4090" -> "rtx4090")."""
    return re.sub(r"[\s_-]+", "", name).casefold()


def _resolve_dir(hw_dir: Path | None) -> Path:
    hw_dir = Path(hw_dir) if hw_dir is not None else BUILTIN_HW_DIR
    if not hw_dir.is_dir():
        raise HardwareProfileError(f"{hw_dir}: hardware profile directory not found")
    return hw_dir.resolve()


def _stamp(hw_dir: Path) -> tuple[tuple[str, int, int], ...]:
    """What the cache is keyed on besides the directory: each file's name, mtime and size."""
    stats = ((p.name, p.stat()) for p in sorted(hw_dir.glob("*.toml")))
    return tuple((name, st.st_mtime_ns, st.st_size) for name, st in stats)


@functools.lru_cache(maxsize=16)
def _load_dir(hw_dir: Path, stamp: tuple[tuple[str, int, int], ...]
              ) -> tuple[Mapping[str, GpuProfile], Mapping[str, str]]:
    """(canonical name -> profile, lookup key -> canonical name) for every file in `hw_dir`."""
    profiles: dict[str, GpuProfile] = {}
    lookup: dict[str, str] = {}
    owner: dict[str, Path] = {}
    for file_name, _, _ in stamp:
        path = hw_dir / file_name
        profile = _parse(path)
        for label in (profile.name, *profile.aliases):
            key = _key(label)
            if key in lookup and lookup[key] != profile.name:
                raise HardwareProfileError(
                    f"{path}: name or alias {label!r} is already used by {owner[key]}")
            lookup[key], owner[key] = profile.name, path
        profiles[profile.name] = profile
    return MappingProxyType(profiles), MappingProxyType(lookup)


def _profiles(hw_dir: Path | None) -> tuple[Mapping[str, GpuProfile], Mapping[str, str]]:
    resolved = _resolve_dir(hw_dir)
    return _load_dir(resolved, _stamp(resolved))


def known_targets(hw_dir: Path | None = None) -> list[str]:
    """Canonical names of every profile in `hw_dir` (default: the built-in profiles), sorted."""
    return sorted(_profiles(hw_dir)[0])


def load_profile(name: str, hw_dir: Path | None = None) -> GpuProfile:
    """The profile in `hw_dir` (default: the built-in profiles) whose name or alias is `name`,
    ignoring case, spaces, '-' and '_'."""
    profiles, lookup = _profiles(hw_dir)
    canonical = lookup.get(_key(name))
    if canonical is not None:
        return profiles[canonical]
    message = f"unknown target GPU {name!r}; known targets: {', '.join(sorted(profiles))}"
    close = difflib.get_close_matches(_key(name), list(lookup), n=1, cutoff=0.6)
    if close:
        message += f"; did you mean {lookup[close[0]]!r}?"
    raise UnknownTargetError(message)
