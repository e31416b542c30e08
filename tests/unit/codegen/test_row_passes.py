"""A row kernel walks its row as few times as its reductions' dependencies allow: a softmax's max
and sum, and a log-sum-exp spelled out as `m + log(sum(exp(x - m)))`, in one walk (the sum kept
online against the running max); independent reductions of the same rows in one kernel and one
walk (cross-entropy's target logit beside its log-sum-exp); a variance after its mean in a second.
Checked under Triton's interpreter against float64 with rows in tiles and whole, on rows that are
-inf alone, -inf for their first tiles, or hold a NaN, a +inf or values rising along the row: the
non-finite results match the reference's exactly (`check_graph` counts a mismatch as an infinite
error)."""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "runtime"))
from interpreted import interpreted_report  # noqa: E402


def test_row_reductions_share_walks_and_match_float64_on_edge_rows() -> None:
    report = interpreted_report(HERE / "interpret_row_passes.py")
    rows = report["rows"]
    # The max and exp-sum, softmax's and log_softmax's statistics and sum(X * W): one kernel (all
    # read X), one walk, three sums online; the variance of W a kernel of two walks.
    assert rows["kinds"] == ["rowwise", "rowwise"], rows["kinds"]
    assert rows["plans"] == [[["max", "sum", "max", "expsum", "max", "expsum", "sum"], 3],
                             [["mean"], ["mean"], 0]], rows["plans"]
    ce = report["ce"]
    assert ce["kinds"].count("rowwise") == 2, ce["kinds"]
    assert ce["plans"][0] == [["max", "sum", "sum"], 1], ce["plans"]
    for name in ("rows", "ce"):
        for config in ("whole", "tiles"):
            outs = report[name][config]
            assert outs and all(o["variants"] for o in outs)
            for out in outs:
                assert out["rel_err"] < 1e-6, (name, config, out)


def test_the_tuners_reference_computes_a_row_value_read_through_a_reshape() -> None:
    """Cross-entropy's loss row `lse - reshape(sum(onehot * x))` reads the target logit, a row value
    of the same kernel, through a reshape the kernel reads in place: the tuner's float64 reference
    must compute it from the kernel's own sum too (it took a random input there, and every
    candidate failed the correctness gate on an H200)."""
    import torch

    from xgbuild.compiler.driver import compile_source
    from xgbuild.tuner.jobs import plan, tuning_env
    from xgbuild.tuner.jobdata import JobData

    sys.path.insert(0, str(HERE))
    from interpret_row_epilogue import CROSS_ENTROPY
    graph = compile_source(CROSS_ENTROPY, "ce.xg").optimized.main
    jobs, _ = plan(graph, tuning_env(graph, {}))
    (job,) = [j for j in jobs if j.spec.kind == "rowwise" and sum(n.op == "sum" for n in j.spec.nodes) == 2]
    data = JobData(job, seed=5)
    binding = job.sites[0][0]
    ops = {nid: data.value_fn("cpu")(nid) for nid in binding.operands}
    logits = next(v for v in ops.values() if v.dtype == torch.bfloat16).double()
    targets = next(v for v in ops.values() if v.dtype == torch.int64 and v.shape[-1] == 1)
    # (the one-hot's arange(V) is computed in the kernel from the column index: no operand)
    assert not any(v.dtype == torch.int64 and v.shape[0] == 1 for v in ops.values())
    columns = torch.arange(logits.shape[1])[None, :]
    m = logits.max(dim=1, keepdim=True).values
    s = (logits - m).exp().sum(dim=1, keepdim=True)
    picked = ((targets == columns).double() * logits).sum(dim=1)
    want = {"max": m, "sum": s, "picked": picked, "loss": m + s.log() - picked[:, None]}
    ref = dict(zip(binding.outputs, data.reference()))
    ops = {nid: graph.node(nid).op.value for nid in ref}
    # The loss row (a sub reading the reshaped sum) is among the kernel's outputs, with the sum
    assert sorted(ops.values()) == ["sub", "sum"], ops
    for nid, got in ref.items():
        w = want["loss" if ops[nid] == "sub" else "picked"]
        assert float((got.double().reshape(w.shape) - w).norm() / w.norm()) < 1e-12, ops[nid]
