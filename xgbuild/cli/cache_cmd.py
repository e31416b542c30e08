"""`xgbuild cache …`: thin typer commands over `xgbuild.cache`.

Commands: put, get, ls, stats, verify, gc, explain, diff; each takes `--cache-dir`.

Exit codes: 0 success; 1 a data or program problem (missing entry, corruption found by `verify`,
disk full, an upload refused for lack of a token), and for `diff`, keys that differ; 2 a usage
problem (bad flag, malformed digest, key, size, URL or header, an ambiguous key prefix). Errors
are one line on stderr, never a traceback; an unexpected internal error says so and where its
traceback was written. Warnings (e.g. a remote that is down) go to stderr as `warning: …`, once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import json
import logging
import shutil
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Annotated, Iterator, Optional

import typer

from xgbuild.cache import gc as cache_gc
from xgbuild.cache.canonical import thaw
from xgbuild.cache.errors import AmbiguousKeyError, CacheError, InvalidDigestError, RemoteConfigError
from xgbuild.cache.forensics import Neighbours, describe, diff_lines, kernel_summary, resolve_key
from xgbuild.cache.keys import diff_keys, explain, render_value
from xgbuild.cache.tiered import ORIGINS, Cache, origin_of
from xgbuild.settings import Settings, SettingsError

app = typer.Typer(help="The content-addressed artifact cache.", no_args_is_help=True,
                  add_completion=False, pretty_exceptions_enable=False)

CacheDir = Annotated[Optional[Path], typer.Option(
    "--cache-dir", help="Cache directory (default: $XG_CACHE_DIR, else $XDG_CACHE_HOME/xg or ~/.cache/xg).",
    file_okay=False)]
Remote = Annotated[Optional[str], typer.Option(
    "--remote", help="Bazel HTTP cache URL (default: $XG_REMOTE_CACHE).")]
RemoteHeader = Annotated[Optional[str], typer.Option(
    "--remote-header", help="'Name: value' sent to the remote (default: $XG_REMOTE_CACHE_HEADER).")]
RemoteTimeout = Annotated[Optional[float], typer.Option(
    "--remote-timeout", help="Seconds per remote request (default: $XG_REMOTE_TIMEOUT or 10).")]
NoUpload = Annotated[bool, typer.Option(
    "--no-remote-upload", help="Read from the remote but never write to it (CI readers).")]
Json = Annotated[bool, typer.Option("--json", help="Machine-readable output on stdout.")]


class _Usage(Exception):
    """A problem with how the command was called (exit 2)."""


def _err(message: str) -> None:
    typer.echo(f"error: {message}", err=True)


@contextlib.contextmanager
def _errors() -> Iterator[None]:
    """Map every failure to a one-line message and an exit code."""
    try:
        yield
    except typer.Exit:
        raise
    except (_Usage, SettingsError, RemoteConfigError, InvalidDigestError, AmbiguousKeyError) as exc:
        _err(str(exc))
        raise typer.Exit(2) from None
    except CacheError as exc:
        _err(f"{exc} ({exc.help})")
        raise typer.Exit(1) from None
    except OSError as exc:
        where = f"{exc.filename}: " if exc.filename else ""
        _err(f"{where}{(exc.strerror or str(exc)).lower()}")
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        _err("interrupted")
        raise typer.Exit(130) from None
    except Exception as exc:  # noqa: BLE001 - the last line of defence against a traceback
        with tempfile.NamedTemporaryFile("w", prefix="xg-cache-crash-", suffix=".txt", delete=False) as f:
            traceback.print_exc(file=f)
        _err(f"internal error ({type(exc).__name__}: {exc}); traceback in {f.name}")
        raise typer.Exit(1) from None


class _StderrHandler(logging.Handler):
    """`warning: message` on whatever sys.stderr is at the time (test runners swap it)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            sys.stderr.write(f"{record.levelname.lower()}: {record.getMessage()}\n")
        except Exception:  # noqa: BLE001 - a warning must never break the command
            self.handleError(record)


