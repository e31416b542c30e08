"""Weights inside an engine: one `weights.safetensors` entry, written canonically.

Imported models carry their parameters and buffers as graph INPUTs that the engine binds itself.
The blob is a pure function of the tensors (names sorted, contiguous copies, no metadata), so the
same model and weights give the same engine bytes; the manifest names it by its sha256.
"""

from __future__ import annotations

import torch
from safetensors.torch import load as _load
from safetensors.torch import save as _save

from .manifest import sha256

PATH = "weights.safetensors"


def weights_blob(tensors: dict[str, torch.Tensor]) -> tuple[bytes, dict]:
    """The safetensors bytes and the manifest's `weights` entry for `tensors`."""
    # Copies: safetensors refuses tensors that share memory (tied weights) or are not contiguous.
    ordered = {name: tensors[name].detach().cpu().contiguous().clone() for name in sorted(tensors)}
    blob = _save(ordered)
    entry = {"path": PATH, "sha256": sha256(blob),
             "tensors": [{"name": n, "dtype": str(t.dtype).rsplit(".", 1)[-1], "shape": list(t.shape)}
                         for n, t in ordered.items()]}
    return blob, entry


def load_weights(blob: bytes) -> dict[str, torch.Tensor]:
    return _load(blob)
