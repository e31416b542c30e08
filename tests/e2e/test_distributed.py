"""Distributed runs on gloo ranks of this host (`xgrun --nproc N`), against float64 references.

One engine holds row-, column- and contracting-sharded matmuls, a tensor-parallel and a
data-parallel MLP, a reshard (all-to-all) and a reduce-scatter, so each rank count costs one
launch (ranks import torch: seconds each). Failures: a killed rank and a stopped (hung) rank end
the run on every rank, with a message naming the rank, and leave no process behind.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import REPO_ROOT, Rand, assert_close, command, gelu, src_text

from xgbuild.runtime.engine import Engine
from xgbuild.runtime.launch import free_port
from xgbuild.runtime.tensor_io import load_tensors, save_tensors

SHARDED = src_text("""
    extern Tensor[float32, 8, 16] A
    extern Tensor[float32, 16, 8] B
    extern Tensor[float32, 8, 16] X
    extern Tensor[float32, 16, 32] W1
    extern Tensor[float32, 32, 16] W2

    def rows(Tensor[float32, M, K] a, Tensor[float32, K, N] b) -> Tensor[float32, M, N] {
        with shard(a, dim=0):
            c = a @ b
        return c
    }
    def cols(Tensor[float32, M, K] a, Tensor[float32, K, N] b) -> Tensor[float32, M, N] {
        with shard(b, dim=1):
            c = a @ b
        return c
    }
    def contract(Tensor[float32, M, K] a, Tensor[float32, K, N] b) -> Tensor[float32, M, N] {
        with shard(a, dim=1), shard(b, dim=0):
            c = a @ b
        return c
    }
    def tensor_mlp(Tensor[float32, T, D] x, Tensor[float32, D, F] w1, Tensor[float32, F, D] w2) -> Tensor[float32, T, D] {
        with shard(w1, dim=1), shard(w2, dim=0):
            y = gelu(x @ w1) @ w2
        return y
    }
    def data_mlp(Tensor[float32, T, D] x, Tensor[float32, D, F] w1, Tensor[float32, F, D] w2) -> Tensor[float32, T, D] {
        with shard(x, dim=0):
            y = gelu(x @ w1) @ w2
        return y
    }
    def main() {
        c = contract(A, B)
        with shard(c, dim=0):
            r = relu(c)
        with shard(r, dim=1):
            t = r * 2.0
        y = data_mlp(X, W1, W2)
        return (rows(A, B), cols(A, B), c, tensor_mlp(X, W1, W2), y, t, mean(y * y))
    }
