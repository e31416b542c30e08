"""The deploy runtime: an engine's kernels on a GPU with neither torch nor Triton nor the compiler.

What a deploy host needs of XG is the engine reader (`packager/`), the launch ABI the build used
(`compiler/codegen/launch.py`: the same binding, variant choice and grid as the torch-backed
executor), the CUDA driver through cuda-python (`device.py`, `cuda.py`) and numpy for files
(`host_io.py`). `NativeEngine.load` opens and verifies an engine as `Engine.load` does; `run`
binds inputs (numpy arrays, `HostArray`s, `DeviceArray`s, or anything with a CUDA Array
Interface), launches the kernels on the device's stream and returns the outputs on the device.

A second run of the engine in one process reuses its loaded modules, its weights on the device
and (through the driver's memory pool) the memory of the first run's buffers.

Left to the torch-backed executor (`gpu.py`): engines that call PyTorch operators (fallback
"eager"), several ranks, CUDA graph capture and launch replay; the CPU reference path.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from ..compiler.codegen.launch import bind, choose, grid_for
from ..compiler.codegen.launch_abi import ExternStep, KernelPlan, arguments
from ..compiler.codegen.schedule import VIEWS
from ..compiler.ir.graph import COLLECTIVE, Graph, Node, Op, tree_ids
from ..compiler.ir.serialize import where as src_text
from ..compiler.passes.specialize import SpecializationError, bind_symbols, specialize
from ..dtypes import FLOAT_DTYPES
from ..errors import EngineError, ExecutionError, InputError, XGError
from ..packager.engine_file import EngineFile, read_engine
from ..packager.manifest import check_sizes
from ..packager.signing import (TrustedKeys, Trust, digest_problem, load_trusted_keys, normal_digest,
                                trust_verdict, SigningError)
from ..packager.weights import safetensors_header
from ..settings import RunSettings
from .lifetimes import computed_gathers, frees, release, shape_only_gathers
from . import dlpack
from .device import CudaDevice, CudaEvent, DeviceArray
from .foreign import cai_dtype, cuda_array_interface, dlpack_device, from_cai
from .replay import Replay, record, remember, replay_args
from .host_io import NUMPY_DTYPES, HostArray, TensorIOError, as_host, c_array, float_view


# --- opening an engine (shared with the torch-backed `Engine.load`) ------------------------------

def engine_trust(file: EngineFile, trusted_keys: Path | str | TrustedKeys, where: str) -> Trust:
    """The trust verdict of a loaded engine file against a trust root (a directory or its keys)."""
    try:
        keys = trusted_keys if isinstance(trusted_keys, TrustedKeys) else load_trusted_keys(trusted_keys)
    except SigningError as exc:
        raise EngineError(str(exc)) from None
    return trust_verdict(file.envelope, file.digest, keys, where)


def open_engine(path: Path | str, settings: RunSettings, trusted_keys: Path | str | TrustedKeys | None,
                expect_digest: str | None) -> tuple[EngineFile, Trust | None]:
    """Read and verify an engine file: its seal and contents, the digest asked for, the signature
    of a trusted key when there is a trust root. Any refusal is an EngineError naming the reason."""
    file = read_engine(Path(path))
    where = f"engine {path}"
    if expect_digest is not None:
        expected = normal_digest(expect_digest) if isinstance(expect_digest, str) else None
        if expected is None:
            raise EngineError(f"expect_digest must be 64 hex digits (a bundle digest), got {expect_digest!r}")
        problem = digest_problem(file.digest, expected, where)
        if problem:
            raise EngineError(problem)
    trusted_keys = trusted_keys if trusted_keys is not None else settings.trusted_keys
    trust = None
    if trusted_keys is not None:
        trust = engine_trust(file, trusted_keys, where)
        if not trust.trusted:
            raise EngineError(trust.problem)
    return file, trust


# --- pieces the torch-backed executor shares -------------------------------------------------------

def made_by(plans: list) -> dict[int, tuple[int, int]]:
    """node id -> (index of the plan step that makes it, its position among that step's outputs)."""
    return {nid: (index, pos) for index, plan in enumerate(plans)
            for pos, nid in enumerate([plan.node] if isinstance(plan, ExternStep) else plan.binding.outputs)}


def guarded_outputs(graph: Graph, plans: list, made: dict[int, tuple[int, int]]) -> tuple[frozenset, frozenset]:
    """(the kernel outputs that hold the graph's floating-point outputs, the graph outputs so
    guarded): check mode's flag word covers them. An output that is a reshape or transpose of a
    kernel's output is that output's (a slice is not: the flag would see elements it leaves out)."""
    stored, covered = set(), set()
    for nid in tree_ids(graph.output):
        base = graph.node(nid)
        while base.op in (Op.RESHAPE, Op.TRANSPOSE) and base.inputs:
            base = graph.node(base.inputs[0])
        at = made.get(base.id)
        if at is not None and not isinstance(plans[at[0]], ExternStep) and base.dtype in FLOAT_DTYPES:
            stored.add(base.id)
            covered.add(nid)
    return frozenset(stored), frozenset(covered)


def check_bits(plan: KernelPlan, guarded: frozenset[int]) -> int:
    """The `checks` bits of `plan`'s launch: its outputs that hold guarded values."""
    return sum(1 << i for i, nid in enumerate(plan.binding.outputs) if nid in guarded)


def where_of(graph: Graph, nids) -> str:
    """The source lines (or an imported model's module paths) of the nodes a kernel stores."""
    seen: list[str] = []
    for nid in nids:
        src = graph.node(nid).src
        text = src_text(src) if src else f"%{nid}"
        if text not in seen:
            seen.append(text)
    return ", ".join(seen[:3]) + (f" (+{len(seen) - 3})" if len(seen) > 3 else "")


# --- the executor --------------------------------------------------------------------------------

class NativeExecutor:
    """Runs an engine's launch plans on a `CudaDevice`: views computed on DeviceArrays, outputs
    allocated from the device's pool, each kernel bound, chosen and launched as the build laid
    it out. Check mode: the kernels raise one flag word on a NaN or Inf in a guarded output."""
    name = "cuda-native"

    def __init__(self, plans: list, device: CudaDevice, launcher: Any = None, graphs: bool = False) -> None:
        """`launcher`: what launches a `KernelBinary` (default: the CUDA driver's, on `device`).
        `graphs`: an input signature's second run captures its launches as a CUDA graph, and it
        and later runs launch the graph (`stable`: the inputs read in place, an engine's weights)."""
        from .cuda import KernelLauncher
        externs = [p for p in plans if isinstance(p, ExternStep)]
        if externs:
            raise EngineError(f"this engine calls {len(externs)} PyTorch operator(s) (built with fallback='eager'); "
                              "the deploy runtime runs XG's kernels only: run it with torch installed "
                              "(xgrun --runtime torch)")
        self.plans: list[KernelPlan] = plans
        self.device = device
        self.launcher = launcher or KernelLauncher(device.index, memory=device)
        self._made = made_by(plans)
        self._guards: dict[int, tuple[Graph, frozenset, frozenset]] = {}
        self._frees: dict[int, tuple[Graph, list[tuple[int, ...]]]] = {}
        self._verified: dict[int, tuple[Graph, frozenset[int]]] = {}    # see `_verify`
        self._consts: dict[tuple, DeviceArray] = {}
        self._replays: dict[tuple, Replay] = {}
        self._dynamic: dict[int, tuple[Graph, bool]] = {}
        self.flags: DeviceArray | None = None
        self.profiler = None
        self.graphs = graphs
        self.stable: frozenset[str] = frozenset()
        self._captured: dict[tuple, CapturedRun] = {}     # least recently used first
        self._uncapturable: set[tuple] = set()
        self.capture_failure: str | None = None     # why the last capture failed (runs then replay launches)

    def load_all(self) -> None:
        """Load every variant's module now (a first run then launches at once)."""
        for plan in self.plans:
            for c in plan.variants:
                self.launcher.load(c.handle)

    def guard(self, graph: Graph) -> tuple[frozenset, frozenset]:
        known = self._guards.get(id(graph))
        if known is None or known[0] is not graph:
            known = self._guards[id(graph)] = (graph, *guarded_outputs(graph, self.plans, self._made))
        return known[1], known[2]

    def dropped(self, graph: Graph) -> list[tuple[int, ...]]:
        """Per plan step, the values dropped once it is launched (`lifetimes.frees`): their memory
        goes back to the stream-ordered pool for the next outputs."""
        known = self._frees.get(id(graph))
        if known is None or known[0] is not graph:
            known = self._frees[id(graph)] = (graph, frees(graph, self.plans, self._made))
        return known[1]

    def run(self, graph: Graph, inputs: Mapping[str, DeviceArray], check: bool = True) -> dict[int, DeviceArray]:
        """Launch the plans. The first run at an input signature records its launches (variant,
        grid, every argument by source: `replay.recipe`); later runs at that signature replay them
        without binding or checking variants again. Profiled runs always bind (and record nothing)."""
        dev = self.device
        vals: dict[int, DeviceArray] = {}

        def value(nid: int) -> DeviceArray:
            if nid not in vals:
                vals[nid] = self._value(graph.node(nid), inputs, value)
            return vals[nid]

        key = self._key(graph, inputs, check) if self.profiler is None else None
        known = self._replays.get(key) if key is not None else None
        replayed = known is not None and known.graph is graph
        if replayed and self.graphs:        # (the graph zeroes and raises its own flag word)
            graphed = self._graphed(key, known, graph, inputs, check)
            if graphed is not None:
                return graphed
        stored, _covered = self.guard(graph) if check else (frozenset(), frozenset())
        flags = dev.zeros((1,), "int32")
        self.flags = flags if check else None
        if replayed:
            self._replay(known, inputs, flags, vals, value)
        else:
            self._launch_all(graph, inputs, flags, stored, vals, value, key)
        out = {nid: value(nid) for nid in tree_ids(graph.output)}
        held = {id(a.owner) for a in self._consts.values()} | {id(a.owner) for a in inputs.values()}
        # an output that is (a view of) an input or a constant is copied: the caller owns its result
        out = {nid: (a.clone() if id(a.owner) in held else a) for nid, a in out.items()}
        if check:
            self._check_gathers(graph, value)
        return out

    def _launch_all(self, graph: Graph, inputs: Mapping[str, DeviceArray], flags: DeviceArray, stored: frozenset,
                    vals: dict, value, key: tuple | None) -> None:
        """Bind, choose and launch every plan; with `key`, record the launches for replay."""
        dev = self.device
        sources: dict[int, tuple] = {}
        for name, a in inputs.items():      # a pointer two inputs share (or an empty one) names neither
            sources[a.data_ptr()] = ("in", name) if a.data_ptr() not in sources else ("?",)
        sources[flags.data_ptr()] = ("flags",) if flags.data_ptr() not in sources else ("?",)
        steps: list | None = [] if key is not None else None
        dropped = self.dropped(graph)
        for index, plan in enumerate(self.plans):
            if index:
                release(vals, dropped[index - 1], self._made, sources)
            shapes = [(tuple(graph.node(nid).shape), graph.node(nid).dtype) for nid in plan.binding.outputs]
            outs = [dev.empty(shape, dtype) for shape, dtype in shapes]
            launch = bind(plan, graph, value, outs, flags, check_bits(plan, stored))
            chosen = choose(plan, launch)
            grid = grid_for(chosen, plan.spec, launch)
            args = arguments(chosen, launch)
            if all(grid):
                if self.profiler is None:
                    self.launcher.launch(chosen.handle, grid, args)
                else:
                    from .profile import launch_cost
                    flops, moved, dtype = launch_cost(plan.spec, launch)
                    self.profiler.timed(f"k{index}", plan.spec.name, where_of(graph, plan.binding.outputs),
                                        lambda: self.launcher.launch(chosen.handle, grid, args),
                                        flops=flops, nbytes=moved, dtype=dtype)
            for nid, t in zip(plan.binding.outputs, outs):
                vals[nid] = t
            steps = record(steps, sources, index, plan, chosen, grid, args, outs, shapes, value)
            launch = args = None        # (they hold the operands: dropped values must go with the next step)
        if steps is not None:
            remember(self._replays, key, graph, steps)

    def _replay(self, known: Replay, inputs: Mapping[str, DeviceArray], flags: DeviceArray, vals: dict,
                value) -> None:
        produced: list[list[DeviceArray]] = []
        dev = self.device
        dropped = self.dropped(known.graph)
        for index, (plan, (chosen, grid, rec, shapes)) in enumerate(zip(self.plans, known.steps)):
            if index:
                release(vals, dropped[index - 1], self._made)
                for nid in dropped[index - 1]:
                    at = self._made.get(nid)
                    if at is not None:
                        produced[at[0]][at[1]] = None
            outs = [dev.empty(shape, dtype) for shape, dtype in shapes]
            produced.append(outs)
            args = replay_args(rec, inputs, produced, value, flags)
            if all(grid):
                self.launcher.launch(chosen.handle, grid, args)
            args = None
            for nid, t in zip(plan.binding.outputs, outs):
                vals[nid] = t

    # --- CUDA graphs -----------------------------------------------------------------------------
    def _graphed(self, key: tuple, known: Replay, graph: Graph, inputs: Mapping[str, DeviceArray],
                 check: bool) -> dict[int, DeviceArray] | None:
        """This run through the signature's CUDA graph (captured now if it has none yet); None when
        it cannot be captured (the run then replays its launches one by one)."""
        cap = self._captured.pop(key, None)
        if cap is not None and (cap.graph is not graph or any(
                inputs[n].data_ptr() != cap.static[n].data_ptr() for n in cap.static if n not in cap.copied)):
            cap.close()                 # a stable input (a weight) moved: capture again
            cap = None
        if cap is None:
            if key in self._uncapturable:
                return None
            cap = self._capture(known, graph, inputs, check)     # the first run loaded every module
            if cap is None:
                self._uncapturable.add(key)
                return None
            if len(self._captured) >= MAX_GRAPHS:
                self._captured.pop(next(iter(self._captured))).close()
        self._captured[key] = cap
        return self._launch_graph(cap, inputs, check)

    def _capture(self, known: Replay, graph: Graph, inputs: Mapping[str, DeviceArray],
                 check: bool) -> "CapturedRun | None":
        dev = self.device
        copied = tuple(sorted(n for n in inputs if n not in self.stable))
        # the graph's own input buffers: filled by each launch's copies (`_launch_graph`)
        static = {n: (dev.empty(inputs[n].shape, inputs[n].dtype) if n in copied else inputs[n]) for n in inputs}
        vals: dict[int, DeviceArray] = {}

        def value(nid: int) -> DeviceArray:
            if nid not in vals:
                vals[nid] = self._value(graph.node(nid), static, value)
            return vals[nid]
        dev.synchronize()
        cuda_graph = None
        try:
            dev.begin_capture()
            try:
                flags = dev.zeros((1,), "int32")
                self._replay(known, static, flags, vals, value)
                outputs = {nid: value(nid) for nid in tree_ids(graph.output)}
                gathers = [(n, value(n.inputs[1])) for n in self._computed_gathers(graph)] if check else []
            finally:
                cuda_graph, owned = dev.end_capture()
            executable = dev.instantiate(cuda_graph)
        except (XGError, RuntimeError) as exc:
            self.capture_failure = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
            if cuda_graph is not None:
                dev.drv.cuGraphDestroy(cuda_graph)
            dev.synchronize()
            return None
        return CapturedRun(graph, dev, cuda_graph, executable, static, copied, outputs,
                           flags if check else None, gathers, owned)

    def _launch_graph(self, cap: "CapturedRun", inputs: Mapping[str, DeviceArray],
                      check: bool) -> dict[int, DeviceArray]:
        """Copy the inputs in, launch the graph, copy the outputs out (a result never aliases the
        graph's buffers, which the next launch reuses)."""
        dev = self.device
        for n in cap.copied:
            dev.copy_dense(cap.static[n], inputs[n])
        dev.launch_graph(cap.executable)
        self.flags = cap.flags
        out = {nid: a.clone() for nid, a in cap.outputs.items()}
        for n, idx in cap.gathers:
            _gather_in_bounds(n, idx, cap.graph)
        return out

    def _key(self, graph: Graph, inputs: Mapping[str, DeviceArray], check: bool) -> tuple | None:
        """The input signature a recorded run is replayed at; None where launches depend on values
        (run-time indices read back to the host)."""
        dynamic = self._dynamic.get(id(graph))
        if dynamic is None or dynamic[0] is not graph:
            dynamic = self._dynamic[id(graph)] = (graph, any(n.op in (Op.INDEX, Op.UNINDEX) and len(n.inputs) > 1
                                                             for n in graph.nodes))
        if dynamic[1]:
            return None
        return (id(graph), check) + tuple((name, a.shape, a.stride(), a.dtype, a.data_ptr() % 16)
                                          for name, a in sorted(inputs.items()))

    def _value(self, n: Node, inputs: Mapping[str, DeviceArray], value) -> DeviceArray:
        if n.op is Op.INPUT:
            return inputs[n.attr("name")]
        if n.op is Op.CONST:
            key = (repr(n.attr("value")), n.dtype)
            if key not in self._consts:     # made once per engine: uploaded, then kept
                host = np.asarray(n.attr("value"), dtype=np.float32 if n.dtype == "bfloat16" else NUMPY_DTYPES[n.dtype])
                if n.dtype == "bfloat16":
                    from .host_io import bf16_bits
                    host = bf16_bits(host)
                self._consts[key] = self.device.upload(c_array(host), n.dtype)
            return self._consts[key]
        if n.op in COLLECTIVE:
            return value(n.inputs[0])           # one process holds every shard
        if n.op in VIEWS:
            x = value(n.inputs[0])
            if n.op is Op.RESHAPE:
                return x.reshape(tuple(n.shape))
            if n.op is Op.TRANSPOSE:
                return x.transpose(n.attr("dim0"), n.attr("dim1"))
            if n.op is Op.INDEX:
                return self._index(n, x, value)
        raise ExecutionError(f"internal: %{n.id} (`{n.op.value}`) is read before a kernel writes it")

    def _index(self, n: Node, x: DeviceArray, value) -> DeviceArray:
        """An INDEX node's items, one axis at a time (run-time indices read back from the device)."""
        axis = 0
        for pos, item in enumerate(n.attr("items")):
            size = x.shape[axis]
            if item[0] == "s":
                picks = range(size)[slice(item[1], item[2], item[3])]
                if picks.step < 0:
                    raise ExecutionError(f"a slice with a negative step at {src_text(n.src) if n.src else f'%{n.id}'} "
                                         "needs the torch-backed runtime (xgrun --runtime torch)")
                x = x[(slice(None),) * axis + (slice(picks.start, picks.stop, picks.step),)]
                axis += 1
                continue
            i = item[1] if item[0] == "i" else int(value(n.inputs[item[1]]).numpy().reshape(-1)[0])
            if not -size <= i < size:
                line = f" at {src_text(n.src)}" if n.src else ""
                raise ExecutionError(f"index {i} is out of bounds for dimension {pos} of size {size}{line}")
            x = x.select(axis, i)
        return x

    def _check_gathers(self, graph: Graph, value) -> None:
        """Check mode: the indices of each GATHER that the program computes, against its table
        (an engine input was checked before the run; on the GPU an out-of-range one reads zeros)."""
        for n in self._computed_gathers(graph):
            _gather_in_bounds(n, value(n.inputs[1]), graph)
        self._verify(graph)

    def _computed_gathers(self, graph: Graph) -> list[Node]:
        """The GATHERs whose indices the program computes (not an engine input's, checked before),
        less those from the shapes alone that a run of this graph already found in range."""
        known = self._verified.get(id(graph))
        return computed_gathers(graph, known[1] if known is not None and known[0] is graph else frozenset())

    def _verify(self, graph: Graph) -> None:
        """This graph's shape-only gather indices were in range: never checked again (`shape_only`)."""
        known = self._verified.get(id(graph))
        if known is None or known[0] is not graph:
            self._verified[id(graph)] = (graph, shape_only_gathers(graph))


def _gather_in_bounds(n: Node, idx: DeviceArray, graph: Graph) -> None:
    if not idx.numel():
        return
    host = idx.numpy()
    lo, hi, rows = int(host.min()), int(host.max()), graph.node(n.inputs[0]).shape[0]
    if lo < 0 or hi >= rows:
        line = f" at {src_text(n.src)}" if n.src else ""
        raise ExecutionError(f"index {lo if lo < 0 else hi} is out of bounds for a table of {rows} rows"
                             f"{line} (computed by the program; on the GPU the lookup read zeros)")


MAX_GRAPHS = 8          # captured input signatures per executor (least recently used dropped first)


@dataclass(eq=False)
class CapturedRun:
    """One input signature's run as a CUDA graph: its own copies of the inputs that change between
    runs (`copied`), the stable ones (weights) read in place, its output buffers (the graph's
    allocations: fixed addresses, freed and made again by each launch), check mode's flag word and
    the computed gather indices checked after each launch."""
    graph: Graph
    device: CudaDevice
    cuda_graph: Any
    executable: Any
    static: dict[str, DeviceArray]
    copied: tuple[str, ...]
    outputs: dict[int, DeviceArray]
    flags: DeviceArray | None
    gathers: list
    owned: list[int]

    def close(self) -> None:
        if self.cuda_graph is not None:
            graph, self.cuda_graph = self.cuda_graph, None
            self.device.destroy_graph(graph, self.executable, self.owned)

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 (interpreter shutdown: the context goes with the process)
            pass


# --- the engine ----------------------------------------------------------------------------------

class EngineView:
    """What both runtimes' engines read of their `file` (an EngineFile): the manifest, the IR,
    the signature, the check of an input set's names, and the IR specialised to input shapes
    (kept in `_specialised`, once per shapes and dtypes)."""
    file: EngineFile
    _specialised: dict

    @property
    def manifest(self) -> dict:
        return self.file.manifest

    @property
    def digest(self) -> str:
        return self.file.digest

    @property
    def graph(self) -> Graph:
        return self.file.graph

    @property
    def signature(self) -> list[dict]:
        return self.manifest["entry"]["inputs"]

    def check_names(self, values: Mapping[str, Any]) -> None:
        """An InputError naming the inputs missing from `values`, or else those the engine lacks."""
        expected = [s["name"] for s in self.signature]
        if len(values) == len(expected) and all(n in values for n in expected):
            return                      # (every call: nothing formatted)
        sig = ", ".join(f"{s['name']}: {s['dtype']}{s['shape']}" for s in self.signature) or "no inputs"
        missing = [n for n in expected if n not in values]
        extra = [n for n in values if n not in expected]
        if missing:
            raise InputError(f"missing input{'s' if len(missing) > 1 else ''} {', '.join(f'`{m}`' for m in missing)}; "
                             f"the engine takes {sig}")
        if extra:
            raise InputError(f"unknown input{'s' if len(extra) > 1 else ''} {', '.join(f'`{e}`' for e in extra)}; "
                             f"the engine takes {sig}")

    def specialise(self, shapes: Mapping[str, tuple], dtypes: Mapping[str, str]) -> tuple[Graph, dict, bool]:
        """(the IR specialised to these input shapes, the symbols' sizes, whether it was cached)."""
        key = tuple((n, str(dtypes.get(n)), tuple(shapes[n])) for n in sorted(shapes))
        cached = key in self._specialised
        if not cached:
            try:
                env = bind_symbols(self.graph, {n: tuple(s) for n, s in shapes.items()})
                graph = specialize(self.graph, env)
            except SpecializationError as exc:
                raise InputError(str(exc)) from None
            # Sizes computed from symbols are checked as the file's were, before anything allocates.
            check_sizes(graph, self.manifest, f"engine {self.digest[:12]} with these inputs")
            self._specialised[key] = (graph, env)
        graph, env = self._specialised[key]
        return graph, env, cached


@dataclass
class NativeResult:
    """One run: `outputs` by output-file name (`out`, `out_0`, `out_ok`, ...), on the device."""
    outputs: dict[str, DeviceArray]
    run_ms: float
    specialization: dict
    value_tree: Any = None

    def to_host(self) -> dict[str, HostArray]:
        return {name: HostArray(a.numpy(), a.dtype) for name, a in self.outputs.items()}


@dataclass
class NativeEngine(EngineView):
    """An engine for the deploy runtime: load, bind inputs, run, read outputs; no torch."""
    file: EngineFile
    settings: RunSettings = field(default_factory=RunSettings)
    trust: Trust | None = None
    device_index: int = 0
    _specialised: dict = field(default_factory=dict, repr=False)
    _executor: NativeExecutor | None = field(default=None, repr=False)
    _weights: dict | None = field(default=None, repr=False)
    _weight_specs: tuple | None = field(default=None, repr=False)

    @classmethod
    def load(cls, path: Path | str, settings: RunSettings | None = None, *, trusted_keys: Any = None,
             expect_digest: str | None = None, device_index: int = 0) -> "NativeEngine":
        settings = settings or RunSettings()
        file, trust = open_engine(path, settings, trusted_keys, expect_digest)
        if any(n.op is Op.EXTERN for n in file.graph.nodes):
            raise EngineError(f"engine {path} calls PyTorch operators (built with fallback='eager'); the deploy "
                              "runtime runs XG's kernels only: run it with torch installed (xgrun --runtime torch)")
        return cls(file, settings, trust, device_index)

    # --- device and kernels ----------------------------------------------------------------------
    def executor(self) -> NativeExecutor:
        """The engine's kernels on its GPU (kept between runs): refuses a missing GPU, kernels for
        another architecture, or an engine built without kernels, before any memory moves."""
        if self._executor is None:
            kernels = self.manifest.get("kernels", [])
            if not kernels and any(n.op not in (Op.INPUT, Op.CONST) for n in self.graph.nodes):
                raise EngineError(f"engine {self.digest[:12]} carries no GPU kernels (built with --no-kernels); "
                                  "rebuild it with xgc --target=... or run it with --device cpu")
            from .cuda import CudaRuntimeError
            try:
                dev = CudaDevice.get(self.device_index)
            except CudaRuntimeError as exc:
                raise EngineError(f"cannot run on cuda: {exc}") from None
            archs = sorted({v["arch"] for k in kernels for v in k["variants"]})
            if archs and dev.arch not in archs:
                raise EngineError(f"engine {self.digest[:12]} carries kernels for "
                                  f"{', '.join(f'sm_{a}' for a in archs)} (target {self.manifest['target']}), but "
                                  f"this GPU is sm_{dev.arch}: rebuild with xgc --target=<this GPU>")
            from .plans import plans_from_manifest
            self._executor = NativeExecutor(plans_from_manifest(self.manifest, self.file.entries), dev,
                                            graphs=self.settings.cuda_graphs)
            self._executor.stable = frozenset(s.name for s in self._weight_header()[1])
        return self._executor

    def weights(self) -> dict[str, DeviceArray]:
        """The tensors the engine binds itself, copied to the device once, straight from the
        engine's bytes (checked against the manifest when the engine was read)."""
        if self._weights is None:
            self._weights = {}
            start, specs = self._weight_header()
            if specs:
                blob = self.file.entries[self.manifest["weights"]["path"]]
                dev = self.executor().device
                for s in specs:
                    host = np.frombuffer(blob, dtype=NUMPY_DTYPES[s.dtype], count=math.prod(s.shape),
                                         offset=start + s.start).reshape(s.shape)
                    self._weights[s.name] = dev.upload(host, s.dtype)
        return self._weights

    def _weight_header(self) -> tuple[int, list]:
        """(where the weights' data starts, their TensorSpecs), read once from the engine's blob."""
        if self._weight_specs is None:
            entry = self.manifest.get("weights")
            blob = self.file.entries[entry["path"]] if entry else None
            self._weight_specs = safetensors_header(blob, len(blob)) if entry else (0, [])
        return self._weight_specs

    # --- inputs ----------------------------------------------------------------------------------
    def check_inputs(self, values: Mapping[str, Any] | None) -> dict[str, Any]:
        """The inputs checked against the signature, on the host: names, dtypes, ranks and sizes
        (the IR specialised to them), index inputs within their tables. Host values become
        `HostArray`s; DeviceArrays and CUDA Array Interface objects are taken as they are (their
        index ranges are checked on the device, in `prepare`). Needs no GPU."""
        values = dict(values or {})
        self.check_names(values)
        out: dict[str, Any] = {}
        dtypes: dict[str, str] = {}
        shapes: dict[str, tuple] = {}
        for spec in self.signature:
            name, v = spec["name"], values[spec["name"]]
            if not isinstance(v, (DeviceArray, np.ndarray)) and dlpack_device(name, v) is not None:
                v = self._from_dlpack(name, v)
            if isinstance(v, DeviceArray):
                dtypes[name], shapes[name] = v.dtype, v.shape
            elif cuda_array_interface(name, v) is not None:
                dtypes[name], shapes[name] = cai_dtype(name, v), tuple(cuda_array_interface(name, v)["shape"])
            else:
                try:
                    v = as_host(name, v)
                except TensorIOError as exc:
                    raise InputError(str(exc)) from None
                dtypes[name], shapes[name] = v.dtype, v.shape
            if dtypes[name] != spec["dtype"]:
                raise InputError(f"input `{name}` has dtype {dtypes[name]}, the engine expects {spec['dtype']} "
                                 "(XG never converts implicitly)")
            if isinstance(v, HostArray):
                _check_range(name, spec, v.array)
            out[name] = v
        for w in self._weight_header()[1]:
            dtypes[w.name], shapes[w.name] = w.dtype, w.shape
        self.specialise(shapes, dtypes)
        return out

    def _from_dlpack(self, name: str, obj: Any) -> Any:
        """A DLPack producer's tensor: on a GPU, a DeviceArray over its memory (zero-copy, ready on
        XG's stream); on the host, a numpy array of it."""
        kind, index = dlpack_device(name, obj)
        if kind == dlpack.KDL_CPU:
            try:
                return np.from_dlpack(obj)
            except (TypeError, ValueError, BufferError, RuntimeError) as exc:
                raise InputError(f"input `{name}`: numpy cannot take this host tensor through DLPack ({exc}); "
                                 "pass a numpy array or a HostArray") from None
        if kind != dlpack.KDL_CUDA:
            raise InputError(f"input `{name}` is on DLPack device type {kind}; the deploy runtime takes CUDA "
                             "memory or host arrays")
        dev = self.executor().device
        if index != dev.ref.index:
            raise InputError(f"input `{name}` is on cuda:{index}, the engine runs on cuda:{dev.ref.index}")
        try:
            t = dlpack.take(obj.__dlpack__(stream=dev.stream_handle), f"input `{name}`")
        except (ValueError, TypeError, BufferError) as exc:
            raise InputError(str(exc) if str(exc).startswith("input") else f"input `{name}`: {exc}") from None
        return dev.foreign(t.ptr, t.shape, t.strides, t.dtype, t.keep)

    def prepare(self, values: Mapping[str, Any] | None) -> dict[str, DeviceArray]:
        """`check_inputs`, then the inputs on the device: host arrays copied, DeviceArrays and CUDA
        Array Interface objects bound in place (their index ranges checked here); the engine's
        weights added."""
        checked = self.check_inputs(values)
        dev = self.executor().device
        out: dict[str, DeviceArray] = {}
        for spec in self.signature:
            name, v = spec["name"], checked[spec["name"]]
            if isinstance(v, HostArray):
                arr = dev.upload(v.array, v.dtype)
            else:
                arr = v if isinstance(v, DeviceArray) else from_cai(dev, name, v)
                if "range" in spec and arr.numel():
                    _check_range(name, spec, arr.numpy())
            out[name] = arr.contiguous()
        out.update(self.weights())
        return out

    def specialised(self, inputs: Mapping[str, DeviceArray]) -> tuple[Graph, dict, bool]:
        return self.specialise({n: a.shape for n, a in inputs.items()}, {n: a.dtype for n, a in inputs.items()})

    # --- running ---------------------------------------------------------------------------------
    def run(self, values: Mapping[str, Any] | None = None, *, check: bool = True, profiler: Any = None) -> NativeResult:
        """Run once; the outputs stay on the device (`NativeResult.to_host` copies them out).
        `check`: NaN/Inf in an output, or a computed index outside its table, is an ExecutionError.
        `profiler` (`runtime.profile.Profiler`): every launch timed with CUDA events."""
        ex = self.executor()
        ex.device.ensure_current()
        inputs = self.prepare(values)
        if profiler is not None:
            ex.device.synchronize()
            profiler.begin()
        t0 = time.perf_counter()
        graph, env, cached = self.specialised(inputs)
        ex.profiler = profiler
        try:
            values_out = ex.run(graph, inputs, check=check)
        finally:
            ex.profiler = None
        if profiler is not None:
            profiler.end()
        ex.device.synchronize()
        run_ms = (time.perf_counter() - t0) * 1e3
        if check:
            self._check(graph, ex, values_out)
        spec = {"symbols": dict(sorted(env.items())), "cached": cached,
                "inputs": {n: {"dtype": a.dtype, "shape": list(a.shape)} for n, a in inputs.items()}}
        return NativeResult(_flat(graph.output, values_out), run_ms, spec, graph.output)

    def profiler(self) -> Any:
        """A `runtime.profile.Profiler` timing with this engine's device's CUDA events."""
        from .profile import Profiler
        dev = self.executor().device
        return Profiler("cuda", event=lambda: CudaEvent(dev), sync=dev.synchronize)

    def _check(self, graph: Graph, ex: NativeExecutor, values: dict[int, DeviceArray]) -> None:
        """Check mode after a run: the flag word the kernels raise, read once; floating outputs no
        kernel guards are scanned on the host."""
        _stored, covered = ex.guard(graph)
        raised = ex.flags is not None and int(ex.flags.numpy()[0]) != 0
        bad = None
        for nid, a in values.items():
            if nid in covered or a.dtype not in FLOAT_DTYPES or not a.numel():
                continue
            if not np.isfinite(float_view(HostArray(a.numpy(), a.dtype))).all():
                bad = nid
                break
        if not raised and bad is None:
            return
        kernels = [where_of(graph, p.binding.outputs) for p in ex.plans
                   if any(nid in _stored for nid in p.binding.outputs)]
        what = f"output %{bad}" if bad is not None else "an output"
        raise ExecutionError(f"check failed: {what} holds NaN/Inf in the kernels' result (stored by "
                             f"{'; '.join(kernels[:3]) or 'no kernel'}); to name the op that made it, run the engine "
                             "with torch installed (xgrun --runtime torch), which traces it on the CPU reference")


def _check_range(name: str, spec: dict, values: np.ndarray) -> None:
    """An index input's values within [lo, hi) of its table (`spec["range"]`), on the host."""
    if "range" not in spec or not values.size:
        return
    lo, hi = spec["range"]
    tmin, tmax = int(values.min()), int(values.max())
    if tmin < lo or tmax >= hi:
        raise InputError(f"input `{name}` holds {tmin if tmin < lo else tmax}, outside [{lo}, {hi}): "
                         f"it indexes a table of {hi} rows")


def _flat(tree: dict, values: Mapping[int, DeviceArray], prefix: str = "out") -> dict[str, DeviceArray]:
    """The output leaves by their output-file names, as `Engine.run`'s `RunResult.tensors`."""
    if "t" in tree:
        return {prefix: values[tree["t"]]}
    if "tuple" in tree:
        out: dict[str, DeviceArray] = {}
        for i, item in enumerate(tree["tuple"]):
            out.update(_flat(item, values, f"{prefix}_{i}"))
        return out
    tag_arr = values[tree["result"]["tag"]]
    tag = int(tag_arr.numpy().reshape(-1)[0])
    ok = tag_arr.device_obj.upload(np.array(tag == 0), "bool")
    out = {f"{prefix}_ok": ok}
    if tag == 0:
        out.update(_flat(tree["result"]["value"], values, f"{prefix}_value"))
    return out

