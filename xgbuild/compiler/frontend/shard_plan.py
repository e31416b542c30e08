"""Sharding plan files (`xgc --sharding plan.toml`): strategies by name, with no code change.

The declarative form of the GT2 seed's signal configs. A plan maps names to strategies:

    num_gpu = 4                    # optional; `--num-gpu` still wins
    [values]
    TOKENS = 0                     # an external input split along dim 0
    EMB = "replicated"
    [regions.layer1]               # a `with shard("layer1"):` block, or a function's name
    strategy = "data"              # data | tensor | replicated | pipeline
    axis = 0                       # data: the dim split in each tensor the region reads
    replicated = ["w"]             # data: tensors that stay whole (parameters)
    [regions.mlp]
    strategy = "tensor"
    shard = { w1 = 1, w2 = 0 }     # tensor: name -> dim
    [regions.head]
    strategy = "pipeline"
    stage = 1                      # pipeline: the stage that runs the region (or `workers = [2, 3]`)
    [pipeline]                     # with pipeline regions: stages overlap on microbatches
    microbatches = 4
    split = { X = 0 }              # the inputs that hold the batch, and along which dim
    schedule = "1f1b"              # or "gpipe"

Owns: reading and validating the file (XG0506, XG0507) and checking its names against a checked
program (XG0505 unknown, XG0503 conflicting with the source's shards, XG0500 indivisible). Lowering
applies it: SHARD nodes where the region starts (ir/lower.py); `replicated` is a SHARD with no dim;
a pipeline region's stage is a STAGE node on each value it reads (passes/stage.py places the rest).

Stages are numbered by `stage = K` (S stages: the largest K + 1), each on NUM_GPU / S GPUs
(stage K on GPUs K*D to K*D + D - 1), or given their GPUs by GT2's `workers = [...]` lists (equal
or disjoint, of one length, covering every GPU; stages in the order of their lowest GPU; a one-GPU
list `workers = [K]` is `stage = K`). A stage
of D GPUs runs data parallel: D replicas of the pipeline, each with 1/D of the `split` inputs'
batch, their weight gradients summed inside each stage. Splitting values by tensor or data regions
beside pipeline regions is XG0507.
"""

from __future__ import annotations

import hashlib
import tomllib
from dataclasses import dataclass, replace
from pathlib import Path

from ...errors import CompileError
from .codes import PLAN_BAD, PLAN_PIPELINE, PLAN_UNKNOWN, SHARD_CONFLICT, SHARD_INDIVISIBLE, Code
from .diagnostics import Diagnostic, Severity, render
from .source import Span, UnreadableSource, read_source

MAX_PLAN_BYTES = 1 << 20      # a plan names regions and values: kilobytes, never megabytes

STRATEGIES = ("data", "tensor", "replicated", "pipeline")


@dataclass(frozen=True)
class RegionPlan:
    name: str
    strategy: str
    axis: int = 0
    replicated: tuple[str, ...] = ()
    shard: tuple[tuple[str, int], ...] = ()
    stage: int | None = None          # pipeline: `stage = K`
    workers: tuple[int, ...] = ()     # pipeline: GT2's `workers = [...]`, the stage's GPUs

    def dims_for(self, names: list[str], ranks: dict[str, int]) -> dict[str, int | None]:
        """What the region does to the tensors it reads: name -> dim split, or None (made whole)."""
        if self.strategy == "replicated":
            return {n: None for n in names}
        if self.strategy == "pipeline":
            return {}
        if self.strategy == "tensor":
            return {n: d for n, d in self.shard if n in names}
        return {n: self.axis for n in names if n not in self.replicated and ranks.get(n, 0) > self.axis}


