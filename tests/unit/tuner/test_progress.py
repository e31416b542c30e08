"""Tests for `xgbuild.tuner.progress` (the progress display) and `xgbuild.tuner.measure`."""

from __future__ import annotations

import io
import subprocess
import sys
import types

import pytest
from rich.console import Console

from xgbuild.tuner import measure
from xgbuild.tuner.progress import TuneProgress

from .test_space import profile


def console(terminal: bool) -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, force_terminal=terminal, width=120), out


# --- progress ------------------------------------------------------------------------------------


def run_jobs(bar: TuneProgress) -> None:
    with bar:
        bar.advance("matmul_3", "measured", 0.19)
        bar.advance("rowwise_7", "cache", 0.09)
        bar.advance("elementwise_9", "cache", None)
        bar.advance("matmul_12", "predicted", 1.5)


@pytest.mark.parametrize("enabled, terminal", [(True, True), (True, False), (False, True)])
def test_progress_counts_whether_or_not_it_draws(enabled, terminal):
    con, _ = console(terminal)
    bar = TuneProgress(total=4, enabled=enabled, console=con)
    run_jobs(bar)
    assert (bar.done, bar.hits, bar.measured, bar.predicted) == (4, 2, 1, 1)


@pytest.mark.parametrize("enabled, terminal", [(True, False), (False, True)])
def test_progress_is_silent_when_disabled_or_not_a_terminal(enabled, terminal):
    con, out = console(terminal)
    run_jobs(TuneProgress(total=4, enabled=enabled, console=con))
    assert out.getvalue() == ""


def test_progress_draws_on_a_terminal():
    con, out = console(True)
    run_jobs(TuneProgress(total=4, enabled=True, console=con))
    text = out.getvalue()
    assert "4/4" in text
    assert "2 cached" in text
    assert "matmul_12: 1.5000 ms (predicted)" in text


def test_progress_shows_names_verbatim():
    con, out = console(True)
    with TuneProgress(total=1, console=con) as bar:
        bar.advance("matmul[128x128]", "measured", 0.5)
    assert "matmul[128x128]" in out.getvalue()


def test_progress_rejects_unknown_sources():
    con, _ = console(False)
    with TuneProgress(total=1, console=con) as bar:
        with pytest.raises(ValueError, match="unknown result source 'guessed'"):
            bar.advance("job", "guessed", 1.0)
    assert bar.done == 0


# --- measure: importable without CUDA, device-name matching, timing ------------------------------


def test_measure_imports_without_torch():
    # torch stays unimported until something is timed: a CPU-only host (or one without torch)
    # can import the tuner.
    code = ("import sys; sys.modules['torch'] = None; import xgbuild.tuner.measure as m; "
            "assert m.cuda_gpu_model(0) is None; print('ok')")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


@pytest.mark.parametrize("device, target, expected", [
    ("NVIDIA H100 80GB HBM3", "H100", True),
    ("nvidia h100 80gb hbm3", "H100", True),
    ("H100", "H100", True),
    ("NVIDIA H100", "H100", True),
    ("NVIDIA H200", "H100", False),
    ("NVIDIA H100 80GB HBM3", "H200", False),
    ("NVIDIA H200", "H200", True),
    ("NVIDIA H100 PCIe", "H100", False),
    ("NVIDIA A100-SXM4-80GB", "A100", True),
    ("NVIDIA A100-SXM4-40GB", "A100", False),
    ("NVIDIA GeForce RTX 4090", "RTX4090", True),
    ("NVIDIA GeForce RTX 4090", "L40S", False),
    ("", "H100", False),
])
def test_matches_target(device, target, expected):
    assert measure.matches_target(device, profile(target)) is expected


def test_summarize_quantiles():
    timing = measure.summarize([float(x) for x in range(10, 0, -1)])
    assert timing == measure.Timing(median_ms=5.5, p10_ms=1.9, p90_ms=9.1, reps=10)
    with pytest.raises(ValueError):
        measure.summarize([])


class FakeEvent:
    """A CUDA event whose elapsed time to the next recorded event is the clock's step."""

    clock = 0.0

    def __init__(self, enable_timing: bool) -> None:
        self.at = 0.0

    def record(self) -> None:
        FakeEvent.clock += 1.0
        self.at = FakeEvent.clock

    def elapsed_time(self, end: "FakeEvent") -> float:
        return end.at - self.at