def _setup_logging() -> None:
    logger = logging.getLogger("xgbuild.cache")
    if not any(isinstance(h, _StderrHandler) for h in logger.handlers):
        logger.addHandler(_StderrHandler())
    logger.setLevel(logging.WARNING)
    logger.propagate = False    # printed once here, not again by a root handler


def _open(cache_dir: Path | None = None, remote: str | None = None, header: str | None = None,
          timeout: float | None = None, no_upload: bool = False, use_remote: bool = True) -> Cache:
    _setup_logging()
    settings = Settings.from_env()
    changes: dict[str, object] = {}
    if cache_dir is not None:
        changes["cache_dir"] = cache_dir
    if remote is not None:
        changes["remote_cache"] = remote or None
    if header is not None:
        changes["remote_header"] = header
    if timeout is not None:
        changes["remote_timeout_s"] = timeout
    if no_upload:
        changes["remote_upload"] = False
    if not use_remote:
        changes["remote_cache"] = None
    return Cache.open(dataclasses.replace(settings, **changes))


def _print_json(value: object) -> None:
    typer.echo(json.dumps(value, indent=2, sort_keys=True))


@app.command()
def put(file: Annotated[Path, typer.Argument(help="File to store.", dir_okay=False)],
        cache_dir: CacheDir = None, remote: Remote = None, remote_header: RemoteHeader = None,
        remote_timeout: RemoteTimeout = None, no_remote_upload: NoUpload = False) -> None:
    """Store FILE's content; print its sha256 (alone) on stdout."""
    with _errors(), _open(cache_dir, remote, remote_header, remote_timeout, no_remote_upload) as cache:
        if not file.is_file():
            raise _Usage(f"{file}: no such file")
        digest = cache.put_file(file)
        typer.echo(digest)
        if cache.remote is not None and cache.remote.uploads_refused:
            raise typer.Exit(1)   # stored locally; the warning above says why the upload failed


@app.command()
def get(digest: Annotated[str, typer.Argument(help="sha256 of the blob.")],
        out: Annotated[Path, typer.Option("--out", "-o", help="Where to write it ('-' for stdout).")],
        cache_dir: CacheDir = None, remote: Remote = None, remote_header: RemoteHeader = None,
        remote_timeout: RemoteTimeout = None) -> None:
    """Write the blob DIGEST to --out, verified, fetching it from the remote if needed."""
    with _errors(), _open(cache_dir, remote, remote_header, remote_timeout) as cache:
        if str(out) == "-":
            with tempfile.TemporaryDirectory() as tmp:
                found = cache.get_file(digest, Path(tmp) / "blob")
                if found:
                    with open(Path(tmp) / "blob", "rb") as f:
                        shutil.copyfileobj(f, sys.stdout.buffer)
                    sys.stdout.buffer.flush()
        else:
            found = cache.get_file(digest, out)
        if not found:
            where = "the local cache or the remote" if cache.remote else "the local cache"
            raise CacheError(f"blob {digest} is not in {where}")


@app.command("ls")
def list_entries(cache_dir: CacheDir = None, as_json: Json = False) -> None:
    """List stored records (ac: with the kernel each is for) and blobs (cas), least recently used first."""
    with _errors(), _open(cache_dir, use_remote=False) as cache:
        entries = list(cache.local.entries())
        records = {r.digest: r for r in cache.local.records()}
        if as_json:
            rows = []
            for e in entries:
                row = dataclasses.asdict(e)
                if e.name in records and e.kind == "ac":
                    row["kernel"] = kernel_summary(records[e.name].key)
                    row["predicted"] = records[e.name].predicted
                rows.append(row)
            _print_json(rows)
            return
        for e in entries:
            when = dt.datetime.fromtimestamp(e.last_access).isoformat(timespec="seconds")
            what = ""
            if e.kind == "ac" and e.name in records:
                what = "  " + describe(records[e.name].key) + (" (predicted)" if records[e.name].predicted else "")
            typer.echo(f"{e.kind:<3} {e.name} {e.size:>12} {e.stored_size:>12} {when}{what}")


