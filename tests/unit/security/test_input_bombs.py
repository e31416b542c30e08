"""Hostile `--inputs` files: archives that inflate to far more than their size, zip and safetensors
headers that lie about sizes, `.pt` files that claim storage they do not hold, meta tensors and
pickles of other objects. Each is refused from its headers, before its data is inflated or
allocated: one `TensorIOError` line in-process, one `error:` line and exit 1 from `xgrun`, within
seconds and bounded memory."""

from __future__ import annotations

import io
import struct
import time
import zipfile

import numpy as np
import pytest
import safetensors.torch
import torch

from .bombs_support import MEMORY_SLACK, assert_refused, build_engine, xgrun
from xgbuild.runtime.tensor_io import TensorIOError, load_tensors

SIGNATURE = {"A": ("float32", (4, 8)), "B": ("float32", (8, "N"))}


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    return build_engine(tmp_path_factory.mktemp("engine"))


@pytest.fixture(scope="module")
def baseline(engine, tmp_path_factory):
    path = tmp_path_factory.mktemp("inputs") / "good.npz"
    np.savez(path, A=np.ones((4, 8), np.float32), B=np.ones((8, 3), np.float32))
    run = xgrun(engine, "--inputs", path)
    assert run.code == 0, run.err
    return run.peak_rss


def npz_bomb(path, name: str, shape: tuple[int, ...]) -> None:
    """A deflated .npz whose one member is a float32 array of zeros of `shape`, written in pieces:
    hundreds of MB that compress a thousand times."""
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f4", "fortran_order": False, "shape": shape})
    info = zipfile.ZipInfo(f"{name}.npy")
    info.compress_type = zipfile.ZIP_DEFLATED
    with zipfile.ZipFile(path, "w", compresslevel=1) as zf:
        with zf.open(info, "w", force_zip64=True) as out:
            out.write(header.getvalue())
            chunk, left = bytes(16 << 20), int(np.prod(shape)) * 4
            while left:
                out.write(chunk[:min(left, len(chunk))])
                left -= min(left, len(chunk))


def refused(path, *needles: str, **kwargs) -> str:
    started = time.monotonic()
    with pytest.raises(TensorIOError) as caught:
        load_tensors(path, **kwargs)
    assert time.monotonic() - started < 10
    message = str(caught.value)
    assert "\n" not in message and str(path) in message, message
    for needle in needles:
        assert needle in message, message
    return message


@pytest.fixture(scope="module")
def bomb(tmp_path_factory):
    path = tmp_path_factory.mktemp("bomb") / "bomb.npz"
    npz_bomb(path, "A", (1 << 28,))            # 1 GiB of float32 zeros in about 1 MB
    assert path.stat().st_size < 8 << 20
    return path


@pytest.mark.timeout(120)
def test_an_npz_bomb_of_the_wrong_shape_is_refused_from_its_header(bomb, engine, baseline):
    refused(bomb, "input `A` must have rank 2 (shape [4, 8]), got shape [268435456]", expected=SIGNATURE)
    run = xgrun(engine, "--inputs", bomb)
    assert_refused(run, "must have rank 2")
    assert run.peak_rss < baseline + MEMORY_SLACK


@pytest.mark.timeout(60)
def test_an_npz_bomb_over_the_memory_budget_is_refused_from_its_header(bomb):
    refused(bomb, "declare more than 100000000 bytes", max_bytes=100_000_000)


@pytest.mark.timeout(60)
def test_an_unknown_input_is_refused_before_it_is_inflated(bomb):
    refused(bomb, "unknown input `A`", expected={"X": ("float32", (4,))})


def _patch_sizes(data: bytes, file_size: int) -> bytes:
    """The zip with its one member's uncompressed size rewritten in the local and central headers."""
    out = bytearray(data)
    local = out.index(b"PK\x03\x04")
    struct.pack_into("<I", out, local + 22, file_size)
    central = out.index(b"PK\x01\x02")
    struct.pack_into("<I", out, central + 24, file_size)
    return bytes(out)


def test_a_zip_member_smaller_than_its_npy_header_says_is_refused(tmp_path):
    # The .npy header claims 10^8 floats; the zip says (truthfully) the member holds 128 bytes.
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": "<f4", "fortran_order": False, "shape": (10**8,)})
    path = tmp_path / "lie.npz"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("A.npy", buf.getvalue() + bytes(64))
    refused(path, "array 'A' is float32[100000000] by its header, 400000000 bytes, but its zip entry holds 64")


