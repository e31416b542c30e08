#!/usr/bin/env python3
"""Benchmark the artifact cache: local lookups, 1 MB blob get/put, and a loopback remote via nginx.

    .venv/bin/python tools/bench/bench_cache.py [--n 2000] [--json-out out/bench_cache.json]

Prints a table and writes the same figures as JSON. Goals (from the cache issue): local record
lookup p50 under 1 ms, 1 MB blob get p50 under 5 ms. The remote figures use tools/cache-server
(Debian's nginx) on 127.0.0.1, started and stopped here; they are skipped if nginx is absent.
Everything runs in fresh temp directories; nothing touches the user's cache.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from xgbuild.cache import Cache, CacheKey, LocalStore, RemoteStore  # noqa: E402

GOALS_MS = {"local_lookup": 1.0, "blob_get_1mb": 5.0}


def key(i: int) -> CacheKey:
    return CacheKey(
        kernel_ir={"ops": ["load", "dot", "store"], "id": i},
        shapes={"A": [4096, 4096], "B": [4096, 4096]},
        dtypes={"A": "bfloat16", "B": "bfloat16", "out": "float32"},
        gpu_profile={"name": "H100", "sm": 90, "sms": 132},
        search_space={"BLOCK_M": [64, 128, 256], "BLOCK_N": [64, 128, 256], "num_warps": [4, 8]},
        policy={"mode": "measure", "repeats": 100},
    )


def timed(fn: Callable[[int], object], n: int) -> list[float]:
    """Milliseconds per call of fn(i) for i in range(n), after a short warm-up."""
    for i in range(min(20, n)):
        fn(i)
    out = []
    for i in range(n):
        start = time.perf_counter()
        fn(i)
        out.append((time.perf_counter() - start) * 1e3)
    return out


def summary(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return {"p50_ms": round(statistics.median(ordered), 4), "p99_ms": round(pick(0.99), 4),
            "mean_ms": round(statistics.fmean(ordered), 4), "n": len(ordered)}


def bench_local(tmp: Path, n: int) -> dict[str, dict]:
    cache = Cache(LocalStore(tmp / "local"))
    cubin = os.urandom(16 << 10)
    for i in range(n):
        cache.store(key(i), {"best": {"BLOCK_M": 128}, "ms": 0.5}, {"cubin": cubin + i.to_bytes(4, "big")})
    digests = [key(i).digest for i in range(n)]
    results = {
        "local_record_lookup": summary(timed(lambda i: cache.local.get_record(digests[i]), n)),
        "local_lookup": summary(timed(lambda i: cache.lookup(digests[i]), n)),
    }
    blobs = [os.urandom(1 << 20) for _ in range(min(n, 200))]
    m = len(blobs)
    results["blob_put_1mb"] = summary(timed(lambda i: cache.put_blob(blobs[i % m] + b"%d" % i), m))
    stored = [cache.put_blob(b) for b in blobs]
    results["blob_get_1mb"] = summary(timed(lambda i: cache.get_blob(stored[i % m]), m))
    cache.close()
    return results


def bench_remote(tmp: Path, n: int) -> dict[str, dict]:
    server_dir = tmp / "nginx"
    tool = ROOT / "tools" / "cache-server"
    proc = subprocess.run([sys.executable, str(tool), "start", "--dir", str(server_dir)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        print(f"remote benchmarks skipped: {proc.stderr.strip()}", file=sys.stderr)
        return {}
    url = proc.stdout.strip()
    try:
        writer = Cache(LocalStore(tmp / "writer"), RemoteStore(url))
        m = min(n, 300)
        cubin = os.urandom(16 << 10)
        results = {"remote_store_roundtrip": summary(timed(
            lambda i: writer.store(key(10_000 + i), {"i": i}, {"cubin": cubin + b"%d" % i}), m))}
        reader = Cache(LocalStore(tmp / "reader"), RemoteStore(url))
        # Each lookup misses locally, fetches record + blob from nginx, verifies and fills local.
        results["remote_lookup_fill"] = summary(timed(lambda i: reader.lookup(key(10_000 + i)), m))
        remote = RemoteStore(url)
        digests = [writer.put_blob(os.urandom(1 << 20)) for _ in range(20)]
        results["remote_get_1mb"] = summary(timed(lambda i: remote.get("cas", digests[i % 20]), m))
        results["remote_get_record"] = summary(timed(
            lambda i: remote.get("ac", key(10_000 + i).digest), m))
        for c in (writer, reader):
            c.close()
        return results
    finally:
        subprocess.run([sys.executable, str(tool), "stop", "--dir", str(server_dir)], capture_output=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=2000, help="lookups to time (default 2000)")
    parser.add_argument("--json-out", default=str(ROOT / "out" / "bench_cache.json"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="xg-bench-cache-") as tmp:
        results = bench_local(Path(tmp), args.n)
        results.update(bench_remote(Path(tmp), args.n))
    print(f"{'measure':<24}{'p50 ms':>10}{'p99 ms':>10}{'mean ms':>10}{'n':>7}   goal")
    for name, s in results.items():
        goal = GOALS_MS.get(name)
        verdict = "" if goal is None else f"p50 < {goal:g} ms: {'met' if s['p50_ms'] < goal else 'MISSED'}"
        print(f"{name:<24}{s['p50_ms']:>10.3f}{s['p99_ms']:>10.3f}{s['mean_ms']:>10.3f}{s['n']:>7}"
              f"   {verdict}")
    out = Path(args.json_out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "machine": {"python": platform.python_version(), "platform": platform.platform(),
                    "cpus": os.cpu_count()},
        "goals_ms": GOALS_MS,
        "results": results,
    }, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
