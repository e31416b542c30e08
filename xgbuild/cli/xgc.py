"""`xgc`: the XG compiler command. Thin: parsing options and printing; the work is in the library.

    xgc FILE.xg --check [--json]                       type-check only
    xgc FILE.xg --out build/engine.xge [--target T] [--num-gpu N] [--sharding plan.toml] [--entry F]
    xgc FILE.xg --out build/small.xge --const L=2 --const D=64         file constants overridden
    xgc FILE.xg --out build/engine.xge --kernels-from r0.json ...   link `xgbuild tune-shard` results
    xgc FILE.xg --out build/engine.xge --sign-key KEY | --provenance  with a (signed) provenance statement
    xgc FILE.xg --emit ast|ir|ir-opt|ir-json|dot [--dump-after PASS]
    xgc MODEL.onnx --out build/engine.xge [--target T] [--tune P] [--dim NAME=SIZE]   an ONNX model
    xgc MODEL.onnx --check | --emit ir|ir-opt|ir-json|dot                              import only

Exit codes: 0 ok (warnings allowed), 1 errors in the program (for ONNX: unsupported ops), 2 usage,
unreadable file (a missing, corrupt or invalid .onnx included) or internal error.
"""

from __future__ import annotations

import json
import sys
from enum import Enum
from pathlib import Path
from typing import NoReturn, Optional

import typer

from ..compiler.frontend import CheckOptions, check_file
from ..compiler.passes import PASS_NAMES
from ..errors import CompileError, XGError
from .common import (EXIT_PROGRAM, EXIT_USAGE, emit_json, exit_code_for, fail, make_app, parse_consts,
                     policy_or_exit, run, settings_or_exit, target_or_exit, write_diagnostics)
from .version import version_option

app = make_app("Compile an XG program (.xg) into an engine bundle (.xge), or check it.")


class Emit(str, Enum):
    ast = "ast"
    ir = "ir"
    ir_opt = "ir-opt"
    ir_json = "ir-json"
    dot = "dot"


