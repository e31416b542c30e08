"""`xgc` end to end on every example: each `--emit` stage, each `--dump-after` pass, `--out`.

Runs `xgc`'s real entry point in this process (see `conftest.cli`).
"""

from __future__ import annotations

import json

import pytest
from conftest import (EXAMPLE_NAMES, EXAMPLES, REPO_ROOT, TWO_GB, assert_clean_failure, cli, src_text,
                      write_program)

import xg
from xgbuild.compiler.driver import compile_file
from xgbuild.compiler.passes import PASS_NAMES


def strict_json(text: str):
    """Parse as RFC 8259 JSON: no NaN or Infinity tokens."""
    def refuse(token: str):
        raise ValueError(f"{token} is not JSON")
    return json.loads(text, parse_constant=refuse)


def node_lines(ir_text: str) -> list[str]:
    return [line for line in ir_text.splitlines() if line.lstrip().startswith("%")]


@pytest.mark.parametrize("name", EXAMPLE_NAMES)
def test_every_emit_stage(name: str, example_engines) -> None:
    path = EXAMPLES / f"{name}.xg"
    stages = {}
    for stage in ("ast", "ir", "ir-opt", "ir-json", "dot"):
        res = cli("xgc", path, "--emit", stage)
        assert res.code == 0, f"--emit {stage}: {res.both}"
        assert res.out.strip(), f"--emit {stage} printed nothing"
        assert "error" not in res.err
        stages[stage] = res.out
    assert stages["ast"].startswith("Module") and "FuncDef name='main'" in stages["ast"]
    assert "graph main(" in stages["ir"] and "graph main(" in stages["ir-opt"]
    assert "call(" not in stages["ir-opt"], "the optimised IR still calls functions"
    graph = strict_json(stages["ir-json"])
    engine = example_engines[name]
    assert graph["name"] == "main" and len(graph["nodes"]) == len(engine.graph.nodes)
    assert [n for n, _ in graph["inputs"]] == [s["name"] for s in engine.signature]
    assert len(node_lines(stages["ir-opt"])) == len(graph["nodes"])
    assert stages["dot"].startswith("digraph") and stages["dot"].rstrip().endswith("}")
    assert stages["dot"].count("->") >= len(graph["nodes"]) - len(graph["inputs"]) - sum(
        1 for n in graph["nodes"] if not n["inputs"])


@pytest.mark.parametrize("name", EXAMPLE_NAMES)
def test_every_dump_after_pass(name: str) -> None:
    path = EXAMPLES / f"{name}.xg"
    assert {"inline", "const-fold", "cse", "dce"} <= set(PASS_NAMES)
    inlined_from = PASS_NAMES.index("inline")
    sizes = {}
    for pass_name in PASS_NAMES:
        res = cli("xgc", path, "--dump-after", pass_name)
        assert res.code == 0, f"--dump-after {pass_name}: {res.both}"
        if pass_name in ("shard", PASS_NAMES[-1]):     # the sharding plan comes first, as `#` comments
            res.out = "".join(line for line in res.out.splitlines(True) if not line.startswith("# "))
        assert res.out.startswith("graph main("), res.out[:200]
        assert res.out.rstrip().endswith("}") and "  return " in res.out
        if PASS_NAMES.index(pass_name) >= inlined_from:
            assert "call(" not in res.out and "proj(" not in res.out, f"after {pass_name}, calls remain"
            sizes[pass_name] = len(node_lines(res.out))
    # Every pass but the sharding planner (which inserts collectives) only shrinks the graph; moving
    # reshapes below element-wise ops adds at most a view per moved op, dce leaves no more than cse
    # did, splitting reductions adds at most two nodes per reduction, a one-hot product turned
    # lookup adds its index clamp and mask (a few nodes per product), moving casts across views
    # rebuilds at most each view and cast once (the old ones left for the next dce), padding a
    # product adds its padded operands and output view (then runs dce), computing a product read
    # only transposed transposed swaps its readers for it (at most two operand views more),
    # splitting a product along
    # K adds its views, parts and their sum (never removes a node), stacking a gradient's partials
    # trades each layer's second stage for one sum (no more nodes), and forking casts adds at most
    # one cast per reader of one.
    looked = sizes.pop("lookups")
    assert looked <= 2 * sizes["simplify"]
    forked = sizes.pop("fork-casts")
    products = sizes.pop("split-products")
    padded = sizes.pop("pad-products")
    transposed = sizes.pop("transpose-products")        # a product, its transposes and slices swapped
    assert transposed <= padded + 2 and transposed <= products
    moved = sizes.pop("cast-views")
    # merge-heads reads an attention output's other readers back through views of its merged heads
    # (a few views per such output); no example has one, so it leaves each as cast-views did
    assert sizes.pop("merge-heads") == moved
    split = sizes.pop("split-reductions")
    stacked = sizes.pop("stack-partials")               # a placement tree rebuilt once, over partials
    assert stacked <= split + 1
    assert stacked <= moved <= 2 * stacked and padded <= 2 * moved and padded <= products
    assert products <= forked <= 2 * products
    assert sizes["shard"] <= split <= 2 * sizes["shard"]
    sizes.pop("shard")
    sunk = sizes.pop("sink-reshapes")
    assert sunk <= 2 * sizes["cse"] and sizes["dce"] <= sizes["cse"]
    assert list(sizes.values()) == sorted(sizes.values(), reverse=True), f"a pass grew the graph: {sizes}"
    final = cli("xgc", path, "--emit", "ir-opt").out
    assert cli("xgc", path, "--dump-after", PASS_NAMES[-1]).out == final


