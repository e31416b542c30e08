"""tools/bench/bench_models.py (issue 21's benchmark) on a host without a GPU: its one-line refusal,
and `--resume`, which keeps an earlier run's finished rows only when they were measured on the same
GPU with the same sizes and policy (the full table of six models in two dtypes takes several of
the device tool's 10-minute runs)."""

import argparse
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "tools" / "bench" / "bench_models.py"


def _module():
    sys.path.insert(0, str(BENCH.parent))
    spec = importlib.util.spec_from_file_location("bench_models_under_test", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _args(**kw) -> argparse.Namespace:
    base = {"batch": 8, "seq": 512, "images": 32, "layers": None, "policy": "measure", "no_max_autotune": False}
    return argparse.Namespace(**{**base, **kw})


def _write(path: Path, device: str, rows: list, **kw) -> None:
    path.write_text(json.dumps({"device": device, "torch": "2.11", "args": vars(_args(**kw)), "rows": rows}))


def test_without_a_gpu_it_says_so_and_exits_non_zero() -> None:
    proc = subprocess.run([sys.executable, str(BENCH), "--models", "gpt2"], cwd=REPO, capture_output=True,
                          text=True, timeout=300, check=False)
    assert proc.returncode == 1 and proc.stderr.strip() == "error: this benchmark needs an NVIDIA GPU"
    assert "Traceback" not in proc.stderr


def test_resume_keeps_finished_rows_of_the_same_gpu_and_setup(tmp_path: Path) -> None:
    bm = _module()
    out = tmp_path / "models.json"
    assert bm.kept_rows(out, "NVIDIA H200", _args()) == []               # nothing yet: measure all
    done = {"model": "gpt2", "dtype": "bfloat16", "xg_ms": 2.87}
    failed = {"model": "bert", "dtype": "bfloat16", "error": "RuntimeError: out of memory"}
    _write(out, "NVIDIA H200", [done, failed, "junk", {"xg_ms": 1.0}])
    assert bm.kept_rows(out, "NVIDIA H200", _args()) == [done]           # the failed row runs again


@pytest.mark.parametrize("change,why", [
    ({"device": "NVIDIA H100 80GB HBM3"}, "measured on 'NVIDIA H100 80GB HBM3'"),
    ({"seq": 128}, "--seq 128 (now 512)"),
    ({"policy": "predict"}, "--policy 'predict' (now 'measure')"),
    ({"no_max_autotune": True}, "--no-max-autotune True (now False)"),
])
def test_resume_refuses_rows_measured_another_way(tmp_path: Path, change: dict, why: str) -> None:
    bm = _module()
    out = tmp_path / "models.json"
    device = change.pop("device", "NVIDIA H200")
    _write(out, device, [{"model": "gpt2", "dtype": "bfloat16", "xg_ms": 2.87}], **change)
    with pytest.raises(ValueError, match="cannot resume") as err:
        bm.kept_rows(out, "NVIDIA H200", _args())
    assert why in str(err.value)


@pytest.mark.parametrize("text", ["{not json", json.dumps({"device": "NVIDIA H200"}), json.dumps([1, 2])])
def test_resume_from_an_unreadable_file_is_an_error(tmp_path: Path, text: str) -> None:
    bm = _module()
    out = tmp_path / "models.json"
    out.write_text(text)
    with pytest.raises(ValueError, match=f"cannot resume from {out}"):
        bm.kept_rows(out, "NVIDIA H200", _args())


def test_profile_rows_are_per_call_gpu_time_by_kernel() -> None:
    bm = _module()
    launches = [{"kernel": "xg_matmul_a:8x512:1"}, {"kernel": "xg_rowwise_b:4096:2"}, {"kernel": "xg_matmul_a:8x64:3"}]
    calls = [("xg_matmul_a", 0.10), ("xg_rowwise_b", 0.01), ("xg_matmul_a", 0.03)]
    rows = bm.by_kernel(calls + [(n, ms * 3) for n, ms in calls], launches, 2, lambda launch: launch["kernel"][-1])
    assert [(r["kernel"], r["launches"], r["where"]) for r in rows] == [
        ("xg_matmul_a", 2, ["1", "3"]), ("xg_rowwise_b", 1, ["2"])]
    assert rows[0]["ms"] == pytest.approx((0.13 + 0.39) / 2) and rows[1]["ms"] == pytest.approx(0.02)
    # events that do not line up with the launches (a call short of one): by name, per call
    rows = bm.by_kernel(calls[:2], launches, 1, lambda launch: "")
    assert [(r["kernel"], r["launches"], r["ms"]) for r in rows] == [("xg_matmul_a", 1, 0.10), ("xg_rowwise_b", 1, 0.01)]


@pytest.mark.parametrize("args,message", [
    (["--batch", "0"], "argument --batch: 0 is less than 1"),
    (["--layers", "-1"], "argument --layers: -1 is less than 1"),
    (["--seq", "many"], "argument --seq: 'many' is not an integer"),
])
def test_bad_sizes_are_refused_at_the_command_line(args: list[str], message: str) -> None:
    """Before anything else (a GPU host would otherwise build every model and fail in each row)."""
    proc = subprocess.run([sys.executable, str(BENCH), *args], cwd=REPO, capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1].endswith(message), proc.stderr
