"""The hw/ profile of the GPU the GPU tests run on (they skip on a GPU XG has no profile for)."""

from __future__ import annotations

import pytest
import torch


def local_target() -> str:
    name = torch.cuda.get_device_name(0)
    for target in ("H200", "H100", "B200", "A100", "L40S"):
        if target in name:
            return target
    pytest.skip(f"no hw/ profile for {name}")
