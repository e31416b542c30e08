"""`xgrun`: run a built engine. Thin: inputs in, the library runs, a summary out.

    xgrun ENGINE [--inputs FILE] [--output FILE] [--device cpu|cuda] [--check|--no-check]
                 [--seed N] [--dim NAME=SIZE ...] [--json]
                 [--warmup N] [--iterations N] [--profile] [--trace FILE.json]
                 [--nproc N] [--timeout S] [--output-per-rank] [--allow-fallback]
                 [--trusted-keys DIR] [--expect-digest HEX] [--steps N]

`--runtime native` runs the engine on the deploy runtime, which imports neither torch nor Triton
(cuda-python and numpy; inputs and outputs .npz or .safetensors; random inputs from numpy's
generator); `--runtime torch` on the torch-backed one (CUDA graphs, PyTorch fallbacks, several
ranks, the CPU reference); `auto` (default) takes torch where it is installed, else native.
`--dry-run` loads and verifies the engine and checks the inputs against its signature, without a
device. `--warmup N` runs N times first, untimed; `--iterations N` times N runs (min, mean, p50, p95, p99,
max). `--profile` times every kernel of those runs on its own (CUDA events; on the CPU each node):
a row per kernel with its launches, p50/p95/p99, share of the run, bytes, FLOPs and share of the
target's roofline, named by the source lines it stores, and the host's share of the run;
`--trace FILE.json` writes those runs in Chrome's trace format (chrome://tracing, Perfetto).
Profiled runs launch kernel by kernel (no CUDA graph). Without `--inputs`, every external gets
seeded random values; symbolic dims take `--dim` sizes
(default 16). `--nproc N` runs the engine's sharding plan on N ranks of this host (gloo on CPU,
NCCL with `--device cuda`); under torchrun or SLURM (RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT
set) each process is one rank of a run that may span hosts. Outputs are gathered to rank 0, which
prints and writes them. Exit codes: 0 ok, 1 a bad engine, bad inputs, a failed check or a failed
rank, 2 usage.

`--steps N` runs a training engine (one whose program declares `extern state` inputs) N times,
each step's state outputs fed back as the next step's inputs on the device and its counters
advanced by 1; the other inputs are the same every step. A row per step (the loss); `--output`
writes the next step's inputs (xgrun_steps.py).

                 [--nproc N] [--timeout S] [--output-per-rank]
                 [--trusted-keys DIR] [--expect-digest HEX]

An engine built with `fallback="eager"` calls PyTorch operators between its kernels; from a file,
it runs only with `--allow-fallback` or a trusted signature (the calls are checked against XG's allow-list either way).
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import List, Optional

import typer

from ..errors import XGError
from ..packager.archive import atomic_write
from ..runtime.host_io import TensorIOError
from ..runtime.profile import Profiler, percentile, render
from ..settings import RunSettings, SettingsError, child_env, dist_env
from .common import EXIT_USAGE, emit_json, fail, make_app, parse_dims, run
from .version import version_option

app = make_app("Run an XG engine (.xge) with correctness checks.")
DEFAULT_DIM = 16


_dims = parse_dims


@app.command()
def main_cmd(
    engine: Path = typer.Argument(..., metavar="ENGINE", help="the .xge engine file", show_default=False),
    inputs: Optional[Path] = typer.Option(None, "--inputs", help=".npz, .safetensors or .pt with one tensor per input"),
    output: Optional[Path] = typer.Option(None, "--output", help="write the outputs to .npz, .safetensors or .pt"),
    device: str = typer.Option("cpu", "--device", help="cpu or cuda"),
    check: bool = typer.Option(True, "--check/--no-check", help="guard every output against NaN/Inf"),
    seed: int = typer.Option(0, "--seed", help="seed for random inputs (without --inputs)"),
    dim: List[str] = typer.Option([], "--dim", help="NAME=SIZE for symbolic dims of random inputs"),
    json_out: bool = typer.Option(False, "--json", help="print the summary as JSON"),
    nproc: int = typer.Option(1, "--nproc", min=1, help="ranks to start on this host (the engine's NUM_GPU)"),
    timeout: float = typer.Option(300.0, "--timeout", min=1.0, help="seconds a rank may wait on a peer, "
                                  "or go silent, before the whole run fails"),
    output_per_rank: bool = typer.Option(False, "--output-per-rank", help="with --output F.ext: each rank "
                                         "writes its own pieces of the outputs to F.rankK.ext"),
    trusted_keys: Optional[Path] = typer.Option(None, "--trusted-keys", metavar="DIR", help="run only engines "
                                                "signed by one of these .pub keys (default: XG_TRUSTED_KEYS)"),
    expect_digest: Optional[str] = typer.Option(None, "--expect-digest", metavar="HEX", help="run only the "
                                                "engine of this bundle digest"),
    allow_fallback: bool = typer.Option(False, "--allow-fallback", help="run an engine that calls PyTorch "
                                        "operators (built with fallback='eager'); only for engines you trust"),
    warmup: int = typer.Option(0, "--warmup", min=0, help="untimed runs first"),
    iterations: int = typer.Option(1, "--iterations", min=1, help="timed runs (their min, mean, p50, p95, p99, max)"),
    profile: bool = typer.Option(False, "--profile", help="time every kernel of the timed runs (CUDA events; "
                                 "on the CPU every node) and print a row per kernel"),
    trace: Optional[Path] = typer.Option(None, "--trace", metavar="FILE.json", help="write the timed runs as a "
                                         "Chrome trace (chrome://tracing, Perfetto)"),
    runtime: str = typer.Option("auto", "--runtime", help="auto, torch or native (the deploy runtime: no torch, "
                                "cuda only)"),
    dry_run: bool = typer.Option(False, "--dry-run", help="load and verify the engine and check the inputs; "
                                 "run nothing"),
    steps: Optional[int] = typer.Option(None, "--steps", metavar="N", help="run a training engine N steps, each "
                                        "step's state outputs fed back as the next step's inputs on the device; a row "
                                        "per step (the loss)", show_default=False),
    version: bool = version_option("xgrun"),
) -> None:
    """Run ENGINE and print each output's shape, dtype and checksum."""
    if device not in ("cpu", "cuda"):
        fail(f"--device takes cpu or cuda, got {device!r}", EXIT_USAGE)
    if runtime not in ("auto", "torch", "native"):
        fail(f"--runtime takes auto, torch or native, got {runtime!r}", EXIT_USAGE)
    if runtime == "auto":
        runtime = "torch" if _torch_installed() else "native"
    if steps is not None:
        _steps_usage(steps, runtime, nproc, output_per_rank, warmup, iterations, profile, trace)
    if output is not None and not output_per_rank:
        # Refused before anything runs: a run must not end in an output it cannot write.
        from ..runtime.host_io import check_output, suffix_of
        try:
            suffix = suffix_of(output, "output file")
            check_output(output, f"output file {output}")
        except TensorIOError as exc:
            fail(str(exc))
        if runtime == "native" and suffix in (".pt", ".pth"):
            fail(f"output file {output}: the deploy runtime writes .npz or .safetensors (a .pt file needs torch)")
    if runtime == "native":
        if device != "cuda" and not dry_run:
            fail("the deploy runtime (--runtime native) runs on cuda; --device cpu is the torch-backed "
                 "CPU reference (install torch, or pass --device cuda)", EXIT_USAGE)
        if nproc > 1 or output_per_rank:
            fail("several ranks (--nproc, --output-per-rank) run on the torch-backed runtime (--runtime torch)",
                 EXIT_USAGE)
        if trace is not None and (trace.is_dir() or not trace.parent.is_dir()):
            fail(f"--trace {trace}: not a file in an existing directory", EXIT_USAGE)
        run_settings = RunSettings.from_env()
        if trusted_keys is not None:
            run_settings = replace(run_settings, trusted_keys=trusted_keys)
        if expect_digest is not None:
            from ..packager.signing import normal_digest
            if normal_digest(expect_digest) is None:
                fail(f"--expect-digest takes a bundle digest (64 hex digits), got {expect_digest!r}", EXIT_USAGE)
        _run_native(engine, inputs, output, check, seed, dim, json_out, run_settings, expect_digest, warmup,
                    iterations, profile, trace, dry_run)
        return
    from ..runtime.engine import Engine
    from ..runtime.tensor_io import describe, save_tensors
    if expect_digest is not None:
        from ..packager.signing import normal_digest
        if normal_digest(expect_digest) is None:
            fail(f"--expect-digest takes a bundle digest (64 hex digits), got {expect_digest!r}", EXIT_USAGE)
    run_settings = RunSettings.from_env()
    if trusted_keys is not None:
        run_settings = replace(run_settings, trusted_keys=trusted_keys)
    if trace is not None and (trace.is_dir() or not trace.parent.is_dir()):
        fail(f"--trace {trace}: not a file in an existing directory", EXIT_USAGE)
    if output_per_rank and output is None:
        fail("--output-per-rank needs --output FILE (each rank writes FILE with .rankK before the suffix)", EXIT_USAGE)
    try:
        denv = dist_env()
    except SettingsError as exc:
        fail(str(exc), EXIT_USAGE)
    if (profile or trace is not None or warmup or iterations > 1) and (nproc > 1 or (denv and denv.world_size > 1)):
        fail("--warmup, --iterations, --profile and --trace time one process's runs; a run of several "
             "ranks (--nproc, torchrun, SLURM) is not profiled: profile the engine on one GPU", EXIT_USAGE)
    if nproc > 1:
        if denv is not None:
            fail(f"--nproc starts ranks itself, but this process is already rank {denv.rank} of "
                 f"{denv.world_size} (RANK/WORLD_SIZE are set): drop --nproc under torchrun or srun", EXIT_USAGE)
        from ..runtime.launch import launch
        try:       # refuse a rank count the plan was not made for (and an untrusted engine) before any rank
            checked = Engine.load(engine, run_settings, expect_digest=expect_digest, allow_fallback=allow_fallback)
        except XGError as exc:
            fail(str(exc))
        planned = checked.manifest["num_gpu"]
        if planned != nproc:
            fail(f"engine {engine} is planned for NUM_GPU = {planned}, not {nproc} ranks: rebuild it with "
                 f"`xgc --num-gpu {nproc}` or run --nproc {planned}", EXIT_USAGE)
        child = [sys.executable, "-m", "xgbuild.cli.xgrun_rank", str(engine), "--device", device,
                 "--check" if check else "--no-check", "--seed", str(seed), "--timeout", str(timeout),
                 *(["--inputs", str(inputs)] if inputs else []), *(["--output", str(output)] if output else []),
                 *[a for d in dim for a in ("--dim", d)], *(["--json"] if json_out else []),
                 *(["--output-per-rank"] if output_per_rank else []),
                 # The ranks load the file again: pin the digest checked here, trusted or not.
                 "--expect-digest", checked.digest,
                 *(["--allow-fallback"] if allow_fallback or checked.trust is not None else [])]
        result = launch(child, nproc, timeout, child_env())
        if not result.ok:
            fail(result.message)
        return
    if denv is not None and denv.world_size > 1:
        if steps is not None:
            fail("--steps runs one process's engine; under torchrun or SLURM run it on one rank", EXIT_USAGE)
        _run_rank(engine, denv, inputs, output, device, check, seed, dim, json_out, timeout, output_per_rank,
                  run_settings, expect_digest, allow_fallback)
        return
    t_load = time.perf_counter()
    try:
        eng = Engine.load(engine, run_settings, expect_digest=expect_digest, allow_fallback=allow_fallback)
        load_ms = (time.perf_counter() - t_load) * 1e3
        values = _inputs_for(eng, inputs, seed, dim)
        if steps is not None and not dry_run:
            from .xgrun_steps import run_steps_cmd
            run_steps_cmd(engine, eng, values, steps, device, check, output, json_out, load_ms)
            return
        if dry_run:
            if steps is not None:
                from ..runtime.steps import feedback_of
                feedback_of(eng.manifest, f"engine {engine}")
            eng.prepare_inputs(values, "cpu")
            eng.specialised(eng.prepare_inputs(values, "cpu"))
            _report_dry(engine, eng.digest, eng.manifest, load_ms, values, describe, json_out)
            return
        if device == "cuda":
            eng.cuda_executor(check=check)       # a clear refusal before any tensor moves
            values = {k: v.to("cuda") for k, v in values.items()}
        for _ in range(warmup):
            eng.run(values, device=device, check=check, wait=True)
        profiler = Profiler(device) if profile or trace is not None else None
        walls = []
        for _ in range(iterations):
            result = eng.run(values, device=device, check=check, wait=True, profiler=profiler)
            walls.append(result.metadata["timings"]["total_ms"])
    except (XGError, TensorIOError) as exc:
        fail(str(exc))
    extra: dict = {}
    if iterations > 1:
        extra["runs_ms"] = run_stats(walls)
    if profiler is not None:
        peaks, bandwidth = _roofline(eng.manifest["target"]) if device == "cuda" else (None, None)
        extra["profile"] = profiler.summary(peaks, bandwidth)
        if trace is not None:
            try:
                atomic_write(trace, json.dumps(profiler.chrome_trace()).encode())
            except OSError as exc:
                fail(f"cannot write the trace {trace}: {exc}")
    outputs = {name: t.cpu() for name, t in result.tensors.items()}     # files and checksums from host memory
    if output is not None:
        if output_per_rank:         # one process is rank 0 of 1: the same file name as in a run of N
            output = output.with_name(f"{output.stem}.rank0{output.suffix}")
        try:
            save_tensors(output, outputs)
        except TensorIOError as exc:
            fail(str(exc))
    _report(engine, eng, device, check, load_ms, result, outputs, json_out, extra, iterations=iterations)
    if "profile" in extra and not json_out:
        sys.stdout.write(render(extra["profile"]) + "\n")
    if trace is not None and not json_out:
        sys.stdout.write(f"trace: {trace}\n")