@dataclass(frozen=True)
class ShardingPlan:
    name: str                                   # the file's name (engines are path-free)
    text: bytes
    num_gpu: int | None
    values: tuple[tuple[str, int | None], ...]  # None: replicated
    regions: tuple[RegionPlan, ...]
    microbatches: int = 1                         # [pipeline]
    micro_split: tuple[tuple[str, int], ...] = ()
    schedule: str = "1f1b"

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text).hexdigest()

    def region(self, name: str) -> RegionPlan | None:
        return next((r for r in self.regions if r.name == name), None)

    @property
    def pipeline(self) -> bool:
        return any(r.strategy == "pipeline" for r in self.regions)

    def stages(self, num_gpu: int) -> tuple[tuple[tuple[int, ...], ...], dict[str, int]]:
        """The pipeline's stages on `num_gpu` GPUs: each stage's GPUs, and each region's stage
        (XG0506 for a layout that does not work)."""
        regions = [r for r in self.regions if r.strategy == "pipeline"]
        at = self.name
        for r in regions:
            big = [w for w in r.workers if w >= num_gpu]
            if big:
                raise plan_error(PLAN_BAD, f"region `{r.name}` runs on GPU {big[0]}, but the engine has "
                                 f"{num_gpu} (NUM_GPU)", f"{at}: [regions.{r.name}]",
                                 f"GPUs are 0 to {num_gpu - 1}; raise NUM_GPU (`--num-gpu`)")
        several = any(len(r.workers) > 1 for r in regions)
        if several and not all(r.workers for r in regions):
            raise plan_error(PLAN_BAD, "some pipeline regions name a `stage` and others several `workers`", at,
                             "give every pipeline region `stage = K`, or every one its `workers = [...]`")
        single = any(r.workers for r in regions) and not several
        if single:       # `workers = [K]` (GT2's one-GPU stage) is `stage = K`
            regions = [r if r.stage is not None else RegionPlan(r.name, "pipeline", stage=r.workers[0])
                       for r in regions]
        elif several:
            lists = sorted({r.workers for r in regions})
            seen: dict[int, tuple[int, ...]] = {}
            for ws in lists:
                for w in ws:
                    if w in seen:
                        raise plan_error(PLAN_BAD, f"GPU {w} is in two different stages, {list(seen[w])} and "
                                         f"{list(ws)}", at, "regions on one stage list the same GPUs; stages "
                                         "share none")
                    seen[w] = ws
            if len({len(ws) for ws in lists}) > 1:
                raise plan_error(PLAN_BAD, "stages of different sizes: " + ", ".join(str(list(ws)) for ws in lists),
                                 at, "every stage runs on the same number of GPUs (each holds one replica's share)")
            idle = [k for k in range(num_gpu) if k not in seen]
            if idle:
                raise plan_error(PLAN_BAD, f"GPU {idle[0]} is in no stage's `workers`", at,
                                 f"give every GPU 0 to {num_gpu - 1} to a stage, or lower NUM_GPU")
            groups = tuple(sorted(lists, key=lambda ws: ws[0]))
            return groups, {r.name: groups.index(r.workers) for r in regions}
        for r in regions:
            if r.stage >= num_gpu:
                raise plan_error(PLAN_BAD, f"region `{r.name}` is placed on stage {r.stage}, but the engine has "
                                 f"{num_gpu} GPUs (NUM_GPU)", f"{at}: [regions.{r.name}]",
                                 f"stages are 0 to {num_gpu - 1}; raise NUM_GPU (`--num-gpu`) or move the region")
        count = max((r.stage for r in regions), default=0) + 1
        if num_gpu % count:
            fits = sorted({count * k for k in (1, 2, 4)})
            raise plan_error(PLAN_BAD, f"{num_gpu} GPUs do not split evenly over {count} stages", at,
                             "each stage runs on NUM_GPU / stages GPUs: use NUM_GPU = " +
                             " or ".join(str(n) for n in fits) + ", or place the GPUs with `workers = [...]`")
        per = num_gpu // count
        if single and per > 1:
            raise plan_error(PLAN_BAD, f"`workers = [K]` puts a region on one GPU, but {num_gpu} GPUs over {count} "
                             f"stages give each stage {per}", at,
                             "write `stage = K` for every region, or list each stage's GPUs in `workers`")
        return (tuple(tuple(range(k * per, (k + 1) * per)) for k in range(count)),
                {r.name: r.stage for r in regions})


def plan_error(code: Code, detail: str, where: str, help: str | None = None) -> CompileError:
    return _error(code.code, code.fmt(detail=detail), where, help)


def _error(code: str, message: str, where: str, help: str | None = None) -> CompileError:
    """An error in the plan file, rendered rustc-style; its one diagnostic names the file (no line:
    TOML readers do not keep positions) for `--json`."""
    diag = Diagnostic(code, Severity.ERROR, message, where.split(":")[0], 0, 0, Span(0, 0), help=help or "")
    return CompileError(render(replace(diag, file=where), None), [diag])   # the text names the table too


