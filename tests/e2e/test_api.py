"""The public Python API (`xg`): the seed's README snippet, exception types, specialisation cache.

Every way to misuse `xg.run_engine` / `xg.load_engine` / `xg.compile_file` raises the matching
`xg` exception (all subclasses of `xg.XGError`), never a bare Python or torch error.
"""

from __future__ import annotations

import re
import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import EXAMPLES, REPO_ROOT, TWO_GB, Rand, compile_text, src_text, write_program

import xg


def readme_snippet() -> str:
    """The Python block of the seed spec's `## Examples` section, exactly as written."""
    candidates = sorted((REPO_ROOT.parent / "shared" / "seeds").glob("000_*.txt"))
    if not candidates:
        pytest.skip("the seed spec (../shared/seeds/000_*.txt) is not beside this checkout")
    text = candidates[0].read_text()
    section = text.split("\n## Examples", 1)[1].split("\n## ", 1)[0]
    match = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert match, "no ```python block in the seed's ## Examples section"
    return match.group(1)


def test_readme_snippet_runs_as_written() -> None:
    snippet = readme_snippet()
    assert 'xg.compile_file(Path("examples/cluster_matmul.xg"))' in snippet
    proc = subprocess.run([sys.executable, "-c", snippet], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    value, meta = proc.stdout.split("]])\n", 1)
    assert value.startswith("tensor([[") and value.count("\n") == 1, proc.stdout   # a 2x2 result
    # The metadata prints as a few aligned lines (it is still a dict: see test_metadata_*).
    assert meta.splitlines()[0].split() == ["target", "H100", "x2", "GPUs"], meta
    assert re.search(r"^engine +[0-9a-f]{12}$", meta, re.M), meta


# ------------------------------------------------------------------------------ input errors

@pytest.fixture
def norms(example_engines) -> xg.Engine:
    return example_engines["norms"]


@pytest.fixture
def good(rand: Rand) -> dict[str, torch.Tensor]:
    return {"X": rand.tensor((3, 4))[0], "G": rand.tensor((4,))[0]}


def test_missing_external(norms, good) -> None:
    with pytest.raises(xg.InputError, match="missing input `G`"):
        xg.run_engine(norms, external_values={"X": good["X"]})


def test_no_externals_at_all(norms) -> None:
    with pytest.raises(xg.InputError, match="missing inputs `X`, `G`"):
        xg.run_engine(norms)


def test_extra_external(norms, good) -> None:
    with pytest.raises(xg.InputError, match="unknown input `Y`"):
        xg.run_engine(norms, external_values={**good, "Y": torch.ones(1)})


@pytest.mark.parametrize("value", [torch.ones(3, 4, dtype=torch.float64), torch.ones(3, 4, dtype=torch.bfloat16),
                                   torch.ones(3, 4, dtype=torch.int64), np.ones((3, 4))])
def test_wrong_dtype(value, norms, good) -> None:
    with pytest.raises(xg.InputError, match="input `X` has dtype .*the engine expects float32"):
        xg.run_engine(norms, external_values={**good, "X": value})


def test_numpy_float32_is_accepted(norms, good) -> None:
    y = xg.run_engine(norms, external_values={"X": good["X"].numpy(), "G": good["G"].numpy()}).value
    assert torch.equal(y, xg.run_engine(norms, external_values=good).value)


def test_not_a_tensor(norms, good) -> None:
    with pytest.raises(xg.InputError, match="input `X` is a list"):
        xg.run_engine(norms, external_values={**good, "X": [[1.0]]})


@pytest.mark.parametrize("shape", [(12,), (1, 3, 4), ()])
def test_wrong_rank(shape, norms, good) -> None:
    with pytest.raises(xg.InputError, match="input `X` must have rank 2"):
        xg.run_engine(norms, external_values={**good, "X": torch.ones(shape)})


def test_wrong_fixed_dim(tmp_path) -> None:
    engine = compile_text(tmp_path, src_text("""
        extern Tensor[float32, 4, D] X
        def main() {
            return X * 2.0
        }
    """))
    with pytest.raises(xg.InputError, match=r"input `X` must have shape \[4, 'D'\], got \[5, 3\]"):
        engine.run({"X": torch.ones(5, 3)})


def test_inconsistent_symbol(norms) -> None:
    with pytest.raises(xg.InputError, match="`G` has D = 5 .* fixed D = 4"):
        xg.run_engine(norms, external_values={"X": torch.ones(3, 4), "G": torch.ones(5)})


def test_tensor_on_another_device(norms, good) -> None:
    with pytest.raises(xg.InputError, match="input `X` is on meta"):
        xg.run_engine(norms, external_values={**good, "X": torch.empty(3, 4, device=torch.device("meta"))})


def test_cuda_device_without_gpu_kernels(good) -> None:
    cpu_only = xg.compile_file(EXAMPLES / "norms.xg", kernels=False)
    assert cpu_only.manifest["kernels"] == []
    with pytest.raises(xg.EngineError, match="no GPU kernels.*--no-kernels"):
        xg.run_engine(cpu_only, external_values=good, device="cuda")


def test_cuda_device_on_a_host_without_a_gpu(norms, good) -> None:
    if torch.cuda.is_available():
        pytest.skip("this host has a GPU")
    assert norms.manifest["kernels"]
    with pytest.raises(xg.EngineError, match="needs an NVIDIA GPU"):
        xg.run_engine(norms, external_values=good, device="cuda")


def test_unknown_device(norms, good) -> None:
    with pytest.raises(xg.InputError, match="unknown device"):
        xg.run_engine(norms, external_values=good, device="tpu")


def test_run_engine_needs_an_engine() -> None:
    with pytest.raises(xg.XGError, match="run_engine takes an Engine"):
        xg.run_engine("examples/norms.xg")  # type: ignore[arg-type]


def test_reduction_over_an_empty_dim_is_an_xg_error(norms) -> None:
    """`max` over a dimension of size 0 has no value: an `xg` error, not a torch IndexError."""
    with pytest.raises(xg.XGError):
        xg.run_engine(norms, external_values={"X": torch.ones(3, 0), "G": torch.ones(0)})


def test_every_exception_is_an_xg_error() -> None:
    for cls in (xg.CompileError, xg.EngineError, xg.InputError, xg.ExecutionError):
        assert issubclass(cls, xg.XGError)


# ------------------------------------------------------------------------------ compile and load errors

def test_compile_error_carries_rendered_diagnostics(tmp_path) -> None:
    path = write_program(tmp_path, src_text("""
        def main() {
            x = 1 + 2.0
            return x / 0
        }
    """), "bad.xg")
    with pytest.raises(xg.CompileError) as info:
        xg.compile_file(path)
    assert info.value.diagnostics, "CompileError.diagnostics is empty"
    assert "error[XG" in str(info.value) and "bad.xg:" in str(info.value)


def test_compile_missing_file(tmp_path) -> None:
    with pytest.raises(xg.CompileError, match="nope.xg"):
        xg.compile_file(tmp_path / "nope.xg")


def test_compile_bad_num_gpu() -> None:
    with pytest.raises(xg.XGError, match="num_gpu"):
        xg.compile_file(EXAMPLES / "norms.xg", num_gpu=0)


def test_compile_unknown_target() -> None:
    with pytest.raises(xg.CompileError) as info:
        xg.compile_file(EXAMPLES / "norms.xg", target="NOT_A_GPU")
    # The argument is wrong, not the source: nothing of it is underlined (issue 25).
    assert "-->" not in str(info.value) and "TARGET_GPU" not in str(info.value), str(info.value)
    assert "`target=`" in str(info.value)


def test_load_missing_engine(tmp_path) -> None:
    with pytest.raises(xg.EngineError, match="does not exist"):
        xg.load_engine(tmp_path / "none.xge")


def test_load_a_source_file_as_an_engine() -> None:
    with pytest.raises(xg.EngineError, match="not an XG engine"):
        xg.load_engine(EXAMPLES / "norms.xg")


def test_target_and_num_gpu_overrides_reach_the_metadata(rand: Rand) -> None:
    engine = xg.compile_file(EXAMPLES / "norms.xg", target="GB200", num_gpu=4)
    meta = xg.run_engine(engine, external_values={"X": rand.tensor((2, 3))[0], "G": rand.tensor((3,))[0]}).metadata
    assert (meta["target"], meta["num_gpu"]) == ("GB200", 4)
    assert engine.manifest["target_profile"]["arch"] == "sm_100"


# ------------------------------------------------------------------------------ specialisation cache

def test_specialisation_is_cached_per_shape(rand: Rand) -> None:
    engine = xg.compile_file(EXAMPLES / "norms.xg")        # a fresh engine: an empty cache

    def run(t: int, d: int) -> dict:
        inputs = {"X": rand.tensor((t, d))[0], "G": rand.tensor((d,))[0]}
        return xg.run_engine(engine, external_values=inputs).metadata["specialization"]

    first, second, other, back = run(3, 4), run(3, 4), run(5, 4), run(3, 4)
    assert (first["cached"], second["cached"], other["cached"], back["cached"]) == (False, True, False, True)
    assert first["symbols"] == {"T": 3, "D": 4} and other["symbols"] == {"T": 5, "D": 4}
    assert first["inputs"] == {"X": {"dtype": "float32", "shape": [3, 4]}, "G": {"dtype": "float32", "shape": [4]}}


def test_specialisation_cache_survives_float64_and_check_modes(rand: Rand) -> None:
    engine = xg.compile_file(EXAMPLES / "cluster_matmul.xg")
    inputs = {"A": rand.tensor((4, 3))[0], "B": rand.tensor((3, 2))[0]}
    assert engine.run(inputs).metadata["specialization"]["cached"] is False
    assert engine.run(inputs, float64=True).metadata["specialization"]["cached"] is True
    assert engine.run(inputs, check=False).metadata["specialization"]["cached"] is True


def test_a_loaded_engine_starts_with_an_empty_cache(tmp_path, rand: Rand) -> None:
    engine = xg.compile_file(EXAMPLES / "norms.xg")
    inputs = {"X": rand.tensor((2, 2))[0], "G": rand.tensor((2,))[0]}
    engine.run(inputs)
    engine.save(tmp_path / "n.xge")
    loaded = xg.load_engine(tmp_path / "n.xge")
    assert loaded.run(inputs).metadata["specialization"]["cached"] is False


def test_metadata_timings_cover_every_node(rand: Rand, example_engines) -> None:
    engine = example_engines["attention"]
    inputs = {n: rand.tensor((4, 8), "bfloat16")[0] for n in "QKV"}
    meta = engine.run(inputs).metadata
    ops = meta["timings"]["ops"]
    assert len(ops) == len(engine.graph.nodes) and meta["timings"]["total_ms"] > 0
    assert {"matmul", "softmax", "cast", "transpose"} <= {o["op"] for o in ops}


def test_compile_file_reads_xg_hw_dir_for_the_memory_check(tmp_path, monkeypatch, small_h100_hw_dir) -> None:
    path = write_program(tmp_path, TWO_GB)
    monkeypatch.setenv("XG_HW_DIR", str(small_h100_hw_dir))
    with pytest.raises(xg.CompileError, match="XG0504"):
        xg.compile_file(path, kernels=False)


# ------------------------------------------------------------------------------ how things print

def test_dir_xg_lists_the_public_api_only() -> None:
    names = dir(xg)
    assert names == sorted(xg.__all__)
    for helper in ("Any", "Mapping", "Path", "Settings", "RunSettings", "child_env", "annotations"):
        assert helper not in names


def test_metadata_prints_as_a_short_summary_and_stays_a_dict(norms, good) -> None:
    import json
    meta = xg.run_engine(norms, external_values=good).metadata
    assert isinstance(meta, dict) and meta["target"] == "H100"
    assert json.loads(json.dumps(meta))["specialization"]["symbols"] == {"D": 4, "T": 3}
    text = str(meta)
    assert not text.startswith("{") and len(text.splitlines()) >= 5, text
    assert "X: float32[3, 4], G: float32[4]" in text and "D=4, T=3" in text
    assert not re.search(r"\d\.\d{6,}", text), text        # times rounded, not 16 digits
    assert "slowest ops" in text and "ms" in text


def test_run_result_repr_is_short(norms, good) -> None:
    text = repr(xg.run_engine(norms, external_values=good))
    assert text.startswith("RunResult(value=tensor(") and "outputs=['out']" in text
    assert len(text) < 800, text


def test_engine_repr_is_short(norms) -> None:
    text = repr(norms)
    assert len(text) < 200, text
    assert text.startswith("Engine(X: float32[T, D], G: float32[D]; target H100") and norms.digest[:12] in text
