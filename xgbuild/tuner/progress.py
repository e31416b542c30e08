"""The tuning progress display: jobs done of total, cache hits, each running job's best so far and
candidates left, time left; or the same as JSON events, one per line, for CI logs.

Owns `TuneProgress`, a context manager that a tuning run reports to: `start_job` when a GPU takes
a job, `event("candidate", ...)` after each measured candidate, `advance` when a job has its
winner. It draws a rich display on stderr only when enabled and stderr is a terminal (no escape
codes in logs or pipes); with `json_stream` it writes every event as one JSON object per line
instead (`xgc --json`, `xgbuild tune --json`). It counts either way, so a caller can print a
summary from the counters.
"""

from __future__ import annotations

import json
import math
import sys
import threading
import time
from types import TracebackType
from typing import Any, TextIO

from rich.console import Console
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn,
                           TimeElapsedColumn, TimeRemainingColumn)

SOURCES = ("measured", "cache", "predicted")


class TuneProgress:
    """Progress of `total` tuning jobs; `advance` once per finished job."""

    def __init__(self, total: int, enabled: bool = True, console: Console | None = None,
                 json_stream: TextIO | None = None) -> None:
        if total < 0:
            raise ValueError(f"total must be >= 0, got {total}")
        self.total = total
        self.done = 0
        self.hits = 0        # jobs answered from the tuning cache
        self.measured = 0    # jobs timed on the GPU
        self.predicted = 0   # jobs settled by the cost model alone
        self.candidates = {"measured": 0, "compiled": 0, "pruned": 0}   # over the measured jobs
        self.console = console if console is not None else Console(stderr=True)
        self.json = json_stream
        self.visible = enabled and json_stream is None and self.console.is_terminal
        self._bar: Progress | None = None
        self._task: TaskID | None = None
        self._jobs: dict[str, TaskID] = {}
        self._lock = threading.Lock()       # one GPU thread per job reports at once
        self._t0 = time.monotonic()
        self.tune_s = 0.0    # seconds the jobs took, once done (set by `link.tune_jobs`)

    @classmethod
    def of(cls, total: int, progress: "bool | str | TuneProgress") -> "TuneProgress":
        """What a build's `progress` argument asks for: this one (a `TuneProgress`), a bar (True,
        drawn on a terminal), JSON events on stderr ("json") or nothing (False)."""
        if isinstance(progress, TuneProgress):
            return progress
        if progress == "json":
            return cls(total, json_stream=sys.stderr)
        return cls(total, enabled=bool(progress))

    def __enter__(self) -> TuneProgress:
        self._t0 = time.monotonic()
        if self.visible:
            self._bar = Progress(TextColumn("{task.description}", markup=False), BarColumn(),
                                 MofNCompleteColumn(), TextColumn("{task.fields[status]}", markup=False),
                                 TimeElapsedColumn(), TimeRemainingColumn(),
                                 console=self.console, transient=False)
            self._bar.start()
            self._task = self._bar.add_task("tuning", total=self.total, status=self._status(None))
        self._emit("start", jobs=self.total)
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self._emit("end", jobs=self.total, done=self.done, cached=self.hits, measured=self.measured,
                   predicted=self.predicted, **{f"candidates_{k}": v for k, v in self.candidates.items()},
                   ok=error is None)
        if self._bar is not None:
            self._bar.stop()
            self._bar = None

    def _emit(self, kind: str, **fields: Any) -> None:
        if self.json is None:
            return
        record = {"event": kind, "t": round(time.monotonic() - self._t0, 3)}
        record.update({k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in fields.items()})
        with self._lock:
            self.json.write(json.dumps(record) + "\n")
            self.json.flush()

    def start_job(self, job: str, candidates: int) -> None:
        """A GPU took `job` (`candidates` configs in its search space; 0: not measured)."""
        self._emit("job", job=job, candidates=candidates)
        if self._bar is not None and candidates:
            with self._lock:
                self._jobs[job] = self._bar.add_task(f"  {job[:48]}", total=candidates,
                                                     status="compiling the first candidates")

    def event(self, kind: str, **fields: Any) -> None:
        """A candidate measured (`kind` "candidate": job, config, ms, best_ms, left)."""
        self._emit(kind, **fields)
        if kind != "candidate" or self._bar is None:
            return
        with self._lock:
            task = self._jobs.get(fields.get("job", ""))
            if task is not None:
                best = fields.get("best_ms")
                left = fields.get("left", 0)
                self._bar.update(task, advance=1, status=(f"best {best:.4f} ms" if best is not None else "no valid "
                                                          "config yet") + f", {left} candidate(s) left")

    def advance(self, job: str, source: str, best_ms: float | None, search: dict | None = None) -> None:
        """Count one finished job: where its result came from, its best time (None if none) and,
        for a measured one, how it searched (`Winner.search`)."""
        if source not in SOURCES:
            raise ValueError(f"unknown result source {source!r}; expected one of "
                             f"{', '.join(SOURCES)}")
        self.done += 1
        if source == "cache":
            self.hits += 1
        elif source == "measured":
            self.measured += 1
            for k in self.candidates:
                self.candidates[k] += int((search or {}).get(k, 0))
        else:
            self.predicted += 1
        self._emit("done", job=job, source=source, ms=best_ms, **({"search": search} if search else {}))
        if self._bar is not None and self._task is not None:
            with self._lock:
                task = self._jobs.pop(job, None)
                if task is not None:
                    self._bar.remove_task(task)
                self._bar.update(self._task, advance=1, status=self._status((job, source, best_ms)))

    def _status(self, last: tuple[str, str, float | None] | None) -> str:
        text = f"{self.hits} cached"
        if self.measured:
            c = self.candidates
            text += f", {self.measured} measured ({c['measured']} candidates timed, {c['pruned']} pruned)"
        if last is not None:
            job, source, best_ms = last
            best = "no config" if best_ms is None else f"{best_ms:.4f} ms"
            text += f" | {job}: {best} ({source})"
        return text