def _steps_usage(steps: int, runtime: str, nproc: int, output_per_rank: bool, warmup: int, iterations: int,
                 profile: bool, trace) -> None:
    """Refuse, as usage errors, a --steps value or the options --steps does not run with."""
    if steps < 1:
        fail(f"--steps takes a positive number of steps, got {steps}", EXIT_USAGE)
    if runtime == "native":
        fail("--steps runs on the torch-backed runtime (--runtime torch)", EXIT_USAGE)
    if nproc > 1 or output_per_rank:
        fail("--steps runs one process's engine, not several ranks (--nproc, --output-per-rank)", EXIT_USAGE)
    if warmup or iterations > 1 or profile or trace is not None:
        fail("--steps reports each step's outputs; it does not time runs (--warmup, --iterations, --profile, "
             "--trace): time one step without --steps", EXIT_USAGE)


def run_stats(walls: list[float]) -> dict:
    """min, mean, p50, p95, p99 and max of the timed runs' wall times (ms)."""
    ordered = sorted(walls)
    return {"min": ordered[0], "mean": sum(ordered) / len(ordered),
            **{f"p{q}": percentile(ordered, q) for q in (50, 95, 99)}, "max": ordered[-1]}


def _roofline(target: str):
    """(FLOP/s by dtype, bytes/s) of the engine's target for the profile's roofline column; (None,
    None) when its profile cannot be read here."""
    from ..compiler.codegen.templates.roofline import matmul_peak, scalar_peak, tensor_cores
    from ..hw import load_profile
    from ..settings import Settings
    try:
        hw = load_profile(target, Settings.from_env().hw_dir)
    except Exception:  # noqa: BLE001 (the column is left empty: the profile is still useful)
        return None, None

    def peaks(dtype):
        return matmul_peak(dtype, hw) if dtype and tensor_cores(dtype) else scalar_peak("float32", hw)
    return peaks, hw.hbm_bandwidth_bytes_per_s


