"""Measured winners written to the XG cache from a thread of their own (`WinnerWriter`).

A winner's record is a SQLite write transaction, which waits whenever another process of the
build (a compile storing its cubin, a GPU's measuring process) holds the index's write lock, and,
with a remote tier, an upload. A GPU that waits for it measures nothing meanwhile: the tuner hands
the record to this writer and takes its next job. `close` (before the build links) waits until
every record is written. Each record is one transaction, so a build that dies first loses the
records not yet written (its next build measures those jobs again), never leaves a half-written
one. A record the cache refuses slows the next build, not this one: `close` warns, naming how many
and why; any other error in the writer is the build's, raised by `close`.
"""

from __future__ import annotations

import queue
import sys
import threading
from typing import Any

from ..cache.errors import CacheError
from ..errors import XGError

_STOP = object()


class WinnerWriter:
    """Stores `(key, value)` records in `cache` in the order `put` gets them, from one thread."""

    def __init__(self, cache: Any) -> None:
        self.cache = cache
        self.written = 0
        self.failed: list[str] = []                 # why each refused record was refused
        self._error: BaseException | None = None    # not a cache's refusal: raised by `close`
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="xg-winner-writer", daemon=True)
        self._thread.start()
        self._closed = False

    def put(self, key: Any, value: dict) -> None:
        """Queue a record; it is written soon after, `close` waits for it."""
        if self._closed:
            raise RuntimeError("the winner writer is closed")
        self._queue.put((key, value))

    def _run(self) -> None:
        while (item := self._queue.get()) is not _STOP:
            if self._error is not None:
                continue            # the build fails anyway: the rest is not written
            key, value = item
            try:
                self.cache.store(key, value)
                self.written += 1
            except (XGError, CacheError, OSError) as exc:
                self.failed.append(f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
            except BaseException as exc:  # noqa: BLE001 (raised on the build's thread by `close`)
                self._error = exc

    def close(self) -> None:
        """Write every queued record, stop the thread, then warn of records the cache refused
        (once) and raise an error the writer met."""
        if not self._closed:
            self._closed = True
            self._queue.put(_STOP)
            self._thread.join()
            if self.failed:
                sys.stderr.write(f"warning: {len(self.failed)} measured winner(s) could not be written to the XG "
                          f"cache ({self.failed[0]}); this build uses them, the next one measures them again\n")
        if self._error is not None:
            error, self._error = self._error, None
            raise error
