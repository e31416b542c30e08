"""The tuner's correctness gate: whether a candidate kernel's outputs are right.

Each output is compared with the float64 reference of its job (`jobdata.JobData.reference`): a float
output within its dtype's tolerance by relative error (`TOLERANCE`, the dtype the kernel rounds to
least precisely: `gate_dtypes`), any other output exactly. An output off by more still passes when
eager PyTorch, computing the same ops in the program's dtypes, is nearly as far off (within
`ILL_CONDITIONED_SLACK` of its error): the job's random inputs made the result ill-conditioned
(AdamW's update divides by the root of a second moment drawn from randn, near zero somewhere in
GPT-2's 38M-element embedding: every candidate 4.6e-3 off, eager float32 itself 3.6e-3), and no
kernel in those dtypes can do better than rounding as eager does. Past that, the elements where
eager itself is off by more than the tolerance (the ill-conditioned ones: a second moment whose
float32 sum lands below zero where float64's does not, a root of a negative in one and not the
other) are set aside, and the candidate must match the reference on the rest, at least
MIN_CONDITIONED of them: a kernel contracting `0.95 v + 0.05 g^2` into one FMA took the root of
a negative where eager did not, and one NaN made its error NaN against eager's 8.9e3.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch

from ..dtypes import FLOAT_DTYPES

TOLERANCE = {"float64": 1e-9, "float32": 1e-4, "float16": 5e-3, "bfloat16": 2e-2}
# A candidate off the float64 reference by more than its dtype's tolerance passes when within this
# factor of eager's own error in the program's dtypes (a kernel's approximate square root and
# reassociated sums may round differently, on ill-conditioned data as much as eager, not 4x more).
ILL_CONDITIONED_SLACK = 4.0
# The least fraction of an output's elements (of those with a finite reference) eager must get
# right for the rest to be set aside as ill-conditioned.
MIN_CONDITIONED = 0.99


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| over the reference's finite elements, in float64."""
    o, r = out.to(ref.device).double(), ref.double()
    finite = torch.isfinite(r)
    if not bool(finite.all()):
        if not finite.any():
            return 0.0
        o, r = o[finite], r[finite]
    num, den = torch.stack([(o - r).norm(), r.norm()]).tolist()
    return num / max(den, 1e-30)


def gate_dtypes(spec) -> list[str]:
    """The dtype whose tolerance each of a kernel's outputs is held to: a float output, to the least
    precise float the kernel rounds to anywhere (the float64 reference rounds nowhere, so a bf16
    product cast to a float32 output, as Llama's residual before its norm, carries bf16's error);
    any other output, to its own dtype (exact)."""
    rounded = [n.dtype for n in spec.nodes if n.dtype in TOLERANCE]
    out = []
    for k in spec.outputs:
        dtype = spec.nodes[k].dtype
        out.append(max([dtype] + rounded, key=TOLERANCE.__getitem__) if dtype in TOLERANCE else dtype)
    return out


def _check(out: torch.Tensor, ref: torch.Tensor, dtype: str) -> tuple[str | None, float | None]:
    """(why `out` is wrong or None, and for a float output past its tolerance, its error: NaN
    for NaNs where the reference has none)."""
    if tuple(out.shape) != tuple(ref.shape):
        return f"shape {tuple(out.shape)} != {tuple(ref.shape)}", None
    if dtype in FLOAT_DTYPES:
        o, r = out.to(ref.device).double(), ref.double()
        if bool(torch.isnan(o).any() != torch.isnan(r).any()):
            return "NaN where the reference has none", math.nan     # (eager may have it there too)
        err = rel_error(o, r)
        if not math.isfinite(err) or err > TOLERANCE[dtype]:
            return f"relative error {err:.3g} > {TOLERANCE[dtype]:g}", err
        return None, None
    wrong = (out.to(ref.device, ref.dtype) != ref).double().mean().item() if out.numel() else 0.0
    return (None if wrong <= 1e-3 else f"{wrong:.2%} of elements differ"), None


def agrees(out: torch.Tensor, ref: torch.Tensor, dtype: str) -> str | None:
    """None when `out` matches the float64 reference within the dtype's tolerance, else why not."""
    return _check(out, ref, dtype)[0]


def conditioned(eager: torch.Tensor, ref: torch.Tensor, dtype: str) -> torch.Tensor | None:
    """The elements where eager in the program's dtypes is within `dtype`'s tolerance of the
    float64 reference (relative to each element; the reference finite), when they are at least
    MIN_CONDITIONED of those with a finite reference; else None (the data judges nothing)."""
    e, r = eager.to(ref.device).double(), ref.double()
    finite = torch.isfinite(r)
    good = finite & torch.isfinite(e) & ((e - r).abs() <= TOLERANCE[dtype] * r.abs())
    total = int(finite.sum())
    return good if total and int(good.sum()) >= MIN_CONDITIONED * total else None


def disagrees(outs: list[torch.Tensor], ref: list[torch.Tensor], dtypes: list[str],
              eager: Callable[[], tuple[list[float], list[torch.Tensor]]]) -> str | None:
    """Why a candidate's outputs are wrong, or None: `agrees` for each, except that an output
    past its tolerance passes within ILL_CONDITIONED_SLACK of eager's own error on the same data,
    or matching the reference where eager does (`conditioned`). `eager()`: eager's errors and
    outputs, per output, asked for only when one is past its tolerance."""
    for i, (o, r, d) in enumerate(zip(outs, ref, dtypes)):
        why, err = _check(o, r, d)
        if why is None:
            continue
        if err is None:
            return why
        bars, values = eager()
        if err <= ILL_CONDITIONED_SLACK * bars[i]:
            continue
        kept = conditioned(values[i], r, d) if tuple(values[i].shape) == tuple(r.shape) else None
        if kept is None or _check(o.to(r.device)[kept], r[kept], d)[0] is not None:
            return f"{why} (eager in the program's dtypes: {bars[i]:.3g})"
    return None


class EagerError:
    """The error PyTorch eager makes on a job's data in the program's own dtypes (float32: exact
    products, float32 sums), per output, and its outputs: the bar an ill-conditioned output and a
    reduced-precision (3xTF32) candidate must clear. Computed once per job, on first use."""

    def __init__(self) -> None:
        # (the job's data, its errors, eager's outputs or None): the data itself is held, since an
        # id() of data freed would come back for the next job's and hand it this job's errors.
        # The outputs are kept only when asked for (`with_outputs`): the 3xTF32 gate needs the
        # errors alone, and a large product's output is gigabytes.
        self.cache: tuple[Any, list[float], list[torch.Tensor] | None] | None = None

    def __call__(self, data: Any, ref: list[torch.Tensor], device) -> list[float]:
        return self._known(data, ref, device, False)[1]

    def with_outputs(self, data: Any, ref: list[torch.Tensor], device) -> tuple[list[float], list[torch.Tensor]]:
        _, errors, outputs = self._known(data, ref, device, True)
        return errors, outputs

    def _known(self, data: Any, ref: list[torch.Tensor], device, outputs: bool) -> tuple:
        known = self.cache                  # read once: tuning threads may replace it
        if known is None or known[0] is not data or (outputs and known[2] is None):
            ref32 = data.reference(device, float64=False)
            known = self.cache = (data, [rel_error(a, r) for a, r in zip(ref32, ref)],
                                  list(ref32) if outputs else None)
        return known
