"""`xgrun --nproc N`'s launcher: start N ranks on this host and watch them until all finish.

Each rank is a child process running `python -m xgbuild.cli.xgrun_rank` with the same options with RANK / WORLD_SIZE / LOCAL_RANK /
MASTER_ADDR / MASTER_PORT set (what torchrun sets, so the ranks take the same path as under an
outside launcher) and a heartbeat pipe. The run fails as a whole, naming the rank, when a rank
exits non-zero, is killed by a signal, or sends no heartbeat for `timeout_s` (hung, stopped);
then every other rank is terminated (and killed if it does not stop), so nothing is left behind.
"""

from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, replace
from typing import Mapping

POLL_S = 0.2
HEARTBEAT_S = 0.5
STALE_S = 2.0          # a peer this quiet when another rank fails is named as the likely cause


@dataclass(frozen=True)
class LaunchResult:
    ok: bool
    message: str            # empty when ok
    exit_code: int
    rank: int | None = None  # the rank that ended the run


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(argv: list[str], nproc: int, timeout_s: float, env: Mapping[str, str]) -> LaunchResult:
    """Run `argv` as `nproc` ranks. Rank 0's stdout is this process's; every rank's stderr is
    passed through once the run ends (prefixed with its rank when there is more than one)."""
    port = free_port()
    procs: list[subprocess.Popen] = []
    beats: dict[int, int] = {}                 # read end of a rank's heartbeat pipe -> rank
    errs = [tempfile.TemporaryFile() for _ in range(nproc)]
    last = [time.monotonic()] * nproc
    try:
        for rank in range(nproc):
            rfd, wfd = os.pipe()
            child_env = {**env, "RANK": str(rank), "WORLD_SIZE": str(nproc), "LOCAL_RANK": str(rank),
                         "LOCAL_WORLD_SIZE": str(nproc), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                         "XG_HEARTBEAT_FD": str(wfd)}
            procs.append(subprocess.Popen(argv, env=child_env, pass_fds=(wfd,), stdin=subprocess.DEVNULL,
                                          stdout=None if rank == 0 else subprocess.DEVNULL, stderr=errs[rank]))
            os.close(wfd)
            beats[rfd] = rank
        result = _watch(procs, beats, last, timeout_s)
    finally:
        _stop(procs)
        for fd in beats:
            os.close(fd)
    last_errors = _pass_stderr(errs, nproc)
    if result.rank is not None and result.rank in last_errors:
        detail = last_errors[result.rank].removeprefix(f"rank {result.rank}: ")
        result = replace(result, message=f"{result.message}: {detail}")
    return result


def _watch(procs: list[subprocess.Popen], beats: dict[int, int], last: list[float], timeout_s: float) -> LaunchResult:
    open_fds = set(beats)
    while True:
        ready, _, _ = select.select(list(open_fds), [], [], POLL_S) if open_fds else ([], [], time.sleep(POLL_S))
        now = time.monotonic()
        for fd in ready:
            if os.read(fd, 4096):
                last[beats[fd]] = now
            else:
                open_fds.discard(fd)        # the rank closed it: it is ending
        codes = [p.poll() for p in procs]
        failed = [r for r, c in enumerate(codes) if c not in (None, 0)]
        if failed:
            # A killed rank is the cause of its peers' failures; else a silent one; else the first.
            killed = [r for r in failed if codes[r] < 0]
            stale = [r for r, c in enumerate(codes) if c is None and now - last[r] > STALE_S]
            rank = (killed or stale or failed)[0]
            return LaunchResult(False, _describe(rank, codes[rank], timeout_s if rank in stale else None), 1, rank)
        if all(c == 0 for c in codes):
            return LaunchResult(True, "", 0)
        for r, c in enumerate(codes):
            if c is None and now - last[r] > timeout_s:
                return LaunchResult(False, f"rank {r} stopped responding: no heartbeat for {timeout_s:g} s "
                                           "(hung or stopped); ended the run on every rank", 1, r)


def _describe(rank: int, code: int | None, stale: float | None) -> str:
    if stale is not None:
        return f"rank {rank} stopped responding (hung or stopped) and its peers failed waiting for it; ended the run"
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"rank {rank} was killed by {name}; ended the run on every rank"
    return f"rank {rank} failed (exit code {code}); ended the run on every rank"


def _stop(procs: list[subprocess.Popen]) -> None:
    """Terminate every rank still running, then kill any that do not stop within a few seconds."""
    for p in procs:
        if p.poll() is None:
            try:
                p.send_signal(signal.SIGCONT)   # a stopped process cannot act on SIGTERM
                p.terminate()
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + 3.0
    for p in procs:
        try:
            p.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _pass_stderr(errs: list, nproc: int) -> dict[int, str]:
    """Each rank's stderr, passed on; returns each rank's last `error:` line (without the prefix)."""
    last: dict[int, str] = {}
    for rank, f in enumerate(errs):
        f.seek(0)
        text = f.read().decode(errors="replace")
        f.close()
        for line in text.splitlines():
            if _noise(line):
                continue
            if line.startswith("error: "):
                last[rank] = line[len("error: "):]
                continue        # said once, in the launcher's own message
            sys.stderr.write((f"[rank {rank}] " if nproc > 1 else "") + line + "\n")
    return last


def _noise(line: str) -> bool:
    # torch.distributed's own warnings say nothing about the user's run.
    return "FutureWarning" in line or "warnings.warn" in line or line.strip().startswith("return func(")


def start_heartbeat(fd: int) -> None:
    """In a rank: tell the launcher every HEARTBEAT_S that this process is alive; if the launcher
    is gone (the pipe is closed), end the rank at once, so no rank outlives its launcher."""
    def beat() -> None:
        while True:
            try:
                os.write(fd, b".")
            except OSError:
                os._exit(3)
            time.sleep(HEARTBEAT_S)
    threading.Thread(target=beat, daemon=True, name="xg-heartbeat").start()


def run_ranks(engine_path: str, inputs_path: str, output_path: str, nproc: int, *, device: str = "cpu",
              check: bool = True, timeout_s: float = 300.0, env: Mapping[str, str],
              allow_fallback: bool = False) -> LaunchResult:
    """`xgrun ENGINE --inputs IN --output OUT --nproc N` as a library call (what `xg.run_engine(...,
    nproc=N)` uses): N ranks of this host, rank 0 writing the gathered outputs."""
    argv = [sys.executable, "-m", "xgbuild.cli.xgrun_rank", engine_path, "--inputs", inputs_path, "--output",
            output_path, "--device", device, "--check" if check else "--no-check", "--timeout", str(timeout_s),
            *(["--allow-fallback"] if allow_fallback else [])]
    return launch(argv, nproc, timeout_s, env)
