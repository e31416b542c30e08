"""Values dropped after their last reader (`runtime/lifetimes.py`) under Triton's interpreter (CPU):
a chain of five layers whose third reads the first through a transpose (a view keeps its root
alive) and whose output adds the input back. Runs it with and without dropping, each twice (the
second run replays the first's launches), and prints, as JSON, the outputs' agreement, the
float64 reference error, the most bytes of kernel outputs alive at any launch (weak references:
what the run really held) and the static estimate (`peak_bytes`). A script, not a test:
TRITON_INTERPRET must be set before Triton is imported, so the test runs it in a fresh process."""

from __future__ import annotations

import json
import sys
import weakref
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "codegen"))
from interpret_gather import generic_plans  # noqa: E402

from xgbuild.compiler.driver import compile_source  # noqa: E402
from xgbuild.compiler.passes.specialize import bind_symbols, specialize  # noqa: E402
from xgbuild.runtime import interpret  # noqa: E402

SOURCE = """extern Tensor[float32, N, N] X
extern Tensor[float32, N, N] W
def main() {
    h1 = tanh(X @ W)
    h2 = tanh(h1 @ W)
    h3 = tanh(h2 @ W) + transpose(h1, 0, 1)
    h4 = tanh(h3 @ W)
    h5 = tanh(h4 @ W)
    return h5 + X
}
"""
N = 32


def main() -> None:
    interpret.enable()
    from xgbuild.runtime.cpu import CpuExecutor
    from xgbuild.runtime.gpu import KernelExecutor
    from xgbuild.runtime.lifetimes import frees, peak_bytes
    from xgbuild.runtime.native import made_by
    graph = compile_source(SOURCE, "chain.xg").optimized.main
    plans = generic_plans(graph, {"N": N})
    torch.manual_seed(0)
    inputs = {"X": torch.randn(N, N), "W": torch.randn(N, N) / N ** 0.5}
    sg = specialize(graph, bind_symbols(graph, {k: tuple(v.shape) for k, v in inputs.items()}))
    ref = list(CpuExecutor(float64=True, check=False).run(sg, inputs).values.values())[0]
    given = {id(t) for t in inputs.values()}
    report: dict = {"launches": len(plans)}
    outs: dict = {}
    for drop in (False, True):
        ex = KernelExecutor(plans, lambda c, g, a: None, torch.device("cpu"), replay=True)
        ex.drop = drop
        seen: list = []
        most = [0]

        def launch(c, grid, args, seen=seen, most=most):
            for a in args:
                if isinstance(a, torch.Tensor) and id(a) not in given and a.numel() > 1:
                    seen.append(weakref.ref(a))
            alive = {}
            for r in seen:
                t = r()
                if t is not None:
                    alive[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            most[0] = max(most[0], sum(alive.values()))
            interpret.launch(c, grid, args)
        ex.launch = launch
        runs = [list(ex.run(sg, inputs).values())[0] for _ in range(2)]
        outs[drop] = runs
        report[f"drop={drop}"] = {"held_bytes": most[0], "replays": len(ex._replays),
                                  "rel_err": float((runs[1].double() - ref).norm() / ref.norm()),
                                  "runs_equal": bool(torch.equal(runs[0], runs[1]))}
    made = made_by(plans)
    report["same_outputs"] = bool(torch.equal(outs[False][0], outs[True][0]) and torch.equal(outs[False][1], outs[True][1]))
    report["static_kept"] = peak_bytes(sg, plans, made, None)
    report["static_dropped"] = peak_bytes(sg, plans, made, frees(sg, plans, made))
    print(json.dumps(report))


if __name__ == "__main__":
    main()
