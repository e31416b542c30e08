"""Benchmark: XG engines on 1, 2 and 4 GPUs (NCCL), strong scaling of one step.

Workloads: a large matmul with its rows split over the GPUs (`--size`, bfloat16), the same with
the contracting dim split (partial sums and an all-reduce), the training step of
models/train_tiny.xg scaled up (`--train-dims`) under models/plans/train_tensor.toml, and a pipeline: a
4-layer float32 MLP training step (`--pipeline-dims`), its layers placed on the GPUs and its batch in
`--microbatches` (ideal efficiency M / (M + n - 1) for M microbatches on n GPUs; its ranks and its
one-GPU baseline run PyTorch's ops), and `pipeline-dp`, the same MLP as two stages of two layers,
each stage on n/2 GPUs (data parallel inside a stage on 4 GPUs). For each GPU
count (up to what the host has) every rank runs the engine's SPMD plan (runtime/spmd.py) on its
shards: warm-up, then `--steps` timed steps, each fenced by a device synchronisation and a barrier.
On GPUs the engines carry kernels tuned for the local GPU at each rank's shapes (`--tune`, default
measure) and every rank launches them, collectives in between (`--no-kernels`: PyTorch's ops per
rank instead, as XG's reference executor runs the plan).

Reported per workload and GPU count: time per step (median over steps, max over ranks), scaling
efficiency t1 / (n * tn), host ms (how long the slowest rank's Python took to issue the step: a
step no longer than that is bound by the host, not the GPU), the plan's collectives and bytes,
and how much communication overlapped compute: the same step with every collective finished
before the next op (serialised) minus the normal step, over the time of the plan's collectives run
alone. Kernel ranks run as `xgrun` does
(XG_COMM_BLOCKS, `--comm-blocks`, default auto: a large all-reduced or reduce-scattered matmul in
row blocks, each block's collective overlapping the next block); where that split any, the step
is timed whole too (XG_COMM_BLOCKS=1): its time, efficiency and overlap. Beside them, on one GPU:
PyTorch eager and torch.compile for the matmuls; each row names the executor its ranks used.

Prints a table and writes JSON. `--device cpu` runs the same on gloo ranks (small sizes) to check
the script without GPUs (with XG_SPMD_KERNELS=interpret and `--tune predict`, the ranks run the
kernels under Triton's interpreter). Nothing here is an assertion.

    python tools/bench/bench_multi_gpu.py [--gpus 1,2,4] [--size 16384] [--steps 10]
        [--train-dims T=8192,D=2048,F=8192,V=1024] [--json out/bench_multi_gpu.json] [--device cuda|cpu]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))

MATMUL = """
extern Tensor[{dtype}, {n}, {n}] A
extern Tensor[{dtype}, {n}, {n}] B
def main() {{
    with {shards}:
        C = A @ B
    return C
}}
"""
SHARDS = {"matmul-rows": "shard(A, dim=0)", "matmul-contract": "shard(A, dim=1), shard(B, dim=0)"}
# A 4-layer MLP training step for the pipeline workload: one function per layer, placed on GPUs by a
# plan made for each GPU count (layer i on GPU i * n // 4), the batch in microbatches.
PIPELINE = """
extern Tensor[float32, {b}, {d}] X
extern Tensor[float32, {b}, {d}] Y
{externs}
{layers}
def loss(Tensor[float32, B, D] x, Tensor[float32, B, D] y, {params}) -> float32 {{
    d = {chain} - y
    return mean(d * d)
}}
def main() {{
    (l, g) = value_and_grad(loss, wrt=({wrt}))(X, Y, {args})
    ({grads}) = g
    return (l, {updates})
}}
"""


def pipeline_source(b: int, d: int) -> str:
    layers = "\n".join(f"def layer{i}(Tensor[float32, B, D] x, Tensor[float32, D, D] w) -> Tensor[float32, B, D] {{\n"
                       f"    return gelu(x @ w)\n}}" for i in range(4))
    chain = "x"
    for i in range(4):
        chain = f"layer{i}({chain}, w{i})"
    return PIPELINE.format(b=b, d=d, externs="\n".join(f"extern Tensor[float32, {d}, {d}] W{i}" for i in range(4)),
                           layers=layers, params=", ".join(f"Tensor[float32, D, D] w{i}" for i in range(4)),
                           chain=chain, wrt=", ".join(f"w{i}" for i in range(4)),
                           args=", ".join(f"W{i}" for i in range(4)), grads=", ".join(f"g{i}" for i in range(4)),
                           updates=", ".join(f"W{i} - 0.01 * g{i}" for i in range(4)))


# ------------------------------------------------------------------------------------- building

def build(workdir: Path, workload: str, ngpu: int, args) -> Path:
    from xgbuild.build.package import engine_of
    from xgbuild.compiler.driver import compile_source
    from xgbuild.compiler.frontend import CheckOptions
    from xgbuild.compiler.frontend.shard_plan import load_plan
    from xgbuild.settings import Settings

    options = CheckOptions(num_gpu=ngpu, target=args.target)
    if workload in ("pipeline", "pipeline-dp"):
        b, d = (int(x) for x in args.pipeline_dims.split(","))
        plan_path = workdir / f"{workload}-{ngpu}.toml"
        # pipeline: the 4 layers spread over the GPUs; pipeline-dp: two stages of two layers, each
        # stage on n/2 GPUs (data parallel inside a stage from 4 GPUs on).
        stage = (lambda i: i * ngpu // 4) if workload == "pipeline" else (lambda i: i // 2)
        plan_path.write_text("".join(f"[regions.layer{i}]\nstage = {stage(i)}\n" for i in range(4)) + (
            f"[pipeline]\nmicrobatches = {args.microbatches}\nsplit = {{ X = 0, Y = 0 }}\n"
            f'schedule = "{args.schedule}"\n' if ngpu > 1 else ""))
        compiled = compile_source(pipeline_source(b, d), "pipeline.xg", options,
                                  plan=load_plan(plan_path) if ngpu > 1 else None)
        out = workdir / f"{workload}-{ngpu}.xge"
        # Pipeline ranks run torch's ops: so does the one-GPU baseline, for a fair efficiency.
        engine_of(compiled, None).save(out)
        return out
    if workload.startswith("matmul"):
        dtype = "bfloat16" if args.device == "cuda" else "float32"
        src = MATMUL.format(dtype=dtype, n=args.size, shards=SHARDS[workload])
        compiled = compile_source(src, f"{workload}.xg", options)
    else:
        text = (REPO_ROOT / "models" / "train_tiny.xg").read_text()
        dims = dict(kv.split("=") for kv in args.train_dims.split(","))
        for k, v in dims.items():
            text = re.sub(rf"^{k} = \d+", f"{k} = {int(v)}", text, flags=re.M)
        text = re.sub(r"^SCALE = .*$", f"SCALE = {int(dims.get('D', 32)) ** -0.5!r}", text, flags=re.M)
        # The model imports std.nn / std.optim relative to models/: compile it from there.
        path = REPO_ROOT / "models" / f".bench_train_{os.getpid()}.xg"
        path.write_text(text)
        try:
            from xgbuild.compiler.driver import compile_file
            compiled = compile_file(path, options, plan=load_plan(REPO_ROOT / "models" / "plans" / "train_tensor.toml"))
        finally:
            path.unlink()
    out = workdir / f"{workload}-{ngpu}.xge"
    table = None
    # On CPUs the ranks run kernels only under Triton's interpreter (XG_SPMD_KERNELS=interpret, with
    # --tune predict): slow, a check of the script's kernel path.
    interpreted = os.environ.get("XG_SPMD_KERNELS") == "interpret"
    if args.kernels and (args.device == "cuda" or interpreted):
        from xgbuild.build.kernels import kernels_for
        from xgbuild.build.target import target_profile
        settings = Settings.from_env()
        table = kernels_for(compiled, target_profile(compiled.target, settings), args.tune, settings)
    engine_of(compiled, table).save(out)
    return out


# ------------------------------------------------------------------------------------- one rank

def worker(args) -> None:
    import torch.distributed as dist

    from xgbuild.compiler.ir.graph import Op
    from xgbuild.compiler.ir.layout import split_inputs
    from xgbuild.runtime.distributed import comm_blocks, init_group, kernel_path, leave_group
    from xgbuild.runtime.engine import Engine
    from xgbuild.runtime.spmd import SpmdExecutor, local_graph
    from xgbuild.runtime.tensor_io import random_inputs
    from xgbuild.settings import RunSettings, dist_env

    env = dist_env()
    group = init_group(env, args.device, 600.0)
    dev = group.device
    engine = Engine.load(args.engine, RunSettings.from_env())
    sig = {s["name"]: (s["dtype"], tuple(s["shape"])) for s in engine.signature}
    values = {k: v.to(dev) for k, v in random_inputs(sig, 0).items()}
    for k in values:
        if k.startswith("V_"):
            values[k] = values[k].abs() + 1e-3                 # AdamW's second moment is positive
    inputs = engine.prepare_inputs(values, "cuda" if dev != "cpu" else "cpu")
    graph, _, _ = engine.specialised(inputs)
    split = split_inputs(graph)
    local_inputs = {k: (v.chunk(group.world, split[k])[group.rank].clone() if k in split else v)
                    for k, v in inputs.items()}

    def sync() -> None:
        if dev != "cpu":
            torch.cuda.synchronize()
        if group.world > 1:
            dist.barrier()

    plans, launch_fn, mode = kernel_path(engine, "cuda" if dev != "cpu" else "cpu", False)

    names = []
    executors = []
    hosts: list[tuple[float, float]] = []      # per step: ms until the run returned, ms of it waiting on transfers

    def steps(overlap: bool, blocks: tuple[int, int] = (1, 0)) -> list[float]:
        ex = SpmdExecutor(group, check=False, overlap=overlap, kernels=plans, launch=launch_fn, kernel_mode=mode,
                          row_blocks=blocks[0], min_block_bytes=blocks[1])
        executors.append(ex)
        for _ in range(2):
            ex.run(graph, local_inputs, split)
        names.append(ex.name)
        out = []
        for _ in range(args.steps):
            sync()
            t0 = time.perf_counter()
            ex.run(graph, local_inputs, split)
            host = (time.perf_counter() - t0) * 1e3      # the rank's Python returns before its GPU is done
            sync()
            out.append((time.perf_counter() - t0) * 1e3)
            if overlap and len(executors) == 1:
                hosts.append((host, ex.stats.get("wait_ms", 0.0)))
        return out

    from xgbuild.compiler.ir.stages import has_stages, stage_gpus, stage_of, stage_summary
    staged = has_stages(graph)
    replicas = len(stage_gpus(graph)[0]) if staged else 1
    blocks = comm_blocks(engine.settings.comm_blocks)          # XG_COMM_BLOCKS, from --comm-blocks (main)
    normal = steps(True, blocks)
    split_count = executors[0].stats.get("split_collectives", 0)
    if args.profile and staged:
        profile_step(executors[0], graph, local_inputs, split, group, Path(args.profile) / f"{Path(args.engine).stem}-rank{group.rank}.txt")
    # A pipeline's transfers are point-to-point sends already overlapping the other stages: no
    # serialised variant to compare with, except for the collectives inside stages of several GPUs.
    serial = steps(False) if group.world > 1 and (not staged or replicas > 1) else normal
    # Where reduced matmuls ran in row blocks: the step again with them whole.
    whole = steps(True) if split_count else None
    # The plan's collectives alone, on tensors of their local input shapes.
    local, _ = local_graph(graph, group.world)
    comm_ms = 0.0
    if staged and replicas > 1:       # this stage's collectives alone, on float32 tensors of their bytes
        stage = stage_of(graph, group.rank)[0]
        pg = executors[0]._stage_groups[stage]
        mine = [c for c in stage_summary(graph)["collectives"] if c["stage"] == stage]
        def stage_sync() -> None:      # stages have different collectives: fence only this one's GPUs
            if dev != "cpu":
                torch.cuda.synchronize()
            dist.barrier(group=pg)
        for _ in range(2):
            times = []
            for c in mine:
                x = torch.ones(max(1, (c["bytes"] or 4) // 4), device=dev if dev != "cpu" else None)
                stage_sync()
                t0 = time.perf_counter()
                if c["op"] in ("all_reduce", "reduce_scatter"):
                    dist.all_reduce(x, group=pg)
                else:
                    outs = [torch.empty_like(x[: x.numel() // replicas]) for _ in range(replicas)]
                    dist.all_gather(outs, x[: x.numel() // replicas].contiguous(), group=pg)
                stage_sync()
                times.append((time.perf_counter() - t0) * 1e3)
            comm_ms = sum(times)
        sync()
    elif group.world > 1 and not staged:
        ex = SpmdExecutor(group, check=False)
        kinds = (Op.ALL_GATHER, Op.ALL_REDUCE, Op.REDUCE_SCATTER, Op.ALL_TO_ALL)
        for _ in range(2):
            times = []
            for n in local.nodes:
                if n.op in kinds:
                    x = torch.ones(local.node(n.inputs[0]).shape, dtype=ex.ops.dtype(n.dtype), device=dev if dev != "cpu" else None)
                    sync()
                    t0 = time.perf_counter()
                    work, finish = ex.collective(n, x)
                    work.wait()
                    finish()
                    sync()
                    times.append((time.perf_counter() - t0) * 1e3)
            comm_ms = sum(times)       # the second pass: warm
    result = {"rank": group.rank, "step_ms": statistics.median(normal), "serial_ms": statistics.median(serial),
              "whole_ms": statistics.median(whole) if whole else None, "split_collectives": split_count,
              "comm_ms": comm_ms, "executor": names[0],
              "host_ms": statistics.median(h for h, _ in hosts), "wait_ms": statistics.median(w for _, w in hosts)}
    gathered = [None] * group.world
    if group.world > 1:
        dist.all_gather_object(gathered, result)
    else:
        gathered = [result]
    if group.rank == 0:
        Path(args.result).write_text(json.dumps(gathered))
    leave_group()


def profile_step(ex, graph, inputs, split, group, out: Path) -> None:
    """One step under torch.profiler: how long this rank's GPU computed, ran NCCL kernels and sat
    idle, with the kernels that took longest (a diagnosis aid, --profile)."""
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        ex.run(graph, inputs, split)
        torch.cuda.synchronize()
    events = [e for e in prof.events() if e.device_type.name == "CUDA"]
    if not events:
        return
    nccl = sum(e.device_time for e in events if "nccl" in e.name.lower())
    compute = [e for e in events if "nccl" not in e.name.lower()]
    busy = sum(e.device_time for e in compute)
    spans = sorted((e.time_range.start, e.time_range.end) for e in compute)
    start, end = spans[0][0], max(b for _, b in spans)
    merged, lo, hi = 0, *spans[0]
    for a, b in spans[1:]:
        if a > hi:
            merged += hi - lo
            lo, hi = a, b
        else:
            hi = max(hi, b)
    merged += hi - lo
    lines = [f"rank {group.rank}: first to last compute kernel {(end - start) / 1e3:.2f} ms, compute kernels busy "
             f"{merged / 1e3:.2f} ms (sum {busy / 1e3:.2f} ms), NCCL kernels {nccl / 1e3:.2f} ms, {len(compute)} kernels"]
    lines.append(prof.key_averages().table(sort_by="cuda_time_total", row_limit=15))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines))


def launch(engine: Path, n: int, args) -> list[dict]:
    from xgbuild.runtime.launch import free_port
    result = Path(tempfile.mkstemp(suffix=".json")[1])
    port = free_port()
    procs = []
    for rank in range(n):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(n), "LOCAL_RANK": str(rank),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        if env.get("XG_SPMD_KERNELS") == "interpret":
            env["TRITON_INTERPRET"] = "1"       # the ranks only: the build compiles cubins
        procs.append(subprocess.Popen([sys.executable, __file__, "--worker", "--engine", str(engine), "--result",
                                       str(result), "--device", args.device, "--steps", str(args.steps),
                                       "--comm-blocks", args.comm_blocks,
                                       *(["--profile", args.profile] if args.profile else [])], env=env))
    codes = [p.wait() for p in procs]
    if any(codes):
        raise SystemExit(f"a rank failed ({codes}) for {engine.name} on {n}")
    out = json.loads(result.read_text())
    result.unlink()
    return out


# ------------------------------------------------------------------------------------- baselines

def torch_baselines(args) -> dict:
    """PyTorch eager and torch.compile for the matmul on one device (ms per step)."""
    dev = "cuda" if args.device == "cuda" else "cpu"
    dtype = torch.bfloat16 if dev == "cuda" else torch.float32
    a = torch.randn(args.size, args.size, device=dev, dtype=dtype)
    b = torch.randn(args.size, args.size, device=dev, dtype=dtype)

    def timed(fn) -> float:
        for _ in range(3):
            fn()
        out = []
        for _ in range(args.steps):
            if dev == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn()
            if dev == "cuda":
                torch.cuda.synchronize()
            out.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(out)

    res = {"eager_ms": timed(lambda: a @ b)}
    try:
        mm = torch.compile(lambda x, y: x @ y)
        res["compile_ms"] = timed(lambda: mm(a, b))
    except Exception as exc:     # torch.compile needs a compiler toolchain; report, don't fail
        res["compile_error"] = str(exc).splitlines()[0][:120]
    return res


def _pipeline_bytes(pp: dict | None) -> float:
    """Bytes one GPU of a pipeline sends per step: its replica's sends averaged over the stages,
    and its part of the ring collectives inside its stage (about 2 (D-1)/D of an all-reduced
    value, (D-1)/D of a gathered one)."""
    if not pp:
        return 0.0
    d = pp.get("replicas", 1)
    inside = sum((2 if c["op"] in ("all_reduce", "reduce_scatter") else 1) * (d - 1) / d * (c["bytes"] or 0)
                 for c in pp.get("collectives", ())) / max(pp["stages"], 1)
    return pp["bytes_moved"] / pp["stages"] + inside


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gpus", default="1,2,4")
    p.add_argument("--size", type=int, default=16384)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--train-dims", default="T=8192,D=2048,F=8192,V=1024")
    p.add_argument("--workloads", default="matmul-rows,matmul-contract,train,pipeline,pipeline-dp")
    p.add_argument("--pipeline-dims", default="4096,4096", help="batch,width of the pipeline workload's MLP")
    p.add_argument("--microbatches", type=int, default=8, help="the pipeline workload's microbatches")
    p.add_argument("--schedule", default="1f1b", choices=["1f1b", "gpipe"], help="the pipeline workloads' schedule")
    p.add_argument("--profile", default=None, help="a directory: each pipeline rank writes a torch.profiler "
                   "summary of one step there (GPU kernel time, idle time, NCCL time)")
    p.add_argument("--comm-blocks", default=os.environ.get("XG_COMM_BLOCKS", "auto"),
                   help="XG_COMM_BLOCKS for the kernel ranks (auto, or the most row blocks of a reduced matmul; "
                   "1: whole); a step that split any is timed whole too")
    p.add_argument("--target", default=None)
    p.add_argument("--tune", default="measure", choices=["measure", "cache", "predict"])
    p.add_argument("--no-kernels", dest="kernels", action="store_false",
                   help="PyTorch's ops per rank (the reference executor) instead of the engine's kernels")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--json", default=str(REPO_ROOT / "out" / "bench_multi_gpu.json"))
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--engine", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    args = p.parse_args()
    from xgbuild.errors import EngineError
    from xgbuild.runtime.distributed import comm_blocks
    os.environ["XG_COMM_BLOCKS"] = args.comm_blocks     # the ranks (and xgrun's policy) read it
    try:
        comm_blocks(args.comm_blocks)
    except EngineError as exc:
        p.error(str(exc))
    if args.worker:
        worker(args)
        return
    have = torch.cuda.device_count() if args.device == "cuda" else 64
    counts = [n for n in map(int, args.gpus.split(",")) if n <= have]
    if not counts:
        raise SystemExit(f"no GPU count in {args.gpus} fits this host ({have} GPUs)")
    from xgbuild.compiler.passes.shard import plan_of
    from xgbuild.runtime.engine import Engine
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for workload in args.workloads.split(","):
            base = None
            for n in counts:
                engine = build(Path(tmp), workload, n, args)
                plan = plan_of(Engine.load(engine).graph, n)
                ranks = launch(engine, n, args)
                step = max(r["step_ms"] for r in ranks)
                serial = max(r["serial_ms"] for r in ranks)
                comm = max(r["comm_ms"] for r in ranks)
                base = step if n == 1 else base
                overlap = None if n == 1 or comm <= 0 else max(0.0, min(1.0, (serial - step) / comm))
                whole = max(r["whole_ms"] for r in ranks) if ranks[0]["whole_ms"] is not None else None
                rows.append({"workload": workload, "gpus": n, "step_ms": step, "serial_ms": serial, "comm_ms": comm,
                             # per rank: ms until its Python returned (host-bound when close to step_ms),
                             # and ms of that spent waiting on transfers
                             "host_ms": [r["host_ms"] for r in ranks], "wait_ms": [r["wait_ms"] for r in ranks],
                             "efficiency": (base / (n * step)) if base else None, "overlap": overlap,
                             # collectives split in row blocks; the same step with none split
                             "split_collectives": ranks[0]["split_collectives"], "whole_ms": whole,
                             "whole_efficiency": (base / (n * whole)) if base and whole else None,
                             "whole_overlap": None if whole is None or comm <= 0
                             else max(0.0, min(1.0, (serial - whole) / comm)),
                             "executor": ranks[0]["executor"],
                             "collectives": sum(1 for c in plan["collectives"] if c["op"] != "shard"),
                             "bytes_per_gpu": plan["bytes_moved"] + _pipeline_bytes(plan.get("pipeline"))})
    baselines = torch_baselines(args) if any(w.startswith("matmul") for w in args.workloads.split(",")) else {}
    print(f"{'workload':<16} {'GPUs':>4} {'ms/step':>9} {'efficiency':>10} {'comm ms':>8} {'overlap':>8} "
          f"{'collectives':>11} {'MB/GPU':>8} {'host ms':>8} {'split':>5} {'whole':>16}  executor")
    pct = lambda x: f"{100 * x:.0f}%" if x is not None else "-"     # noqa: E731
    for r in rows:
        eff = f"{100 * r['efficiency']:.0f}%" if r["efficiency"] else "-"
        ov = f"{100 * r['overlap']:.0f}%" if r["overlap"] is not None else "-"
        # the step with no collective split in row blocks: ms/step, efficiency, overlap
        whole = (f"{r['whole_ms']:.2f} {pct(r['whole_efficiency'])} {pct(r['whole_overlap'])}"
                 if r["whole_ms"] is not None else "-")
        print(f"{r['workload']:<16} {r['gpus']:>4} {r['step_ms']:>9.2f} {eff:>10} {r['comm_ms']:>8.2f} {ov:>8} "
              f"{r['collectives']:>11} {r['bytes_per_gpu'] / 1e6:>8.1f} {max(r['host_ms']):>8.2f} {r['split_collectives']:>5} {whole:>16}  "
              f"{r['executor']}")
    if baselines:
        print(f"matmul {args.size}^3 on one device: torch eager {baselines['eager_ms']:.2f} ms, torch.compile "
              + (f"{baselines['compile_ms']:.2f} ms" if "compile_ms" in baselines else baselines.get("compile_error", "-")))
    report = {"host": platform.node(), "device": args.device,
              "gpu": torch.cuda.get_device_name(0) if args.device == "cuda" else platform.processor(),
              "torch": torch.__version__, "size": args.size, "train_dims": args.train_dims, "steps": args.steps,
              "rows": rows, "torch_single_device": baselines}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(report, indent=2))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
