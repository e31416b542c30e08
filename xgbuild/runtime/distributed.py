"""Distributed runs, one rank's side: join the process group, run the engine's SPMD plan on this
rank's shards, gather the outputs, leave.

The group is torch.distributed's default one: gloo on CPUs, NCCL on GPUs (one GPU per rank,
`cuda:LOCAL_RANK`). Every collective has the group's timeout, so a rank whose peer died or hung
fails instead of waiting forever. (Under `xgrun --nproc` the rank's heartbeat to the launcher is
started by cli/xgrun_rank.py, before torch loads.)
"""

from __future__ import annotations

import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, Mapping

import torch
import torch.distributed as dist

from ..compiler.ir.graph import tree_ids
from ..compiler.ir.layout import infer_layouts
from ..compiler.ir.stages import has_stages, rank_share, stage_inputs, stage_plans
from ..compiler.passes.shard import ShardingError
from ..errors import EngineError, ExecutionError, InputError, XGError
from ..settings import DistEnv
from ..dtypes import XG_NAMES
from .engine import Engine, ResultValue, RunResult, _build, _flat
from .spmd import Group, SpmdExecutor, split_inputs

def init_group(env: DistEnv, device: str, timeout_s: float) -> Group:
    """Join the run `env` describes; `device` is "cpu" (gloo) or "cuda" (NCCL, this rank's GPU)."""
    if device == "cuda":
        if not torch.cuda.is_available() or torch.cuda.device_count() <= env.local_rank:
            raise EngineError(f"rank {env.rank} needs GPU {env.local_rank}, and this host has "
                              f"{torch.cuda.device_count() if torch.cuda.is_available() else 0}")
        torch.cuda.set_device(env.local_rank)
    backend = "nccl" if device == "cuda" else "gloo"
    try:
        dist.init_process_group(backend, init_method=f"tcp://{env.master_addr}:{env.master_port}", rank=env.rank,
                                world_size=env.world_size, timeout=timedelta(seconds=timeout_s))
    except (RuntimeError, ValueError) as exc:
        raise ExecutionError(f"rank {env.rank} could not join the run at {env.master_addr}:{env.master_port}: "
                             f"{str(exc).strip().splitlines()[0] if str(exc).strip() else exc}") from None
    return Group(env.rank, env.world_size, f"cuda:{env.local_rank}" if device == "cuda" else "cpu", timeout_s)


