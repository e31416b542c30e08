"""Attacks with hostile sources (issue 26, classes 3-7 on the language side).

Each test forges what an attacker controls (a source, a module beside it, a link, a FIFO) and
asserts a clear refusal: XG diagnostics with a code and a place, or one `cannot read` line, exit 1
(2 for an unreadable main file, as `xgc` documents), no traceback, no internal error, within
seconds and bounded memory. Subprocess runs are killed past their time limit and run under an
address-space limit (RLIMIT_AS): going past it is a MemoryError, a traceback, a failed test.
(Peak RSS from wait4 would not do: it counts the pytest process the child was forked from.)
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from xgbuild.compiler.frontend import check_file, check_source
from xgbuild.compiler.frontend.lexer import MAX_TOKENS
from xgbuild.compiler.frontend.parser import MAX_DEPTH, MAX_TREE_DEPTH
from xgbuild.compiler.frontend.checker import MAX_CALL_DEPTH
from xgbuild.compiler.frontend.source import MAX_SOURCE_BYTES

REPO = Path(__file__).resolve().parents[3]
HEADER = "extern Tensor[float32, 4, 4] A\n"
CHECK_MEMORY_MB = 1024     # address space for `xgc --check` (no torch): a refusal needs far less
BUILD_MEMORY_MB = None     # builds import torch, whose libraries map gigabytes of address space


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str
    seconds: float


def run_bounded(args: list[str], timeout: float, memory_mb: int | None) -> Run:
    """Run a command killed past `timeout` seconds, with at most `memory_mb` of address space."""
    def limit() -> None:
        if memory_mb is not None:
            resource.setrlimit(resource.RLIMIT_AS, (memory_mb << 20, memory_mb << 20))

    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.monotonic()
        proc = subprocess.Popen(args, stdout=out, stderr=err, stdin=subprocess.DEVNULL, cwd=REPO,
                                env={**os.environ, "PYTHONPATH": str(REPO)}, preexec_fn=limit)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            pytest.fail(f"{args} ran past {timeout} s (killed)")
        seconds = time.monotonic() - start
        out.seek(0)
        err.seek(0)
        return Run(proc.returncode, out.read().decode(errors="replace"), err.read().decode(errors="replace"), seconds)


def xgc(*args: str, timeout: float = 60) -> Run:
    check_only = "--check" in args
    return run_bounded([sys.executable, "-m", "xgbuild.cli.xgc", *args], timeout,
                       CHECK_MEMORY_MB if check_only else BUILD_MEMORY_MB)


def assert_refused(run: Run, code: int, *needles: str) -> None:
    assert run.returncode == code, run.stderr[-3000:]
    for stream in (run.stdout, run.stderr):
        assert "Traceback" not in stream and "internal" not in stream and "MemoryError" not in stream, stream[-3000:]
    for needle in needles:
        assert needle in run.stderr, run.stderr[-3000:]


def codes(result) -> list[str]:
    return [d.code for d in result.diagnostics if d.severity.value == "error"]


def assert_no_internal(result) -> None:
    assert "XG0900" not in codes(result), result.render()[-3000:]


def program(body: str, header: str = HEADER) -> str:
    return header + "def main() {\n" + body + "}\n"


# --- class 3: only regular files are sources ----------------------------------------------------

@pytest.mark.timeout(60)
def test_fifo_as_main_file_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "main.xg"
    os.mkfifo(fifo)            # no writer: opening it for reading would block forever
    run = xgc(str(fifo), "--check", timeout=30)
    assert_refused(run, 2, "XG0007", "not a regular file (a FIFO)")
    assert run.stderr.count("error[") == 1


@pytest.mark.timeout(60)
def test_fifo_as_imported_module_is_refused_without_blocking(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "evil.xg")
    main = tmp_path / "main.xg"
    main.write_text("import evil\n" + program("    return A\n"))
    run = xgc(str(main), "--check", timeout=30)
    assert_refused(run, 1, "XG0016", "cannot import `evil`: not a regular file (a FIFO)")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("device", ["/dev/zero", "/dev/urandom"])
def test_module_linked_to_an_endless_device_is_refused(tmp_path: Path, device: str) -> None:
    (tmp_path / "evil.xg").symlink_to(device)
    main = tmp_path / "main.xg"
    main.write_text("import evil\n" + program("    return A\n"))
    run = xgc(str(main), "--check", timeout=30)
    assert_refused(run, 1, "XG0016", "not a regular file (a device)")


@pytest.mark.timeout(60)
def test_main_file_linked_to_dev_zero_is_refused(tmp_path: Path) -> None:
    (tmp_path / "main.xg").symlink_to("/dev/zero")
    assert_refused(xgc(str(tmp_path / "main.xg"), "--check", timeout=30), 2, "XG0007", "a device")


@pytest.mark.timeout(60)
def test_huge_module_is_refused_by_the_main_file_cap(tmp_path: Path) -> None:
    huge = tmp_path / "huge.xg"
    with open(huge, "wb") as f:           # sparse: costs no disk, reads as zeros
        f.truncate(MAX_SOURCE_BYTES + 1)
    main = tmp_path / "main.xg"
    main.write_text("import huge\n" + program("    return A\n"))
    run = xgc(str(main), "--check", timeout=30)
    assert_refused(run, 1, "XG0016", f"larger than {MAX_SOURCE_BYTES >> 20} MiB")
    # The same cap for the main file, with its own exit code (unreadable: 2).
    assert_refused(xgc(str(huge), "--check", timeout=30), 2, "XG0007", f"larger than {MAX_SOURCE_BYTES >> 20} MiB")


def test_module_that_is_a_directory_or_missing(tmp_path: Path) -> None:
    (tmp_path / "dir.xg").mkdir()
    main = tmp_path / "main.xg"
    main.write_text("import dir\nimport gone\n" + program("    return A\n"))
    result = check_file(main)
    text = result.render()
    assert codes(result) == ["XG0016", "XG0016"], text
    assert "it is a directory" in text and "no such module" in text


@pytest.mark.timeout(120)
def test_long_import_chain_is_one_clear_error(tmp_path: Path) -> None:
    # Each module is checked with all it imports: a chain of 3,000 took minutes (quadratic).
    from xgbuild.compiler.frontend.modules import MAX_IMPORT_DEPTH
    n = 3000
    for i in range(n):
        imp = f"import m{i + 1}\n" if i + 1 < n else ""
        (tmp_path / f"m{i}.xg").write_text(imp + f"def g{i}(float32 x) -> float32 {{\n    return x\n}}\n")
    main = tmp_path / "main.xg"
    main.write_text("import m0\n" + program("    return A\n"))
    start = time.monotonic()
    result = check_file(main)
    assert time.monotonic() - start < 30
    assert codes(result) == ["XG0016"], result.render()
    assert f"imports nested deeper than {MAX_IMPORT_DEPTH} modules" in result.render()


def test_too_many_modules_is_one_clear_error(tmp_path: Path) -> None:
    from xgbuild.compiler.frontend.modules import MAX_MODULES
    for i in range(MAX_MODULES + 5):
        (tmp_path / f"m{i}.xg").write_text(f"def g{i}(float32 x) -> float32 {{\n    return x\n}}\n")
    main = tmp_path / "main.xg"
    main.write_text("".join(f"import m{i}\n" for i in range(MAX_MODULES + 5)) + program("    return A\n"))
    result = check_file(main)
    assert set(codes(result)) == {"XG0016"}, result.render()[-2000:]
    assert f"more than {MAX_MODULES} modules" in result.render()


def test_sharding_plan_that_is_a_fifo_is_refused(tmp_path: Path) -> None:
    from xgbuild.errors import CompileError
    from xgbuild.compiler.frontend.shard_plan import load_plan
    os.mkfifo(tmp_path / "plan.toml")
    with pytest.raises(CompileError, match="not a regular file"):
        load_plan(tmp_path / "plan.toml")


# --- class 4: only ASCII digits are digits --------------------------------------------------------

CONFUSABLE_DIGITS = {
    "bengali four": "\u09ea",           # renders like 8
    "arabic-indic four": "\u0664",
    "extended arabic-indic four": "\u06f4",
    "devanagari four": "\u096a",
    "fullwidth four": "\uff14",
    "mathematical bold four": "\U0001d7d2",
}


@pytest.mark.parametrize("name", sorted(CONFUSABLE_DIGITS))
def test_non_ascii_digit_in_a_number_is_an_error(name: str) -> None:
    digit = CONFUSABLE_DIGITS[name]
    for literal in (f"{digit}.0", f"1{digit}", f"{digit}", f"2.{digit}", f"1e{digit}"):
        result = check_source(program(f"    return A * {literal}\n"))
        assert not result.ok, f"{literal!r} was accepted"
        assert "XG0002" in codes(result), result.render()
        assert f"U+{ord(digit):04X}" in result.render()
        assert_no_internal(result)


@pytest.mark.parametrize("name", sorted(CONFUSABLE_DIGITS))
def test_non_ascii_digit_in_a_dim_is_an_error(name: str) -> None:
    digit = CONFUSABLE_DIGITS[name]
    result = check_source(program("    return A * 2.0\n", header=f"extern Tensor[float32, {digit}, 4] A\n"))
    assert not result.ok and "XG0002" in codes(result), result.render()
    result = check_source(program("    return A\n", header=f"extern Tensor[float32, 1{digit}, 4] A\n"))
    assert not result.ok and "XG0002" in codes(result), result.render()


def test_non_ascii_letters_in_names_are_named_errors() -> None:
    # A Cyrillic `а` looks like the Latin `a`: never the same name, and never silently a new one.
    result = check_source(program("    \u0430 = A\n    return \u0430\n"))
    assert not result.ok and set(codes(result)) == {"XG0002"}
    assert "CYRILLIC SMALL LETTER A" in result.render()


def test_bengali_four_never_compiles_to_a_constant(tmp_path: Path) -> None:
    path = tmp_path / "eight.xg"
    path.write_text(program("    return A * \u09ea.0\n"), encoding="utf-8")
    run = xgc(str(path), "--emit", "ir-opt", "--no-kernels", timeout=60)
    assert_refused(run, 1, "XG0002", "BENGALI DIGIT FOUR")
    assert "const" not in run.stdout


def test_dim_option_takes_ascii_digits_only(tmp_path: Path) -> None:
    path = tmp_path / "ok.xg"
    path.write_text(program("    return A\n"))
    run = xgc(str(path), "--out", str(tmp_path / "e.xge"), "--no-kernels", "--dim", "M=\u09ea", timeout=60)
    assert_refused(run, 2, "--dim takes NAME=SIZE")


# --- classes 6 and 7: literals outside their type ---------------------------------------------------

@pytest.mark.parametrize("literal", [str(2 ** 63), str(10 ** 40), "9_223_372_036_854_775_808", "1" * 5000])
def test_integer_literal_past_int64_is_an_error(literal: str) -> None:
    for src in (program(f"    x = {literal}\n    return A * cast(x, float32)\n"),
                program("    return A\n", header=HEADER + f"BIG = {literal}\n"),
                program(f"    return A * cast({literal}, float32)\n")):
        result = check_source(src)
        assert codes(result) == ["XG0108"], result.render()
        assert "does not fit in `int64`" in result.render()


def test_int64_minimum_is_a_literal() -> None:
    result = check_source(program("    x = -9223372036854775808\n    return A * cast(x, float32)\n"))
    assert result.ok, result.render()
    result = check_source(program("    x = - -9223372036854775808\n    return A * cast(x, float32)\n"))
    assert codes(result) == ["XG0113"], result.render()


@pytest.mark.parametrize("expr", ["9223372036854775807 + 1", "-9223372036854775807 - 2",
                                  "3037000500 * 3037000500", "4611686018427387904 * 2"])
def test_constant_arithmetic_overflowing_int64_is_an_error(expr: str) -> None:
    result = check_source(program(f"    x = {expr}\n    return A * cast(x, float32)\n"))
    assert codes(result) == ["XG0113"], result.render()
    assert "overflows `int64`" in result.render()


def test_int64_max_plus_one_never_reaches_const_fold(tmp_path: Path) -> None:
    path = tmp_path / "wrap.xg"
    path.write_text(program("    x = 9223372036854775807 + 1\n    return A * cast(x, float32)\n"))
    assert_refused(xgc(str(path), "--out", str(tmp_path / "e.xge"), "--no-kernels"), 1, "XG0113", "wrap.xg:3:9")
    assert not (tmp_path / "e.xge").exists()


# The last: float64's maximum written out in full, rounded up past it (float() gives inf).
@pytest.mark.parametrize("literal", ["1e400", "-1e400", "1.0e309", "17976931348623159" + "0" * 292 + ".0"])
def test_non_finite_float_literal_is_an_error(literal: str) -> None:
    result = check_source(program(f"    return A * {literal}\n"))
    assert codes(result) == ["XG0108"], result.render()
    assert "does not fit in `float64`" in result.render() and "inf" not in result.render().split("\n")[0]


def test_float_constant_arithmetic_overflowing_is_an_error() -> None:
    result = check_source(program("    return A * (1e300 * 1e300)\n"))
    assert codes(result) == ["XG0113"], result.render()


@pytest.mark.parametrize("expr,dtype", [("1e30", "int64"), ("300", "int8"), ("-1", "uint8"), ("1e38", "float16"),
                                        ("1e39", "float32"), ("9223372036854775807.0 * 2.0", "int64")])
def test_cast_of_a_literal_outside_the_target_type_is_an_error(expr: str, dtype: str) -> None:
    result = check_source(program(f"    x = cast({expr}, {dtype})\n    return A * cast(x, float32)\n"))
    assert codes(result) == ["XG0108"], result.render()
    assert f"does not fit in `{dtype}`" in result.render()


WRAPPING_DIVISION = (
    "import torch\n"
    "from xgbuild.compiler.driver import compile_source\n"
    "from xgbuild.compiler.ir.graph import tree_ids\n"
    "from xgbuild.runtime.cpu import CpuExecutor\n"
    "src = ('extern Tensor[int64, 4] A\\ndef main() {\\n    m = cast(-9223372036854775808, int64)\\n'\n"
    "       '    return A + m / -1, A + m % -1, A / -1\\n}\\n')\n"
    "graph = compile_source(src).optimized.main\n"
    "out = CpuExecutor(check=True).run(graph, {'A': torch.tensor([-1, 0, 1, -2**63])})\n"
    "print([out.values[i].tolist() for i in tree_ids(graph.output)])\n"
)


@pytest.mark.timeout(120)
def test_int64_minimum_divided_by_minus_one_wraps_instead_of_killing_the_process() -> None:
    # x86's divide traps on INT64_MIN / -1 (SIGFPE, the process dies without a word): the CPU
    # executor must never execute it. Two's complement wraps: INT64_MIN / -1 is INT64_MIN.
    run = run_bounded([sys.executable, "-c", WRAPPING_DIVISION], 120, BUILD_MEMORY_MB)
    assert run.returncode == 0, run.stderr[-3000:]
    low = -2 ** 63
    assert run.stdout.strip() == str([[(a + low + 2 ** 63) % 2 ** 64 - 2 ** 63 for a in (-1, 0, 1, low)],
                                      [-1, 0, 1, low], [1, 0, -1, low]])


def test_huge_dims_are_errors() -> None:
    result = check_source(program("    return A\n", header=f"extern Tensor[float32, {10 ** 40}, 4] A\n"))
    assert codes(result) == ["XG0108"], result.render()


# --- classes 5 and 6: depth and size ---------------------------------------------------------------

def deep_cases(n: int) -> dict[str, str]:
    return {
        "sum": program("    return " + " + ".join(["A"] * n) + "\n"),
        "slices": program("    return A" + "[0:4]" * n + "\n"),
        "methods": "def f() -> Result[float32] {\n    return Ok(1.0)\n}\ndef main() {\n    return f()"
                   + ".unwrap_or(0.0)" * n + "\n}\n",
    }


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["sum", "slices"])
def test_deep_chains_at_the_limit_compile(kind: str) -> None:
    from xgbuild.compiler.driver import compile_source
    compiled = compile_source(deep_cases(MAX_TREE_DEPTH - 10)[kind])
    assert compiled.optimized.main.nodes


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["sum", "slices", "methods"])
@pytest.mark.parametrize("n", [MAX_TREE_DEPTH + 1, 7_000, 100_000])
def test_deep_chains_above_the_limit_are_one_error(kind: str, n: int) -> None:
    start = time.monotonic()
    result = check_source(deep_cases(n)[kind])
    # 100,000 links are also more tokens than a file may hold: either limit, one error.
    assert codes(result) in (["XG0004"], ["XG0008"]), result.render()[-2000:]
    if n < 10_000:
        assert f"deeper than {MAX_TREE_DEPTH:,} levels" in result.render()
    assert time.monotonic() - start < 30


def test_chain_inside_a_chain_is_bounded_by_the_tree_depth() -> None:
    # Each chain alone is within the limit; together the tree is deeper than it.
    inner = " + ".join(["A"] * (MAX_TREE_DEPTH - 500))
    src = program("    return (" + inner + ")" + "[0:4]" * 1000 + "\n")
    result = check_source(src)
    assert codes(result) == ["XG0004"], result.render()[-2000:]


@pytest.mark.parametrize("opener,closer", [("(", ")"), ("f(", ")"), ("-", ""), ("not ", ""), ("A[", "]")])
def test_nesting_above_the_limit_is_the_only_error(opener: str, closer: str) -> None:
    n = MAX_DEPTH * 3
    body = "    return " + opener * n + "1" + closer * n + "\n"
    src = "def f(float32 x) -> float32 {\n    return x\n}\n" + program(body)
    result = check_source(src)
    assert codes(result) == ["XG0004"], result.render()[-2000:]


@pytest.mark.parametrize("opener,closer", [("Result[", "]"), ("(", ")"), ("Tensor[", "]")])
def test_nested_types_above_the_limit_are_the_only_error(opener: str, closer: str) -> None:
    n = 50_000
    result = check_source("extern " + opener * n + "float32" + closer * n + " A\n" + program("    return 1\n", ""))
    assert codes(result) in (["XG0004"], ["XG0001"]), result.render()[-2000:]     # Tensor[Tensor[: syntax
    assert_no_internal(result)


@pytest.mark.timeout(120)
def test_else_if_chains_at_and_above_the_limit() -> None:
    from xgbuild.compiler.driver import compile_source
    chain = "".join(f"    if K == {i} {{ x = A + {i}.0 }} else " for i in range(MAX_TREE_DEPTH - 100))
    src = "extern Tensor[float32, 4] A\nextern Tensor[int64] K\ndef main() {\n    x = A\n" + chain + "{ x = A }\n" \
          "    return x\n}\n"
    assert compile_source(src).optimized.main.nodes
    result = check_source(program("if true {} else " * 20_000 + "{}\n    return 1\n"))
    assert codes(result) == ["XG0004"] and "`else if` chain" in result.render(), result.render()[-2000:]


@pytest.mark.timeout(120)
def test_long_if_heavy_function_checks_in_linear_time() -> None:
    # Every `if` copied and re-joined the whole scope: 15,000 of them took over five minutes.
    n = 12_000
    body = "    x0 = A\n" + "".join(f"    if true {{ x{i} = x{i - 1} + 1.0 }} else {{ x{i} = x{i - 1} }}\n"
                                   for i in range(1, n))
    start = time.monotonic()
    result = check_source(program(body + f"    return x{n - 1}\n"))
    assert result.ok, result.render()[-2000:]
    assert time.monotonic() - start < 30


@pytest.mark.timeout(180)
def test_many_externals_build_in_linear_time() -> None:
    # The shard pass recomputed the split inputs per input: 25,000 externals took minutes.
    from xgbuild.compiler.driver import compile_source
    src = "".join(f"extern Tensor[float32, 4] E{i}\n" for i in range(20_000)) + "def main() {\n    return E0\n}\n"
    start = time.monotonic()
    assert compile_source(src).optimized.main.nodes
    assert time.monotonic() - start < 60


@pytest.mark.timeout(180)
def test_gradient_of_a_long_function_builds_in_linear_time() -> None:
    # GraphBuilder.node scanned the node list: autodiff of 5,000 statements took 50 s.
    from xgbuild.compiler.driver import compile_source
    n = 4000
    body = "    h0 = x * w\n" + "".join(f"    h{i} = h{i - 1} * 1.01 + w\n" for i in range(1, n))
    src = ("extern Tensor[float32, 4, 4] X\nextern Tensor[float32, 4, 4] W\n"
           "def loss(Tensor[float32, 4, 4] x, Tensor[float32, 4, 4] w) -> float32 {\n" + body
           + f"    return sum(h{n - 1})\n}}\n"
           "def main() {\n    (l, g) = value_and_grad(loss, wrt=(w))(X, W)\n    return l, g\n}\n")
    start = time.monotonic()
    assert compile_source(src).optimized.main.nodes
    assert time.monotonic() - start < 60


def test_nesting_limit_error_comes_first_and_alone() -> None:
    # No "no `main` function" before (or after) the error that stopped the parse.
    result = check_source("def main() {\n    return " + "(" * 500 + "1" + ")" * 500 + "\n}\n")
    assert codes(result) == ["XG0004"], result.render()
    result = check_source("x = " + "(" * 500 + "1" + ")" * 500 + "\n")
    assert codes(result) == ["XG0004"], result.render()


def test_syntax_error_in_main_is_not_reported_as_missing_main() -> None:
    result = check_source("def main( {\n    return 1\n}\n")
    assert "XG0010" not in codes(result) and codes(result)[0] == "XG0001", result.render()


def _call_chain(n: int, fanout: int = 1) -> str:
    sig = "(Tensor[float32, 4, 4] x) -> Tensor[float32, 4, 4]"
    fs = [f"def f0{sig} {{\n    return x * 2.0\n}}\n"]
    fs += [f"def f{i}{sig} {{\n    return {' + '.join([f'f{i - 1}(x)'] * fanout)}\n}}\n" for i in range(1, n)]
    return HEADER + "".join(fs) + f"def main() {{\n    return f{n - 1}(A)\n}}\n"


@pytest.mark.timeout(120)
def test_call_chain_at_the_limit_compiles() -> None:
    from xgbuild.compiler.driver import compile_source
    compiled = compile_source(_call_chain(MAX_CALL_DEPTH - 1))
    assert compiled.optimized.main.nodes


@pytest.mark.timeout(120)
@pytest.mark.parametrize("n", [MAX_CALL_DEPTH + 2, 5_000])
def test_call_chain_above_the_limit_is_one_error(n: int) -> None:
    result = check_source(_call_chain(n))
    assert codes(result) == ["XG0004"], result.render()[-2000:]
    assert "calls from `main` nest" in result.render()


@pytest.mark.timeout(120)
def test_call_chain_above_the_limit_through_the_cli(tmp_path: Path) -> None:
    path = tmp_path / "calls.xg"
    path.write_text(_call_chain(5_000))
    run = xgc(str(path), "--out", str(tmp_path / "e.xge"), "--no-kernels", timeout=90)
    assert_refused(run, 1, "XG0004")


@pytest.mark.timeout(120)
def test_inlining_bomb_is_refused_before_it_is_built() -> None:
    from xgbuild.compiler.driver import compile_source
    from xgbuild.errors import CompileError
    src = _call_chain(40, fanout=2)       # 2**40 nodes once inlined
    assert check_source(src).ok
    start = time.monotonic()
    with pytest.raises(CompileError) as info:
        compile_source(src)
    assert [d.code for d in info.value.diagnostics] == ["XG0008"]
    assert time.monotonic() - start < 30


@pytest.mark.timeout(120)
def test_too_many_tokens_is_one_error_within_seconds(tmp_path: Path) -> None:
    path = tmp_path / "long.xg"
    path.write_text("def main() {\n    x = [" + ", ".join(["1"] * MAX_TOKENS) + "]\n    return 1\n}\n")
    run = xgc(str(path), "--check", timeout=60)
    assert_refused(run, 1, "XG0008", f"more than {MAX_TOKENS:,} tokens")
    assert run.stderr.count("error[") == 1


@pytest.mark.timeout(120)
def test_many_functions_are_bounded_by_the_token_cap(tmp_path: Path) -> None:
    per = "def f{}(float32 x) -> float32 {{\n    return x\n}}\n"
    n = MAX_TOKENS // 15 + 1000       # each function is 15 tokens (newlines included)
    path = tmp_path / "many.xg"
    path.write_text("".join(per.format(i) for i in range(n)) + "def main() {\n    return 1\n}\n")
    run = xgc(str(path), "--check", timeout=60)
    assert_refused(run, 1, "XG0008")


@pytest.mark.timeout(120)
def test_long_statement_chain_with_a_nan_is_traced_in_check_mode() -> None:
    import torch
    from xgbuild.compiler.driver import compile_source
    from xgbuild.errors import ExecutionError
    from xgbuild.runtime.cpu import CpuExecutor
    n = 3000
    body = "    x0 = log(A - 10.0)\n" + "".join(f"    x{i} = x{i - 1} * 1.5 + 1.0\n" for i in range(1, n))
    compiled = compile_source(program(body + f"    return x{n - 1}\n"))
    with pytest.raises(ExecutionError, match=r"holds NaN; it first appears in `log` \(node %\d+\) at line 3"):
        CpuExecutor(check=True).run(compiled.optimized.main, {"A": torch.ones(4, 4)})
    # A NaN input is named as the input, through the whole chain.
    with pytest.raises(ExecutionError, match="first appears in the input `A`"):
        CpuExecutor(check=True).run(compiled.optimized.main, {"A": torch.full((4, 4), float("nan"))})


# --- class 7: messages ------------------------------------------------------------------------------

def test_import_cycle_names_the_cycle(tmp_path: Path) -> None:
    (tmp_path / "a.xg").write_text("import b\ndef fa(float32 x) -> float32 {\n    return x\n}\n")
    (tmp_path / "b.xg").write_text("import a\ndef fb(float32 x) -> float32 {\n    return x\n}\n")
    main = tmp_path / "main.xg"
    main.write_text("import a\n" + program("    return A\n"))
    result = check_file(main)
    text = result.render()
    assert codes(result) == ["XG0016"], text
    assert "import cycle: a.xg -> b.xg -> a.xg" in text


def test_module_importing_itself_is_a_cycle(tmp_path: Path) -> None:
    (tmp_path / "a.xg").write_text("import a\ndef fa(float32 x) -> float32 {\n    return x\n}\n")
    main = tmp_path / "main.xg"
    main.write_text("import a\n" + program("    return A\n"))
    assert "import cycle: a.xg -> a.xg" in check_file(main).render()


@pytest.mark.parametrize("newline", ["\r", "\r\n", "\n"])
def test_line_endings_are_newlines(newline: str) -> None:
    src = program("    y = A * 2.0\n    return y\n").replace("\n", newline)
    result = check_source(src)
    assert result.ok, result.render()
    bad = "def f(float32 x) -> float32 {\n    y = x\n    return z\n}\n" + program("    return A\n")
    bad = bad.replace("\n", newline)
    result = check_source(bad)
    assert codes(result) == ["XG0103"], result.render()
    assert [d.line for d in result.diagnostics if d.code == "XG0103"] == [3]


def test_lone_cr_file_through_the_cli(tmp_path: Path) -> None:
    path = tmp_path / "cr.xg"
    path.write_bytes(("def f(float32 x) -> float32 {\n    return x + q\n}\n" + program("    return A\n"))
                     .replace("\n", "\r").encode())
    run = xgc(str(path), "--check")
    assert_refused(run, 1, "XG0103", "cr.xg:2:16")
    assert "XG0010" not in run.stderr


# --- fuzzing around the limits ---------------------------------------------------------------------

@pytest.mark.timeout(300)
def test_mutated_hostile_sources_never_reach_an_internal_error() -> None:
    import random
    rng = random.Random(26)
    seeds = [program("    return A * 4.0 + A[0:2, :][0:1] @ A\n"),
             program("    x = 9223372036854775807\n    return A\n"),
             deep_cases(50)["slices"], _call_chain(20), program("    return 1e308 * 10.0\n")]
    pieces = ["\u09ea", "\uff14", "1e400", str(2 ** 63), "-", "(", ")", "[0:4]", "\r", "9223372036854775807 + 1",
              ".unwrap_or(1.0)", "import a\n", " + A" * 50]
    for _ in range(300):
        src = rng.choice(seeds)
        for _ in range(rng.randint(1, 4)):
            at = rng.randrange(len(src) + 1)
            src = src[:at] + rng.choice(pieces) + src[at:]
        result = check_source(src)
        assert_no_internal(result)
