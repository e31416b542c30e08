"""`--version` on every XG command: XG's version and the versions of what its builds and runs use
(Triton compiles the kernels, torch runs engines on CPU, the CUDA driver runs them on a GPU), and
where the data XG ships (GPU profiles, standard library, Bazel rules) was found."""

from __future__ import annotations

import importlib.metadata
import sys

import typer

from .. import __version__


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def version_text(prog: str) -> str:
    """The lines `PROG --version` prints."""
    from ..runtime.cuda import driver_version
    from ..settings import SHIPPED_DIRS, shipped_dir

    driver = driver_version()
    bindings = _version("cuda-bindings")     # what `cuda.bindings` is; cuda-python is a meta-package over it
    cuda = f"CUDA driver {driver}" if driver else "no CUDA driver"
    data = sorted({str(shipped_dir(name).parent) for name in SHIPPED_DIRS})
    return (f"{prog} (XG) {__version__}\n"
            f"triton {_version('triton')}\n"
            f"torch {_version('torch')}\n"
            f"{cuda} (cuda-bindings {bindings})\n"
            f"python {sys.version.split()[0]}\n"
            f"data {', '.join(data)} ({', '.join(SHIPPED_DIRS)})\n")


def version_option(prog: str) -> bool:
    """A `--version` option for a command's parameters: eager, so it works without the command's
    required arguments, and it exits after printing."""
    def show(value: bool) -> None:
        if value:
            sys.stdout.write(version_text(prog))
            raise typer.Exit(0)
    return typer.Option(False, "--version", callback=show, is_eager=True,
                        help="print XG's version and Triton's, torch's and the CUDA driver's, then exit")
