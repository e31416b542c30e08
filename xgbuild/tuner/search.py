"""Which of a job's candidates are compiled and measured, in what order, and when measuring stops.

Owns `Search`, the pure half of a measured tuning job: no GPU, no clock. Candidates come ranked by
the cost model (`predict.rank`, best first). A seed, the winner of a neighbouring shape of the
same kernel, goes first when it is a candidate here. Then the model's order, and the search
stops as soon as no unmeasured candidate can still win by its predicted bound:

- every measurement gives a ratio measured / predicted; the smallest ratio seen so far, times
  `margin`, is the most the model has been too pessimistic on this job (`optimism`);
- an unmeasured candidate predicted at p could run in p * optimism at best; when that is not
  below the best time measured, it cannot win, and neither can any candidate after it (they are
  predicted slower still): they are pruned, each with that reason;
- at least `min_measured` candidates are measured successfully first (a single lucky ratio says
  little), and a candidate that failed (compile error, wrong result) counts for nothing;
- the margin is the kernel kind's (`KernelTemplate.bound_margin`): 0.85 for matmul and 0.75 for
  attention, where the model ranks tile configs, 0 (measure all) for memory-bound kinds, whose
  candidates all sit within noise of the bandwidth floor where the model's ratios scatter, and for
  the flash kernels, whose model ranks their tiles no better.

`exhaustive=True` (`XG_TUNE_EXHAUSTIVE=1`) measures everything, as before this module existed.
`tests/unit/tuner/test_search.py` holds the rule to recorded H100 and H200 timings of every
candidate of real jobs: it must never prune the candidate exhaustive measurement picks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

MARGIN = 0.85           # default: how much more optimistic than the most optimistic ratio seen a bound may be
MIN_MEASURED = 3        # successful measurements before the bound may stop a job
RACE = 1.3              # a run already this much slower than the best so far stops early (`stop_above`)


def exhaustive() -> bool:
    """`XG_TUNE_EXHAUSTIVE=1`: compile and measure every candidate fully (no bound, no racing,
    a fixed 50 runs each): how XG tuned before the search stopped early; for comparisons."""
    from ..settings import tune_exhaustive
    return tune_exhaustive()


@dataclass(frozen=True)
class Candidate:
    key: str                # config_key(config)
    config: dict
    predicted_ms: float


@dataclass
class Search:
    """The measuring order and stopping rule of one job (see the module docstring)."""

    ranked: list[Candidate]                         # best-predicted first
    seed: str | None = None                         # a neighbour's winner: measured first
    exhaustive: bool = False
    margin: float = MARGIN
    min_measured: int = MIN_MEASURED
    times: dict[str, float] = field(default_factory=dict)      # key -> ms (inf: failed)
    pruned: dict[str, str] = field(default_factory=dict)       # key -> why it was never measured
    order: list[Candidate] = field(init=False)
    _next: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        first = [c for c in self.ranked if c.key == self.seed]
        self.order = first + [c for c in self.ranked if c.key != self.seed]

    @property
    def best(self) -> tuple[float, str] | None:
        """(ms, key) of the fastest successful measurement (ties: the smaller key)."""
        ok = [(ms, k) for k, ms in self.times.items() if math.isfinite(ms)]
        return min(ok) if ok else None

    @property
    def optimism(self) -> float | None:
        """The smallest measured / predicted ratio so far, times the margin (None before any)."""
        by_key = {c.key: c for c in self.order}
        ratios = [ms / by_key[k].predicted_ms for k, ms in self.times.items()
                  if math.isfinite(ms) and by_key[k].predicted_ms > 0]
        return min(ratios) * self.margin if ratios else None

    def can_win(self, c: Candidate) -> bool:
        """Whether `c` might still beat the best measured time, by its predicted bound."""
        best, optimism = self.best, self.optimism
        if self.exhaustive or best is None or optimism is None or self.margin <= 0:
            return True
        if sum(math.isfinite(ms) for ms in self.times.values()) < min(self.min_measured, len(self.order)):
            return True
        return c.predicted_ms * optimism < best[0]

    def next(self) -> Candidate | None:
        """The next candidate to measure, or None when the job is done (the rest are then pruned)."""
        while self._next < len(self.order):
            c = self.order[self._next]
            if c.key in self.times:
                self._next += 1
                continue
            if not self.can_win(c):
                self._prune_rest()
                return None
            return c
        return None

    def upcoming(self, n: int) -> list[Candidate]:
        """Up to `n` candidates, from the current one on, that the search may measure next (what to
        compile ahead): none that its bound already rules out (a later, lower ratio can bring one
        back; it is then compiled when reached)."""
        out = []
        for c in self.order[self._next:]:
            if len(out) >= n or not self.can_win(c):
                break
            if c.key not in self.times and c.key not in self.pruned:
                out.append(c)
        return out

    def record(self, key: str, ms: float) -> None:
        """A measurement of candidate `key` (inf: it failed or was refused)."""
        self.times[key] = ms

    def skip(self, key: str, why: str) -> None:
        """Candidate `key` is not measured (a time budget, say): it neither wins nor bounds."""
        self.pruned[key] = why
        self.times.setdefault(key, math.inf)

    def _prune_rest(self) -> None:
        best, optimism = self.best, self.optimism
        assert best is not None and optimism is not None
        for c in self.order[self._next:]:
            if c.key not in self.times:
                self.pruned[c.key] = (f"bound: predicted {c.predicted_ms:.4g} ms x {optimism:.3g} (the most "
                                      f"optimistic measured/predicted ratio x {self.margin}) is not below the "
                                      f"best measured {best[0]:.4g} ms")
        self._next = len(self.order)

    def stop_above(self) -> float | None:
        """A run slower than this can stop timing early: it cannot win (None: time it fully)."""
        best = self.best
        return None if self.exhaustive or best is None else best[0] * RACE


def first_wave(ranked: list[Candidate], seed: str | None, n: int) -> list[Candidate]:
    """The candidates a job will measure first, whatever the measurements say: what to compile ahead."""
    return Search(ranked, seed=seed).order[:n]
