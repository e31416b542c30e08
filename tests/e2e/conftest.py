"""Shared helpers of the end-to-end tests: fresh random data, float64 references, CLI runners.

- `rand` gives a fresh, unseeded generator per test and reports its entropy in every failure
  message, so a failure can be replayed (`np.random.default_rng(SEED)`) without fixing the data.
- `assert_close` compares by relative norm error `||y - ref|| / ||ref||` against a float64 reference.
- `cli(...)` runs `xgc`/`xgrun`/`xgbuild` in this process through their real `main()` (argv,
  exit code, stdout, stderr): milliseconds instead of the ~2 s a subprocess spends importing torch.
  `start_process(...)` / `finish(...)` run the installed command in a subprocess, for what only a
  process shows (environment, umask, the exit status the shell sees).
"""

from __future__ import annotations

import contextlib
import importlib
import io
import math
import os
import shutil
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import xg

REPO_ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = REPO_ROOT / "examples"
EXAMPLE_NAMES = sorted(p.stem for p in EXAMPLES.glob("*.xg"))

# Relative norm error allowed for a program computing in this dtype, against float64.
TOLERANCE = {"float32": 1e-5, "bfloat16": 2e-2, "float64": 1e-12}
FLOAT64_MODE_TOL = 1e-12

_erf = np.vectorize(math.erf, otypes=[np.float64])


# ------------------------------------------------------------------------------ float64 references

def gelu(x: np.ndarray) -> np.ndarray:
    """GELU in its exact erf form (what `gelu` means in XG)."""
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))


def softmax(x: np.ndarray, axis: int) -> np.ndarray:
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def rmsnorm(x: np.ndarray, g: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps) * g


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float) -> np.ndarray:
    return softmax(q @ k.T * scale, axis=1) @ v


def mlp(x: np.ndarray, w1: np.ndarray, b1: np.ndarray, w2: np.ndarray) -> np.ndarray:
    return gelu(x @ w1 + b1) @ w2


# ------------------------------------------------------------------------------------ random data

@dataclass
class Rand:
    """A fresh generator; `seed` is its entropy, printed by every failure that uses it."""
    seed: int
    gen: np.random.Generator

    def tensor(self, shape: tuple[int, ...], dtype: str = "float32", scale: float = 1.0,
               shift: float = 0.0) -> tuple[torch.Tensor, np.ndarray]:
        """Normal data in `dtype` (generated in float32 and rounded), and its float64 copy."""
        x = self.gen.standard_normal(shape) * scale + shift
        t = torch.from_numpy(np.asarray(x, dtype=np.float32))
        if dtype != "float32":
            t = t.to(getattr(torch, dtype))
        return t, t.to(torch.float64).numpy()

    def ints(self, shape: tuple[int, ...], low: int, high: int, dtype: str = "int64") -> torch.Tensor:
        return torch.from_numpy(self.gen.integers(low, high, size=shape)).to(getattr(torch, dtype))

    def size(self, low: int, high: int, even: bool = False) -> int:
        n = int(self.gen.integers(low, high + 1))
        return n + (n % 2) if even else n


@pytest.fixture
def rand() -> Rand:
    ss = np.random.SeedSequence()
    return Rand(int(ss.entropy), np.random.default_rng(ss))


def to64(value: Any) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        return value.detach().to(torch.float64).numpy()
    return np.asarray(value, dtype=np.float64)


def rel_err(y: Any, ref: np.ndarray) -> float:
    y64, ref64 = to64(y), np.asarray(ref, dtype=np.float64)
    assert y64.shape == ref64.shape, f"shape {y64.shape} != reference shape {ref64.shape}"
    denom = np.linalg.norm(ref64)
    assert denom > 0, "the reference is all zeros: choose other data"
    return float(np.linalg.norm(y64 - ref64) / denom)


def assert_close(y: Any, ref: np.ndarray, tol: float, rand: Rand | None = None, what: str = "") -> None:
    err = rel_err(y, ref)
    seed = f" (data seed {rand.seed}: np.random.default_rng({rand.seed}))" if rand else ""
    assert err <= tol, f"{what}: relative norm error {err:.3e} > {tol:.0e}{seed}"


# ------------------------------------------------------------------------------------ engines

