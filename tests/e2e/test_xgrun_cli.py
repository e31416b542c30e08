"""`xgrun` end to end: inputs and outputs as files, `--json`, seeds, and every kind of bad input.

A bad input is exit 1 with one `error:` line naming the input or the file, and never a traceback.
Most cases run `xgrun`'s real entry point in this process (`cli`); `test_real_processes` runs the
installed command for the cases where the process itself matters.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import safetensors.torch
import torch
from conftest import Rand, assert_clean_failure, cli, compile_text, finish, src_text, start_process, write_program

import xg
from xgbuild.runtime.tensor_io import load_tensors, save_tensors

FIXED = src_text("""
    extern Tensor[float32, 4, D] X
    extern Tensor[float32, D] G
    def main() {
        return X * G
    }
""")

MIXED = src_text("""
    extern Tensor[float32, T, D] X
    extern Tensor[float32] B
    def safe_div(float32 a, float32 b) -> Result[float32] {
        if b == 0 { return DivByZero }
        return Ok(a / b)
    }
    def main() {
        return relu(X) * 2.0, sum(X), safe_div(1.0, B)
    }
""")


@pytest.fixture
def norms(example_files):
    return example_files["norms"]


@pytest.fixture
def norms_inputs(rand: Rand) -> dict[str, torch.Tensor]:
    t, d = rand.size(1, 8), rand.size(2, 8)
    return {"X": rand.tensor((t, d))[0], "G": rand.tensor((d,))[0]}


def saved(tmp_path, tensors: dict, name: str = "in.safetensors"):
    path = tmp_path / name
    save_tensors(path, tensors)
    return path


# ------------------------------------------------------------------------------ bad input

def test_missing_external(tmp_path, norms, norms_inputs) -> None:
    res = cli("xgrun", norms, "--inputs", saved(tmp_path, {"X": norms_inputs["X"]}))
    assert_clean_failure(res, "missing input", "`G`")


def test_extra_external(tmp_path, norms, norms_inputs) -> None:
    res = cli("xgrun", norms, "--inputs", saved(tmp_path, {**norms_inputs, "Z": torch.ones(2)}))
    assert_clean_failure(res, "unknown input", "`Z`")


def test_wrong_dtype(tmp_path, norms, norms_inputs) -> None:
    inputs = {**norms_inputs, "X": norms_inputs["X"].double()}
    res = cli("xgrun", norms, "--inputs", saved(tmp_path, inputs, "in.npz"))
    assert_clean_failure(res, "`X`", "float64", "float32")


def test_wrong_rank(tmp_path, norms, norms_inputs) -> None:
    inputs = {**norms_inputs, "X": norms_inputs["X"].reshape(-1)}
    res = cli("xgrun", norms, "--inputs", saved(tmp_path, inputs))
    assert_clean_failure(res, "`X`", "rank 2")


def test_wrong_fixed_dim(tmp_path, rand: Rand) -> None:
    engine = tmp_path / "fixed.xge"
    compile_text(tmp_path, FIXED, "fixed.xg").save(engine)
    res = cli("xgrun", engine, "--inputs", saved(tmp_path, {"X": rand.tensor((5, 3))[0], "G": rand.tensor((3,))[0]}))
    assert_clean_failure(res, "`X`", "dimension 0 must be 4")


def test_inconsistent_symbol(tmp_path, norms, rand: Rand) -> None:
    res = cli("xgrun", norms, "--inputs", saved(tmp_path, {"X": rand.tensor((3, 4))[0], "G": rand.tensor((5,))[0]}))
    assert_clean_failure(res, "`G`", "D = 5", "D = 4")


def test_device_cuda_on_a_cpu_only_host(norms) -> None:
    if torch.cuda.is_available():
        pytest.skip("this host has a GPU")
    assert_clean_failure(cli("xgrun", norms, "--device", "cuda"), "GPU")


def test_unknown_device_is_a_usage_error(norms) -> None:
    assert_clean_failure(cli("xgrun", norms, "--device", "tpu"), "--device", code=2)


@pytest.mark.parametrize("actual, named", [(".safetensors", ".npz"), (".npz", ".pt"), (".pt", ".safetensors")])
def test_inputs_file_is_not_what_its_suffix_says(actual: str, named: str, tmp_path, norms, norms_inputs) -> None:
    real = saved(tmp_path, norms_inputs, f"real{actual}")
    lying = tmp_path / f"inputs{named}"
    lying.write_bytes(real.read_bytes())
    assert_clean_failure(cli("xgrun", norms, "--inputs", lying), str(lying), "not a valid")


def test_inputs_file_that_is_garbage(tmp_path, norms) -> None:
    junk = tmp_path / "in.npz"
    junk.write_bytes(b"definitely not a zip archive\n" * 10)
    assert_clean_failure(cli("xgrun", norms, "--inputs", junk), str(junk))


def test_inputs_file_missing(tmp_path, norms) -> None:
    missing = tmp_path / "nope.npz"
    assert_clean_failure(cli("xgrun", norms, "--inputs", missing), str(missing), "does not exist")


def test_output_with_an_unsupported_suffix(tmp_path, norms) -> None:
    out = tmp_path / "out.csv"
    assert_clean_failure(cli("xgrun", norms, "--output", out), str(out), "suffix")
    assert not out.exists()


def test_bfloat16_output_to_npz_is_refused(tmp_path, example_files) -> None:
    out = tmp_path / "att.npz"
    assert_clean_failure(cli("xgrun", example_files["attention"], "--output", out), "bfloat16", ".npz")


def test_missing_engine_file(tmp_path) -> None:
    missing = tmp_path / "none.xge"
    assert_clean_failure(cli("xgrun", missing), str(missing), "does not exist")


# ------------------------------------------------------------------------------ inputs / outputs

def checksums(res) -> dict[str, str]:
    assert res.code == 0, res.both
    summary = json.loads(res.out)
    return {name: d["checksum"] for name, d in summary["outputs"].items()}


def test_inputs_in_every_format_give_the_same_checksums(tmp_path, norms, norms_inputs) -> None:
    sums = [checksums(cli("xgrun", norms, "--inputs", saved(tmp_path, norms_inputs, f"in{suffix}"), "--json"))
            for suffix in (".npz", ".safetensors", ".pt")]
    assert sums[0] == sums[1] == sums[2]


def test_bfloat16_inputs_from_safetensors_and_pt(tmp_path, example_files, rand: Rand) -> None:
    s, d = rand.size(2, 8), rand.size(2, 8)
    inputs = {name: rand.tensor((s, d), "bfloat16")[0] for name in "QKV"}
    a = checksums(cli("xgrun", example_files["attention"], "--inputs", saved(tmp_path, inputs, "a.safetensors"),
                      "--json"))
    b = checksums(cli("xgrun", example_files["attention"], "--inputs", saved(tmp_path, inputs, "a.pt"), "--json"))
    assert a == b


@pytest.mark.parametrize("suffix", [".npz", ".safetensors", ".pt"])
def test_output_file_equals_the_api_result(suffix: str, tmp_path, rand: Rand) -> None:
    engine_path = tmp_path / "mixed.xge"
    engine = compile_text(tmp_path, MIXED, "mixed.xg")
    engine.save(engine_path)
    x, _ = rand.tensor((rand.size(1, 6), rand.size(1, 6)))
    b = torch.tensor(float(rand.gen.choice([0.0, 4.0])))
    inputs = saved(tmp_path, {"X": x, "B": b}, f"in{suffix}")
    out = tmp_path / f"out{suffix}"
    res = cli("xgrun", engine_path, "--inputs", inputs, "--output", out)
    assert res.code == 0, res.both
    written = load_tensors(out, role="output file")
    relu, total, result = xg.run_engine(xg.load_engine(engine_path), external_values={"X": x, "B": b}).value
    assert torch.equal(written["out_0"], relu)
    assert written["out_1"].dim() == 0 and float(written["out_1"]) == total
    assert bool(written["out_2_ok"]) == result.ok
    if result.ok:
        assert float(written["out_2_value"]) == result.value
    else:
        assert "out_2_value" not in written


def test_output_file_keeps_rank0_dtypes(tmp_path, rand: Rand) -> None:
    """A rank-0 output is saved (and checksummed) in its declared dtype, as tensors are."""
    path = tmp_path / "scalars.xge"
    compile_text(tmp_path, src_text("""
        extern Tensor[float64, N] X
        extern Tensor[int32, N] Z
        def main() {
            return sum(X), Z[0], X * 2.0
        }
    """), "scalars.xg").save(path)
    x = torch.from_numpy(rand.gen.standard_normal(5))
    z = rand.ints((5,), -100, 100, "int32")
    out = tmp_path / "out.safetensors"
    res = cli("xgrun", path, "--inputs", saved(tmp_path, {"X": x, "Z": z}), "--output", out, "--json")
    assert res.code == 0, res.both
    declared = [o["tensor"]["dtype"] for o in xg.load_engine(path).manifest["entry"]["output"]["tuple"]]
    assert declared == ["float64", "int32", "float64"]
    reported = json.loads(res.out)["outputs"]
    written = safetensors.torch.load_file(out)
    assert [reported[f"out_{i}"]["dtype"] for i in range(3)] == declared
    assert written["out_0"].dtype == torch.float64 and float(written["out_0"]) == float(x.sum())
    assert written["out_1"].dtype == torch.int32


def test_json_is_one_object(norms) -> None:
    res = cli("xgrun", norms, "--json", "--dim", "T=3", "--dim", "D=5")
    assert res.code == 0, res.both
    summary = json.loads(res.out)          # the whole of stdout is one JSON value
    assert isinstance(summary, dict)
    assert summary["outputs"]["out"]["shape"] == [3, 5] and summary["outputs"]["out"]["dtype"] == "float32"
    assert summary["check"] is True and summary["device"] == "cpu" and summary["target"] == "H100"
    assert summary["specialization"]["symbols"] == {"D": 5, "T": 3}


def test_same_seed_same_checksums(norms) -> None:
    a = checksums(cli("xgrun", norms, "--json", "--seed", "11"))
    b = checksums(cli("xgrun", norms, "--json", "--seed", "11"))
    c = checksums(cli("xgrun", norms, "--json", "--seed", "12"))
    assert a == b and a != c


def test_human_summary(norms) -> None:
    res = cli("xgrun", norms, "--seed", "3")
    assert res.code == 0 and res.err == ""
    assert "checksum" in res.out and "check on" in res.out and "target H100" in res.out


# ------------------------------------------------------------------------------ real processes

def test_real_processes(tmp_path, norms, norms_inputs) -> None:
    """The installed `xgrun`, side by side: the exit status a shell sees, and no traceback."""
    bad = tmp_path / "flipped.xge"
    data = bytearray(norms.read_bytes())
    data[len(data) // 2] ^= 0xFF
    bad.write_bytes(bytes(data))
    missing = saved(tmp_path, {"X": norms_inputs["X"]})
    procs = {
        "ok": start_process("xgrun", norms, "--json"),
        "flipped": start_process("xgrun", bad),
        "missing": start_process("xgrun", norms, "--inputs", missing),
    }
    if not torch.cuda.is_available():
        procs["cuda"] = start_process("xgrun", norms, "--device", "cuda")
    results = {name: finish(p) for name, p in procs.items()}
    assert results["ok"].code == 0 and json.loads(results["ok"].out)["outputs"], results["ok"].both
    assert_clean_failure(results["flipped"], str(bad), "corrupt")
    assert_clean_failure(results["missing"], "`G`")
    if "cuda" in results:
        assert_clean_failure(results["cuda"], "GPU")


def test_program_without_inputs(tmp_path) -> None:
    path = tmp_path / "consts.xge"
    xg.compile_file(write_program(tmp_path, src_text("""
        def main() {
            return ones([2, 3], float32) * 4.0
        }
    """))).save(path)
    out = tmp_path / "o.npz"
    res = cli("xgrun", path, "--output", out)
    assert res.code == 0, res.both
    assert np.array_equal(np.load(out)["out"], np.full((2, 3), 4.0, dtype=np.float32))
