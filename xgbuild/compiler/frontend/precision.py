"""The program's mixed-precision policy: the dtype its products compute in (`COMPUTE = bfloat16`).

`COMPUTE` is a file-level declaration the compiler knows, like `TARGET_GPU`: its value is a
floating dtype name. `--const COMPUTE=float32` (constants.py reads the name) overrides it, or states
it for a file that does not declare it. `compute_policy` checks both and gives the dtype, or None
when there is no policy (or one that changes nothing: `float32`); passes/precision.py applies it
to the IR. An imported module's `COMPUTE` is not a policy (modules.py refuses it, as it does a
module's `TARGET_GPU`): the compiled file states the policy of the whole program.
"""

from __future__ import annotations

from . import ast as A
from .codes import BAD_COMPUTE, OVERRIDE
from .constants import ConstantEvaluator
from .diagnostics import Diagnostics
from .types import FLOAT_DTYPES

NAME = "COMPUTE"
# The dtype a program is written in: products of it are the policy's to change; float32 as the
# policy's dtype is no policy at all.
WRITTEN = "float32"


def compute_policy(decl: A.ConstDecl | None, constants: ConstantEvaluator, diags: Diagnostics) -> str | None:
    """The products' dtype the file states (`decl`) or `--const COMPUTE=...` gives; an XG0021 error
    for a value that is not a floating dtype."""
    dtype = None
    if decl is not None:
        v = decl.value
        name = v.id if isinstance(v, A.Name) else None
        if name in FLOAT_DTYPES:
            dtype = name
        else:
            diags.error(BAD_COMPUTE, v.span, label="not a floating dtype",
                        detail=f"`COMPUTE` takes a floating dtype, found `{diags.source.snippet(v.span)[:40]}`",
                        help=_HELP)
    if NAME in constants.overrides:
        constants.applied.add(NAME)       # never "overrides no constant": the compiler knows COMPUTE
        given = constants.overrides[NAME]
        if given not in FLOAT_DTYPES:
            diags.error_outside(BAD_COMPUTE, detail=f"`--const COMPUTE={given}`: `COMPUTE` takes a floating dtype",
                                help=_HELP)
            return None
        if decl is not None and dtype is not None and given != dtype:
            diags.note(OVERRIDE, decl.span, detail=f"`COMPUTE = {dtype}` is overridden by `--const COMPUTE={given}`")
        dtype = str(given)
    return None if dtype in (None, WRITTEN) else dtype


_HELP = ("one of " + ", ".join(f"`{d}`" for d in FLOAT_DTYPES)
         + ", e.g. `COMPUTE = bfloat16` (float32 products computed in bfloat16)")
