"""The pass pipeline: one ordered list of named passes, each a pure `Program -> Program`.

`run_pipeline` runs them in order; `stop_after` ends after one (for `--dump-after=NAME`), and
`verify_each` runs the IR verifier between passes (the tests turn it on). Shape specialisation
(`specialize.py`) is not in this list: it needs concrete input shapes and runs at first run.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

from ..ir.graph import Program, renumber
from ..ir.verify import verify
from .const_fold import const_fold
from .autodiff import autodiff
from .cast_views import cast_views
from .cse import cse
from .dce import dce
from .fork_casts import fork_casts
from .inline import inline
from .lookups import lookups
from .merge_heads import merge_heads
from .pad_products import pad_products
from .precision import precision
from .shard import shard
from .simplify import simplify
from .sink_reshapes import sink_reshapes
from .split_products import split_products
from .split_reductions import split_reductions
from .stack_partials import stack_partials
from .stage import stage
from .transpose_products import transpose_products

Pass = Callable[[Program], Program]

PIPELINE: list[tuple[str, Pass]] = [
    ("precision", precision),
    ("autodiff", autodiff),
    ("inline", inline),
    ("const-fold", const_fold),
    ("simplify", simplify),
    ("lookups", lookups),
    ("cse", cse),
    ("sink-reshapes", sink_reshapes),
    ("dce", dce),
    ("stage", stage),
    ("shard", shard),
    ("split-reductions", split_reductions),
    ("stack-partials", stack_partials),
    ("cast-views", cast_views),
    ("merge-heads", merge_heads),
    ("pad-products", pad_products),
    ("transpose-products", transpose_products),
    ("split-products", split_products),
    ("fork-casts", fork_casts),
]
PASS_NAMES = [name for name, _ in PIPELINE]


def run_pipeline(program: Program, *, stop_after: str | None = None, verify_each: bool = False) -> Program:
    if stop_after is not None and stop_after not in PASS_NAMES:
        raise ValueError(f"unknown pass {stop_after!r}; passes: {', '.join(PASS_NAMES)}")
    for name, fn in PIPELINE:
        program = fn(program)
        if verify_each:
            verify(program.main)
        if name == stop_after:
            break
    return replace(program, main=renumber(program.main))
