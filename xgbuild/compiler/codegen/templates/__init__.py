"""The kernel-template registry: one `KernelTemplate` per kernel kind; `KINDS` are their names.

Codegen, the tuner and the runtime look a kind's code, launch ABI, search space and cost model up
here rather than switching on the kind. Adding a kernel kind is its template module plus one line
in `TEMPLATES` (a unit test checks that every kind has a complete template).
"""

from __future__ import annotations

from ..emitter import Emitted, Emitter
from ..kernel import Kernel, Schedule
from ..launch_abi import Variant
from ..spec import Binding, KernelSpec
from . import attention, elementwise, flash, matmul, rowwise, scatter
from .base import KernelTemplate, Problem

TEMPLATES: dict[str, KernelTemplate] = {t.kind: t for t in (
    elementwise.TEMPLATE,
    rowwise.TEMPLATE,
    matmul.TEMPLATE,
    attention.TEMPLATE,
    flash.TEMPLATE,
    scatter.TEMPLATE,
)}
KINDS = tuple(TEMPLATES)


def template(kind: str) -> KernelTemplate:
    """The template of kernel kind `kind`; ValueError for a kind XG has none for."""
    try:
        return TEMPLATES[kind]
    except KeyError:
        raise ValueError(f"unknown kernel kind {kind!r}; expected one of {', '.join(KINDS)}") from None


def for_problem(problem: Problem) -> KernelTemplate:
    """The template of `problem`'s kind, once the problem has every size that kind needs."""
    t = template(problem.kind)
    t.check(problem)
    return t


def make_spec(sched: Schedule, k: Kernel) -> tuple[KernelSpec, Binding]:
    """The spec of scheduled kernel `k` and its binding to `sched.graph`."""
    return template(k.kind).spec(sched, k)


def kernel_specs(sched: Schedule) -> list[tuple[KernelSpec, Binding]]:
    """The spec and binding of each of the schedule's kernels (a PyTorch operator has none)."""
    return [make_spec(sched, k) for k in sched.kernels if not k.extern]


def emit(spec: KernelSpec, config: dict[str, int], variant: Variant) -> Emitted:
    """The Triton source of `spec` under one tuning config and one variant."""
    return template(spec.kind).emit(Emitter(spec, config, variant))
