"""ONNX values known at import time, and ONNX's dtypes: what the importer and its op tables share.

`Static` is a value the ONNX importer folds instead of emitting IR (an initializer, a constant, a
shape and whatever is computed from them alone, symbolic dims as sympy expressions). A module of
its own so that onnx_import.py (the walk) and onnx_ops.py / onnx_shape_ops.py (the table it walks
with) both import it, and neither imports the other back.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Any

import numpy as np
import sympy

from ..ir.graph import Dim
from .builder import TranslationError
from .composites import dim_expr

# ONNX TensorProto element types -> XG dtypes
ONNX_DTYPES = {1: "float32", 2: "uint8", 3: "int8", 5: "int16", 6: "int32", 7: "int64", 9: "bool",
               10: "float16", 11: "float64", 16: "bfloat16"}
NP_DTYPES = {"float32": np.float32, "uint8": np.uint8, "int8": np.int8, "int16": np.int16, "int32": np.int32,
             "int64": np.int64, "bool": np.bool_, "float16": np.float16, "float64": np.float64}


@dataclass
class Static:
    """A value known at import time: a numpy array (object dtype when it holds symbolic dims)."""
    array: np.ndarray
    dtype: str                          # the XG dtype it has in the model

    def __post_init__(self) -> None:
        # numpy hands back a bare element (a sympy Symbol, a numpy scalar) from indexing with
        # scalars; every Static holds an array, 0-d included.
        if not isinstance(self.array, np.ndarray):
            self.array = np.asarray(self.array, dtype=object if isinstance(self.array, sympy.Basic) else None)

    @property
    def symbolic(self) -> bool:
        return self.array.dtype == object and any(not _is_int(v) for v in self.array.reshape(-1))


def _is_int(v: Any) -> bool:
    return isinstance(v, (int, np.integer)) or (isinstance(v, sympy.Basic) and v.is_Integer)


def sym(d: Any) -> sympy.Expr:
    """An IR dim (an int, a symbol, an expression such as `4*batch` or `(seq-1)//2`) as sympy."""
    if isinstance(d, sympy.Basic):
        return d
    if isinstance(d, str):
        return sympy.Symbol(d) if d.isidentifier() else _parse(d)
    return sympy.Integer(int(d))


def _parse(text: str) -> sympy.Expr:
    tree = ast.parse(text, mode="eval").body

    def ev(n: ast.AST) -> sympy.Expr:
        if isinstance(n, ast.Constant) and isinstance(n.value, int):
            return sympy.Integer(n.value)
        if isinstance(n, ast.Name):
            return sympy.Symbol(n.id)
        if isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.USub):
            return -ev(n.operand)
        if isinstance(n, ast.BinOp) and type(n.op) in (ast.Add, ast.Sub, ast.Mult, ast.FloorDiv):
            a, b = ev(n.left), ev(n.right)
            return {ast.Add: lambda: a + b, ast.Sub: lambda: a - b, ast.Mult: lambda: a * b,
                    ast.FloorDiv: lambda: sympy.floor(a / b)}[type(n.op)]()
        raise TranslationError(f"the size {text!r}")
    return ev(tree)


def ir_dim(d: Any) -> Dim:
    """A size as the IR spells it: an int, a symbol, or an integer expression of symbols in
    `+ - * //` (what `passes/specialize.size_of` evaluates)."""
    if isinstance(d, (int, np.integer)):
        return int(d)
    if isinstance(d, sympy.Basic):
        d = sympy.expand(d)
        # the canonical form composites.dim_expr gives sizes the other importer computes
        return int(d) if d.is_Integer else dim_expr(_spell(d))
    raise TranslationError(f"a size {d!r}")


def _spell(e: sympy.Expr) -> str:
    if e.is_Integer:
        return str(int(e))
    if e.is_Symbol:
        return e.name
    if isinstance(e, sympy.floor):
        num, den = sympy.fraction(sympy.together(e.args[0]))
        if den.is_Integer and den > 0:
            return f"({_spell(sympy.expand(num))})//{int(den)}"
    if e.is_Add:
        terms = sorted(e.args, key=lambda a: (a.is_Number, sympy.default_sort_key(a)))
        out = _spell(terms[0])
        for a in terms[1:]:
            out += f"-{_spell(-a)}" if a.could_extract_minus_sign() else f"+{_spell(a)}"
        return out
    if e.is_Mul and all(a.is_Integer or a.is_Symbol or isinstance(a, sympy.floor) or a.is_Add for a in e.args):
        if e.args[0] == -1:
            return "-" + _spell(sympy.Mul(*e.args[1:]))
        return "*".join(f"({_spell(a)})" if a.is_Add or isinstance(a, sympy.floor) else _spell(a) for a in e.args)
    raise TranslationError(f"the size {e} (a size is an integer expression of symbols in + - * //)")