def leave_group() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def run_spmd(engine: Engine, external_values: Mapping[str, Any] | None, group: Group, *, check: bool = True,
             float64: bool = False, overlap: bool = True,
             whole_shapes: Mapping[str, tuple[int, ...]] | None = None) -> tuple[RunResult, dict[str, torch.Tensor]]:
    """Run `engine` on this rank. `external_values` are whole tensors, except those named in
    `whole_shapes`, which are already this rank's slices (`tensor_io.load_tensor_shards`) of
    tensors of those shapes. Returns the result, with whole outputs on rank 0 (gathered there;
    other ranks' results hold none), and this rank's own pieces of them (for `--output-per-rank`)."""
    planned = check_world(engine, group.world)
    device = "cuda" if group.device.startswith("cuda") else "cpu"
    external_values = dict(external_values or {})
    unread: frozenset[str] = frozenset()
    split, piece, pieces, reads = rank_slices(engine.graph, group.rank, group.world)
    staged = reads is not None
    if staged:
        # A pipeline rank holds only the inputs its stage reads: the rest stand in as meta tensors.
        unread = frozenset(external_values) - reads
        external_values = {k: (torch.empty(v.shape, dtype=v.dtype, device="meta")
                               if k in unread and isinstance(v, torch.Tensor) else v)
                           for k, v in external_values.items()}
    if device == "cuda":
        external_values = {k: (v if k in unread else _to(v, group.device)) for k, v in external_values.items()}
    inputs = engine.prepare_inputs(external_values, device, placeholders=unread)
    whole_shapes = dict(whole_shapes or {})
    if set(whole_shapes) - set(split):
        raise ExecutionError(f"inputs {sorted(set(whole_shapes) - set(split))} were loaded as slices, but the "
                             "plan uses them whole")
    t0 = time.perf_counter()
    # Specialise on the whole shapes (meta tensors stand in for the slices: only shapes matter).
    shapes = {k: (torch.empty(whole_shapes[k], dtype=v.dtype, device="meta") if k in whole_shapes else v)
              for k, v in inputs.items()}
    graph, env, cached = engine.specialised(shapes)
    if staged:
        try:         # the microbatches (and a stage's GPUs) must divide the batch: say so before slicing it
            stage_plans(graph)
        except ShardingError as exc:
            raise InputError(str(exc)) from None
    # Keep only this rank's slice of a split input (a copy, so the whole one can be freed).
    local_inputs = {k: (v.chunk(pieces, split[k])[piece].clone() if k in split and k not in whole_shapes
                        else v) for k, v in inputs.items()}
    del inputs, shapes
    # A pipeline's ranks run torch's ops for now (the engine's kernels are tuned for one process).
    problem = None      # a bad setting on this rank: said on every rank (below), none waits for it
    try:
        plans, launch, mode = (None, None, "") if staged else kernel_path(engine, device, float64)
        blocks, min_bytes = comm_blocks(engine.settings.comm_blocks) if plans is not None else (1, 0)
    except XGError as exc:      # a bad setting, or no GPU driver for the kernels' launcher
        if group.world == 1:
            raise
        problem, plans, launch, mode, blocks, min_bytes = str(exc), None, None, "", 1, 0
    executor = SpmdExecutor(group, float64=float64, check=check, overlap=overlap, kernels=plans, launch=launch,
                            kernel_mode=mode, row_blocks=blocks, min_block_bytes=min_bytes)
    if staged:
        executor.name = "pipeline-" + device
    _same_executor(group, executor.name + ("" if blocks == 1 else " with XG_COMM_BLOCKS=auto" if min_bytes
                                           else f" with XG_COMM_BLOCKS={blocks}"), problem)
    out = executor.run(graph, local_inputs, split)
    if staged:      # outputs arrive on rank 0 only: the others hold what they computed
        whole = out.values
    else:           # split outputs are gathered to rank 0 only (the others would hold them for nothing)
        layouts = infer_layouts(graph, group.world)
        whole = {i: _gather(out.values[i], layouts[i].dim if layouts[i].kind == "S" else None, group)
                 for i in tree_ids(graph.output)}
    total_ms = (time.perf_counter() - t0) * 1e3
    metadata = {
        "target": engine.manifest["target"], "num_gpu": planned, "engine_digest": engine.digest,
        "device": device, "executor": executor.name + ("-float64" if float64 else ""), "check": check,
        "rank": group.rank, "world_size": group.world, "split_inputs": split,
        "specialization": {"symbols": dict(sorted(env.items())), "cached": cached,
                           "inputs": {n: {"dtype": XG_NAMES[t.dtype], "shape": list(t.shape)}
                                      for n, t in local_inputs.items()}},
        "loaded_as_slices": sorted(whole_shapes),
        "timings": {"total_ms": total_ms, "comm": executor.stats},
    }
    mine = _flat(graph.output, out.values, partial=staged)
    if group.rank != 0:
        return RunResult(None, metadata, {}), mine
    return RunResult(_build(graph.output, whole), metadata, _flat(graph.output, whole)), mine


def rank_slices(graph: Any, rank: int, world: int) -> tuple[dict[str, int], int, int, frozenset[str] | None]:
    """What rank `rank` of `world` holds of the inputs: (split dim of each input it holds a slice
    of, its piece, the number of pieces, the inputs it reads at all or None for every one). The
    plan's splits in SPMD; in a pipeline, its stage's inputs and its replica's share of the batch."""
    if world > 1 and has_stages(graph):
        split, piece, pieces = rank_share(graph, rank)
        return split, piece, pieces, frozenset(stage_inputs(graph, rank))
    return split_inputs(graph), rank, world, None


