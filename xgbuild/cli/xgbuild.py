"""`xgbuild`: XG's toolbox: `explain` diagnostic codes, the `cache`, and (later) `inspect`, `tune`."""

from __future__ import annotations

import sys

import typer

from ..compiler.frontend.diagnostics import explain as explain_code
from . import cache_cmd
from .common import fail, make_app, run

app = make_app("XG build tools: explain diagnostics, manage the artifact cache.")
app.add_typer(cache_cmd.app, name="cache")


@app.command()
def explain(code: str = typer.Argument(..., help="a diagnostic code such as XG0100")) -> None:
    """Print the long explanation of a diagnostic code."""
    text = explain_code(code.strip())
    if text is None:
        fail(f"unknown diagnostic code {code!r}; codes look like XG0100", 2)
    sys.stdout.write(text)


def main() -> None:
    run(app, "xgbuild")


if __name__ == "__main__":
    main()
