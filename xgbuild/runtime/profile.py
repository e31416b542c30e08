"""Profiles of engine runs: what `xgrun --profile` prints and `--trace` writes.

A `Profiler` is handed to a run (`Engine.run(..., profiler=p)`), which reports to it:

- on the GPU, every kernel launch (and every PyTorch operator an engine built with a fallback
  calls) bracketed by CUDA events on the run's stream: the executor then launches kernel by kernel,
  neither replaying recorded launches nor a CUDA graph, so that each launch has its own time;
- on the CPU reference path, every node's host time, as the executor measures it.

Each profiled iteration's wall time comes from the host clock around the whole `run` (with the
GPU synchronised at its end), so the kernels' share of it and the host's show. Rows group the
launches by kernel: launches per iteration, p50/p95/p99 over iterations of that kernel's time per
iteration, its share of the run, the bytes it moves and its FLOPs (estimated from the launch's
tensors and sizes), and on a GPU the share of the target's roofline (`hw/`) those reach. Each row
is named by the kernel and the source lines (or, for an imported model, module paths) of the
nodes whose values it stores.

`chrome_trace()` is Chrome's trace event format (what chrome://tracing and Perfetto load): one
complete event ("ph": "X") per launch on a device track, one per iteration on a host track, in
microseconds from the first iteration's start.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable

PERCENTILES = (50, 95, 99)


@dataclass
class Span:
    """One launch (or CPU op) of one iteration: `start_ms` from the iteration's start."""
    key: str                    # what rows group by (a kernel's plan index and name, a node's op)
    name: str
    where: str
    iteration: int
    start_ms: float
    ms: float
    flops: float = 0.0
    bytes: float = 0.0
    dtype: str | None = None


@dataclass
class _Pending:
    key: str
    name: str
    where: str
    start: Any
    end: Any
    flops: float
    bytes: float
    dtype: str | None


