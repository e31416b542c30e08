"""`xgrun --warmup/--iterations/--profile/--trace` on the CPU reference path (the GPU's CUDA-event
path: tests/gpu/test_engines_cuda.py): the trace is Chrome trace JSON, the rows name the ops and
their lines and add up to the measured run, and bad uses are clean usage errors."""

from __future__ import annotations

import json

from conftest import assert_clean_failure, cli, src_text, write_program

import xg

# Three matmuls of a few milliseconds each on a CPU: the ops, not the loop around them, are the run.
HEAVY = src_text("""
    extern Tensor[float32, 512, 512] A
    extern Tensor[float32, 512, 512] B
    def main() {
        c = A @ B
        d = c @ B
        return relu(d @ A)
    }
""")


def _engine(tmp_path):
    path = tmp_path / "heavy.xge"
    xg.compile_file(write_program(tmp_path, HEAVY), kernels=False).save(path)
    return path


def test_profile_rows_add_up_to_the_run_and_the_trace_loads(tmp_path) -> None:
    engine, trace = _engine(tmp_path), tmp_path / "run.trace.json"
    res = cli("xgrun", engine, "--no-check", "--warmup", "1", "--iterations", "4", "--profile", "--trace", trace,
              "--json")
    assert res.code == 0, res.both
    summary = json.loads(res.out)
    prof = summary["profile"]
    assert prof["iterations"] == 4 and prof["device"] == "cpu"
    assert set(summary["runs_ms"]) == {"min", "mean", "p50", "p95", "p99", "max"}
    assert summary["runs_ms"]["min"] <= summary["runs_ms"]["p50"] <= summary["runs_ms"]["max"]
    rows = prof["rows"]
    matmuls = [r for r in rows if r["kernel"].startswith("matmul")]
    assert len(matmuls) == 3 and {r["where"] for r in matmuls} == {"line 4", "line 5", "line 6"}
    for r in matmuls:
        assert r["launches"] == 1 and r["p50_ms"] <= r["p95_ms"] <= r["p99_ms"]
        assert r["flops"] == 2 * 512 ** 3 and r["bytes"] == 3 * 512 * 512 * 4
    # the rows are the run: an iteration's ops add up to within 10% of its measured wall time
    assert 0 <= prof["host_share"] <= 0.10, prof
    assert prof["kernels_ms"] <= prof["run_ms"]["max"]

    doc = json.loads(trace.read_text())
    events = doc["traceEvents"]
    spans = [e for e in events if e["ph"] == "X" and e["tid"] == 1]
    iters = [e for e in events if e["ph"] == "X" and e["tid"] == 0]
    assert len(iters) == 4 and len(spans) == 4 * len(rows)
    for e in spans + iters:
        assert {"name", "ts", "dur", "pid", "tid"} <= set(e) and e["dur"] >= 0
    for it in iters:            # every op lies inside its iteration
        inside = [e for e in spans if it["ts"] - 1 <= e["ts"] and e["ts"] + e["dur"] <= it["ts"] + it["dur"] + 1]
        assert len(inside) == len(rows)


def test_profile_prints_a_table(tmp_path) -> None:
    res = cli("xgrun", _engine(tmp_path), "--iterations", "2", "--profile")
    assert res.code == 0, res.both
    assert "profile: 2 iterations on cpu" in res.out and "p95 ms" in res.out and "line 6" in res.out
    assert "min " in res.out and "last of 2" in res.out


def test_bad_profile_uses_are_usage_errors(tmp_path) -> None:
    engine = _engine(tmp_path)
    assert_clean_failure(cli("xgrun", engine, "--trace", tmp_path), "--trace", code=2)
    assert_clean_failure(cli("xgrun", engine, "--trace", tmp_path / "no" / "such" / "t.json"), "--trace", code=2)
    assert cli("xgrun", engine, "--iterations", "0").code == 2
    assert cli("xgrun", engine, "--warmup", "-1").code == 2
    res = cli("xgrun", engine, "--profile", "--nproc", "2")
    assert_clean_failure(res, "not profiled", code=2)
    assert not (tmp_path / "t.json").exists()