def load_plan(path: Path | str) -> ShardingPlan:
    path = Path(path)
    try:
        raw = read_source(path, MAX_PLAN_BYTES)     # a regular file, read with a cap, like a source
    except UnreadableSource as exc:
        raise plan_error(PLAN_BAD, f"cannot read the sharding plan: {exc}", str(path)) from None
    try:
        doc = tomllib.loads(raw.decode())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise plan_error(PLAN_BAD, f"the sharding plan is not TOML: {exc}", path.name) from None
    unknown = set(doc) - {"num_gpu", "values", "regions", "pipeline"}
    if unknown:
        raise plan_error(PLAN_BAD, f"unknown key `{sorted(unknown)[0]}`", path.name,
                         "a plan has `num_gpu`, a `[values]` table, `[regions.NAME]` tables and a `[pipeline]` table")
    num_gpu = doc.get("num_gpu")
    if num_gpu is not None and (not isinstance(num_gpu, int) or isinstance(num_gpu, bool) or num_gpu < 1):
        raise plan_error(PLAN_BAD, f"`num_gpu` must be a positive integer, got {num_gpu!r}", path.name)
    values = []
    for name, v in _table(doc, "values", path.name).items():
        if v == "replicated":
            values.append((name, None))
        elif isinstance(v, int) and not isinstance(v, bool) and v >= 0:
            values.append((name, v))
        else:
            raise plan_error(PLAN_BAD, f"`values.{name}` must be a dimension (0, 1, ...) or \"replicated\", "
                             f"got {v!r}", path.name)
    regions = [_region(name, body, path.name) for name, body in _table(doc, "regions", path.name).items()]
    micro, split, schedule = _pipeline_table(_table(doc, "pipeline", path.name), f"{path.name}: [pipeline]")
    if (micro > 1 or split) and not any(r.strategy == "pipeline" for r in regions):
        raise plan_error(PLAN_BAD, "`[pipeline]` microbatches need pipeline regions", f"{path.name}: [pipeline]",
                         "place regions on GPUs: `[regions.NAME]` with `stage = K`")
    return ShardingPlan(path.name, raw, num_gpu, tuple(sorted(values)), tuple(sorted(regions, key=lambda r: r.name)),
                        micro, split, schedule)


def _pipeline_table(body: dict, at: str) -> tuple[int, tuple[tuple[str, int], ...], str]:
    extra = sorted(set(body) - {"microbatches", "split", "schedule"})
    if extra:
        raise plan_error(PLAN_BAD, f"unknown key `{extra[0]}` in `[pipeline]`", at,
                         "keys: `microbatches`, `split`, `schedule`")
    schedule = body.get("schedule", "1f1b")
    if schedule not in ("1f1b", "gpipe"):
        raise plan_error(PLAN_BAD, f"`schedule` is {schedule!r}", at, 'schedules: "1f1b" (the default), "gpipe"')
    micro = body.get("microbatches", 1)
    if not _index(micro) or micro < 1:
        raise plan_error(PLAN_BAD, f"`microbatches` must be a positive integer, got {micro!r}", at)
    split = body.get("split", {})
    if not isinstance(split, dict) or not all(_index(d) for d in split.values()):
        raise plan_error(PLAN_BAD, "`split` must map inputs to dimensions: `split = { X = 0 }`", at)
    if micro > 1 and not split:
        raise plan_error(PLAN_BAD, f"{micro} microbatches of what? `split` names no input", at,
                         "say which inputs hold the batch, and along which dim: `split = { X = 0, Y = 0 }`")
    if "schedule" in body and micro == 1:
        raise plan_error(PLAN_BAD, "a `schedule` orders microbatches, and the plan has none", at,
                         "add `microbatches = M` and `split = { X = 0 }`, or drop `schedule`")
    return micro, tuple(sorted(split.items())), schedule


def _table(doc: dict, key: str, where: str) -> dict:
    t = doc.get(key, {})
    if not isinstance(t, dict):
        raise plan_error(PLAN_BAD, f"`{key}` must be a table (`[{key}]`)", where)
    return t


