"""tools/bench/bench_train.py (issue 23's training-step benchmark) on the CPU at a tiny
configuration: every row in its JSON, XG's losses on PyTorch eager's, its peer the same model as
tests/models/test_gpt2.py's reference, and `--plot`'s one-line refusal without matplotlib."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "tools" / "bench" / "bench_train.py"
TINY = ["L=2", "D=64", "H=2", "T=32", "V=128", "B=2", "COMPUTE=float32"]


def bench(tmp_path: Path, *extra: str) -> dict:
    out = tmp_path / "bench_train.json"
    proc = subprocess.run([sys.executable, str(BENCH), "--device", "cpu", "--const", *TINY, "--steps", "3",
                           "--time-steps", "1", "--repeats", "1", "--repeat-steps", "4", "--json", str(out), *extra],
                          cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "| xg |" in proc.stdout and "| eager |" in proc.stdout, proc.stdout
    return json.loads(out.read_text())


def check_rows(report: dict, timed: tuple[str, ...]) -> None:
    rows = {r["impl"]: r for r in report["rows"]}
    assert set(rows) == {"xg", "eager", "compile"}
    assert report["config"]["compute"] is None and report["tokens_per_step"] == 64
    for name in timed:
        row = rows[name]
        assert "error" not in row, row
        assert row["step_ms"] > 0 and row["tokens_per_s"] > 0 and row["peak_bytes"] is None   # no CUDA here
        assert len(row["loss"]) == 3
        # --repeat-steps 4: two more runs, longer than the curve (their batches are made too)
        assert row["repeat_steps"] == 4 and len(row["repeat_losses"][0]) == 4
        assert row["repeat_losses"][0][:3] == row["loss"], (row["repeat_losses"], row["loss"])
        assert row["repeat_state_tensors"] > 0
        if name == "xg":        # ordered reductions: bit for bit
            assert row["repeat_losses_identical"] and row["repeat_state_identical"], row
        worst = max(abs(a - b) / abs(b) for a, b in zip(row["loss"], rows["eager"]["loss"]))
        assert worst < 1e-4, f"{name}: losses {row['loss']} against eager's {rows['eager']['loss']}"


def test_tiny_run_on_the_cpu(tmp_path: Path) -> None:
    report = bench(tmp_path, "--no-compile")
    check_rows(report, ("xg", "eager"))
    assert {r["impl"]: r for r in report["rows"]}["compile"] == {"impl": "compile", "skipped": "--no-compile"}


@pytest.mark.slow
def test_tiny_run_with_torch_compile(tmp_path: Path) -> None:
    # torch.compile's first call takes about 45 s on a CPU with Inductor's cache cold.
    check_rows(bench(tmp_path), ("xg", "eager", "compile"))


def _module(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module          # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


def test_peer_is_the_reference_model() -> None:
    """The bench's nn.Module (SDPA, nn.Linear) gives test_gpt2's reference loss, in float64, from
    the same stacked parameters: one model, two ways of writing it."""
    sys.path.insert(0, str(REPO / "tests" / "models"))
    try:
        ref = _module("test_gpt2_ref", REPO / "tests" / "models" / "test_gpt2.py")
    finally:
        sys.path.remove(str(REPO / "tests" / "models"))
    mod = _module("bench_train", BENCH)
    c = {"L": 2, "D": 32, "H": 2, "T": 16, "V": 64, "B": 2}
    cfg = mod.Config(**c, clip=1.0, wd=0.1, beta1=0.9, beta2=0.95, eps=1e-8, dtype="float64", compute=None)
    gen = torch.Generator().manual_seed(3)
    params = ref.init_params(c, gen, torch.float64)
    tokens, targets = ref.batch(c, gen)
    got = mod.GPT(cfg).double().load_stacked(params)(tokens, targets).item()
    want = ref.torch_loss(params, tokens, targets, c).item()
    assert abs(got - want) < 1e-12 * abs(want)


def test_plot_needs_matplotlib(tmp_path: Path) -> None:
    report = tmp_path / "r.json"
    report.write_text(json.dumps({"config": {"L": 2, "D": 64, "B": 2, "T": 32}, "device": "cpu",
                                  "rows": [{"impl": "xg", "loss": [3.0, 2.0]}, {"impl": "eager", "loss": [3.0, 2.1]}]}))
    png = tmp_path / "loss.png"
    proc = subprocess.run([sys.executable, str(BENCH), "--replot", str(report), "--plot", str(png)], cwd=REPO,
                          capture_output=True, text=True, timeout=120, check=False)
    if importlib.util.find_spec("matplotlib") is None:
        assert proc.returncode == 2
        assert proc.stderr.strip().splitlines() == [
            "error: --plot needs the package `matplotlib`, which is not installed (pip install matplotlib)"]
        assert not png.exists()
    else:
        assert proc.returncode == 0, proc.stderr
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_profile_lists_where_a_step_goes(tmp_path) -> None:
    """`--profile N`: N of XG's steps op by op (on the CPU; kernel by kernel on a GPU), the slowest
    kept in XG's row and the table printed."""
    out = tmp_path / "bench_train.json"
    proc = subprocess.run([sys.executable, str(BENCH), "--device", "cpu", "--const", *TINY, "--steps", "2",
                           "--time-steps", "1", "--repeats", "1", "--no-compile", "--profile", "2",
                           "--json", str(out)], cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "profile: 2 iterations on cpu" in proc.stderr, proc.stderr
    xg_row = next(r for r in json.loads(out.read_text())["rows"] if r["impl"] == "xg")
    prof = xg_row["profile"]
    assert prof["launches"] > 0 and 0 < len(prof["rows"]) <= 15
    assert all(r["p50_ms"] >= 0 for r in prof["rows"])


def test_table_shows_each_rows_spread(capsys) -> None:
    """A noisy peer (repeats 25-31 ms around a 28 ms median) is visible in the printed table."""
    module = _module("bench_train_table", BENCH)
    row = {"impl": "compile", "step_ms": 28.2, "step_ms_runs": [28.2, 30.6, 25.1, 29.7, 27.4], "tokens_per_s": 1.0,
           "peak_bytes": 2**30, "first_step_s": 1.0, "loss": [11.0, 10.5], "loss_rel_diff_vs_eager_10": 7e-5}
    report = {"config": {"L": 1, "D": 8, "H": 2, "V": 16, "B": 1, "T": 4}, "params": 1e6, "dtype_policy": "p",
              "lr": 1e-3, "args": {"steps": 2}, "device": "cpu", "torch": "x",
              "rows": [row, {"impl": "eager", "skipped": "--no-eager"}]}
    module.print_table(report)
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("|")]
    assert "| runs min - max |" in lines[0]
    assert lines[2].endswith("| - |")
    assert lines[2].startswith("| compile | 28.200 | 25.10 - 30.60 |")
    assert all(line.count("|") == lines[0].count("|") for line in lines)


