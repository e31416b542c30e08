"""Compile workers as plain subprocesses (`python -m xgbuild.tuner.workers`), not multiprocessing.

multiprocessing's spawn start method re-runs the caller's `__main__` in every worker, so a script
that calls `xg.compile(...)` at top level (as PyTorch users write `torch.compile(...)`) would crash
its workers. These workers import only XG: each reads a length-prefixed pickle `(function, args)`
from stdin and writes back `("ok", result)` or `("err", exception)`. A worker that dies fails the
job it held with its exit code and the tail of its stderr, and is replaced for the next job.

While it runs a call, a worker may `ask` its caller a question (`("ask", question)` on the reply
stream); `Worker.call(answer=...)` answers each on stdin before it reads on. Each side then waits
on the other only while the other owes it a message (the worker's question, the caller's answer,
the worker's reply), so neither can block writing to a pipe the other is not reading.
"""

from __future__ import annotations

import collections
import itertools
import math
import os
import pickle
import queue
import struct
import subprocess
import sys
import threading
from concurrent import futures
from pathlib import Path
from typing import Any, BinaryIO, Callable

from ..settings import child_env

_HEADER = struct.Struct("<Q")
NICE_ENV = "XG_WORKER_NICE"     # a worker raises its own niceness by this much at start
_STOP = object()


class WorkerDied(RuntimeError):
    """A compile worker process exited while it held a job."""


# In a worker process: its streams to the caller, for `ask` (set by `_main`, once).
_CALLER: dict[str, Any] = {}


def _send(stream: BinaryIO, obj: Any) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_HEADER.pack(len(data)) + data)
    stream.flush()


def _receive(stream: BinaryIO) -> Any:
    head = stream.read(_HEADER.size)
    if len(head) < _HEADER.size:
        raise EOFError
    size = _HEADER.unpack(head)[0]
    data = stream.read(size)
    if len(data) < size:
        raise EOFError
    return pickle.loads(data)


