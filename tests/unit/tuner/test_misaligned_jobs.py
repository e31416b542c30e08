"""A job whose operand is a view at an offset that is not a multiple of 16 bytes (a shifted window
of its input, as a convolution imported as a matmul per tap read) gets a tuned variant that does not
assume aligned pointers: measuring it on its own tuning inputs must hold, or every candidate fails
and the build with it (Whisper's and ResNet's convolutions under `--tune=measure`)."""

from __future__ import annotations

import torch

from xgbuild.compiler.codegen.launch import bind, holds
from xgbuild.compiler.codegen.launch_abi import Compiled, KernelPlan
from xgbuild.compiler.codegen.templates import emit
from xgbuild.compiler.importers.torch_export import import_torch
from xgbuild.dtypes import TORCH_DTYPES
from xgbuild.tuner.jobfile import job_from_json, job_to_json
from xgbuild.tuner.jobs import plan, tuning_env
from xgbuild.tuner.space import default_config
from xgbuild.tuner.jobdata import JobData


class Shifted(torch.nn.Module):
    """A product over a window of its input shifted by one element (what a convolution imported as
    a matmul per tap read; convolutions now gather their windows): B is x[:, :, 1:], 2 bytes off."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(16, 8))

    def forward(self, x):
        return torch.relu(self.w @ x[:, :, 1:])


def _jobs(dtype: torch.dtype) -> list:
    torch.manual_seed(0)
    imported = import_torch(Shifted().to(dtype), (torch.randn(2, 8, 41, dtype=dtype),))
    g = imported.optimized.main
    return plan(g, tuning_env(g, {}))[0]


def _holds_on_tuning_inputs(job) -> bool:
    value = JobData(job).value_fn("cpu")
    binding = job.sites[0][0]
    outs = [torch.empty(tuple(job.graph.node(n).shape), dtype=TORCH_DTYPES[job.graph.node(n).dtype])
            for n in binding.outputs]
    cfg = default_config(job.problem)
    variant = job.fast_variant(cfg)
    em = emit(job.spec, cfg, variant)
    compiled = Compiled(variant, cfg, em.params, em.div16, None)
    return holds(compiled, bind(KernelPlan(job.spec, binding, [compiled]), job.graph, value, outs), job.spec)


def test_a_shifted_window_job_is_tuned_without_the_alignment_assumption() -> None:
    jobs = _jobs(torch.bfloat16)
    shifted = [j for j in jobs if j.misaligned]
    assert shifted, "the product reads its input at a 2-byte offset"
    for job in jobs:
        assert job.fast_variant(default_config(job.problem)).aligned is not job.misaligned
        assert _holds_on_tuning_inputs(job), job.ident
    assert all(j.ident.endswith(":u") for j in shifted)
    assert all(j.shape_part().get("misaligned") is True for j in shifted)
    assert not any("misaligned" in j.shape_part() for j in jobs if not j.misaligned)


def test_the_flag_survives_a_job_file() -> None:
    for job in _jobs(torch.bfloat16):
        back = job_from_json(job_to_json(job))
        assert back.misaligned == job.misaligned and back.ident == job.ident
