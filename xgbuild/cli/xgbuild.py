"""`xgbuild`: XG's toolbox: `explain` diagnostic codes, `inspect` engines, the `cache`, and `tune` (with
its build-system steps `jobs` and `tune-shard`); `keygen`, `sign` and `verify` (signing.py)."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path
from typing import Optional

import typer

from ..compiler.frontend.diagnostics import explain as explain_code
from . import sign_cmd, tune_cmd
from .common import BUILD_MODULES, fail, make_app, run
from .version import version_option

app = make_app("XG build tools: explain diagnostics, inspect engines, tune kernels, manage the artifact cache.")
try:
    from . import cache_cmd
    app.add_typer(cache_cmd.app, name="cache")
except ModuleNotFoundError as missing:      # a runtime-only install (`xg[runtime]`): no SQLite index
    if (missing.name or "").split(".")[0] not in BUILD_MODULES:
        raise
    _missing = missing.name

    @app.command("cache", context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
                 help="The artifact cache (needs XG's build tools: pip install 'xg[build]').")
    def cache_unavailable() -> None:
        fail(f"xgbuild cache needs `{_missing}`, one of XG's build tools, which this install lacks: "
             "pip install 'xg[build]'")
tune_cmd.register(app)
sign_cmd.register(app)


@app.callback()
def toolbox(version: bool = version_option("xgbuild")) -> None:
    # The group's own options (`--version`); the help text is make_app's.
    pass


@app.command()
def explain(code: str = typer.Argument(..., help="a diagnostic code such as XG0100")) -> None:
    """Print the long explanation of a diagnostic code."""
    text = explain_code(code.strip())
    if text is None:
        fail(f"unknown diagnostic code {code!r}; codes look like XG0100", 2)
    sys.stdout.write(text)


SHOWN_OUTPUTS = 12     # output leaves `inspect` lists; a model returning caches has hundreds


@app.command()
def inspect(
    engine: Path = typer.Argument(..., metavar="ENGINE", help="an .xge engine file", show_default=False),
    json_out: bool = typer.Option(False, "--json", help="print the manifest (and digest) as JSON"),
    trusted_keys: Optional[Path] = typer.Option(None, "--trusted-keys", metavar="DIR",
                                                help="check signatures against these .pub keys "
                                                     "(default: XG_TRUSTED_KEYS)"),
) -> None:
    """Print an engine's manifest: target, signature, training state, kernels, whether it is
    deterministic, toolchain, sources; its signatures and provenance."""
    from ..errors import XGError
    from ..runtime.engine import Engine
    from ..runtime.summary import output_leaves
    from .common import emit_json

    try:
        eng = Engine.load(engine, allow_fallback=True)     # shown, never run (its calls are still checked)
    except XGError as exc:
        fail(str(exc))
    from ..runtime.determinism import determinism
    m = eng.manifest
    signatures = sign_cmd.signature_report(eng, engine, trusted_keys)
    verdict = determinism(m, eng.graph, eng.file.entries)
    if json_out:
        extra = {"determinism": verdict.to_json()}
        if eng.file.envelope is not None:
            extra |= {"signatures": signatures, "provenance": eng.file.envelope.statement()}
        emit_json({"digest": eng.digest, **m, **extra})
        return
    out = sys.stdout
    out.write(f"engine      {engine}\ndigest      {eng.digest}\nformat      {m['format_version']}\n")
    out.write(f"target      {m['target']} ({m['target_profile']['arch']}), num_gpu {m['num_gpu']}\n")
    out.write("toolchain   " + ", ".join(f"{k} {v}" for k, v in sorted(m["toolchain"].items())) + "\n")
    if m.get("consts"):
        out.write("consts      " + " ".join(f"{k}={v}" for k, v in sorted(m["consts"].items())) + "   (--const)\n")
    out.write("inputs\n")
    for spec in m["entry"]["inputs"]:
        out.write(f"  {spec['name']:<12} {spec['dtype']:<9} {spec['shape']}\n")
    leaves = output_leaves(m["entry"]["output"])
    out.write(f"outputs     {len(leaves)}" + (" (a Result)" if "result" in m["entry"]["output"] else "") + "\n")
    for name, dtype, shape in leaves[:SHOWN_OUTPUTS]:
        out.write(f"  {name:<12} {dtype:<9} {shape}\n")
    if len(leaves) > SHOWN_OUTPUTS:
        out.write(f"  … {len(leaves) - SHOWN_OUTPUTS} more (--json lists them all)\n")
    state = m["entry"].get("state", [])
    if state:
        counters = m["entry"].get("counters", [])
        out.write(f"state       {len(state)} outputs feed inputs at the next step (xgrun --steps): "
                  + ", ".join(f"{p['output']} -> {p['input']}" for p in state[:4])
                  + (f", … {len(state) - 4} more" if len(state) > 4 else "")
                  + (f"; counters {', '.join(counters)}" if counters else "") + "\n")
    # The passes wrapped under the label, so that no line runs past a terminal's width.
    passes = textwrap.wrap(", ".join(m["program"]["passes"]), 100)
    out.write(f"program     {len(eng.graph.nodes)} nodes after the passes {passes[0] if passes else '(none)'}\n")
    for line in passes[1:]:
        out.write(f"            {line}\n")
    out.write(f"kernels     {len(m['kernels'])} ({len(m.get('launches', []))} launches)\n")
    out.write(f"determinism {verdict.line()}\n")
    for k in m["kernels"]:
        t = k["tuning"]
        archs = ",".join(sorted({f"sm_{v['arch']}" for v in k["variants"]}))
        how = t["source"] + (f" on {t['measured_on']}" if t.get("measured_on") else "")
        cfg = " ".join(f"{a}={b}" for a, b in sorted(t["config"].items()))
        shape = " ".join(f"{a}={b}" for a, b in sorted(t.get("shape", {}).items()) if not a.startswith("d"))
        out.write(f"  {k['name']:<32} {archs:<7} {how:<10} {t['ms']:.4f} ms  {cfg}  [{shape}] key {t['key']}\n")
    from ..compiler.ir.graph import Op
    eager = [f"%{n.id} {n.attr('call')}" for n in eng.graph.nodes if n.op is Op.EXTERN]
    if eager:
        out.write(f"eager ops   {len(eager)} (fallback='eager', called through torch.ops): {', '.join(eager)}\n")
    for shard in m["sharding"]:
        out.write(f"shard       {shard['name']} dim={shard['dim']}\n")
    if m.get("sharding_plan"):
        from ..compiler.passes.shard import plan_lines
        fp = m["sharding_plan"]["footprint"]
        out.write("plan        " + "\n            ".join(plan_lines(m["sharding_plan"])) + "\n")
        gpus = m["sharding_plan"].get("pipeline", {}).get("gpus")
        for k, one in enumerate(fp.get("per_stage", [fp])):
            who = ("per GPU     " if "per_stage" not in fp else f"GPU {gpus[k][0] if gpus else k}     "
                   if not gpus or len(gpus[k]) == 1 else f"stage {k}: each of GPUs {gpus[k]}, ")
            out.write(f"{who}inputs {one['inputs']} B, intermediates at the peak {one['activations']} B "
                      "(symbolic sizes not counted)\n")
    for src in m["sources"]:
        out.write(f"source      {src['path']} {src['sha256'][:16]}\n")
    sign_cmd.write_signatures(out, eng, signatures)


def main() -> None:
    run(app, "xgbuild")


if __name__ == "__main__":
    main()
