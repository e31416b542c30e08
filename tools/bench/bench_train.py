"""One training step of GPT-2 small (models/train.xg) through XG, beside the same model as a plain
PyTorch `nn.Module`, eager and under `torch.compile`, in one run: issue 23's benchmark.

XG builds `models/train.xg` with `xg.compile_file` at the sizes its constants give (`--const NAME=VALUE`
overrides them as `xgc --const` does: GPT-2 small, batch 8 x 1024 tokens, unless told) and runs it
as `xgrun --steps` does, through `xgbuild.runtime.steps.run_steps`: the engine called with its
inputs, its parameters and AdamW moments fed back on the device, STEP advanced. The peer is the
same model in PyTorch (`F.scaled_dot_product_attention`, a tied LM head, `clip_grad_norm_` and
`torch.optim.AdamW`, fused on CUDA), its hyperparameters read from the file's constants, its
weights those XG starts from. Every implementation runs the file's precision policy: `COMPUTE =
bfloat16` (products in bfloat16, float32 master weights and moments) is what `torch.autocast`
does, so the peers run under it; `--const COMPUTE=float32` (or a file without the policy) runs
everything in float32, TF32 off for the peers as XG's float32 matmuls are IEEE.

For each implementation: the first step (build or compile) timed apart, then `--repeats` runs of
`--time-steps` steps on one batch, the median per step (CUDA events on a GPU), tokens per second,
and the peak of `torch.cuda.max_memory_allocated` (reset before each implementation sets up;
XG's executor allocates through torch's allocator too). Then `--steps` steps of each from the same
initial weights and the same batches (seeded: each sequence counts from a random start by a random
stride modulo V, so there is something to learn) at a constant learning rate, their loss curves
in the JSON. Last, two more runs of `--repeat-steps` steps (20) from the initial weights, their
losses, weights and moments compared bit for bit (issue 23's determinism: XG's reductions are
ordered, so its two runs must agree; the peers' rows say whether theirs do). Under a bf16 policy
the same model in float32 (eager, TF32 off) adds a reference curve, so that each bf16 curve's
distance from it can be read beside the others' (what "within bf16 noise" means). Prints two
tables (the step; the curves' means by quarter) and writes JSON; `--plot` draws the curves (matplotlib), `--replot`
draws them from an earlier JSON without running anything (the GPU hosts have no matplotlib).

    python tools/bench/bench_train.py [--const L=12 D=768 COMPUTE=float32 ...] [--device cuda|cpu]
        [--tune measure|cache|predict|strict] [--steps 200] [--time-steps 20] [--repeats 5]
        [--repeat-steps 20] [--lr 6e-4] [--seed 0] [--no-compile] [--json out/bench_train.json]
        [--plot loss.png] [--replot out/bench_train.json]
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import xg  # noqa: E402
from xgbuild.compiler.frontend import CheckOptions, check_file  # noqa: E402
from xgbuild.compiler.frontend.constants import OverrideError, normalize, parse_override  # noqa: E402
from xgbuild.errors import XGError  # noqa: E402
from xgbuild.runtime.steps import feedback_of, run_steps  # noqa: E402
from bench_torch_models import count, local_target  # noqa: E402  (command-line counts; this GPU's target)

SOURCE = REPO / "models" / "train.xg"
TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
                "float64": torch.float64}
MATRICES = ("WTE", "WPE", "WQKV", "WO", "W1", "W2")       # normal(0, 0.02); gains 1, biases 0


# --- the configuration, read from the file --------------------------------------------------------

@dataclass(frozen=True)
class Config:
    """train.xg's sizes and training constants after the overrides, its parameters' dtype and its
    products' (`COMPUTE`; None: no mixed-precision policy, products in the parameters' dtype)."""
    L: int
    D: int
    H: int
    T: int
    V: int
    B: int
    clip: float
    wd: float
    beta1: float
    beta2: float
    eps: float
    dtype: str
    compute: str | None

    @property
    def tokens(self) -> int:
        return self.B * self.T

    @property
    def policy(self) -> str:
        if self.compute is None:
            return f"no mixed-precision policy: {self.dtype} throughout"
        return (f"COMPUTE = {self.compute}: products in {self.compute}, {self.dtype} master weights and moments "
                "(torch.autocast for the peers)")


def read_config(consts: dict) -> Config:
    """The constants the checker resolves for `consts` (so the peer trains with the file's own
    sizes and hyperparameters, not copies of them); a CompileError as xgc renders it."""
    result = check_file(SOURCE, CheckOptions(consts=normalize(consts)))
    if not result.ok:
        raise xg.CompileError(result.render(), result.diagnostics)
    c = result.program.constants
    wte = result.program.externals["WTE"]
    return Config(L=c["L"], D=c["D"], H=c["H"], T=c["T"], V=c["V"], B=c["B"], clip=float(c["CLIP"]),
                  wd=float(c["WD"]), beta1=float(c["BETA1"]), beta2=float(c["BETA2"]), eps=float(c["EPS"]),
                  dtype=str(wte.dtype), compute=getattr(result.program, "compute", None))


def initial_params(engine: Any, cfg: Config, seed: int) -> dict[str, torch.Tensor]:
    """GPT-2's initialisation for every parameter the engine feeds back (moments excluded): matrices
    and embeddings normal with std 0.02, LayerNorm gains 1, biases 0. Seeded, on the CPU."""
    gen = torch.Generator().manual_seed(seed)
    names = [name for name, _ in feedback_of(engine.manifest).pairs if not name.startswith(("M_", "V_"))]
    shapes = {s["name"]: tuple(s["shape"]) for s in engine.signature}
    out = {}
    for name in names:
        if name.endswith("_G"):
            out[name] = torch.ones(shapes[name])
        elif name in MATRICES:
            out[name] = 0.02 * torch.randn(shapes[name], generator=gen)
        else:
            out[name] = torch.zeros(shapes[name])
    return {k: v.to(TORCH_DTYPES[cfg.dtype]) for k, v in out.items()}


def make_batches(cfg: Config, seed: int, n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """`n` (tokens, targets) batches: each sequence counts up from a random start by a random
    stride of 1 to 3, modulo V. The same for every implementation."""
    gen = torch.Generator().manual_seed(seed + 1)
    out = []
    for _ in range(n):
        start = torch.randint(0, cfg.V, (cfg.B, 1), generator=gen)
        stride = torch.randint(1, 4, (cfg.B, 1), generator=gen)
        seq = (start + stride * torch.arange(cfg.T + 1)) % cfg.V
        out.append((seq[:, :-1].contiguous(), seq[:, 1:].contiguous()))
    return out


# --- the PyTorch peer ---------------------------------------------------------------------------

class Block(nn.Module):
    """nanoGPT's pre-norm block: x + attn(ln_1(x)), then + mlp(ln_2(.))."""

    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.heads = cfg.H
        self.ln_1, self.ln_2 = nn.LayerNorm(cfg.D), nn.LayerNorm(cfg.D)
        self.c_attn, self.c_proj = nn.Linear(cfg.D, 3 * cfg.D), nn.Linear(cfg.D, cfg.D)
        self.c_fc, self.mlp_proj = nn.Linear(cfg.D, 4 * cfg.D), nn.Linear(4 * cfg.D, cfg.D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2)
                   for z in self.c_attn(self.ln_1(x)).split(d, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
        x = x + self.c_proj(y)
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    """train.xg's model: token and learned position embeddings, L blocks, a final LayerNorm, the
    LM head tied to the token embedding; `forward` returns the mean cross-entropy."""

    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(cfg.V, cfg.D), nn.Embedding(cfg.T, cfg.D)
        self.h = nn.ModuleList(Block(cfg) for _ in range(cfg.L))
        self.ln_f = nn.LayerNorm(cfg.D)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.wte(tokens) + self.wpe.weight
        for block in self.h:
            x = block(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))

    @torch.no_grad()
    def load_stacked(self, p: dict[str, torch.Tensor]) -> "GPT":
        """Take train.xg's parameters (per-layer tensors stacked on a leading L dim, matrices as
        `x @ W` reads them) into this module's (nn.Linear's weight is W transposed)."""
        self.wte.weight.copy_(p["WTE"])
        self.wpe.weight.copy_(p["WPE"])
        self.ln_f.weight.copy_(p["LNF_G"])
        self.ln_f.bias.copy_(p["LNF_B"])
        for l, blk in enumerate(self.h):
            for mod, w, b in ((blk.ln_1, "LN1_G", "LN1_B"), (blk.ln_2, "LN2_G", "LN2_B")):
                mod.weight.copy_(p[w][l])
                mod.bias.copy_(p[b][l])
            for mod, w, b in ((blk.c_attn, "WQKV", "BQKV"), (blk.c_proj, "WO", "BO"), (blk.c_fc, "W1", "B1"),
                              (blk.mlp_proj, "W2", "B2")):
                mod.weight.copy_(p[w][l].T)
                mod.bias.copy_(p[b][l])
        return self


