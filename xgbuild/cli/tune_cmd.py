"""`xgbuild tune`, `xgbuild jobs`, `xgbuild tune-shard`: tuning without linking, and its fan-out steps.

    xgbuild tune FILE.xg --target H100 [--tune measure] [--dim T=8192]      tune every job; no engine
    xgbuild jobs FILE.xg --target GB200 --out s0.json --out s1.json         the jobs, split into shards
    xgbuild tune-shard s0.json --tune cache --out r0.json                   tune + compile one shard
    xgc FILE.xg --target GB200 --out e.xge --kernels-from r0.json ...       link (see xgc)

The last three are what a build system runs as separate cached actions (rules_xg does); see
xgbuild/tuner/jobfile.py for the files and xgbuild/build/shards.py for the steps. Exit codes as
every XG command: 0 ok, 1 failed, 2 usage.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from ..compiler.frontend import CheckOptions
from ..errors import XGError
from .common import (EXIT_USAGE, compile_or_exit, emit_json, fail, parse_consts, parse_dims, policy_or_exit,
                     progress_or_exit, settings_or_exit, target_or_exit)

def _options(target: str | None, num_gpu: int | None, entry: str, settings, const: list[str]) -> CheckOptions:
    if not entry.isidentifier():
        fail(f"--entry names a function, got {entry!r}", EXIT_USAGE)
    target_or_exit(target, settings.hw_dir)
    return CheckOptions(target=target, num_gpu=num_gpu, entry=entry, hw_dir=settings.hw_dir,
                        consts=parse_consts(const))


_CONST_HELP = "NAME=VALUE: override a file-level constant (as xgc --const)"


def tune(
    file: Path = typer.Argument(..., metavar="FILE", help="the .xg source file", show_default=False),
    target: Optional[str] = typer.Option(None, "--target", help="GPU profile from hw/ (overrides TARGET_GPU)"),
    num_gpu: Optional[int] = typer.Option(None, "--num-gpu", min=1, help="GPUs to plan for (overrides NUM_GPU)"),
    entry: str = typer.Option("main", "--entry", help="the entry function (as xgc --entry)"),
    const: list[str] = typer.Option([], "--const", metavar="NAME=VALUE", help=_CONST_HELP),
    sharding: Optional[Path] = typer.Option(None, "--sharding", help="a sharding plan (TOML), as xgc --sharding"),
    policy: str = typer.Option("measure", "--tune", help="measure | cache | predict | strict"),
    dim: list[str] = typer.Option([], "--dim", help="NAME=SIZE: tune at this size of a symbolic dim (default 1024)"),
    jobs: Optional[int] = typer.Option(None, "--jobs", min=1, help="processes compiling kernels"),
    budget: Optional[float] = typer.Option(None, "--budget", min=0.1, help="seconds of measuring per job"),
    json_out: bool = typer.Option(False, "--json", help="print one JSON object"),
    progress: str = typer.Option("auto", "--progress", help="progress on stderr: auto, bar, json (one event per "
                                 "line) or none"),
) -> None:
    """Tune every kernel of FILE for the target (winners go to the XG cache); link nothing."""
    policy, dims = policy_or_exit(policy), parse_dims(dim)
    settings = settings_or_exit()
    compiled = compile_or_exit(file, _options(target, num_gpu, entry, settings, const), sharding=sharding)
    from ..build.kernels import tune_program
    from ..build.target import target_profile
    try:
        pairs = tune_program(compiled, target_profile(compiled.target, settings), policy, settings, dims,
                             workers=jobs, budget_s=budget, progress=progress_or_exit(progress, json_out=json_out))
    except XGError as exc:
        fail(str(exc))
    rows = [{"job": job.ident, "kind": job.spec.kind, **w.to_json()} for job, w in pairs]
    if json_out:
        emit_json({"ok": True, "target": compiled.target, "policy": policy, "jobs": rows})
        return
    out = sys.stdout
    out.write(f"{len(rows)} jobs for {compiled.target} (--tune={policy})\n")
    for r in rows:
        cfg = " ".join(f"{k}={v}" for k, v in sorted(r["config"].items()))
        out.write(f"  {r['job']:<48} {r['source']:<9} {r['ms']:.4f} ms  {cfg}\n")


def jobs(
    file: Path = typer.Argument(..., metavar="FILE", help="the .xg source file", show_default=False),
    out: list[Path] = typer.Option(..., "--out", help="a shard file to write (repeat once per shard)"),
    target: Optional[str] = typer.Option(None, "--target", help="GPU profile from hw/ (overrides TARGET_GPU)"),
    num_gpu: Optional[int] = typer.Option(None, "--num-gpu", min=1, help="GPUs to plan for (overrides NUM_GPU)"),
    entry: str = typer.Option("main", "--entry", help="the entry function (as xgc --entry)"),
    const: list[str] = typer.Option([], "--const", metavar="NAME=VALUE", help=_CONST_HELP),
    sharding: Optional[Path] = typer.Option(None, "--sharding", help="a sharding plan (TOML), as xgc --sharding"),
    dim: list[str] = typer.Option([], "--dim", help="NAME=SIZE: tune at this size of a symbolic dim (default 1024)"),
    quiet: bool = typer.Option(False, "--quiet", help="print errors only (no warnings, no summary)"),
) -> None:
    """Write FILE's tuning jobs, split into one shard file per --out (stable by job identity)."""
    dims = parse_dims(dim)
    if len(set(out)) != len(out):
        fail("each --out names a different shard file", EXIT_USAGE)
    compiled = compile_or_exit(file, _options(target, num_gpu, entry, settings_or_exit(), const), warnings=not quiet,
                               sharding=sharding)
    from ..build.shards import write_shards
    try:
        n = write_shards(compiled, dims, len(out), list(out))
    except XGError as exc:
        fail(str(exc))
    except OSError as exc:
        fail(f"cannot write the shard files: {exc}")
    if not quiet:
        sys.stderr.write(f"{n} tuning jobs for {compiled.target} in {len(out)} shards\n")