def test_a_zip_member_claiming_more_than_it_inflates_to_is_refused(tmp_path):
    # Header and zip agree on 400 MB; the deflated data holds 64 bytes: zipfile stops at the end of
    # the data, and nothing close to 400 MB is ever held.
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": "<f4", "fortran_order": False, "shape": (10**8,)})
    member = buf.getvalue() + bytes(64)
    raw = io.BytesIO()
    with zipfile.ZipFile(raw, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("A.npy", member)
    path = tmp_path / "lie.npz"
    path.write_bytes(_patch_sizes(raw.getvalue(), len(buf.getvalue()) + 4 * 10**8))
    refused(path, "is not a valid .npz archive")


@pytest.mark.filterwarnings("ignore:Duplicate name")
def test_duplicate_names_are_refused(tmp_path):
    path = tmp_path / "dup.npz"
    with zipfile.ZipFile(path, "w") as zf:
        for _ in range(2):
            with zf.open("A.npy", "w") as out:
                np.lib.format.write_array(out, np.ones(2, np.float32))
    refused(path, "name 'A' appears twice")


def test_a_safetensors_header_declaring_a_huge_tensor_is_refused(tmp_path):
    header = b'{"A":{"dtype":"F32","shape":[1000000000],"data_offsets":[0,4000000000]}}'
    path = tmp_path / "huge.safetensors"
    path.write_bytes(len(header).to_bytes(8, "little") + header + bytes(16))
    refused(path, "its header accounts for 4000000080 bytes, but the file has 96")


def test_a_safetensors_header_of_the_wrong_shape_is_refused_before_its_data(tmp_path):
    path = tmp_path / "wrong.safetensors"
    path.write_bytes(safetensors.torch.save({"A": torch.ones(40, 8)}))
    refused(path, "must have shape [4, 8], got [40, 8] (dimension 0 must be 4)", expected=SIGNATURE)


@pytest.mark.parametrize("header, needle", [
    (b"[" * 50_000 + b"]" * 50_000, "nests 50000 levels deep"),
    (b'{"A":{"dtype":"F32","shape":[-4],"data_offsets":[0,0]}}', "dim -4 is outside"),
    (b'{"A":{"dtype":"F32","shape":[1.5],"data_offsets":[0,0]}}', "is not an integer"),
    (b'{"A":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}}', "malformed data offsets"),
])
def test_malformed_safetensors_headers_are_refused(tmp_path, header, needle):
    path = tmp_path / "bad.safetensors"
    path.write_bytes(len(header).to_bytes(8, "little") + header)
    refused(path, needle)


def _torch_bytes(obj, **kwargs) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf, **kwargs)
    return buf.getvalue()


def test_a_pt_with_compressed_records_is_refused(tmp_path):
    # torch stores records uncompressed; deflated ones could inflate to anything.
    data = _torch_bytes({"A": torch.zeros(4, 8)})
    path = tmp_path / "deflated.pt"
    with zipfile.ZipFile(io.BytesIO(data)) as src, zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as out:
        for info in src.infolist():
            out.writestr(info.filename, src.read(info))
    refused(path, "is compressed or claims more bytes than the file has")


def test_a_legacy_pt_is_refused_unread(tmp_path):
    # The legacy format allocates each storage at the size its pickle claims before reading it.
    path = tmp_path / "legacy.pt"
    path.write_bytes(_torch_bytes({"A": torch.zeros(4, 8)}, _use_new_zipfile_serialization=False))
    refused(path, "not in torch's zip format")


def test_a_meta_tensor_is_refused(tmp_path):
    path = tmp_path / "meta.pt"
    path.write_bytes(_torch_bytes({"A": torch.empty(4, 8, device="meta")}))
    refused(path, "tensor 'A' is on device meta, which holds no data")


@pytest.mark.timeout(60)
def test_xgrun_refuses_a_meta_tensor_with_one_line(tmp_path, engine):
    path = tmp_path / "meta.pt"
    path.write_bytes(_torch_bytes({"A": torch.empty(4, 8, device="meta"), "B": torch.ones(8, 2)}))
    assert_refused(xgrun(engine, "--inputs", path), "which holds no data")


@pytest.mark.parametrize("payload, needle", [
    ({"A": torch.ones(4, 8), "B": [1, 2]}, "entry 'B' is of type list"),
    ({"A": torch.ones(4, 8), "B": "text"}, "entry 'B' is of type str"),
    ([torch.ones(4, 8)], "it holds a list"),
])
def test_pickles_of_other_objects_are_refused(tmp_path, payload, needle):
    path = tmp_path / "objects.pt"
    path.write_bytes(_torch_bytes(payload))
    refused(path, needle)


def test_a_pt_storage_larger_than_its_record_is_refused(tmp_path):
    # The pickle claims a storage of 10^9 floats; its record holds 128 bytes.
    data = _torch_bytes({"A": torch.zeros(4, 8)})
    with zipfile.ZipFile(io.BytesIO(data)) as src:
        pkl = next(n for n in src.namelist() if n.endswith("data.pkl"))
        blob = src.read(pkl)
        numel = b"cpuq\x06K "                                  # BININT1 32, after the location
        assert numel in blob
        forged = blob.replace(numel, b"cpuq\x06J" + struct.pack("<i", 10**9))
        out = tmp_path / "big.pt"
        with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as dst:
            for info in src.infolist():
                dst.writestr(info, forged if info.filename == pkl else src.read(info))
    refused(out, "record size (128 bytes) does not match expected size")
