"""Engines, `--inputs` and `--output` that are not regular files: FIFOs (which block an open for
reading until a writer comes), devices (`/dev/zero` never ends), directories and sockets, named
directly or through a symlink. Each is refused at once, never blocks, and nothing is written
anywhere: not into the FIFO or device, not through the link, no temp file left behind."""

from __future__ import annotations

import os
import socket
import stat

import numpy as np
import pytest
import torch

from .bombs_support import assert_refused, build_engine, xgrun
from xgbuild.errors import EngineError
from xgbuild.packager.engine_file import read_engine
from xgbuild.runtime.tensor_io import TensorIOError, load_tensors, save_tensors

KINDS = ["fifo", "dev-zero", "directory", "socket", "link-to-fifo"]


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    return build_engine(tmp_path_factory.mktemp("engine"))


@pytest.fixture
def sockets():
    held = []
    yield held
    for s in held:
        s.close()


def make(kind: str, path, sockets) -> str:
    """`path` made into a `kind` of non-regular file; the words the refusal should use."""
    if kind == "fifo":
        os.mkfifo(path)
        return "a FIFO"
    if kind == "dev-zero":
        os.symlink("/dev/zero", path)
        return "a character device"
    if kind == "directory":
        path.mkdir()
        return "directory"
    if kind == "socket":
        s = socket.socket(socket.AF_UNIX)
        s.bind(str(path))
        sockets.append(s)
        return "not a regular file"
    os.mkfifo(path.with_name("real-fifo"))
    os.symlink(path.with_name("real-fifo"), path)
    return "a FIFO"


@pytest.mark.timeout(20)
@pytest.mark.parametrize("kind", KINDS)
def test_an_engine_that_is_not_a_regular_file_is_refused_at_once(tmp_path, kind, sockets):
    path = tmp_path / "e.xge"
    make(kind, path, sockets)
    with pytest.raises(EngineError) as caught:
        read_engine(path)
    assert "is a directory" in str(caught.value) or "is not a regular file" in str(caught.value)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
def test_xgrun_refuses_an_engine_fifo_or_device_with_one_line(tmp_path, kind, sockets):
    path = tmp_path / "e.xge"
    make(kind, path, sockets)
    assert_refused(xgrun(path, timeout=30), "is not a regular file")


@pytest.mark.timeout(20)
@pytest.mark.parametrize("suffix", [".npz", ".safetensors", ".pt"])
@pytest.mark.parametrize("kind", KINDS)
def test_inputs_that_are_not_regular_files_are_refused_at_once(tmp_path, kind, suffix, sockets):
    path = tmp_path / f"in{suffix}"
    words = make(kind, path, sockets)
    with pytest.raises(TensorIOError) as caught:
        load_tensors(path)
    message = str(caught.value)
    assert "is not a regular file" in message and words in message and "\n" not in message, message


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
def test_xgrun_refuses_inputs_fifo_or_device_with_one_line(tmp_path, engine, kind, sockets):
    path = tmp_path / "in.npz"
    make(kind, path, sockets)
    assert_refused(xgrun(engine, "--inputs", path, timeout=30), "is not a regular file")


@pytest.mark.timeout(20)
@pytest.mark.parametrize("kind", ["fifo", "directory", "socket"])
def test_an_output_that_is_not_a_regular_file_is_refused_untouched(tmp_path, kind, sockets):
    path = tmp_path / "out.npz"
    make(kind, path, sockets)
    before = os.lstat(path)
    with pytest.raises(TensorIOError, match="cannot write output file .*not a regular file"):
        save_tensors(path, {"out": torch.ones(2)})
    after = os.lstat(path)
    assert stat.S_IFMT(after.st_mode) == stat.S_IFMT(before.st_mode) and after.st_ino == before.st_ino
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.npz"]      # no temp file left


@pytest.mark.timeout(20)
@pytest.mark.parametrize("target", ["/dev/null", "file"])
def test_an_output_link_is_not_replaced_or_written_through(tmp_path, target):
    victim = tmp_path / "elsewhere" / "victim.npz"
    victim.parent.mkdir()
    np.savez(victim, keep=np.ones(1))
    original = victim.read_bytes()
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    link = out_dir / "out.npz"
    os.symlink("/dev/null" if target == "/dev/null" else victim, link)
    with pytest.raises(TensorIOError, match="is a symbolic link"):
        save_tensors(link, {"out": torch.ones(2)})
    assert os.path.islink(link) and victim.read_bytes() == original
    assert sorted(p.name for p in out_dir.iterdir()) == ["out.npz"]


@pytest.mark.timeout(20)
def test_a_device_named_as_the_output_is_refused(tmp_path):
    device = tmp_path / "out.npz"
    try:
        os.mknod(device, stat.S_IFCHR | 0o600, os.makedev(1, 3))     # /dev/null's numbers
    except PermissionError:
        pytest.skip("making a device node needs root")
    with pytest.raises(TensorIOError, match="it is a character device, not a regular file"):
        save_tensors(device, {"out": torch.ones(2)})
    assert stat.S_ISCHR(os.lstat(device).st_mode)


@pytest.mark.timeout(60)
def test_xgrun_refuses_a_fifo_output_and_never_opens_it(tmp_path, engine):
    fifo = tmp_path / "out.npz"
    os.mkfifo(fifo)
    assert_refused(xgrun(engine, "--output", fifo, timeout=30), "not a regular file")
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.npz"]
