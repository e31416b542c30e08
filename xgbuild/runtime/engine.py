"""The engine a program compiles to, in memory: load, save, check inputs, run.

An `Engine` wraps a verified `EngineFile` (the build writes them: xgbuild/build/package.py) and
the `RunSettings` it runs with. `run` checks the inputs against the signature (names,
dtypes, ranks, fixed dims, one size per symbol, device), specialises the IR to their shapes once
per (shapes, dtypes) and caches it, then runs the executor for the device.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np
import torch

from ..compiler.ir.graph import Graph
from ..compiler.ir.lower import ERROR_CODES
from ..errors import EngineError, ExecutionError, InputError, XGError
from ..packager.engine_file import EngineFile, save_engine_file
from ..packager.signing import Envelope, Trust, TrustedKeys
from ..packager.weights import load_weights
from ..settings import RunSettings
from .cpu import CpuExecutor
from .extern import admit
from .native import EngineView, engine_trust, open_engine  # noqa: F401 (engine_trust: part of this module's API)
from .summary import RunMetadata, engine_summary
from .verdicts import input_in_range
from ..dtypes import TORCH_DTYPES, XG_NAMES


@dataclass(frozen=True)
class ResultValue:
    """What a `Result[T]` output becomes: `ok`, and either `value` or the `error` name."""
    ok: bool
    value: Any
    error: str | None


class RunResult:
    """What a run returns: `value` (what main returns: a tensor, a Python scalar, a tuple, a
    ResultValue), `metadata` (how it ran) and `tensors` (every output leaf, dtype kept: `out`, or
    `out_0`, `out_1`, ... for tuples, `out_ok` / `out_value` for results).

    A GPU run that did not wait (the default) is queued when this is returned: reading `value` or
    `tensors` (or `wait()`) waits for it and for its check, raising the check's error here."""

    def __init__(self, value: Any, metadata: dict, tensors: dict[str, torch.Tensor] | None = None,
                 settle: Callable[[], Any] | None = None) -> None:
        self._value = value
        # Still the dict every caller indexes; printed, a short summary (runtime/summary.py).
        self.metadata = metadata if isinstance(metadata, RunMetadata) else RunMetadata(metadata)
        self._tensors = tensors if tensors is not None else {}
        self._settle = settle
        self._failed: BaseException | None = None

    def wait(self) -> "RunResult":
        """Wait for the run and its check (an error of the check raises here, every time it is asked)."""
        if self._failed is not None:
            raise self._failed
        if self._settle is not None:
            try:
                self._value = self._settle()
            except XGError as exc:
                self._failed = exc
                raise
            self._settle = None
        return self

    @property
    def value(self) -> Any:
        return self.wait()._value

    @property
    def tensors(self) -> dict[str, torch.Tensor]:
        return self.wait()._tensors

    def __repr__(self) -> str:
        if self._settle is not None:
            return f"RunResult(queued, outputs={sorted(self._tensors)})\n{self.metadata}"
        value = repr(self._value)
        if len(value) > 200:
            value = value[:200] + "…"
        return f"RunResult(value={value}, outputs={sorted(self._tensors)})\n{self.metadata}"


