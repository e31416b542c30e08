"""The cost model: a deterministic roofline estimate of one config's run time on one GPU.

Owns: the ceilings a prediction uses (measured copy bandwidth where the profile has it, else the
datasheet's; the FLOP/s ceiling is the kernel kind's, from its template), the roofline floor,
`predict_ms` and `rank`. Each kind's own model (`KernelTemplate.seconds`, built on
`templates/roofline.py`) counts the bytes a config really moves, whether enough loads are in
flight to reach full bandwidth and how tiles quantize into waves over the SMs; this adds ~3 us
per launch, and every prediction is at least `floor_ms`. Pure: no clock, no randomness.
"""

from __future__ import annotations

from xgbuild.hw import GpuProfile

from ..compiler.codegen.templates import for_problem
from ..compiler.codegen.templates.base import Config, Problem
from ..compiler.codegen.templates.roofline import Ceilings

LAUNCH_MS = 0.003


def ceilings(problem: Problem, profile: GpuProfile, config: Config | None = None) -> Ceilings:
    """The bandwidth and FLOP/s ceilings for `problem` on `profile` (under `config`: a 3xTF32
    matmul runs three TF32 tensor-core products per useful one)."""
    bandwidth = profile.measured.copy_bandwidth_bytes_per_s or profile.hbm_bandwidth_bytes_per_s
    return Ceilings(bandwidth, for_problem(problem).peak_flops(problem, profile, config))


def floor_ms(problem: Problem, profile: GpuProfile, config: Config | None = None) -> float:
    """The roofline floor: max(flops / peak, bytes / bandwidth), in milliseconds."""
    top = ceilings(problem, profile, config)
    return 1e3 * max(problem.flops / top.flops, problem.bytes / top.bandwidth)


def predict_ms(problem: Problem, config: Config, profile: GpuProfile) -> float:
    """Predicted run time of `problem` under `config` on `profile`, in ms (>= `floor_ms`)."""
    top = ceilings(problem, profile, config)
    seconds = for_problem(problem).seconds(problem, config, profile, top)
    return max(1e3 * seconds, floor_ms(problem, profile, config)) + LAUNCH_MS


def tie_break(problem: Problem, config: Config) -> tuple:
    """How configs the model predicts equal are ordered (the kind's template says)."""
    return for_problem(problem).tie_break(problem, config)


def rank(problem: Problem, configs: list[Config], profile: GpuProfile
         ) -> list[tuple[float, Config]]:
    """(predicted ms, config) for each config, fastest first; ties broken by `tie_break`."""
    scored = [(predict_ms(problem, c, profile), tie_break(problem, c), c) for c in configs]
    scored.sort(key=lambda t: (t[0], t[1]))
    return [(ms, c) for ms, _, c in scored]
