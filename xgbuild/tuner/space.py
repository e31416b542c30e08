"""Tuning search spaces: which launch configs the tuner considers for a kernel, pruned by the GPU.

Owns the generic half of search: a problem's full space and generic fallback config (each kind's
template says what they are), pruning by the template's rules (each drop with a reason), and the
cut to the best-predicted candidates. Configs that cannot fit the chip (shared memory, registers)
are dropped here, before anything is compiled: Inductor compiles them and fails with "out of
resource: shared memory". Which of the survivors are worth timing is the cost model's
call (`predict.rank`), so `candidates` returns them best-predicted first.
"""

from __future__ import annotations

from typing import Iterable

from xgbuild.hw import GpuProfile

from ..compiler.codegen.templates import for_problem
from ..compiler.codegen.templates.base import Config, Problem, config_key
from .predict import rank


def default_config(problem: Problem) -> Config:
    """A config valid for any size on every target: the generic fallback kernel's."""
    return for_problem(problem).default_config(problem)


def full_space(problem: Problem, profile: GpuProfile | None = None) -> list[Config]:
    """Every config of the problem's kind before pruning, in a fixed order (with `profile`, those
    sized by the target too: a persistent matmul's programs)."""
    return for_problem(problem).full_space(problem, profile)


def _check_keys(problem: Problem, config: Config) -> None:
    template = for_problem(problem)
    want = set(template.params) | {"num_warps", "num_stages"}
    extra = set(config) - want
    if not want <= set(config) or not extra <= set(template.optional) or any(config[k] == 0 for k in extra):
        raise ValueError(f"a {problem.kind} config needs exactly the keys {sorted(want)}"
                         + (f" (and, when not 0, {sorted(template.optional)})" if template.optional else "")
                         + f", got {config_key(config)}")


def prune(problem: Problem, configs: Iterable[Config], profile: GpuProfile, *,
          limit: int | None = None) -> tuple[list[Config], list[tuple[Config, str]]]:
    """Split `configs` into (kept, [(dropped, reason)]), by the rules of the problem's kind.

    With `limit`, only the `limit` best survivors by predicted time are kept (spread over tile
    shapes for matmul), and kept comes back best-predicted first; without it, in input order.
    """
    rules = for_problem(problem).rules
    kept: list[Config] = []
    dropped: list[tuple[Config, str]] = []
    for config in configs:
        _check_keys(problem, config)
        reason = next((r for rule in rules if (r := rule(problem, config, profile))), None)
        if reason is None:
            kept.append(config)
        else:
            dropped.append((config, reason))
    if limit is not None:
        kept, cut = _best(problem, kept, profile, limit)
        dropped += cut
    return kept, dropped


def _best(problem: Problem, configs: list[Config], profile: GpuProfile, limit: int, split: bool = True
          ) -> tuple[list[Config], list[tuple[Config, str]]]:
    """The `limit` best configs by predicted time, best first, and the rest with a reason. The
    kind's template may take some first (matmul: spread over tile shapes and product modes)."""
    ranked = [config for _, config in rank(problem, configs, profile)]

    def best(subset: list[Config], n: int) -> list[Config]:
        return _best(problem, subset, profile, n, False)[0]

    chosen, limit = for_problem(problem).preselect(problem, ranked, limit, best, split)
    for config in ranked:
        if len(chosen) < limit:
            chosen.add(config_key(config))
    kept = [c for c in ranked if config_key(c) in chosen]
    cut = [(c, f"predicted rank {i + 1} of {len(ranked)}: outside the best {limit} kept")
           for i, c in enumerate(ranked) if config_key(c) not in chosen]
    return kept, cut


def candidates(problem: Problem, profile: GpuProfile) -> list[Config]:
    """The pruned search space for `problem` on `profile`, best-predicted first (deterministic)."""
    kept, _ = prune(problem, full_space(problem, profile), profile, limit=for_problem(problem).max_candidates)
    return kept
