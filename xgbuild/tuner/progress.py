"""The tuning progress display: jobs done of total, cache hits and the latest job's best time.

Owns `TuneProgress`, a context manager that draws a rich progress bar on stderr while a tuning
run works through its jobs. It draws only when enabled and stderr is a terminal (no escape codes
in logs or pipes), but counts either way, so a caller can print a summary from the counters.
"""

from __future__ import annotations

from types import TracebackType

from rich.console import Console
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn,
                           TimeElapsedColumn)

SOURCES = ("measured", "cache", "predicted")


class TuneProgress:
    """Progress of `total` tuning jobs; `advance` once per finished job."""

    def __init__(self, total: int, enabled: bool = True, console: Console | None = None) -> None:
        if total < 0:
            raise ValueError(f"total must be >= 0, got {total}")
        self.total = total
        self.done = 0
        self.hits = 0        # jobs answered from the tuning cache
        self.measured = 0    # jobs timed on the GPU
        self.predicted = 0   # jobs settled by the cost model alone
        self.console = console if console is not None else Console(stderr=True)
        self.visible = enabled and self.console.is_terminal
        self._bar: Progress | None = None
        self._task: TaskID | None = None

    def __enter__(self) -> TuneProgress:
        if self.visible:
            self._bar = Progress(TextColumn("tuning"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[status]}", markup=False),
                                 TimeElapsedColumn(),
                                 console=self.console, transient=False)
            self._bar.start()
            self._task = self._bar.add_task("tuning", total=self.total, status=self._status(None))
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None

    def advance(self, job: str, source: str, best_ms: float | None) -> None:
        """Count one finished job: where its result came from and its best time (None if none)."""
        if source not in SOURCES:
            raise ValueError(f"unknown result source {source!r}; expected one of "
                             f"{', '.join(SOURCES)}")
        self.done += 1
        if source == "cache":
            self.hits += 1
        elif source == "measured":
            self.measured += 1
        else:
            self.predicted += 1
        if self._bar is not None and self._task is not None:
            self._bar.update(self._task, advance=1, status=self._status((job, source, best_ms)))

    def _status(self, last: tuple[str, str, float | None] | None) -> str:
        text = f"{self.hits} cached"
        if last is not None:
            job, source, best_ms = last
            best = "no config" if best_ms is None else f"{best_ms:.4f} ms"
            text += f" | {job}: {best} ({source})"
        return text