def tune_shard(
    shard: Path = typer.Argument(..., metavar="SHARD", help="a shard file from `xgbuild jobs`", show_default=False),
    out: Path = typer.Option(..., "--out", help="the result file to write"),
    policy: str = typer.Option("cache", "--tune", help="measure | cache | predict | strict"),
    jobs: Optional[int] = typer.Option(None, "--jobs", min=1, help="processes compiling kernels"),
    budget: Optional[float] = typer.Option(None, "--budget", min=0.1, help="seconds of measuring per job"),
    quiet: bool = typer.Option(False, "--quiet", help="no summary line"),
    remote: Optional[str] = typer.Option(None, "--remote", help="the XG cache's remote tier, a Bazel HTTP cache "
                                         "URL (default: $XG_REMOTE_CACHE); rules_xg passes //rules_xg:remote_cache"),
    remote_header_file: Optional[Path] = typer.Option(
        None, "--remote-header-file", help="a file holding the 'Name: value' header for the remote (a token stays "
        "out of the command line; default: $XG_REMOTE_CACHE_HEADER(_FILE))"),
) -> None:
    """Tune and compile the jobs of one shard file into a result file for `xgc --kernels-from`."""
    policy = policy_or_exit(policy)
    settings = _remote_settings(settings_or_exit(), remote, remote_header_file)
    from ..build.shards import tune_shard as run_shard
    try:
        stats = run_shard(shard, out, policy, settings, workers=jobs, budget_s=budget,
                          progress=sys.stderr.isatty())
    except XGError as exc:
        fail(str(exc))
    except OSError as exc:
        fail(f"cannot write {str(out)!r}: {exc}")
    if not quiet:
        sys.stderr.write(f"{shard.name}: {stats['jobs']} jobs ({stats['measured']} measured, {stats['cache']} "
                         f"from cache, {stats['predicted']} predicted); {stats['compiled']} compiled, "
                         f"{stats['compile_cache_hits']} cubins from cache\n")


def _remote_settings(settings, remote: str | None, header_file: Path | None):
    """`settings` with the remote tier the flags name (they beat the environment)."""
    import dataclasses

    from ..settings import SettingsError, read_header_file
    changes: dict[str, object] = {}
    if remote is not None:
        if remote and not remote.startswith(("http://", "https://")):
            fail(f"--remote must be an http:// or https:// URL, got {remote!r}", EXIT_USAGE)
        changes["remote_cache"] = remote or None
    try:
        if header_file is not None:
            changes["remote_header"] = read_header_file(header_file)
        return dataclasses.replace(settings, **changes)
    except SettingsError as exc:
        fail(str(exc), EXIT_USAGE)


def register(app: typer.Typer) -> None:
    app.command()(tune)
    app.command()(jobs)
    app.command("tune-shard")(tune_shard)
