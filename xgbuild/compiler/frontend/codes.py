"""The registry of diagnostic codes: one `Code` each, with its message template and explanation.

Every diagnostic XG emits names a code from this table; `xgbuild explain XG0100` prints the
explanation. Message templates are lowercase, with no final period, code in backticks (rustc's
house style). Tests check that every code is documented and every template formats.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Code:
    code: str
    title: str
    message: str
    explanation: str

    def fmt(self, **kw: object) -> str:
        return self.message.format(**kw)


CODES: dict[str, Code] = {}


def _code(code: str, title: str, message: str, explanation: str) -> Code:
    entry = Code(code, title, message, explanation.strip())
    assert code not in CODES, code
    CODES[code] = entry
    return entry


# --- input and syntax (XG00xx) --------------------------------------------------------------
SYNTAX = _code("XG0001", "syntax error", "{detail}", """
The parser met a token it did not expect. The caret points at that token; the label says what
would have been valid there. Statements end at a newline or `}`; blocks are `{ ... }`, except the
seed's `with shard(...):` form, whose block is the indented lines that follow it.
""")
BAD_CHAR = _code("XG0002", "invalid character or literal", "{detail}", """
The lexer met a character that cannot start any token (XG source is ASCII outside comments and
strings), or a malformed literal such as `1e` or `0x` or an unterminated string.
""")
NOT_UTF8 = _code("XG0003", "source is not UTF-8", "{path} is not valid UTF-8 (byte {offset})", """
XG sources must be UTF-8 text. The message gives the offset of the first byte that does not
decode. This usually means a binary file was passed by mistake.
""")
TOO_DEEP = _code("XG0004", "nesting too deep", "{what} deeper than {limit} levels", """
XG bounds how deep a program may nest, so that no stage after the parser (checker, lowering,
passes) can run out of stack:

- parentheses, calls, indexing, blocks and `match` may nest at most 100 levels;
- one expression may be at most 2,000 levels deep, counting every operator of a chain
  (`a + b + ...` is a tree as deep as it has terms), every postfix (`x[0:4][0:4]...`,
  `.unwrap_or(...)`) and every nesting level;
- calls between functions may be at most 1,000 deep (`main` calls `f1`, which calls `f2`, ...).

