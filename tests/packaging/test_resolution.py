"""XG's dependencies resolve from the package index alone (issue 25, finding 1).

pyproject.toml once pinned torch 2.13.0 with Triton 3.6.0, a pair only this kind of host's local
wheels satisfy: the index's torch 2.13.0 requires Triton 3.7.1. The slow test asks pip, with no
configuration and no local wheels, to resolve the project with each supported torch/Triton pair
and requirements.lock (what `tools/lock.py --check` does; CI reaches the index).
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _lock_tool():
    spec = importlib.util.spec_from_file_location("xg_lock_tool", ROOT / "tools" / "lock.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_lock_pins_every_requirement_but_torch_and_triton() -> None:
    lock = _lock_tool()
    pins = lock.read_lock()
    names = {lock.canonical(r.split(";")[0].split("[")[0].split("=")[0].split("<")[0].split(">")[0].strip())
             for r in lock.requirements()}
    assert names - set(pins) == {"torch", "triton"}, "tools/lock.py rewrites requirements.lock"
    assert not [n for n in pins if lock.UNLOCKED.match(n)], "torch, Triton and torch's CUDA wheels float"
    assert pins["transformers"] == "5.17.0"   # an exact pin of pyproject.toml's is the lock's too


def test_resolution_ignores_this_hosts_pip_configuration(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIP_FIND_LINKS", "/opt/wheels")
    monkeypatch.setenv("PIP_CONSTRAINT", "/etc/xdg/pip/constraints.txt")
    env = _lock_tool().index_env()
    assert not [k for k in env if k.startswith("PIP_") and k not in
                {"PIP_CONFIG_FILE", "PIP_DISABLE_PIP_VERSION_CHECK", "PIP_NO_INPUT"}]
    assert env["PIP_CONFIG_FILE"] == "/dev/null"


@pytest.mark.slow
def test_each_torch_triton_pair_resolves_from_the_index_alone() -> None:
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "lock.py"), "--check"],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert any(line.startswith("torch 2.11.") and "triton 3.6." in line for line in lines), done.stdout
    assert any(line.startswith("torch 2.13.") and "triton 3.7." in line for line in lines), done.stdout
