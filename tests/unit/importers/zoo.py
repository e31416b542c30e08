"""Shared by the importer tests: the example models, fresh inputs, float64 eager references."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import torch

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
if str(EXAMPLES) not in sys.path:
    sys.path.insert(0, str(EXAMPLES))

from torch_models import NAMES, make  # noqa: E402

TOL = 1e-4          # the bound: float32 engines against eager, relative norm error


def fresh_inputs(name: str, batch: int = 2) -> tuple:
    """New random inputs (not the captured examples): another seed drawn from torch's own state."""
    seed = int(torch.randint(1, 2**31 - 1, ()).item())
    return make(name, batch=batch, seed=seed)[1]


def as_tuple(v) -> tuple:
    return v if isinstance(v, tuple) else (v,)


def reference(model: torch.nn.Module, inputs: tuple) -> tuple:
    """The model in float64, eager: the reference every engine output is measured against."""
    m = copy.deepcopy(model).double()
    with torch.no_grad():
        return as_tuple(m(*[x.double() if x.is_floating_point() else x for x in inputs]))


def rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    return ((y.double() - ref.double()).norm() / ref.double().norm().clamp_min(1e-30)).item()


__all__ = ["NAMES", "TOL", "as_tuple", "fresh_inputs", "make", "reference", "rel_err"]