class TorchTrainer:
    """The peer as a training loop writes it: forward (compiled or not) under the file's precision
    policy, backward, global-norm clipping, AdamW (weight decay on tensors of rank 2 or more, as
    train.xg; fused on CUDA)."""

    def __init__(self, cfg: Config, params: dict, device: str, lr: float, compiled: bool) -> None:
        self.cfg, self.params, self.device, self.lr = cfg, params, device, lr
        self.model = GPT(cfg).to(device=device, dtype=TORCH_DTYPES[cfg.dtype])
        if compiled:
            torch._dynamo.reset()
        self.forward = torch.compile(self.model) if compiled else self.model
        self.restart()

    def restart(self) -> None:
        """The initial weights again and a fresh optimizer (the compiled code is kept)."""
        cfg = self.cfg
        self.model.load_stacked({k: v.to(self.device) for k, v in self.params.items()})
        decay = [p for p in self.model.parameters() if p.dim() >= 2]
        rest = [p for p in self.model.parameters() if p.dim() < 2]
        self.opt = None                     # the old moments freed before the new ones exist
        self.opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.wd},
                                      {"params": rest, "weight_decay": 0.0}],
                                     lr=self.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps,
                                     **({"fused": True} if self.device == "cuda" else {}))

    def step(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        compute = self.cfg.compute
        with torch.autocast(self.device, dtype=TORCH_DTYPES[compute or self.cfg.dtype], enabled=compute is not None):
            loss = self.forward(tokens, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.clip)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return loss.detach()

    def steps(self, tokens: torch.Tensor, targets: torch.Tensor, n: int) -> list[float]:
        """`n` steps on one batch; the losses (read once, after the last)."""
        losses = [self.step(tokens, targets) for _ in range(n)]
        return torch.stack(losses).float().tolist()

    def state(self) -> list[torch.Tensor]:
        """The weights and AdamW's moments, in a fixed order."""
        out = [p.detach() for p in self.model.parameters()]
        for p in self.model.parameters():
            out += [v for v in self.opt.state.get(p, {}).values() if isinstance(v, torch.Tensor)]
        return out


# --- timing -------------------------------------------------------------------------------------

def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def elapsed_ms(fn: Callable[[], Any], device: str) -> float:
    """Wall time of `fn` from an idle device to its work done (CUDA events on a GPU)."""
    sync(device)
    if device != "cuda":
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


class XGTrainer:
    """The engine as `xgrun --steps` runs it: `run_steps`, state fed back on the device."""

    def __init__(self, engine: Any, params: dict, lr: float, device: str, check: bool = True) -> None:
        self.engine, self.device, self.check = engine, device, check
        self.feedback = feedback_of(engine.manifest, "models/train.xg")
        self.params, self.lr = params, lr
        self.restart()

    def restart(self) -> None:
        """The initial weights again, the moments zero, STEP 1."""
        shapes = {s["name"]: (tuple(s["shape"]), s["dtype"]) for s in self.engine.signature}
        moments = {n: torch.zeros(shapes[n][0], dtype=TORCH_DTYPES[shapes[n][1]])
                   for n, _ in self.feedback.pairs if n.startswith(("M_", "V_"))}
        fixed = {"STEP": torch.tensor(1.0), "LR": torch.tensor(self.lr, dtype=torch.float32)}
        self.values = {}                    # the old state freed before the new one exists
        self.values = {k: v.to(self.device) for k, v in {**self.params, **moments, **fixed}.items()}

    def steps(self, tokens: torch.Tensor, targets: torch.Tensor, n: int) -> list[float]:
        """`n` steps on one batch; the losses (read once, after the last)."""
        done = run_steps(self.engine, {**self.values, "TOKENS": tokens, "TARGETS": targets}, n,
                         device=self.device, check=self.check, feedback=self.feedback)
        self.values = done.next_inputs
        return [row["out_0"] for row in done.scalars]

    def state(self) -> list[torch.Tensor]:
        """The weights and AdamW's moments (every fed-back input), in a fixed order."""
        return [self.values[name] for name, _ in self.feedback.pairs]

    def profile(self, tokens: torch.Tensor, targets: torch.Tensor, iterations: int, top: int = 15) -> dict:
        """`iterations` steps (each from the same state: nothing fed back) kernel by kernel under the
        profiler, as `xgrun --profile` runs them: where a step's time goes, printed to stderr; the
        slowest `top` kernels kept."""
        from xgbuild.runtime.profile import Profiler, render
        profiler = Profiler(self.device)
        inputs = {**self.values, "TOKENS": tokens, "TARGETS": targets}
        for _ in range(iterations):
            self.engine.run(inputs, device=self.device, check=self.check, profiler=profiler)
        summary = profiler.summary()
        print(render(summary, limit=top), file=sys.stderr, flush=True)
        return {"kernels_ms": summary["kernels_ms"], "run_p50_ms": summary["run_ms"]["p50"],
                "launches": summary["launches"], "rows": summary["rows"][:top]}


def measure(name: str, make: Callable[[], XGTrainer | TorchTrainer], batches: list, args: argparse.Namespace,
            cfg: Config) -> dict:
    """One implementation's row: first step, per-step time, tokens/s, peak memory; then its loss
    curve from the initial weights again. `make()` builds the implementation (its peak counts)."""
    device = args.device
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    row: dict[str, Any] = {"impl": name}
    t0 = time.perf_counter()
    trainer = make()
    row["setup_s"] = time.perf_counter() - t0
    tokens, targets = (t.to(device) for t in batches[0])
    row["first_step_s"] = elapsed_ms(lambda: trainer.steps(tokens, targets, 1), device) / 1e3
    trainer.steps(tokens, targets, 2)                                    # warm-up
    runs = [elapsed_ms(lambda: trainer.steps(tokens, targets, args.time_steps), device) / args.time_steps
            for _ in range(args.repeats)]
    row["step_ms"] = statistics.median(runs)
    row["step_ms_runs"] = runs
    row["tokens_per_s"] = cfg.tokens / (row["step_ms"] / 1e3)
    row["peak_bytes"] = torch.cuda.max_memory_allocated() if device == "cuda" else None
    if args.profile and isinstance(trainer, XGTrainer):
        row["profile"] = trainer.profile(tokens, targets, args.profile)
    row["loss"] = curve(trainer, batches[:args.steps], device)
    if args.repeat_steps:
        row.update(repeat_check(trainer, batches[:args.repeat_steps], device))
    return row


def curve(trainer: XGTrainer | TorchTrainer, batches: list, device: str) -> list[float]:
    """The losses of one step per batch from the initial weights."""
    trainer.restart()
    losses = []
    for tok, tgt in batches:
        losses += trainer.steps(tok.to(device), tgt.to(device), 1)
    return losses


def bits(t: torch.Tensor) -> torch.Tensor:
    """`t`'s bytes (NaNs and signed zeros compared as stored)."""
    return t.contiguous().reshape(-1).view(torch.uint8)


def repeat_check(trainer: XGTrainer | TorchTrainer, batches: list, device: str) -> dict:
    """Two more runs of `len(batches)` steps from the initial weights: are their losses, weights and
    moments equal bit for bit (issue 23: determinism, no atomics whose order varies)?"""
    runs = []
    for _ in range(2):
        losses = curve(trainer, batches, device)
        runs.append((losses, [t.detach().cpu().clone() for t in trainer.state()]))
    (loss_a, state_a), (loss_b, state_b) = runs
    differing = sum(a.shape != b.shape or not torch.equal(bits(a), bits(b)) for a, b in zip(state_a, state_b))
    return {"repeat_steps": len(batches), "repeat_losses_identical": loss_a == loss_b,
            "repeat_state_identical": len(state_a) == len(state_b) and differing == 0,
            "repeat_state_tensors": len(state_a),
            "repeat_state_differing": differing, "repeat_losses": [loss_a, loss_b]}


def run(args: argparse.Namespace, consts: dict) -> dict:
    device = args.device
    cfg = read_config(consts)
    print(f"# models/train.xg at {asdict(cfg)}; {cfg.policy}", file=sys.stderr)
    t0 = time.perf_counter()
    if device == "cuda":
        engine = xg.compile_file(SOURCE, target=local_target(), tune=args.tune, consts=consts)
    else:
        engine = xg.compile_file(SOURCE, kernels=False, consts=consts)
    build_s = time.perf_counter() - t0
    params = initial_params(engine, cfg, args.seed)
    batches = make_batches(cfg, args.seed, max(args.steps, args.repeat_steps))

    impls: list[tuple[str, Callable]] = [
        ("xg", lambda: XGTrainer(engine, params, args.lr, device, check=not args.no_check)),
        ("eager", lambda: TorchTrainer(cfg, params, device, args.lr, compiled=False))]
    if not args.no_compile:
        impls.append(("compile", lambda: TorchTrainer(cfg, params, device, args.lr, compiled=True)))
    rows = []
    for name, make in impls:
        print(f"# {name}: {args.repeats} x {args.time_steps} timed steps, then {args.steps} steps", file=sys.stderr)
        try:
            row = measure(name, make, batches, args, cfg)
        except (XGError, RuntimeError) as exc:    # one implementation's failure is a row, not the end
            row = {"impl": name, "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"}
        if name == "xg" and "error" not in row:
            row.update(build_s=build_s, kernels=len(engine.manifest.get("kernels", [])),
                       launches=len(engine.manifest.get("launches", [])))
        rows.append(row)
    if args.no_compile:
        rows.append({"impl": "compile", "skipped": "--no-compile"})
    eager = next((r for r in rows if r["impl"] == "eager" and "loss" in r), None)
    for r in rows:
        if eager is not None and "loss" in r:
            head = list(zip(r["loss"], eager["loss"]))[:10]
            r["loss_rel_diff_vs_eager_10"] = max(abs(a - b) / abs(b) for a, b in head)
    reference = None
    if cfg.compute is not None and args.reference_curve:
        # What bf16's noise is measured against: the same model, weights and batches in float32
        # (IEEE products: TF32 is off), PyTorch eager. Its curve only; nothing timed.
        print(f"# reference: eager float32, {args.steps} steps", file=sys.stderr)
        gc.collect()
        try:
            trainer = TorchTrainer(replace(cfg, compute=None), params, device, args.lr, compiled=False)
            reference = {"impl": "eager float32", "loss": curve(trainer, batches[:args.steps], device)}
        except RuntimeError as exc:             # (out of memory, say): the report goes on without it
            reference = {"impl": "eager float32", "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"}
        trainer = None
    return {"device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu", "torch": torch.__version__,
            "config": asdict(cfg), "consts": consts, "params": sum(v.numel() for v in params.values()),
            "tokens_per_step": cfg.tokens, "lr": args.lr, "seed": args.seed,
            "dtype_policy": cfg.policy,
            "peak_memory": "torch.cuda.max_memory_allocated, reset before each implementation sets up",
            "args": vars(args), "rows": rows, "reference": reference}


# --- reporting ----------------------------------------------------------------------------------

def print_table(report: dict) -> None:
    cfg = report["config"]
    print(f"\nmodels/train.xg: L{cfg['L']} D{cfg['D']} H{cfg['H']} V{cfg['V']}, batch {cfg['B']} x {cfg['T']} tokens, "
          f"{report['params'] / 1e6:.2f}M parameters, {report['dtype_policy']}; lr {report['lr']}, "
          f"{report['args']['steps']} steps; {report['device']}, torch {report['torch']}")
    # The runs' spread beside the median: a peer whose repeats scatter (a GPU shared, a recompile)
    # shows it in the table, not only in the JSON.
    print("| impl | step ms | runs min - max | tokens/s | peak MiB | build + first step s | loss first -> last "
          "| rel Δ vs eager (10 steps) | two reruns bit for bit |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in report["rows"]:
        if "step_ms" not in r:
            print(f"| {r['impl']} | {r.get('error') or 'skipped: ' + r.get('skipped', '')} | | | | | | | |")
            continue
        peak = "-" if r["peak_bytes"] is None else f"{r['peak_bytes'] / 2**20:.0f}"
        first = r["first_step_s"] + r.get("build_s", 0.0)
        runs = r.get("step_ms_runs") or [r["step_ms"]]
        print(f"| {r['impl']} | {r['step_ms']:.3f} | {min(runs):.2f} - {max(runs):.2f} | {r['tokens_per_s']:.0f} | "
              f"{peak} | {first:.2f} | {r['loss'][0]:.4f} -> {r['loss'][-1]:.4f} | "
              f"{r['loss_rel_diff_vs_eager_10']:.1e} | {repeat_cell(r)} |")


def print_curves(report: dict, windows: int = 4) -> None:
    """The loss curves in numbers: each implementation's mean loss over `windows` equal spans of the
    run, and its mean distance from the float32 reference's curve over the last span (bf16's noise:
    compare it with the peers' own distance)."""
    curves = [(r["impl"], r["loss"]) for r in report["rows"] if "loss" in r]
    ref = report.get("reference")
    if ref and "loss" not in ref:
        print(f"\nno float32 reference curve: {ref.get('error')}")
        ref = None
    if ref:
        curves.append((ref["impl"], ref["loss"]))
    n = min((len(loss) for _, loss in curves), default=0)
    if n < windows:
        return
    spans = [(n * i // windows, n * (i + 1) // windows) for i in range(windows)]
    print("\n| loss curve | " + " | ".join(f"steps {a + 1}-{b}" for a, b in spans)
          + (" | mean abs Δ vs float32, last span |" if ref else " |"))
    print("| --- " * (len(spans) + 1 + bool(ref)) + "|")
    for name, loss in curves:
        cells = [f"{statistics.fmean(loss[a:b]):.4f}" for a, b in spans]
        if ref:
            a, b = spans[-1]
            cells.append(f"{statistics.fmean(abs(x - y) for x, y in zip(loss[a:b], ref['loss'][a:b])):.2e}")
        print(f"| {name} | " + " | ".join(cells) + " |")


def repeat_cell(r: dict) -> str:
    """`repeat_check`'s verdict in words."""
    if "repeat_steps" not in r:
        return "-"
    if r["repeat_losses_identical"] and r["repeat_state_identical"]:
        return f"{r['repeat_steps']} steps: losses and state identical"
    return (f"{r['repeat_steps']} steps: losses {'identical' if r['repeat_losses_identical'] else 'DIFFER'}, "
            f"{r['repeat_state_differing']} of {r['repeat_state_tensors']} state tensors differ")


def is_report(report: Any) -> bool:
    """Whether `report` has what `plot` reads: the device, the config's sizes, a list of rows."""
    return isinstance(report, dict) and isinstance(report.get("rows"), list) and "device" in report \
        and isinstance(report.get("config"), dict) and {"L", "D", "B", "T"} <= set(report["config"]) \
        and all(isinstance(r, dict) and "impl" in r for r in report["rows"])


def plot(report: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 5))
    for r in report["rows"]:
        if "loss" in r:
            ax.plot(range(1, len(r["loss"]) + 1), r["loss"], label=r["impl"], linewidth=1)
    ref = report.get("reference")
    if ref and "loss" in ref:
        ax.plot(range(1, len(ref["loss"]) + 1), ref["loss"], label=ref["impl"], linewidth=1, linestyle="--",
                color="black")
    cfg = report["config"]
    ax.set(xlabel="step", ylabel="loss", title=f"train.xg L{cfg['L']} D{cfg['D']}, batch {cfg['B']}x{cfg['T']}, "
           f"{report['device']}")
    ax.legend()
    fig.savefig(path, dpi=120, bbox_inches="tight")
    print(f"wrote {path}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--const", nargs="+", action="extend", default=[], metavar="NAME=VALUE",
                    help="override a constant of models/train.xg, as xgc --const (L D H T V B ...)")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--tune", default="measure", choices=["measure", "cache", "predict", "strict"],
                    help="XG's tuning policy on a GPU")
    ap.add_argument("--steps", type=count(1), default=200, help="steps of each implementation for the loss curves")
    ap.add_argument("--time-steps", type=count(1), default=20, help="steps in one timed run")
    ap.add_argument("--repeats", type=count(1), default=5, help="timed runs (the median is reported)")
    ap.add_argument("--repeat-steps", type=count(0), default=20, metavar="N",
                    help="then two more runs of N steps from the initial weights, compared bit for bit (0: skip)")
    ap.add_argument("--no-reference-curve", dest="reference_curve", action="store_false",
                    help="under a mixed-precision policy, leave out the float32 eager loss curve bf16's are compared with")
    ap.add_argument("--lr", type=float, default=6e-4, help="the constant learning rate of every run")
    ap.add_argument("--seed", type=int, default=0, help="seeds the initial weights and the batches")
    ap.add_argument("--no-compile", action="store_true", help="leave torch.compile out (slow to start on a CPU)")
    ap.add_argument("--no-check", action="store_true",
                    help="run XG's steps without check mode (its default, and the row's, is checks on: a NaN "
                         "flag read each step; the PyTorch rows check nothing)")
    ap.add_argument("--profile", type=count(0), default=0, metavar="N",
                    help="also run N of XG's steps kernel by kernel (xgrun --profile's table, on stderr)")
    ap.add_argument("--json", default=str(REPO / "out" / "bench_train.json"))
    ap.add_argument("--plot", default=None, help="draw the loss curves into this image (needs matplotlib)")
    ap.add_argument("--replot", default=None, metavar="JSON", help="draw --plot from this report; run nothing")
    args = ap.parse_args()
    report = None
    if args.replot:
        if not args.plot:
            print("error: --replot needs --plot PATH", file=sys.stderr)
            return 2
        try:
            report = json.loads(Path(args.replot).read_text())
        except (OSError, ValueError) as exc:
            print(f"error: --replot {args.replot}: {exc}", file=sys.stderr)
            return 1
        if not is_report(report):
            print(f"error: --replot {args.replot}: not a bench_train report (its device, config and rows)",
                  file=sys.stderr)
            return 1
    # Before anything runs: a GPU session should not learn at the end of its run that it cannot plot.
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        print("error: --plot needs the package `matplotlib`, which is not installed (pip install matplotlib)",
              file=sys.stderr)
        return 2
    if report is not None:
        plot(report, Path(args.plot))
        return 0
    try:
        consts = dict(parse_override(text) for text in args.const)
    except OverrideError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.device == "cuda" and not torch.cuda.is_available():
        print("error: no GPU here; run a small configuration on the CPU: --device cpu "
              "--const L=2 D=64 H=2 T=32 V=128 B=2", file=sys.stderr)
        return 1
    torch.backends.cuda.matmul.allow_tf32 = False       # XG's fp32 matmuls are IEEE; so are the peers'
    torch.backends.cudnn.allow_tf32 = False
    try:
        report = run(args, consts)
    except (XGError, OverrideError) as exc:
        print(exc if isinstance(exc, xg.CompileError) else f"error: {exc}", file=sys.stderr)
        return 1
    print_table(report)
    print_curves(report)
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    print(f"wrote {out}")
    if args.plot:
        plot(report, Path(args.plot))
    return 0


if __name__ == "__main__":
    sys.exit(main())
