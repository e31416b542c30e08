"""`xgbuild cache …`: placeholder, replaced by the cache implementation."""

import typer

app = typer.Typer(help="The content-addressed artifact cache.", no_args_is_help=True)