def _region(name: str, body: object, where: str) -> RegionPlan:
    at = f"{where}: [regions.{name}]"
    if not isinstance(body, dict):
        raise plan_error(PLAN_BAD, f"`regions.{name}` must be a table", at)
    strategy = body.get("strategy")
    if strategy is None and ("stage" in body or "workers" in body):
        strategy = "pipeline"             # GT2's spelling: a region on `workers = [k]`
    if strategy == "pipeline" or "stage" in body or "workers" in body:
        return _pipeline_region(name, body, at)
    if strategy not in STRATEGIES:
        raise plan_error(PLAN_BAD, f"region `{name}` has strategy {strategy!r}", at,
                         "strategies: " + ", ".join(f'"{s}"' for s in STRATEGIES))
    allowed = {"strategy", "axis", "replicated"} if strategy == "data" else (
        {"strategy", "shard"} if strategy == "tensor" else {"strategy"})
    extra = sorted(set(body) - allowed)
    if extra:
        raise plan_error(PLAN_BAD, f"`{extra[0]}` does not apply to strategy \"{strategy}\"", at,
                         "keys for it: " + ", ".join(f"`{k}`" for k in sorted(allowed)))
    axis = body.get("axis", 0)
    reps = body.get("replicated", [])
    shard = body.get("shard", {})
    if not isinstance(axis, int) or isinstance(axis, bool) or axis < 0:
        raise plan_error(PLAN_BAD, f"`axis` must be a dimension (0, 1, ...), got {axis!r}", at)
    if not isinstance(reps, list) or not all(isinstance(r, str) for r in reps):
        raise plan_error(PLAN_BAD, "`replicated` must be a list of names", at)
    if not isinstance(shard, dict) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                                              for d in shard.values()):
        raise plan_error(PLAN_BAD, "`shard` must map names to dimensions: `shard = { w1 = 1 }`", at)
    if strategy == "tensor" and not shard:
        raise plan_error(PLAN_BAD, f"region `{name}` is tensor-parallel but splits nothing", at,
                         "say which tensors and dims: `shard = { w1 = 1, w2 = 0 }`")
    return RegionPlan(name, strategy, axis, tuple(reps), tuple(sorted(shard.items())))


def _pipeline_region(name: str, body: dict, at: str) -> RegionPlan:
    strategy = body.get("strategy", "pipeline")
    if strategy != "pipeline":
        raise plan_error(PLAN_PIPELINE, f"region `{name}` is {strategy!r} and also names GPUs (`stage`/`workers`)",
                         at, "a stage of several GPUs is data parallel already (over the `[pipeline] split` "
                         "inputs); tensor parallelism inside a stage is not supported yet: drop `strategy`")
    extra = sorted(set(body) - {"strategy", "stage", "workers"})
    if extra:
        raise plan_error(PLAN_BAD, f"`{extra[0]}` does not apply to strategy \"pipeline\"", at,
                         "keys for it: `stage` (or `workers = [...]`)")
    if "stage" in body and "workers" in body:
        raise plan_error(PLAN_BAD, f"region `{name}` has both `stage` and `workers`", at, "keep one")
    if "workers" in body:
        workers = body["workers"]
        if not isinstance(workers, list) or not workers or not all(_index(w) for w in workers):
            raise plan_error(PLAN_BAD, "`workers` must be a list of GPU indices: `workers = [2, 3]`", at)
        if len(set(workers)) != len(workers):
            raise plan_error(PLAN_BAD, f"`workers` lists a GPU twice: {workers}", at)
        return RegionPlan(name, "pipeline", workers=tuple(sorted(workers)))
    stage = body.get("stage")
    if not _index(stage):
        raise plan_error(PLAN_BAD, f"region `{name}` needs `stage = K`, its place in the pipeline (0, 1, ...), "
                         f"got {stage!r}", at)
    return RegionPlan(name, "pipeline", stage=stage)


