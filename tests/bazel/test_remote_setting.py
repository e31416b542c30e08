"""XG's remote tier reaches Bazel's tuning actions by design (issue 25), read from `bazel aquery`.

Under `--incompatible_strict_action_env` an exported XG_REMOTE_CACHE never reaches an action, and
the old `--config=cache --action_env=XG_REMOTE_CACHE=…` put the URL into every action's key, so
switching the cache on or off reran every action. Now the `//rules_xg:remote_cache` setting (and
`:remote_header_file`, a path: never a token) goes on the tuning actions' command lines only, and
`--config=cache` (Bazel's own --remote_cache) changes no action key. Analysis only: no build runs.
"""

from __future__ import annotations

import re

import pytest

from bazel_helpers import explain

pytestmark = [pytest.mark.bazel, pytest.mark.timeout(900)]

# models/train.xg at a small configuration: the real size's actions, plus `consts` on their command lines.
TARGET = "//models:train_engine_small"
URL = "http://cache.example:8080"
HEADER_FILE = "/etc/xg/cache-header"
XG_TIER = [f"--//rules_xg:remote_cache={URL}", f"--//rules_xg:remote_header_file={HEADER_FILE}"]


def aquery(ws, *flags: str) -> list[dict]:
    """Each action of TARGET as {mnemonic, key, env, argv}, from `bazel aquery --output=text`."""
    res = ws.run("aquery", "--config=ci", TARGET, "--config=gb200", *flags, "--output=text", timeout=600)
    assert res.returncode == 0, explain(res)
    actions = []
    for block in res.stdout.split("\naction ")[0:]:
        if "Mnemonic:" not in block:
            continue
        command = block.split("Command Line: (", 1)[1].split(")\n", 1)[0]
        actions.append({
            "mnemonic": re.search(r"Mnemonic: (\S+)", block).group(1),
            "key": re.search(r"ActionKey: (\S+)", block).group(1),
            "env": re.search(r"Environment: \[(.*)\]", block).group(1),
            "argv": [line.strip().rstrip("\\").strip() for line in command.splitlines()],
        })
    assert {a["mnemonic"] for a in actions} >= {"XgJobs", "XgTune", "XgLink"}, actions
    return actions


def _pairs(argv: list[str]) -> dict[str, str]:
    return {flag: value for flag, value in zip(argv, argv[1:]) if flag.startswith("--")}


def test_the_tuning_actions_see_xg_remote_tier_and_no_token(repo_workspace, tmp_path):
    actions = aquery(repo_workspace, *XG_TIER)
    for a in actions:
        assert "XG_REMOTE_CACHE" not in a["env"], a
        if a["mnemonic"] == "XgTune":
            flags = _pairs(a["argv"])
            assert flags.get("--remote") == URL and flags.get("--remote-header-file") == HEADER_FILE, a["argv"]
        else:           # only tuning reads the XG cache: nothing else's key carries the URL
            assert "--remote" not in a["argv"], a
        if a["mnemonic"] in ("XgJobs", "XgLink"):     # `consts`, as `--const NAME=VALUE` sorted by name
            consts = [v.strip("'") for f, v in zip(a["argv"], a["argv"][1:]) if f == "--const"]
            assert consts == ["B=2", "D=64", "H=2", "L=2", "T=32", "V=128"], a["argv"]
    # A value that is not a URL fails analysis, naming it and what is allowed.
    res = repo_workspace.run("aquery", "--config=ci", TARGET, "--//rules_xg:remote_cache=cache.example:8080")
    assert res.returncode != 0 and '"cache.example:8080" is not an allowed value' in res.stderr, explain(res)


def test_switching_the_cache_on_or_off_changes_no_action_key(repo_workspace):
    off = aquery(repo_workspace, *XG_TIER)
    on = aquery(repo_workspace, *XG_TIER, "--config=cache", "--remote_cache=http://127.0.0.1:1")
    assert len(off) >= 6
    assert sorted((a["mnemonic"], a["key"]) for a in on) == sorted((a["mnemonic"], a["key"]) for a in off)