def _report(engine, eng, device: str, check: bool, load_ms: float, result, outputs: dict, json_out: bool,
            extra: dict | None = None, ranks: str = "", tail: str = "", iterations: int = 1) -> None:
    """The run's summary: one JSON object, or a line per output between a header and timings."""
    from ..runtime.tensor_io import describe
    _summary_out(engine, eng.digest, eng.manifest["target"], device, check, load_ms,
                 result.metadata["timings"]["total_ms"], {name: describe(v) for name, v in outputs.items()},
                 result.metadata["specialization"], json_out, extra, iterations, ranks=ranks, tail=tail)


def _summary_out(engine, digest: str, target: str, device: str, check: bool, load_ms: float, run_ms: float,
                 described: dict, specialization: dict, json_out: bool, extra: dict | None = None,
                 iterations: int = 1, ranks: str = "", tail: str = "") -> None:
    if not tail and extra and "runs_ms" in extra:
        r = extra["runs_ms"]
        tail = (f" (last of {iterations}; min {r['min']:.3f}, mean {r['mean']:.3f}, p50 {r['p50']:.3f}, "
                f"p95 {r['p95']:.3f}, p99 {r['p99']:.3f}, max {r['max']:.3f} ms)")
    summary = {
        "engine": str(engine), "digest": digest, "target": target, "device": device,
        "check": check, "load_ms": load_ms, "run_ms": run_ms, **(extra or {}),
        "outputs": described, "specialization": specialization,
    }
    if json_out:
        emit_json(summary)
        return
    out = sys.stdout
    out.write(f"engine {engine} ({digest[:12]}), target {summary['target']}, device {device}, "
              f"{ranks}check {'on' if check else 'off'}\n")
    _tensor_lines(out, summary["outputs"])
    out.write(f"load {load_ms:.1f} ms, run {summary['run_ms']:.1f} ms{tail}\n")


