#!/usr/bin/env python3
"""Bazel build times of `//models:train_engine --config=gb200`: cold, no-op, after an edit, and a
second checkout against a warm remote cache. Prints a table and writes JSON (out/bench_bazel.json).

    .venv/bin/python tools/bench/bench_bazel.py [--json out/bench_bazel.json] [--target //models:train_engine]

Runs in two fresh copies of this checkout (the files git knows), with a real nginx cache server
(tools/cache-server) as the remote cache of Bazel and of XG, and an empty XG cache, so "cold"
means cold: every kernel is planned, tuned (predicted: no GPU here) and compiled. The edit adds a
residual before the final LayerNorm of models/train.xg (GPT-2 small), which changes some kernels
and leaves the rest alone;
before it, a comment line atop the file moves every line and changes no kernel (the tuning
actions stay cached: shard files hold no source positions).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "bazel"))

from bazel_helpers import PYTHON, copy_checkout, summary  # noqa: E402  (the tests' checkout copier)

EDIT_FROM = "    logits = layer_norm(x, lnf_g, lnf_b) @ transpose(wte)\n"
EDIT_TO = "    logits = layer_norm(x + x, lnf_g, lnf_b) @ transpose(wte)\n"


def timed(ws, target: str, flags: list[str]) -> tuple[float, str]:
    t0 = time.perf_counter()
    res = ws.build(target, *flags)
    seconds = time.perf_counter() - t0
    if res.returncode != 0:
        sys.exit(f"bench_bazel: the build failed:\n{res.stderr[-3000:]}")
    return seconds, summary(res)


def actions(line: str) -> str:
    return re.sub(r"^INFO: ", "", line)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, default=REPO / "out" / "bench_bazel.json")
    ap.add_argument("--target", default="//models:train_engine")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="xg-bench-bazel-"))
    server = [str(PYTHON), str(REPO / "tools" / "cache-server")]
    url = subprocess.run([*server, "start", "--dir", str(tmp / "server")], capture_output=True, text=True,
                         check=True).stdout.strip()
    a = copy_checkout(tmp / "a")
    b = copy_checkout(tmp / "b")
    flags = ["--config=gb200", "--config=cache", f"--remote_cache={url}", f"--action_env=XG_REMOTE_CACHE={url}",
             f"--action_env=XG_CACHE_DIR={tmp / 'xg-cache'}"]
    rows = []
    try:
        for label, ws, prepare in (
            ("cold build (empty caches)", a, None),
            ("no-op rebuild (warm server)", a, None),
            ("rebuild after a comment line atop train.xg", a, "comment"),
            ("rebuild after editing loss_fn() in train.xg", a, "edit"),
            ("no-op rebuild after the edit", a, None),
            ("second checkout, warm remote cache", b, None),
        ):
            src = ws.root / "models" / "train.xg"
            if prepare == "comment":       # every line moves; no kernel changes
                src.write_text("# an edit that moves every line\n" + src.read_text())
            if prepare == "edit":          # a residual more: the kernels it touches change
                text = src.read_text()
                assert EDIT_FROM in text, "models/train.xg changed: update the benchmark's edit"
                src.write_text(text.replace(EDIT_FROM, EDIT_TO))
            seconds, line = timed(ws, args.target, flags)
            rows.append({"step": label, "seconds": round(seconds, 3), "actions": actions(line)})
            print(f"{label:<46} {seconds:8.2f} s   {actions(line)}", flush=True)
    finally:
        for ws in (a, b):
            ws.shutdown(expunge=True)
        subprocess.run([*server, "stop", "--dir", str(tmp / "server")], capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)
    print()
    print(f"| step | seconds | actions |\n| --- | --- | --- |")
    for r in rows:
        print(f"| {r['step']} | {r['seconds']:.2f} | {r['actions']} |")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"target": args.target, "config": "gb200", "host": platform.node(),
                                     "cpus": os.cpu_count(), "rows": rows}, indent=2) + "\n")
    print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
