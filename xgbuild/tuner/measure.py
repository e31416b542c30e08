"""GPU timing: median run time of a launch with a cold L2, and which GPU the timing was taken on.

Owns: `time_gpu` (CUDA events around each run, L2 flushed before every timed run, inputs rotated
so that sets larger than L2 are not served from it), `cuda_gpu_model` and `matches_target`, which
keep the tuner from recording a measurement taken on one GPU model as another model's.

torch is imported inside the functions that need it, so this module imports on a CPU-only host
and costs nothing until something is timed.
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass
from typing import Callable

from xgbuild.hw import GpuProfile


@dataclass(frozen=True)
class Timing:
    """Run-time statistics of `reps` timed runs, in milliseconds."""

    median_ms: float
    p10_ms: float
    p90_ms: float
    reps: int


def _quantile(ordered: list[float], q: float) -> float:
    """The q-quantile of an ascending list, interpolating linearly between neighbours."""
    position = q * (len(ordered) - 1)
    low, high = math.floor(position), math.ceil(position)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def summarize(times_ms: list[float]) -> Timing:
    """Median, 10th and 90th percentile of `times_ms`."""
    if not times_ms:
        raise ValueError("no times to summarize")
    ordered = sorted(times_ms)
    return Timing(median_ms=_quantile(ordered, 0.5), p10_ms=_quantile(ordered, 0.1),
                  p90_ms=_quantile(ordered, 0.9), reps=len(ordered))


def median_ci(ordered: list[float], z: float = 1.96) -> tuple[float, float]:
    """A distribution-free confidence interval of the median of an ascending sample (order
    statistics at n/2 -+ z*sqrt(n)/2, the binomial's normal approximation)."""
    n = len(ordered)
    half = z * math.sqrt(n) / 2
    lo, hi = max(0, math.floor(n / 2 - half)), min(n - 1, math.ceil(n / 2 + half) - 1)
    return ordered[lo], ordered[hi]


def settled(times_ms: list[float], rel: float) -> bool:
    """Whether the median of `times_ms` is known to within +-`rel` of itself (95% interval)."""
    ordered = sorted(times_ms)
    lo, hi = median_ci(ordered)
    mid = _quantile(ordered, 0.5)
    return mid > 0 and (hi - lo) / 2 <= rel * mid


# The GPU is held busy while a batch of timed runs is enqueued, so that no run waits on the host:
# a start event recorded on an idle GPU would time the host's launch too (a 4 us kernel measured
# 12-16 us while the build's compile processes kept the host's CPUs busy).
HOLD_FACTOR = 1.25      # x the host's time to enqueue the batch (the last batch's, or a warm-up's),
                        # less the GPU time of the runs that follow the first (the median so far)
HOLD_S = 50e-6
HOLD_MAX_S = 0.02
_CYCLES_PER_S: dict[int, float] = {}


def _hold(torch, device: int, seconds: float) -> None:
    """Enqueue a spin of about `seconds` on the current stream (`torch.cuda._sleep`, in GPU clock
    cycles, calibrated once per device with events); nothing where torch lacks it."""
    sleep = getattr(torch.cuda, "_sleep", None)
    if sleep is None:
        return
    rate = _CYCLES_PER_S.get(device)
    if rate is None:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        sleep(1_000_000)
        end.record()
        torch.cuda.synchronize()
        rate = _CYCLES_PER_S[device] = 1e6 / max(start.elapsed_time(end) / 1e3, 1e-6)
    sleep(int(min(seconds, HOLD_MAX_S) * rate))


def time_gpu(launch: Callable[[int], None], *, rotations: int = 1, warmup: int = 5, reps: int = 50,
             l2_bytes: int = 64 << 20, device: int = 0, min_reps: int | None = None, rel_ci: float = 0.0,
             stop_above: float | None = None, batch: int = 5) -> Timing:
    """Time `launch` on CUDA device `device`; `launch(s)` enqueues one run on input set `s`.

    Run i uses input set i % rotations. Before each timed run a buffer of 2 * `l2_bytes` is
    zeroed, so the run starts with nothing of its inputs in L2; CUDA events bracket the launch
    alone, not the flush, and each batch of runs is enqueued behind a GPU spin (`_hold`) that
    outlasts its enqueueing, so the events time the GPU's work and not the host's.

    Adaptive when `min_reps` is given: after `min_reps` runs, and every `batch` runs after, it
    stops once the median's 95% interval is within +-`rel_ci` of it, or (`stop_above`) once the
    fastest run so far is slower than `stop_above` ms: a candidate that cannot win needs no
    precise time. At most `reps` runs either way.
    """
    if rotations < 1 or reps < 1 or warmup < 0 or l2_bytes < 1:
        raise ValueError(f"time_gpu needs rotations >= 1, reps >= 1, warmup >= 0, l2_bytes >= 1; "
                         f"got {rotations}, {reps}, {warmup}, {l2_bytes}")
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("time_gpu needs a CUDA device; torch sees none")
    first = reps if min_reps is None else max(1, min(min_reps, reps))
    with torch.cuda.device(device):
        flush = torch.empty(2 * l2_bytes, dtype=torch.uint8, device="cuda")
        per_run = 0.0               # host seconds to enqueue one timed run (flush, events, launch)
        for i in range(warmup):
            t = time.perf_counter()
            launch(i % rotations)
            per_run = time.perf_counter() - t       # the last warm-up's: the first loads modules
        times: list[float] = []
        torch.cuda.synchronize()
        while len(times) < reps:
            n = first if not times else min(batch, reps - len(times))
            starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
            ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
            # Enough spin that the GPU, running each run as it arrives, never waits on the host.
            gpu_run = sorted(times)[len(times) // 2] / 1e3 if times else 0.0
            _hold(torch, device, max(0.0, HOLD_FACTOR * n * per_run - (n - 1) * gpu_run) + HOLD_S)
            t = time.perf_counter()
            for i in range(n):
                flush.zero_()
                starts[i].record()
                launch((warmup + len(times) + i) % rotations)
                ends[i].record()
            per_run = (time.perf_counter() - t) / n
            torch.cuda.synchronize()
            times += [start.elapsed_time(end) for start, end in zip(starts, ends, strict=True)]
            if min_reps is None:
                continue
            if stop_above is not None and min(times) > stop_above:
                break
            if rel_ci > 0 and settled(times, rel_ci):
                break
        return summarize(times)


def cuda_gpu_model(device: int) -> str | None:
    """The device's name ("NVIDIA H100 80GB HBM3"); None without torch, CUDA or that device."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available() or not 0 <= device < torch.cuda.device_count():
        return None
    return torch.cuda.get_device_name(device)


def _normal(name: str) -> str:
    """Comparison form of a GPU name: case-folded, no spaces, '-' or '_', no leading "nvidia"."""
    return re.sub(r"[\s_-]+", "", name).casefold().removeprefix("nvidia")


def matches_target(device_name: str, profile: GpuProfile) -> bool:
    """Whether a device of this name is the GPU model `profile` describes.

    The whole name must equal the profile's name or one of its aliases (ignoring case, spaces,
    '-', '_' and a leading "NVIDIA"): "NVIDIA H100 80GB HBM3" is the H100 profile, but neither
    "NVIDIA H200" nor "NVIDIA H100 PCIe" (fewer SMs, less bandwidth) is. A model with no alias
    for its device name is not matched, and gets predicted instead of measured.
    """
    device = _normal(device_name)
    return bool(device) and any(device == _normal(label)
                                for label in (profile.name, *profile.aliases))
