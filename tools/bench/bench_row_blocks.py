"""Benchmark: what running a reduced matmul in row blocks (XG_COMM_BLOCKS) costs on one GPU.

On several GPUs each block's collective overlaps the next block's compute
(`bench_multi_gpu.py --comm-blocks` times that); this measures the other side of the trade on one
GPU: the same kernels launched in 1, 2, 4, 8 blocks of rows with the collectives left out (a
stand-in that returns at once), at one rank's shapes of a `--size`^3 bfloat16 matmul whose
contracting dim is split over `--world` ranks, its product all-reduced (`contract`) or
reduce-scattered along rows (`scatter`). Beside them: PyTorch eager and torch.compile for the same
local matmul. Prints a table and writes JSON; nothing here is an assertion.

    python tools/bench/bench_row_blocks.py [--size 16384] [--world 2,4] [--blocks 1,2,4,8] [--steps 20]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))

# The product all-reduced (returned whole) or reduce-scattered along rows (a consumer wants it split).
SOURCE = """
extern Tensor[bfloat16, {n}, {n}] A
extern Tensor[bfloat16, {n}, {n}] B
def main() {{
    with shard(A, dim=1), shard(B, dim=0):
        C = A @ B
{tail}
}}
"""
TAILS = {"contract": "    return C",
         "scatter": "    with shard(C, dim=0):\n        D = relu(C)\n    return D"}


def stand_in(world: int):
    """No transfer: a collective's result is (a view of) its input, left as it is."""
    from xgbuild.compiler.ir.graph import Op

    def collective(n, x, in_place: bool = False, into=None):
        if into is not None:
            return into
        if n.op is Op.REDUCE_SCATTER:
            return x.chunk(world, n.attr("dim"))[0]
        return x
    return collective


def timed(fn, steps: int) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(steps):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        out.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", type=int, default=16384)
    p.add_argument("--world", default="2,4", help="rank counts whose local shapes are measured")
    p.add_argument("--blocks", default="1,2,4,8")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--tune", default="predict", choices=["predict", "measure", "cache"])
    p.add_argument("--json", default=str(REPO_ROOT / "out" / "bench_row_blocks.json"))
    args = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_row_blocks: needs an NVIDIA GPU")
    from xgbuild.build.engines import link_engine
    from xgbuild.compiler.driver import compile_source
    from xgbuild.compiler.frontend import CheckOptions
    from xgbuild.runtime.cuda import KernelLauncher, device_arch
    from xgbuild.runtime.engine import Engine
    from xgbuild.runtime.gpu import KernelExecutor
    from xgbuild.runtime.spmd import local_graph
    from xgbuild.runtime.plans import plans_from_manifest
    from xgbuild.settings import Settings

    name = torch.cuda.get_device_name(0)
    target = next((t for t in ("H200", "H100", "B200", "A100", "L40S") if t in name), None)
    if target is None:
        raise SystemExit(f"bench_row_blocks: no hw/ profile for {name}")
    launcher = KernelLauncher(torch.cuda.current_device())
    rows = []
    n = args.size
    for world in map(int, args.world.split(",")):
        a = torch.randn(n, n // world, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(n // world, n, device="cuda", dtype=torch.bfloat16)
        eager = timed(lambda: a @ b, args.steps)
        compiled_mm = torch.compile(lambda x, y: x @ y)
        try:
            comp = timed(lambda: compiled_mm(a, b), args.steps)
        except Exception as exc:        # torch.compile needs a toolchain: report, don't fail
            comp, why = None, str(exc).splitlines()[0][:100]
            print(f"torch.compile: {why}")
        for case, tail in TAILS.items():
            compiled = compile_source(SOURCE.format(n=n, tail=tail), f"{case}.xg",
                                      CheckOptions(num_gpu=world, target=target))
            path = Path(f"/tmp/xg-bench-blocks-{case}-{world}.xge")
            link_engine(compiled, Settings.from_env(), policy=args.tune).engine.save(path)
            engine = Engine.load(path)
            archs = {v["arch"] for k in engine.manifest["kernels"] for v in k["variants"]}
            if device_arch(torch.cuda.current_device()) not in archs:
                raise SystemExit(f"bench_row_blocks: kernels built for {sorted(archs)}, not this GPU")
            plans = plans_from_manifest(engine.manifest, engine.file.entries)
            graph, _, _ = engine.specialised({k: torch.empty(n, n, device="meta", dtype=torch.bfloat16)
                                              for k in ("A", "B")})
            local, _ = local_graph(graph, world)
            local_inputs = {"A": a, "B": b}
            whole = None
            for blocks in map(int, args.blocks.split(",")):
                ex = KernelExecutor(plans, lambda c, grid, args_: launcher.launch(c.handle, grid, args_),
                                    torch.device("cuda"), collective=stand_in(world), row_blocks=blocks, world=world)
                with torch.no_grad():
                    ms = timed(lambda: ex.run(local, local_inputs), args.steps)
                whole = ms if blocks == 1 else whole
                rows.append({"case": case, "world": world, "blocks": blocks, "split": ex.split_collectives,
                             "ms": ms, "vs_whole": ms / whole if whole else None, "torch_eager_ms": eager,
                             "torch_compile_ms": comp})
    print(f"{'case':<9} {'world':>5} {'blocks':>6} {'split':>5} {'ms':>8} {'vs whole':>9} {'eager ms':>9} {'compile ms':>10}")
    for r in rows:
        vs = f"{100 * (r['vs_whole'] - 1):+.1f}%" if r["vs_whole"] else "-"
        comp = f"{r['torch_compile_ms']:.2f}" if r["torch_compile_ms"] else "-"
        print(f"{r['case']:<9} {r['world']:>5} {r['blocks']:>6} {r['split']:>5} {r['ms']:>8.2f} {vs:>9} "
              f"{r['torch_eager_ms']:>9.2f} {comp:>10}")
    report = {"gpu": name, "torch": torch.__version__, "size": n, "tune": args.tune, "rows": rows}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(report, indent=2))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