@dataclass
class Engine(EngineView):
    file: EngineFile
    settings: RunSettings = field(default_factory=RunSettings)   # read at the top (CLI, xg), handed in
    _specialised: dict = field(default_factory=dict, repr=False)
    _cuda: dict = field(default_factory=dict, repr=False)        # arch, ("device", index) -> CudaExecutor
    _weights: dict = field(default_factory=dict, repr=False)     # device -> {name: tensor}
    _fast: dict = field(default_factory=dict, repr=False)        # caller's input shapes -> specialised graph
    _descriptions: dict = field(default_factory=dict, repr=False)   # see `_described`
    _names: tuple | None = field(default=None, repr=False)           # the signature's input names
    trust: Trust | None = field(default=None, repr=False)        # set when loaded against trusted keys

    def __repr__(self) -> str:
        # The manifest runs to thousands of characters; `engine.manifest` has it all.
        return engine_summary("Engine", self.manifest, self.digest)

    # --- storing ---------------------------------------------------------------------------------
    @classmethod
    def load(cls, path: Path | str, settings: RunSettings | None = None, *,
             trusted_keys: Path | str | TrustedKeys | None = None, expect_digest: str | None = None,
             allow_fallback: bool = False) -> "Engine":
        """Load and verify an engine file. `trusted_keys` (default: the settings', XG_TRUSTED_KEYS):
        a directory of `.pub` keys, one of which must have signed the engine; `expect_digest`: the
        bundle digest the engine must have. Either refusal is an EngineError naming the reason.
        One that calls PyTorch operators (`fallback="eager"`) is refused unless `allow_fallback`
        or a trusted key signed it: a file is only as trustworthy as whoever could write it
        (runtime/extern.py `admit`); its calls are checked against XG's allow-list either way."""
        settings = settings or RunSettings()
        file, trust = open_engine(path, settings, trusted_keys, expect_digest)
        where = f"engine {path}"
        admit(file.graph, allow_fallback or trust is not None, where)
        return cls(file, settings, trust=trust)

    def check_trust(self, trusted_keys: Path | str | TrustedKeys, where: str = "engine") -> Trust:
        """Whether this engine is signed by one of `trusted_keys` (a verdict, never raises for an
        untrusted engine; a trust root that cannot be read is an EngineError)."""
        return engine_trust(self.file, trusted_keys, where)

    def save(self, path: Path | str, envelope: Envelope | None = None) -> str:
        """Write the engine; `envelope`: signatures and provenance for its trailer (default: the
        ones it was loaded with, if any). Returns the bundle digest."""
        return save_engine_file(self.file, Path(path), envelope)

    # --- inputs ---------------------------------------------------------------------------------
    def prepare_inputs(self, values: Mapping[str, Any] | None, device: str,
                       placeholders: frozenset[str] = frozenset(),
                       pending: list | None = None) -> dict[str, torch.Tensor]:
        """The inputs checked against the signature. Those named in `placeholders` (inputs a
        pipeline rank does not read) may be `meta` tensors: only their shapes and dtypes count.
        `pending`: a GPU input's index range is not read here (a sync before any work is queued,
        the GPU idle meanwhile) but appended, with its min and max still on the device, for
        `check_ranges` after the run: an out-of-range index reads zeros on the GPU, never faults."""
        values = dict(values or {})
        self.check_names(values)
        out: dict[str, torch.Tensor] = {}
        for spec in self.signature:
            name = spec["name"]
            t = _as_tensor(name, values[name])
            got = XG_NAMES.get(t.dtype, str(t.dtype))
            if got != spec["dtype"]:
                raise InputError(f"input `{name}` has dtype {got}, the engine expects {spec['dtype']} "
                                 "(XG never converts implicitly)")
            if name in placeholders and t.device.type == "meta":
                out[name] = t
                continue
            if t.device.type != device:
                raise InputError(f"input `{name}` is on {t.device}, but the engine runs on {device}")
            if "range" in spec and t.numel():
                check = (name, *spec["range"], torch.stack(torch.aminmax(t)))
                if pending is not None and t.device.type == "cuda":
                    pending.append(check)
                else:
                    check_ranges([check])
            out[name] = t
        out.update(self.weights(device))
        return out

    def weights(self, device: str) -> dict[str, torch.Tensor]:
        """The tensors the engine binds itself (imported models' parameters), on `device`, kept."""
        entry = self.manifest.get("weights")
        if not entry:
            return {}
        if device not in self._weights:
            host = self._weights.get("cpu") or load_weights(self.file.entries[entry["path"]])
            self._weights["cpu"] = host
            if device != "cpu":
                self._weights[device] = {k: v.to(device) for k, v in host.items()}
        return self._weights[device]

    def specialised(self, inputs: Mapping[str, torch.Tensor]) -> tuple[Graph, dict, bool]:
        return self.specialise({n: tuple(t.shape) for n, t in inputs.items()},
                               {n: str(t.dtype) for n, t in inputs.items()})

    def _specialised_fast(self, inputs: Mapping[str, torch.Tensor], device: str) -> tuple[Graph, dict, bool]:
        """`specialised`, keyed by the caller's inputs alone: the engine's own weights (a hundred
        and more tensors for an imported model) never change shape, so a run does not describe
        them again (host time the GPU would otherwise wait through)."""
        names = self._names
        if names is None:
            names = self._names = tuple(s["name"] for s in self.signature)
        key = (device, *[(n, inputs[n].dtype, inputs[n].shape) for n in names])   # (the weights never change)
        hit = self._fast.get(key)
        if hit is not None:
            return hit[0], hit[1], True
        graph, env, cached = self.specialised(inputs)
        if len(self._fast) >= 64:
            self._fast.clear()
        self._fast[key] = (graph, env)
        return graph, env, cached

    # --- running --------------------------------------------------------------------------------
    def run(self, external_values: Mapping[str, Any] | None = None, *, device: str = "cpu", check: bool = True,
            float64: bool = False, wait: bool | None = None, profiler: Any = None) -> RunResult:
        """Runs the engine. On cuda the run is queued on torch's current stream and this returns
        without waiting for the GPU (`wait=None`, the default): reading the result's `value` or
        `tensors` waits for it and for its check (NaN/Inf flags, index ranges), and raises the
        check's error there; a failed run nobody reads is reported by the engine's next run or
        `synchronize()`. `wait=True` waits before returning (its timings are then the run's);
        `wait=False` never waits, as a PyTorch op: a scalar output stays a 0-d tensor in `value`,
        and the check is read at the next run or `synchronize()`. On the CPU every run is done when
        this returns. `profiler` (`runtime.profile.Profiler`): this run is one profiled iteration,
        each kernel (on the CPU, each node) timed on its own; on cuda it runs kernel by kernel and waits."""
        if device not in ("cpu", "cuda"):
            raise InputError(f"unknown device {device!r}; use 'cpu' or 'cuda'")
        if device == "cuda":
            if float64:
                raise InputError("float64 mode is the CPU reference: run it with device='cpu'")
            executor = self.cuda_executor(check=check)     # refuses missing kernels or GPU first
        else:
            executor = CpuExecutor(float64=float64, check=check)
        ranges: list = []
        inputs = self.prepare_inputs(external_values, device, pending=ranges)
        if profiler is not None:
            if device == "cuda":
                torch.cuda.synchronize()        # the iteration starts on an idle GPU
            profiler.begin()
            wait = True
        t0 = time.perf_counter()
        graph, env, cached = self._specialised_fast(inputs, device)
        pending = None
        if device == "cuda":
            try:
                out = executor.run(graph, inputs, wait=bool(wait), profiler=profiler, ranges=ranges)
            except ExecutionError:
                check_ranges(ranges)        # a bad input index is the cause to name first
                raise
            pending = out.pending
        else:
            out = executor.run(graph, inputs)
        total_ms = (time.perf_counter() - t0) * 1e3
        if profiler is not None:
            iteration = profiler.iteration
            profiler.end()
            if device == "cpu":
                _profile_ops(profiler, graph, out.timings, iteration)
        metadata = {
            "target": self.manifest["target"],
            "num_gpu": self.manifest["num_gpu"],
            "engine_digest": self.digest,
            "device": device,
            "executor": executor.name + ("-float64" if float64 else ""),
            "check": check,
            "specialization": self._described(graph, env, cached, inputs),
            "timings": {"total_ms": total_ms, "ops": out.timings},
        }
        tensors = _flat(graph.output, out.values)
        if device == "cpu" or wait:
            return RunResult(_build(graph.output, out.values), metadata, tensors)
        if wait is False:
            return RunResult(_build(graph.output, out.values, scalars=False), metadata, tensors)

        def settle() -> Any:            # on the first read of the result
            if pending is not None:
                executor.settle(pending)
            value = _build(graph.output, out.values)
            metadata["timings"]["total_ms"] = (time.perf_counter() - t0) * 1e3   # until the host had it
            return value
        return RunResult(None, metadata, tensors, settle=settle)

    def _described(self, graph: Graph, env: dict, cached: bool, inputs: Mapping[str, torch.Tensor]) -> dict:
        """The metadata's `specialization`: once per specialised graph and input shapes (a run
        with many weights would describe each of them again)."""
        names = self._names or ()
        key = (id(graph), cached, *[(n, inputs[n].dtype, inputs[n].shape) for n in names if n in inputs])
        known = self._descriptions.get(key)
        if known is None or known[0] is not graph:
            if len(self._descriptions) >= 64:
                self._descriptions.clear()
            known = self._descriptions[key] = (graph, {
                "symbols": dict(sorted(env.items())), "cached": cached,
                "inputs": {n: {"dtype": XG_NAMES[t.dtype], "shape": list(t.shape)} for n, t in inputs.items()}})
        return known[1]

    def synchronize(self) -> None:
        """Wait for every queued GPU run of this engine and raise the first failed check among them."""
        for ex in {id(ex): ex for ex in self._cuda.values()}.values():
            torch.cuda.synchronize(ex.device)
            ex.settle()

    def cuda_executor(self, check: bool = True):
        """The GPU executor for this engine on torch's current CUDA device (kept between runs)."""
        ex = self._cuda.get(("device", torch.cuda.current_device())) if torch.cuda.is_initialized() else None
        if ex is not None:              # (every run: the checks below were made for this device)
            ex.check = check
            return ex
        from .cuda import CudaRuntimeError, device_arch
        from .gpu import CudaExecutor
        kernels = self.manifest.get("kernels", [])
        if not kernels and _needs_kernels(self.graph):
            raise EngineError(f"engine {self.digest[:12]} carries no GPU kernels (built with --no-kernels); "
                              "rebuild it with xgc --target=... or run it with --device cpu")
        if not torch.cuda.is_available():
            raise EngineError("--device cuda needs an NVIDIA GPU, and this host has none "
                              "(torch.cuda.is_available() is False); run with --device cpu")
        try:
            arch = device_arch(torch.cuda.current_device())
        except CudaRuntimeError as exc:
            raise EngineError(f"cannot run on cuda: {exc}") from None
        archs = sorted({v["arch"] for k in kernels for v in k["variants"]})
        if archs and arch not in archs:
            raise EngineError(f"engine {self.digest[:12]} carries kernels for "
                              f"{', '.join(f'sm_{a}' for a in archs)} (target {self.manifest['target']}), but this "
                              f"GPU is sm_{arch}: rebuild with xgc --target=<this GPU> or run with --device cpu")
        if arch not in self._cuda:
            from .plans import plans_from_manifest
            self._cuda[arch] = CudaExecutor(plans_from_manifest(self.manifest, self.file.entries),
                                            graphs=self.settings.cuda_graphs)
            self._cuda[arch].kept = self.weights("cuda")
            self._cuda[arch].stable = frozenset(self.weights("cuda"))   # cached on the device: read in place
        ex = self._cuda[("device", torch.cuda.current_device())] = self._cuda[arch]
        ex.check = check
        return ex


