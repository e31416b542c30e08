"""`xgc`: the XG compiler command. Thin: parsing options and printing; the work is in the library."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from ..compiler.frontend import CheckOptions, check_file
from .common import EXIT_OK, EXIT_PROGRAM, EXIT_USAGE, emit_json, make_app, run

app = make_app("Compile an XG program (.xg) into an engine bundle (.xge), or check it.")


def _exit_code(result) -> int:
    if result.ok:
        return EXIT_OK
    codes = {d.code for d in result.diagnostics}
    # An unreadable file or a bug in XG is not a mistake in the program.
    return EXIT_USAGE if codes & {"XG0007", "XG0900"} else EXIT_PROGRAM


@app.command()
def compile(
    file: Path = typer.Argument(..., metavar="FILE", help="the .xg source file", show_default=False),
    check: bool = typer.Option(False, "--check", help="type-check only; write nothing"),
    json_out: bool = typer.Option(False, "--json", help="print one JSON object on stdout"),
    target: Optional[str] = typer.Option(None, "--target", help="GPU profile from hw/ (overrides TARGET_GPU)"),
    num_gpu: Optional[int] = typer.Option(None, "--num-gpu", min=1, help="GPUs to plan for (overrides NUM_GPU)"),
    lib: bool = typer.Option(False, "--lib", help="a library file: no `main` required"),
) -> None:
    """Type-check FILE (`--check`)."""
    options = CheckOptions(target=target, num_gpu=num_gpu, lib=lib)
    result = check_file(file, options)
    if json_out:
        emit_json(result.to_json())
    if result.diagnostics and not json_out:
        sys.stderr.write(result.render() + "\n")
    code = _exit_code(result)
    if code != EXIT_OK or check:
        raise typer.Exit(code)
    sys.stderr.write("error: building engines is not available yet; use --check\n")
    raise typer.Exit(EXIT_USAGE)


def main() -> None:
    run(app, "xgc")


if __name__ == "__main__":
    main()