def test_repeat_check_finds_a_differing_bit() -> None:
    """The determinism check compares bytes: a rerun whose weights differ in one float's last bit
    (or only in a zero's sign) is reported, with the count of differing tensors, in the table too."""
    module = _module("bench_train_repeat", BENCH)

    class Flaky:
        def __init__(self, flip: float) -> None:
            self.runs, self.flip, self.w = 0, flip, torch.zeros(3)

        def restart(self) -> None:
            self.runs += 1
            self.w = torch.tensor([1.0, 2.0, 0.0])

        def steps(self, tokens, targets, n):
            if self.runs == 2:
                self.w[2] = self.flip
            return [0.5] * n

        def state(self):
            return [torch.ones(2), self.w]

    batches = [(torch.zeros(1), torch.zeros(1))] * 3
    same = module.repeat_check(Flaky(0.0), batches, "cpu")
    assert same["repeat_losses_identical"] and same["repeat_state_identical"] and same["repeat_state_differing"] == 0
    for flip in (-0.0, float(torch.finfo(torch.float32).tiny)):
        got = module.repeat_check(Flaky(flip), batches, "cpu")
        assert got["repeat_losses_identical"] and not got["repeat_state_identical"]
        assert got["repeat_state_differing"] == 1 and got["repeat_state_tensors"] == 2
        assert module.repeat_cell(got) == "3 steps: losses identical, 1 of 2 state tensors differ"


