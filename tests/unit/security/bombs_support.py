"""Shared by the bomb, forged-manifest, input and non-regular-file attacks: a real engine to forge
from, a forger that re-seals with the packager's own writer, and `xgrun` run in a child process
whose peak memory and output are measured."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import xg
from xgbuild.packager.archive import read_bundle, write_bundle
from xgbuild.packager.manifest import canonical_json, sha256

# Fixed dims for A (so a wrong input shape is refused from its header), a symbol for B.
PROGRAM = """extern Tensor[float32, 4, 8] A
extern Tensor[float32, 8, N] B
def main() {
    return A @ B
}
"""
MEMORY_SLACK = 500 << 20        # what a refusal may take above a sound run of the same engine


def build_engine(directory: Path) -> Path:
    source = directory / "mm.xg"
    source.write_text(PROGRAM)
    engine = directory / "mm.xge"
    xg.compile_file(source).save(engine)
    return engine


@dataclass
class Forger:
    """The entries of a real engine, to edit and re-seal as an attacker with write access would."""

    entries: dict[str, bytes]

    @classmethod
    def of(cls, engine: Path) -> "Forger":
        return cls(dict(read_bundle(engine).entries))

    def manifest(self) -> dict:
        return json.loads(self.entries["manifest.json"])

    def program(self) -> dict:
        return json.loads(self.entries["program.json"])

    def write(self, path: Path, *, manifest: dict | None = None, program: dict | bytes | None = None,
              raw_manifest: bytes | None = None, files: dict[str, bytes] | None = None) -> Path:
        """The engine with these parts replaced, digests in the manifest updated to match, sealed."""
        entries = dict(self.entries)
        manifest = json.loads(json.dumps(manifest if manifest is not None else self.manifest()))
        if program is not None:
            blob = program if isinstance(program, bytes) else json.dumps(program).encode()
            entries["program.json"] = blob
            manifest["program"]["sha256"] = sha256(blob)
        entries.update(files or {})
        entries["manifest.json"] = raw_manifest if raw_manifest is not None else canonical_json(manifest)
        write_bundle(path, entries)
        return path


@dataclass
class Run:
    code: int
    out: str
    err: str
    peak_rss: int               # bytes, the child's high-water mark

    def error_lines(self) -> list[str]:
        return [line for line in self.err.splitlines() if line.startswith("error:")]


_MEASURE = (
    "import resource, subprocess, sys\n"
    "r = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
    "sys.stdout.write(r.stdout); sys.stderr.write(r.stderr)\n"
    "print('PEAK_RSS_KB', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr)\n"
    "sys.exit(r.returncode)\n"
)


def run_measured(*argv: object, timeout: float = 60) -> Run:
    """Run a command in a child, with its peak resident memory (Linux reports kilobytes)."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    proc = subprocess.run([sys.executable, "-c", _MEASURE, *map(str, argv)], capture_output=True, text=True,
                          timeout=timeout, env=env)
    lines = proc.stderr.splitlines()
    peak = int(lines[-1].split()[1]) * 1024
    return Run(proc.returncode, proc.stdout, "\n".join(lines[:-1]), peak)


def xgrun(*args: object, timeout: float = 60) -> Run:
    return run_measured(sys.executable, "-m", "xgbuild.cli.xgrun", *args, timeout=timeout)


def assert_refused(run: Run, *needles: str) -> str:
    """Exit 1, one `error:` line holding every needle, no traceback, no internal error."""
    both = run.out + run.err
    assert run.code == 1, f"exit {run.code}\n{both}"
    assert "Traceback" not in both and "internal error" not in both, both
    errors = run.error_lines()
    assert len(errors) == 1, both
    for needle in needles:
        assert needle in errors[0], errors[0]
    return errors[0]
