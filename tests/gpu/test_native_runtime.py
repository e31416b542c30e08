"""The deploy runtime on a real GPU (issue 22): `xgrun --runtime native` with torch and Triton made
unimportable gives the torch-backed runtime's outputs bit for bit (an MLP in bfloat16, a
transformers GPT-2 with its weights and index inputs), its strided copies are numpy's, the
`xg.runtime`-level API reuses modules, weights and memory between runs and binds other libraries'
CUDA memory in place, check mode catches a NaN, and `--profile` times every kernel."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from gpu_target import local_target

import xg
from xgbuild.runtime.tensor_io import save_tensors

pytestmark = pytest.mark.gpu
REPO = Path(__file__).resolve().parents[2]
NO_TORCH = REPO / "tests" / "e2e" / "no_torch.py"
MLP = """
extern Tensor[bfloat16, T, D] X
extern Tensor[bfloat16, D, F] W1
extern Tensor[bfloat16, F] B1
extern Tensor[bfloat16, F, D] W2
def main() {
    return gelu(X @ W1 + B1) @ W2
}
"""


def _run(args: list, no_torch: bool) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(NO_TORCH)] if no_torch else [sys.executable, "-m", "xgbuild.cli.xgrun"]
    proc = subprocess.run([*cmd, *map(str, args)], capture_output=True, text=True, cwd=REPO, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    if no_torch:
        assert "no-torch: loaded nothing" in proc.stderr, proc.stderr[-2000:]
    return proc


def _same_outputs(engine: Path, inputs: Path, tmp: Path) -> dict:
    a, b = tmp / "torch.safetensors", tmp / "native.safetensors"
    _run([engine, "--device", "cuda", "--runtime", "torch", "--inputs", inputs, "--output", a, "--json"], False)
    out = _run([engine, "--device", "cuda", "--runtime", "native", "--inputs", inputs, "--output", b, "--json"], True)
    assert a.read_bytes() == b.read_bytes()         # bit for bit, and the same file bytes
    return json.loads(out.stdout)


def _mlp_engine(tmp_path: Path, t: int, d: int, f: int, seed: int) -> tuple[Path, dict]:
    """The bf16 MLP's engine at T, D, F = t, d, f, and float32 inputs for it (scaled to unit outputs)."""
    src = tmp_path / "mlp.xg"
    src.write_text(MLP)
    engine = tmp_path / "mlp.xge"
    xg.compile_file(src, target=local_target(), tune="predict", dims={"T": t, "D": d, "F": f}).save(engine)
    g = torch.Generator().manual_seed(seed)
    inputs = {"X": torch.randn(t, d, generator=g), "W1": torch.randn(d, f, generator=g) / d ** 0.5,
              "B1": torch.randn(f, generator=g), "W2": torch.randn(f, d, generator=g) / f ** 0.5}
    return engine, inputs


def test_mlp_without_torch_is_bit_identical(tmp_path: Path) -> None:
    engine, inputs = _mlp_engine(tmp_path, 512, 256, 704, seed=0)
    save_tensors(tmp_path / "in.safetensors", {k: v.to(torch.bfloat16) for k, v in inputs.items()})
    summary = _same_outputs(engine, tmp_path / "in.safetensors", tmp_path)
    assert summary["runtime"] == "native" and summary["outputs"]["out"]["shape"] == [512, 256]


