"""The Bazel workspace as a user drives it: offline builds through bazel and bazelisk, the configs,
diagnostics in Bazel's output, bad settings, and the GPU tags of measuring. (`bazel test //...`
itself runs after pytest in tools/test, through tools/bazel-test, so CI prints its summary line.)"""

from __future__ import annotations

import json
import re
import subprocess

import pytest

from bazel_helpers import BAZELISK, PYTHON, REPO, explain

pytestmark = pytest.mark.timeout(1800)


def inspect(engine) -> dict:
    res = subprocess.run([str(PYTHON), "-m", "xgbuild.cli.xgbuild", "inspect", str(engine), "--json"],
                         capture_output=True, text=True, timeout=120, cwd=REPO)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def test_train_engine_for_gb200_through_bazel_and_bazelisk(repo_workspace):
    """The user's command, offline: sm_100 kernels for GB200, whichever front end runs Bazel."""
    engines = []
    for bazel in ("bazel", BAZELISK):
        if bazel == BAZELISK and not BAZELISK.exists():
            pytest.fail(f"{BAZELISK} is missing: tools/setup.sh installs bazelisk from npm")
        res = repo_workspace.run("build", "--config=ci", "//models:train_engine", "--config=gb200", bazel=bazel)
        assert res.returncode == 0, explain(res)
        engine = repo_workspace.bin("models/train_engine.xge")
        engines.append(engine.read_bytes())
        manifest = inspect(engine)
        assert manifest["target"] == "GB200"
        archs = {v["arch"] for k in manifest["kernels"] for v in k["variants"]}
        assert manifest["kernels"] and archs == {100}, archs
        assert {k["tuning"]["source"] for k in manifest["kernels"]} <= {"predicted", "cache"}
    assert engines[0] == engines[1]


@pytest.mark.parametrize("target,plan", [("train_engine_tp2", "train_tensor"), ("train_engine_pp2", "train_pipeline")])
def test_sharding_plan_attribute_builds_the_many_gpu_engine(repo_workspace, tmp_path, target, plan):
    """`sharding = "plans/...toml"` (tensor parallel, or a pipeline): the plan reaches the jobs and
    link actions, and the engine is the one `xgc --num-gpu 2 --sharding ...` links from the same
    tuning results."""
    res = repo_workspace.build(f"//models:{target}", "--config=h100", "--config=predict")
    assert res.returncode == 0, explain(res)
    engine = repo_workspace.bin(f"models/{target}.xge")
    manifest = inspect(engine)
    assert manifest["num_gpu"] == 2 and manifest["target"] == "H100"
    sharding = manifest["sharding_plan"]
    assert sharding["num_gpu"] == 2
    if plan == "train_pipeline":
        assert sharding["pipeline"]["transfers"] and not sharding["collectives"], sharding.keys()
    else:
        assert sharding["collectives"], sharding.keys()
    results = sorted(engine.parent.glob(f"{target}.tune/result-*.json"))
    assert results
    out = tmp_path / f"{target}.xge"
    cli = subprocess.run([str(PYTHON), "-m", "xgbuild.cli.xgc", "models/train_tiny.xg", "--target", "H100", "--num-gpu",
                          "2", "--sharding", f"models/plans/{plan}.toml", "--out", str(out), "--quiet",
                          *[a for r in results for a in ("--kernels-from", str(r))]],
                         capture_output=True, text=True, timeout=600, cwd=repo_workspace.root)
    assert cli.returncode == 0, cli.stderr
    assert out.read_bytes() == engine.read_bytes()


def test_a_type_error_fails_the_build_with_the_diagnostic(make_checkout):
    ws = make_checkout("typeerror")
    pkg = ws.root / "broken"
    pkg.mkdir()
    (pkg / "bad.xg").write_text("extern float32 A\nextern float32 B\ndef main() {\n    return A / B\n}\n")
    (pkg / "BUILD").write_text('load("//rules_xg:defs.bzl", "xg_engine", "xg_library")\n'
                               'xg_engine(name = "bad", src = "bad.xg")\n'
                               'xg_library(name = "badlib", srcs = ["bad.xg"])\n')
    for target in ("//broken:bad", "//broken:badlib"):
        res = ws.build(target)
        assert res.returncode != 0
        out = res.stderr + res.stdout
        assert "error[XG0300]: cannot prove the divisor `B` is nonzero" in out, explain(res)
        assert "--> broken/bad.xg:4:" in out and "^ this divisor may be zero" in out, explain(res)
        assert "Traceback" not in out