def fake_torch(log: list[str]) -> types.SimpleNamespace:
    class Buffer:
        def zero_(self) -> None:
            log.append("flush")

    class DeviceScope:
        def __init__(self, device: int) -> None:
            log.append(f"device {device}")

        def __enter__(self) -> None:
            return None

        def __exit__(self, *exc: object) -> None:
            return None

    cuda = types.SimpleNamespace(is_available=lambda: True, device=DeviceScope, Event=FakeEvent,
                                 synchronize=lambda: None)
    def empty(n: int, dtype: str, device: str) -> Buffer:
        log.append(f"alloc {n}")
        return Buffer()

    return types.SimpleNamespace(cuda=cuda, uint8="uint8", empty=empty)


def test_time_gpu_flushes_and_rotates(monkeypatch):
    log: list[str] = []
    monkeypatch.setitem(sys.modules, "torch", fake_torch(log))
    timing = measure.time_gpu(lambda s: log.append(f"run {s}"), rotations=3, warmup=2, reps=4,
                              l2_bytes=1000, device=1)
    assert log == ["device 1", "alloc 2000", "run 0", "run 1",
                   "flush", "run 2", "flush", "run 0", "flush", "run 1", "flush", "run 2"]
    assert timing.reps == 4 and timing.median_ms == 1.0


def test_time_gpu_holds_the_gpu_while_each_batch_is_enqueued(monkeypatch):
    """A batch of timed runs goes behind a GPU spin longer than its enqueueing (calibrated once, in
    cycles): a start event recorded on an idle GPU would time the host's launch as well."""
    log: list[str] = []
    torch = fake_torch(log)
    torch.cuda._sleep = lambda cycles: log.append(f"hold {cycles}")
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setattr(measure, "_CYCLES_PER_S", {})
    measure.time_gpu(lambda s: log.append("run"), warmup=1, reps=7, min_reps=5, batch=2, device=3)
    holds = [i for i, line in enumerate(log) if line.startswith("hold")]
    assert log[holds[0]] == "hold 1000000"                # the calibration: 1e6 cycles took 1 ms
    rate = measure._CYCLES_PER_S[3]
    assert rate == pytest.approx(1e9)
    batches = holds[1:]
    assert len(batches) == 2 and all(log[i + 1] == "flush" for i in batches)    # 5 runs, then 2
    assert log[batches[0] + 1:batches[1]].count("run") == 5
    for i in batches:       # at least the fixed part, at most the cap
        cycles = int(log[i].split()[1])
        assert measure.HOLD_S * rate <= cycles <= measure.HOLD_MAX_S * rate


def test_time_gpu_rejects_bad_counts():
    with pytest.raises(ValueError, match="rotations >= 1"):
        measure.time_gpu(lambda s: None, rotations=0)


@pytest.mark.gpu
def test_time_gpu_on_a_real_device():
    import torch

    x = [torch.randn(1 << 22, device="cuda") for _ in range(2)]
    y = torch.empty_like(x[0])
    timing = measure.time_gpu(lambda s: torch.mul(x[s], 2.0, out=y), rotations=2, reps=20)
    assert timing.reps == 20
    assert 0 < timing.p10_ms <= timing.median_ms <= timing.p90_ms
    name = measure.cuda_gpu_model(0)
    assert isinstance(name, str) and name
    assert measure.cuda_gpu_model(torch.cuda.device_count()) is None


class ScriptedEvent(FakeEvent):
    """Each timed run lasts the next of `durations` (the flush between runs takes no time)."""

    durations: list[float] = []

    def record(self) -> None:
        if ScriptedEvent.started:
            FakeEvent.clock += ScriptedEvent.durations.pop(0) if ScriptedEvent.durations else 1.0
        ScriptedEvent.started = not ScriptedEvent.started
        self.at = FakeEvent.clock

    started = False


def _scripted(monkeypatch, durations: list[float]) -> list[str]:
    log: list[str] = []
    torch = fake_torch(log)
    torch.cuda.Event = ScriptedEvent
    ScriptedEvent.durations, ScriptedEvent.started = list(durations), False
    monkeypatch.setitem(sys.modules, "torch", torch)
    return log