@app.command()
def compile(
    file: Path = typer.Argument(..., metavar="FILE", help="the .xg source file", show_default=False),
    check: bool = typer.Option(False, "--check", help="type-check only; write nothing"),
    out: Optional[Path] = typer.Option(None, "--out", help="write the engine bundle here (.xge)"),
    emit: Optional[Emit] = typer.Option(None, "--emit", help="print a stage: ast, ir, ir-opt, ir-json or dot"),
    dump_after: Optional[str] = typer.Option(None, "--dump-after", help=f"print the IR after one pass: {', '.join(PASS_NAMES)}"),
    json_out: bool = typer.Option(False, "--json", help="print one JSON object on stdout"),
    target: Optional[str] = typer.Option(None, "--target", help="GPU profile from hw/ (overrides TARGET_GPU)"),
    num_gpu: Optional[int] = typer.Option(None, "--num-gpu", min=1, help="GPUs to plan for (overrides NUM_GPU)"),
    const: list[str] = typer.Option([], "--const", metavar="NAME=VALUE", help="override the file-level constant "
                                    "NAME (repeat per constant), e.g. --const L=2 for a small configuration"),
    lib: bool = typer.Option(False, "--lib", help="a library file: no `main` required (with --check)"),
    entry: str = typer.Option("main", "--entry", help="the entry function; another than `main` takes the "
                              "engine's inputs as its parameters"),
    tune: str = typer.Option("cache", "--tune", help="kernel tuning: measure | cache | predict | strict"),
    kernels: bool = typer.Option(True, "--kernels/--no-kernels", help="build GPU kernels for the target "
                                 "(--no-kernels: a CPU-only engine)"),
    dim: list[str] = typer.Option([], "--dim", help="NAME=SIZE: tune kernels for this size of a symbolic dim "
                                  "(default 1024); the engine runs at any size"),
    jobs: Optional[int] = typer.Option(None, "--jobs", min=1, help="processes compiling kernels (default: one per CPU)"),
    quiet: bool = typer.Option(False, "--quiet", help="no progress bar or tuning summary"),
    progress: str = typer.Option("auto", "--progress", help="tuning progress on stderr: auto (a bar on a "
                                 "terminal), bar, json (one event per line, for CI logs) or none"),
    version: bool = version_option("xgc"),
    kernels_from: list[Path] = typer.Option([], "--kernels-from", metavar="RESULT",
                                            help="link kernels from these `xgbuild tune-shard` results "
                                                 "instead of tuning and compiling (repeat per shard)"),
    sharding: Optional[Path] = typer.Option(None, "--sharding", help="a sharding plan (TOML): regions, functions "
                                            "and inputs -> data / tensor / replicated (docs/sharding.md)"),
    sign_key: Optional[Path] = typer.Option(None, "--sign-key", metavar="KEY", help="sign the engine with this "
                                            "Ed25519 private key (xgbuild keygen); adds its provenance statement"),
    provenance: bool = typer.Option(False, "--provenance", help="add an unsigned provenance statement "
                                    "(--sign-key adds a signed one)"),
) -> None:
    """Check FILE, print one of its stages, or build its engine."""
    if dump_after is not None and dump_after not in PASS_NAMES:
        fail(f"unknown pass {dump_after!r} for --dump-after; passes: {', '.join(PASS_NAMES)}", EXIT_USAGE)
    if not (check or out or emit or dump_after):
        fail("nothing to do: pass --check, --out FILE.xge, --emit STAGE or --dump-after PASS", EXIT_USAGE)
    if out is not None and out.suffix != ".xge":
        fail(f"--out names an engine file ending in .xge, got {str(out)!r}", EXIT_USAGE)
    policy = policy_or_exit(tune, "{} or {}")
    settings = settings_or_exit()        # read once here; the hw directory and the cache go down from it
    target_or_exit(target, settings.hw_dir)
    consts = parse_consts(const)
    if sign_key is not None or provenance:
        if out is None:
            fail("--sign-key and --provenance apply to the engine --out writes", EXIT_USAGE)
        if file.suffix.lower() == ".onnx":
            fail("--sign-key and --provenance apply to .xg sources; sign an ONNX model's engine with "
                 "`xgbuild sign`", EXIT_USAGE)
    if sign_key is not None:
        from ..packager.signing import load_private_key
        try:
            load_private_key(sign_key)        # a bad key is refused before a minute of building
        except XGError as exc:
            fail(str(exc), EXIT_USAGE)
    if file.suffix.lower() == ".onnx":
        if kernels_from or sharding is not None or entry != "main" or consts:
            fail("--kernels-from, --sharding, --entry and --const apply to .xg sources, not ONNX models", EXIT_USAGE)
        from .xgc_onnx import compile_onnx
        compile_onnx(file, check=check, out=out, emit=emit.value if emit else None, dump_after=dump_after,
                     json_out=json_out, target=target, num_gpu=num_gpu, tune=policy, kernels=kernels, dims=dim,
                     jobs=jobs, quiet=quiet, settings=settings)
        return
    if not entry.isidentifier():
        fail(f"--entry names a function, got {entry!r}", EXIT_USAGE)
    options = CheckOptions(target=target, num_gpu=num_gpu, lib=lib, entry=entry, hw_dir=settings.hw_dir,
                           consts=consts)
    plan = None
    if sharding is not None:
        from ..build.compile import sharding_plan
        try:
            plan, options = sharding_plan(sharding, options)
        except CompileError as exc:
            _report(exc, json_out)
    if check or (lib and not out):
        result = check_file(file, options)
        if plan is not None and result.ok and result.program is not None:
            from ..compiler.frontend.shard_plan import check_plan
            try:
                check_plan(plan, result.program, result.program.num_gpu)
            except CompileError as exc:
                _report(exc, json_out)
        if json_out:
            emit_json(result.to_json())
        elif result.diagnostics:
            write_diagnostics(result.render())
        raise typer.Exit(exit_code_for(result.diagnostics))
    # Imported here, not at the top: `--check` stays free of the engine and torch imports.
    from ..build.compile import ir_opt_text
    from ..compiler.driver import compile_file
    from ..compiler.frontend.ast_dump import dump as dump_ast
    from ..compiler.ir.serialize import program_text, to_dot, to_json, to_text
    from ..build.context import early_start
    # A measured build's GPUs and compile pool start now, overlapping the front end; what the link
    # step does not take is closed when the command ends, however it ends.
    building = bool(out is not None and kernels and not kernels_from and dump_after is None)
    with early_start(policy, target, settings, kernels=building, workers=jobs) as early:
        try:
            compiled = compile_file(file, options, stop_after=dump_after, plan=plan)
        except CompileError as exc:
            if json_out:
                emit_json({"ok": False, "diagnostics": [d.to_json() for d in exc.diagnostics]})
            else:
                write_diagnostics(str(exc))
            raise typer.Exit(exit_code_for(exc.diagnostics) or EXIT_PROGRAM)
        warnings = compiled.check.diagnostics
        if warnings and not json_out:
            write_diagnostics(compiled.check.render())
        if dump_after is not None:
            # After the last pass the dump is `--emit ir-opt` (with the sharding plan, if any).
            sys.stdout.write(ir_opt_text(compiled, settings) if dump_after == PASS_NAMES[-1]
                             else to_text(compiled.optimized.main))
        elif emit is Emit.ast:
            sys.stdout.write(dump_ast(compiled.typed.module, compiled.typed.types))
        elif emit is Emit.ir:
            sys.stdout.write(program_text(compiled.lowered))
        elif emit is Emit.ir_opt:
            sys.stdout.write(ir_opt_text(compiled, settings))
        elif emit is Emit.ir_json:
            sys.stdout.write(json.dumps(to_json(compiled.optimized.main), sort_keys=True, indent=1,
                                        allow_nan=False) + "\n")
        elif emit is Emit.dot:
            sys.stdout.write(to_dot(compiled.optimized.main))
        if out is not None:
            from ..build.engines import link_engine
            from .common import parse_dims, progress_or_exit
            dims = parse_dims(dim)
            if kernels_from and not kernels:
                fail("--kernels-from links GPU kernels; it cannot be combined with --no-kernels", EXIT_USAGE)
            try:
                built = link_engine(compiled, settings, policy=policy, dims=dims, kernels=kernels,
                                    kernels_from=list(kernels_from), workers=jobs,
                                    progress=progress_or_exit(progress, quiet, json_out), early=early)
                envelope = None
                if sign_key is not None or provenance:
                    from ..build.provenance import build_envelope
                    parameters = {"source": file.name, "target": compiled.target, "num_gpu": compiled.num_gpu,
                                  "entry": entry, "dims": dims, "tune": policy.value, "kernels": kernels,
                                  "consts": dict(consts) or None,
                                  "sharding": compiled.plan.name if compiled.plan is not None else None,
                                  "kernels_from": bool(kernels_from)}
                    envelope = build_envelope(built.engine.file, name=out.name, parameters=parameters,
                                              settings=settings, origins=built.origins, key_path=sign_key)
                digest = built.engine.save(out, envelope)
            except XGError as exc:
                fail(str(exc))
            stats = built.stats
            if json_out:
                emit_json({"ok": True, "engine": str(out), "digest": digest, "kernels": stats,
                           "diagnostics": [d.to_json() for d in warnings]})
            else:
                if stats and not quiet:
                    sys.stderr.write(f"kernels: {stats['jobs']} tuning jobs ({stats['measured']} measured, "
                                     f"{stats['cache']} from cache, {stats['predicted']} predicted), "
                                     f"{stats['launches']} launches; {stats['compiled']} compiled, "
                                     f"{stats['compile_cache_hits']} cubins from cache; {stats['seconds']:.2f} s\n")
                    if stats.get("search"):
                        found = stats["search"]
                        sys.stderr.write(f"search: {found['candidates']} candidates, {found['compiled']} compiled, "
                                         f"{found['measured']} measured, {found['pruned']} pruned by the "
                                         f"model's bound, "
                                         f"{found['seeded']} jobs seeded by a neighbouring shape\n")
                sys.stderr.write(f"wrote {out} ({digest[:12]}, target {compiled.target}, num_gpu {compiled.num_gpu})\n")


def _report(exc: CompileError, json_out: bool) -> NoReturn:
    """A plan-file error: rendered on stderr, or as the JSON object `--json` promises."""
    if json_out:
        emit_json({"ok": False, "diagnostics": [d.to_json() for d in exc.diagnostics]})
    else:
        write_diagnostics(str(exc))
    raise typer.Exit(EXIT_PROGRAM)


def main() -> None:
    run(app, "xgc")


if __name__ == "__main__":
    main()
