"""Benchmark: building and running engines on the CPU reference executor.

For each example program: compile time (median of several in-process `xg.compile_file` calls),
engine save + load time, and the run time `xgrun` sees (load the engine file, make its seeded
random inputs, specialise, run, check), next to the same computation in PyTorch eager (and
`torch.compile` with `--torch-compile`). Then the executor's own cost: a 200-node element-wise
chain on tiny tensors, where the ops cost almost nothing, gives the overhead per node =
(executor run time - time of the same torch ops called directly) / nodes.

Prints a table and writes JSON. Nothing here is an assertion: timings vary by machine.

    python tools/bench/bench_engine.py [--size 64] [--repeat 7] [--json-out out/bench_engine.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))

import xg
from xgbuild.runtime.cpu import CpuExecutor
from xgbuild.runtime.tensor_io import random_inputs

EXAMPLES = REPO_ROOT / "examples"


def median_s(fn: Callable[[], object], repeat: int, warmup: int = 1) -> tuple[float, list[float]]:
    """(median, all samples) in seconds; the best sample is `min(samples)`."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), times


# ------------------------------------------------------------------------------ eager equivalents

def _attention(Q, K, V):
    p = torch.softmax((Q @ K.transpose(0, 1)).float() * 0.125, dim=1)
    return p.to(torch.bfloat16) @ V


def _rmsnorm(x, g, eps):
    return x * torch.rsqrt((x * x).mean(dim=1, keepdim=True) + eps) * g


def _stable_softmax(x):
    e = torch.exp(x - x.amax(dim=1, keepdim=True))
    return e / e.sum(dim=1, keepdim=True)


EAGER: dict[str, Callable[..., torch.Tensor]] = {
    "attention": lambda Q, K, V: _attention(Q, K, V),
    "cluster_matmul": lambda A, B: A @ B,
    "contract": lambda A, B, W: _stable_softmax(_rmsnorm(A @ B, W, 1e-5)),
    "mlp": lambda X, W1, B1, W2: F.gelu(X @ W1 + B1) @ W2,
    "norms": lambda X, G: _stable_softmax(_rmsnorm(X, G, 1e-6)),
}


