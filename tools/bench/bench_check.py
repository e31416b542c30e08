"""Benchmark: how long `xgc --check` takes on a generated 5,000-line program.

Prints a table (in-process check time, median of several runs; whole `xgc --check` process time)
and writes JSON. Goal (front-end issue): under one second on a CI-class CPU.

    python tools/bench/bench_check.py [--lines 5000] [--json-out out/bench_check.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from xgbuild.compiler.frontend import check_source

FUNC = """def layer{i}(Tensor[float32, T, D] x, Tensor[float32, D, D] w, Tensor[float32, D] g) -> Tensor[float32, T, D] {{
    h = gelu(x @ w) + x
    ms = mean(h * h, dim=1, keepdim=true)
    n = h * rsqrt(ms + 1e-5) * g
    e = exp(n - max(n, dim=1, keepdim=true))
    return e / sum(e, dim=1, keepdim=true)
}}
def scale{i}(float32 a, float32 b) -> Result[float32] {{
    if b == 0 {{ return DivByZero }}
    return Ok(a / b + cast({i}, float32))
}}
"""


def generate(lines: int) -> str:
    parts = ["TARGET_GPU = H100\nNUM_GPU = 1\nextern Tensor[float32, 64, 128] X\n",
             "extern Tensor[float32, 128, 128] W\nextern Tensor[float32, 128] G\n"]
    body = ["def main() {", "    y = X"]
    i = 0
    while sum(p.count("\n") for p in parts) + len(body) < lines - 4:
        parts.append(FUNC.format(i=i))
        body.append(f"    y = layer{i}(y, W, G) * scale{i}(1.0, 2.0).unwrap_or(1.0)")
        i += 1
    body += ["    return y", "}"]
    return "".join(parts) + "\n".join(body) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=5000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json-out", type=Path, default=Path("out/bench_check.json"))
    args = ap.parse_args()

    src = generate(args.lines)
    n_lines = src.count("\n")
    result = check_source(src, "bench.xg")
    assert result.ok, result.render()[:2000]
    times = []
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        check_source(src, "bench.xg")
        times.append(time.perf_counter() - t0)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.xg"
        path.write_text(src)
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "xgbuild.cli.xgc", str(path), "--check"],
                              capture_output=True, text=True)
        process_s = time.perf_counter() - t0
        assert proc.returncode == 0, proc.stderr[:2000]

    check_s = statistics.median(times)
    rows = [("lines", f"{n_lines}"), ("check, in process (median)", f"{check_s * 1e3:.1f} ms"),
            ("check, best", f"{min(times) * 1e3:.1f} ms"), ("xgc --check, whole process", f"{process_s * 1e3:.1f} ms"),
            ("lines per second", f"{n_lines / check_s:,.0f}"), ("goal: under 1 s", "met" if check_s < 1 else "MISSED")]
    width = max(len(k) for k, _ in rows)
    print(f"{'measure'.ljust(width)} | value")
    print(f"{'-' * width}-|-------")
    for k, v in rows:
        print(f"{k.ljust(width)} | {v}")
    args.json_out.parent.mkdir(parents=True, exist_ok=True)
    args.json_out.write_text(json.dumps({
        "machine": platform.machine(), "python": platform.python_version(), "cpu_count": __import__("os").cpu_count(),
        "lines": n_lines, "check_s_median": check_s, "check_s_all": times, "xgc_process_s": process_s,
    }, indent=2) + "\n")
    print(f"wrote {args.json_out}")


if __name__ == "__main__":
    main()
