"""A wheel of XG compiles and runs programs on its own (issue 25, finding 2).

The wheel must carry the GPU profiles (`hw/`), the standard library (`std/`) and the Bazel rules
(`rules_xg/`): without them `xgc` on any program stopped at "hardware profile directory not
found", and `import std.nn` at "no such module". The test builds the wheel from a copy of the
checkout, installs it (without dependencies) into a fresh virtualenv that borrows this one's
packages, and from a directory outside the checkout builds and runs an example and a program
that imports std.nn.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ("hw/h100.toml", "std/nn.xg", "std/optim.xg", "rules_xg/defs.bzl", "rules_xg/private/rules/engine.bzl")

USES_STD = """\
import std.nn

extern Tensor[float32, T, D] X
extern Tensor[float32, D] G

def main() {
    return rms_norm(X, G)
}
"""


def _run(cmd: list, cwd: Path, env: dict, timeout: float = 600) -> subprocess.CompletedProcess:
    done = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{' '.join(map(str, cmd))} exited {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done


# Top-level entries a wheel is not built from (xgbuild/build/ is a package: only the root's build/ goes).
_SKIPPED_AT_ROOT = {".git", ".venv", ".tools", ".whl", "out", "build", "tests", "docs"}


def _not_sources(directory: str, names: list[str]) -> set[str]:
    at_root = Path(directory) == ROOT
    return {n for n in names if n == "__pycache__" or n.endswith(".egg-info")
            or (at_root and (n in _SKIPPED_AT_ROOT or n.startswith("bazel-")))}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """XG's wheel, built from a copy of the checkout (an in-tree build would leave build/ behind)."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    shutil.copytree(ROOT, src, ignore=_not_sources)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") and k != "PYTHONPATH"}
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
          "-w", tmp / "dist", src], cwd=tmp, env=env)
    (built,) = (tmp / "dist").glob("xg-*.whl")
    return built


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtualenv with the wheel, and this environment's packages (torch, Triton, ...)
    behind it through a .pth line (its own .pth files, the editable checkout's among them, stay
    unread), so the test installs nothing from the index."""
    venv = tmp_path_factory.mktemp("venv") / "v"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True, timeout=120)
    py = venv / "bin" / "python"
    site = Path(subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    (site / "zz_borrowed.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") and k != "PYTHONPATH"}
    _run([sys.executable, "-m", "pip", "--python", py, "install", "--no-deps", "--no-index", "-q", wheel],
         cwd=venv, env=env)
    return venv


def test_the_wheel_carries_profiles_std_and_the_bazel_rules(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    sources = {p.relative_to(ROOT).as_posix() for pkg in ("xg", "xgbuild") for p in (ROOT / pkg).rglob("*.py")
               if "__pycache__" not in p.parts}
    assert not sources - names, f"sources not in {wheel.name}: {sorted(sources - names)[:5]}"
    missing = [p for p in SHIPPED if f"xgbuild/_data/{p}" not in names]
    assert not missing, f"not in {wheel.name}: {missing}"
    profiles = {p.name for p in (ROOT / "hw").glob("*.toml")}
    assert {n.rsplit("/", 1)[1] for n in names if n.startswith("xgbuild/_data/hw/")} == profiles


@pytest.mark.slow
def test_the_installed_wheel_builds_and_runs_programs_outside_the_checkout(installed: Path, tmp_path: Path) -> None:
    bin_dir = installed / "bin"
    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(ROOT / "examples" / "mlp.xg", work / "mlp.xg")
    (work / "uses_std.xg").write_text(USES_STD)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(XDG_CACHE_HOME=str(tmp_path / "cache"), PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}")

    version = _run(["xgc", "--version"], work, env).stdout
    assert f"data {installed}" in version, version      # the profiles found are the wheel's own
    where = _run([bin_dir / "python", "-c", "import xgbuild; print(xgbuild.__file__)"], work, env).stdout
    assert where.startswith(str(installed)), where

    _run(["xgc", "mlp.xg", "--no-kernels", "--out", "build/mlp.xge"], work, env)
    ran = _run(["xgrun", "build/mlp.xge", "--seed", "1"], work, env)
    assert "bfloat16" in ran.stdout, ran.stdout

    _run(["xgc", "uses_std.xg", "--check"], work, env)
    _run(["xgc", "uses_std.xg", "--no-kernels", "--out", "std.xge"], work, env)
    ran = _run(["xgrun", "std.xge", "--seed", "1", "--json"], work, env)
    assert '"float32"' in ran.stdout, ran.stdout


@pytest.mark.slow
def test_a_runtime_only_install_runs_engines_without_torch(wheel: Path, tmp_path: Path) -> None:
    """`pip install 'xg[runtime]'` from the package index (issue 22): neither torch nor Triton is
    installed; xgrun verifies an engine built here and checks its inputs, says plainly that running
    it needs a GPU (this host has none) and that the build tools need `xg[build]`; the whole
    install stays small."""
    import xg
    venv = tmp_path / "v"
    subprocess.run([sys.executable, "-m", "venv", venv], check=True, timeout=300)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") and k != "PYTHONPATH"}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1")
    _run([venv / "bin" / "python", "-m", "pip", "install", "-q", "-c", ROOT / "requirements.lock",
          f"{wheel}[runtime]"], cwd=tmp_path, env=env, timeout=900)
    listed = _run([venv / "bin" / "python", "-m", "pip", "list", "--format=freeze"], tmp_path, env).stdout.lower()
    for heavy in ("torch", "triton", "sympy", "sqlite-utils", "safetensors"):
        assert f"\n{heavy}==" not in f"\n{listed}", listed
    src = tmp_path / "m.xg"
    src.write_text("extern Tensor[float32, T, D] X\nextern Tensor[float32, D] G\ndef main() {\n    return X * G\n}\n")
    xg.compile_file(src, target="H100", tune="predict", dims={"T": 8, "D": 4}).save(tmp_path / "m.xge")
    xgrun = venv / "bin" / "xgrun"
    ran = _run([xgrun, "m.xge", "--dry-run", "--dim", "T=8", "--dim", "D=4"], tmp_path, env)
    assert "verified, inputs match its signature" in ran.stdout, ran.stdout
    for cmd, needle in (([xgrun, "m.xge", "--device", "cuda", "--dim", "T=8", "--dim", "D=4"], "cannot run on cuda"),
                        ([venv / "bin" / "xgc", "m.xg", "--target=H100", "--out", "o.xge"], "pip install 'xg[build]'"),
                        ([venv / "bin" / "xgbuild", "cache", "stats"], "pip install 'xg[build]'")):
        done = subprocess.run([str(c) for c in cmd], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 1 and needle in done.stderr and "Traceback" not in done.stderr, done.stderr
    site = Path(_run([venv / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                     tmp_path, env).stdout.strip())
    size = sum(p.stat().st_size for p in site.rglob("*") if p.is_file())
    assert size < 400 * 2**20, f"a runtime-only install takes {size / 2**20:.0f} MB"
