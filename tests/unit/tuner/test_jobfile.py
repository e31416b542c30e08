"""Tuning as separate steps: jobs -> shard files -> result files -> link, as a build system runs them.

The steps must give exactly what one `xgc --out` process gives (same kernel table, same engine
bytes), every job must land in exactly one shard, and every file between the steps is checked:
a tampered, truncated, foreign or missing file is a clear error, never a wrong engine.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path

import pytest

from xgbuild.build.package import engine_of
from xgbuild.build.shards import link_results, tune_shard, write_shards
from xgbuild.compiler.driver import compile_file
from xgbuild.compiler.frontend import CheckOptions
from xgbuild.errors import CompileError
from xgbuild.hw import load_profile
from xgbuild.settings import Settings
from xgbuild.tuner.jobfile import (JobFileError, canonical_bytes, job_from_json, job_to_json, portable,
                                   read_results, shard_docs, shard_of)
from xgbuild.tuner.link import build_kernels, plan_jobs
from xgbuild.tuner.policy import Policy
from xgbuild.tuner.tuner import Tuner

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def train():
    return compile_file(REPO / "models" / "train_tiny.xg", CheckOptions(target="GB200"))


@pytest.fixture(scope="module")
def mlp():
    return compile_file(REPO / "examples" / "mlp.xg", CheckOptions(target="H100"))


def test_jobs_round_trip_through_json_with_the_same_identity_and_key(train):
    jobs, _ = plan_jobs(train.optimized.main, {})
    tuner = Tuner(load_profile("GB200"), policy="predict")
    assert len(jobs) > 20
    for job in jobs:
        doc = json.loads(canonical_bytes(job_to_json(portable(job))))
        back = job_from_json(doc)
        assert back.ident == job.ident
        assert tuner.key(back).digest == tuner.key(job).digest
        cfg = {"BLOCK_K": 32, "SINGLE": 1, "BLOCK_D": 64}     # every kind's assumptions read from it
        assert back.fast_variant(cfg) == job.fast_variant(cfg)


def test_every_job_lands_in_exactly_one_stable_shard(train):
    jobs, _ = plan_jobs(train.optimized.main, {})
    for shards in (1, 3, 4, 16):
        docs = shard_docs(jobs, "GB200", shards)
        seen = [j["ident"] for d in docs for j in d["jobs"]]
        assert sorted(seen) == sorted(j.ident for j in jobs)
        for i, d in enumerate(docs):
            assert all(shard_of(j["ident"], shards) == i for j in d["jobs"])
            assert [j["ident"] for j in d["jobs"]] == sorted(j["ident"] for j in d["jobs"])
    with pytest.raises(JobFileError, match="at least 1"):
        shard_docs(jobs, "GB200", 0)


def test_shard_files_do_not_change_with_edits_that_leave_the_jobs_alone(tmp_path):
    """Moving code, adding a function or a computation elsewhere: the unchanged jobs' shard bytes
    stay the same, so a build system keeps their tuning actions cached."""
    text = (REPO / "examples" / "norms.xg").read_text()
    first = tmp_path / "a.xg"
    first.write_text(text)
    # Two lines more at the top (every node's line and id shift) and an unrelated function.
    second = tmp_path / "b.xg"
    second.write_text("# an edit\n\n" + text.replace("def main", "def unused(Tensor[float32, Q] q) -> float32 {\n"
                                                       "    return sum(exp(q))\n}\n\ndef main", 1))
    docs = []
    for path in (first, second):
        compiled = compile_file(path, CheckOptions(target="H100"))
        jobs, _ = plan_jobs(compiled.optimized.main, {})
        docs.append([canonical_bytes(d) for d in shard_docs(jobs, "H100", 4)])
    assert docs[0] == docs[1]


def test_a_job_whose_contents_do_not_match_its_identity_is_refused(mlp):
    jobs, _ = plan_jobs(mlp.optimized.main, {})
    doc = job_to_json(jobs[0])
    doc["sizes"] = {k: v * 2 for k, v in doc["sizes"].items()}
    doc["problem"]["m"] *= 2
    doc["graph"]["nodes"][0]["shape"] = [7] * len(doc["graph"]["nodes"][0]["shape"])
    doc["ident"] = doc["ident"].replace("1024", "9999")
    with pytest.raises(JobFileError, match="does not match its own contents"):
        job_from_json(doc)
    with pytest.raises(JobFileError, match="malformed job"):
        job_from_json({"ident": "x", "spec": {}})
    doc = job_to_json(jobs[0])
    doc["problem"]["kind"] = "conv"
    with pytest.raises(JobFileError, match="malformed job: ValueError: unknown kernel kind 'conv'"):
        job_from_json(doc)


def _steps(compiled, tmp: Path, shards: int, dims=None) -> tuple[list[Path], object]:
    shard_paths = [tmp / f"shard-{i}.json" for i in range(shards)]
    write_shards(compiled, dims or {}, shards, shard_paths)
    results = []
    for i, shard in enumerate(shard_paths):
        out = tmp / f"result-{i}.json"
        tune_shard(shard, out, Policy.PREDICT, Settings(), workers=1)
        results.append(out)
    return results, link_results(compiled, load_profile(compiled.target), dims or {}, results)


def test_the_steps_give_the_one_process_kernel_table_and_engine_bytes(mlp, tmp_path):
    results, table = _steps(mlp, tmp_path, 3)
    whole = build_kernels(mlp.optimized.main, load_profile("H100"), policy="predict", workers=1)
    assert table.kernels == whole.kernels
    assert table.launches == whole.launches
    assert table.files == whole.files
    assert engine_of(mlp, table).digest == engine_of(mlp, whole).digest
    # Results are canonical: tuning the same shard again gives the same bytes.
    again = tmp_path / "again.json"
    tune_shard(tmp_path / "shard-1.json", again, Policy.PREDICT, Settings(), workers=1)
    assert again.read_bytes() == results[1].read_bytes()


def test_link_refuses_results_of_another_target_or_program(mlp, tmp_path):
    results, _ = _steps(mlp, tmp_path, 2)
    other = compile_file(REPO / "examples" / "mlp.xg", CheckOptions(target="GB200"))
    with pytest.raises(JobFileError, match=r"made for H100 \(sm_90\), not GB200 \(sm_100\)"):
        link_results(other, load_profile("GB200"), {}, results)
    with pytest.raises(CompileError, match="no tuned kernel for 1 of 2 jobs"):
        link_results(mlp, load_profile("H100"), {}, [r for r in results if json.loads(r.read_text())["kernels"]][:1])
    with pytest.raises(CompileError, match="no tuned kernel"):
        link_results(mlp, load_profile("H100"), {"T": 64}, results)     # other dims: other tuning shapes, other jobs


def test_damaged_result_files_are_refused(mlp, tmp_path):
    results, _ = _steps(mlp, tmp_path, 1)
    doc = json.loads(results[0].read_text())
    path = next(iter(doc["files"]))
    blob = bytearray(base64.b64decode(doc["files"][path]))
    blob[len(blob) // 2] ^= 0x40
    doc["files"][path] = base64.b64encode(bytes(blob)).decode()
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    with pytest.raises(JobFileError, match="missing or corrupt"):
        read_results([bad], "H100", 90)
    del doc["files"][path]
    bad.write_text(json.dumps(doc))
    with pytest.raises(JobFileError, match="missing or corrupt"):
        read_results([bad], "H100", 90)
    bad.write_bytes(results[0].read_bytes()[:100])
    with pytest.raises(JobFileError, match="is not JSON"):
        read_results([bad], "H100", 90)
    bad.write_text(json.dumps({"format": "xg-tune-shard/1"}))
    with pytest.raises(JobFileError, match="is not a tuning result"):
        read_results([bad], "H100", 90)
    with pytest.raises(JobFileError, match="does not exist"):
        read_results([tmp_path / "missing.json"], "H100", 90)


def test_an_empty_shard_is_answered_without_importing_torch(tmp_path):
    shard = tmp_path / "empty.json"
    shard.write_bytes(canonical_bytes({"format": "xg-tune-shard/1", "target": "H100", "shard": 0, "shards": 4,
                                       "jobs": []}))
    code = ("import sys; from pathlib import Path; from xgbuild.build.shards import tune_shard; "
            "from xgbuild.settings import Settings; "
            f"tune_shard(Path({str(shard)!r}), Path({str(tmp_path / 'r.json')!r}), 'cache', Settings()); "
            "print('torch' in sys.modules)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "False"
    assert json.loads((tmp_path / "r.json").read_text())["kernels"] == {}


def _cli(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, timeout=300, cwd=cwd)


def test_the_commands_end_to_end_and_their_bad_input(tmp_path):
    src = str(REPO / "examples" / "norms.xg")
    s0, s1 = tmp_path / "s0.json", tmp_path / "s1.json"
    res = _cli("xgbuild.cli.xgbuild", "jobs", src, "--target", "H100", "--out", str(s0), "--out", str(s1))
    assert res.returncode == 0, res.stderr
    assert "tuning jobs for H100 in 2 shards" in res.stderr
    outs = []
    for s in (s0, s1):
        r = tmp_path / (s.stem + ".result.json")
        res = _cli("xgbuild.cli.xgbuild", "tune-shard", str(s), "--tune", "predict", "--out", str(r), "--jobs", "1")
        assert res.returncode == 0, res.stderr
        outs += ["--kernels-from", str(r)]
    linked, direct = tmp_path / "linked.xge", tmp_path / "direct.xge"
    res = _cli("xgbuild.cli.xgc", src, "--target", "H100", "--out", str(linked), *outs)
    assert res.returncode == 0, res.stderr
    res = _cli("xgbuild.cli.xgc", src, "--target", "H100", "--tune", "predict", "--out", str(direct))
    assert res.returncode == 0, res.stderr
    assert linked.read_bytes() == direct.read_bytes()

    bad = [
        (("xgbuild.cli.xgbuild", "jobs", src, "--out", str(s0), "--out", str(s0)), 2, "different shard file"),
        (("xgbuild.cli.xgbuild", "tune-shard", str(tmp_path / "nope.json"), "--out", str(tmp_path / "r.json")),
         1, "does not exist"),
        (("xgbuild.cli.xgbuild", "tune-shard", str(s0), "--tune", "fast", "--out", str(tmp_path / "r.json")),
         2, "--tune takes"),
        (("xgbuild.cli.xgbuild", "tune-shard", src, "--out", str(tmp_path / "r.json")), 1, "is not JSON"),
        (("xgbuild.cli.xgc", src, "--out", str(tmp_path / "e.xge"), "--no-kernels", *outs), 2, "--no-kernels"),
        (("xgbuild.cli.xgc", src, "--target", "GB200", "--out", str(tmp_path / "e.xge"), *outs), 1,
         "not GB200"),
        (("xgbuild.cli.xgbuild", "jobs", str(tmp_path / "missing.xg"), "--out", str(s0)), 2, "missing.xg"),
    ]
    for args, code, text in bad:
        res = _cli(*args)
        assert res.returncode == code, (args, res.stderr)
        assert text in res.stderr, (args, res.stderr)
        assert "Traceback" not in res.stderr
    assert not (tmp_path / "e.xge").exists() and not (tmp_path / "r.json").exists()


def test_tune_shard_reaches_xg_remote_tier_through_its_flags_and_a_header_file(mlp, tmp_path):
    """What rules_xg passes a tuning action (`--remote` from //rules_xg:remote_cache,
    `--remote-header-file` from :remote_header_file): a winner measured on another host reaches the
    shard through the remote, the token read from a file and never put on the command line."""
    import os

    from xgbuild.cache import Cache
    if not Path("/usr/sbin/nginx").exists():
        pytest.skip("/usr/sbin/nginx is not installed (tools/setup.sh installs it)")
    server = [sys.executable, str(REPO / "tools" / "cache-server")]
    started = subprocess.run([*server, "start", "--dir", str(tmp_path / "server"), "--token", "s3cret-token"],
                             capture_output=True, text=True, timeout=60)
    assert started.returncode == 0, started.stderr
    url = started.stdout.strip()
    try:
        shard = tmp_path / "shard-0.json"
        write_shards(mlp, {}, 1, [shard])
        jobs, _ = plan_jobs(mlp.optimized.main, {})
        tuner = Tuner(load_profile("H100"))
        with Cache.open(Settings(cache_dir=tmp_path / "gpu-host", remote_cache=url,
                                 remote_header="Authorization: Bearer s3cret-token")) as cache:
            for job in jobs:
                cache.store(tuner.key(job), {"how": "measured", "config": tuner.candidates(job)[-1], "ms": 0.125,
                                             "measured_on": "NVIDIA H100 80GB HBM3", "candidates": 7, "rejected": {}})
        header = tmp_path / "cache-header"
        header.write_text("Authorization: Bearer s3cret-token\n")
        env = {k: v for k, v in os.environ.items() if not k.startswith("XG_")}
        env["XG_CACHE_DIR"] = str(tmp_path / "cpu-host")
        cmd = [sys.executable, "-m", "xgbuild.cli.xgbuild", "tune-shard", str(shard), "--tune", "cache",
               "--out", str(tmp_path / "result.json"), "--jobs", "1", "--remote", url, "--remote-header-file", str(header)]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=REPO, env=env)
        assert res.returncode == 0, res.stderr
        assert f"{len(jobs)} jobs (0 measured, {len(jobs)} from cache, 0 predicted)" in res.stderr
        assert "warning" not in res.stderr          # the uploads of its cubins were let in, too
        header.write_text("s3cret-token-without-a-name")
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=REPO, env=env)
        assert res.returncode == 2 and "does not hold one 'Name: value' line" in res.stderr
        assert "s3cret-token" not in res.stderr
        bad_url = [*cmd[:-4], "--remote", "cache.example:8080"]
        res = subprocess.run(bad_url, capture_output=True, text=True, timeout=300, cwd=REPO, env=env)
        assert res.returncode == 2 and "--remote must be an http:// or https:// URL" in res.stderr
    finally:
        subprocess.run([*server, "stop", "--dir", str(tmp_path / "server")], capture_output=True, timeout=60)
