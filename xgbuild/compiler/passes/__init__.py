"""The compiler's passes. The pipeline (`pipeline.py`: `PIPELINE`, `PASS_NAMES`, `run_pipeline`)
is loaded on first use, so that importing one pass (the deploy runtime's `specialize`) does not
import every other pass and the front end they reach."""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    if name in ("PIPELINE", "PASS_NAMES", "run_pipeline", "Pass"):
        from . import pipeline
        return getattr(pipeline, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
