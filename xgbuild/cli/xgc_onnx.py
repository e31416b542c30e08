"""`xgc MODEL.onnx`: import an ONNX model, then print its IR or build its engine. Thin, like xgc.

Exit codes as xgc's: 1 for a model that uses unsupported ops, 2 for a missing, corrupt or
invalid file and for usage errors.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer

from ..errors import CompileError, XGError
from ..settings import Settings
from ..tuner.policy import Policy
from .common import EXIT_PROGRAM, EXIT_USAGE, emit_json, fail, parse_dims, write_diagnostics


def compile_onnx(file: Path, *, check: bool, out: Path | None, emit: str | None, dump_after: str | None,
                 json_out: bool, target: str | None, num_gpu: int | None, tune: Policy, kernels: bool,
                 dims: list[str], jobs: int | None, quiet: bool, settings: Settings) -> None:
    if dump_after is not None or emit == "ast":
        fail("an ONNX model has no XG source: use --emit ir, ir-opt, ir-json or dot", EXIT_USAGE)
    from ..build.engines import model_target
    from ..compiler.driver import DEFAULT_TARGET
    from ..compiler.importers.onnx_import import OnnxImportError, import_onnx
    from ..compiler.ir.serialize import to_dot, to_json, to_text
    try:
        profile = model_target(target or DEFAULT_TARGET, settings)
    except XGError as exc:
        fail(str(exc), EXIT_USAGE)
    target_name = profile.name
    sizes = parse_dims(dims)
    try:
        imported = import_onnx(file, target=target_name, num_gpu=num_gpu or 1, dims=sizes, profile=profile)
    except OnnxImportError as exc:
        _report(exc, json_out, EXIT_USAGE if exc.unreadable else EXIT_PROGRAM)
    except CompileError as exc:
        _report(exc, json_out, EXIT_PROGRAM)
    graph = imported.optimized.main
    if check:
        if json_out:
            emit_json({"ok": True, "diagnostics": [], "inputs": list(imported.inputs),
                       "weights": len(imported.weights), "nodes": len(graph.nodes)})
        return
    if emit == "ir":
        sys.stdout.write(to_text(imported.lowered.main))
    elif emit == "ir-opt":
        sys.stdout.write(to_text(graph))
    elif emit == "ir-json":
        sys.stdout.write(json.dumps(to_json(graph), sort_keys=True, indent=1, allow_nan=False) + "\n")
    elif emit == "dot":
        sys.stdout.write(to_dot(graph))
    if out is None:
        return
    from ..build.engines import model_engine
    try:
        engine = model_engine(imported, profile, settings, policy=tune, kernels=kernels, dims=sizes,
                              progress=not quiet and not json_out, workers=jobs)
        digest = engine.save(out)
    except XGError as exc:
        fail(str(exc))
    if json_out:
        emit_json({"ok": True, "engine": str(out), "digest": digest, "diagnostics": []})
    else:
        sys.stderr.write(f"wrote {out} ({digest[:12]}, target {target_name}, {len(imported.weights)} weights)\n")


def _report(exc: CompileError, json_out: bool, code: int) -> None:
    if json_out:
        emit_json({"ok": False, "diagnostics": [{"severity": "error", "message": str(exc)}]})
    else:
        write_diagnostics(str(exc))
    raise typer.Exit(code)
