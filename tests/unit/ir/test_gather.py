"""The GATHER op through the IR and its passes: verifier, JSON and text, CSE/DCE, specialisation of
a symbolic token count, the sharding pass's layouts, and autodiff's refusal."""

from __future__ import annotations

import pytest

from xgbuild.compiler.ir.graph import Graph, GraphBuilder, Op, Program, attrs_of, renumber
from xgbuild.compiler.ir.layout import R, S, infer_layouts
from xgbuild.compiler.ir.serialize import dumps, loads, to_text
from xgbuild.compiler.ir.verify import IRError, verify
from xgbuild.compiler.passes.autodiff import AutodiffError, differentiate
from xgbuild.compiler.passes.cse import cse
from xgbuild.compiler.passes.dce import dce
from xgbuild.compiler.passes.shard import shard
from xgbuild.compiler.passes.specialize import bind_symbols, specialize


def embed(shard_idx: int | None = None, shard_table: int | None = None, twice: bool = False) -> Graph:
    """out = table[idx] (+ the same lookup again with `twice`), table [50, 8], idx [B, T]."""
    b = GraphBuilder("main")
    table = b.add(Op.INPUT, (), "float32", (50, 8), attrs_of(name="table"))
    idx = b.add(Op.INPUT, (), "int64", ("B", "T"), attrs_of(name="idx"))
    b.inputs += [("table", table), ("idx", idx)]
    if shard_idx is not None:
        idx = b.add(Op.SHARD, (idx,), "int64", ("B", "T"), attrs_of(dim=shard_idx))
    if shard_table is not None:
        table = b.add(Op.SHARD, (table,), "float32", (50, 8), attrs_of(dim=shard_table))
    out = b.add(Op.GATHER, (table, idx), "float32", ("B", "T", 8), src=(3, 7))
    if twice:
        again = b.add(Op.GATHER, (table, idx), "float32", ("B", "T", 8))
        out = b.add(Op.ADD, (out, again), "float32", ("B", "T", 8))
    return b.build({"t": out})


def test_verifier_checks_arity_shape_and_index_dtype() -> None:
    g = embed()
    verify(g)
    gather = next(n for n in g.nodes if n.op is Op.GATHER)
    bad_shape = g.with_nodes([n if n is not gather else n.__class__(**{**n.__dict__, "shape": ("B", 8)})
                              for n in g.nodes])
    with pytest.raises(IRError, match=r"recorded float32\['B', 8\] but inputs give float32\['B', 'T', 8\]"):
        verify(bad_shape)
    one_input = g.with_nodes([n if n is not gather else n.__class__(**{**n.__dict__, "inputs": n.inputs[:1]})
                              for n in g.nodes])
    with pytest.raises(IRError, match="takes 2 inputs, has 1"):
        verify(one_input)
    float_idx = g.with_nodes([n if n.op is not Op.INPUT or n.attr("name") != "idx" else
                              n.__class__(**{**n.__dict__, "dtype": "float32"}) for n in g.nodes])
    with pytest.raises(IRError, match="`gather` indices must be integers, got float32"):
        verify(float_idx)


def test_json_round_trip_and_text() -> None:
    g = embed()
    assert loads(dumps(g)) == g and dumps(loads(dumps(g))) == dumps(g)
    assert "= gather(%0, %1) : float32[B, T, 8]  # line 3" in to_text(g)


def test_cse_merges_equal_lookups_and_dce_drops_unused_ones() -> None:
    g = cse(Program(embed(twice=True))).main
    assert sum(n.op is Op.GATHER for n in g.nodes) == 1
    b = GraphBuilder("main")
    table = b.add(Op.INPUT, (), "float32", (50, 8), attrs_of(name="table"))
    idx = b.add(Op.INPUT, (), "int32", (4,), attrs_of(name="idx"))
    b.inputs += [("table", table), ("idx", idx)]
    b.add(Op.GATHER, (table, idx), "float32", (4, 8))
    g = dce(Program(b.build({"t": table}))).main
    assert not any(n.op is Op.GATHER for n in g.nodes)


def test_specialisation_binds_the_token_count() -> None:
    g = embed()
    sg = specialize(g, bind_symbols(g, {"table": (50, 8), "idx": (3, 11)}))
    verify(sg)
    assert next(n for n in sg.nodes if n.op is Op.GATHER).shape == (3, 11, 8)


@pytest.mark.parametrize("shard_idx, shard_table, want", [(None, None, R), (0, None, S(0)), (1, None, S(1)),
                                                          (None, 1, S(2))])
def test_sharding_keeps_a_split_of_the_indices_or_of_the_table_columns(shard_idx, shard_table, want) -> None:
    g = shard(Program(embed(shard_idx, shard_table), num_gpu=2)).main
    verify(g)
    layouts = infer_layouts(g, 2)
    gather = next(n for n in g.nodes if n.op is Op.GATHER)
    assert layouts[gather.id] == want
    # Local on every rank: no collective runs before the lookup.
    assert not any(n.op in (Op.ALL_GATHER, Op.ALL_REDUCE, Op.ALL_TO_ALL) for n in g.nodes if n.id < gather.id)


def test_a_table_split_along_its_rows_is_converted_first() -> None:
    # A rank holding half the rows cannot look up every index: the pass re-lays the table out (the
    # cheapest way is an all-to-all to a split along the columns) before the lookup.
    g = shard(Program(embed(shard_table=0), num_gpu=2)).main
    verify(g)
    layouts = infer_layouts(g, 2)
    gather = next(n for n in g.nodes if n.op is Op.GATHER)
    table = g.node(gather.inputs[0])
    assert table.op in (Op.ALL_GATHER, Op.ALL_TO_ALL) and layouts[table.id] in (R, S(1))
    assert layouts[gather.id] == (R if layouts[table.id] == R else S(2))


def test_autodiff_refuses_clearly() -> None:
    b = GraphBuilder("f")
    table = b.add(Op.PARAM, (), "float32", (50, 8), attrs_of(index=0))
    idx = b.add(Op.PARAM, (), "int64", (4,), attrs_of(index=1))
    b.params += [table, idx]
    rows = b.add(Op.GATHER, (table, idx), "float32", (4, 8))
    loss = b.add(Op.SUM, (rows,), "float32", (), attrs_of(dim=None))
    f = renumber(b.build({"t": loss}))
    with pytest.raises(AutodiffError, match="`gather` has no derivative rule"):
        differentiate(f, (0,), False, False, "f/grad(0)")
