"""The deploy runtime's executor (`runtime/native.py`) on a CPU host: with a device that hands out
addresses and a launcher that records, each engine's launches (kernels, variants, grids and every
scalar argument: sizes and the strides views make) are those of the torch-backed executor
(`runtime/gpu.py`) binding torch tensors; DeviceArray's views agree with torch's."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
import torch

import xg
from xgbuild.compiler.passes.specialize import bind_symbols, specialize
from xgbuild.errors import EngineError
from xgbuild.runtime.device import Allocation, DeviceArray, DeviceRef, contiguous_strides, view_strides
from xgbuild.runtime.gpu import KernelExecutor
from xgbuild.runtime.native import NativeExecutor
from xgbuild.runtime.plans import plans_from_manifest

REPO = Path(__file__).resolve().parents[3]


class FakeDevice:
    """Addresses without memory: what the executor's binding needs of a device."""
    index, arch, ref = 0, 90, DeviceRef("cuda", 0)

    def __init__(self) -> None:
        self.next = 1 << 20
        self.copies: list = []

    def empty(self, shape, dtype: str) -> DeviceArray:
        nbytes = int(np.prod(shape, dtype=np.int64)) * {"bfloat16": 2, "float16": 2, "float32": 4, "int32": 4,
                                                         "int64": 8, "bool": 1, "float64": 8}[dtype]
        block = Allocation(self, self.next, nbytes)
        self.next += -(-max(nbytes, 1) // 256) * 256
        return DeviceArray(block, block.ptr, shape, contiguous_strides(shape), dtype, self.ref)

    zeros = empty

    def upload(self, host, dtype: str) -> DeviceArray:
        return self.empty(host.shape, dtype)

    def free(self, ptr: int) -> None:
        pass

    def download(self, host, src) -> None:
        host.fill(0)                    # (a computed gather's indices, checked after the run)

    def copy_strided(self, dst, src) -> None:
        self.copies.append((src.shape, src.stride()))


class Recorder:
    def __init__(self) -> None:
        self.launches: list = []

    def launch(self, k, grid, args) -> None:
        self.launches.append((k.name, tuple(grid), [a if isinstance(a, (int, float)) else "ptr" for a in args]))

    def load(self, k) -> None:
        pass


def _launches(engine, shapes: dict, dtypes: dict) -> tuple[list, list]:
    plans = plans_from_manifest(engine.manifest, engine.file.entries)
    graph = specialize(engine.graph, bind_symbols(engine.graph, shapes))
    torch_side = Recorder()
    ex = KernelExecutor(plans, lambda c, grid, args: torch_side.launch(c.handle, grid, args), torch.device("meta"))
    ex.check_outputs = True
    ex.run(graph, {n: torch.empty(s, dtype=getattr(torch, dtypes[n]), device="meta") for n, s in shapes.items()})
    native_side = Recorder()
    dev = FakeDevice()
    nx = NativeExecutor(plans, dev, launcher=native_side)
    nx.run(graph, {n: dev.empty(s, dtypes[n]) for n, s in shapes.items()}, check=True)
    _launches.copies = dev.copies
    return torch_side.launches, native_side.launches


@pytest.mark.parametrize("example, dims", [
    ("attention", {"T": 24, "D": 16}),
    ("mlp", {}),
    ("norms", {}),
])
def test_native_launches_are_the_torch_executors(example: str, dims: dict) -> None:
    engine = xg.compile_file(REPO / "examples" / f"{example}.xg", target="H100", tune="predict", dims=dims or None)
    sizes = {"T": 24, "D": 16, "F": 40, "H": 8, "B": 3, **dims}
    shapes, dtypes = {}, {}
    for s in engine.signature:
        shapes[s["name"]] = tuple(d if isinstance(d, int) else sizes.get(d, 16) for d in s["shape"])
        dtypes[s["name"]] = s["dtype"]
    want, got = _launches(engine, shapes, dtypes)
    assert want and got == want


def test_views_match_torch() -> None:
    """reshape (view or not), expand, permute, transpose, unsqueeze, squeeze, select and indexing:
    the same shapes, strides and offsets as torch's, on fresh random shapes."""
    rng = np.random.default_rng()
    dev = FakeDevice()
    for _ in range(200):
        shape = tuple(int(x) for x in rng.integers(1, 5, size=rng.integers(1, 5)))
        t = torch.empty(shape)
        a = dev.empty(shape, "float32")
        perm = tuple(int(x) for x in rng.permutation(len(shape)))
        t, a = t.permute(perm), a.permute(perm)
        assert a.shape == tuple(t.shape) and a.stride() == t.stride() and a.is_contiguous() == t.is_contiguous()
        flat = int(np.prod(shape))
        for new in ((flat,), (1, flat), tuple(reversed(shape)), (-1,) + shape[-1:]):
            s = view_strides(a.shape, a.stride(), tuple(int(x) for x in (torch.empty(0).new_empty(t.shape)
                                                                            .reshape(new).shape)))
            try:
                v = t.view(new)
            except RuntimeError:
                assert s is None
                continue
            assert s == v.stride()
            assert a.reshape(new).stride() == v.stride()
        d = int(rng.integers(0, t.dim() + 1))
        assert a.unsqueeze(d).stride() == t.unsqueeze(d).stride()
        i = int(rng.integers(0, t.shape[0]))
        assert a.select(0, i).data_ptr() - a.data_ptr() == (t.select(0, i).storage_offset() - t.storage_offset()) * 4
        key = (Ellipsis, None, slice(1, None, 2)) if t.dim() else (None,)
        v, w = t[key], a[key]
        assert w.shape == tuple(v.shape) and w.stride() == v.stride()
        assert w.data_ptr() - a.data_ptr() == (v.storage_offset() - t.storage_offset()) * 4
        e = t[(slice(None),) * (t.dim() - 1) + (slice(0, 1),)]
        f = a[(slice(None),) * (a.dim() - 1) + (slice(0, 1),)]
        want = (5,) + tuple(e.shape[:-1]) + (3,)
        assert f.expand(want).stride() == e.expand(want).stride()
    for i, j in itertools.combinations(range(3), 2):
        t, a = torch.empty(2, 3, 4), dev.empty((2, 3, 4), "float32")
        assert a.transpose(i, j).stride() == t.transpose(i, j).stride()


def test_engines_that_call_pytorch_are_refused() -> None:
    from xgbuild.compiler.codegen.launch_abi import ExternStep
    with pytest.raises(EngineError, match="PyTorch operator"):
        NativeExecutor([ExternStep(3)], FakeDevice(), launcher=Recorder())


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_native_launches_of_imported_models(name: str) -> None:
    """A transformers model's engine (views of heads, gathers, weights bound by the engine)."""
    import sys
    import warnings
    sys.path.insert(0, str(REPO / "tests" / "unit" / "importers"))
    from hf_zoo import build
    m = build(name)
    kwargs = m.inputs(2, 16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compiled = xg.compile(m.model, example_kwargs=kwargs, target="H100", tune="predict")
    engine = compiled.engine
    weights = {s.name: (s.dtype, s.shape) for s in _weight_specs(engine)}
    shapes = {s["name"]: tuple(s["shape"]) for s in engine.signature}
    dtypes = {s["name"]: s["dtype"] for s in engine.signature}
    shapes.update({k: v[1] for k, v in weights.items()})
    dtypes.update({k: v[0] for k, v in weights.items()})
    want, got = _launches(engine, shapes, dtypes)
    assert len(want) > 5 and got == want


def _weight_specs(engine) -> list:
    from xgbuild.packager.weights import safetensors_header
    blob = engine.file.entries[engine.manifest["weights"]["path"]]
    return safetensors_header(blob, len(blob))[1]


def test_strided_copies_are_numpys() -> None:
    """`CudaDevice.copy_strided`'s plan (dims merged, the kernel's rank, outer dims launched in
    pieces) with the shipped kernel's index arithmetic emulated on host memory: every view of a
    random array copies to numpy's contiguous copy of the same view."""
    from xgbuild.runtime.device import CudaDevice, _copy_kernels

    base = 1 << 24
    table = _copy_kernels()

    class Emulated:
        def launch(self, k, grid, args) -> None:
            src, dst, n, s1, s2, s3, *t = args
            assert k.arch == 0 and k.params[2:] == ("i64",) * (4 + len(t)) and len(t) == table["rank"]
            assert grid[0] * table["block"] >= n
            dt = np.dtype(f"i{src.itemsize}")
            i = np.arange(n)
            idx = (i // (s1 * s2 * s3)) * t[0] + (i // (s2 * s3) % s1) * t[1] + (i // s3 % s2) * t[2] + (i % s3) * t[3]
            mem[dst.ptr - base: dst.ptr - base + n * dt.itemsize].view(dt)[:] = \
                mem[src.ptr - base:].view(dt)[:len(mem[src.ptr - base:]) // dt.itemsize][idx]

    dev = CudaDevice.__new__(CudaDevice)
    dev.index, dev.ref, dev._launcher = 0, DeviceRef("cuda", 0), Emulated()
    rng = np.random.default_rng()
    for _ in range(100):
        shape = tuple(int(x) for x in rng.integers(1, 5, size=rng.integers(1, 7)))
        itemsize = int(rng.choice([1, 2, 4, 8]))
        dtype = {1: "int8", 2: "float16", 4: "float32", 8: "int64"}[itemsize]
        host = rng.integers(-100, 100, size=shape).astype(np.dtype(f"i{itemsize}"))
        mem = np.zeros(2 * host.nbytes + 64, dtype=np.uint8)
        mem[:host.nbytes] = host.reshape(-1).view(np.uint8)
        a = DeviceArray(None, base, shape, contiguous_strides(shape), dtype, dev.ref)
        perm = [int(x) for x in rng.permutation(len(shape))]
        view, want = a.permute(perm), host.transpose(perm)
        if view.dim() and view.shape[0] > 1:
            view, want = view[1:], want[1:]
        out = DeviceArray(None, base + host.nbytes, view.shape, contiguous_strides(view.shape), dtype, dev.ref)
        dev.copy_strided(out, view)
        got = mem[host.nbytes: host.nbytes + want.nbytes].view(want.dtype).reshape(want.shape)
        assert np.array_equal(got, want), (shape, perm)


def _canonical(launches: list, inputs: dict) -> list:
    """Launches with each pointer named: an input's by its name, any other by first appearance."""
    names = {a.data_ptr(): f"in:{n}" for n, a in inputs.items()}
    seen: dict[int, str] = {}
    out = []
    for name, grid, args in launches:
        named = []
        for a in args:
            if a == "ptr":
                named.append(a)
            elif isinstance(a, tuple):
                ptr = a[1]
                named.append(names.get(ptr) or seen.setdefault(ptr, f"buf{len(seen)}"))
            else:
                named.append(a)
        out.append((name, grid, named))
    return out


class PointerRecorder(Recorder):
    def launch(self, k, grid, args) -> None:
        self.launches.append((k.name, tuple(grid), [a if isinstance(a, (int, float)) else ("ptr", a.data_ptr())
                                                    for a in args]))


@pytest.mark.parametrize("name", ["gpt2"])
def test_a_second_run_replays_the_first_runs_launches(name: str, monkeypatch) -> None:
    """The second run at a signature replays the first's launches (no binding, no variant
    choice): the same kernels, grids and scalar arguments, every pointer its counterpart."""
    import sys
    import warnings
    import xgbuild.runtime.native as native
    sys.path.insert(0, str(REPO / "tests" / "unit" / "importers"))
    from hf_zoo import build
    m = build(name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        engine = xg.compile(m.model, example_kwargs=m.inputs(2, 16), target="H100", tune="predict").engine
    shapes = {s["name"]: tuple(s["shape"]) for s in engine.signature}
    dtypes = {s["name"]: s["dtype"] for s in engine.signature}
    for s in _weight_specs(engine):
        shapes[s.name], dtypes[s.name] = s.shape, s.dtype
    plans = plans_from_manifest(engine.manifest, engine.file.entries)
    graph = specialize(engine.graph, bind_symbols(engine.graph, shapes))
    dev, rec = FakeDevice(), PointerRecorder()
    nx = NativeExecutor(plans, dev, launcher=rec)
    inputs = {n: dev.empty(s, dtypes[n]) for n, s in shapes.items()}
    outs = []
    for _ in range(2):
        start = len(rec.launches)
        out = nx.run(graph, inputs, check=True)
        outs.append((rec.launches[start:], out))
    chosen = []
    monkeypatch.setattr(native, "choose", lambda *a: chosen.append(a) or pytest.fail("replay chose a variant"))
    start = len(rec.launches)
    third = nx.run(graph, inputs, check=True)
    first, second = _canonical(outs[0][0], inputs), _canonical(outs[1][0], inputs)
    assert len(nx._replays) == 1 and not chosen
    assert second == first == _canonical(rec.launches[start:], inputs)
    assert [a.shape for a in third.values()] == [a.shape for a in outs[0][1].values()]


def test_check_inputs_takes_device_arrays_of_any_dtype(tmp_path) -> None:
    """A bfloat16 DeviceArray (a previous run's output, say) is an input like any other, though it
    has no CUDA Array Interface typestr; a wrong dtype or size is still refused before the GPU."""
    from xgbuild.errors import InputError
    from xgbuild.runtime.native import NativeEngine
    src = tmp_path / "m.xg"
    src.write_text("extern Tensor[bfloat16, T, D] X\nextern Tensor[bfloat16, D] G\ndef main() {\n    return X * G\n}\n")
    xg.compile_file(src, kernels=False).save(tmp_path / "m.xge")
    eng = NativeEngine.load(tmp_path / "m.xge")
    dev = FakeDevice()
    x, g = dev.empty((8, 4), "bfloat16"), dev.empty((4,), "bfloat16")
    assert eng.check_inputs({"X": x, "G": g}) == {"X": x, "G": g}
    with pytest.raises(InputError, match="dtype float32"):
        eng.check_inputs({"X": dev.empty((8, 4), "float32"), "G": g})
    with pytest.raises(InputError, match="D"):
        eng.check_inputs({"X": x, "G": dev.empty((5,), "bfloat16")})
    class Bf16Tensor:                   # torch's bfloat16 CUDA tensors refuse the interface like this
        @property
        def __cuda_array_interface__(self):
            raise TypeError("dtype bfloat16 is not supported")
    with pytest.raises(InputError, match="without a CUDA Array Interface"):
        eng.check_inputs({"X": Bf16Tensor(), "G": g})


class GraphDevice(FakeDevice):
    """A FakeDevice that captures: launches made between begin_capture and end_capture go into
    the graph (the recorder marks them), launch_graph replays them as one event."""
    def __init__(self, recorder, fail: bool = False) -> None:
        super().__init__()
        self.recorder, self.fail, self.events = recorder, fail, []
        self._capturing, self._deferred = None, []

    def synchronize(self) -> None:
        pass

    def begin_capture(self) -> None:
        self.events.append("begin")
        self.recorder.capturing = True

    def end_capture(self):
        self.recorder.capturing = False
        self.events.append("end")
        if self.fail:
            from xgbuild.runtime.cuda import CudaRuntimeError
            raise CudaRuntimeError("cuStreamEndCapture failed: CUDA_ERROR_STREAM_CAPTURE_INVALIDATED")
        return "graph", []

    def instantiate(self, graph):
        return "exec"

    def launch_graph(self, executable) -> None:
        self.events.append("launch")

    def copy_dense(self, dst, src) -> None:
        self.events.append(("copy", dst.data_ptr(), src.data_ptr()))

    def destroy_graph(self, graph, executable, owned) -> None:
        self.events.append("destroy")


class CaptureRecorder(PointerRecorder):
    capturing = False

    def launch(self, k, grid, args) -> None:
        super().launch(k, grid, args)
        self.launches[-1] = (*self.launches[-1], self.capturing)


def _gpt2_run_parts():
    import sys
    import warnings
    sys.path.insert(0, str(REPO / "tests" / "unit" / "importers"))
    from hf_zoo import build
    m = build("gpt2")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        engine = xg.compile(m.model, example_kwargs=m.inputs(2, 16), target="H100", tune="predict").engine
    shapes = {s["name"]: tuple(s["shape"]) for s in engine.signature}
    dtypes = {s["name"]: s["dtype"] for s in engine.signature}
    weights = {s.name for s in _weight_specs(engine)}
    for s in _weight_specs(engine):
        shapes[s.name], dtypes[s.name] = s.shape, s.dtype
    plans = plans_from_manifest(engine.manifest, engine.file.entries)
    graph = specialize(engine.graph, bind_symbols(engine.graph, shapes))
    return plans, graph, shapes, dtypes, weights


def test_a_signatures_second_run_is_captured_and_later_runs_launch_the_graph() -> None:
    """Run 1 launches and records; run 2 captures the recorded launches and launches the graph;
    run 3 only copies the changing inputs in, launches the graph and copies the outputs out. A
    weight that moves is captured again; results never alias the graph's buffers."""
    plans, graph, shapes, dtypes, weights = _gpt2_run_parts()
    rec = CaptureRecorder()
    dev = GraphDevice(rec)
    nx = NativeExecutor(plans, dev, launcher=rec, graphs=True)
    nx.stable = frozenset(weights)
    fixed = {n: dev.empty(shapes[n], dtypes[n]) for n in weights}

    def inputs():
        return {**fixed, **{n: dev.empty(s, dtypes[n]) for n, s in shapes.items() if n not in weights}}
    first = nx.run(graph, inputs(), check=True)
    n_kernels = len(rec.launches)
    assert n_kernels and not any(c for *_, c in rec.launches) and dev.events == []
    second = nx.run(graph, inputs(), check=True)
    captured = rec.launches[n_kernels:]
    names = [e for e in dev.events if isinstance(e, str)]
    assert names == ["begin", "end", "launch"]
    assert dev.events[0] == "begin"          # the graph's input buffers are filled by its launches' copies
    kernels_in_graph = [c for c in captured if c[-1]]
    assert len(kernels_in_graph) >= n_kernels       # the kernels, and the copies that make views dense
    cap = next(iter(nx._captured.values()))
    assert set(cap.copied) == set(shapes) - weights
    start, ev = len(rec.launches), len(dev.events)
    x = inputs()
    third = nx.run(graph, x, check=True)
    assert not [c for c in rec.launches[start:] if c[-1]]           # nothing launched one by one into a capture
    events = dev.events[ev:]
    assert events.count("launch") == 1 and "begin" not in events
    copies = [e for e in events if isinstance(e, tuple)]
    assert {src for _, _, src in copies} >= {x[n].data_ptr() for n in cap.copied}
    graph_bufs = {a.data_ptr() for a in cap.outputs.values()}
    for out in (second, third):
        assert set(out) == set(first) and not {a.data_ptr() for a in out.values()} & graph_bufs
        assert [a.shape for a in out.values()] == [a.shape for a in first.values()]
    # a weight at another address: the old graph goes, a new one is captured
    moved = next(iter(weights))
    fixed[moved] = dev.empty(shapes[moved], dtypes[moved])
    ev = len(dev.events)
    nx.run(graph, inputs(), check=True)
    assert [e for e in dev.events[ev:] if isinstance(e, str)] == ["destroy", "begin", "end", "launch"]


def test_a_failed_capture_falls_back_to_replaying_launches() -> None:
    plans, graph, shapes, dtypes, weights = _gpt2_run_parts()
    rec = CaptureRecorder()
    dev = GraphDevice(rec, fail=True)
    nx = NativeExecutor(plans, dev, launcher=rec, graphs=True)
    x = {n: dev.empty(s, dtypes[n]) for n, s in shapes.items()}
    nx.run(graph, x, check=True)
    n = len(rec.launches)
    second = nx.run(graph, x, check=True)
    assert "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED" in nx.capture_failure and not nx._captured
    replayed = [c for c in rec.launches[n:] if not c[-1]]
    assert len(replayed) >= n                   # the run itself replayed its launches one by one
    ev = len(dev.events)
    nx.run(graph, x, check=True)
    assert "begin" not in dev.events[ev:]       # not tried again for this signature
    assert second
