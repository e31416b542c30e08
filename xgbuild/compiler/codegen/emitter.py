"""The shared core of Triton code generation: dtypes, variants, parameters, element-wise op code.

Every kernel takes its sizes as integer arguments, so one compiled kernel serves every shape; the
tuning config fixes the tile sizes, and a `Variant` (`launch_abi.py`) what the code may assume
about a launch's arguments.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..ops import Op, TritonCtx, op_def
from .launch_abi import Variant
from .spec import FLOAT, KernelSpec, LocalNode

TL = {"float32": "tl.float32", "bfloat16": "tl.bfloat16", "float16": "tl.float16", "float64": "tl.float64",
      "int8": "tl.int8", "int16": "tl.int16", "int32": "tl.int32", "int64": "tl.int64", "uint8": "tl.uint8",
      "bool": "tl.int1"}
POINTER = {"float32": "*fp32", "bfloat16": "*bf16", "float16": "*fp16", "float64": "*fp64", "int8": "*i8",
           "int16": "*i16", "int32": "*i32", "int64": "*i64", "uint8": "*u8", "bool": "*i1"}


FLOAT32_MAX = 3.4028234663852886e38      # the largest finite float32 (every 16-bit float widens into it)
FLOAT64_MAX = 1.7976931348623157e308


def compute_dtype(dtype: str) -> str:
    """16-bit floats are computed in fp32 and rounded where the program rounds (casts, stores)."""
    return "float32" if dtype in ("float16", "bfloat16") else dtype


@dataclass
class Emitted:
    name: str
    source: str
    params: list[tuple[str, str]]           # (name, Triton type) of each run-time parameter, in order
    constexprs: dict[str, int]
    div16: list[str] = field(default_factory=list)   # parameters compiled as multiples of 16
    aligned: bool = False                           # pointers compiled as 16-byte aligned

    @property
    def signature(self) -> dict[str, str]:
        return {**dict(self.params), **{c: "constexpr" for c in self.constexprs}}


def literal(value, dtype: str) -> str:
    if dtype == "bool":
        return "True" if value else "False"
    if isinstance(value, str):           # "inf", "-inf", "nan" from the spec's canonical form
        return f'float("{value}")'
    if dtype in FLOAT:
        v = float(value)
        return f'float("{v}")' if not math.isfinite(v) else repr(v)
    return repr(int(value))


PRELUDE = '''import triton
import triton.language as tl


@triton.jit
def _pcg(x):
    state = x * 747796405 + 2891336453
    word = ((state >> ((state >> 28) + 4)) ^ state) * 277803737
    return (word >> 22) ^ word


@triton.jit
def _tanh(x):
    # An odd Taylor polynomial near 0 (where 2 * sigmoid(2x) - 1 cancels), the sigmoid form elsewhere.
    x2 = x * x
    small = x * (1.0 + x2 * (-1.0 / 3.0 + x2 * (2.0 / 15.0 - x2 * (17.0 / 315.0))))
    return tl.where(tl.abs(x) < 0.125, small, 2.0 * tl.sigmoid(2.0 * x) - 1.0)


@triton.jit
def _fmod(a, b):
    # C fmod (the sign of a), like torch.fmod: a - trunc(a / b) * b.
    q = a / b
    return a - tl.where(q < 0, tl.ceil(q), tl.floor(q)) * b


@triton.jit
def _uniform(seed, idx, lane):
    seed = seed.to(tl.int64)
    lo = (seed & 0xFFFFFFFF).to(tl.uint32)
    hi = ((seed >> 32) & 0xFFFFFFFF).to(tl.uint32)
    key = _pcg(lo ^ _pcg(hi))
    u = _pcg(key + 2 * idx.to(tl.uint32) + lane) >> 8
    return (u.to(tl.float32) + 0.5) * (1.0 / 16777216.0)


@triton.jit
def _udiv(x, m, s):
    # x // d for 0 <= x < 2**31 by a multiply: (m, s) = launch.div_magic(d), m an int32 of
    # uint32 bits (the interpreter passes it as a wider int: the cast keeps its low bits).
    u = x.to(tl.uint32)
    return ((tl.umulhi(u, m.to(tl.uint32)) + u) >> s.to(tl.uint32)).to(x.dtype)
'''


class Writer:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.indent = 1
        self.counter = 0

    def line(self, text: str) -> None:
        self.lines.append("    " * self.indent + text)

    def tmp(self, prefix: str = "t") -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"


class Emitter:
    def __init__(self, spec: KernelSpec, config: dict[str, int], variant: Variant) -> None:
        self.spec, self.config, self.variant = spec, config, variant
        self.w = Writer()
        self.params: list[tuple[str, str]] = []
        self.div16: list[str] = []
        self.idx = "tl.int64" if variant.wide else "tl.int32"
        self.ity = "i64" if variant.wide else "i32"
        # How `store` raises the NaN/Inf flag: "branch" (under `if` the output's check bit) or
        # "carry" (inside a tile loop Triton flattens, whose pass refuses an `if` in its body: each
        # tile adds its values times 0, NaN for a NaN or an infinity, into a per-row sum the loop
        # carries, `carried`, and the template raises the flag once after the loop).
        self.check_mode = "branch"
        self.carried: list[tuple[str, int]] = []        # (the carried sum, output index)

    # --- parameters -------------------------------------------------------------------------
    def int_param(self, name: str, hint16: bool = False) -> str:
        if name not in dict(self.params):
            self.params.append((name, self.ity))
            if hint16 and self.variant.hinted(name):
                self.div16.append(name)
        return name

    def div(self, x: str, dim: str) -> str:
        """`x // dim` for a size parameter `dim` and 0 <= x: with 32-bit indices, a multiply by the
        magic number the launch passes beside the size (`{dim}m`, `{dim}s`: launch.div_magic), not
        a division per lane. (Computed in the kernel, once a program, the 64-bit division cost as
        much as the lanes' divisions it saved: 18k programs of 1024 elements.)"""
        if self.variant.wide:
            return f"{x} // {dim}"
        m, s = self.int_param(f"{dim}m"), self.int_param(f"{dim}s")
        return f"_udiv({x}, {m}, {s})"

    def layout(self, j: int) -> object:
        lays = self.variant.layouts
        return lays[j] if lays else None

    def stride(self, j: int, d: int) -> str:
        """Operand j's stride along its level's dim d: a baked constant or a parameter."""
        lay = self.layout(j)
        if isinstance(lay, tuple) and lay[d] is not None:
            return str(lay[d])
        return self.int_param(f"p{j}_s{d}", hint16=True)

    def unravel(self, index: str, first: int, last: int, prefix: str) -> None:
        """Emits `{prefix}{d}`, the index along dim d of first..last-1, from a linear `index`."""
        rest = index
        for d in range(last - 1, first - 1, -1):
            if d == first:
                self.w.line(f"{prefix}{d} = {rest}")
            else:
                dim = self.int_param(f"d{d}")
                self.w.line(f"{prefix}r{d} = {self.div(rest, dim)}")
                self.w.line(f"{prefix}{d} = {rest} - {prefix}r{d} * {dim}")
                rest = f"{prefix}r{d}"

    def split(self, index: str, first: int, last: int) -> dict[int, str]:
        """Inline expressions for the index along dims first..last-1 of a linear `index`."""
        out, rest = {}, index
        for d in range(last - 1, first - 1, -1):
            if d == first:
                out[d] = rest
            else:
                dim = self.int_param(f"d{d}")
                q = self.div(f"({rest})", dim)
                out[d], rest = f"(({rest}) - {q} * {dim})", q
        return out

    @staticmethod
    def dot(pairs) -> str:
        """sum(index * stride) over (index, stride) pairs, leaving out stride-0 terms ("" if none)."""
        return " + ".join(i if s == "1" else f"{i} * {s}" for i, s in pairs if s != "0")

    # --- nodes --------------------------------------------------------------------------------
    def arg(self, a: tuple, vals: dict, load) -> str:
        if a[0] == "c":
            return literal(a[1], a[2])
        if a[0] == "n":
            return vals[a[1]]
        return load(a[1])

    def op(self, n: LocalNode, xs: list[str], index: str | None = None) -> str:
        """The Triton expression of one element-wise node: its op's own code (`OpDef.triton`)."""
        ctx = TritonCtx(tuple(xs), compute_dtype(n.dtype), n.dtype, dict(n.attrs), index, TL.__getitem__, literal)
        return op_def(Op(n.op)).triton_code(ctx)

    def load(self, j: int, offset: str, mask: str | None) -> str:
        dtype, _level = self.spec.operands[j]
        m = f", mask={mask}, other=0" if mask else ""
        v = f"tl.load(p{j} + {offset}{m})"
        if dtype in ("bfloat16", "float16"):
            v += ".to(tl.float32)"
        return v

    def store(self, i: int, offset: str, value: str, mask: str | None, block: bool = True) -> None:
        """Stores output i; a floating-point one also raises the run's NaN/Inf flag word where bit i
        of the run-time `checks` is set (check mode, for the engine's outputs). A block's bad lanes
        are reduced to one scalar first and only that scalar is stored, predicated, into `flags`:
        a clean run writes nothing, and the check holds no tile of pointers (a per-lane pointer
        store kept a 64-bit pointer per accumulator element live in a GEMM's epilogue and cost the
        128x256 tiles more than half their speed). `block=False`: `value` is a scalar."""
        n = self.spec.nodes[self.spec.outputs[i]]
        m = f", mask={mask}" if mask else ""
        if n.dtype == "bool":
            self.w.line(f"tl.store(q{i} + {offset}, ({value}) != 0{m})")
            return
        if n.dtype not in FLOAT:
            self.w.line(f"tl.store(q{i} + {offset}, ({value}).to({TL[n.dtype]}){m})")
            return
        s, f = self.w.tmp("s"), self.w.tmp("f")
        self.w.line(f"{s} = ({value}).to({TL[n.dtype]})")
        self.w.line(f"tl.store(q{i} + {offset}, {s}{m})")
        if self.check_mode == "carry":
            z = f"z{i}"
            self.carried.append((z, i))
            lanes = f"tl.where({mask}, {s}, 0.0)" if mask else s
            self.w.line(f"{z} += tl.sum({lanes} * 0.0, axis=1).to(tl.float32)")
            return
        self.w.line(f"if (checks >> {i}) & 1:")
        self.w.indent += 1
        wide = n.dtype == "float64"
        self.w.line(f"{f} = {s}" if wide else f"{f} = {s}.to(tl.float32)")
        bad = f"({f} != {f}) | (tl.abs({f}) > {FLOAT64_MAX if wide else FLOAT32_MAX!r})"
        if mask:
            bad = f"({bad}) & ({mask})"
        b = self.w.tmp("b")
        self.w.line(f"{b} = {bad}")
        if block:
            self.w.line(f"{b} = tl.max({b}.to(tl.int32), axis=None) != 0")
        self.w.line(f"tl.store(flags, 1, mask={b})")
        self.w.indent -= 1

    def pointer_params(self) -> None:
        for j, (dtype, _level) in enumerate(self.spec.operands):
            self.params.append((f"p{j}", POINTER[dtype]))
        for i, out in enumerate(self.spec.outputs):
            self.params.append((f"q{i}", POINTER[self.spec.nodes[out].dtype]))
        # Check mode's NaN/Inf flag word, and which outputs raise it (bit i: output i; 0: none).
        self.params.append(("flags", "*i32"))
        self.params.append(("checks", "i32"))

    def finish(self, body_constexprs: dict[str, int]) -> Emitted:
        spec = self.spec
        name = spec.name
        names = [p for p, _ in self.params] + list(body_constexprs)
        head = f"@triton.jit\ndef {name}({', '.join(n if n not in body_constexprs else n + ': tl.constexpr' for n in names)}):"
        source = PRELUDE + "\n\n" + head + "\n" + "\n".join(self.w.lines) + "\n"
        return Emitted(name, source, list(self.params), dict(body_constexprs), list(self.div16),
                       self.variant.aligned)