""")


def references(v: dict[str, np.ndarray]) -> list[np.ndarray]:
    a, b, x, w1, w2 = (v[k] for k in ("A", "B", "X", "W1", "W2"))
    c = a @ b
    y = gelu(x @ w1) @ w2
    return [c, c, c, y, y, np.maximum(c, 0) * 2.0, np.array((y * y).mean())]


def run_ranks(engine: Path, nproc: int, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([*command("xgrun"), str(engine), "--nproc", str(nproc), *args],
                          capture_output=True, text=True, timeout=timeout)


def build(tmp_path: Path, text: str, num_gpu: int, *extra: str) -> Path:
    src = tmp_path / "prog.xg"
    src.write_text(text)
    out = tmp_path / f"prog{num_gpu}.xge"
    done = subprocess.run([*command("xgc"), str(src), "--no-kernels", "--num-gpu", str(num_gpu), "--out", str(out),
                           *extra], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return out


@pytest.mark.parametrize("nproc", [2, 4])
def test_sharded_programs_match_float64_on_gloo_ranks(tmp_path: Path, rand: Rand, nproc: int) -> None:
    engine = build(tmp_path, SHARDED, nproc)
    shapes = {"A": (8, 16), "B": (16, 8), "X": (8, 16), "W1": (16, 32), "W2": (32, 16)}
    values = {k: rand.tensor(s) for k, s in shapes.items()}
    save_tensors(tmp_path / "in.npz", {k: t for k, (t, _) in values.items()})
    out = tmp_path / "out.npz"
    done = run_ranks(engine, nproc, "--inputs", str(tmp_path / "in.npz"), "--output", str(out), "--json")
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["world_size"] == nproc and summary["comm"]["collectives"] > 0
    got = load_tensors(out)
    for k, ref in enumerate(references({k: v for k, (_, v) in values.items()})):
        assert_close(got[f"out_{k}"], ref, 1e-5, rand, what=f"output {k} on {nproc} ranks")


@pytest.mark.slow
def test_each_rank_runs_the_engines_own_kernels(tmp_path: Path, rand: Rand) -> None:
    """An engine with kernels (cross-compiled for H100): each rank runs them on its local shapes,
    collectives between kernels, under Triton's interpreter here (on GPUs: the cubins, with NCCL)."""
    src = tmp_path / "prog.xg"
    src.write_text(SHARDED)
    engine = tmp_path / "prog_kernels.xge"
    done = subprocess.run([*command("xgc"), str(src), "--target", "H100", "--tune", "predict", "--num-gpu", "2",
                           "--out", str(engine), "--quiet"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    shapes = {"A": (8, 16), "B": (16, 8), "X": (8, 16), "W1": (16, 32), "W2": (32, 16)}
    values = {k: rand.tensor(s) for k, s in shapes.items()}
    save_tensors(tmp_path / "in.npz", {k: t for k, (t, _) in values.items()})
    out = tmp_path / "out.npz"
    done = subprocess.run([*command("xgrun"), str(engine), "--nproc", "2", "--inputs", str(tmp_path / "in.npz"),
                           "--output", str(out), "--json"], capture_output=True, text=True, timeout=400,
                          env={**os.environ, "XG_SPMD_KERNELS": "interpret"})
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["executor"] == "spmd-kernels-interpret" and summary["comm"]["collectives"] > 0
    got = load_tensors(out)
    for k, ref in enumerate(references({k: v for k, (_, v) in values.items()})):
        assert_close(got[f"out_{k}"], ref, 1e-5, rand, what=f"output {k} from the kernels on 2 ranks")
    bad = subprocess.run([*command("xgrun"), str(engine), "--nproc", "2", "--seed", "1"], capture_output=True,
                         text=True, timeout=200, env={**os.environ, "XG_SPMD_KERNELS": "fast"})
    assert bad.returncode != 0 and "XG_SPMD_KERNELS is 'fast'" in bad.stderr and "Traceback" not in bad.stderr


BLOCKED = src_text("""
    extern Tensor[float32, 320, 32] A
    extern Tensor[float32, 32, 16] B
    extern Tensor[float32, 320, 16] C
    extern Tensor[float32, 320, 16] X
    extern Tensor[float32, 16, 64] W1
    extern Tensor[float32, 64, 16] W2
    extern Tensor[float32, 32, 320] Z
    extern Tensor[float32, 320, 32] G1
    extern Tensor[float32, 320, 320] W3
    def main() {
        with shard(A, dim=1), shard(B, dim=0):
            p = (A @ B) * C
        with shard(W1, dim=1), shard(W2, dim=0):
            y = gelu(X @ W1) @ W2
        with shard(Z, dim=0), shard(B, dim=0):
            q = transpose(Z) @ B
        with shard(q, dim=0):
            r = relu(q)
        with shard(G1, dim=1), shard(B, dim=0):
            g = G1 @ B
        h = W3 @ g + g
        return (p, y, q, r, relu(h))
    }
""")


@pytest.mark.slow
def test_all_reduced_matmuls_run_in_row_blocks(tmp_path: Path, rand: Rand) -> None:
    """XG_COMM_BLOCKS=3: a matmul whose partial sums are all-reduced (one with an epilogue that
    reads a whole operand) runs in blocks of rows, each block's all-reduce in place on its rows as
    soon as its kernel is launched (320 rows do not fall into equal blocks); one whose partial sums
    are reduce-scattered (a transposed operand; its product all-reduced too, so not in place) runs
    block by block of every rank's part, each block's reduce-scatter filling rows of this rank's
    part. A product whose B operand its epilogue reads too (`W3 @ g + g`: one pointer for both)
    runs whole. The result is the same as whole (XG_COMM_BLOCKS=1) and as the float64 reference;
    a bad value is refused."""
    src = tmp_path / "blocked.xg"
    src.write_text(BLOCKED)
    engine = tmp_path / "blocked.xge"
    done = subprocess.run([*command("xgc"), str(src), "--target", "H100", "--tune", "predict", "--num-gpu", "2",
                           "--out", str(engine), "--quiet"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    shapes = {"A": (320, 32), "B": (32, 16), "C": (320, 16), "X": (320, 16), "W1": (16, 64), "W2": (64, 16),
              "Z": (32, 320), "G1": (320, 32), "W3": (320, 320)}
    values = {k: rand.tensor(s) for k, s in shapes.items()}
    save_tensors(tmp_path / "in.npz", {k: t for k, (t, _) in values.items()})
    v = {k: w for k, (_, w) in values.items()}
    p = (v["A"] @ v["B"]) * v["C"]
    y = gelu(v["X"] @ v["W1"]) @ v["W2"]
    summaries = {}
    for blocks in ("1", "3"):
        out = tmp_path / f"out{blocks}.npz"
        done = subprocess.run([*command("xgrun"), str(engine), "--nproc", "2", "--inputs", str(tmp_path / "in.npz"),
                               "--output", str(out), "--json"], capture_output=True, text=True, timeout=400,
                              env={**os.environ, "XG_SPMD_KERNELS": "interpret", "XG_COMM_BLOCKS": blocks})
        assert done.returncode == 0, done.stderr
        summaries[blocks] = json.loads(done.stdout)["comm"]
        got = load_tensors(out)
        q = v["Z"].T @ v["B"]
        g = v["G1"] @ v["B"]
        for k, ref in enumerate((p, y, q, np.maximum(q, 0), np.maximum(v["W3"] @ g + g, 0))):
            assert_close(got[f"out_{k}"], ref, 1e-5, rand, what=f"output {k} with XG_COMM_BLOCKS={blocks}")
    assert summaries["1"]["split_collectives"] == 0
    assert summaries["3"]["split_collectives"] == 3      # 2 all-reduces, 1 reduce-scatter, 2 or 3 blocks each
    assert summaries["3"]["collectives"] >= summaries["1"]["collectives"] + 3
    for bad in ("0", "two", "65", "²"):
        done = subprocess.run([*command("xgrun"), str(engine), "--nproc", "2", "--seed", "1"], capture_output=True,
                              text=True, timeout=200, env={**os.environ, "XG_SPMD_KERNELS": "interpret",
                                                           "XG_COMM_BLOCKS": bad})
        assert done.returncode != 0 and f"XG_COMM_BLOCKS is {bad!r}" in done.stderr, done.stderr
        assert "Traceback" not in done.stderr


def test_outputs_per_rank_are_each_ranks_pieces(tmp_path: Path, rand: Rand) -> None:
    src = src_text("""
        extern Tensor[float32, 8, 6] A
        def main() {
            with shard(A, dim=0):
                b = A * 3.0
            return b
        }
    """)
    engine = build(tmp_path, src, 2)
    a, a64 = rand.tensor((8, 6))
    save_tensors(tmp_path / "in.safetensors", {"A": a})
    done = run_ranks(engine, 2, "--inputs", str(tmp_path / "in.safetensors"), "--output", str(tmp_path / "o.npz"),
                     "--output-per-rank", "--json")
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["split_inputs"] == {"A": 0} and summary["loaded_as_slices"] == ["A"]   # each rank reads its rows
    for r in range(2):
        piece = load_tensors(tmp_path / f"o.rank{r}.npz")["out"]
        assert_close(piece, a64[4 * r:4 * (r + 1)] * 3.0, 1e-6, rand, what=f"rank {r}'s rows")


def test_rank_count_must_match_the_plan(tmp_path: Path) -> None:
    engine = build(tmp_path, "extern Tensor[float32, 4] A\ndef main() {\n    return A + 1.0\n}\n", 4)
    done = run_ranks(engine, 2)       # refused before any rank starts
    assert done.returncode == 2 and "planned for NUM_GPU = 4" in done.stderr and "Traceback" not in done.stderr
    # ...and by a rank itself, under an outside launcher that started the wrong number.
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    done = subprocess.run([*command("xgrun"), str(engine), "--timeout", "20"], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 1 and "planned for NUM_GPU = 4" in done.stderr and "Traceback" not in done.stderr


# ------------------------------------------------------------------------------------- failures

def _ranks_of(parent: int, n: int, deadline: float) -> dict[int, int]:
    """RANK -> pid of `parent`'s children, once all n have started."""
    while time.monotonic() < deadline:
        found = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
                env = (entry / "environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) != parent:
                continue
            rank = next((int(e[5:]) for e in env if e.startswith(b"RANK=")), None)
            if rank is not None:
                found[rank] = int(entry.name)
        if len(found) == n:
            return found
        time.sleep(0.05)
    raise AssertionError("the ranks did not start")


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"


@pytest.mark.parametrize("sig,expect,plan", [(signal.SIGKILL, "rank 1 was killed by SIGKILL", None),
                                             (signal.SIGSTOP, "rank 1 stopped responding", None),
                                             (signal.SIGSTOP, "rank 1 stopped responding", "pipeline-dp")],
                         ids=["killed", "hung", "hung-in-a-stage-of-2-gpus"])
def test_a_dead_or_hung_rank_ends_the_run_naming_it(tmp_path: Path, sig: signal.Signals, expect: str,
                                                    plan: str | None) -> None:
    # pipeline-dp: 2 stages of 2 GPUs (a stage's process groups beside the default one); rank 1
    # stops, and every other rank ends too, whatever it was waiting for.
    if plan is None:
        engine, n = build(tmp_path, SHARDED, 2), 2
    else:
        (tmp_path / "p.toml").write_text((REPO_ROOT / "examples" / "pipeline.toml").read_text())
        engine, n = build(tmp_path, (REPO_ROOT / "examples" / "pipeline.xg").read_text(), 4, "--sharding",
                          str(tmp_path / "p.toml")), 4
    proc = subprocess.Popen([*command("xgrun"), str(engine), "--nproc", str(n), "--timeout", "6"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        ranks = _ranks_of(proc.pid, n, time.monotonic() + 30)
        time.sleep(0.3)
        os.kill(ranks[1], sig)
        t0 = time.monotonic()
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, err
    assert expect in err and "Traceback" not in err, err
    assert time.monotonic() - t0 < 30
    assert all(_gone(pid) for pid in ranks.values()), "a rank outlived the run"



def test_ranks_end_when_their_launcher_is_killed(tmp_path: Path) -> None:
    engine = build(tmp_path, SHARDED, 2)
    proc = subprocess.Popen([*command("xgrun"), str(engine), "--nproc", "2"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        ranks = _ranks_of(proc.pid, 2, time.monotonic() + 30)
    finally:
        proc.kill()
        proc.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not all(_gone(pid) for pid in ranks.values()):
        time.sleep(0.1)
    assert all(_gone(pid) for pid in ranks.values()), "a rank outlived its launcher"


# ------------------------------------------------------------------------------- training step

TRAIN_SHAPES = {"EMB": (16, 32), "G1": (32,), "WQ": (32, 32), "WK": (32, 32), "WV": (32, 32), "WO": (32, 32),
                "G2": (32,), "W1": (32, 64), "W2": (64, 32), "GF": (32,), "HEAD": (32, 16)}


def train_inputs(rand: Rand) -> dict:
    vals = {}
    for name, shape in TRAIN_SHAPES.items():
        w, _ = rand.tensor(shape, scale=0.1 if len(shape) == 1 else shape[0] ** -0.5, shift=1.0 if len(shape) == 1 else 0.0)
        m, _ = rand.tensor(shape, scale=0.01)
        v = rand.tensor(shape, scale=1e-3)[0].abs() + 1e-3       # a second moment: positive
        vals |= {name: w, f"M_{name}": m, f"V_{name}": v}
    tokens = rand.ints((33,), 0, 16)
    return vals | {"TOKENS": tokens[:-1].contiguous(), "TARGETS": tokens[1:].contiguous(),
                   "STEP": torch.tensor(3.0), "LR": torch.tensor(0.01)}


@pytest.mark.parametrize("nproc,plan", [(2, "train_tensor"), (4, "train_data"), (2, "train_pipeline"),
                                        (4, "train_pipeline4"), (2, "train_pipeline+mb4"),
                                        (4, "train_pipeline_dp"), (4, "train_pipeline+mb2")])
def test_training_step_matches_the_single_process_float64_step(tmp_path: Path, rand: Rand, nproc: int,
                                                               plan: str) -> None:
    # train_pipeline_dp: 2 stages of 2 GPUs each (data parallel inside a stage); +mbM: the 32
    # tokens in M microbatches per replica (the model has no batch dim).
    engine = tmp_path / "train.xge"
    plan_file = REPO_ROOT / "models" / "plans" / f"{plan.split('+')[0]}.toml"
    if "+mb" in plan:
        plan_file = tmp_path / "plan.toml"
        plan_file.write_text((REPO_ROOT / "models" / "plans" / "train_pipeline.toml").read_text()
                             + f'\n[pipeline]\nmicrobatches = {plan.split("+mb")[1]}\n'
                             'split = { TOKENS = 0, TARGETS = 0 }\n')
    done = subprocess.run([*command("xgc"), str(REPO_ROOT / "models" / "train_tiny.xg"), "--no-kernels", "--num-gpu",
                           str(nproc), "--sharding", str(plan_file), "--out", str(engine)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    values = train_inputs(rand)
    save_tensors(tmp_path / "in.safetensors", values)
    done = run_ranks(engine, nproc, "--inputs", str(tmp_path / "in.safetensors"), "--output", str(tmp_path / "o.npz"),
                     "--json")
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    pipeline = plan.startswith("train_pipeline")
    assert summary["executor"] == ("pipeline-cpu" if pipeline else "spmd-cpu")
    if pipeline:           # rank 0 receives gradients and the other stages' updated parameters
        assert summary["comm"]["collectives"] > 0 and summary["comm"]["sends"] > 0
    got = load_tensors(tmp_path / "o.npz")
    ref = Engine.load(engine).run(values, float64=True).tensors     # one process: collectives are identity
    assert set(got) == set(ref)
    for name, want in ref.items():
        assert_close(got[name], want.numpy(), 1e-4, rand, what=f"{name} after a step on {nproc} ranks ({plan})")


@pytest.mark.slow
def test_tensor_parallel_step_with_kernels_in_row_blocks(tmp_path: Path, rand: Rand) -> None:
    """The training step scaled up (T=256, D=64, F=256), tensor parallel on 2 ranks running the
    engine's kernels (Triton's interpreter): with XG_COMM_BLOCKS=4 its reduce-scattered products
    (transposed operands among them) run in row blocks, and the step equals the float64 one. (Two
    products were split before attention's gradient became flash kernels, which are not split.)"""
    text = (REPO_ROOT / "models" / "train_tiny.xg").read_text()
    for name, size in (("T", 256), ("D", 64), ("F", 256)):
        text = re.sub(rf"^{name} = \d+", f"{name} = {size}", text, flags=re.M)
    text = re.sub(r"^SCALE = .*$", f"SCALE = {64 ** -0.5!r}", text, flags=re.M)
    (tmp_path / "train.xg").write_text(text)
    engine = tmp_path / "train.xge"
    done = subprocess.run([*command("xgc"), str(tmp_path / "train.xg"), "--target", "H100", "--tune", "predict",
                           "--num-gpu", "2", "--sharding", str(REPO_ROOT / "models" / "plans" / "train_tensor.toml"),
                           "--out", str(engine), "--quiet"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    values = {}
    for spec in Engine.load(engine).signature:
        shape = tuple(spec["shape"])
        if spec["dtype"] == "int64":
            values[spec["name"]] = rand.ints(shape, 0, 16)
        elif spec["name"] in ("STEP", "LR"):
            values[spec["name"]] = torch.tensor(3.0 if spec["name"] == "STEP" else 0.01)
        else:
            t = rand.tensor(shape, scale=1e-3 if spec["name"].startswith("V_") else 0.1)[0]
            values[spec["name"]] = t.abs() + 1e-3 if spec["name"].startswith("V_") else t
    save_tensors(tmp_path / "in.safetensors", values)
    done = subprocess.run([*command("xgrun"), str(engine), "--nproc", "2", "--inputs", str(tmp_path / "in.safetensors"),
                           "--output", str(tmp_path / "o.npz"), "--json"], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "XG_SPMD_KERNELS": "interpret", "XG_COMM_BLOCKS": "4"})
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["executor"] == "spmd-kernels-interpret" and summary["comm"]["split_collectives"] >= 1, summary
    got = load_tensors(tmp_path / "o.npz")
    ref = Engine.load(engine).run(values, float64=True).tensors
    for name, want in ref.items():
        assert_close(got[name], want.numpy(), 1e-4, rand, what=f"{name} after a tensor-parallel step in row blocks")


def test_under_torchrun_each_process_is_one_rank(tmp_path: Path, rand: Rand) -> None:
    # An outside launcher (here torchrun; SLURM's srun sets SLURM_PROCID / SLURM_NTASKS) starts
    # plain `xgrun` processes: they read RANK / WORLD_SIZE / MASTER_ADDR from the environment.
    engine = build(tmp_path, src_text("""
        extern Tensor[float32, 4, 8] A
        extern Tensor[float32, 8, 6] B
        def main() {
            with shard(A, dim=1), shard(B, dim=0):
                c = A @ B
            return c
        }
    """), 2)
    (a, a64), (b, b64) = rand.tensor((4, 8)), rand.tensor((8, 6))
    save_tensors(tmp_path / "in.npz", {"A": a, "B": b})
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
                           str(free_port()), "-m", "xgbuild.cli.xgrun", str(engine), "--inputs", str(tmp_path / "in.npz"),
                           "--output", str(tmp_path / "o.npz"), "--timeout", "60"],
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    assert "2 ranks" in done.stdout
    assert_close(load_tensors(tmp_path / "o.npz")["out"], a64 @ b64, 1e-5, rand, what="contracting matmul")


def test_under_slurm_each_process_is_one_rank(tmp_path: Path, rand: Rand) -> None:
    """srun starts one plain `xgrun` per task with SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID (and
    the job script exports MASTER_ADDR / MASTER_PORT): the processes form the run. Ranks told to
    run the plan differently (XG_COMM_BLOCKS on one rank only) both stop, saying so, not hang."""
    src = tmp_path / "c.xg"
    src.write_text(src_text("""
        extern Tensor[float32, 256, 64] A
        extern Tensor[float32, 64, 16] B
        def main() {
            with shard(A, dim=1), shard(B, dim=0):
                c = A @ B
            return c
        }
    """))
    engine = tmp_path / "c.xge"
    done = subprocess.run([*command("xgc"), str(src), "--target", "H100", "--tune", "predict", "--num-gpu", "2",
                           "--out", str(engine), "--quiet"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    (a, a64), (b, b64) = rand.tensor((256, 64)), rand.tensor((64, 16))
    save_tensors(tmp_path / "in.npz", {"A": a, "B": b})

    def srun(per_rank: list[dict]) -> list[tuple[int, str, str]]:
        port = free_port()
        procs = []
        for rank, extra in enumerate(per_rank):
            env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
            env |= {"SLURM_PROCID": str(rank), "SLURM_NTASKS": "2", "SLURM_LOCALID": str(rank),
                    "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), **extra}
            procs.append(subprocess.Popen([*command("xgrun"), str(engine), "--inputs", str(tmp_path / "in.npz"),
                                           "--output", str(tmp_path / "o.npz"), "--timeout", "60"], env=env,
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        done = []
        for proc in procs:          # (little output: neither fills its pipes while the other is read)
            out, err = proc.communicate(timeout=300)
            done.append((proc.returncode, out, err))
        return done

    ran = srun([{}, {}])
    assert all(code == 0 for code, _, _ in ran), [err for _, _, err in ran]
    assert "2 ranks" in ran[0][1]
    assert_close(load_tensors(tmp_path / "o.npz")["out"], a64 @ b64, 1e-5, rand, what="contracting matmul under SLURM")
    kernels = {"XG_SPMD_KERNELS": "interpret", "TRITON_INTERPRET": "1"}
    ran = srun([{**kernels, "XG_COMM_BLOCKS": "1"}, {**kernels, "XG_COMM_BLOCKS": "4"}])
    for code, _, err in ran:
        assert code == 1, err
        assert "ranks would run the plan differently" in err and "XG_COMM_BLOCKS" in err, err
        assert "Traceback" not in err
    # A bad value on one rank only: both stop at once (none waits out the 60 s timeout for it).
    t0 = time.monotonic()
    ran = srun([{**kernels}, {**kernels, "XG_COMM_BLOCKS": "many"}])
    assert time.monotonic() - t0 < 50
    assert all(code == 1 and "Traceback" not in err for code, _, err in ran), ran
    assert "XG_COMM_BLOCKS is 'many'" in ran[1][2] and "rank 1 stopped the run: XG_COMM_BLOCKS is 'many'" in ran[0][2]


def test_python_api_runs_ranks(tmp_path: Path, rand: Rand) -> None:
    # examples/data_parallel.xg: the batch split, each GPU's gradient a partial sum, reduced by the
    # compiler's collectives; one SGD step equals the hand-written float64 step.
    import xg
    from test_examples_numeric import data_parallel_case
    engine = xg.compile_file(REPO_ROOT / "examples" / "data_parallel.xg", kernels=False)
    inputs, refs = data_parallel_case(rand)
    result = xg.run_engine(engine, inputs, nproc=2)
    assert result.metadata["world_size"] == 2
    for got, ref in zip(result.value, refs):
        assert_close(got, ref, 1e-5, rand, what="data-parallel SGD step on 2 ranks")
    with pytest.raises(xg.EngineError, match="planned for NUM_GPU = 2"):
        xg.run_engine(engine, inputs, nproc=4)


@pytest.mark.slow
def test_a_batch_the_pieces_do_not_divide_fails_every_rank_with_the_reason(tmp_path: Path) -> None:
    # 2 stages of 2 GPUs, 4 microbatches each: 8 pieces of a symbolic batch of 1 row. Every rank
    # says so (an input error, exit 1) before slicing its share.
    src = (REPO_ROOT / "examples" / "pipeline.xg").read_text().replace("Tensor[float32, 64, 32] X", "Tensor[float32, B, 32] X") \
        .replace("Tensor[float32, 64, 8] Y", "Tensor[float32, B, 8] Y")
    assert "B, 32" in src
    (tmp_path / "p.toml").write_text((REPO_ROOT / "examples" / "pipeline.toml").read_text())
    engine = build(tmp_path, src, 4, "--sharding", str(tmp_path / "p.toml"))
    done = run_ranks(engine, 4, "--dim", "B=1", timeout=120)
    assert done.returncode == 1, done.stderr
    assert "size 1, which 8 pieces (4 microbatches x 2 GPUs per stage) do not divide" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    done = run_ranks(engine, 4, "--dim", "B=16", "--json", timeout=120)      # 8 pieces of 2 rows
    assert done.returncode == 0, done.stderr
