"""`xgrun --steps N` on the tiny training model (models/train_tiny.xg): the same losses and final
state as N engine calls fed back by hand; refusals in one line; `xgbuild inspect`'s state and
determinism lines."""

import json
import math
from pathlib import Path

import pytest
import torch

import xg
from conftest import cli, compile_text
from xgbuild.runtime.tensor_io import load_tensors, save_tensors

REPO = Path(__file__).resolve().parents[2]
PARAMS = ["EMB", "G1", "WQ", "WK", "WV", "WO", "G2", "W1", "W2", "GF", "HEAD"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> tuple[Path, Path]:
    """The tiny training engine's file and a first step's inputs (moments zero, STEP 1)."""
    where = tmp_path_factory.mktemp("steps")
    engine = xg.compile_file(REPO / "models" / "train_tiny.xg")
    engine.save(where / "train.xge")
    gen = torch.Generator().manual_seed(7)
    inputs: dict[str, torch.Tensor] = {}
    for spec in engine.signature:
        name, shape = spec["name"], tuple(spec["shape"])
        if name in ("TOKENS", "TARGETS"):
            seq = (3 + torch.arange(shape[0] + 1)) % 16
            inputs[name] = seq[:-1] if name == "TOKENS" else seq[1:]
        elif name == "STEP":
            inputs[name] = torch.tensor(1.0)
        elif name == "LR":
            inputs[name] = torch.tensor(0.01)
        elif name.startswith(("M_", "V_")):
            inputs[name] = torch.zeros(shape)
        else:
            inputs[name] = (1.0 + 0.1 * torch.randn(shape, generator=gen)) if len(shape) == 1 else \
                torch.randn(shape, generator=gen) / math.sqrt(shape[0])
    save_tensors(where / "in.safetensors", inputs)
    return where / "train.xge", where / "in.safetensors"


def by_hand(engine_path: Path, inputs: dict, steps: int) -> tuple[list[float], dict]:
    """`steps` engine calls, each one's new parameters and moments fed back, STEP advanced."""
    engine = xg.Engine.load(engine_path)
    current = dict(inputs)
    losses = []
    for _ in range(steps):
        loss, new_p, new_m, new_v = engine.run(current).value
        current |= dict(zip(PARAMS, new_p)) | {f"M_{k}": m for k, m in zip(PARAMS, new_m)} \
            | {f"V_{k}": v for k, v in zip(PARAMS, new_v)}
        current["STEP"] = current["STEP"] + 1
        losses.append(loss)
    return losses, current


def test_steps_match_calls_fed_back_by_hand(tiny, tmp_path) -> None:
    engine, inputs = tiny
    res = cli("xgrun", engine, "--inputs", inputs, "--steps", 3, "--json", "--output", tmp_path / "final.safetensors")
    assert res.code == 0, res.err
    summary = json.loads(res.out)
    losses = [row["out_0"] for row in summary["per_step"]]
    want, final = by_hand(engine, load_tensors(inputs), 3)
    assert losses == want                       # bit for bit: the same kernels on the same inputs
    assert losses[2] < losses[0]
    assert summary["steps"] == 3 and summary["counters"] == {"STEP": 4.0}
    written = load_tensors(tmp_path / "final.safetensors")
    assert sorted(written) == sorted(final)
    for name, t in final.items():
        assert torch.equal(written[name], t), name


def test_final_state_resumes_training(tiny, tmp_path) -> None:
    engine, inputs = tiny
    five = json.loads(cli("xgrun", engine, "--inputs", inputs, "--steps", 5, "--json").out)
    assert cli("xgrun", engine, "--inputs", inputs, "--steps", 2, "--output", tmp_path / "s.npz").code == 0
    rest = json.loads(cli("xgrun", engine, "--inputs", tmp_path / "s.npz", "--steps", 3, "--json").out)
    assert [r["out_0"] for r in rest["per_step"]] == [r["out_0"] for r in five["per_step"][2:]]


def test_table(tiny) -> None:
    engine, inputs = tiny
    res = cli("xgrun", engine, "--inputs", inputs, "--steps", 2)
    assert res.code == 0, res.err
    lines = res.out.splitlines()
    assert "2 steps (33 state tensors fed back, counter STEP)" in lines[0]
    assert lines[1].split() == ["step", "out_0"]
    assert [line.split()[0] for line in lines[2:4]] == ["1", "2"]


@pytest.mark.parametrize("steps", ["0", "-1"])
def test_steps_must_be_positive(tiny, steps: str) -> None:
    res = cli("xgrun", tiny[0], "--steps", steps)
    assert res.code == 2
    assert res.err.strip().splitlines() == [f"error: --steps takes a positive number of steps, got {steps}"]


def test_inference_engine_has_nothing_to_feed_back(tmp_path) -> None:
    xg.compile_file(REPO / "models" / "infer.xg").save(tmp_path / "infer.xge")
    res = cli("xgrun", tmp_path / "infer.xge", "--steps", 2)
    assert res.code == 1
    (line,) = res.err.strip().splitlines()
    assert line.startswith("error: ") and "has no training state" in line and "Traceback" not in res.err


def test_steps_does_not_time_runs(tiny) -> None:
    res = cli("xgrun", tiny[0], "--steps", 2, "--iterations", 3)
    assert res.code == 2 and len(res.err.strip().splitlines()) == 1


STATE = """TARGET_GPU = H100
extern state Tensor[float32, 4] W
extern state Tensor[float32, 4] M
extern counter float32 STEP
extern float32 LR
def main() {{
    m2 = M * 0.5 + W
    w2 = W - LR * m2 * STEP
    return {ret}
}}
"""


def test_pairs_are_the_last_outputs_in_declaration_order(tmp_path) -> None:
    engine = compile_text(tmp_path, STATE.format(ret="(sum(w2 * w2), w2, m2)"))
    assert engine.manifest["entry"]["state"] == [{"input": "W", "output": "out_1"}, {"input": "M", "output": "out_2"}]
    assert engine.manifest["entry"]["counters"] == ["STEP"]


@pytest.mark.parametrize("ret, says", [
    ("sum(w2 * w2)", "2 state inputs, but `main` returns only 1 value"),
    ("(w2, m2, sum(w2 * w2))", "state `M` is `Tensor[float32, 4]`, but its next value, output `out_2`, is `float32`"),
])
def test_a_pair_that_cannot_be_is_xg0020(tmp_path, ret: str, says: str) -> None:
    (tmp_path / "p.xg").write_text(STATE.format(ret=ret))
    res = cli("xgc", tmp_path / "p.xg", "--out", tmp_path / "p.xge", "--no-kernels")
    assert res.code == 1
    assert f"error[XG0020]: {says}" in res.err


def test_old_engines_without_state_still_load(tmp_path) -> None:
    engine = compile_text(tmp_path, "TARGET_GPU = H100\nextern Tensor[float32, 4] W\ndef main() {\n    return W * 2.0\n}\n")
    assert "state" not in engine.manifest["entry"] and "counters" not in engine.manifest["entry"]


def test_inspect_states_state_and_determinism(tiny) -> None:
    res = cli("xgbuild", "inspect", tiny[0])
    assert res.code == 0, res.err
    lines = {line.split()[0]: line for line in res.out.splitlines() if line and not line.startswith(" ")}
    assert lines["determinism"] == "determinism deterministic (run-to-run bit-identical on the same GPU)"
    assert "33 outputs feed inputs" in lines["state"] and "out_1_0 -> EMB" in lines["state"]
    data = json.loads(cli("xgbuild", "inspect", tiny[0], "--json").out)
    assert data["determinism"] == {"deterministic": True, "reasons": [], "notes": []}