def input_signature(engine: xg.Engine, size: int) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Every symbolic dim at `size` (2 * size for the MLP's hidden dim F, as a transformer has)."""
    sig = {}
    for spec in engine.signature:
        shape = tuple(d if isinstance(d, int) else (2 * size if d == "F" else size) for d in spec["shape"])
        sig[spec["name"]] = (spec["dtype"], shape)
    return sig


# ------------------------------------------------------------------------------ per example

def bench_example(name: str, size: int, repeat: int, tmp: Path) -> dict:
    path = EXAMPLES / f"{name}.xg"
    compile_s, _ = median_s(lambda: xg.compile_file(path), repeat)
    engine = xg.compile_file(path)
    engine_path = tmp / f"{name}.xge"
    save_s, _ = median_s(lambda: engine.save(engine_path), repeat)
    load_s, _ = median_s(lambda: xg.load_engine(engine_path), repeat)
    sig = input_signature(engine, size)

    def xgrun_style() -> object:
        # What `xgrun ENGINE --seed 0` does after start-up: a fresh load (so a fresh specialisation).
        eng = xg.load_engine(engine_path)
        return eng.run(random_inputs(sig, 0), check=True)

    xgrun_s, xgrun_all = median_s(xgrun_style, repeat)
    inputs = random_inputs(sig, 0)
    warm = xg.load_engine(engine_path)
    warm.run(inputs)
    cached_s, cached_all = median_s(lambda: warm.run(inputs, check=True), repeat)
    unchecked_s, _ = median_s(lambda: warm.run(inputs, check=False), repeat)
    return {"example": name, "nodes": len(engine.graph.nodes), "engine_bytes": engine_path.stat().st_size,
            "shapes": {k: list(v[1]) for k, v in sig.items()},
            "compile_ms": compile_s * 1e3, "save_ms": save_s * 1e3, "load_ms": load_s * 1e3,
            "xgrun_run_ms": xgrun_s * 1e3, "xgrun_run_best_ms": min(xgrun_all) * 1e3,
            "run_cached_ms": cached_s * 1e3, "run_cached_best_ms": min(cached_all) * 1e3,
            "run_nocheck_ms": unchecked_s * 1e3, "eager_ms": None, "torch_compile_ms": None}


def bench_torch(row: dict, size: int, repeat: int, compile_torch: bool) -> None:
    """The same computation in PyTorch eager (and torch.compile), on the same inputs as `xgrun --seed 0`."""
    fn = EAGER.get(row["example"])
    if fn is None:
        return
    engine = xg.compile_file(EXAMPLES / f"{row['example']}.xg")
    inputs = random_inputs(input_signature(engine, size), 0)
    with torch.no_grad():
        row["eager_ms"] = median_s(lambda: fn(**inputs), repeat)[0] * 1e3
        if compile_torch:
            try:
                compiled = torch.compile(fn)
                compiled(**inputs)
                row["torch_compile_ms"] = median_s(lambda: compiled(**inputs), repeat)[0] * 1e3
            except Exception as exc:  # noqa: BLE001 - a missing C++ toolchain is a row note, not a crash
                row["torch_compile_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"


# ------------------------------------------------------------------------------ executor overhead

def chain_source(nodes: int) -> str:
    """A program whose optimised graph is an element-wise chain of about `nodes` nodes."""
    lines = ["extern Tensor[float32, 4] X", "def main() {", "    h = X"]
    lines += ["    h = tanh(h) + X" for _ in range(nodes // 2)]
    lines += ["    return h", "}"]
    return "\n".join(lines) + "\n"


def bench_overhead(nodes: int, repeat: int, tmp: Path) -> dict:
    src = tmp / "chain.xg"
    src.write_text(chain_source(nodes))
    engine = xg.compile_file(src)
    graph_nodes = len(engine.graph.nodes)
    x = torch.randn(4)
    graph, _, _ = engine.specialised({"X": x})

    def executor(check: bool, timings: bool) -> Callable[[], object]:
        ex = CpuExecutor(check=check, timings=timings)
        return lambda: ex.run(graph, {"X": x})

    def direct() -> torch.Tensor:
        h = x
        with torch.no_grad():
            for _ in range(nodes // 2):
                h = torch.add(torch.tanh(h), x)
        return h

    # Best of many runs: the overhead is a fixed cost, and the best run is the one least disturbed.
    run_s = min(median_s(executor(check=False, timings=False), repeat * 5)[1])
    run_timed_s = min(median_s(executor(check=False, timings=True), repeat * 5)[1])
    run_checked_s = min(median_s(executor(check=True, timings=True), repeat * 5)[1])
    api_s = min(median_s(lambda: engine.run({"X": x}, check=True), repeat * 5)[1])
    torch_s = min(median_s(direct, repeat * 5)[1])
    torch_ops = 2 * (nodes // 2)
    per_op_timings = CpuExecutor(check=False).run(graph, {"X": x}).timings
    op_ms_sum = sum(t["ms"] for t in per_op_timings)
    return {
        "graph_nodes": graph_nodes, "torch_ops": torch_ops,
        "executor_ms": run_s * 1e3, "executor_with_timings_ms": run_timed_s * 1e3,
        "executor_checked_ms": run_checked_s * 1e3, "engine_run_ms": api_s * 1e3,
        "direct_torch_ms": torch_s * 1e3, "torch_us_per_op": torch_s / torch_ops * 1e6,
        "overhead_us_per_node": (run_s - torch_s) / graph_nodes * 1e6,
        "overhead_us_per_node_timed_checked": (run_checked_s - torch_s) / graph_nodes * 1e6,
        "overhead_us_per_node_engine_run": (api_s - torch_s) / graph_nodes * 1e6,
        "recorded_op_ms_sum": op_ms_sum,
    }


# ------------------------------------------------------------------------------ report

def fmt(v: float | None, unit: str = "ms") -> str:
    return "-" if v is None else f"{v:.2f} {unit}" if v < 100 else f"{v:.0f} {unit}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=64, help="size of every symbolic dim (F is twice it)")
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--nodes", type=int, default=200, help="length of the element-wise chain")
    ap.add_argument("--torch-compile", action="store_true", help="also time torch.compile (slow to compile)")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch intra-op threads (1: tiny ops gain nothing from more, and timings are steadier)")
    ap.add_argument("--json-out", type=Path, default=Path("out/bench_engine.json"))
    args = ap.parse_args()
    torch.set_num_threads(max(1, args.threads))

    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        rows = [bench_example(p.stem, args.size, args.repeat, tmp) for p in sorted(EXAMPLES.glob("*.xg"))]
        overhead = bench_overhead(args.nodes, args.repeat, tmp)
    # Last: torch.compile leaves compile workers behind that would disturb the timings above.
    for row in rows:
        bench_torch(row, args.size, args.repeat, args.torch_compile)

    cols = [("example", "example", str), ("nodes", "nodes", str), ("compile", "compile_ms", fmt),
            ("save", "save_ms", fmt), ("load", "load_ms", fmt), ("xgrun run", "xgrun_run_ms", fmt),
            ("run (cached)", "run_cached_ms", fmt), ("run --no-check", "run_nocheck_ms", fmt),
            ("torch eager", "eager_ms", fmt)]
    if args.torch_compile:
        cols.append(("torch.compile", "torch_compile_ms", fmt))
    table = [[title for title, _, _ in cols]] + [[f(r[key]) for _, key, f in cols] for r in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(cols))]
    print(f"engines on the CPU executor (symbolic dims = {args.size}, median of {args.repeat}, "
          f"{torch.get_num_threads()} torch thread(s))")
    for i, line in enumerate(table):
        print(" | ".join(cell.rjust(w) if j else cell.ljust(w) for j, (cell, w) in enumerate(zip(line, widths))))
        if i == 0:
            print("-|-".join("-" * w for w in widths))
    o = overhead
    print(f"\nexecutor overhead: a {o['graph_nodes']}-node element-wise chain on float32[4] (best of {args.repeat * 5})")
    print(f"  executor run (no check, no timings)  {o['executor_ms']:.3f} ms")
    print(f"  executor run (check, timings)        {o['executor_checked_ms']:.3f} ms")
    print(f"  Engine.run (specialisation cached)   {o['engine_run_ms']:.3f} ms")
    print(f"  the same {o['torch_ops']} torch ops called directly {o['direct_torch_ms']:.3f} ms "
          f"({o['torch_us_per_op']:.2f} us per op)")
    print(f"  overhead per node: {o['overhead_us_per_node']:.2f} us (bare executor), "
          f"{o['overhead_us_per_node_timed_checked']:.2f} us (check + timings), "
          f"{o['overhead_us_per_node_engine_run']:.2f} us (Engine.run)")

    args.json_out.parent.mkdir(parents=True, exist_ok=True)
    args.json_out.write_text(json.dumps({
        "machine": platform.machine(), "processor": platform.processor(), "python": platform.python_version(),
        "torch": torch.__version__, "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
        "size": args.size, "repeat": args.repeat, "examples": rows, "executor_overhead": overhead,
    }, indent=2) + "\n")
    print(f"\nwrote {args.json_out}")


if __name__ == "__main__":
    main()
