"""XG's types, and the unification of symbolic dimensions and dtypes.

A scalar is a rank-0 `TensorType` (`float32` is `Tensor[float32]`), so one rule set serves
scalars and tensors. Dims are integers, rigid symbols (`"M"`: a generic parameter of the function
being checked) or `DimVar`s (unknowns solved per call and per external). Literals have their own
types until their context fixes a dtype, like Go's untyped constants: no typed value is ever
converted implicitly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

INT_DTYPES = ("int8", "int16", "int32", "int64", "uint8")
FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")
DTYPES = ("bool",) + INT_DTYPES + FLOAT_DTYPES

_INT_RANGE = {"int8": (-2**7, 2**7 - 1), "int16": (-2**15, 2**15 - 1), "int32": (-2**31, 2**31 - 1),
              "int64": (-2**63, 2**63 - 1), "uint8": (0, 255)}
# (mantissa bits including the implicit one, largest finite value)
_FLOAT_FORMAT = {"float16": (11, 65504.0), "bfloat16": (8, 3.3895313892515355e38),
                 "float32": (24, 3.4028234663852886e38), "float64": (53, 1.7976931348623157e308)}

NAMED_ERRORS = ("DivByZero", "OutOfBounds", "Overflow", "InvalidValue", "NotFinite", "ShapeMismatch")


@dataclass(frozen=True, slots=True)
class DimVar:
    id: int
    hint: str            # the symbol it came from, for messages ("M")

    def __str__(self) -> str:
        return self.hint


@dataclass(frozen=True, slots=True)
class DTypeVar:
    id: int

    def __str__(self) -> str:
        return "?"


Dim = Union[int, str, DimVar]
DType = Union[str, DTypeVar]


@dataclass(frozen=True, slots=True)
class TensorType:
    dtype: DType
    shape: tuple[Dim, ...] = ()

    @property
    def rank(self) -> int:
        return len(self.shape)

    def __str__(self) -> str:
        if not self.shape:
            return str(self.dtype)
        return f"Tensor[{self.dtype}, {', '.join(str(d) for d in self.shape)}]"


@dataclass(frozen=True, slots=True)
class IntLiteral:
    value: int

    def __str__(self) -> str:
        return "integer literal"


@dataclass(frozen=True, slots=True)
class FloatLiteral:
    value: float

    def __str__(self) -> str:
        return "float literal"


@dataclass(frozen=True, slots=True)
class BoolLiteral:
    value: bool

    def __str__(self) -> str:
        return "bool"


@dataclass(frozen=True, slots=True)
class ResultType:
    inner: "Type"

    def __str__(self) -> str:
        return f"Result[{self.inner}]"


@dataclass(frozen=True, slots=True)
class ErrorValue:
    """A named error (`DivByZero`) or `Err(e)`: becomes whatever `Result[T]` its context needs."""
    name: str

    def __str__(self) -> str:
        return f"error `{self.name}`"


@dataclass(frozen=True, slots=True)
class TupleType:
    items: tuple["Type", ...]

    def __str__(self) -> str:
        return "(" + ", ".join(str(t) for t in self.items) + ")"


@dataclass(frozen=True, slots=True)
class StrType:
    def __str__(self) -> str:
        return "string"


@dataclass(frozen=True, slots=True)
class DTypeValue:
    """A dtype name used as an argument: the `float32` of `cast(x, float32)`."""
    dtype: str

    def __str__(self) -> str:
        return f"dtype `{self.dtype}`"


@dataclass(frozen=True, slots=True)
class ShapeValue:
    """A shape literal `[4, M]`: the argument of `reshape`, `zeros`, `randn`."""
    dims: tuple[Dim, ...]

    def __str__(self) -> str:
        return "[" + ", ".join(str(d) for d in self.dims) + "]"


@dataclass(frozen=True, slots=True)
class GradFn:
    """`grad(f, wrt=...)` / `value_and_grad(...)`: a function value, called right away."""
    func: str
    wrt: tuple[int, ...]        # parameter positions
    tuple_wrt: bool             # `wrt=(a, b)` returns a tuple of gradients
    with_value: bool

    def __str__(self) -> str:
        return f"gradient of `{self.func}`"


@dataclass(frozen=True, slots=True)
class ExternVar:
    """An external whose type its uses have not fixed yet."""
    name: str

    def __str__(self) -> str:
        return f"external `{self.name}`"


@dataclass(frozen=True, slots=True)
class ErrorType:
    """The type of an expression that already produced an error: accepted everywhere, so one
    mistake gives one diagnostic."""

    def __str__(self) -> str:
        return "{error}"


Type = Union[TensorType, IntLiteral, FloatLiteral, BoolLiteral, ResultType, ErrorValue, TupleType,
             StrType, DTypeValue, ShapeValue, GradFn, ExternVar, ErrorType]
ERROR = ErrorType()


def is_float(dtype: DType) -> bool:
    return isinstance(dtype, str) and dtype in FLOAT_DTYPES


def is_int(dtype: DType) -> bool:
    return isinstance(dtype, str) and dtype in INT_DTYPES


def int_fits(value: int, dtype: str) -> bool:
    """Does the integer literal `value` have an exact representation in `dtype`?"""
    if dtype in _INT_RANGE:
        lo, hi = _INT_RANGE[dtype]
        return lo <= value <= hi
    if dtype in _FLOAT_FORMAT:
        bits, largest = _FLOAT_FORMAT[dtype]
        if value == 0:
            return True
        mag = abs(value)
        if mag > largest:
            return False
        mag >>= (mag & -mag).bit_length() - 1   # drop trailing zero bits
        return mag.bit_length() <= bits
    return False


def float_fits(value: float, dtype: str) -> bool:
    """A float literal rounds to the nearest value of its float type, but must stay finite."""
    if dtype not in _FLOAT_FORMAT:
        return False
    return abs(value) <= _FLOAT_FORMAT[dtype][1] or value != value


class Subst:
    """The solved values of the DimVars and DTypeVars of one function check."""

    def __init__(self, counter: list[int]) -> None:
        self.dims: dict[int, Dim] = {}
        self.dtypes: dict[int, DType] = {}
        self._counter = counter      # shared with the checker, so ids never collide

    def fresh_dim(self, hint: str) -> DimVar:
        self._counter[0] += 1
        return DimVar(self._counter[0], hint)

    def fresh_dtype(self) -> DTypeVar:
        self._counter[0] += 1
        return DTypeVar(self._counter[0])

    def dim(self, d: Dim) -> Dim:
        while isinstance(d, DimVar) and d.id in self.dims:
            d = self.dims[d.id]
        return d

    def dtype(self, t: DType) -> DType:
        while isinstance(t, DTypeVar) and t.id in self.dtypes:
            t = self.dtypes[t.id]
        return t

    def resolve(self, ty: Type) -> Type:
        if isinstance(ty, TensorType):
            if ty.dtype.__class__ is str and not any(d.__class__ is DimVar for d in ty.shape):
                return ty     # nothing to solve: the common case
            return TensorType(self.dtype(ty.dtype), tuple(self.dim(d) for d in ty.shape))
        if isinstance(ty, ResultType):
            return ResultType(self.resolve(ty.inner))
        if isinstance(ty, TupleType):
            return TupleType(tuple(self.resolve(t) for t in ty.items))
        if isinstance(ty, ShapeValue):
            return ShapeValue(tuple(self.dim(d) for d in ty.dims))
        return ty

    def unify_dim(self, a: Dim, b: Dim) -> bool:
        a, b = self.dim(a), self.dim(b)
        if a == b:
            return True
        if isinstance(a, DimVar):
            self.dims[a.id] = b
            return True
        if isinstance(b, DimVar):
            self.dims[b.id] = a
            return True
        return False

    def unify_dtype(self, a: DType, b: DType) -> bool:
        a, b = self.dtype(a), self.dtype(b)
        if a == b:
            return True
        if isinstance(a, DTypeVar):
            self.dtypes[a.id] = b
            return True
        if isinstance(b, DTypeVar):
            self.dtypes[b.id] = a
            return True
        return False

    def instantiate(self, ty: Type, mapping: dict[str, DimVar]) -> Type:
        """Replace rigid symbols by per-call DimVars (created on first sight, kept in `mapping`)."""
        if isinstance(ty, TensorType):
            dims = []
            for d in ty.shape:
                if isinstance(d, str):
                    if d not in mapping:
                        mapping[d] = self.fresh_dim(d)
                    d = mapping[d]
                dims.append(d)
            return TensorType(ty.dtype, tuple(dims))
        if isinstance(ty, ResultType):
            return ResultType(self.instantiate(ty.inner, mapping))
        if isinstance(ty, TupleType):
            return TupleType(tuple(self.instantiate(t, mapping) for t in ty.items))
        return ty


def fmt_shape(shape: tuple[Dim, ...]) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"
