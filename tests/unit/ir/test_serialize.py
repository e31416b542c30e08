"""IR serialisation: JSON round trips exactly; malformed JSON (as from a corrupt engine) is an
IRError, never another exception; text and DOT render every example."""

import json
from pathlib import Path

import pytest

from xgbuild.compiler.driver import compile_file
from xgbuild.compiler.ir.serialize import dumps, from_json, loads, to_dot, to_json, to_text
from xgbuild.compiler.ir.verify import IRError

REPO = Path(__file__).resolve().parents[3]
EXAMPLES = sorted((REPO / "examples").glob("*.xg"))


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_round_trip(path: Path) -> None:
    g = compile_file(path).optimized.main
    assert loads(dumps(g)) == g
    assert dumps(loads(dumps(g))) == dumps(g)
    assert to_text(g).startswith("graph main(")
    assert to_dot(g).startswith('digraph "main"')


@pytest.mark.parametrize("mutate", [
    lambda d: d.pop("nodes"),
    lambda d: d.update(format=99),
    lambda d: d["nodes"][0].update(op="frobnicate"),
    lambda d: d["nodes"][0].update(shape=[1.5]),
    lambda d: d["nodes"][0].update(inputs="x"),
    lambda d: d.update(output={"t": "x"}),
    lambda d: d.update(output={"weird": 1}),
    lambda d: d.update(inputs=[[1]]),
    lambda d: d["nodes"][0].update(attrs=5),
])
def test_malformed_json_is_an_ir_error(mutate) -> None:
    data = to_json(compile_file(REPO / "examples" / "norms.xg").optimized.main)
    mutate(data)
    with pytest.raises(IRError):
        from_json(json.loads(json.dumps(data)))


def test_not_json() -> None:
    with pytest.raises(IRError, match="not JSON"):
        loads(b"\xff\xfe not json")
