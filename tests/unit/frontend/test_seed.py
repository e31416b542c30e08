"""Every snippet of the seed spec (shared/seeds/000_*.txt): accepted, or rejected with the
diagnostic its Rules call for. The snippets are copied verbatim; where one is a fragment, the test
says how it is completed."""

from xgbuild.compiler.frontend import CheckOptions, check_source

HARDWARE = "TARGET_GPU = GB200\nNUM_GPU = 8\n"
ADD = "def add(int64 a, int64 b) -> int64 {\n    return a + b\n}\n"
MULTMAT = ("def multMat(Tensor[float32, M, K] a, Tensor[float32, K, N] b) -> Tensor[float32, M, N] {\n"
           "    return a @ b\n}\n")
SAFE_DIV = ("def safe_div(float32 a, float32 b) -> Result[float32] {\n    if b == 0 { return DivByZero }\n"
            "    return Ok(a / b)\n}\n")
MAIN = ("def main() {\n    x = add(10, 20)\n    y = multMat(A, B)\n"
        "    z = safe_div(1.0, 0.0) # forces explicit handling\n}\n")
SHARD = "with shard(A, dim=0), shard(B, dim=1):\n    C = A @ B\n"
CLUSTER = "TARGET_GPU = GB200\nNUM_GPU = 1024\n"


def codes(src: str, **opts) -> list[str]:
    result = check_source(src, "seed.xg", CheckOptions(**opts))
    return [d.code for d in result.diagnostics if d.severity.value == "error"]


def test_hardware_declarations_alone_need_main() -> None:
    # Rule 4: a program starts at main; as a library file the declarations are fine.
    assert codes(HARDWARE) == ["XG0010"]
    assert codes(HARDWARE, lib=True) == []


def test_typed_functions_are_accepted() -> None:
    for snippet in (ADD, MULTMAT, SAFE_DIV):
        assert codes(snippet, lib=True) == []


def test_seed_main_forces_explicit_handling() -> None:
    # The seed's comment says `z = safe_div(1.0, 0.0)` "forces explicit handling": z is a Result
    # that main never handles, which Rule 5 rejects (XG0401) at that line. Nothing else is wrong.
    result = check_source(HARDWARE + ADD + MULTMAT + SAFE_DIV + MAIN, "seed.xg")
    errors = [(d.code, d.line) for d in result.diagnostics if d.severity.value == "error"]
    assert errors == [("XG0401", 16)], result.render()


def test_seed_main_with_handling_is_accepted() -> None:
    handled = MAIN.replace("z = safe_div(1.0, 0.0) # forces explicit handling",
                           "z = safe_div(1.0, 0.0).unwrap_or(0.0) # handled")
    assert codes(HARDWARE + ADD + MULTMAT + SAFE_DIV + handled) == []


def test_multi_gpu_block_inside_main() -> None:
    body = "".join("    " + line + "\n" for line in SHARD.splitlines())
    src = "NUM_GPU = 8\ndef main() {\n" + body + "    return C\n}\n"
    assert codes(src) == []


def test_multi_gpu_block_at_file_level_is_rejected() -> None:
    # Statements belong in a function (Rule 4); one error for the block, not one per line.
    assert codes(SHARD) == ["XG0010", "XG0012"]


def test_deployment_declarations() -> None:
    assert codes(CLUSTER + "def main() { return 1 }\n") == []
    assert codes(CLUSTER + "def main() { return 1 }\n", target="H100", num_gpu=1024) == []


def test_cluster_matmul_example_shape() -> None:
    src = ("TARGET_GPU = H100\nNUM_GPU = 2\ndef main() {\n    with shard(A, dim=0), shard(B, dim=1):\n"
           "        C = A @ B\n    return C\n}\n")
    assert codes(src) == []