def test_consts_override_file_constants_and_bad_ones_fail_with_a_message(make_checkout):
    """`consts` reaches the compiler as `--const`: a value of the wrong form fails analysis, naming
    it; a constant the file lacks fails the build with XG's diagnostic; a good one builds."""
    ws = make_checkout("consts")
    pkg = ws.root / "deep"
    pkg.mkdir()
    (pkg / "deep.xg").write_text("L = 3\nextern Tensor[float32, L, 8, 8] W\nextern Tensor[float32, 8] X\n"
                                 "def main() -> Tensor[float32, 8] {\n    x = X\n    for l in range(L) {\n"
                                 "        x = tanh(x @ W[l])\n    }\n    return x\n}\n")
    (pkg / "BUILD").write_text('load("//rules_xg:defs.bzl", "xg_engine")\n'
                               'xg_engine(name = "two", src = "deep.xg", consts = {"L": "2"}, kernels = False)\n'
                               'xg_engine(name = "word", src = "deep.xg", consts = {"L": "two"}, kernels = False)\n'
                               'xg_engine(name = "typo", src = "deep.xg", consts = {"Q": "2"}, kernels = False)\n')
    res = ws.build("//deep:word", "--nobuild")
    assert res.returncode != 0 and 'consts["L"] = "two" is not a value' in res.stderr, explain(res)
    res = ws.build("//deep:typo")
    out = res.stderr + res.stdout
    assert res.returncode != 0 and "error[XG0019]: `--const Q=2` overrides no constant" in out, explain(res)
    assert "Traceback" not in out
    res = ws.build("//deep:two")
    assert res.returncode == 0, explain(res)
    manifest = inspect(ws.bin("deep/two.xge"))
    assert manifest["consts"] == {"L": 2}
    assert [i["shape"] for i in manifest["entry"]["inputs"] if i["name"] == "W"] == [[2, 8, 8]]


def test_unknown_target_fails_analysis_listing_the_allowed_ones(repo_workspace):
    res = repo_workspace.build("//examples:mlp", "--//rules_xg:target=Z100", "--nobuild")
    assert res.returncode != 0
    out = res.stderr
    assert '"Z100" is not an allowed value' in out, explain(res)
    for name in ('"GB200"', '"H100"', '"A100"', '"" (unset)'):
        assert name in out
    res = repo_workspace.build("//examples:mlp", "--//rules_xg:tune=fastest", "--nobuild")
    assert res.returncode != 0 and '"fastest" is not an allowed value' in res.stderr, explain(res)
    res = repo_workspace.build("//examples:mlp", "--//rules_xg:tune_shards=0", "--nobuild")
    assert res.returncode != 0 and "out of range" in res.stderr, explain(res)


def test_configs_cover_every_gpu_profile_and_name_real_targets():
    from xgbuild.hw import known_targets
    rc = (REPO / ".bazelrc").read_text()
    build = (REPO / "rules_xg" / "BUILD").read_text()
    for name in known_targets():
        assert f"build:{name.lower()} --//rules_xg:target={name}\n" in rc, name
        assert f'"{name}",' in build, name
    listed = re.findall(r'^        "([A-Z0-9]+)",$', build.split('name = "tune"')[0], re.M)
    assert sorted(listed) == sorted(known_targets())
    for config in ("cache", "ci"):
        assert f"build:{config} " in rc
    assert "build --incompatible_strict_action_env" in rc


def _tune_actions(ws, *flags: str) -> str:
    res = ws.run("aquery", "--config=ci", *flags, 'mnemonic("XgTune", //examples:mlp)', "--output=text")
    assert res.returncode == 0, explain(res)
    return re.sub(r" *\\\n\s*", " ", res.stdout)    # each command line on one line


def test_measuring_actions_ask_for_a_gpu_and_stay_local(repo_workspace):
    measure = _tune_actions(repo_workspace, "--config=measure", "--config=h100")
    assert measure.count("Mnemonic: XgTune") == 4
    info = "ExecutionInfo: {no-remote-exec: 1, no-sandbox: 1, requires-gpu: 1}"
    blocks = measure.split("\naction '")
    assert len(blocks) == 4 and all(info in b for b in blocks), measure[-3000:]
    assert "--tune measure" in measure
    cached = _tune_actions(repo_workspace, "--config=h100")
    assert "requires-gpu" not in cached and "--tune cache" in cached
    shards = _tune_actions(repo_workspace, "--//rules_xg:tune_shards=2")
    assert shards.count("Mnemonic: XgTune") == 2


def test_a_missing_or_incomplete_python_fails_with_a_message(make_checkout, tmp_path):
    ws = make_checkout("nopython")
    res = ws.run("build", "--config=ci", "//examples:mlp", python=tmp_path / "no" / "python3")
    assert res.returncode != 0
    assert "XG's Python environment is missing" in res.stderr and "tools/setup.sh" in res.stderr, explain(res)
    bare = tmp_path / "bare"
    subprocess.run(["python3", "-m", "venv", "--without-pip", str(bare)], check=True, timeout=120)
    res = ws.run("build", "--config=ci", "//examples:mlp", python=bare / "bin" / "python3")
    assert res.returncode != 0
    assert "lacks torch, triton" in res.stderr, explain(res)
