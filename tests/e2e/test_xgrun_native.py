"""`xgrun` on a host without torch (issue 22's deploy runtime), on this CPU host: with torch and
Triton unimportable, an engine is loaded, verified (seal, digest, signature) and its inputs
checked against its signature (`--dry-run`, files or seeded random inputs), and every way that
can fail is one `error:` line: a bad engine, a bad inputs file, a dtype or shape it does not take,
an index outside its table, no GPU. Neither torch nor Triton is ever loaded. The GPU half (the
same runs against the torch-backed runtime, bit for bit) is tests/gpu/test_native_runtime.py."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO_ROOT, CliResult, assert_clean_failure, src_text, write_program

import xg
from xgbuild.runtime.host_io import HostArray, bf16_bits, save_host_tensors

SCRIPT = Path(__file__).with_name("no_torch.py")
PROGRAM = src_text("""
    extern Tensor[bfloat16, T, D] X
    extern Tensor[bfloat16, D, F] W
    def main() {
        return relu(X @ W)
    }
""")


def xgrun(*args) -> CliResult:
    proc = subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True,
                          cwd=REPO_ROOT, timeout=300)
    assert "no-torch: loaded nothing" in proc.stderr, proc.stderr
    err = "\n".join(line for line in proc.stderr.splitlines() if not line.startswith("no-torch:"))
    return CliResult(proc.returncode, proc.stdout, err)


@pytest.fixture(scope="module")
def engine(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("native")
    path = tmp / "m.xge"
    xg.compile_file(write_program(tmp, PROGRAM), target="H100", tune="predict", dims={"T": 64, "D": 32, "F": 48}).save(path)
    return path


def _inputs(tmp: Path, suffix: str = ".safetensors", **change) -> Path:
    rng = np.random.default_rng()
    arrays = {"X": HostArray(bf16_bits(rng.standard_normal((64, 32)).astype(np.float32)), "bfloat16"),
              "W": HostArray(bf16_bits(rng.standard_normal((32, 48)).astype(np.float32)), "bfloat16")}
    arrays.update(change)
    path = tmp / f"in{len(list(tmp.iterdir()))}{suffix}"
    save_host_tensors(path, arrays)
    return path


def test_an_engine_is_verified_and_its_inputs_checked_without_torch(engine: Path, tmp_path: Path) -> None:
    res = xgrun(engine, "--dry-run", "--dim", "T=64", "--dim", "D=32", "--dim", "F=48")
    assert res.code == 0, res.both
    assert "verified, inputs match its signature" in res.out and "bfloat16  [64, 32]" in res.out
    again = xgrun(engine, "--dry-run", "--dim", "T=64", "--dim", "D=32", "--dim", "F=48")
    assert again.out.splitlines()[1:3] == res.out.splitlines()[1:3]        # seeded: the same inputs
    inputs = _inputs(tmp_path)
    res = xgrun(engine, "--dry-run", "--inputs", inputs, "--json")
    assert res.code == 0, res.both
    summary = json.loads(res.out)
    assert summary["dry_run"] and summary["kernels"] == 1 and set(summary["inputs"]) == {"X", "W"}
    # the checksums are the torch-backed runtime's for the same file
    from xgbuild.runtime.tensor_io import describe, load_tensors
    assert summary["inputs"] == {k: describe(v) for k, v in load_tensors(inputs).items()}


def test_bad_inputs_are_one_error_line(engine: Path, tmp_path: Path) -> None:
    rng = np.random.default_rng()
    f32 = HostArray(rng.standard_normal((64, 32)).astype(np.float32), "float32")
    cases = [
        (_inputs(tmp_path, ".npz", X=f32, W=HostArray(rng.standard_normal((32, 48)).astype(np.float32), "float32")),
         "dtype float32, the engine expects bfloat16"),
        (_inputs(tmp_path, X=HostArray(bf16_bits(rng.standard_normal((64, 32, 2)).astype(np.float32)), "bfloat16")),
         "must have rank 2"),
        (_inputs(tmp_path, W=HostArray(bf16_bits(rng.standard_normal((31, 48)).astype(np.float32)), "bfloat16")),
         "fixed D = 32"),
        (tmp_path / "in.pt", "needs torch"),
        (tmp_path / "missing.safetensors", "does not exist"),
    ]
    for path, needle in cases:
        res = xgrun(engine, "--dry-run", "--inputs", path)
        assert_clean_failure(res, needle)
    (tmp_path / "cut.safetensors").write_bytes(_inputs(tmp_path).read_bytes()[:100])
    assert_clean_failure(xgrun(engine, "--dry-run", "--inputs", tmp_path / "cut.safetensors"), "not a valid safetensors")
    save_host_tensors(tmp_path / "one.safetensors", {"X": HostArray(bf16_bits(np.ones((64, 32), np.float32)),
                                                                     "bfloat16")})
    assert_clean_failure(xgrun(engine, "--dry-run", "--inputs", tmp_path / "one.safetensors"), "missing input `W`")


def test_bad_engines_are_refused(engine: Path, tmp_path: Path) -> None:
    cut = tmp_path / "cut.xge"
    cut.write_bytes(engine.read_bytes()[:-40])
    assert_clean_failure(xgrun(cut, "--dry-run"), "corrupt")
    assert_clean_failure(xgrun(engine, "--dry-run", "--expect-digest", "ab" * 32), "not the expected")
    assert_clean_failure(xgrun(engine, "--dry-run", "--expect-digest", "xyz"), "64 hex digits", code=2)
    from xgbuild.packager.signing import generate_key
    generate_key(tmp_path / "keys" / "other")
    assert_clean_failure(xgrun(engine, "--dry-run", "--trusted-keys", tmp_path / "keys"), "signed")
    assert_clean_failure(xgrun(tmp_path / "none.xge", "--dry-run"), "none.xge")


def test_running_needs_a_gpu_and_says_so(engine: Path, tmp_path: Path) -> None:
    res = xgrun(engine, "--inputs", _inputs(tmp_path))
    assert_clean_failure(res, "runs on cuda", code=2)
    res = xgrun(engine, "--device", "cuda", "--inputs", _inputs(tmp_path))
    assert_clean_failure(res, "cannot run on cuda")
    assert_clean_failure(xgrun(engine, "--device", "cuda", "--nproc", "2"), "torch-backed", code=2)
    assert_clean_failure(xgrun(engine, "--runtime", "jax"), "auto, torch or native", code=2)


def test_index_inputs_are_checked_against_their_tables(tmp_path: Path) -> None:
    sys.path.insert(0, str(REPO_ROOT / "tests" / "unit" / "importers"))
    from hf_zoo import VOCAB, build
    m = build("gpt2")
    kwargs = m.inputs(2, 16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compiled = xg.compile(m.model, example_kwargs=kwargs, target="H100", tune="predict")
    path = tmp_path / "gpt2.xge"
    compiled.engine.save(path)
    sig = {s["name"]: s for s in compiled.engine.signature}
    good = {k: HostArray(v.numpy(), sig[k]["dtype"]) for k, v in kwargs.items()}
    save_host_tensors(tmp_path / "ok.safetensors", good)
    res = xgrun(path, "--dry-run", "--inputs", tmp_path / "ok.safetensors")
    assert res.code == 0, res.both
    bad = dict(good, input_ids=HostArray(np.full((2, 16), VOCAB, dtype=np.int64), "int64"))
    save_host_tensors(tmp_path / "bad.safetensors", bad)
    assert_clean_failure(xgrun(path, "--dry-run", "--inputs", tmp_path / "bad.safetensors"),
                         f"outside [0, {VOCAB})")


def test_the_torch_runtime_without_torch_says_what_to_install(engine: Path) -> None:
    res = xgrun(engine, "--runtime", "torch", "--dim", "T=8", "--dim", "D=4", "--dim", "F=4")
    assert_clean_failure(res, "needs `torch`", "pip install 'xg[build]'")


RUNTIME_API = """
import json, sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "triton"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, Block())
import numpy as np
import xg.runtime
from xgbuild.errors import EngineError, InputError
out = {}
eng = xg.runtime.load(sys.argv[1])
x = xg.runtime.HostArray(np.zeros((64, 32), np.uint16), "bfloat16")
w = xg.runtime.HostArray(np.zeros((32, 48), np.uint16), "bfloat16")
out["checked"] = sorted(eng.check_inputs({"X": x, "W": w}))
for bad in ({"X": x}, {"X": x, "W": np.zeros((32, 48), np.float32)}, {"X": x, "W": w, "Z": w}):
    try:
        eng.check_inputs(bad)
    except InputError as exc:
        out.setdefault("refused", []).append(str(exc))
