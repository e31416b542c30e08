"""The kernel-template interface, and the values its tuning half works on (`Problem`, `Config`).

A `KernelTemplate` is everything XG knows about one kernel kind (its `kind`), in one object:
- fusion: which nodes may join a kernel of the kind (`joins`, `takes_reduction`,
  `prologue_of_reduction`: the scheduler asks);
- code: the spec of a scheduled kernel, and its Triton source under a config and a variant
  (`spec`, `emit`);
- launch ABI: how a launch's operands line up with the kernel's domain, its size arguments and
  grid, and what a variant's kind-specific assumptions need of a launch (`frame`, `grid`,
  `accepts`);
- tuning: the `Problem` a launch at the tuning shape solves, what a tuned variant may assume
  there, the config space and its hardware pruning rules, the generic fallback's config, and the
  roofline cost model that ranks configs (`problem`, `assumptions`, `full_space`, `rules`,
  `default_config`, `seconds`, `peak_flops`, `tie_break`).
The registry (`templates/__init__.py`) maps each kind to its template; codegen, the tuner and the
runtime look a kind up there instead of switching on it.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Callable

from xgbuild.hw import GpuProfile

from ..emitter import Emitted, Emitter
from ..kernel import Kernel, Schedule
from ..launch_abi import Frame, Launch, Variant
from ..spec import Binding, KernelSpec

Config = dict[str, int]  # keys sorted; always includes num_warps and num_stages


def row_tiles_programs(total: int, last: int, block: int, cols: int) -> int:
    """Programs that each take `block // cols` rows of a last dim `last` long, `cols` positions of
    each (`triton_src.elementwise`'s row tiles), `total` positions in all."""
    rows = total // last if last else 0
    return -(-last // cols) * -(-rows // (block // cols))


def row_blocks_grid(total: int, last: int, block: int) -> tuple[int, int, int]:
    """The grid of programs that each take `block` positions along a last dim of `last` for one
    index of the dims before it, `total` positions in all (`triton_src._row_blocks`)."""
    return (-(-last // block) * (total // last) if last else 0, 1, 1)


@dataclass(frozen=True)
class Problem:
    """One kernel's work: its kind, operand dtype and sizes, its useful FLOPs and fewest bytes.
    Which sizes a kind needs is its template's `sizes` (checked by `templates.for_problem`)."""

    kind: str            # a kernel kind (a key of templates.TEMPLATES)
    dtype: str           # XG dtype of the operands / widest input: "bfloat16", "int32", ...
    flops: float         # useful floating-point operations
    bytes: float         # fewest bytes: every input read once, every output written once
    numel: int = 0       # elementwise: elements of the domain
    rows: int = 0        # rowwise: number of rows
    cols: int = 0        # rowwise: reduced length of each row; elementwise: the last dim (0: flat only)
    passes: int = 1      # rowwise: reductions needing the whole row before the next
    batch: int = 1       # matmul, attention (m = T queries, n = S keys, k = D head dim)
    m: int = 0
    n: int = 0
    k: int = 0
    dv: int = 0          # attention: v's head dim (the output's last)
    causal: bool = False  # attention: key blocks above the diagonal are skipped
    elem_bytes: int = 4  # bytes per element of the operands (matmul A/B) or of the widest input
    b_transposed: bool = False  # matmul: B stored [N, K] (an `nn.Linear` weight): unit stride along K
    columns: bool = False  # rowwise: adjacent rows adjacent in memory, the reduced dim strided (sum(g, dim=0))
    short_rows: bool = False  # rowwise: rows so short (a head's 64) that a program takes many, in the column form
    # elementwise: values a thread holds for each of its elements while the loads are in flight
    # (the operands it reads and the outputs), and besides them, in a flat block over operands read
    # through strides, the index along each dim and its quotient (`index_live`).
    live: int = 1
    index_live: int = 0

    def __post_init__(self) -> None:
        # The kind is checked where it is looked up (`templates.template`, `for_problem`): this
        # module is below the registry and does not import it back.
        if not self.kind:
            raise ValueError("problem kind must not be empty")
        if not self.dtype:
            raise ValueError("problem dtype must not be empty")
        if self.elem_bytes not in (1, 2, 4, 8):
            raise ValueError(f"elem_bytes must be 1, 2, 4 or 8, got {self.elem_bytes}")
        if not isinstance(self.b_transposed, bool):
            raise ValueError(f"b_transposed must be a bool, got {self.b_transposed!r}")
        if self.flops < 0 or self.bytes < 0:
            raise ValueError(f"flops and bytes must be >= 0, got {self.flops} and {self.bytes}")


def next_pow2(x: int) -> int:
    """The smallest power of two >= x (1 for x <= 1)."""
    return 1 if x <= 1 else 1 << (x - 1).bit_length()


def config_key(config: Config) -> str:
    """Canonical JSON text of a config: sorted keys, no spaces."""
    return json.dumps(config, sort_keys=True, separators=(",", ":"))


def make_config(**params: int) -> Config:
    """A config dict with its keys sorted."""
    return dict(sorted(params.items()))


# A pruning rule: why a config is dropped for a problem on a GPU, or None.
Rule = Callable[[Problem, Config, GpuProfile], "str | None"]


class KernelTemplate(ABC):
    """One kernel kind. Subclasses implement every abstract method and set the class attributes
    (a unit test checks each kind's template); the other methods are defaults a kind may keep."""

    kind: str = ""
    params: tuple[str, ...] = ()        # config keys besides num_warps and num_stages
    optional: tuple[str, ...] = ()      # config keys present only when not 0 (a config without
                                        # one means 0: earlier configs and their keys stay valid)
    sizes: tuple[str, ...] = ()         # the `Problem` fields this kind needs >= 1
    tiled: bool = False                 # operands read as 2-D tiles: layouts always carry strides
    max_candidates: int = 48            # configs `tuner.space.candidates` keeps at most (matmul: of each form)
    # How far the tuner trusts this kind's cost model to stop measuring early (`tuner.search`):
    # the model's most optimistic measured/predicted ratio times this bounds an unmeasured
    # candidate's time. 0: measure every candidate (the model cannot rank them).
    bound_margin: float = 0.85
    rules: tuple[Rule, ...] = ()        # pruning rules, in the order they are tried

    # --- code ------------------------------------------------------------------------------
    @abstractmethod
    def spec(self, sched: Schedule, k: Kernel) -> tuple[KernelSpec, Binding]:
        """The spec of scheduled kernel `k` (of this kind) and its binding to `sched.graph`."""
        raise NotImplementedError

    @abstractmethod
    def emit(self, e: Emitter) -> Emitted:
        """The Triton source of `e.spec` under `e.config` and `e.variant`."""
        raise NotImplementedError

    # --- fusion (the scheduler asks) -------------------------------------------------------
    def joins(self, k: Kernel, shape: tuple, inner: list[int], graph, users: dict) -> bool:
        """May an element-wise node of `shape`, whose inputs `inner` kernel `k` computes, join
        `k` (of this kind)? By default nothing joins (attention's chain is matched whole)."""
        return False

    def takes_reduction(self, k: Kernel, shape: tuple) -> bool:
        """May a reduction over the last dim of a value of `shape`, made by `k`, join `k`?"""
        return False

    def prologue_of_reduction(self, k: Kernel, shape: tuple) -> bool:
        """May `k` become the prologue of a reduction over the last dim of its value of `shape`
        (when that reduction alone reads it)?"""
        return False

    # --- launch ABI ------------------------------------------------------------------------
    @abstractmethod
    def frame(self, spec: KernelSpec, b: Binding, graph, domain: tuple) -> Frame:
        """How one launch lines operands up with the kernel's domain (`domain`: the binding's)."""
        raise NotImplementedError

    @abstractmethod
    def grid(self, config: Config, ints: dict[str, int]) -> tuple[int, int, int]:
        """The launch grid for a launch's size arguments `ints`."""
        raise NotImplementedError

    @abstractmethod
    def accepts(self, variant: Variant, config: Config, launch: Launch) -> bool:
        """Do the launch's arguments meet the variant's kind-specific assumptions?"""
        raise NotImplementedError

    def block_rows(self, spec: KernelSpec, b: Binding, graph) -> int:
        """Rows a launch can be split into blocks of (`rows_of`), or 0: most kinds cannot."""
        return 0

    def rows_of(self, spec: KernelSpec, launch: Launch, r0: int, r1: int) -> Launch:
        """The launch restricted to output rows r0..r1 (kinds whose `block_rows` is not 0)."""
        raise ValueError(f"a {self.kind} kernel does not run in blocks of rows")

    # --- tuning ----------------------------------------------------------------------------
    @abstractmethod
    def problem(self, spec: KernelSpec, ints: dict[str, int], dtype: str, work: int, moved: float,
                widest: int, strides: tuple = ()) -> Problem:
        """The work of a launch with size arguments `ints`: `dtype` the first operand's (or the
        first output's), `work` the spec's non-product nodes, `moved` the fewest bytes read and
        written, `widest` the widest operand's bytes per element, `strides` each operand's strides
        at that shape (where a kind's space depends on how an operand is stored)."""
        raise NotImplementedError

    @abstractmethod
    def shape_text(self, p: Problem) -> str:
        """The problem's sizes as a job names them."""
        raise NotImplementedError

    @abstractmethod
    def assumptions(self, p: Problem, config: Config) -> tuple[bool, bool]:
        """(single, even_k): what a variant tuned for `p` under `config` may assume."""
        raise NotImplementedError

    @abstractmethod
    def full_space(self, p: Problem, hw: GpuProfile | None = None) -> list[Config]:
        """Every config of this kind for `p` before pruning, in a fixed order (`hw`: the target,
        for knobs sized by it; without it, only configs valid on any GPU)."""
        raise NotImplementedError

    @abstractmethod
    def default_config(self, p: Problem) -> Config:
        """A config valid for any size on every target: the generic fallback kernel's."""
        raise NotImplementedError

    @abstractmethod
    def peak_flops(self, p: Problem, profile: GpuProfile, config: Config | None) -> float:
        """The FLOP/s ceiling of `p`'s math on `profile` (under `config`)."""
        raise NotImplementedError

    @abstractmethod
    def seconds(self, p: Problem, c: Config, hw: GpuProfile, top) -> float:
        """The cost model: predicted seconds of `p` under config `c` on `hw`, with the ceilings
        `top` (`roofline.Ceilings`)."""
        raise NotImplementedError

    def tie_break(self, p: Problem, config: Config) -> tuple:
        """How configs the model predicts equal are ordered: by their canonical text."""
        return (config_key(config),)

    def preselect(self, p: Problem, ranked: list[Config], limit: int, best: Callable, split: bool
                  ) -> tuple[set[str], int]:
        """Config keys taken before the rest by rank, and the new limit; `best(configs, n)` is the
        tuner's pick of n among configs. Most kinds take the ranking as it is."""
        return set(), limit

    def check(self, p: Problem) -> None:
        """Raise ValueError unless `p` has every size this kind needs."""
        for name in self.sizes:
            if getattr(p, name) < 1:
                raise ValueError(f"{p.kind} problem needs {name} >= 1, got {getattr(p, name)}")