@pytest.mark.parametrize("name", EXAMPLE_NAMES)
def test_the_verifier_passes_between_every_pass(name: str) -> None:
    compile_file(EXAMPLES / f"{name}.xg", verify_each=True)


def test_unknown_pass_is_a_usage_error() -> None:
    res = cli("xgc", EXAMPLES / "norms.xg", "--dump-after", "fusion")
    assert_clean_failure(res, "fusion", *PASS_NAMES, code=2)


def test_unknown_stage_is_a_usage_error() -> None:
    res = cli("xgc", EXAMPLES / "norms.xg", "--emit", "llvm")
    assert res.code == 2 and "Traceback" not in res.both


def test_out_needs_the_xge_suffix(tmp_path) -> None:
    res = cli("xgc", EXAMPLES / "norms.xg", "--out", tmp_path / "engine.bin")
    assert_clean_failure(res, "engine.bin", ".xge", code=2)
    assert not (tmp_path / "engine.bin").exists()


def test_out_writes_a_loadable_engine(tmp_path) -> None:
    out = tmp_path / "deep" / "dir" / "norms.xge"
    res = cli("xgc", EXAMPLES / "norms.xg", "--out", out, "--target", "h200", "--json")
    assert res.code == 0, res.both
    report = json.loads(res.out)
    assert report["ok"] is True and report["engine"] == str(out)
    engine = xg.load_engine(out)
    assert engine.digest == report["digest"] and engine.manifest["target"] == "H200"


def test_program_errors_are_exit_1_with_diagnostics(tmp_path) -> None:
    path = write_program(tmp_path, src_text("""
        extern Tensor[float32, N] X
        extern Tensor[float32, N] Y
        def main() {
            return X / Y
        }
    """), "div.xg")
    res = cli("xgc", path, "--out", tmp_path / "div.xge")
    assert res.code == 1 and "error[XG0300]" in res.err and "div.xg:4" in res.err
    assert "Traceback" not in res.both and not (tmp_path / "div.xge").exists()


def test_unreadable_source_is_exit_2(tmp_path) -> None:
    res = cli("xgc", tmp_path / "missing.xg", "--emit", "ir")
    assert res.code == 2 and "missing.xg" in res.err and "Traceback" not in res.both


def test_ir_json_is_strict_json_even_with_non_finite_constants(tmp_path) -> None:
    """`--emit ir-json` (and the engine's program.json) must be JSON other tools can read: no `NaN`."""
    path = write_program(tmp_path, src_text("""
        extern Tensor[float32, N] X
        def main() {
            return X + log(cast(-1, float32)) + exp(cast(1000, float32))
        }
    """))
    res = cli("xgc", path, "--emit", "ir-json")
    assert res.code == 0, res.both
    strict_json(res.out)


def test_sharding_plan_option(tmp_path) -> None:
    good = tmp_path / "tp.toml"
    good.write_text('[regions.mlp]\nstrategy = "tensor"\nshard = { w1 = 1, w2 = 0 }\n')
    res = cli("xgc", REPO_ROOT / "models" / "train_tiny.xg", "--num-gpu", "2", "--sharding", good, "--emit", "ir-opt")
    assert res.code == 0, res.both
    assert res.out.startswith("# sharding plan over 2 GPUs") and "all_reduce" in res.out and "@S(1)" in res.out
    bad = tmp_path / "bad.toml"
    bad.write_text('[regions.mpl]\nstrategy = "tensor"\nshard = { w1 = 1 }\n')
    res = cli("xgc", REPO_ROOT / "models" / "train_tiny.xg", "--check", "--sharding", bad, "--json")
    assert res.code == 1 and json.loads(res.out)["diagnostics"][0]["code"] == "XG0505"
    res = cli("xgc", REPO_ROOT / "models" / "train_tiny.xg", "--check", "--sharding", bad)
    assert res.code == 1 and res.err.startswith("error[XG0505]") and "`mlp`" in res.err


def test_xg_hw_dir_reaches_the_checker_and_the_memory_check(tmp_path, monkeypatch, small_h100_hw_dir) -> None:
    path = write_program(tmp_path, TWO_GB)
    assert cli("xgc", path, "--emit", "ir-opt").code == 0
    monkeypatch.setenv("XG_HW_DIR", str(small_h100_hw_dir))
    res = cli("xgc", path, "--emit", "ir-opt")
    assert res.code == 1 and "error[XG0504]" in res.err and "1.0 GB" in res.err, res.both
    custom = tmp_path / "only-h100"
    custom.mkdir()
    (custom / "h100.toml").write_text((REPO_ROOT / "hw" / "h100.toml").read_text())
    monkeypatch.setenv("XG_HW_DIR", str(custom))
    res = cli("xgc", write_program(tmp_path, TWO_GB.replace("H100", "A100"), "a100.xg"), "--check")
    assert res.code == 1 and "A100" in res.err and "known targets: H100" in res.err, res.both


def test_xg_hw_dir_that_is_no_directory_is_a_usage_error(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("XG_HW_DIR", str(tmp_path / "missing"))
    res = cli("xgc", write_program(tmp_path, TWO_GB), "--check")
    assert_clean_failure(res, "XG_HW_DIR=", "is not a directory of GPU profiles", code=2)