def _run_rank(engine, denv, inputs, output, device, check, seed, dim, json_out, timeout, per_rank,
              run_settings, expect_digest, allow_fallback: bool) -> None:
    """One rank of a distributed run: its shards in, whole outputs to rank 0 (which reports)."""
    from ..runtime.distributed import check_world, init_group, leave_group, rank_slices, run_spmd
    from ..runtime.engine import Engine
    from ..runtime.tensor_io import save_tensors
    t_load = time.perf_counter()
    try:
        eng = Engine.load(engine, run_settings, expect_digest=expect_digest, allow_fallback=allow_fallback)
        load_ms = (time.perf_counter() - t_load) * 1e3
        check_world(eng, denv.world_size)        # before joining: a wrong count would wait for peers
        whole = None
        if inputs is not None:      # each rank reads only its slices of the split inputs
            from ..runtime.tensor_io import load_tensor_shards
            split, piece, pieces, only = rank_slices(eng.graph, denv.rank, denv.world_size)
            values, whole = load_tensor_shards(inputs, split, piece, pieces, only=only)
        else:
            values = _inputs_for(eng, None, seed, dim)
        group = init_group(denv, device, timeout)
        try:
            result, local = run_spmd(eng, values, group, check=check, whole_shapes=whole)
        finally:
            leave_group()
    except (XGError, TensorIOError) as exc:
        fail(f"rank {denv.rank}: {exc}")
    try:
        if per_rank:
            save_tensors(output.with_name(f"{output.stem}.rank{denv.rank}{output.suffix}"),
                         {k: v.cpu() for k, v in local.items()})
        if denv.rank != 0:
            return
        outputs = {name: t.cpu() for name, t in result.tensors.items()}
        if output is not None and not per_rank:
            save_tensors(output, outputs)
    except TensorIOError as exc:
        fail(str(exc))
    comm = result.metadata["timings"]["comm"]
    extra = {"world_size": denv.world_size, "executor": result.metadata["executor"], "comm": comm,
             "split_inputs": result.metadata["split_inputs"],
             "loaded_as_slices": result.metadata["loaded_as_slices"]}
    _report(engine, eng, device, check, load_ms, result, outputs, json_out, extra,
            ranks=f"{denv.world_size} ranks, ",
            tail=f" (rank 0: {comm['collectives']} collectives, {comm['wait_ms']:.1f} ms waiting on them)")