def percentile(ordered: list[float], q: float) -> float:
    """The q-th percentile (0..100) of an ascending list, interpolating between neighbours."""
    if not ordered:
        return math.nan
    pos = q / 100 * (len(ordered) - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


@dataclass
class Profiler:
    """Collects the spans of profiled iterations (`device`: "cpu" or "cuda")."""
    device: str
    # How a launch is bracketed on the GPU: a CUDA event with timing, and a full synchronise
    # (given here only to time the launch path where there is no GPU: Triton's interpreter).
    event: Callable[[], Any] | None = None
    sync: Callable[[], None] | None = None
    spans: list[Span] = field(default_factory=list)
    walls_ms: list[float] = field(default_factory=list)
    iteration_starts_ms: list[float] = field(default_factory=list)     # host clock, from the first
    _pending: list[_Pending] = field(default_factory=list)
    _t0: float | None = None
    _iter_t: float = 0.0
    _iter_event: Any = None

    # --- recording ------------------------------------------------------------------------------
    @property
    def iteration(self) -> int:
        return len(self.walls_ms)

    def begin(self) -> None:
        """An iteration starts (on cuda: after the device is idle, with an event on the stream)."""
        now = time.perf_counter()
        if self._t0 is None:
            self._t0 = now
        self._iter_t = now
        self.iteration_starts_ms.append((now - self._t0) * 1e3)
        if self.device == "cuda":
            self._iter_event = self._event()
            self._iter_event.record()

    def timed(self, key: str, name: str, where: str, call: Callable[[], Any], *, flops: float = 0.0,
              nbytes: float = 0.0, dtype: str | None = None) -> Any:
        """Run `call` (one launch), bracketed by CUDA events; their times are read at `end`."""
        start, end = self._event(), self._event()
        start.record()
        out = call()
        end.record()
        self._pending.append(_Pending(key, name, where, start, end, flops, nbytes, dtype))
        return out

    def host_op(self, key: str, name: str, where: str, start_ms: float, ms: float, *, flops: float = 0.0,
                nbytes: float = 0.0, dtype: str | None = None, iteration: int | None = None) -> None:
        """A CPU op's host time (the reference path), `start_ms` from the iteration's start;
        `iteration`: an ended one's index (ops are reported after `end`, off its clock)."""
        it = self.iteration if iteration is None else iteration
        self.spans.append(Span(key, name, where, it, start_ms, ms, flops, nbytes, dtype))

    def end(self) -> None:
        """The iteration ends: on cuda, synchronises and reads every launch's events."""
        if self.device == "cuda":
            if self.sync is not None:
                self.sync()
            else:
                import torch
                torch.cuda.synchronize()
            for p in self._pending:
                self.spans.append(Span(p.key, p.name, p.where, self.iteration,
                                       self._iter_event.elapsed_time(p.start), p.start.elapsed_time(p.end),
                                       p.flops, p.bytes, p.dtype))
            self._pending.clear()
        self.walls_ms.append((time.perf_counter() - self._iter_t) * 1e3)

    def _event(self) -> Any:
        if self.event is not None:
            return self.event()
        import torch
        return torch.cuda.Event(enable_timing=True)

    # --- reading --------------------------------------------------------------------------------
    def rows(self, peaks: Callable[[str | None], float | None] | None = None,
             bandwidth: float | None = None) -> list[dict]:
        """One row per kernel (or op), slowest first. `peaks(dtype)`: FLOP/s of the target for the
        roofline column, with `bandwidth` in bytes/s; without them the column is None."""
        n = max(1, self.iteration)
        groups: dict[str, list[Span]] = {}
        for s in self.spans:
            groups.setdefault(s.key, []).append(s)
        run_ms = percentile(sorted(self.walls_ms), 50)
        out = []
        for key, spans in groups.items():
            per_iter = [0.0] * n
            for s in spans:
                per_iter[s.iteration] += s.ms
            ordered = sorted(per_iter)
            first = spans[0]
            launches = len(spans) / n
            flops = sum(s.flops for s in spans) / n
            moved = sum(s.bytes for s in spans) / n
            p50 = percentile(ordered, 50)
            roofline = None
            peak = peaks(first.dtype) if peaks is not None else None
            if peak and bandwidth and p50 > 0:
                roofline = max(flops / peak, moved / bandwidth) / (p50 / 1e3)
            out.append({"kernel": first.name, "where": first.where, "launches": launches,
                        **{f"p{q}_ms": percentile(ordered, q) for q in PERCENTILES},
                        "share": p50 / run_ms if run_ms > 0 else None, "bytes": moved, "flops": flops,
                        "roofline": roofline})
        out.sort(key=lambda r: -r["p50_ms"])
        return out

    def summary(self, peaks: Callable[[str | None], float | None] | None = None,
                bandwidth: float | None = None) -> dict:
        """Everything `xgrun --profile --json` reports: the iterations' wall times, the rows, the
        median iteration's kernel time (its launches added up) and the median share of an
        iteration the kernels leave to the host."""
        walls = sorted(self.walls_ms)
        rows = self.rows(peaks, bandwidth)
        busy = [0.0] * self.iteration          # each iteration's kernels, added up
        for sp in self.spans:
            busy[sp.iteration] += sp.ms
        kernel_ms = percentile(sorted(busy), 50)
        host = sorted(max(0.0, 1 - b / w) for b, w in zip(busy, self.walls_ms) if w > 0)
        return {"device": self.device, "iterations": self.iteration,
                "run_ms": {"min": walls[0] if walls else math.nan, "mean": sum(walls) / len(walls) if walls else math.nan,
                           **{f"p{q}": percentile(walls, q) for q in PERCENTILES},
                           "max": walls[-1] if walls else math.nan},
                "launches": sum(r["launches"] for r in rows), "kernels_ms": kernel_ms,
                "host_share": percentile(host, 50) if host else None, "by_kernel": by_kernel(rows, kernel_ms),
                "rows": rows}

    def chrome_trace(self) -> dict:
        """The profiled iterations in Chrome's trace event format (JSON-ready)."""
        track = "GPU kernels" if self.device == "cuda" else "CPU ops"
        events: list[dict] = [
            {"name": "process_name", "ph": "M", "pid": 1, "tid": 0, "args": {"name": "xgrun"}},
            {"name": "thread_name", "ph": "M", "pid": 1, "tid": 0, "args": {"name": "host: iterations"}},
            {"name": "thread_name", "ph": "M", "pid": 1, "tid": 1, "args": {"name": track}},
        ]
        for i, (start, wall) in enumerate(zip(self.iteration_starts_ms, self.walls_ms)):
            events.append({"name": f"iteration {i}", "cat": "run", "ph": "X", "pid": 1, "tid": 0,
                           "ts": round(start * 1e3, 3), "dur": round(wall * 1e3, 3)})
        for s in self.spans:
            base = self.iteration_starts_ms[s.iteration]
            events.append({"name": s.name, "cat": "kernel" if self.device == "cuda" else "op", "ph": "X",
                           "pid": 1, "tid": 1, "ts": round((base + s.start_ms) * 1e3, 3),
                           "dur": round(s.ms * 1e3, 3),
                           "args": {"where": s.where, "iteration": s.iteration, "bytes": s.bytes,
                                    "flops": s.flops}})
        return {"traceEvents": events, "displayTimeUnit": "ms"}


def by_kernel(rows: list[dict], kernels_ms: float) -> list[dict]:
    """The rows added up by kernel (one compiled kernel launched from many places: a model's
    layers), slowest first: launches, the sum of the sites' p50 ms, its share of the kernels' time,
    and how many places launch it."""
    groups: dict[str, dict] = {}
    for r in rows:
        g = groups.setdefault(r["kernel"], {"kernel": r["kernel"], "launches": 0.0, "p50_ms": 0.0, "sites": 0,
                                            "bytes": 0.0, "flops": 0.0, "where": r["where"]})
        g["launches"] += r["launches"]
        g["p50_ms"] += r["p50_ms"]
        g["bytes"] += r["bytes"]
        g["flops"] += r["flops"]
        g["sites"] += 1
    out = sorted(groups.values(), key=lambda g: -g["p50_ms"])
    for g in out:
        g["share"] = g["p50_ms"] / kernels_ms if kernels_ms > 0 else None
    return out


def render(summary: dict, limit: int = 25) -> str:
    """The profile as text: the iterations' wall times, then a row per kernel."""
    r = summary["run_ms"]
    lines = [f"profile: {summary['iterations']} iterations on {summary['device']}: run min {r['min']:.3f} ms, "
             f"mean {r['mean']:.3f}, p50 {r['p50']:.3f}, p95 {r['p95']:.3f}, p99 {r['p99']:.3f}, "
             f"max {r['max']:.3f}; {summary['launches']:g} launches per run, kernels "
             f"{summary['kernels_ms']:.3f} ms"
             + (f", host {summary['host_share']:.0%} of the run" if summary["host_share"] is not None else "")]
    groups = summary.get("by_kernel") or []
    if any(g["sites"] > 1 for g in groups):     # one kernel launched from many places: their sum first
        lines.append(f"  {'by kernel':<34} {'launches':>8} {'sum p50':>9} {'of kernels':>10}  sites")
        for g in groups[:10]:
            share = f"{g['share']:.1%}" if g["share"] is not None else "—"
            where = g["where"] if g["sites"] == 1 else f"{g['sites']} places, e.g. {g['where']}"
            lines.append(f"  {g['kernel'][:34]:<34} {g['launches']:>8g} {g['p50_ms']:>9.4f} {share:>10}  {where}")
    head = f"  {'kernel':<34} {'launches':>8} {'p50 ms':>9} {'p95 ms':>9} {'p99 ms':>9} {'share':>6} " \
           f"{'MB':>9} {'GFLOP':>9} {'roofline':>8}  where"
    lines.append(head)
    for row in summary["rows"][:limit]:
        share = f"{row['share']:.1%}" if row["share"] is not None else "—"
        roof = f"{row['roofline']:.0%}" if row["roofline"] is not None else "—"
        lines.append(f"  {row['kernel'][:34]:<34} {row['launches']:>8g} {row['p50_ms']:>9.4f} {row['p95_ms']:>9.4f} "
                     f"{row['p99_ms']:>9.4f} {share:>6} {row['bytes'] / 1e6:>9.2f} {row['flops'] / 1e9:>9.3f} "
                     f"{roof:>8}  {row['where']}")
    if len(summary["rows"]) > limit:
        lines.append(f"  ... {len(summary['rows']) - limit} more (--json has them all)")
    return "\n".join(lines)


# --- what a launch or an op costs (estimates for the bytes and FLOPs columns) ----------------------

def stored_bytes(t: Any) -> int:
    """Bytes a tensor's elements occupy, a broadcast (stride-0) dim counted once."""
    n = 1
    for size, stride in zip(t.shape, t.stride()):
        if stride != 0:
            n *= size
    return n * t.element_size()


def launch_cost(spec: Any, launch: Any) -> tuple[float, float, str | None]:
    """(FLOPs, bytes, the dtype whose peak bounds the math) of one kernel launch: the bytes of
    every operand and output it binds; the FLOPs of its products (half for a causal attention,
    which skips the blocks above the diagonal) and one per element for each of its other nodes."""
    tensors = {k: t for k, t in launch.tensors.items() if k != "flags"}
    moved = sum(stored_bytes(t) for t in tensors.values())
    outs = [t.numel() for k, t in tensors.items() if k.startswith("q")]
    elems = max(outs + [t.numel() for t in tensors.values()] or [0])
    ints = launch.ints
    kind = getattr(spec, "kind", "")
    others = max(0, len(getattr(spec, "nodes", ())) - 1)
    if kind == "matmul" and outs:
        dtype = spec.operands[spec.matmul[0]][0]
        return 2.0 * outs[0] * ints.get("K", 1) + others * outs[0], float(moved), dtype
    if kind == "attention" and outs:
        from ..compiler.codegen.triton_attention import causal
        dv = max(1, ints.get("DV", 1))
        rows = outs[0] / dv
        dtype = spec.operands[spec.matmul[0]][0]
        flops = 2.0 * rows * ints.get("N", 1) * (ints.get("K", 1) + dv) * (0.5 if causal(spec) else 1.0)
        return flops + others * outs[0], float(moved), dtype
    return float(len(getattr(spec, "nodes", ())) * elems), float(moved), None


def node_cost(graph: Any, node: Any, itemsize: Callable[[str], int]) -> tuple[float, float]:
    """(FLOPs, bytes) of one node of the CPU reference path: its inputs and output at their IR
    shapes; a matmul's products, else one FLOP per output element."""
    def size(nid: int) -> int:
        return math.prod(graph.node(nid).shape)
    out = math.prod(node.shape)
    moved = out * itemsize(node.dtype) + sum(size(i) * itemsize(graph.node(i).dtype) for i in node.inputs)
    if node.op.value == "matmul" and node.inputs:
        k = graph.node(node.inputs[0]).shape[-1]
        return 2.0 * out * k, float(moved)
    return float(out), float(moved)
