"""`xgrun`: run a built engine. Thin: inputs in, the library runs, a summary out.

    xgrun ENGINE [--inputs FILE] [--output FILE] [--device cpu|cuda] [--check|--no-check]
                 [--seed N] [--dim NAME=SIZE ...] [--json]

Without `--inputs`, every external gets seeded random values; symbolic dims take `--dim` sizes
(default 16). Exit codes: 0 ok, 1 a bad engine, bad inputs or a failed check, 2 usage.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import List, Optional

import typer

from ..errors import XGError
from ..runtime.engine import Engine
from ..runtime.tensor_io import TensorIOError, describe, load_tensors, random_inputs, save_tensors
from .common import EXIT_USAGE, emit_json, fail, make_app, parse_dims, run

app = make_app("Run an XG engine (.xge) with correctness checks.")
DEFAULT_DIM = 16


_dims = parse_dims


@app.command()
def main_cmd(
    engine: Path = typer.Argument(..., metavar="ENGINE", help="the .xge engine file", show_default=False),
    inputs: Optional[Path] = typer.Option(None, "--inputs", help=".npz, .safetensors or .pt with one tensor per input"),
    output: Optional[Path] = typer.Option(None, "--output", help="write the outputs to .npz, .safetensors or .pt"),
    device: str = typer.Option("cpu", "--device", help="cpu or cuda"),
    check: bool = typer.Option(True, "--check/--no-check", help="guard every output against NaN/Inf"),
    seed: int = typer.Option(0, "--seed", help="seed for random inputs (without --inputs)"),
    dim: List[str] = typer.Option([], "--dim", help="NAME=SIZE for symbolic dims of random inputs"),
    json_out: bool = typer.Option(False, "--json", help="print the summary as JSON"),
) -> None:
    """Run ENGINE and print each output's shape, dtype and checksum."""
    if device not in ("cpu", "cuda"):
        fail(f"--device takes cpu or cuda, got {device!r}", EXIT_USAGE)
    t_load = time.perf_counter()
    try:
        eng = Engine.load(engine)
        load_ms = (time.perf_counter() - t_load) * 1e3
        if inputs is not None:
            values = load_tensors(inputs)
        else:
            sizes = _dims(dim)
            sig = {}
            for spec in eng.signature:
                shape = tuple(d if isinstance(d, int) else sizes.get(d, DEFAULT_DIM) for d in spec["shape"])
                sig[spec["name"]] = (spec["dtype"], shape)
            values = random_inputs(sig, seed, {s["name"]: tuple(s["range"]) for s in eng.signature if "range" in s})
        if device == "cuda":
            eng.cuda_executor(check=check)       # a clear refusal before any tensor moves
            values = {k: v.to("cuda") for k, v in values.items()}
        result = eng.run(values, device=device, check=check)
    except (XGError, TensorIOError) as exc:
        fail(str(exc))
    outputs = {name: t.cpu() for name, t in result.tensors.items()}     # files and checksums from host memory
    if output is not None:
        try:
            save_tensors(output, outputs)
        except TensorIOError as exc:
            fail(str(exc))
    summary = {
        "engine": str(engine), "digest": eng.digest, "target": eng.manifest["target"], "device": device,
        "check": check, "load_ms": load_ms, "run_ms": result.metadata["timings"]["total_ms"],
        "outputs": {name: describe(v) for name, v in outputs.items()},
        "specialization": result.metadata["specialization"],
    }
    if json_out:
        emit_json(summary)
        return
    out = sys.stdout
    out.write(f"engine {engine} ({eng.digest[:12]}), target {summary['target']}, device {device}, "
              f"check {'on' if check else 'off'}\n")
    for name, d in summary["outputs"].items():
        out.write(f"  {name:<12} {d['dtype']:<9} {str(d['shape']):<16} checksum {d['checksum']}\n")
    out.write(f"load {load_ms:.1f} ms, run {summary['run_ms']:.1f} ms\n")


def main() -> None:
    run(app, "xgrun")


if __name__ == "__main__":
    main()
