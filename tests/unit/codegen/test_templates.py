"""The kernel-template registry: every kernel kind has one complete template, and the launch ABI
and the tuner reach each kind through it."""

from __future__ import annotations

import inspect
import re

import pytest

from xgbuild.compiler.codegen import schedule
from xgbuild.compiler.codegen.templates import KINDS, TEMPLATES, for_problem, template
from xgbuild.compiler.codegen.templates.base import KernelTemplate, Problem


def test_every_kind_the_scheduler_makes_has_a_template():
    """The scheduler's kernels are of registered kinds (or PyTorch operators' steps)."""
    made = set(re.findall(r'Kernel\("(\w+)"', inspect.getsource(schedule)))
    assert made - {"extern"} == set(KINDS)
    assert all(TEMPLATES[k].kind == k for k in KINDS)


@pytest.mark.parametrize("kind", KINDS)
def test_template_is_complete(kind):
    t = TEMPLATES[kind]
    assert isinstance(t, KernelTemplate)
    assert t.kind == kind
    # Every abstract method of the interface is implemented (an abstract one left would also make
    # the template module fail to import: its instance could not be made).
    assert not type(t).__abstractmethods__
    for name in KernelTemplate.__abstractmethods__:
        method = getattr(type(t), name)
        assert method is not getattr(KernelTemplate, name), f"{kind} template lacks `{name}`"
        assert inspect.signature(method).parameters.keys() == \
            inspect.signature(getattr(KernelTemplate, name)).parameters.keys(), f"{kind}.{name}'s parameters"
    # The attributes the tuner reads: config keys, the problem's sizes, pruning rules.
    assert t.params and t.sizes and t.rules and t.max_candidates > 0
    assert all(name in Problem.__dataclass_fields__ for name in t.sizes)


def test_unknown_kind_and_missing_sizes_are_refused():
    with pytest.raises(ValueError, match="unknown kernel kind 'conv'"):
        template("conv")
    with pytest.raises(ValueError, match="needs dv >= 1"):
        for_problem(Problem("attention", "bfloat16", 1.0, 1.0, m=4, n=4, k=4, elem_bytes=2))


@pytest.mark.parametrize("kind", KINDS)
def test_default_config_is_in_the_kinds_keys(kind):
    t = TEMPLATES[kind]
    sizes = {name: 64 for name in t.sizes}
    p = Problem(kind, "float32", 1.0, 1.0, **sizes)
    assert set(t.default_config(p)) == set(t.params) | {"num_warps", "num_stages"}
    assert all(set(c) == set(t.params) | {"num_warps", "num_stages"} for c in t.full_space(p))
