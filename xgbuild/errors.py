"""XG's exception types: every failure a user can cause is one of these, with a clear message.

The CLI turns them into `error: ...` and exit code 1; the `xg` API raises them as they are.
"""


class XGError(Exception):
    """Base class of every error XG reports to users."""


class CompileError(XGError):
    """The program has errors; `diagnostics` holds them and `str()` is their rendering."""

    def __init__(self, rendered: str, diagnostics: list) -> None:
        super().__init__(rendered)
        self.diagnostics = diagnostics


class EngineError(XGError):
    """An engine file is missing, corrupt, from a newer format, or not an engine."""


class InputError(XGError):
    """Engine inputs do not match the engine's signature (missing, extra, dtype, shape, device)."""


class ExecutionError(XGError):
    """Running an engine failed: a check found NaN/Inf, a run-time index was out of bounds, …"""


def user_stacklevel() -> int:
    """The `stacklevel` that makes `warnings.warn(..., stacklevel=user_stacklevel())` name the first
    frame outside XG's own packages (`xg`, `xgbuild`): the user's line that called into XG."""
    import os
    import sys
    here = os.path.dirname(os.path.abspath(__file__))
    roots = (here + os.sep, os.path.join(os.path.dirname(here), "xg") + os.sep)
    frame, level = sys._getframe(1), 1          # level 1: the line calling warnings.warn
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(roots):
        frame, level = frame.f_back, level + 1
    return level