@pytest.fixture(scope="session")
def example_engines() -> dict[str, xg.Engine]:
    """Every example compiled once (compiling is deterministic; tests must not mutate engines)."""
    return {name: xg.compile_file(EXAMPLES / f"{name}.xg") for name in EXAMPLE_NAMES}


@pytest.fixture(scope="session")
def example_files(tmp_path_factory: pytest.TempPathFactory, example_engines) -> dict[str, Path]:
    """Every example's engine saved as an `.xge` file."""
    out = tmp_path_factory.mktemp("engines")
    paths = {}
    for name, engine in example_engines.items():
        paths[name] = out / f"{name}.xge"
        engine.save(paths[name])
    return paths


def src_text(text: str) -> str:
    """An inline program: dedented, without the leading blank line."""
    return textwrap.dedent(text).lstrip()


def write_program(directory: Path, text: str, name: str = "prog.xg") -> Path:
    path = directory / name
    path.write_text(text)
    return path


# Needs 2 GB on one GPU: fits the built-in H100, not the `small_h100_hw_dir` fixture's.
TWO_GB = "TARGET_GPU = H100\nextern Tensor[float32, 16000, 16000] W\ndef main() {\n    return W * 2.0\n}\n"


def compile_text(directory: Path, text: str, name: str = "prog.xg") -> xg.Engine:
    return xg.compile_file(write_program(directory, text, name))


# ------------------------------------------------------------------------------------ the CLIs

@dataclass
class CliResult:
    code: int
    out: str
    err: str

    @property
    def both(self) -> str:
        return self.out + self.err

    def error_lines(self) -> list[str]:
        return [line for line in self.err.splitlines() if line.startswith(("error:", "error["))]


def cli(prog: str, *args: Any) -> CliResult:
    """Run `prog` (xgc, xgrun, xgbuild) in-process through its console entry point."""
    module = importlib.import_module(f"xgbuild.cli.{prog}")
    out, err = io.StringIO(), io.StringIO()
    argv = sys.argv
    sys.argv = [prog, *map(str, args)]
    code: Any = 0
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            module.main()
    except SystemExit as exc:
        code = exc.code
    finally:
        sys.argv = argv
    if code is None:
        code = 0
    assert isinstance(code, int), f"{prog} exited with {code!r}"
    return CliResult(code, out.getvalue(), err.getvalue())


def command(prog: str) -> list[str]:
    """The installed console script if there is one beside this interpreter, else `python -m`."""
    script = Path(sys.executable).with_name(prog)
    if script.exists():
        return [str(script)]
    found = shutil.which(prog)
    return [found] if found else [sys.executable, "-m", f"xgbuild.cli.{prog}"]


def process_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(extra)
    return env


def _argv(prog: str, args: tuple, umask: int | None) -> list[str]:
    argv = [*command(prog), *map(str, args)]
    if umask is None:
        return argv
    # Through a shell rather than preexec_fn: the umask is set in the child alone, thread-safely.
    return ["/bin/sh", "-c", f'umask {umask:03o} && exec "$0" "$@"', *argv]


def start_process(prog: str, *args: Any, cwd: Path | None = None, env: dict[str, str] | None = None,
                  umask: int | None = None) -> subprocess.Popen:
    """Start the installed command in a subprocess; `finish` waits. Independent commands run side by side."""
    return subprocess.Popen(_argv(prog, args, umask), cwd=cwd or REPO_ROOT, env=env or process_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen, timeout: float = 120) -> CliResult:
    out, err = proc.communicate(timeout=timeout)
    return CliResult(proc.returncode, out, err)


def assert_clean_failure(res: CliResult, *needles: str, code: int = 1) -> None:
    """Exit `code`, exactly one `error:` line naming every needle, and no traceback anywhere."""
    assert res.code == code, f"exit {res.code}, expected {code}\nstdout: {res.out}\nstderr: {res.err}"
    assert "Traceback" not in res.both, res.both
    assert "internal error" not in res.both, res.both
    errors = res.error_lines()
    assert len(errors) == 1, f"expected one `error:` line, got {errors!r}\nstderr: {res.err}"
    for needle in needles:
        assert needle in errors[0], f"{needle!r} not in {errors[0]!r}"
