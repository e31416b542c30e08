"""XG's deploy runtime, as a library: load an engine, bind inputs, run, read outputs, with neither
torch nor Triton (`xgrun --runtime native` is its command line).

    import numpy as np
    import xg.runtime

    engine = xg.runtime.load("build/mlp.xge")              # read, sealed contents and digest verified
    result = engine.run({"X": x, "W1": w1, "B1": b1, "W2": w2})   # numpy arrays (copied to the GPU)
    y = result.to_host()["out"]                             # HostArray: .array (numpy), .dtype (XG's name)

Inputs may be numpy arrays (bfloat16 as `ml_dtypes.bfloat16`, or `HostArray(uint16 bits,
"bfloat16")`), `DeviceArray`s (a previous result's outputs: no copy), any DLPack producer's CUDA
tensor (torch, CuPy, JAX; bfloat16 included: bound in place, ordered after the producer's stream)
or any object with a CUDA Array Interface (Numba). Outputs stay on the GPU until `to_host()`; a
`DeviceArray` goes to other libraries without a copy through DLPack
(`torch.from_dlpack(result.outputs["out"])`) or `__cuda_array_interface__`. A second run
reuses the first's loaded kernels, weights and memory. `engine.check_inputs(values)` checks
inputs against the signature on the host (no GPU needed).
"""

from __future__ import annotations

from pathlib import Path

from xgbuild.runtime.device import CudaDevice, DeviceArray
from xgbuild.runtime.host_io import (HostArray, TensorIOError, load_host_tensors as load_tensors,
                                     save_host_tensors as save_tensors)
from xgbuild.runtime.native import NativeEngine as Engine, NativeResult as Result
from xgbuild.settings import RunSettings

__all__ = ["CudaDevice", "DeviceArray", "Engine", "HostArray", "Result", "TensorIOError", "load", "load_tensors",
           "save_tensors"]


def load(path: Path | str, *, trusted_keys: Path | str | None = None, expect_digest: str | None = None,
         device: int = 0) -> Engine:
    """Load and verify an engine for GPU `device` (raises `xgbuild.errors.EngineError`):
    `trusted_keys` (default: XG_TRUSTED_KEYS), a directory of `.pub` keys one of which must have
    signed it; `expect_digest`, the bundle digest it must have. The GPU is touched at the first run."""
    return Engine.load(path, RunSettings.from_env(), trusted_keys=trusted_keys, expect_digest=expect_digest,
                       device_index=device)