def _inputs_for(eng, inputs, seed: int, dim: list[str], native: bool = False) -> dict:
    """The run's inputs: from the file (headers checked against the signature before data is
    read), or seeded random ones (torch's generator; numpy's on the deploy runtime)."""
    expected = {s["name"]: (s["dtype"], tuple(s["shape"])) for s in eng.signature}
    if inputs is not None:
        if native:
            from ..runtime.host_io import load_host_tensors
            return load_host_tensors(inputs, expected=expected)
        from ..runtime.tensor_io import load_tensors
        return load_tensors(inputs, expected=expected)
    sizes = _dims(dim)
    sig = {}
    for spec in eng.signature:
        shape = tuple(d if isinstance(d, int) else sizes.get(d, DEFAULT_DIM) for d in spec["shape"])
        sig[spec["name"]] = (spec["dtype"], shape)
    # Integer inputs used as indices (imported models) are drawn inside their declared range.
    ranges = {s["name"]: tuple(s["range"]) for s in eng.signature if "range" in s}
    if native:
        from ..runtime.host_io import random_host_inputs
        return random_host_inputs(sig, seed, ranges)
    from ..runtime.tensor_io import random_inputs
    return random_inputs(sig, seed, ranges)


def _torch_installed() -> bool:
    import importlib.util
    try:
        return importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):
        return False


