"""The front-end issue's contract: programs that must pass `--check`, and mistakes that must be
rejected at the right line with the right code."""

from pathlib import Path

import pytest

from xgbuild.compiler.frontend import check_source
from xgbuild.compiler.frontend.types import TensorType

REPO = Path(__file__).resolve().parents[3]


def test_contract_program_checks() -> None:
    result = check_source((REPO / "examples" / "contract.xg").read_text(), "contract.xg")
    assert result.ok, result.render()
    prog = result.program
    assert prog.target == "H100" and prog.num_gpu == 1
    # Externals inferred from use in main, with symbolic dims unified across calls.
    a, b, w = prog.externals["A"], prog.externals["B"], prog.externals["W"]
    assert a.dtype == b.dtype == w.dtype == "float32"
    assert a.shape[1] == b.shape[0] and b.shape[1] == w.shape[0]
    assert prog.main_ret == TensorType("float32", (a.shape[0], b.shape[1]))


SHARD_PROGRAM = """NUM_GPU = 2
def main() {
    with shard(A, dim=0), shard(B, dim=1):
        C = A @ B
    return C
}
"""


def test_shard_program_checks() -> None:
    result = check_source(SHARD_PROGRAM, "shard.xg")
    assert result.ok, result.render()
    assert [(s.name, s.dim) for s in result.program.shards] == [("A", 0), ("B", 1)]


def test_shard_program_brace_form() -> None:
    src = SHARD_PROGRAM.replace("dim=1):\n        C = A @ B\n", "dim=1) {\n        C = A @ B\n    }\n")
    result = check_source(src, "shard.xg")
    assert result.ok, result.render()


# (name, program, line of the error, code)
REJECTED = [
    ("int64 + float32", "def f(int64 a, float32 b) -> int64 {\n    return a + b\n}\ndef main() {}\n", 2, "XG0100"),
    ("bfloat16 + float32 tensors",
     "def f(Tensor[bfloat16, 4, 4] a, Tensor[float32, 4, 4] b) -> Tensor[float32, 4, 4] {\n    return a + b\n}\ndef main() {}\n",
     2, "XG0100"),
    ("matmul inner dims", "def f(Tensor[float32, 32, 64] a, Tensor[float32, 32, 64] b) -> Tensor[float32, 32, 64] {\n"
     "    return a @ b\n}\ndef main() {}\n", 2, "XG0200"),
    ("x / sum(x)", "def f(Tensor[float32, T, D] x) -> Tensor[float32, T, D] {\n    y = x + 1.0\n"
     "    return x / sum(x, dim=1, keepdim=true)\n}\ndef main() {}\n", 3, "XG0300"),
    ("unguarded a / b", "def f(float32 a, float32 b) -> float32 {\n    return a / b\n}\ndef main() {}\n", 2, "XG0300"),
    ("Result used as value", "def sd(float32 a, float32 b) -> Result[float32] {\n    if b == 0 { return DivByZero }\n"
     "    return Ok(a / b)\n}\ndef main() {\n    r = sd(1.0, 2.0)\n    y = 3.0\n    return y * r\n}\n", 8, "XG0400"),
    ("Result call as statement", "def sd(float32 a, float32 b) -> Result[float32] {\n    if b == 0 { return DivByZero }\n"
     "    return Ok(a / b)\n}\ndef main() {\n    sd(1.0, 2.0)\n    return 1\n}\n", 6, "XG0401"),
    ("x[3, 0] on [3, 5]", "extern Tensor[float32, 3, 5] x\ndef main() {\n    return x[3, 0]\n}\n", 3, "XG0202"),
    ("int32 returned as int64", "def f(int32 a) -> int64 {\n    return a\n}\ndef main() {}\n", 2, "XG0102"),
    ("unknown function", "def main() {\n    y = 1\n    return nope(y)\n}\n", 3, "XG0104"),
    ("[4, 8] * [8, 4]", "def f(Tensor[float32, 4, 8] a, Tensor[float32, 8, 4] b) -> Tensor[float32, 4, 8] {\n"
     "    return a * b\n}\ndef main() {}\n", 2, "XG0201"),
    ("indivisible shard", "NUM_GPU = 4\nextern Tensor[float32, 6, 8] A\ndef main() {\n    with shard(A, dim=0):\n"
     "        C = A * 2.0\n    return C\n}\n", 4, "XG0500"),
]


@pytest.mark.parametrize("name,src,line,code", REJECTED, ids=[r[0] for r in REJECTED])
def test_rejected_at_the_right_line(name: str, src: str, line: int, code: str) -> None:
    result = check_source(src, "bad.xg")
    errors = [(d.line, d.code) for d in result.diagnostics if d.severity.value == "error"]
    assert errors == [(line, code)], result.render()


def test_target_override_gives_a_note() -> None:
    from xgbuild.compiler.frontend import CheckOptions
    result = check_source("TARGET_GPU = GB200\nNUM_GPU = 8\ndef main() { return 1 }\n", "t.xg",
                          CheckOptions(target="h100", num_gpu=2))
    assert result.ok
    assert result.program.target == "H100" and result.program.num_gpu == 2
    assert sorted(d.code for d in result.diagnostics if d.severity.value == "note") == ["XG0702", "XG0702"]


def test_target_names_are_case_insensitive_and_unknown_lists_known() -> None:
    assert check_source("TARGET_GPU = gb200\ndef main() { return 1 }\n").program.target == "GB200"
    bad = check_source("TARGET_GPU = H900\ndef main() { return 1 }\n")
    (diag,) = bad.diagnostics
    assert diag.code == "XG0013" and "H100" in diag.help and "GB200" in diag.help