def _index(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def check_plan(plan: ShardingPlan, typed, num_gpu: int) -> None:
    """The plan's names against the checked program `typed` (a frontend TypedProgram)."""
    regions = {s.name for s in typed.shards if s.region}
    funcs = {n: sig for n, sig in typed.funcs.items() if n != "main"}
    if plan.pipeline:
        _check_pipeline(plan, typed, num_gpu)
    source_shards = {(s.function, s.name): s.dim for s in typed.shards if not s.region}
    for name, dim in plan.values:
        where = f"{plan.name}: [values] {name}"
        ty = typed.externals.get(name)
        if ty is None:
            raise plan_error(PLAN_UNKNOWN, f"the plan splits `{name}`, which is not an input of the program", where,
                             "inputs: " + (", ".join(f"`{n}`" for n in sorted(typed.externals)) or "none"))
        mine = source_shards.get(("main", name))
        if mine is not None and mine != dim:
            raise _conflict(name, mine, dim, where)
        shape = getattr(ty, "shape", ())
        if dim is not None and dim >= len(shape):
            raise plan_error(PLAN_BAD, f"`{name}` has {len(shape)} dimensions; the plan splits dimension {dim}", where)
        if dim is not None and isinstance(shape[dim], int) and shape[dim] % num_gpu:
            raise _error(SHARD_INDIVISIBLE.code, SHARD_INDIVISIBLE.fmt(dim=dim, name=name, size=shape[dim],
                                                                       num_gpu=num_gpu), where)
    for r in plan.regions:
        where = f"{plan.name}: [regions.{r.name}]"
        if r.name not in regions and r.name not in funcs:
            raise plan_error(PLAN_UNKNOWN, f"the plan names `{r.name}`, which is neither a `with shard(\"...\")` "
                             "region nor a function of the program", where,
                             "regions: " + (", ".join(f'"{n}"' for n in sorted(regions)) or "none") +
                             "; functions: " + ", ".join(f"`{n}`" for n in sorted(funcs)))
        if r.name in funcs:
            params = [p for p, _ in funcs[r.name].params]
            for n in [n for n, _ in r.shard] + list(r.replicated):
                if n not in params:
                    raise plan_error(PLAN_UNKNOWN, f"function `{r.name}` has no parameter `{n}`", where,
                                     "its parameters: " + ", ".join(f"`{p}`" for p in params))
            for n, d in r.shard:
                mine = source_shards.get((r.name, n))
                if mine is not None and mine != d:
                    raise _conflict(n, mine, d, where)


def _conflict(name: str, mine: int | None, theirs: int | None, where: str) -> CompileError:
    second = theirs if theirs is not None else "none (the plan replicates it)"
    return _error(SHARD_CONFLICT.code, SHARD_CONFLICT.fmt(name=name, first=mine, second=second), where,
                  f"the program's `with shard({name}, dim={mine})` and the plan disagree: keep one")


def _check_pipeline(plan: ShardingPlan, typed, num_gpu: int) -> None:
    """A pipeline plan places regions on stages of GPUs and splits nothing but the batch (over
    microbatches, and over a stage's GPUs)."""
    where = f"{plan.name}"
    mixed = [r.name for r in plan.regions if r.strategy not in ("pipeline", "replicated")]
    split = [name for name, dim in plan.values if dim is not None]
    source = [s.name for s in typed.shards if not s.region and s.dim is not None]
    if mixed or split or source:
        what = (f"region `{mixed[0]}` is {plan.region(mixed[0]).strategy!r}" if mixed else
                f"`[values]` splits `{split[0]}`" if split else f"the program shards `{source[0]}`")
        raise plan_error(PLAN_PIPELINE, f"pipeline stages with data or tensor parallelism: {what}", where,
                         "a pipeline plan places whole regions on stages; a stage of several GPUs splits the "
                         "`[pipeline] split` batch over them, and nothing else is split inside a stage yet")
    groups, _ = plan.stages(num_gpu)
    replicas = len(groups[0])
    at = f"{plan.name}: [pipeline]"
    if replicas > 1 and not plan.micro_split:
        raise plan_error(PLAN_BAD, f"each of the {len(groups)} stages runs on {replicas} GPUs, which split the batch, "
                         "and `[pipeline] split` names no input", at,
                         "say which inputs hold the batch, and along which dim: `split = { X = 0, Y = 0 }`")
    pieces = plan.microbatches * replicas
    what = " x ".join(x for x in (f"{plan.microbatches} microbatches" if plan.microbatches > 1 else "",
                                  f"{replicas} GPUs per stage" if replicas > 1 else "") if x)
    for name, dim in plan.micro_split:
        at = f"{plan.name}: [pipeline] split.{name}"
        ty = typed.externals.get(name)
        if ty is None:
            raise plan_error(PLAN_UNKNOWN, f"the plan splits `{name}` into microbatches, which is not an input of "
                             "the program", at, "inputs: " + (", ".join(f"`{n}`" for n in sorted(typed.externals))
                                                          or "none"))
        shape = getattr(ty, "shape", ())
        if dim >= len(shape):
            raise plan_error(PLAN_BAD, f"`{name}` has {len(shape)} dimensions; the plan splits dimension {dim}", at)
        if isinstance(shape[dim], int) and shape[dim] % pieces:
            raise plan_error(PLAN_BAD, f"dimension {dim} of `{name}` has size {shape[dim]}, which {what}"
                             + (f" ({pieces} pieces)" if replicas > 1 else "") + " do not divide", at,
                             "choose a number of microbatches that divides the batch" if replicas == 1 else
                             "choose microbatches and GPUs per stage whose product divides the batch")