def _run_native(engine: Path, inputs, output, check: bool, seed: int, dim: list[str], json_out: bool,
                run_settings: RunSettings, expect_digest, warmup: int, iterations: int, profile: bool, trace,
                dry_run: bool) -> None:
    """xgrun on the deploy runtime (`runtime/native.py`): no torch, no Triton."""
    t = time.perf_counter()
    from ..runtime.device import CudaDevice
    if not dry_run:
        CudaDevice.start(0)         # the driver and the context start while the engine and inputs are read
    from ..runtime.host_io import describe_host, save_host_tensors
    from ..runtime.native import NativeEngine
    phases: dict[str, float] = {"imports": (time.perf_counter() - t) * 1e3}
    t = time.perf_counter()

    def phase(name: str) -> None:
        nonlocal t
        now = time.perf_counter()
        phases[name] = (now - t) * 1e3
        t = now
    try:
        eng = NativeEngine.load(engine, run_settings, expect_digest=expect_digest)
        phase("load")
        load_ms = phases["load"]
        values = _inputs_for(eng, inputs, seed, dim, native=True)
        eng.check_inputs(values)
        phase("inputs")
        if dry_run:
            _report_dry(engine, eng.digest, eng.manifest, load_ms, values, describe_host, json_out)
            return
        eng.executor().load_all()               # a clear refusal (no GPU, another arch) before memory moves
        phase("device")
        for _ in range(warmup):
            eng.run(values, check=check)
        profiler = eng.profiler() if profile or trace is not None else None
        walls = []
        for _ in range(iterations):
            result = eng.run(values, check=check, profiler=profiler)
            walls.append(result.run_ms)
        phase("runs")
        outputs = result.to_host()
        phase("to_host")
    except (XGError, TensorIOError) as exc:
        fail(str(exc))
    extra: dict = {"runtime": "native", "phases_ms": phases}
    if iterations > 1:
        extra["runs_ms"] = run_stats(walls)
    if profiler is not None:
        peaks, bandwidth = _roofline(eng.manifest["target"])
        extra["profile"] = profiler.summary(peaks, bandwidth)
        if trace is not None:
            try:
                atomic_write(trace, json.dumps(profiler.chrome_trace()).encode())
            except OSError as exc:
                fail(f"cannot write the trace {trace}: {exc}")
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(1) as pool:         # the checksums (hashlib) while the file is written (I/O)
        sums = pool.submit(lambda: {name: describe_host(v) for name, v in outputs.items()})
        if output is not None:
            try:
                save_host_tensors(output, outputs)
            except TensorIOError as exc:
                fail(str(exc))
        described = sums.result()
    phase("write+checksums")
    _summary_out(engine, eng.digest, eng.manifest["target"], "cuda", check, load_ms, result.run_ms, described,
                 result.specialization, json_out, extra, iterations)
    if "profile" in extra and not json_out:
        sys.stdout.write(render(extra["profile"]) + "\n")
    if trace is not None and not json_out:
        sys.stdout.write(f"trace: {trace}\n")


def _report_dry(engine, digest: str, manifest: dict, load_ms: float, values: dict, describe, json_out: bool) -> None:
    """--dry-run: the engine verified and the inputs checked against its signature; nothing ran."""
    summary = {"engine": str(engine), "digest": digest, "target": manifest["target"], "dry_run": True,
               "load_ms": load_ms, "kernels": len(manifest.get("kernels", [])),
               "inputs": {name: describe(v) for name, v in values.items()}}
    if json_out:
        emit_json(summary)
        return
    out = sys.stdout
    out.write(f"engine {engine} ({digest[:12]}), target {summary['target']}, {summary['kernels']} kernels: "
              f"verified, inputs match its signature (dry run: nothing ran)\n")
    _tensor_lines(out, summary["inputs"])
    out.write(f"load {load_ms:.1f} ms\n")


def _tensor_lines(out, described: dict) -> None:
    """A line per tensor: name, dtype, shape, checksum."""
    for name, d in described.items():
        out.write(f"  {name:<12} {d['dtype']:<9} {str(d['shape']):<16} checksum {d['checksum']}\n")


def main() -> None:
    if _native_on_gpu(sys.argv[1:]):
        # Start the GPU (the driver, its context: a few hundred ms) while the rest of XG imports and
        # the engine and inputs are read.
        from ..runtime.device import CudaDevice
        CudaDevice.start(0)
    run(app, "xgrun")


def _native_on_gpu(argv: list[str]) -> bool:
    """Will this command line run the deploy runtime on a GPU (a guess before parsing it: a wrong
    one costs a context started early, or nothing)?"""
    if "--dry-run" in argv or "--help" in argv or any(a.startswith("--nproc") for a in argv):
        return False
    if "cuda" not in argv and "--device=cuda" not in argv:
        return False
    runtime = "auto"
    for i, a in enumerate(argv):
        if a == "--runtime" and i + 1 < len(argv):
            runtime = argv[i + 1]
        elif a.startswith("--runtime="):
            runtime = a.split("=", 1)[1]
    return runtime == "native" or (runtime == "auto" and not _torch_installed())


if __name__ == "__main__":
    main()
