"""Help texts fit the program they are shown for: they use the user's own expressions, and
following one does not lead straight to another error (issue 25)."""

from xgbuild.compiler.frontend import check_source


def helps(text: str) -> dict[str, str]:
    return {d.code: d.help for d in check_source(text).diagnostics}


def test_div_guard_in_a_function_returning_a_value_does_not_suggest_returning_an_error() -> None:
    prog = "def ratio(float32 a, float32 den) -> float32 {\n    return a / den\n}\n" \
           "def main() {\n    return ratio(1.0, 2.0)\n}\n"
    help = helps(prog)["XG0300"]
    assert "if den != 0 {" in help and "`ratio`" in help and "Result[float32]" in help, help
    assert not help.startswith("guard it first: `if den == 0 { return DivByZero }`")
    # Following it (divide inside the guard) compiles.
    fixed = prog.replace("    return a / den\n", "    if den != 0 { return a / den }\n    return 0.0\n")
    assert check_source(fixed).ok, check_source(fixed).render()


def test_div_guard_in_a_function_returning_a_result_suggests_the_error() -> None:
    prog = "def ratio(float32 a, float32 den) -> Result[float32] {\n    return Ok(a / den)\n}\n" \
           "def main() {\n    return ratio(1.0, 2.0).unwrap_or(0.0)\n}\n"
    help = helps(prog)["XG0300"]
    assert help == "guard it first: `if den == 0 { return DivByZero }`"
    fixed = prog.replace("    return Ok", "    if den == 0 { return DivByZero }\n    return Ok")
    assert check_source(fixed).ok, check_source(fixed).render()


def test_result_as_value_help_names_the_users_expression() -> None:
    prog = "def sd(float32 a, float32 b) -> Result[float32] {\n    if b == 0 { return DivByZero }\n" \
           "    return Ok(a / b)\n}\ndef main() {\n    return sd(1.0, 2.0) + 1.0\n}\n"
    help = helps(prog)["XG0400"]
    assert "match sd(1.0, 2.0) {" in help and "`sd(1.0, 2.0).unwrap_or(...)`" in help, help
    assert "match r" not in help


def test_matmul_help_names_the_right_operand() -> None:
    prog = "extern Tensor[float32, 3, 4] A\nextern Tensor[float32, 3, 4] Wq\ndef main() {\n    return A @ Wq\n}\n"
    help = helps(prog)["XG0201"] if "XG0201" in helps(prog) else next(iter(helps(prog).values()))
    assert "`transpose(Wq)`" in help and "transpose(b)" not in help, help


def test_bool_arithmetic_help_names_the_operand() -> None:
    prog = "def main() {\n    flag = 1 < 2\n    return flag + flag\n}\n"
    texts = " ".join(helps(prog).values())
    assert "cast(flag, int32)" in texts and "cast(x," not in texts, texts


def test_chained_comparison_help_uses_the_users_operands() -> None:
    prog = "def between(float32 lo, float32 x, float32 hi) -> bool {\n    return lo < x <= hi\n}\n" \
           "def main() {\n    return between(1.0, 2.0, 3.0)\n}\n"
    help = helps(prog)["XG0001"]
    assert help == "combine them with `and`: `lo < x and x <= hi`", help
    fixed = prog.replace("lo < x <= hi", "lo < x and x <= hi")
    assert check_source(fixed).ok, check_source(fixed).render()
