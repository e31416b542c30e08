"""An engine's reader needs neither torch nor Triton (issue 22: a deploy host's runtime): with both
unimportable, an engine file is read and checked (seal, manifest, IR, weights header), its
signature verified against trusted keys, and a damaged or unsigned one refused with its reason.
`dtypes.ITEMSIZE` (torch-free) agrees with torch's itemsizes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import torch

import xg
from xgbuild.dtypes import ITEMSIZE, TORCH_DTYPES

REPO = Path(__file__).resolve().parents[3]

READER = textwrap.dedent("""
    import json, sys
    class Block:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("torch", "triton"):
                raise ImportError(f"No module named {name!r} (made unimportable by the test)")
            return None
    sys.meta_path.insert(0, Block())
    from xgbuild.errors import EngineError
    from xgbuild.packager.engine_file import read_engine
    from xgbuild.packager.signing import load_trusted_keys, trust_verdict
    out = {}
    ef = read_engine(sys.argv[1])
    out["inputs"] = [s["name"] for s in ef.manifest["entry"]["inputs"]]
    out["kernels"] = len(ef.manifest.get("kernels", []))
    out["trust"] = trust_verdict(ef.envelope, ef.digest, load_trusted_keys(sys.argv[2]), "engine").trusted
    try:
        read_engine(sys.argv[3])
        out["damaged"] = "read"
    except EngineError as exc:
        out["damaged"] = str(exc)
    unsigned = read_engine(sys.argv[4])
    verdict = trust_verdict(unsigned.envelope, unsigned.digest, load_trusted_keys(sys.argv[2]), "engine")
    out["unsigned"] = "trusted" if verdict.trusted else verdict.problem
    out["torch_loaded"] = any(m.split(".")[0] in ("torch", "triton") for m in sys.modules)
    print(json.dumps(out))
""")


def test_itemsizes_agree_with_torch() -> None:
    assert {n: t.itemsize for n, t in TORCH_DTYPES.items()} == ITEMSIZE
    assert TORCH_DTYPES["bfloat16"] is torch.bfloat16


def test_an_engine_is_read_and_verified_without_torch_or_triton(tmp_path) -> None:
    from xgbuild.packager.signing import generate_key
    src = tmp_path / "m.xg"
    src.write_text("extern Tensor[float32, T, D] X\nextern Tensor[float32, D] G\ndef main() {\n"
                   "    return X * G\n}\n")
    engine = xg.compile_file(src, target="H100", dims={"T": 16, "D": 32})
    keys = tmp_path / "keys"
    keys.mkdir()
    private, public, _ = generate_key(keys / "release")
    unsigned = tmp_path / "unsigned.xge"
    engine.save(unsigned)
    signed = tmp_path / "signed.xge"
    proc = subprocess.run([sys.executable, "-m", "xgbuild.cli.xgbuild", "sign", str(unsigned), "--key", str(private),
                           "--out", str(signed)], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    damaged = tmp_path / "damaged.xge"
    data = bytearray(signed.read_bytes())
    data[len(data) // 2] ^= 0xFF
    damaged.write_bytes(bytes(data))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    run = subprocess.run([sys.executable, "-c", READER, str(signed), str(keys), str(damaged), str(unsigned)],
                         capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout)
    assert out["inputs"] == ["X", "G"] and out["kernels"] >= 1 and out["trust"] is True
    assert out["damaged"] != "read" and "damaged.xge" in out["damaged"]
    assert "is not signed" in out["unsigned"]
    assert out["torch_loaded"] is False
