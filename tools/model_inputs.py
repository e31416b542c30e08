"""Writes a valid first-step input file for models/train.xg (GPT-2), models/train_tiny.xg or
models/infer.xg engines.

Parameters are scaled normal draws (norm gains 1, GPT-2's biases 0), optimizer moments zero,
STEP 1, LR 0.01, tokens from the synthetic "next token" task. Deterministic for a given --seed.

    python tools/model_inputs.py ENGINE.xge OUT.safetensors [--seed N]
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch

from xgbuild.errors import XGError
from xgbuild.runtime.engine import Engine
from xgbuild.runtime.tensor_io import TORCH_DTYPES, TensorIOError, save_tensors


def first_step_inputs(engine: Engine, seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    out: dict[str, torch.Tensor] = {}
    for spec in engine.signature:
        name, shape, dtype = spec["name"], tuple(spec["shape"]), TORCH_DTYPES[spec["dtype"]]
        if any(not isinstance(d, int) for d in shape):
            raise XGError(f"input `{name}` has symbolic shape {list(shape)}; this tool needs a fixed-size model")
        if name in ("TOKENS", "TARGETS"):
            vocab = next(s["shape"][0] for s in engine.signature if s["name"] in ("EMB", "WTE"))
            rows = math.prod(shape[:-1])           # [T] (tiny) or [B, T] (GPT-2): one sequence a row
            start = torch.randint(0, vocab, (rows, 1), generator=gen)
            seq = (start + torch.arange(shape[-1] + 1)) % vocab
            out[name] = (seq[:, :-1] if name == "TOKENS" else seq[:, 1:]).reshape(shape)
        elif name == "STEP":
            out[name] = torch.tensor(1.0, dtype=dtype)
        elif name == "LR":
            out[name] = torch.tensor(0.01, dtype=dtype)
        elif name.startswith(("M_", "V_")):
            out[name] = torch.zeros(shape, dtype=dtype)
        elif name.endswith("_G") or len(shape) == 1 and not _is_bias(name):
            out[name] = torch.ones(shape, dtype=dtype)
        elif _is_bias(name):
            out[name] = torch.zeros(shape, dtype=dtype)
        else:
            out[name] = (torch.randn(shape, generator=gen, dtype=torch.float64) / math.sqrt(shape[0])).to(dtype)
    return out


def _is_bias(name: str) -> bool:
    """GPT-2's biases: LN1_B, BQKV, BO, B1, ... (models/train.xg)."""
    return name.endswith("_B") or (name.startswith("B") and name[1:2] in ("Q", "O", "1", "2"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("engine", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    try:
        save_tensors(args.out, first_step_inputs(Engine.load(args.engine), args.seed))
    except (XGError, TensorIOError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