Deeper code is almost certainly generated code gone wrong; split it into named intermediate
values (`t = a + b + ...` then `u = t + ...`) or functions. The parser stops at the first such
error, and nothing else is reported for the file.
""")
INDENT = _code("XG0005", "bad indentation", "{detail}", """
A `with shard(...):` block (the seed's form) is made of the lines after it that are indented more
than the `with` line. Its first statement must be on the next line and indented; the block ends at
the first line indented no deeper than the `with`. The brace form `with shard(A, dim=0) { ... }`
has no indentation rules.
""")
TOO_MANY = _code("XG0006", "too many errors", "too many errors; stopped after {limit}", """
XG stops reporting after a fixed number of errors in one file: later ones are usually
consequences of the first. Fix the first errors and check again.
""")
FILE_ERROR = _code("XG0007", "cannot read source", "cannot read {path}: {reason}", """
The source file does not exist, is a directory, or cannot be read. XG reads only regular files
of at most 16 MiB as sources and modules: a FIFO, a device (`/dev/zero`), a socket or a larger
file is refused before anything is read from it.
""")
TOO_LARGE = _code("XG0008", "program too large", "the program has more than {limit} {what}", """
XG bounds the size of what one check reads, so that a hostile or runaway generated source costs
seconds and bounded memory, never minutes and gigabytes: a file may hold at most 262,144
tokens (names, numbers, operators). Split a larger program into modules, or compute with tensors
instead of unrolling a computation into code. The lexer stops at the limit; nothing else is
reported for the file.
""")

# --- program structure (XG001x) -------------------------------------------------------------
NO_MAIN = _code("XG0010", "missing `main`", "no `main` function in {path}", """
Rule 4 of the language: a program starts at `def main() { ... }`. A file meant as a library of
functions is checked with `xgc FILE --check --lib` (Bazel's `xg_library`), which does not need one.
""")
DUPLICATE = _code("XG0011", "duplicate definition", "`{name}` is defined more than once", """
Each function, parameter, constant and external has one definition per scope.
""")
BAD_DECL = _code("XG0012", "invalid file-level declaration", "{detail}", """
At file level only `def`, `extern`, `import` and constant declarations `NAME = value` are
allowed. A constant's value is a literal or arithmetic (`+ - * / %`, parentheses) on literals and
constants declared above it (`F = 4 * D`); the hardware declarations are `TARGET_GPU = <GPU
name>` and `NUM_GPU = <positive integer>`. Statements belong inside a function.
""")
UNKNOWN_TARGET = _code("XG0013", "unknown target GPU", "unknown target GPU `{name}`", """
`TARGET_GPU` (and `--target`) name a GPU profile from the `hw/` directory, case-insensitively.
The help line lists the known ones. Add a profile file to `hw/` to support a new GPU.
""")
BAD_NUM_GPU = _code("XG0014", "invalid `NUM_GPU`", "`NUM_GPU` must be a positive integer, found {value}", """
`NUM_GPU` is the number of GPUs the program is planned for; it must be an integer literal >= 1
(and at most 1,048,576).
""")
MAIN_PARAMS = _code("XG0015", "`main` takes no parameters", "`main` takes no parameters", """
`main` is the entry point. Its inputs are externals: names it uses without defining, bound at run
time by `xg.run_engine(engine, external_values={...})` or `xgrun --inputs`. Declare their types
with `extern Tensor[float32, 64, 32] P`.
""")

NO_ENTRY = _code("XG0017", "missing entry function", "no function `{name}` in {path} to use as the entry point", """
An engine runs its entry point: `main` unless another is named (`xgc --entry NAME`, Bazel's
`xg_engine(entry = "NAME")`). An entry other than `main` takes the engine's inputs as its
parameters (tensors and scalars), in order, named as the parameters are.
""")

BAD_IMPORT = _code("XG0016", "bad import", "{detail}", """
`import std.nn` loads `std/nn.xg` from XG's standard library; `import mylib` loads `mylib.xg`
beside the importing file (`import a.b` loads `a/b.xg`). A module holds functions and constants
only: no `main`, no `extern`, no `TARGET_GPU` or `NUM_GPU`. Imports may not form a cycle (the
message names its files: `a.xg -> b.xg -> a.xg`), and a module with errors cannot be imported
(its diagnostics are listed as notes). A module is read like a source: a regular file of at most
16 MiB. Imports may nest at most 32 modules deep, and a program may import at most 256 modules.
""")

BAD_LOOP = _code("XG0018", "invalid `for` loop", "{detail}", """
`for l in range(N) { ... }` repeats its block N times, with `l` the constant 0, 1, ..., N-1: the
loop is unrolled when the program is compiled, so each iteration may index a stacked weight with
its own constant (`W[l]`), and a value reassigned in the block (`x = block(x, W[l])`) carries
over to the next iteration. `range(start, stop)` counts from `start`. The bounds must be integer
constants (literals, file-level constants, or arithmetic on them), the loop may repeat its block
at most 4,096 times (and unroll at most 65,536 iterations in one program, nested loops
multiplied), and the block may not `return` or assign the loop variable: compute a value in the
loop and return after it.
""")
BAD_CONST_OVERRIDE = _code("XG0019", "invalid constant override", "{detail}", """
`xgc --const NAME=VALUE` (Bazel's `consts = {"NAME": "VALUE"}`, `xg.compile_file(...,
consts={...})`) replaces the value of the file-level constant `NAME` of the compiled file, e.g.
`--const L=2 --const D=64` for a small configuration of a model whose sizes are constants. The
constant must exist in that file (not in an imported module), and the value must be of the
constant's kind: an integer for an integer constant, a number for a float constant, `true` or
`false` for a boolean. Constants computed from it (`F = 4 * D`) follow. `TARGET_GPU` and
`NUM_GPU` have their own options: `--target` and `--num-gpu`.
""")
BAD_STATE = _code("XG0020", "invalid state declaration", "{detail}", """
`extern state T W` makes `W` part of a training step's state: `main`'s outputs end with the next
value of every state input, in the order they are declared, each of the input's type. `xgrun
--steps N` feeds those outputs back as the inputs of the next step, on the device. For example:

    extern state Tensor[float32, 16, 32] W
    extern state Tensor[float32, 16, 32] M_W
    extern counter float32 STEP
    def main() {
        ...
        return (loss, w2, m_w2)      # w2 is W's next value, m_w2 is M_W's
    }

`extern counter float32 STEP` (or `int64`) declares a step counter: a scalar that `xgrun --steps`
advances by 1 after every step; it is not an output. The error says which declaration does not
match: more state inputs than `main` returns values, a next value of another type or shape, a
`main` returning a `Result`, or a counter that is not a scalar.
""")
BAD_COMPUTE = _code("XG0021", "invalid precision policy", "{detail}", """
`COMPUTE = bfloat16` (a file-level declaration of the compiled file) states the program's
mixed-precision policy: every `float32` product (`@`, and so attention's `q @ k` and `p @ v`)
takes its operands rounded to `COMPUTE` and gives its result in `COMPUTE`, accumulating in float32
inside the kernel; its consumers read it back as `float32`. Everything else (reductions, softmax,
normalisation, the loss, the optimizer) and every input, parameter and optimizer state stays
`float32`, and gradients flow through the conversions, so the backward products run in `COMPUTE`
too: what `torch.autocast(dtype=torch.bfloat16)` does around a training step. For example:

    COMPUTE = bfloat16        # or float16; float32 turns the policy off

`COMPUTE` takes one of XG's floating dtypes: `float16`, `bfloat16`, `float32`, `float64`. A
product written in another dtype (`float64`, or already 16-bit) is left as written.
`--const COMPUTE=float32` (Bazel's `consts = {"COMPUTE": "float32"}`) overrides it, for example to
compare the program in float32 with a reference, and `--const COMPUTE=bfloat16` states it for a
file that does not. See docs/precision.md.
""")

# --- types (XG01xx) -------------------------------------------------------------------------
DTYPE_MISMATCH = _code("XG0100", "mismatched dtypes", "mismatched dtypes: `{left}` {op} `{right}`", """
XG never converts between dtypes implicitly (Rules 1 and 2). Both operands of an arithmetic or
comparison operator must have the same dtype: `int64 + float32` and `bfloat16 + float32` are
errors. Convert explicitly with `cast(x, float32)`. An integer literal adapts to any numeric type
that holds its value exactly; a float literal adapts to any float type.
""")
TYPE_MISMATCH = _code("XG0101", "mismatched types", "mismatched types: expected `{expected}`, found `{found}`", """
A value's type does not match what its context requires: an argument against its parameter, a
value against a declared type, the branches of a `match` or `where` against each other.
""")
RETURN_MISMATCH = _code("XG0102", "wrong return type", "`{name}` returns `{found}` but is declared to return `{expected}`", """
The value returned does not have the function's declared return type. XG does not convert on
return: `return cast(x, int64)` if a conversion is meant.
""")
UNKNOWN_NAME = _code("XG0103", "unknown name", "cannot find value `{name}` in this scope", """
The name is not a parameter, a local, a file-level constant or an external. Externals (engine
inputs) are names that `main` uses without defining; other functions must receive values as
parameters.
""")
UNKNOWN_FUNC = _code("XG0104", "unknown function", "cannot find function `{name}`", """
The called name is neither a function defined in this file nor a builtin. The help line suggests
the closest known name when there is one.
""")
ARITY = _code("XG0105", "wrong number of arguments", "`{name}` takes {expected} argument{s} but {found} {were} given", """
A call passes a different number of positional arguments than the function declares.
""")
BAD_KWARG = _code("XG0106", "bad keyword argument", "{detail}", """
A keyword argument is not accepted by the function, is given twice, or a required one is
missing. Builtins take their options by keyword: `sum(x, dim=1, keepdim=true)`.
""")
BAD_CAST = _code("XG0107", "invalid cast", "{detail}", """
`cast(x, T)` converts a scalar or tensor to another numeric dtype `T`; it cannot change a
`Result`, a tuple, or a shape.
""")
LITERAL_RANGE = _code("XG0108", "literal does not fit", "literal `{literal}` does not fit in `{dtype}`", """
An integer literal adapts to the numeric type its context needs only when that type holds its
value exactly; a float literal never becomes an integer.

Every integer literal must fit in `int64` (-9223372036854775808 to 9223372036854775807), and a
float literal must be finite as a `float64` (`1e400` is not infinity: it is an error). Dimensions
in `Tensor[...]` are integers of the same range.
""")
CONST_OVERFLOW = _code("XG0113", "constant arithmetic overflows", "{detail}", """
XG computes arithmetic on literals exactly while it checks (`2 * 3` is the literal `6`), and the
result must still fit its type: an integer constant must fit in `int64`, a float constant must be
finite in `float64`. `9223372036854775807 + 1` is an error here, not a silent wrap. Arithmetic on
typed values (an `int64` tensor plus one) wraps at run time as two's complement, like PyTorch.
""")
NOT_CALLABLE = _code("XG0109", "wrong kind of value", "{detail}", """
A value was used in a way its kind does not allow: calling something that is not a function,
indexing a scalar, destructuring a value that is not a tuple, using a dtype name as a value.
""")
COND_NOT_BOOL = _code("XG0110", "condition is not a `bool`", "`if` condition must be a scalar `bool`, found `{found}`", """
An `if` condition is one `bool`. Compare explicitly (`if n != 0`); for element-wise choices on
tensors use `where(cond, a, b)`.
""")
UNKNOWN_TYPE = _code("XG0111", "unknown type", "unknown type `{name}`", """
Scalar types are `bool int8 int16 int32 int64 uint8 float16 bfloat16 float32 float64`; tensors are
`Tensor[dtype, dim, ...]` with integer or symbolic dims; results are `Result[T]`.
""")
NOT_DIFFERENTIABLE = _code("XG0112", "not differentiable", "{detail}", """
`grad(f, wrt=p)` differentiates a function returning a floating-point scalar with respect to its
floating-point parameters. Integers, booleans and comparisons have no gradient.
""")

# --- shapes (XG02xx) ------------------------------------------------------------------------
MATMUL_SHAPE = _code("XG0200", "matmul shapes do not match", "matmul inner dimensions differ: `{left}` @ `{right}`", """
`a @ b` needs the last dimension of `a` to equal the second-to-last of `b` (for 1-D operands, the
only one). Both operands need rank >= 1; leading (batch) dimensions broadcast.
""")
BROADCAST = _code("XG0201", "shapes do not broadcast", "shapes `{left}` and `{right}` do not broadcast", """
Element-wise operators combine tensors of the same shape, or broadcast: the shorter shape is
aligned with the trailing dimensions of the longer, and a dimension of size 1 stretches. `[M, N] +
[N]` and `[T, D] * [T, 1]` work; `[4, 8] * [8, 4]` does not. Symbolic dims must be the same name
to be equal.
""")
OUT_OF_BOUNDS = _code("XG0202", "index out of bounds", "index {index} is out of bounds for dimension {dim} of size {size}", """
Rule 3: with known shapes, constant indices and slices are checked at compile time. Indices run
from 0 to size - 1, or from -size to -1 counting from the end.
""")
BAD_DIM = _code("XG0203", "dimension out of range", "dimension {dim} is out of range for a tensor of rank {rank}", """
A reduction, `softmax`, `transpose` or `shard` names a dimension that the tensor does not have.
Valid dims are 0 .. rank-1, or -rank .. -1.
""")
RANK = _code("XG0204", "wrong rank", "{detail}", """
The operation needs a tensor of a different rank (number of dimensions), e.g. too many indices.
""")
RESHAPE = _code("XG0205", "bad reshape", "{detail}", """
`reshape(x, [d0, d1, ...])` keeps the number of elements; with known dims that is checked at
compile time.
""")
DIM_CONFLICT = _code("XG0206", "inconsistent dimension", "dimension `{name}` is {first} here but was {second} earlier", """
A symbolic dimension names one size per call: in `f(Tensor[float32, M, K] a, Tensor[float32, K,
N] b)`, `K` must be the same for both arguments.
""")

# --- safety (XG03xx) ------------------------------------------------------------------------
DIV_UNSAFE = _code("XG0300", "division by a value that may be zero", "cannot prove the divisor `{divisor}` is nonzero", """
Rule 3: division by zero must be handled explicitly. A divisor must be provably nonzero:
a nonzero constant; a scalar guarded on every path by an earlier `if b == 0 { return ... }`
(or used inside `if b != 0 { ... }`); or a value the range analysis proves positive: `exp`,
`softmax`, `sigmoid`, `sqrt`/`rsqrt` of a positive value, `x * x + eps` with `eps > 0`, sums and
means of positive values.
""")
RSQRT_UNSAFE = _code("XG0301", "`rsqrt` of a value that may be zero", "cannot prove the argument `{arg}` of `rsqrt` is positive", """
`rsqrt(x)` is `1 / sqrt(x)`, a division: its argument must be provably positive, typically by
adding a positive epsilon: `rsqrt(mean(x * x, dim=1, keepdim=true) + 1e-5)`.
""")

# --- results (XG04xx) -----------------------------------------------------------------------
RESULT_AS_VALUE = _code("XG0400", "`Result` used as its value", "a `{found}` is not a `{inner}`", """
Rule 5: errors are values. A `Result[T]` must be taken apart before its value is used:
`match r { Ok(v) => v, Err(e) => fallback }` or `r.unwrap_or(fallback)`.
""")
RESULT_UNUSED = _code("XG0401", "unhandled `Result`", "{detail}", """
Rule 5: a `Result` may not be dropped: every `Result` must be handled with `match` or
`.unwrap_or(...)`, or returned to the caller. A call returning a `Result` cannot stand alone as a
statement, and a variable holding one must be handled before the function ends.
""")
BAD_MATCH = _code("XG0402", "bad `match`", "{detail}", """
A `match` on a `Result` has exactly the arms `Ok(v) => ...` and `Err(e) => ...` (or a named error
such as `DivByZero => ...` before a final `Err(e)` or `_`). Every arm gives a value of the same
type.
""")
ERROR_OUTSIDE_RESULT = _code("XG0403", "error value outside a `Result`", "{detail}", """
Named errors such as `DivByZero` and `Ok(v)` build a `Result`; they can only be returned from a
function declared `-> Result[T]`.
""")

# --- sharding (XG05xx) ----------------------------------------------------------------------
SHARD_INDIVISIBLE = _code("XG0500", "sharded dimension not divisible", "dimension {dim} of `{name}` has size {size}, which `NUM_GPU = {num_gpu}` does not divide", """
`shard(A, dim=d)` splits dimension `d` of `A` evenly over `NUM_GPU` GPUs; its size must be a
multiple of `NUM_GPU`. Pad the tensor, pick another dimension, or change `NUM_GPU`.
""")
SHARD_UNKNOWN = _code("XG0501", "shard of an unknown name", "cannot shard `{name}`: no such value", """
`shard(X, dim=d)` names a value defined before the `with` block: a parameter, a local or an
external.
""")
SHARD_BAD = _code("XG0502", "invalid shard", "{detail}", """
`shard(X, dim=d)` takes a tensor name and a constant dimension in range, each value at most once
per `with`.
""")

SHARD_CONFLICT = _code("XG0503", "conflicting shardings", "`{name}` is sharded along dimension {first} and along dimension {second}", """
One value has one layout at a time. A `with shard(X, dim=a)` block inside another that shards `X`
along a different dimension, or a sharding plan file (`--sharding`) that splits a value along one
dimension while the program (or another entry of the plan) splits it along another, is
contradictory: pick one. To change a layout on purpose, compute a new value and shard that.
""")
SHARD_MEMORY = _code("XG0504", "plan exceeds GPU memory", "{detail}", """
After sharding, each GPU must hold its pieces of the engine's inputs (weights, optimizer state and
data) and, at the peak, the intermediate values alive at once. The compiler adds these up per
GPU from the plan and compares them with the target's HBM size (from its `hw/` profile). Shard
the largest inputs (`with shard(W, dim=0)` or a `--sharding` plan), raise `NUM_GPU`, or pick a
target with more memory.
""")
PLAN_UNKNOWN = _code("XG0505", "sharding plan names an unknown region", "{detail}", """
Every entry of a `--sharding` plan file names something in the program: a region (a
`with shard("name"):` block), a function, or a value (an external input or a parameter of a
function the entry names). A name that matches nothing is most likely a typo, so it is an error.
""")
PLAN_BAD = _code("XG0506", "invalid sharding plan", "{detail}", """
A sharding plan (`--sharding plan.toml`) maps names to strategies:

    [regions.layer1]          # a `with shard("layer1"):` block, or a function name
    strategy = "data"         # data | tensor | replicated
    axis = 0                  # data: the batch dimension of the region's inputs
    replicated = ["w"]        # data: inputs that stay whole (parameters)
    [regions.mlp]
    strategy = "tensor"
    shard = { w1 = 1, w2 = 0 }   # tensor: parameter -> dimension
    [regions.head]
    strategy = "pipeline"
    stage = 1                 # pipeline: the region's stage (or its GPUs: `workers = [2, 3]`)
    [values]
    TOKENS = 0                # an external input split along dimension 0

See docs/sharding.md.
""")
PLAN_PIPELINE = _code("XG0507", "unsupported pipeline plan", "{detail}", """
A pipeline plan places whole regions on stages (`stage = K`, or the stage's GPUs: `workers =
[2, 3]`). A stage of several GPUs splits the `[pipeline] split` batch over them (data parallel).
Not supported yet: splitting anything else inside a pipeline (pipeline regions beside `data` or
`tensor` regions, `[values]` splits, or the program's own `with shard(x, dim=...)`), i.e. tensor
parallelism inside a stage. Use one kind of plan per engine.
""")

# --- control flow (XG06xx) ------------------------------------------------------------------
RECURSION = _code("XG0600", "recursion", "`{name}` calls itself (through {path})", """
XG programs compile to fixed graphs of kernels; recursion is not supported.
""")
MISSING_RETURN = _code("XG0601", "missing return", "`{name}` is declared to return `{expected}` but not every path returns", """
Every path through a function with a declared return type must end in `return`.
""")
UNREACHABLE = _code("XG0602", "unreachable code", "unreachable statement after `return`", """
Statements after a `return` in the same block never run.
""")

# --- warnings and notes (XG07xx) ------------------------------------------------------------
UNUSED_VAR = _code("XG0700", "unused value", "value `{name}` is assigned but never used", """
A warning: the assigned value is never read. Its computation is removed from the engine.
Prefix the name with `_` to silence it.
""")
DEFAULT_DTYPE = _code("XG0701", "external dtype defaulted", "the dtype of external `{name}` is not determined by its uses; assuming `float32`", """
A warning: an external's dtype comes from an `extern` declaration or from its uses. When neither
fixes it, XG assumes `float32`. Declare it: `extern Tensor[float32, M, K] {name}`.
""")
OVERRIDE = _code("XG0702", "declaration overridden", "{detail}", """
A note: a command-line option overrides a declaration of the file: `--target` its `TARGET_GPU`,
`--num-gpu` its `NUM_GPU`, `--const NAME=VALUE` its constant `NAME`.
""")

# --- imported models (XG08xx) ---------------------------------------------------------------
UNSUPPORTED_OPS = _code("XG0800", "unsupported ops in an imported model", "{what} uses {count} unsupported op{s}", """
`xg.compile` and `xgc-onnx` translate every op of the model into XG's graph IR. The notes list
each op that has no translation, with the module (PyTorch) or node (ONNX) that uses it and why,
when the op is supported only in some forms. Supported ops are listed in docs/importers.md. With
`xg.compile(..., fallback="eager")` the listed ops run through PyTorch instead, with one warning.
""")
MODEL_INPUT = _code("XG0801", "model input XG cannot import", "{detail}", """
An imported model's inputs become the engine's inputs. They must be tensors (a PyTorch model's
positional arguments, an ONNX graph's inputs) of a dtype XG has: `float16`, `bfloat16`,
`float32`, `float64`, `int8`, `int16`, `int32`, `int64`, `uint8` or `bool`. Other kinds of input
(Python scalars, lists, custom objects, inputs torch.export marks as tokens) are not imported:
close over them, or pass them as tensors.
""")
MODEL_DTYPE = _code("XG0802", "weight of a dtype XG has no type for", "{detail}", """
Every weight (parameter, buffer or constant tensor; an ONNX initializer) is stored in the engine
with one of XG's dtypes: `float16`, `bfloat16`, `float32`, `float64`, `int8`, `int16`, `int32`,
`int64`, `uint8` or `bool`. Complex, quantized and float8 tensors have no XG type: convert the
weight (e.g. `model.float()`) before compiling.
""")
MODEL_TRAINING = _code("XG0803", "model in training mode", "{detail}", """
An engine computes a fixed function of its inputs: it cannot update the model's state as it
runs. A module in training mode does (batch norm updates its running statistics, dropout draws
random masks), so XG refuses it. Call `model.eval()` before `xg.compile`.
""")
MODEL_OUTPUT = _code("XG0804", "model output XG cannot import", "{detail}", """
An imported model's outputs become the engine's outputs, so each must be a tensor (or a tuple or
list of tensors; an ONNX graph's outputs) of a dtype XG has. Return the tensors themselves:
Python numbers, strings and custom objects are not engine outputs.
""")
NOT_CAPTURED = _code("XG0805", "model cannot be captured", "torch.export could not capture the model: {detail}", """
`xg.compile` captures a PyTorch model with `torch.export.export(model, example_inputs)`, which
traces one fixed graph. Python control flow that depends on tensor values (`if x.sum() > 0:`),
data-dependent shapes and some Python constructs cannot be traced. The message repeats
torch.export's first line. Use `torch.where` or `torch.cond` instead of `if`, or move the
data-dependent part out of the model.
""")
BAD_ONNX = _code("XG0806", "not an ONNX model XG can read", "{detail}", """
`xgc-onnx` reads an ONNX file (protobuf, with its external data beside it) and checks it with
`onnx.checker` before importing. The file is missing, unreadable, not ONNX, holds no graph, or
fails the checker; the message says which. Re-export the model (`torch.onnx.export`) or check it
with `python -m onnx.checker FILE`.
""")

# --- internal, and not supported yet (XG09xx) -----------------------------------------------
INTERNAL = _code("XG0900", "internal compiler error", "internal compiler error: {detail}", """
XG itself failed: this is a bug in XG, not in the program. The message names the dump file that
holds the traceback; please attach it to a bug report.
""")
NOT_LOWERED = _code("XG0901", "not supported by the compiler yet", "{detail}", """
The checker accepts the construct, but this compiler cannot turn it into graph IR yet: for
example a parameter of a structured type on the entry function, a value returned on some paths of
an `if` and not on others, or slice bounds that are not constants. The message names what and
the caret where. Rewrite that piece (make the bound a constant, return on every path, pass
tensors), or report the case so support can be added.
""")

# --- GPU kernels (XG10xx) -------------------------------------------------------------------
NO_GPU_CODE = _code("XG1000", "no GPU code", "no GPU code for {what}: {detail}", """
Building an engine with kernels turns each fused group of ops into a Triton kernel. Some
programs and shapes have no kernel template yet; the message names the kernel (or the program)
and what is missing. Build without GPU kernels (`xgc --no-kernels`, `kernels=False`) to run the
engine on the CPU reference executor, or report the case.
""")
KERNEL_COMPILE = _code("XG1001", "kernel failed to compile", "could not compile kernel {name} for sm_{arch} with Triton: {detail}", """
Triton failed on a kernel XG generated, for the target's architecture. The message repeats the
last and first lines of Triton's error. This is most often a Triton other than the version XG
pins (`triton==3.6.0` in pyproject.toml) or a configuration the target cannot hold; it is not a
mistake in the program. Report it with the output of `xgc --emit ir-opt` for the program.
""")
NO_TUNED_KERNEL = _code("XG1002", "tuning results do not match the program", "no tuned kernel for {missing} of {total} jobs: {jobs}", """
Linking (`xgc --kernels-from`, Bazel's link step) takes each kernel's winner from the tuning
results given. A job with no result means those results were made from another version of the
program, another target or other tuning shapes (`--dim`). Tune again from the same program and
options (`xgbuild tune`), or let `xgc` tune as it builds.
""")