@app.command()
def stats(cache_dir: CacheDir = None, as_json: Json = False) -> None:
    """Entries, bytes, hits, misses, remote errors and rejected downloads."""
    with _errors(), _open(cache_dir, use_remote=False) as cache:
        numbers = cache.stats()
        numbers.pop("remote", None)
        if as_json:
            _print_json(numbers)
            return
        typer.echo(f"cache dir:          {numbers['cache_dir']}")
        typer.echo(f"entries:            {numbers['entries']} ({numbers['records']} records, "
                   f"{numbers['blobs']} blobs)")
        typer.echo(f"bytes:              {numbers['bytes']} on disk "
                   f"({cache_gc.format_size(numbers['bytes'])}; {numbers['raw_bytes']} uncompressed)")
        for name in ("hits", "remote_hits", "misses", "remote_errors", "rejected_downloads",
                     "corrupt_dropped", "uploads", "upload_errors"):
            typer.echo(f"{name.replace('_', ' ') + ':':<20}{numbers[name]}")


@app.command()
def verify(cache_dir: CacheDir = None, as_json: Json = False) -> None:
    """Rehash every blob and re-check every record; drop and report what is corrupt (exit 1)."""
    with _errors(), _open(cache_dir, use_remote=False) as cache, _progress("verifying") as tick:
        report = cache.local.verify(progress=tick)
    if as_json:
        _print_json({**dataclasses.asdict(report), "ok": report.ok})
    else:
        for line in report.corrupt + report.missing + report.dangling:
            typer.echo(f"dropped {line}")
        state = "ok" if report.ok else "PROBLEMS FOUND (dropped)"
        typer.echo(f"checked {report.blobs_checked} blobs and {report.records_checked} records: {state}"
                   + ("" if report.index_ok else "; the SQLite index failed its integrity check"))
    if not report.ok:
        raise typer.Exit(1)


@app.command("gc")
def collect(max_size: Annotated[str, typer.Option("--max-size", help="Target size: 123, 500K, 10M, 1G.")],
            cache_dir: CacheDir = None, as_json: Json = False) -> None:
    """Evict least recently used entries until the cache holds at most --max-size bytes."""
    with _errors():
        try:
            limit = cache_gc.parse_size(max_size)
        except CacheError as exc:
            raise _Usage(str(exc)) from None
        with _open(cache_dir, use_remote=False) as cache, _progress("collecting") as tick:
            report = cache_gc.collect(cache.local, limit, progress=tick)
    if as_json:
        _print_json(dataclasses.asdict(report))
        return
    typer.echo(f"removed {report.removed_records} records and {report.removed_blobs} blobs, freed "
               f"{cache_gc.format_size(report.freed_bytes)}; the cache now holds "
               f"{cache_gc.format_size(report.bytes_after)}")


