"""The deploy runtime's tensor files (`runtime/host_io.py`, numpy only) against the torch-backed
ones (`tensor_io`): the same bytes written for the same tensors (`.safetensors` as the safetensors
library lays it out, `.npz`), the same bits read back either way, the same checksums; bfloat16
rounding as torch's; random inputs seeded and stable."""

from __future__ import annotations

import numpy as np
import pytest
import safetensors.torch
import torch

from xgbuild.runtime.host_io import (HostArray, TensorIOError, bf16_bits, describe_host, float_view, load_host_tensors,
                                     random_host_inputs, safetensors_bytes, save_host_tensors)
from xgbuild.runtime.tensor_io import describe, load_tensors, save_tensors

DTYPES = ["bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32", "float64"]


def _pair(rng: np.random.Generator, dtype: str, shape: tuple) -> tuple[torch.Tensor, HostArray]:
    t = torch.from_numpy(np.asarray(rng.standard_normal(shape) * 50)).to(getattr(torch, dtype))
    bits = t.view(torch.int16).numpy().view(np.uint16) if dtype == "bfloat16" else t.numpy()
    return t, HostArray(np.asarray(bits).copy(order="C"), dtype)


def _mixed(rng):
    tensors, hosts = {}, {}
    for i, dtype in enumerate(DTYPES):
        shape = tuple(int(x) for x in rng.integers(0 if i == 3 else 1, 5, size=int(rng.integers(0, 4))))
        tensors[f"t{i}"], hosts[f"t{i}"] = _pair(rng, dtype, shape)
    return tensors, hosts


def test_safetensors_bytes_are_the_librarys() -> None:
    rng = np.random.default_rng()
    for _ in range(5):
        tensors, hosts = _mixed(rng)
        assert safetensors_bytes(hosts) == safetensors.torch.save(tensors)


def test_files_round_trip_between_the_runtimes(tmp_path) -> None:
    rng = np.random.default_rng()
    tensors, hosts = _mixed(rng)
    for suffix in (".safetensors", ".npz"):
        keep = {k: v for k, v in hosts.items() if suffix != ".npz" or v.dtype != "bfloat16"}
        keep_t = {k: tensors[k] for k in keep}
        save_host_tensors(tmp_path / f"h{suffix}", keep)
        save_tensors(tmp_path / f"t{suffix}", keep_t)
        assert (tmp_path / f"h{suffix}").read_bytes() == (tmp_path / f"t{suffix}").read_bytes()
        back = load_host_tensors(tmp_path / f"t{suffix}")
        assert sorted(back) == sorted(load_tensors(tmp_path / f"h{suffix}")) == sorted(keep)
        for k, v in back.items():
            assert v.dtype == keep[k].dtype and np.array_equal(v.array, keep[k].array)
            assert describe_host(v) == describe(keep_t[k])
    with pytest.raises(TensorIOError, match="bfloat16, which .npz cannot store"):
        save_host_tensors(tmp_path / "x.npz", {"b": hosts["t7"]})
    with pytest.raises(TensorIOError, match="needs torch"):
        load_host_tensors(tmp_path / "x.pt")
    (tmp_path / "bad.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}      ")
    with pytest.raises(TensorIOError, match="is not a valid safetensors file"):
        load_host_tensors(tmp_path / "bad.safetensors")
    with pytest.raises(TensorIOError, match="dtype float32, the engine expects bfloat16"):
        load_host_tensors(tmp_path / "h.safetensors", expected={"t8": ("bfloat16", (None,) * hosts["t8"].array.ndim),
                                                                **{k: (v.dtype, (None,) * v.array.ndim)
                                                                   for k, v in hosts.items() if k != "t8"}})


def test_bfloat16_rounding_is_torchs() -> None:
    rng = np.random.default_rng()
    x = (rng.standard_normal(10000) * 10.0 ** rng.integers(-30, 30, 10000)).astype(np.float32)
    x[:4] = [np.inf, -np.inf, 0.0, -0.0]
    want = torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    assert np.array_equal(bf16_bits(x), want)
    assert np.isnan(float_view(HostArray(bf16_bits(np.array([np.nan], np.float32)), "bfloat16"))).all()
    assert np.array_equal(float_view(HostArray(want, "bfloat16")),
                          torch.from_numpy(x).to(torch.bfloat16).float().numpy())


def test_random_inputs_are_seeded() -> None:
    sig = {"x": ("bfloat16", (4, 8)), "i": ("int64", (6,)), "b": ("bool", (3,))}
    a, b = random_host_inputs(sig, 3, {"i": (0, 5)}), random_host_inputs(sig, 3, {"i": (0, 5)})
    assert all(np.array_equal(a[k].array, b[k].array) for k in sig)
    assert not np.array_equal(a["x"].array, random_host_inputs(sig, 4)["x"].array)
    assert a["i"].array.min() >= 0 and a["i"].array.max() < 5 and a["x"].array.dtype == np.uint16
