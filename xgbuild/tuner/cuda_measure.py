"""Measuring candidates on a local GPU: compiled cubins launched through the CUDA driver, timed
with CUDA events (warm-up, L2 flushed before each run, median) by `measure.time_gpu`: at least
`MIN_REPS` runs, then until the median is known to +-`REL_CI` (95%) or `reps` runs; a candidate
already slower than the tuner's `stop_above` stops there. The outputs stay on the GPU, where the
tuner checks them against the float64 reference."""

from __future__ import annotations

import torch

from ..compiler.codegen.emitter import Emitted
from ..compiler.codegen.launch import bind, grid_for, holds
from ..compiler.codegen.launch_abi import Compiled, KernelPlan, Variant, arguments
from ..hw import GpuProfile
from ..runtime.cuda import KernelBinary, KernelLauncher
from ..dtypes import TORCH_DTYPES
from .jobs import Job
from .measure import cuda_gpu_model, matches_target, time_gpu
from .search import exhaustive


WARMUP = 3
MIN_REPS = 10
REL_CI = 0.01


class CudaMeasurer:
    races = True        # `measure` takes `stop_above`

    def __init__(self, device_index: int, profile: GpuProfile, reps: int = 50) -> None:
        self.device_index = device_index
        self.device = torch.device("cuda", device_index)
        self.gpu_name = cuda_gpu_model(device_index) or "?"
        self.launcher = KernelLauncher(device_index)
        self.l2 = profile.l2_bytes
        self.reps = reps

    def measure(self, job: Job, variant: Variant, config: dict, emitted: Emitted, binary: KernelBinary,
                data, stop_above: float | None = None) -> tuple[float, list[torch.Tensor]]:
        dev = torch.device("cuda", self.device_index)
        with torch.cuda.device(dev):
            value = data.value_fn(dev)
            binding = job.sites[0][0]
            outs = [torch.full(tuple(job.graph.node(n).shape), float("nan") if TORCH_DTYPES[
                job.graph.node(n).dtype].is_floating_point else 0, dtype=TORCH_DTYPES[job.graph.node(n).dtype],
                device=dev) for n in binding.outputs]          # poisoned: an unwritten element fails the check
            compiled = Compiled(variant, config, emitted.params, emitted.div16, binary)
            plan = KernelPlan(job.spec, binding, [compiled])
            launch = bind(plan, job.graph, value, outs)
            if not holds(compiled, launch, job.spec):
                raise RuntimeError("the tuning inputs break the variant's assumptions")
            grid = grid_for(compiled, job.spec, launch)
            args = arguments(compiled, launch)
            self.launcher.launch(binary, grid, args)
            torch.cuda.synchronize(dev)
            results = [o.clone() for o in outs]      # what the first run wrote, before the timed runs
            run = lambda _i: self.launcher.launch(binary, grid, args)  # noqa: E731
            if exhaustive():
                timing = time_gpu(run, reps=self.reps, l2_bytes=self.l2, device=self.device_index)
            else:
                timing = time_gpu(run, reps=self.reps, warmup=WARMUP, min_reps=MIN_REPS, rel_ci=REL_CI,
                                  stop_above=stop_above, l2_bytes=self.l2, device=self.device_index)
            return timing.median_ms, results


def local_measurers(profile: GpuProfile) -> list[CudaMeasurer]:
    """One measurer per local GPU of the target's model (none on a host without one)."""
    if not torch.cuda.is_available():
        return []
    out = []
    for i in range(torch.cuda.device_count()):
        name = cuda_gpu_model(i)
        if name and matches_target(name, profile):
            out.append(CudaMeasurer(i, profile))
    return out