def _gpt2_engine(path: Path) -> tuple[Any, dict]:
    """(the hf_zoo GPT-2 model, its example inputs), its bf16 engine saved at `path`."""
    sys.path.insert(0, str(REPO / "tests" / "unit" / "importers"))
    from hf_zoo import build
    m = build("gpt2")
    kwargs = m.inputs(2, 16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compiled = xg.compile(m.model.to(torch.bfloat16), example_kwargs=kwargs, target=local_target(), tune="predict")
    compiled.engine.save(path)
    return m, kwargs


def test_gpt2_without_torch_is_bit_identical(tmp_path: Path) -> None:
    engine = tmp_path / "gpt2.xge"
    _m, kwargs = _gpt2_engine(engine)
    save_tensors(tmp_path / "in.safetensors", kwargs)
    _same_outputs(engine, tmp_path / "in.safetensors", tmp_path)


def test_runtime_api_reuses_what_it_loaded_and_binds_cuda_memory(tmp_path: Path) -> None:
    from xgbuild.runtime.device import CudaDevice
    from xgbuild.runtime.host_io import HostArray
    from xgbuild.runtime.native import NativeEngine
    src = tmp_path / "m.xg"
    src.write_text("extern Tensor[float32, T, D] X\nextern Tensor[float32, D, F] W\ndef main() {\n"
                   "    return softmax(transpose(X @ W), dim=1)\n}\n")
    path = tmp_path / "m.xge"
    xg.compile_file(src, target=local_target(), tune="predict", dims={"T": 96, "D": 64, "F": 80}).save(path)
    eng = NativeEngine.load(path)
    rng = np.random.default_rng()
    x, w = rng.standard_normal((96, 64)).astype(np.float32), rng.standard_normal((64, 80)).astype(np.float32)
    first = eng.run({"X": x, "W": w}).to_host()["out"].array
    loaded = dict(eng.executor().launcher._loaded)
    second = eng.run({"X": HostArray(x, "float32"), "W": w}).to_host()["out"].array
    assert np.array_equal(first, second) and eng.executor().launcher._loaded == loaded
    ref = torch.softmax((torch.from_numpy(x).double() @ torch.from_numpy(w).double()).T, dim=1).numpy()
    assert np.linalg.norm(first - ref) / np.linalg.norm(ref) < 1e-4
    # torch's CUDA memory, bound in place through the CUDA Array Interface (no copy)
    tx, tw = torch.from_numpy(x).cuda(), torch.from_numpy(w).cuda()
    third = eng.run({"X": tx, "W": tw}).to_host()["out"].array
    assert np.array_equal(first, third)
    # strided copies (the runtime's PTX kernel) for every element size
    dev = CudaDevice.get(0)
    for dt, np_dt in (("int8", np.int8), ("float16", np.float16), ("float32", np.float32), ("int64", np.int64)):
        host = rng.integers(-100, 100, size=(3, 5, 7, 2, 4)).astype(np_dt)
        a = dev.upload(host, dt)
        view = a.permute(4, 2, 0, 3, 1)[1:, :, 1:]
        assert np.array_equal(view.contiguous().numpy(), host.transpose(4, 2, 0, 3, 1)[1:, :, 1:])


def test_check_mode_and_profile_without_torch(tmp_path: Path) -> None:
    src = tmp_path / "m.xg"
    src.write_text("extern Tensor[float32, T, D] X\nextern Tensor[float32, D, F] W\ndef main() {\n"
                   "    h = relu(X @ W)\n    return softmax(h * 2.0, dim=1)\n}\n")
    path = tmp_path / "m.xge"
    xg.compile_file(src, target=local_target(), tune="predict", dims={"T": 1024, "D": 512, "F": 768}).save(path)
    x = torch.randn(1024, 512)
    x[5, 7] = float("nan")
    save_tensors(tmp_path / "nan.npz", {"X": x, "W": torch.randn(512, 768)})
    proc = subprocess.run([sys.executable, str(NO_TORCH), str(path), "--device", "cuda", "--inputs",
                           str(tmp_path / "nan.npz")], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert proc.returncode == 1 and "check failed" in proc.stderr and "line 5" in proc.stderr, proc.stderr
    trace = tmp_path / "run.json"
    out = _run([path, "--device", "cuda", "--runtime", "native", "--dim", "T=1024", "--dim", "D=512", "--dim", "F=768",
                "--warmup", "2", "--iterations", "5", "--profile", "--trace", trace, "--json"], True)
    prof = json.loads(out.stdout)["profile"]
    assert prof["device"] == "cuda" and prof["iterations"] == 5
    assert all(r["where"].startswith("line ") and r["launches"] == 1 for r in prof["rows"]), prof["rows"]
    assert 0 <= prof["host_share"] < 1 and prof["kernels_ms"] <= prof["run_ms"]["max"]
    events = json.loads(trace.read_text())["traceEvents"]
    assert len([e for e in events if e["ph"] == "X" and e["tid"] == 1]) == 5 * len(prof["rows"])


def test_dlpack_in_and_out_without_copies(tmp_path: Path) -> None:
    """torch's bfloat16 CUDA tensors (which have no CUDA Array Interface) go in through DLPack, in
    place; the output comes out to torch through DLPack, in place, equal to the torch runtime's."""
    from xgbuild.runtime.engine import Engine
    from xgbuild.runtime.native import NativeEngine
    path, inputs = _mlp_engine(tmp_path, 256, 128, 352, seed=7)
    cuda = {k: v.to(torch.bfloat16).cuda() for k, v in inputs.items()}
    eng = NativeEngine.load(path)
    result = eng.run(cuda)
    out = result.outputs["out"]
    y = torch.from_dlpack(out)
    assert y.dtype == torch.bfloat16 and y.data_ptr() == out.data_ptr() and y.shape == (256, 128)
    ref = Engine.load(path).run(cuda, device="cuda").tensors["out"]
    assert torch.equal(y, ref)
    exact = torch.nn.functional.gelu(inputs["X"].double() @ inputs["W1"].double() + inputs["B1"].double()) @ inputs["W2"].double()
    assert float((y.double().cpu() - exact).norm() / exact.norm()) < 2e-2
    x_view = eng.check_inputs(cuda)["X"]
    assert x_view.data_ptr() == cuda["X"].data_ptr()          # bound in place, not copied
    del result, out
    assert torch.equal(y, ref)                                # torch's view keeps XG's memory alive


def test_later_runs_launch_a_cuda_graph_with_the_same_bits(tmp_path: Path) -> None:
    """A signature's second run is captured as a CUDA graph (the driver's, no torch), and it and
    later runs launch it: the same bits as the kernel-by-kernel first run and as the torch runtime,
    results that do not alias each other, a NaN still caught by check mode, and XG_CUDA_GRAPHS=0
    keeps launching kernel by kernel."""
    from xgbuild.runtime.engine import Engine
    from xgbuild.runtime.host_io import float_view
    from xgbuild.runtime.native import NativeEngine
    from xgbuild.settings import RunSettings
    path = tmp_path / "gpt2.xge"
    m, kwargs = _gpt2_engine(path)
    feed = {k: v.numpy() for k, v in kwargs.items()}
    ids = feed["input_ids"]
    eng = NativeEngine.load(path)
    runs = [eng.run(feed) for _ in range(4)]
    ex = eng.executor()
    assert ex.capture_failure is None and len(ex._captured) == 1, ex.capture_failure
    name = next(iter(runs[0].outputs))
    host = [r.to_host()[name] for r in runs]
    assert all(np.array_equal(host[0].array, h.array) for h in host[1:])
    assert len({r.outputs[name].data_ptr() for r in runs}) == 4         # no result aliases another
    ref = Engine.load(path).run({k: v.cuda() for k, v in kwargs.items()}, device="cuda").tensors[name]
    assert np.array_equal(float_view(host[-1]), ref.float().cpu().numpy())
    other = {**feed, "input_ids": np.random.default_rng().integers(0, m.model.config.vocab_size, ids.shape)}
    again = eng.run(other).to_host()[name].array
    fresh = NativeEngine.load(path, RunSettings(cuda_graphs=False))
    plain = fresh.run(other).to_host()[name].array
    fresh.run(other)
    assert np.array_equal(again, plain) and not fresh.executor()._captured
    # check mode through the graph: a float engine whose input turns NaN on its third run
    src = tmp_path / "m.xg"
    src.write_text("extern Tensor[float32, T, D] X\nextern Tensor[float32, D, F] W\ndef main() {\n"
                   "    h = relu(X @ W)\n    return softmax(h * 2.0, dim=1)\n}\n")
    xg.compile_file(src, target=local_target(), tune="predict", dims={"T": 256, "D": 128, "F": 192}).save(tmp_path / "m.xge")
    e2 = NativeEngine.load(tmp_path / "m.xge")
    x, w = np.random.default_rng(1).standard_normal((256, 128)).astype(np.float32), np.ones((128, 192), np.float32)
    e2.run({"X": x, "W": w})
    e2.run({"X": x, "W": w})
    assert len(e2.executor()._captured) == 1
    x[3, 4] = np.nan
    with pytest.raises(xg.ExecutionError, match="check failed"):
        e2.run({"X": x, "W": w})