def check_ranges(checks: list) -> None:
    """InputError for the first input of `checks` ((name, lo, hi, its [min, max] tensor)) holding an
    index outside [lo, hi); one device read for them all."""
    if not checks:
        return
    values = torch.cat([c[3] for c in checks]).tolist()
    for k, (name, lo, hi, _mm) in enumerate(checks):
        input_in_range(name, lo, hi, values[2 * k], values[2 * k + 1])


def _profile_ops(profiler: Any, graph: Graph, timings: list[dict], iteration: int) -> None:
    """The CPU reference path's node timings as a profiled iteration's spans."""
    from ..compiler.ir.serialize import where
    from .profile import node_cost
    for t in timings:
        n = graph.node(t["id"])
        flops, moved = node_cost(graph, n, lambda d: TORCH_DTYPES[d].itemsize)
        profiler.host_op(f"n{n.id}", f"{n.op.value} %{n.id}", where(n.src) if n.src else f"%{n.id}",
                         t.get("start_ms", 0.0), t["ms"], flops=flops, nbytes=moved, iteration=iteration)


def _needs_kernels(graph: Graph) -> bool:
    from ..compiler.ir.graph import Op
    return any(n.op not in (Op.INPUT, Op.CONST) for n in graph.nodes)


def _as_tensor(name: str, value: Any) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, np.ndarray):
        if value.dtype == object:
            raise InputError(f"input `{name}` is a numpy object array; pass numbers")
        try:
            return torch.from_numpy(value if value.flags.c_contiguous else value.copy(order="C"))
        except TypeError as exc:
            raise InputError(f"input `{name}`: numpy dtype {value.dtype} is not supported ({exc})") from None
    if isinstance(value, bool):
        return torch.tensor(value)
    if isinstance(value, int):
        return torch.tensor(value, dtype=torch.int64)
    if isinstance(value, float):
        return torch.tensor(value, dtype=torch.float32)
    raise InputError(f"input `{name}` is a {type(value).__name__}; pass a torch tensor or a numpy array")


