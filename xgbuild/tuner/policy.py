"""The tuning policy (`--tune`), one enum every command and API takes; kept apart from the tuner
so that parsing a command line imports neither torch nor Triton.
"""

from __future__ import annotations

from enum import StrEnum


class Policy(StrEnum):
    """Where a job's winner comes from (tuner/tuner.py's docstring says how each decides)."""
    MEASURE = "measure"
    CACHE = "cache"
    PREDICT = "predict"
    STRICT = "strict"
