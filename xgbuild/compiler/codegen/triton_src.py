"""Triton source for one kernel spec, one tuning config and one variant.

Every kernel takes its sizes as integer arguments, so one compiled kernel serves every shape; the
tuning config fixes the tile sizes. A `Variant` states what the compiled code may assume about the
arguments of a launch, and the runtime checks it before launching:

- `wide`: index arithmetic in int64 (else every offset must fit in int32);
- `layouts`: per operand, "dense" (laid out like the domain: one linear index addresses it) or one
  entry per domain dim: an int stride baked into the code (0 for broadcast, 1 for contiguous) or
  None (passed at run time);
- `aligned`: every pointer is 16-byte aligned and every run-time stride and size named in
  `Emitted.div16` is a multiple of 16 (Triton then vectorises loads);
- `single` (rowwise): a row fits one tile, so it is loaded once;
- `even_k` (matmul): K is a multiple of BLOCK_K, so the K loop needs no mask.

The generic variant (`Variant.generic`) assumes nothing: it is the fallback every engine carries.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .spec import FLOAT, KernelSpec, LocalNode

TL = {"float32": "tl.float32", "bfloat16": "tl.bfloat16", "float16": "tl.float16", "float64": "tl.float64",
      "int8": "tl.int8", "int16": "tl.int16", "int32": "tl.int32", "int64": "tl.int64", "uint8": "tl.uint8",
      "bool": "tl.int1"}
POINTER = {"float32": "*fp32", "bfloat16": "*bf16", "float16": "*fp16", "float64": "*fp64", "int8": "*i8",
           "int16": "*i16", "int32": "*i32", "int64": "*i64", "uint8": "*u8", "bool": "*i1"}


def compute_dtype(dtype: str) -> str:
    """16-bit floats are computed in fp32 and rounded where the program rounds (casts, stores)."""
    return "float32" if dtype in ("float16", "bfloat16") else dtype


@dataclass(frozen=True)
class Variant:
    wide: bool = True
    layouts: tuple = ()           # per operand: "dense" or tuple[int | None, ...]; () = all run-time strides
    aligned: bool = False
    single: bool = False
    even_k: bool = False

    @classmethod
    def generic(cls) -> "Variant":
        return cls()

    def to_json(self) -> dict:
        return {"wide": self.wide, "layouts": [lay if lay == "dense" else list(lay) for lay in self.layouts],
                "aligned": self.aligned, "single": self.single, "even_k": self.even_k}

    @classmethod
    def from_json(cls, d: dict) -> "Variant":
        return cls(bool(d["wide"]), tuple(lay if lay == "dense" else tuple(lay) for lay in d["layouts"]),
                   bool(d["aligned"]), bool(d["single"]), bool(d["even_k"]))


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


def _literal(value, dtype: str) -> str:
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
'''


class _Writer:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.indent = 1
        self.counter = 0

    def line(self, text: str) -> None:
        self.lines.append("    " * self.indent + text)

    def tmp(self, prefix: str = "t") -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"


class _Emitter:
    def __init__(self, spec: KernelSpec, config: dict[str, int], variant: Variant) -> None:
        self.spec, self.config, self.variant = spec, config, variant
        self.w = _Writer()
        self.params: list[tuple[str, str]] = []
        self.div16: list[str] = []
        self.idx = "tl.int64" if variant.wide else "tl.int32"
        self.ity = "i64" if variant.wide else "i32"

    # --- parameters -------------------------------------------------------------------------
    def int_param(self, name: str, hint16: bool = False) -> str:
        if name not in dict(self.params):
            self.params.append((name, self.ity))
            if hint16 and self.variant.aligned:
                self.div16.append(name)
        return name

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
                self.w.line(f"{prefix}{d} = {rest} % {dim}")
                self.w.line(f"{prefix}r{d} = {rest} // {dim}")
                rest = f"{prefix}r{d}"

    def split(self, index: str, first: int, last: int) -> dict[int, str]:
        """Inline expressions for the index along dims first..last-1 of a linear `index`."""
        out, rest = {}, index
        for d in range(last - 1, first - 1, -1):
            if d == first:
                out[d] = rest
            else:
                dim = self.int_param(f"d{d}")
                out[d], rest = f"(({rest}) % {dim})", f"(({rest}) // {dim})"
        return out

    @staticmethod
    def dot(pairs) -> str:
        """sum(index * stride) over (index, stride) pairs, leaving out stride-0 terms ("" if none)."""
        return " + ".join(i if s == "1" else f"{i} * {s}" for i, s in pairs if s != "0")

    # --- nodes --------------------------------------------------------------------------------
    def arg(self, a: tuple, vals: dict, load) -> str:
        if a[0] == "c":
            return _literal(a[1], a[2])
        if a[0] == "n":
            return vals[a[1]]
        return load(a[1])

    def op(self, n: LocalNode, xs: list[str], index: str | None = None) -> str:
        op, dt = n.op, compute_dtype(n.dtype)
        a = xs[0] if xs else ""
        b = xs[1] if len(xs) > 1 else ""
        f32 = dt == "float32"
        simple = {
            "neg": f"-({a})", "not": f"({a} == 0)", "exp": f"tl.exp({a})", "log": f"tl.log({a})",
            "sqrt": f"tl.sqrt_rn({a})" if f32 else f"tl.sqrt({a})", "rsqrt": f"tl.rsqrt({a})",
            "sigmoid": f"tl.sigmoid({a})", "tanh": f"_tanh({a})",
            "gelu": f"0.5 * ({a}) * (1.0 + tl.erf(({a}) * 0.7071067811865476))",
            "silu": f"({a}) * tl.sigmoid({a})", "relu": f"tl.where(({a}) < 0, 0, {a})",
            "abs": f"tl.abs({a})", "erf": f"tl.erf({a})",
            "add": f"({a}) + ({b})", "sub": f"({a}) - ({b})", "mul": f"({a}) * ({b})",
            "eq": f"({a}) == ({b})", "ne": f"({a}) != ({b})", "lt": f"({a}) < ({b})", "le": f"({a}) <= ({b})",
            "gt": f"({a}) > ({b})", "ge": f"({a}) >= ({b})", "and": f"({a}) & ({b})", "or": f"({a}) | ({b})",
            "maximum": f"tl.maximum({a}, {b}, propagate_nan=tl.PropagateNan.ALL)",
            "minimum": f"tl.minimum({a}, {b}, propagate_nan=tl.PropagateNan.ALL)",
        }
        if op in simple:
            return simple[op]
        if op == "div":
            if dt in FLOAT:
                return f"({a}) / ({b})"
            # Truncating integer division; a zero divisor only reaches a discarded path (see cpu.py).
            return f"({a}) // tl.where(({b}) == 0, 1, {b})"
        if op == "mod":
            if dt in FLOAT:
                return f"_fmod({a}, {b})"
            return f"({a}) % tl.where(({b}) == 0, 1, {b})"
        if op == "where":
            return f"tl.where({a}, {b}, {xs[2]})"
        if op == "cast":
            if n.dtype == "bool":
                return f"(({a}) != 0)"
            if n.dtype in ("bfloat16", "float16"):
                return f"({a}).to({TL[n.dtype]}).to(tl.float32)"
            return f"({a}).to({TL[n.dtype]})"
        if op == "full":
            return _literal(dict(n.attrs)["value"], n.dtype)
        if op == "iota":
            return f"({index}).to({TL[dt]})"
        if op in ("rand", "randn"):
            if a.lstrip("-").isdigit():          # a constant seed
                a = f"tl.full([], {a}, tl.int64)"
            u1 = f"_uniform({a}, {index}, 0)"
            if op == "rand":
                return f"({u1}).to({TL[dt]})"
            u2 = f"_uniform({a}, {index}, 1)"
            return f"(tl.sqrt(-2.0 * tl.log({u1})) * tl.cos(6.283185307179586 * {u2})).to({TL[dt]})"
        raise NotImplementedError(f"no Triton code for `{op}`")

    def load(self, j: int, offset: str, mask: str | None) -> str:
        dtype, _level = self.spec.operands[j]
        m = f", mask={mask}, other=0" if mask else ""
        v = f"tl.load(p{j} + {offset}{m})"
        if dtype in ("bfloat16", "float16"):
            v += ".to(tl.float32)"
        return v

    def store(self, i: int, offset: str, value: str, mask: str | None) -> None:
        n = self.spec.nodes[self.spec.outputs[i]]
        m = f", mask={mask}" if mask else ""
        if n.dtype == "bool":
            self.w.line(f"tl.store(q{i} + {offset}, ({value}) != 0{m})")
        else:
            self.w.line(f"tl.store(q{i} + {offset}, ({value}).to({TL[n.dtype]}){m})")

    def pointer_params(self) -> None:
        for j, (dtype, _level) in enumerate(self.spec.operands):
            self.params.append((f"p{j}", POINTER[dtype]))
        for i, out in enumerate(self.spec.outputs):
            self.params.append((f"q{i}", POINTER[self.spec.nodes[out].dtype]))

    def finish(self, body_constexprs: dict[str, int]) -> Emitted:
        spec = self.spec
        name = spec.name
        names = [p for p, _ in self.params] + list(body_constexprs)
        head = f"@triton.jit\ndef {name}({', '.join(n if n not in body_constexprs else n + ': tl.constexpr' for n in names)}):"
        source = PRELUDE + "\n\n" + head + "\n" + "\n".join(self.w.lines) + "\n"
        return Emitted(name, source, list(self.params), dict(body_constexprs), list(self.div16),
                       self.variant.aligned)


# --- element-wise --------------------------------------------------------------------------------

def _elementwise(e: _Emitter) -> Emitted:
    spec, w = e.spec, e.w
    e.pointer_params()
    rank = spec.rank
    numel = e.int_param("numel", hint16=True)
    w.line(f"lin = tl.program_id(0).to({e.idx}) * BLOCK + tl.arange(0, BLOCK)")
    w.line(f"mask = lin < {numel}")
    unravelled = False

    def unravel() -> None:
        nonlocal unravelled
        if not unravelled:
            unravelled = True
            e.unravel("lin", 0, rank, "i")

    loaded: dict[int, str] = {}

    def load(j: int) -> str:
        if j in loaded:
            return loaded[j]
        level = spec.operands[j][1]
        v = w.tmp("x")
        if level == "scalar":
            w.line(f"{v} = {e.load(j, '0', None)}")
        elif e.layout(j) == "dense":
            w.line(f"{v} = {e.load(j, 'lin', 'mask')}")
        else:
            unravel()
            off = e.dot((f"i{d}", e.stride(j, d)) for d in range(rank))
            # Broadcast along every dim: one value, a scalar load.
            w.line(f"{v} = {e.load(j, off, 'mask') if off else e.load(j, '0', None)}")
        loaded[j] = v
        return v

    vals: dict[int, str] = {}
    for k, n in enumerate(spec.nodes):
        v = w.tmp("v")
        w.line(f"{v} = {e.op(n, [e.arg(a, vals, load) for a in n.args], index='lin')}")
        vals[k] = v
    for i, out in enumerate(spec.outputs):
        value = vals[out]
        if spec.nodes[out].op == "full":
            value = f"tl.full([BLOCK], {value}, {TL[compute_dtype(spec.nodes[out].dtype)]})"
        e.store(i, "lin", value, "mask")
    return e.finish({"BLOCK": e.config["BLOCK"]})


# --- row reductions ------------------------------------------------------------------------------

def _identity(kind: str, dtype: str) -> str:
    """The value a reduction of `kind` ("sum", "mean", "max", "min") starts from, in compute `dtype`."""
    if kind in ("sum", "mean"):
        return "0"
    low = kind == "max"
    if dtype in FLOAT:
        return '-float("inf")' if low else 'float("inf")'
    if dtype == "bool":
        return "False" if low else "True"
    if dtype == "uint8":
        return "0" if low else "255"
    bits = {"int8": 8, "int16": 16, "int32": 32, "int64": 64}[dtype]
    return str(-(2 ** (bits - 1))) if low else str(2 ** (bits - 1) - 1)


def _rowwise(e: _Emitter) -> Emitted:
    spec, w, v = e.spec, e.w, e.variant
    e.pointer_params()
    nrow, rank = spec.row_dims, spec.rank
    e.int_param("R")
    cols = e.int_param("C", hint16=True)
    w.line(f"row = tl.program_id(0).to({e.idx})")
    w.line("cols = tl.arange(0, BLOCK_N)")

    # Row indices (for what is addressed through strides) and per-operand row offsets, computed
    # once: they do not change along a row.
    strided = [j for j, (_dt, level) in enumerate(spec.operands) if level != "scalar" and e.layout(j) != "dense"]
    if strided or spec.strided_out:
        e.unravel("row", 0, nrow, "ri")
    for j in strided:
        w.line(f"ro{j} = {e.dot((f'ri{d}', e.stride(j, d)) for d in range(nrow)) or '0'}")

    def col_offset(j: int, c: str) -> str:
        """Operand j's offset along the columns `c` (a linear index over the reduced dims)."""
        return e.dot((idx, e.stride(j, d)) for d, idx in e.split(c, nrow, rank).items())

    # Dependencies: reductions (and softmax's two hidden ones) in order; full-level values are
    # recomputed from memory inside each pass over the row.
    reductions: list[tuple[int, str, str]] = []   # (node, kind, internal name)
    for k, n in enumerate(spec.nodes):
        if n.op in ("sum", "mean", "max", "min"):
            reductions.append((k, n.op, f"red{k}"))
        elif n.op in ("softmax", "log_softmax"):
            reductions.append((k, "max", f"smax{k}"))
            reductions.append((k, "expsum", f"ssum{k}"))

    row_vals: dict[int, str] = {}      # row-level nodes computed so far
    single = v.single

    def full_scope(c: str, cmask: str):
        """Computes full-level node values at columns `c`; returns (values dict, loader)."""
        vals: dict[int, str] = {}
        loaded: dict[int, str] = {}

        def load(j: int) -> str:
            if j in loaded:
                return loaded[j]
            level = spec.operands[j][1]
            t = w.tmp("x")
            if level == "scalar":
                w.line(f"{t} = {e.load(j, '0', None)}")
            elif level == "row":
                off = "row" if e.layout(j) == "dense" else f"ro{j}"
                w.line(f"{t} = {e.load(j, off, None)}")
            elif e.layout(j) == "dense":
                w.line(f"{t} = {e.load(j, f'row * {cols} + {c}', cmask)}")
            else:
                co = col_offset(j, c)
                off = " + ".join(x for x in (f"ro{j}", co) if x)
                # Stride 0 along the row: one value per row, a scalar load broadcast over the tile.
                w.line(f"{t} = {e.load(j, off, cmask if co else None)}")
            loaded[j] = t
            return t

        def value(k) -> str:
            if isinstance(k, tuple):          # an operand read directly by a reduction
                return load(k[1])
            if k in row_vals:
                return row_vals[k]
            if k in vals:
                return vals[k]
            n = spec.nodes[k]
            if n.op in ("softmax", "log_softmax"):
                x = value(n.args[0][1]) if n.args[0][0] == "n" else e.arg(n.args[0], vals, load)
                m, s = f"smax{k}", f"ssum{k}"
                t = w.tmp("v")
                if n.op == "softmax":
                    w.line(f"{t} = tl.exp(({x}) - {m}) / {s}")
                else:
                    w.line(f"{t} = ({x}) - {m} - tl.log({s})")
                vals[k] = t
                return t
            xs = [value(a[1]) if a[0] == "n" else e.arg(a, vals, load) for a in n.args]
            t = w.tmp("v")
            w.line(f"{t} = {e.op(n, xs, index=c)}")
            vals[k] = t
            return t

        return value

    def emit_reduction_step(k: int, kind: str, value, c: str, cmask: str, acc: str | None) -> str:
        """The reduction of one tile (acc is None in the single-tile form)."""
        a = spec.nodes[k].args[0]
        x = value(a[1]) if a[0] == "n" else value(("o", a[1]))
        n = spec.nodes[k]
        dt = compute_dtype(spec.nodes[a[1]].dtype if a[0] == "n" else spec.operands[a[1]][0])
        if kind == "expsum":
            x = f"tl.exp(({x}) - smax{k})"
            kind_ = "sum"
        else:
            kind_ = kind
        masked = f"tl.where({cmask}, {x}, {_identity(kind_, dt)})"
        t = w.tmp("m")
        w.line(f"{t} = {masked}")
        nan_check = kind_ in ("max", "min") and dt in FLOAT and n.op in ("max", "min")
        if acc is None:
            return t
        if kind_ in ("sum", "mean"):
            w.line(f"{acc} = {acc} + {t}")
        else:
            fn = "tl.maximum" if kind_ == "max" else "tl.minimum"
            w.line(f"{acc} = {fn}({acc}, {t})")
            if nan_check:
                w.line(f"{acc}_nan = {acc}_nan | ({t} != {t})")
        return t

    def finish_reduction(k: int, kind: str, name: str, tile_or_acc: str, has_nan: str | None) -> None:
        n = spec.nodes[k]
        kind_ = "sum" if kind == "expsum" else kind
        fn = {"sum": "tl.sum", "mean": "tl.sum", "max": "tl.max", "min": "tl.min"}[kind_]
        w.line(f"{name} = {fn}({tile_or_acc}, axis=0)")
        if kind_ == "mean":
            w.line(f"{name} = {name} / {cols}")
        if has_nan:
            w.line(f'{name} = tl.where(tl.max({has_nan}.to(tl.int32), axis=0) > 0, float("nan"), {name})')
        if n.op in ("sum", "mean", "max", "min"):
            row_vals[k] = name
            dt = compute_dtype(n.dtype)
            if dt not in FLOAT or n.dtype != dt:
                w.line(f"{name} = {name}.to({TL[n.dtype]}).to({TL[dt]})")

    def compute_row_nodes() -> None:
        """Row-level element-wise nodes whose inputs are all available."""
        for k, n in enumerate(spec.nodes):
            if n.level != "row" or k in row_vals or n.op in ("sum", "mean", "max", "min"):
                continue
            if all(a[0] != "n" or a[1] in row_vals for a in n.args):
                xs = [row_vals[a[1]] if a[0] == "n" else e.arg(a, {}, row_loader) for a in n.args]
                t = f"rv{k}"
                w.line(f"{t} = {e.op(n, xs, index='row')}")
                row_vals[k] = t

    row_loaded: dict[int, str] = {}

    def row_loader(j: int) -> str:
        if j not in row_loaded:
            level = spec.operands[j][1]
            t = f"y{j}"
            if level == "scalar":
                w.line(f"{t} = {e.load(j, '0', None)}")
            else:
                off = "row" if e.layout(j) == "dense" else f"ro{j}"
                w.line(f"{t} = {e.load(j, off, None)}")
            row_loaded[j] = t
        return row_loaded[j]

    compute_row_nodes()
    full_outputs = [(i, k) for i, k in enumerate(spec.outputs) if spec.nodes[k].level == "full"]
    permuted = spec.strided_out                               # softmax over a dim other than the last

    def out_offset(i: int, c: str) -> str:
        """Where full-level output i's element (row, c) goes: dense, or through its strides."""
        if not permuted:
            return f"row * {cols} + {c}"
        index = {d: f"ri{d}" for d in range(nrow)} | e.split(c, nrow, rank)
        return " + ".join(f"{idx} * {e.int_param(f'q{i}_s{d}')}" for d, idx in sorted(index.items()))
    if single:
        w.line(f"cmask = cols < {cols}")
        value = full_scope("cols", "cmask")
        for k, kind, name in reductions:
            tile = emit_reduction_step(k, kind, value, "cols", "cmask", None)
            nan = None
            if kind in ("max", "min") and spec.nodes[k].op in ("max", "min") and \
                    compute_dtype(_in_dtype(spec, k)) in FLOAT:
                nan = w.tmp("nan")
                w.line(f"{nan} = {tile} != {tile}")
            finish_reduction(k, kind, name, tile, nan)
            compute_row_nodes()
        for i, k in full_outputs:
            e.store(i, out_offset(i, "cols"), value(k), "cmask")
    else:
        for k, kind, name in reductions:
            acc = f"acc{k}_{kind}"
            dt = compute_dtype(_in_dtype(spec, k))
            kind_ = "sum" if kind == "expsum" else kind
            init = _identity(kind_, dt)
            acc_dt = TL[dt] if kind_ in ("max", "min") else ("tl.float32" if dt in FLOAT and dt != "float64"
                                                             else TL[dt])
            w.line(f"{acc} = tl.full([BLOCK_N], {init}, {acc_dt})")
            nan_check = kind_ in ("max", "min") and dt in FLOAT and spec.nodes[k].op in ("max", "min")
            if nan_check:
                w.line(f"{acc}_nan = tl.zeros([BLOCK_N], tl.int1)")
            w.line(f"for c0 in range(0, {cols}, BLOCK_N):")
            w.indent += 1
            w.line("c = c0 + cols")
            w.line(f"cmask = c < {cols}")
            value = full_scope("c", "cmask")
            emit_reduction_step(k, kind, value, "c", "cmask", acc)
            w.indent -= 1
            finish_reduction(k, kind, name, acc, f"{acc}_nan" if nan_check else None)
            compute_row_nodes()
        if full_outputs:
            w.line(f"for c0 in range(0, {cols}, BLOCK_N):")
            w.indent += 1
            w.line("c = c0 + cols")
            w.line(f"cmask = c < {cols}")
            value = full_scope("c", "cmask")
            for i, k in full_outputs:
                e.store(i, out_offset(i, "c"), value(k), "cmask")
            w.indent -= 1
    for i, k in enumerate(spec.outputs):
        if spec.nodes[k].level != "full":
            e.store(i, "row", row_vals[k], None)
    return e.finish({"BLOCK_N": e.config["BLOCK_N"]})