def kernel_path(engine: Engine, device: str, float64: bool) -> tuple[list | None, Any, str]:
    """The engine's kernels for this rank, (plans, launch, mode), or (None, None, "") for torch's
    ops: the float64 reference, engines without kernels, or XG_SPMD_KERNELS=0 (the engine's
    run settings)."""
    choice = engine.settings.spmd_kernels
    if choice not in ("", "0", "1", "interpret"):
        raise EngineError(f"XG_SPMD_KERNELS is {choice!r}; use 0 (torch ops), 1 (the engine's kernels on "
                          "GPUs, the default) or interpret (the kernels under Triton's interpreter on CPUs)")
    if float64 or choice == "0" or not engine.manifest.get("kernels"):
        return None, None, ""
    if device == "cuda":
        from .cuda import KernelLauncher, device_arch
        from .plans import plans_from_manifest
        arch = device_arch(torch.cuda.current_device())
        archs = {v["arch"] for k in engine.manifest["kernels"] for v in k["variants"]}
        if arch not in archs:
            return None, None, ""               # kernels for another GPU: torch's ops run the plan
        launcher = KernelLauncher(torch.cuda.current_device())
        return (plans_from_manifest(engine.manifest, engine.file.entries),
                lambda c, grid, args: launcher.launch(c.handle, grid, args), "cuda")
    if choice == "interpret":
        if not engine.settings.triton_interpret:
            raise EngineError("XG_SPMD_KERNELS=interpret needs TRITON_INTERPRET=1 in the ranks' environment "
                              "before they start (Triton reads it when it is imported); xgrun --nproc sets it")
        from . import interpret
        interpret.enable()
        return interpret.plans_from_manifest(engine.manifest), interpret.launch, "interpret"
    return None, None, ""


AUTO_BLOCKS = 4                  # XG_COMM_BLOCKS unset: up to 4 blocks ...
AUTO_MIN_BYTES = 8 << 20         # ... each of whose collectives moves at least 8 MiB


def comm_blocks(text: str) -> tuple[int, int]:
    """XG_COMM_BLOCKS (`text`, from the run settings): (the most blocks of rows, the fewest bytes a
    block's collective moves) for a matmul whose product is all-reduced or reduce-scattered on a
    kernel rank (each block's collective starts as soon as its kernels are launched, overlapping
    the next block). Unset or `auto`: up to 4 blocks of at least 8 MiB each (a smaller reduction
    stays whole: its transfer is short, and more of them would cost more in latency than they
    hide); N: up to N blocks, whatever their size; 1: whole. Every rank must be given the same
    value."""
    text = text.strip() or "auto"
    if text == "auto":
        return AUTO_BLOCKS, AUTO_MIN_BYTES
    if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= 64:
        raise EngineError(f"XG_COMM_BLOCKS is {text!r}; give auto (the default: up to {AUTO_BLOCKS} row blocks of "
                          f"at least {AUTO_MIN_BYTES >> 20} MiB each) or a whole number of row blocks from 1 "
                          "(a reduced matmul runs whole) to 64")
    return int(text), 0


def _same_executor(group: Group, name: str, problem: str | None = None) -> None:
    """Every rank must run the plan the same way: the two executors issue collectives in different
    orders, so a mix would pair the wrong transfers or wait until the timeout. `problem`: this
    rank's settings are bad; every rank stops, naming it (rather than waiting for it)."""
    if group.world == 1:
        return
    said: list = [None] * group.world
    try:
        dist.all_gather_object(said, (name, problem))
    except RuntimeError as exc:
        raise ExecutionError(f"rank {group.rank} could not agree on the executor with its peers: "
                             f"{str(exc).strip().splitlines()[0] if str(exc).strip() else exc}") from None
    bad = [(r, why) for r, (_, why) in enumerate(said) if why]
    if bad:
        mine = next((why for r, why in bad if r == group.rank), None)
        raise EngineError(mine or f"rank {bad[0][0]} stopped the run: {bad[0][1]}")
    names = [n for n, _ in said]
    if len(set(names)) > 1:
        raise ExecutionError("ranks would run the plan differently (" + ", ".join(
            f"rank {r}: {n}" for r, n in enumerate(names)) + "): give every rank the same XG_SPMD_KERNELS and "
            "XG_COMM_BLOCKS, and GPUs of the model the engine was built for")