class Worker:
    def __init__(self, env_extra: dict[str, str] | None = None) -> None:
        env = {**child_env(), **(env_extra or {})}
        root = str(Path(__file__).resolve().parents[2])          # the directory holding `xgbuild`
        env["PYTHONPATH"] = os.pathsep.join([root] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        self.proc = subprocess.Popen([sys.executable, "-m", "xgbuild.tuner.workers"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        self.stderr: collections.deque[str] = collections.deque(maxlen=20)
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        assert self.proc.stderr is not None
        for line in iter(self.proc.stderr.readline, b""):
            self.stderr.append(line.decode(errors="replace").rstrip())

    def call(self, fn: Callable, args: tuple, answer: Callable[[Any], Any] | None = None) -> Any:
        """`fn(*args)` run in the worker; `answer(question)`: what its `ask`s get meanwhile (an
        exception it raises is raised by that `ask`)."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        try:
            _send(self.proc.stdin, (fn, args))
            while (message := _receive(self.proc.stdout))[0] == "ask":
                try:
                    if answer is None:
                        raise RuntimeError("this call answers no questions")
                    reply = ("ok", answer(message[1]))
                except Exception as exc:  # noqa: BLE001 (the asking side's error)
                    reply = ("err", exc)
                _send(self.proc.stdin, reply)
            status, value = message
        except (EOFError, BrokenPipeError, OSError):
            code = self.proc.wait()
            tail = "; ".join(list(self.stderr)[-3:])
            raise WorkerDied(f"a compile worker exited with code {code}" + (f": {tail}" if tail else "")) from None
        except Exception as exc:  # noqa: BLE001 (a reply that cannot be read: the stream is out of step)
            self.proc.kill()
            self.proc.wait()
            raise WorkerDied(f"a compile worker's reply could not be read ({type(exc).__name__}: {exc}); "
                             "the worker was stopped") from None
        if status == "err":
            raise value
        return value

    def close(self) -> None:
        try:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
            self.proc.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()


class SubprocessPool(futures.Executor):
    """A fixed number of worker subprocesses, started on first use, each fed by one thread. Jobs
    run lowest `priority` first (`submit_at`), in submission order within a priority. `nice`: the
    workers' (and their children's, ptxas's) niceness increment: compiles yield the CPUs to the
    GPU-measuring loops, whose launches are host-bound and time-critical. `warm`: a call
    `(function, args)` that each worker started by `start` runs before its first job (what makes
    its first job as fast as its later ones; its failure is ignored)."""

    def __init__(self, workers: int, nice: int = 0, warm: tuple[Callable, tuple] | None = None) -> None:
        self.size = max(1, workers)
        self._env = {NICE_ENV: str(int(nice))} if nice else None
        self._warm = warm
        self._jobs: queue.PriorityQueue = queue.PriorityQueue()
        self._seq = itertools.count()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._closed = False
        self._live: set[Worker] = set()

    def start(self) -> None:
        """Start every worker now (their imports and `warm` overlap the caller's work) instead of on
        first use."""
        with self._lock:
            while not self._closed and len(self._threads) < self.size:
                t = threading.Thread(target=self._serve, args=(True,), daemon=True)
                t.start()
                self._threads.append(t)

    def submit(self, fn: Callable, /, *args: Any, **kwargs: Any) -> futures.Future:
        if kwargs:
            raise TypeError("SubprocessPool.submit takes positional arguments only")
        return self.submit_at(0, fn, *args)

    def submit_at(self, priority: float, fn: Callable, /, *args: Any) -> futures.Future:
        """`submit`, run before every queued job of a higher `priority` number."""
        fut: futures.Future = futures.Future()
        with self._lock:
            if self._closed:
                raise RuntimeError("cannot submit to a pool that was shut down")
            self._jobs.put((priority, next(self._seq), (fut, fn, args)))
            if len(self._threads) < self.size:
                t = threading.Thread(target=self._serve, daemon=True)
                t.start()
                self._threads.append(t)
        return fut

    def _serve(self, early: bool = False) -> None:
        worker: Worker | None = None
        try:
            if early:
                try:
                    worker = Worker(self._env)
                    self._live.add(worker)
                except OSError:
                    worker = None       # tried again, and reported, when a job comes
                if worker is not None and self._warm is not None:
                    try:
                        worker.call(*self._warm)
                    except Exception:  # noqa: BLE001 (a worker that died warming is replaced for its first job)
                        pass
            while True:
                job = self._jobs.get()[2]
                if job is _STOP:
                    return
                fut, fn, args = job
                if not fut.set_running_or_notify_cancel():
                    continue
                try:
                    if worker is None or worker.proc.poll() is not None:
                        if worker is not None:
                            worker.close()
                            self._live.discard(worker)
                        worker = Worker(self._env)
                        self._live.add(worker)
                    fut.set_result(worker.call(fn, args))
                except BaseException as exc:  # noqa: BLE001 (the job's failure belongs to its future)
                    fut.set_exception(exc)
        finally:
            if worker is not None:
                worker.close()
                self._live.discard(worker)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            self._closed = True
            if cancel_futures:
                while True:
                    try:
                        job = self._jobs.get_nowait()[2]
                    except queue.Empty:
                        break
                    if job is not _STOP:
                        job[0].cancel()
                for worker in list(self._live):     # compiles still running are not wanted either
                    if worker.proc.poll() is None:
                        worker.proc.kill()
            for _ in self._threads:
                self._jobs.put((math.inf, next(self._seq), _STOP))     # after every queued job
        if wait:
            for t in self._threads:
                t.join()


def ask(question: Any) -> Any:
    """In a worker, from the thread running its call: the caller's answer to `question` (see
    `Worker.call`); raises what the answer raised."""
    if not _CALLER:
        raise RuntimeError("`ask` is for a call running in a worker process")
    with _CALLER["lock"]:
        _send(_CALLER["out"], ("ask", question))
        status, value = _receive(_CALLER["in"])
    if status == "err":
        raise value
    return value


def _main() -> int:
    # The replies get a descriptor of their own; descriptor 1 (what the job, its C code and its
    # child processes print to) goes to stderr, so nothing can corrupt the reply stream.
    nice = os.environ.pop(NICE_ENV, "")
    if nice.isdigit():
        try:
            os.nice(int(nice))
        except OSError:
            pass
    stdin = sys.stdin.buffer
    stdout = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    _CALLER.update({"in": stdin, "out": stdout, "lock": threading.Lock()})
    while True:
        try:
            fn, args = _receive(stdin)
        except EOFError:
            return 0
        try:
            reply = ("ok", fn(*args))
        except BaseException as exc:  # noqa: BLE001 (sent back to the caller's future)
            reply = ("err", exc)
        try:
            _send(stdout, reply)
        except (pickle.PicklingError, TypeError, AttributeError):
            _send(stdout, ("err", RuntimeError(f"{type(reply[1]).__name__}: {reply[1]}")))


if __name__ == "__main__":
    # Run as `xgbuild.tuner.workers`, not `__main__`: the calls import that module, whose `ask`
    # must find the streams `_main` sets.
    from xgbuild.tuner.workers import _main as main
    sys.exit(main())