@app.command("explain")
def explain_key(key: Annotated[str, typer.Argument(help="A record's key (64 hex, or a unique prefix of it).")],
                cache_dir: CacheDir = None, remote: Remote = None, remote_header: RemoteHeader = None,
                remote_timeout: RemoteTimeout = None, as_json: Json = False) -> None:
    """Print the named parts a stored key was built from (and, for a predicted winner, how the
    nearest measured one differs)."""
    with _errors(), _open(cache_dir, remote, remote_header, remote_timeout) as cache:
        key = resolve_key(cache.local, key)
        record = _record(cache, key)
        near = Neighbours.of(cache.local).nearest(record.key) if record.predicted else None
        origin = _origin(cache, key, record)
        if as_json:
            out = {"key": key, "kernel": kernel_summary(record.key), "predicted": record.predicted, "origin": origin,
                   "parts": thaw(record.key.parts()), "value": thaw(record.value),
                   "blobs": {n: dataclasses.asdict(r) for n, r in record.blobs.items()}}
            if near is not None:
                out["nearest_measured"] = {"key": near.record.digest, "differs_in": near.parts}
            _print_json(out)
            return
        lines = explain(record.key)
        lines.insert(1, f"  kernel: {describe(record.key)}")
        for line in lines:
            typer.echo(line)
        for name, ref in record.blobs.items():
            typer.echo(f"  blob {name}: {ref.digest} ({ref.size} bytes)")
        typer.echo(f"  origin: {origin} ({ORIGINS.get(origin, _UNCHECKED.get(origin, ''))})")
        if record.predicted:
            typer.echo("  predicted: the cost model's pick, not a measurement; never served as a cache hit")
            if near is None:
                typer.echo("  no measured record of this kernel kind is stored locally")
            else:
                typer.echo(f"  nearest measured key {near.record.digest} differs in: {', '.join(near.parts)}"
                           f" (xgbuild cache diff {key[:16]} {near.record.digest[:16]})")


@app.command("diff")
def diff(key1: Annotated[str, typer.Argument(help="First key (64 hex, or a unique prefix).")],
         key2: Annotated[Optional[str], typer.Argument(
             help="Second key; left out: the nearest stored measured key of the same kernel kind.")] = None,
         cache_dir: CacheDir = None, remote: Remote = None, remote_header: RemoteHeader = None,
         remote_timeout: RemoteTimeout = None, as_json: Json = False) -> None:
    """Show which key parts differ between two stored keys (why did my copied cache miss?).
    Exit 0 when the parts are identical, 1 when they differ."""
    with _errors(), _open(cache_dir, remote, remote_header, remote_timeout) as cache:
        left = _record(cache, resolve_key(cache.local, key1))
        if key2 is None:
            near = Neighbours.of(cache.local).nearest(left.key)
            if near is None:
                raise CacheError(f"no other measured record of the same kind ({describe(left.key)}) is "
                                 "stored locally to compare with")
            right = near.record
        else:
            right = _record(cache, resolve_key(cache.local, key2))
        diffs = diff_keys(left.key, right.key)
        if as_json:
            _print_json([{"path": d.path, "left": render_value(d.left), "right": render_value(d.right)}
                         for d in diffs])
        elif not diffs:
            typer.echo("the keys have identical parts")
        else:
            parts = sorted({d.path.split(".", 1)[0] for d in diffs})
            if key2 is None:
                typer.echo(f"nearest stored key: {right.digest} ({describe(right.key)})")
            typer.echo(f"parts that differ: {', '.join(parts)}")
            for line in diff_lines(diffs):
                typer.echo(line)
    if diffs:
        raise typer.Exit(1)     # like diff(1): 0 same, 1 different, 2 trouble


_UNCHECKED = {"remote": "only the remote has it; a build checks it before use",
              "unknown": "stored by an older XG without its origin; a build checks it before use"}


def _origin(cache: Cache, key: str, record) -> str:
    """Where the record `explain` shows came from: its local origin, or "remote" when only the
    remote holds it (not yet checked here)."""
    try:
        local = cache.local.get_record(key)
    except CacheError:
        local = None
    return "remote" if local is None else origin_of(local)


def _record(cache: Cache, key: str):
    record = cache.get_record(key)
    if record is None:
        where = "the local cache or the remote" if cache.remote else "the local cache"
        raise CacheError(f"no record for key {key} in {where}")
    return record


@contextlib.contextmanager
def _progress(label: str) -> Iterator:
    """A transient rich progress bar on stderr when it is a terminal; a no-op callback otherwise."""
    if not sys.stderr.isatty():
        yield None
        return
    from rich.console import Console
    from rich.progress import Progress

    with Progress(console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(label, total=None)
        yield lambda done, total: bar.update(task, completed=done, total=total)


if __name__ == "__main__":
    app()
