"""Writes and checks requirements.lock: XG's dependencies resolved from the package index alone.

    .venv/bin/python tools/lock.py            # resolve every extra, write requirements.lock
    .venv/bin/python tools/lock.py --check    # each supported torch/Triton pair resolves with the lock

pyproject.toml gives ranges; the lock pins everything else to one tested set, as a pip constraints
file (`pip install -c requirements.lock -e '.[dev]'`, as tools/setup.sh does). torch, Triton and
the packages only torch pins (its CUDA wheels, setuptools) stay out of the lock: each supported
pair (`PAIRS`) brings its own, and the check resolves the project with each of them.

Both modes ignore this host's pip configuration (PIP_CONFIG_FILE=/dev/null, no PIP_* variables):
a local wheel directory or mirror must not hide a conflict that a user's plain `pip install` meets.
Resolutions are for the interpreter running this script (CI's: CPython 3.11 on Linux x86_64).
Exit codes: 0 ok, 1 a pair does not resolve, 2 usage or the index cannot be reached.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOCK = ROOT / "requirements.lock"
PAIRS = (("2.11", "3.6"), ("2.13", "3.7"))   # torch, Triton: the GPU hosts' pair, the index's newest
# Left to each pair: torch and Triton themselves, torch's CUDA wheels, and setuptools (torch 2.11
# requires <82, torch 2.13 >=77), and pip, the installer itself.
UNLOCKED = re.compile(r"^(torch|triton|setuptools|pip|cuda-toolkit|nvidia-.*)$")


def canonical(name: str) -> str:
    """PEP 503's normalised name: `Jinja2` and `jinja2`, `typing_extensions` and `typing-extensions` agree."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirements(extras: tuple[str, ...] = ("dev",)) -> list[str]:
    """pyproject.toml's dependencies plus those of `extras`, self-references (`xg[onnx]`) expanded."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    optional = project.get("optional-dependencies", {})
    out, todo, seen = list(project["dependencies"]), list(extras), set()
    while todo:
        extra = todo.pop()
        if extra in seen:
            continue
        seen.add(extra)
        for req in optional[extra]:
            own = re.fullmatch(rf"{project['name']}\[([^\]]+)\]", req.replace(" ", ""))
            if own:
                todo.extend(own.group(1).split(","))
            elif req not in out:
                out.append(req)
    return out


def index_env() -> dict[str, str]:
    """This environment without any pip configuration: the package index alone."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1")
    return env


class Unresolvable(Exception):
    """pip found no set of versions; the message is pip's explanation."""


def resolve(reqs: list[str], constraints: Path | None = None) -> dict[str, str]:
    """Name -> version that pip would install from the index alone (into an empty environment)."""
    with tempfile.TemporaryDirectory(prefix="xg-lock-") as tmp:
        report = Path(tmp) / "report.json"
        cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
               "--report", str(report), *reqs]
        if constraints is not None:
            cmd += ["-c", str(constraints)]
        done = subprocess.run(cmd, env=index_env(), capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            raise Unresolvable((done.stderr or done.stdout).strip())
        items = json.loads(report.read_text())["install"]
    return {canonical(i["metadata"]["name"]): i["metadata"]["version"] for i in items}


def read_lock(path: Path = LOCK) -> dict[str, str]:
    """The lock's pins, name -> version."""
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            pins[canonical(name)] = version.strip()
    return pins


def write_lock(path: Path = LOCK) -> int:
    pins = {n: v for n, v in sorted(resolve(requirements()).items()) if not UNLOCKED.match(n)}
    head = ("# XG's dependencies, except torch and Triton, pinned to one resolution from the package index\n"
            "# alone (CPython 3.11, Linux x86_64). A pip constraints file: pip install -c requirements.lock ...\n"
            "# Written by tools/lock.py; check with `tools/lock.py --check`. Do not edit by hand.\n")
    path.write_text(head + "".join(f"{n}=={v}\n" for n, v in pins.items()))
    print(f"wrote {path.relative_to(ROOT)}: {len(pins)} pins")
    return 0


def check(path: Path = LOCK) -> int:
    """Every pair resolves from the index alone with the project's requirements and the lock."""
    failed = 0
    for torch, triton in PAIRS:
        try:
            got = resolve(requirements() + [f"torch=={torch}.*", f"triton=={triton}.*"], path)
        except Unresolvable as exc:
            failed += 1
            print(f"torch {torch}, triton {triton}: does not resolve from the index alone\n{exc}")
            continue
        print(f"torch {got['torch']}, triton {got['triton']}: {len(got)} packages resolve from the index alone")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="check that every torch/Triton pair resolves")
    args = parser.parse_args(argv)
    try:
        return check() if args.check else write_lock()
    except Unresolvable as exc:
        print(f"error: the project's requirements do not resolve from the index alone\n{exc}", file=sys.stderr)
        return 1
    except (subprocess.TimeoutExpired, OSError) as exc:
        print(f"error: cannot run pip against the index: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
