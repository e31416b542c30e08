"""A run drops each value its kernels made after the last launch that reads it (`runtime/lifetimes.py`):
the same outputs, replays still recorded, less memory held; views keep their roots alive; the
graph's outputs and a GATHER's computed indices are never dropped."""

from __future__ import annotations

from pathlib import Path

from interpreted import interpreted_report

from xgbuild.compiler.codegen.launch_abi import ExternStep
from xgbuild.compiler.driver import compile_source
from xgbuild.compiler.ir.graph import Op, tree_ids
from xgbuild.runtime.lifetimes import frees, peak_bytes
from xgbuild.runtime.native import made_by
from xgbuild.tuner.jobs import plan, tuning_env

REPO = Path(__file__).resolve().parents[3]


class _Plan:            # what `frees` reads of a kernel's launch plan: its binding
    def __init__(self, binding) -> None:
        self.binding = binding


def _plans(source: str, dims: dict[str, int] | None = None):
    graph = compile_source(source, "t.xg").optimized.main
    _jobs, launches = plan(graph, tuning_env(graph, dims or {}))
    plans = [ExternStep(b) if ident == "extern" else _Plan(b) for ident, b in launches]
    return graph, plans, made_by(plans)


def test_dropping_keeps_the_outputs_and_the_replays_and_holds_less() -> None:
    report = interpreted_report("interpret_lifetimes.py")
    kept, dropped = report["drop=False"], report["drop=True"]
    assert report["same_outputs"], report                   # bit for bit, first run and replay
    for r in (kept, dropped):
        assert r["runs_equal"] and r["replays"] == 1 and r["rel_err"] < 1e-6, report
    assert dropped["held_bytes"] < kept["held_bytes"], report
    n = 32 * 32 * 4                                         # one [32, 32] float32 layer
    assert report["static_kept"] == report["launches"] * n
    assert report["static_dropped"] == 3 * n                # h1 (read again by layer 3), h2, h3


def test_a_view_keeps_its_root_and_outputs_are_never_dropped() -> None:
    graph, plans, made = _plans("""extern Tensor[float32, N, N] X
extern Tensor[float32, N, N] W
def main() {
    h1 = tanh(X @ W)
    h2 = tanh(h1 @ W)
    h3 = tanh(h2 @ W) + transpose(h1, 0, 1)
    return (h3, transpose(h2, 0, 1))
}
""", {"N": 16})
    dropped = frees(graph, plans, made)
    at = {nid: i for i, nids in enumerate(dropped) for nid in nids}
    assert len(plans) == 3, made                            # one kernel a layer
    (h1,) = [nid for nid, (i, _pos) in made.items() if i == 0]
    assert at[h1] == 2, (at, made)                          # after layer 3 reads its transpose, not layer 2
    outputs = set(tree_ids(graph.output))
    roots = outputs | {graph.node(o).inputs[0] for o in outputs if graph.node(o).op is Op.TRANSPOSE}
    assert not set(at) & roots, (at, roots)                  # h2 (an output's root) and h3 stay


def test_computed_gather_indices_are_kept_for_check_mode() -> None:
    import warnings

    import torch

    from xgbuild.compiler.importers.torch_export import import_torch
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        graph = import_torch(lambda e, i: e[9 - i * 2] * 2.0,
                             (torch.randn(10, 8), torch.arange(5))).optimized.main
    _jobs, launches = plan(graph, tuning_env(graph, {}))
    plans = [ExternStep(b) if ident == "extern" else _Plan(b) for ident, b in launches]
    made = made_by(plans)
    gathers = [n for n in graph.nodes if n.op is Op.GATHER]
    assert gathers and gathers[0].inputs[1] in made          # the indices: a kernel's output
    dropped = {nid for nids in frees(graph, plans, made) for nid in nids}
    assert gathers[0].inputs[1] not in dropped


def test_the_training_step_peak_falls_under_two_fifths() -> None:
    """models/train.xg at its real size (GPT-2 small, 8 x 1024 tokens): the kernel outputs alive at
    once, all kept (what an H200 run held: 53 GB, before attention's gradient recomputed its
    probabilities; 18 GB once no float32 copies of attention's operands were made; 13.4 GB, then
    12.0 GB once the GELU gradients' float32 values and the heads' gradients were not written)
    against dropped after their last reader (5.3 GB, then 4.7 GB, 4.8 GB)."""
    graph = compile_source((REPO / "models" / "train.xg").read_text(), "train.xg").optimized.main
    _jobs, launches = plan(graph, tuning_env(graph, {}))
    plans = [ExternStep(b) if ident == "extern" else _Plan(b) for ident, b in launches]
    made = made_by(plans)
    kept, dropped = peak_bytes(graph, plans, made, None), peak_bytes(graph, plans, made, frees(graph, plans, made))
    assert kept > 11e9 and dropped < kept * 0.4, (kept, dropped)