def check_world(engine: Engine, world: int) -> int:
    """The engine's NUM_GPU, if `world` ranks can run it (that many, or one process)."""
    planned = engine.manifest["num_gpu"]
    if world not in (1, planned):
        raise EngineError(f"engine {engine.digest[:12]} is planned for NUM_GPU = {planned}, but the run has "
                          f"{world} ranks: rebuild it with `xgc --num-gpu {world}` or run {planned} ranks")
    return planned


def _gather(x: torch.Tensor, dim: int | None, group: Group) -> torch.Tensor | None:
    """A sharded output joined along its split dim on rank 0 (every rank sends its piece; the
    others get None)."""
    if dim is None or group.world == 1:
        return x
    wire = (x.to(torch.uint8) if x.dtype is torch.bool else x).contiguous()   # NCCL takes contiguous ones only
    parts = [torch.empty_like(wire) for _ in range(group.world)] if group.rank == 0 else None
    try:
        dist.gather(wire, parts, dst=0)
    except (RuntimeError, ValueError) as exc:
        raise ExecutionError(f"gathering an output on rank {group.rank} failed: "
                             f"{str(exc).strip().splitlines()[0]}") from None
    if parts is None:
        return None
    out = torch.cat(parts, dim)
    return out.to(torch.bool) if x.dtype is torch.bool else out


def _to(v: Any, device: str) -> Any:
    return v.to(device) if isinstance(v, torch.Tensor) else v


def run_ranks(engine: Engine, external_values: Mapping[str, Any] | None, nproc: int, env: Mapping[str, str], *,
              device: str = "cpu", check: bool = True, timeout_s: float = 300.0) -> RunResult:
    """`xgrun --nproc N` from Python (`xg.run_engine(..., nproc=N)`): the engine and its inputs go
    to a temporary directory, N ranks of this host run it (in environment `env`), and rank 0's
    gathered outputs come back. A failed rank is an ExecutionError naming it."""
    from .launch import run_ranks as launch_ranks
    from .tensor_io import load_tensors, save_tensors

    if device not in ("cpu", "cuda"):
        raise InputError(f"unknown device {device!r}; use 'cpu' or 'cuda'")
    check_world(engine, nproc)
    values = engine.prepare_inputs({k: _to(v, "cpu") for k, v in (external_values or {}).items()}, "cpu")
    with tempfile.TemporaryDirectory(prefix="xg-ranks-") as tmp:
        engine.save(Path(tmp) / "engine.xge")
        save_tensors(Path(tmp) / "inputs.safetensors", values)
        done = launch_ranks(str(Path(tmp) / "engine.xge"), str(Path(tmp) / "inputs.safetensors"),
                            str(Path(tmp) / "outputs.safetensors"), nproc, device=device, check=check,
                            timeout_s=timeout_s, env=env,
                            allow_fallback=True)     # `engine` is in memory: built here or admitted on load
        if not done.ok:
            raise ExecutionError(done.message)
        tensors = load_tensors(Path(tmp) / "outputs.safetensors", role="outputs of the ranks")
    metadata = {"target": engine.manifest["target"], "num_gpu": engine.manifest["num_gpu"],
                "engine_digest": engine.digest, "device": device, "executor": f"spmd-{device}", "check": check,
                "world_size": nproc}
    return RunResult(_unflat(engine.graph.output, tensors, "out"), metadata, tensors)


def _unflat(tree: dict, tensors: Mapping[str, torch.Tensor], prefix: str) -> Any:
    """What `main` returned, rebuilt from the output file's names (engine._flat's scheme)."""
    if "t" in tree:
        t = tensors[prefix]
        return t.item() if t.dim() == 0 else t
    if "tuple" in tree:
        return tuple(_unflat(item, tensors, f"{prefix}_{i}") for i, item in enumerate(tree["tuple"]))
    if bool(tensors[f"{prefix}_ok"]):
        return ResultValue(True, _unflat(tree["result"]["value"], tensors, f"{prefix}_value"), None)
    return ResultValue(False, None, "error")     # the file keeps whether a Result is Ok, not which error