def _scalar(t: torch.Tensor, scalars: bool = True) -> Any:
    return t.item() if scalars and t.dim() == 0 else t


def _flat(tree: dict, values: Mapping[int, torch.Tensor], prefix: str = "out", *,
          partial: bool = False) -> dict[str, torch.Tensor]:
    """The output leaves by their output-file names; `partial`: only those among `values` (a
    pipeline rank's own outputs; a Result only where its tag is there too)."""
    if "t" in tree:
        return {prefix: values[tree["t"]]} if not partial or tree["t"] in values else {}
    if "tuple" in tree:
        out: dict[str, torch.Tensor] = {}
        for i, item in enumerate(tree["tuple"]):
            out.update(_flat(item, values, f"{prefix}_{i}", partial=partial))
        return out
    if partial and tree["result"]["tag"] not in values:
        return {}
    tag = values[tree["result"]["tag"]]
    out = {f"{prefix}_ok": tag == 0}
    if int(tag) == 0:
        out.update(_flat(tree["result"]["value"], values, f"{prefix}_value", partial=partial))
    return out


def _build(tree: dict, values: dict[int, torch.Tensor], scalars: bool = True) -> Any:
    """What main returns, from its output values; 0-d values as Python numbers (`scalars`) or
    left tensors (a run that does not wait for the GPU)."""
    if "t" in tree:
        return _scalar(values[tree["t"]], scalars)
    if "tuple" in tree:
        return tuple(_build(t, values, scalars) for t in tree["tuple"])
    tag = int(values[tree["result"]["tag"]])
    if tag == 0:
        return ResultValue(True, _build(tree["result"]["value"], values, scalars), None)
    names = {v: k for k, v in ERROR_CODES.items()}
    return ResultValue(False, None, names.get(tag, f"error {tag}"))


__all__ = ["Engine", "ExecutionError", "ResultValue", "RunResult"]
