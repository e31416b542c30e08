"""One cache for every checkout: Bazel's remote cache and XG's remote tier on one real nginx.

Checkout A builds `//models:train_engine --config=gb200 --config=cache`; A is cleaned; checkout B,
in another directory, builds the same target and gets every action from the server. Then two clean
builds with no cache at all (fresh XG caches, no remote) give byte-identical engines too.
"""

from __future__ import annotations

import re

import pytest

from .conftest import explain, summary

pytestmark = pytest.mark.timeout(2400)

TARGET = "//models:train_engine"


def _cache_flags(url: str, xg_cache) -> list[str]:
    # The server's port is chosen at start, so the URL of .bazelrc's `cache` config is overridden,
    # as a user's .bazelrc.user would. XG_CACHE_DIR keeps the tests off the user's own XG cache;
    # it is part of the actions' keys, so both checkouts name the same one.
    return ["--config=gb200", "--config=cache", f"--remote_cache={url}", f"--action_env=XG_REMOTE_CACHE={url}",
            f"--action_env=XG_CACHE_DIR={xg_cache}"]


def test_second_checkout_hits_the_remote_cache_for_every_action(make_checkout, cache_server, tmp_path):
    a, b = make_checkout("checkout-a"), make_checkout("checkout-b")
    flags = _cache_flags(cache_server, tmp_path / "xg-cache")
    first = a.build(TARGET, *flags)
    assert first.returncode == 0, explain(first)
    engine_a = a.bin("models/train_engine.xge").read_bytes()
    assert a.run("clean").returncode == 0

    second = b.build(TARGET, *flags)
    assert second.returncode == 0, explain(second)
    line = summary(second)
    counts = dict((kind.strip(), int(n)) for n, kind in re.findall(r"(\d+) ([a-z -]+?)(?:[,.]|$)",
                                                                     line.split("processes:", 1)[-1]))
    executed = {k: v for k, v in counts.items() if k not in ("internal", "remote cache hit")}
    assert counts.get("remote cache hit", 0) >= 6 and not executed, line
    assert b.bin("models/train_engine.xge").read_bytes() == engine_a

    # And A, rebuilt after its clean, also takes everything from the server.
    again = a.build(TARGET, *flags)
    assert again.returncode == 0 and "remote cache hit" in summary(again), explain(again)
    assert a.bin("models/train_engine.xge").read_bytes() == engine_a


def test_two_clean_builds_without_any_cache_are_byte_identical(make_checkout, tmp_path):
    engines = []
    for name in ("clean-a", "clean-b"):
        ws = make_checkout(name)
        res = ws.build(TARGET, "--config=gb200", f"--action_env=XG_CACHE_DIR={tmp_path / name / 'xg-cache'}")
        assert res.returncode == 0, explain(res)
        assert "remote cache hit" not in summary(res)
        engines.append(ws.bin("models/train_engine.xge").read_bytes())
    assert engines[0] == engines[1]
