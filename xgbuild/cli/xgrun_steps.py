"""`xgrun ENGINE --steps N`: N steps of a training engine, its state fed back on the device.

The library does the work (runtime/steps.py); this prints a row per step (the step's scalar
outputs that are not state: the loss) or one JSON object, and with `--output` writes the inputs
of the step after the last: the state's final values under their input names, the counters
advanced and the other inputs as given, so `--inputs` of that file goes on training.
"""

from __future__ import annotations

import contextlib
import sys
import time
from pathlib import Path
from typing import Iterator

from ..errors import XGError
from ..runtime.host_io import TensorIOError
from .common import emit_json, fail


def run_steps_cmd(engine: Path, eng, values: dict, steps: int, device: str, check: bool, output: Path | None,
                  json_out: bool, load_ms: float) -> None:
    """Run `steps` steps of the loaded engine `eng` from `values` (host tensors) and report them."""
    from ..runtime.steps import feedback_of, run_steps
    from ..runtime.tensor_io import describe, save_tensors
    try:
        feedback = feedback_of(eng.manifest, f"engine {engine}")
        if device == "cuda":
            eng.cuda_executor(check=check)       # a clear refusal before any tensor moves
            values = {k: v.to("cuda") for k, v in values.items()}
        t0 = time.perf_counter()
        with _progress(steps) as tick:
            done = run_steps(eng, values, steps, device=device, check=check, feedback=feedback, on_step=tick)
        run_ms = (time.perf_counter() - t0) * 1e3
    except (XGError, TensorIOError) as exc:
        fail(str(exc))
    final = {name: t.cpu() for name, t in done.next_inputs.items()}     # once, after the last step
    if output is not None:
        try:
            save_tensors(output, final)
        except TensorIOError as exc:
            fail(str(exc))
    state = {name: describe(final[name]) for name, _ in feedback.pairs}
    summary = {"engine": str(engine), "digest": eng.digest, "target": eng.manifest["target"], "device": device,
               "check": check, "load_ms": load_ms, "run_ms": run_ms, "steps": steps,
               "per_step": [{"step": k, **row} for k, row in enumerate(done.scalars, 1)],
               "state": state, "counters": {n: final[n].item() for n in feedback.counters},
               **({"output": str(output)} if output is not None else {})}
    if json_out:
        emit_json(summary)
        return
    out = sys.stdout
    out.write(f"engine {engine} ({eng.digest[:12]}), target {summary['target']}, device {device}, "
              f"check {'on' if check else 'off'}, {steps} steps ({len(feedback.pairs)} state tensors fed back"
              + (f", counter {', '.join(feedback.counters)}" if feedback.counters else "") + ")\n")
    names = list(done.scalars[0])
    out.write("  step " + "".join(f"{n:>14}" for n in names) + "\n")
    for k, row in enumerate(done.scalars, 1):
        out.write(f"  {k:>4} " + "".join(f"{row[n]:>14.6f}" for n in names) + "\n")
    if output is not None:
        out.write(f"final state: {output} (the next step's inputs)\n")
    out.write(f"load {load_ms:.1f} ms, {steps} steps {run_ms:.1f} ms\n")


@contextlib.contextmanager
def _progress(steps: int) -> Iterator:
    """A transient rich progress bar on stderr when it is a terminal; None otherwise."""
    if not sys.stderr.isatty():
        yield None
        return
    from rich.console import Console
    from rich.progress import Progress

    with Progress(console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("steps", total=steps)
        yield lambda k: bar.update(task, completed=k)