def _in_dtype(spec: KernelSpec, k: int) -> str:
    a = spec.nodes[k].args[0]
    return spec.nodes[a[1]].dtype if a[0] == "n" else spec.operands[a[1]][0]


# --- matmul -------------------------------------------------------------------------------------

def _matmul(e: _Emitter) -> Emitted:
    spec, w, v, cfg = e.spec, e.w, e.variant, e.config
    e.pointer_params()
    rank = spec.rank
    nb = rank - 2
    ja, jb = spec.matmul
    a_dt = spec.operands[ja][0]
    for name in ("M", "N", "K"):
        e.int_param(name, hint16=name != "M")
    w.line("pid = tl.program_id(0)")
    w.line(f"bid = tl.program_id(1).to({e.idx})")
    w.line("num_pid_m = tl.cdiv(M, BLOCK_M)")
    w.line("num_pid_n = tl.cdiv(N, BLOCK_N)")
    w.line("group = GROUP_M * num_pid_n")
    w.line("first_m = (pid // group) * GROUP_M")
    w.line("size_m = tl.minimum(num_pid_m - first_m, GROUP_M)")
    w.line("pid_m = first_m + ((pid % group) % size_m)")
    w.line("pid_n = (pid % group) // size_m")
    w.line(f"rm = pid_m.to({e.idx}) * BLOCK_M + tl.arange(0, BLOCK_M)")
    w.line(f"rn = pid_n.to({e.idx}) * BLOCK_N + tl.arange(0, BLOCK_N)")
    # Wrapped indices keep every load in bounds without masks on M and N (rows past the end read
    # valid memory and are never stored).
    w.line("am = tl.max_contiguous(tl.multiple_of(rm % M, BLOCK_M), BLOCK_M)")
    w.line("bn = tl.max_contiguous(tl.multiple_of(rn % N, BLOCK_N), BLOCK_N)")
    w.line("rk = tl.arange(0, BLOCK_K)")
    e.unravel("bid", 0, nb, "bi")           # batch indices

    def batch_offset(j: int) -> str:
        return e.dot((f"bi{d}", e.stride(j, d)) for d in range(nb)) or "0"

    sam, sak = e.stride(ja, nb), e.stride(ja, nb + 1)
    sbk, sbn = e.stride(jb, nb), e.stride(jb, nb + 1)
    w.line(f"a_ptrs = p{ja} + {batch_offset(ja)} + am[:, None] * {sam} + rk[None, :] * {sak}")
    w.line(f"b_ptrs = p{jb} + {batch_offset(jb)} + rk[:, None] * {sbk} + bn[None, :] * {sbn}")
    if a_dt not in ("bfloat16", "float16", "float32", "float64"):
        raise NotImplementedError(f"no GPU matmul for {a_dt} operands")
    acc_dt = "tl.float64" if a_dt == "float64" else "tl.float32"
    w.line(f"acc = tl.zeros((BLOCK_M, BLOCK_N), dtype={acc_dt})")
    w.line("for kk in range(0, tl.cdiv(K, BLOCK_K)):")
    w.indent += 1
    if v.even_k:
        w.line("a = tl.load(a_ptrs)")
        w.line("b = tl.load(b_ptrs)")
    else:
        w.line("kmask = rk < K - kk * BLOCK_K")
        w.line("a = tl.load(a_ptrs, mask=kmask[None, :], other=0)")
        w.line("b = tl.load(b_ptrs, mask=kmask[:, None], other=0)")
    if a_dt == "float32":
        w.line('acc = tl.dot(a, b, acc, input_precision="ieee")')
    elif a_dt == "float64":      # no fp64 tensor-core path in Triton: FMA over a broadcast product
        w.line("acc += tl.sum(a[:, :, None] * b[None, :, :], axis=1)")
    else:
        w.line("acc = tl.dot(a, b, acc)")
    w.line(f"a_ptrs += BLOCK_K * {sak}")
    w.line(f"b_ptrs += BLOCK_K * {sbk}")
    w.indent -= 1
    w.line("mask = (rm[:, None] < M) & (rn[None, :] < N)")
    loaded: dict[int, str] = {}

    def load(j: int) -> str:
        if j not in loaded:
            t = w.tmp("x")
            level = spec.operands[j][1]
            if level == "scalar":
                w.line(f"{t} = {e.load(j, '0', None)}")
            elif e.layout(j) == "dense":
                w.line(f"{t} = {e.load(j, 'bid * M * N + rm[:, None] * N + rn[None, :]', 'mask')}")
            else:
                sm, sn = e.stride(j, nb), e.stride(j, nb + 1)
                tile = [x for x, s in ((f"rm[:, None] * {sm}", sm), (f"rn[None, :] * {sn}", sn)) if s != "0"]
                if len(tile) == 1 and sm == "0":      # a row vector (bias): broadcast down the tile
                    tile = [f"tl.zeros((BLOCK_M, 1), dtype=rm.dtype) + {tile[0]}"]
                elif len(tile) == 1:
                    tile = [f"{tile[0]} + tl.zeros((1, BLOCK_N), dtype=rn.dtype)"]
                off = " + ".join([batch_offset(j)] + tile)
                w.line(f"{t} = {e.load(j, off, 'mask') if tile else e.load(j, batch_offset(j), None)}")
            loaded[j] = t
        return loaded[j]

    vals: dict[int, str] = {}
    for k, n in enumerate(spec.nodes):
        if n.op == "matmul":
            # The product rounds to its dtype before any epilogue reads it, as on the CPU.
            if n.dtype in ("bfloat16", "float16"):
                w.line(f"acc = acc.to({TL[n.dtype]}).to(tl.float32)")
            vals[k] = "acc"
            continue
        t = w.tmp("v")
        w.line(f"{t} = {e.op(n, [e.arg(a, vals, load) for a in n.args])}")
        vals[k] = t
    for i, k in enumerate(spec.outputs):
        e.store(i, "bid * M * N + rm[:, None] * N + rn[None, :]", vals[k], "mask")
    return e.finish({"BLOCK_M": cfg["BLOCK_M"], "BLOCK_N": cfg["BLOCK_N"], "BLOCK_K": cfg["BLOCK_K"],
                     "GROUP_M": cfg["GROUP_M"]})


def emit(spec: KernelSpec, config: dict[str, int], variant: Variant) -> Emitted:
    e = _Emitter(spec, config, variant)
    if spec.kind == "elementwise":
        return _elementwise(e)
    if spec.kind == "rowwise":
        return _rowwise(e)
    if spec.kind == "matmul":
        return _matmul(e)
    raise ValueError(f"unknown kernel kind {spec.kind!r}")