try:
    eng.run({"X": x, "W": w})
except EngineError as exc:
    out["run"] = str(exc)
out["torch"] = [m for m in sys.modules if m.split(".")[0] in ("torch", "triton")]
print(json.dumps(out))
"""


def test_the_runtime_api_without_torch(engine: Path) -> None:
    proc = subprocess.run([sys.executable, "-c", RUNTIME_API, str(engine)], capture_output=True, text=True,
                          cwd=REPO_ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["checked"] == ["W", "X"] and out["torch"] == []
    assert [("missing input `W`" in r, "dtype float32" in r, "unknown input `Z`" in r) for r in out["refused"]] == \
        [(True, False, False), (False, True, False), (False, False, True)]
    assert "cannot run on cuda" in out["run"]


def test_an_output_it_cannot_write_is_refused_before_the_run(engine: Path, tmp_path: Path) -> None:
    inputs = _inputs(tmp_path)
    (tmp_path / "d.safetensors").mkdir()
    for out, needle in ((tmp_path / "d.safetensors", "is a directory"), (tmp_path / "o.pt", "writes .npz or .safetensors"),
                        (tmp_path / "o.txt", "unknown suffix")):
        res = xgrun(engine, "--device", "cuda", "--runtime", "native", "--inputs", inputs, "--output", out)
        assert_clean_failure(res, needle)
        assert "cannot run on cuda" not in res.err       # refused before the GPU is asked for
