"""One cache for every checkout: Bazel's remote cache and XG's remote tier on one real nginx.

Checkout A builds `//models:train_engine_small --config=gb200 --config=cache`; A is cleaned;
checkout B, in another directory, builds the same target and gets every action from the server.
Then two clean builds with no cache at all (fresh XG caches, no remote) give byte-identical engines
too. The target is the training step of models/train.xg at a small configuration (`consts`): the
same jobs, tuning and link actions as the real size, in seconds instead of minutes (the real size
is built once, by tests/bazel/test_workspace.py).
"""

from __future__ import annotations

import re

import pytest

from bazel_helpers import explain, summary

pytestmark = [pytest.mark.timeout(2400), pytest.mark.slow]       # two clean Bazel builds each: CI runs them

TARGET = "//models:train_engine_small"
ENGINE = "models/train_engine_small.xge"


def _cache_flags(url: str, xg_cache) -> list[str]:
    # The server's port is chosen at start, so the URL of .bazelrc's `cache` config is overridden,
    # and XG's tier set, as a user's .bazelrc.user would. XG_CACHE_DIR keeps the tests off the
    # user's own XG cache; it is part of the actions' keys, so both checkouts name the same one.
    return ["--config=gb200", "--config=cache", f"--remote_cache={url}", f"--//rules_xg:remote_cache={url}",
            f"--action_env=XG_CACHE_DIR={xg_cache}"]


def test_second_checkout_hits_the_remote_cache_for_every_action(make_checkout, cache_server, tmp_path):
    a, b = make_checkout("checkout-a"), make_checkout("checkout-b")
    flags = _cache_flags(cache_server, tmp_path / "xg-cache")
    first = a.build(TARGET, *flags)
    assert first.returncode == 0, explain(first)
    engine_a = a.bin(ENGINE).read_bytes()
    assert a.run("clean").returncode == 0

    second = b.build(TARGET, *flags)
    assert second.returncode == 0, explain(second)
    line = summary(second)
    counts = dict((kind.strip(), int(n)) for n, kind in re.findall(r"(\d+) ([a-z -]+?)(?:[,.]|$)",
                                                                     line.split("processes:", 1)[-1]))
    executed = {k: v for k, v in counts.items() if k not in ("internal", "remote cache hit")}
    assert counts.get("remote cache hit", 0) >= 6 and not executed, line
    assert b.bin(ENGINE).read_bytes() == engine_a

    # And A, rebuilt after its clean, also takes everything from the server.
    again = a.build(TARGET, *flags)
    assert again.returncode == 0 and "remote cache hit" in summary(again), explain(again)
    assert a.bin(ENGINE).read_bytes() == engine_a


def test_two_clean_builds_without_any_cache_are_byte_identical(make_checkout, tmp_path):
    engines = []
    for name in ("clean-a", "clean-b"):
        ws = make_checkout(name)
        res = ws.build(TARGET, "--config=gb200", f"--action_env=XG_CACHE_DIR={tmp_path / name / 'xg-cache'}")
        assert res.returncode == 0, explain(res)
        assert "remote cache hit" not in summary(res)
        engines.append(ws.bin(ENGINE).read_bytes())
    assert engines[0] == engines[1]


def test_a_winner_measured_elsewhere_reaches_a_bazel_build_through_xg_remote_tier(make_checkout, cache_server,
                                                                                  tmp_path):
    """Team A's GPU hosts measured a winner and stored it in XG's cache (local store + the shared
    remote tier); team B's Bazel build on a CPU host, with an XG cache of its own, links it."""
    import json
    import subprocess

    from bazel_helpers import PYTHON, REPO
    from xgbuild.cache import Cache
    from xgbuild.compiler.driver import compile_file
    from xgbuild.compiler.frontend import CheckOptions
    from xgbuild.hw import load_profile
    from xgbuild.settings import Settings
    from xgbuild.tuner.link import plan_jobs
    from xgbuild.tuner.tuner import Tuner

    compiled = compile_file(REPO / "examples" / "mlp.xg", CheckOptions(target="H100"))
    jobs, _ = plan_jobs(compiled.optimized.main, {})
    tuner = Tuner(load_profile("H100"))
    team_a = Cache.open(Settings(cache_dir=tmp_path / "team-a", remote_cache=cache_server))
    stored = {}
    try:
        for job in jobs:
            config = tuner.candidates(job)[-1]          # not what the cost model would pick
            team_a.store(tuner.key(job), {"how": "measured", "config": config, "ms": 0.125, "measured_on": "NVIDIA H100 80GB HBM3",
                                          "candidates": 7, "rejected": {}})
            stored[job.ident] = config
    finally:
        team_a.close()

    ws = make_checkout("team-b")
    res = ws.build("//examples:mlp", "--config=h100", "--config=cache", f"--remote_cache={cache_server}",
                   f"--//rules_xg:remote_cache={cache_server}", f"--action_env=XG_CACHE_DIR={tmp_path / 'team-b'}")
    assert res.returncode == 0, explain(res)
    out = subprocess.run([str(PYTHON), "-m", "xgbuild.cli.xgbuild", "inspect", str(ws.bin("examples/mlp.xge")),
                          "--json"], capture_output=True, text=True, timeout=120, cwd=REPO)
    manifest = json.loads(out.stdout)
    assert len(manifest["kernels"]) == len(jobs)
    for k in manifest["kernels"]:
        assert k["tuning"]["source"] == "cache" and k["tuning"]["measured_on"] == "NVIDIA H100 80GB HBM3"
        assert k["tuning"]["config"] == stored[k["id"]]
