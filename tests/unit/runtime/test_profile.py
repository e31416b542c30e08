"""Run profiles (`runtime.profile`, `xgrun --profile/--trace`): the GPU executor's profiled path
under Triton's interpreter (every launch timed on its own, nothing replayed, rows named by the
kernels and the lines they store), and the aggregation: percentiles, shares, roofline, the trace."""

from __future__ import annotations

import json

import pytest
from interpreted import interpreted_report

from xgbuild.runtime.profile import Profiler, Span, percentile, render


def test_profiled_gpu_launches_under_the_interpreter() -> None:
    report = interpreted_report("interpret_profile.py")
    assert report["error"] < 1e-4                      # profiled runs compute the same result
    s = report["summary"]
    assert s["iterations"] == 3 and s["device"] == "cuda"
    rows = s["rows"]
    assert sorted(r["kernel"] for r in rows) == sorted(report["plans"])     # every launch, none replayed
    assert all(r["launches"] == 1 and r["where"].startswith("line ") for r in rows)
    mm = next(r for r in rows if "matmul" in r["kernel"])
    assert mm["flops"] >= 2 * 16 * 32 * 24 and mm["bytes"] >= 4 * (16 * 32 + 32 * 24 + 16 * 24)
    assert mm["roofline"] is None                       # no target peaks given
    assert 0 <= s["host_share"] <= 1 and s["kernels_ms"] <= s["run_ms"]["max"]
    spans = [e for e in report["trace"]["traceEvents"] if e["ph"] == "X" and e["tid"] == 1]
    assert len(spans) == 3 * len(rows)


def test_rows_percentiles_shares_and_roofline() -> None:
    p = Profiler("cuda")
    p.walls_ms = [10.0, 12.0, 20.0]
    p.iteration_starts_ms = [0.0, 15.0, 30.0]
    for it, (a, b) in enumerate([(4.0, 2.0), (5.0, 2.0), (9.0, 3.0)]):
        p.spans.append(Span("k0", "gemm", "line 3", it, 0.5, a, flops=2e12 * a / 1e3, bytes=1e6, dtype="bfloat16"))
        p.spans.append(Span("k1", "norm", "line 4", it, 0.5 + a, b, flops=1e6, bytes=3e12 * b / 1e3))
    s = p.summary(peaks=lambda dt: 4e12 if dt == "bfloat16" else 1e12, bandwidth=6e12)
    gemm, norm = s["rows"]
    assert gemm["kernel"] == "gemm" and gemm["p50_ms"] == 5.0 and gemm["p99_ms"] == pytest.approx(8.92)
    assert gemm["share"] == pytest.approx(5.0 / 12.0)
    assert gemm["roofline"] == pytest.approx(0.5 * 6.0 / 5.0)          # mean flops at 4 TFLOP/s over p50
    assert norm["roofline"] == pytest.approx((3e12 * 7 / 3 / 1e3 / 6e12) / (2e-3))
    assert s["kernels_ms"] == 7.0 and s["host_share"] == pytest.approx(0.4)     # iterations: 0.4, 0.417, 0.4
    assert s["run_ms"]["min"] == 10.0 and s["run_ms"]["max"] == 20.0 and s["launches"] == 2
    text = render(s)
    assert "gemm" in text and "line 3" in text and "3 iterations" in text
    assert percentile([], 50) != percentile([], 50)     # nan: nothing measured


def test_trace_is_chrome_trace_json() -> None:
    p = Profiler("cpu")
    p.begin()
    p.end()
    p.host_op("n0", "matmul %0", "line 2", 0.0, 0.25, iteration=0)
    doc = json.loads(json.dumps(p.chrome_trace()))
    kinds = {e["ph"] for e in doc["traceEvents"]}
    assert kinds == {"M", "X"} and doc["displayTimeUnit"] == "ms"
    op = next(e for e in doc["traceEvents"] if e.get("cat") == "op")
    assert op["name"] == "matmul %0" and op["dur"] == 250.0 and op["args"]["where"] == "line 2"


def test_one_kernel_launched_from_many_places_is_summed() -> None:
    """A model's layers launch the same compiled kernel: the rows stay per place, and `by_kernel`
    (printed first) adds them up, with each kernel's share of the kernels' time."""
    p = Profiler("cuda")
    p.walls_ms = [10.0, 10.0]
    p.iteration_starts_ms = [0.0, 12.0]
    for it in range(2):
        for layer in range(3):
            p.spans.append(Span(f"k{2 * layer}", "xg_attention", f"line 9 of h.{layer}.attn", it, 0.0, 1.0))
            p.spans.append(Span(f"k{2 * layer + 1}", "xg_matmul", f"line 4 of h.{layer}.mlp", it, 1.0, 0.5))
        p.spans.append(Span("k9", "xg_head", "line 12 of lm_head", it, 5.0, 2.0))
    s = p.summary()
    assert len(s["rows"]) == 7 and s["kernels_ms"] == 6.5
    attention, head, matmul = s["by_kernel"]
    assert (attention["kernel"], attention["launches"], attention["sites"]) == ("xg_attention", 3, 3)
    assert attention["p50_ms"] == pytest.approx(3.0) and attention["share"] == pytest.approx(3.0 / 6.5)
    assert head["sites"] == 1 and matmul["p50_ms"] == pytest.approx(1.5)
    text = render(s)
    assert "by kernel" in text and "3 places, e.g. line 9 of h.0.attn" in text
    assert text.index("by kernel") < text.index("line 12 of lm_head")