def test_time_gpu_stops_once_the_median_is_known(monkeypatch):
    log = _scripted(monkeypatch, [1.0] * 100)
    timing = measure.time_gpu(lambda s: log.append("run"), warmup=0, reps=50, min_reps=10, rel_ci=0.01)
    assert timing.reps == 10 and timing.median_ms == 1.0 and log.count("run") == 10


def test_time_gpu_keeps_timing_a_noisy_kernel_up_to_reps(monkeypatch):
    log = _scripted(monkeypatch, [1.0, 1.5, 2.0, 2.5] * 30)
    timing = measure.time_gpu(lambda s: log.append("run"), warmup=0, reps=50, min_reps=10, rel_ci=0.01)
    assert timing.reps == 50


def test_time_gpu_stops_a_loser_early(monkeypatch):
    _scripted(monkeypatch, [5.0] * 100)
    timing = measure.time_gpu(lambda s: None, warmup=0, reps=50, min_reps=10, rel_ci=0.0, stop_above=2.0)
    assert timing.reps == 10 and timing.median_ms == 5.0
    _scripted(monkeypatch, [1.0] * 100)               # a contender is timed in full
    assert measure.time_gpu(lambda s: None, warmup=0, reps=50, min_reps=10, stop_above=2.0).reps == 50


def test_median_interval_and_settled():
    ordered = [float(x) for x in range(1, 101)]
    lo, hi = measure.median_ci(ordered)
    assert lo < 50.5 < hi and hi - lo < 25
    assert measure.settled([1.0] * 10, 0.01)
    assert not measure.settled([1.0, 2.0] * 5, 0.01)
    assert measure.settled([1.0, 1.001] * 20, 0.01)


def test_progress_writes_json_events_for_logs():
    import json
    stream = io.StringIO()
    with TuneProgress(2, json_stream=stream) as bar:
        bar.start_job("job-a", 12)
        bar.event("candidate", job="job-a", config='{"BLOCK":1}', ms=0.5, best_ms=0.5, left=3)
        bar.advance("job-a", "measured", 0.5, {"candidates": 12, "compiled": 6, "measured": 5, "pruned": 7})
        bar.advance("job-b", "cache", float("inf"))
    events = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [e["event"] for e in events] == ["start", "job", "candidate", "done", "done", "end"]
    assert events[-1]["candidates_pruned"] == 7 and events[-1]["cached"] == 1 and events[-1]["ok"] is True
    assert events[4]["ms"] is None                  # never Infinity: JSON parsers refuse it
    assert all(isinstance(e["t"], float) for e in events)
    assert not bar.visible


def test_xgc_progress_json_streams_events_on_stderr(tmp_path):
    """`xgc --progress json`: one JSON object per line on stderr while tuning (a CI log can parse
    it), the build summary after; a value it does not know is a usage error."""
    import json
    from pathlib import Path
    repo = Path(__file__).resolve().parents[3]
    env = {**__import__("os").environ, "XG_CACHE_DIR": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, "-m", "xgbuild.cli.xgc", str(repo / "examples" / "mlp.xg"), "--target=H100",
                           "--tune=predict", "--out", str(tmp_path / "mlp.xge"), "--progress", "json"],
                          capture_output=True, text=True, timeout=300, cwd=repo, env=env)
    assert done.returncode == 0, done.stderr
    events = [json.loads(line) for line in done.stderr.splitlines() if line.startswith("{")]
    kinds = [e["event"] for e in events]
    assert kinds[0] == "start" and kinds[-1] == "end" and kinds.count("done") == events[0]["jobs"] >= 1
    assert all(e["source"] == "predicted" for e in events if e["event"] == "done")
    bad = subprocess.run([sys.executable, "-m", "xgbuild.cli.xgc", str(repo / "examples" / "mlp.xg"), "--target=H100",
                          "--out", str(tmp_path / "x.xge"), "--progress", "loud"],
                         capture_output=True, text=True, timeout=120, cwd=repo, env=env)
    assert bad.returncode == 2 and "--progress takes auto, bar, json or none" in bad.stderr
    assert "Traceback" not in bad.stderr and not (tmp_path / "x.xge").exists()
