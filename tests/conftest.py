"""Shared pytest configuration: the `gpu` marker skips without a CUDA device; snapshot updates."""

from __future__ import annotations

from pathlib import Path

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-snapshots", action="store_true", default=False,
                     help="rewrite rendered-diagnostic snapshot files instead of comparing")


def _has_cuda() -> bool:
    try:
        import torch
        return torch.cuda.is_available()
    except Exception:
        return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if any("gpu" in item.keywords for item in items) and not _has_cuda():
        skip = pytest.mark.skip(reason="needs an NVIDIA GPU (none found)")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)
    # Under pytest-xdist (`-n N --dist loadgroup`, as tools/test runs): a file's tests stay on one
    # worker (its module fixtures are built once), and every Bazel test shares one worker (one
    # Bazel server and output base at a time).
    for item in items:
        group = "bazel" if "bazel" in item.keywords else item.nodeid.split("::", 1)[0]
        item.add_marker(pytest.mark.xdist_group(group))


@pytest.fixture
def update_snapshots(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--update-snapshots"))


@pytest.fixture
def small_h100_hw_dir(tmp_path: Path) -> Path:
    """A copy of the built-in GPU profiles (for XG_HW_DIR or CheckOptions.hw_dir) whose H100 has
    1 GB of HBM, so a program needing 2 GB on one GPU fails the per-GPU memory check."""
    from xgbuild.settings import BUILTIN_HW_DIR
    out = tmp_path / "small-hw"
    out.mkdir()
    for src in BUILTIN_HW_DIR.glob("*.toml"):
        text = src.read_text()
        if src.name == "h100.toml":
            assert "hbm_bytes = 80_000_000_000" in text
            text = text.replace("hbm_bytes = 80_000_000_000", "hbm_bytes = 1_000_000_000")
        (out / src.name).write_text(text)
    return out
