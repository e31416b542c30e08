"""Several steps of a training engine: each step's state outputs are the next step's inputs.

A training engine states what it feeds back (frontend/state.py; the manifest's `entry.state`,
output leaf -> input, and `entry.counters`): after a step, every paired input takes its output
tensor as it is, on the device the step ran on (no copy, no trip through the host), and every
counter advances by 1 with a device add. The other inputs (tokens, learning rate) are the same
every step. A step's other scalar outputs (the loss) stay on the device until the last step, so
the steps queue without a sync between them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

import torch

from ..errors import EngineError, InputError


@dataclass(frozen=True)
class Feedback:
    pairs: tuple[tuple[str, str], ...]     # (input, the output that is its next value)
    counters: tuple[str, ...]              # inputs that advance by 1 a step

    @property
    def state_outputs(self) -> frozenset[str]:
        return frozenset(out for _, out in self.pairs)


def feedback_of(manifest: dict, where: str = "engine") -> Feedback:
    """The engine's feedback; an EngineError when it has none (an inference engine, one built
    before `extern state`). The pairs were checked when the engine was loaded (`check_manifest`'s
    `state_problem`: each an input and an output leaf of one dtype and shape)."""
    entry = manifest["entry"]
    pairs = tuple((p["input"], p["output"]) for p in entry.get("state", []))
    if not pairs:
        raise EngineError(f"{where} has no training state to feed back (no `extern state` inputs paired with "
                          "outputs): --steps runs training engines; run an inference engine without it")
    return Feedback(pairs, tuple(entry.get("counters", [])))


@dataclass
class StepsResult:
    scalars: list[dict[str, float]]       # per step: each scalar output that is not state (the loss)
    last: Any                             # the last step's RunResult
    next_inputs: dict[str, torch.Tensor]  # the inputs a next step would take: state, counters advanced


def run_steps(engine: Any, values: Mapping[str, torch.Tensor], steps: int, *, device: str, check: bool,
              feedback: Feedback, on_step: Callable[[int], None] | None = None) -> StepsResult:
    """Run `engine` `steps` times from `values` (on `device` already), feeding back as `feedback`
    says. `on_step(k)` is called after step k is queued (a progress bar). The losses are read once,
    after the last step; check mode's verdicts (`check`) are read as the steps finish, without a
    sync a step (`verdicts.py`): a step that made a NaN raises at a later step or at the end."""
    if steps < 1:
        raise InputError(f"steps must be at least 1, got {steps}")
    current = dict(values)
    queued: list[dict[str, torch.Tensor]] = []
    result = None
    for k in range(1, steps + 1):
        result = engine.run(current, device=device, check=check, wait=False)   # queued; its check is read later
        out = result.tensors
        queued.append({name: t for name, t in out.items()
                       if name not in feedback.state_outputs and t.dim() == 0 and t.dtype.is_floating_point})
        for name, o in feedback.pairs:
            current[name] = out[o]          # the output tensor itself: it stays where the step left it
        for name in feedback.counters:
            current[name] = current[name] + 1
        if on_step is not None:
            on_step(k)
    if device == "cuda" and hasattr(engine, "synchronize"):
        engine.synchronize()                # every step's check, read asynchronously while they ran
    # One read of every step's scalars at the end, not a sync a step.
    names = list(queued[0])
    flat = torch.stack([s[n].float() for s in queued for n in names]).tolist() if names else []
    scalars = [dict(zip(names, flat[i * len(names):(i + 1) * len(names)])) for i in range(steps)]
    return StepsResult(scalars, result, current)

