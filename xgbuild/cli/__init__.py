"""Thin typer applications over the library: `xgc`, `xgrun`, `xgbuild`."""