def test_bf16_policy_adds_a_float32_reference_curve(tmp_path: Path) -> None:
    """Under `COMPUTE = bfloat16` the report carries eager float32's curve from the same weights and
    batches, and the curves' table measures every bf16 curve against it; `--no-reference-curve`
    leaves it out."""
    bf16 = [c for c in TINY if not c.startswith("COMPUTE")] + ["COMPUTE=bfloat16"]
    out = tmp_path / "bench_train.json"
    args = [sys.executable, str(BENCH), "--device", "cpu", "--const", *bf16, "--steps", "4", "--time-steps", "1",
            "--repeats", "1", "--repeat-steps", "0", "--no-compile", "--json", str(out)]
    proc = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(out.read_text())
    ref = report["reference"]
    assert ref["impl"] == "eager float32" and len(ref["loss"]) == 4
    rows = {r["impl"]: r for r in report["rows"]}
    assert "repeat_steps" not in rows["xg"]                     # --repeat-steps 0
    for name in ("xg", "eager"):
        worst = max(abs(a - b) / b for a, b in zip(rows[name]["loss"], ref["loss"]))
        assert 0 < worst < 1e-2, (name, rows[name]["loss"], ref["loss"])   # bf16's rounding, no more
    lines = proc.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| loss curve"))
    table = [line.split(" | ")[0] for line in lines[start:] if line.startswith("|")]
    assert lines[start].endswith("| mean abs Δ vs float32, last span |"), proc.stdout
    assert table[2:] == ["| xg", "| eager", "| eager float32"], proc.stdout
    proc = subprocess.run(args + ["--no-reference-curve"], cwd=REPO, capture_output=True, text=True, timeout=300,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(out.read_text())["reference"] is None
    assert "vs float32" not in proc.stdout


@pytest.mark.parametrize("args,message", [
    (["--steps", "0"], "argument --steps: 0 is less than 1"),
    (["--repeats", "0"], "argument --repeats: 0 is less than 1"),
    (["--time-steps", "x"], "argument --time-steps: 'x' is not an integer"),
    (["--repeat-steps", "-3"], "argument --repeat-steps: -3 is less than 0"),
])
def test_bad_counts_are_refused_before_anything_runs(args: list[str], message: str) -> None:
    proc = subprocess.run([sys.executable, str(BENCH), "--device", "cpu", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=120, check=False)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1].endswith(message), proc.stderr
    assert "Traceback" not in proc.stderr


def test_curves_table_without_a_reference_says_why(capsys) -> None:
    """A reference curve that failed (its error kept in the report) leaves the table without the
    distance column and says so in one line."""
    module = _module("bench_train_curves", BENCH)
    rows = [{"impl": "xg", "loss": [4.0, 3.0, 2.0, 1.0]}, {"impl": "eager", "error": "RuntimeError: x"}]
    module.print_curves({"rows": rows, "reference": {"impl": "eager float32", "error": "RuntimeError: out of memory"}})
    out = capsys.readouterr().out.splitlines()
    assert "no float32 reference curve: RuntimeError: out of memory" in out
    table = [line for line in out if line.startswith("|")]
    assert table[0] == "| loss curve | steps 1-1 | steps 2-2 | steps 3-3 | steps 4-4 |"
    assert table[2] == "| xg | 4.0000 | 3.0000 | 2.0000 | 1.0000 |" and len(table) == 3


@pytest.mark.parametrize("text,message", [
    (None, "No such file or directory"),
    ("{bad", "Expecting property name"),
    ('{"rows": 3}', "not a bench_train report (its device, config and rows)"),
    ('{"device": "cpu", "config": {"L": 1}, "rows": []}', "not a bench_train report"),
])
def test_replot_of_an_unreadable_report_is_refused(tmp_path: Path, text, message: str) -> None:
    """Checked before matplotlib is looked for, so the refusal is the same with or without it."""
    report = tmp_path / "r.json"
    if text is not None:
        report.write_text(text)
    png = tmp_path / "loss.png"
    proc = subprocess.run([sys.executable, str(BENCH), "--replot", str(report), "--plot", str(png)], cwd=REPO,
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(f"error: --replot {report}: ") and message in line, line
    assert not png.exists()
