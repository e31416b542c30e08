"""Sources the model tests derive from models/: a training step rewritten to return its gradients."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def gradient_source(model: str, tmp_path: Path, dtype: str, params: list[str]) -> Path:
    """models/`model` in `dtype` (with std.nn in `dtype` beside it), its main replaced by one that
    returns the loss and the gradient of each of `params` (the inputs; `loss_fn` takes them, lower
    case, after TOKENS and TARGETS). The optimizer's inputs are dropped."""
    (tmp_path / "nn64.xg").write_text((REPO / "std" / "nn.xg").read_text().replace("float32", dtype))
    src = (REPO / "models" / model).read_text().replace("float32", dtype)
    wrt = ", ".join(name.lower() for name in params)
    src = src[:src.index("def main()")] + (
        f"def main() {{\n    return value_and_grad(loss_fn, wrt=({wrt}))(TOKENS, TARGETS, {', '.join(params)})\n}}\n")
    src = src.replace("import std.nn\n", "import nn64\n").replace("import std.optim\n", "")
    # No state: this main returns gradients, not the next step's parameters.
    src = src.replace("extern state ", "extern ").replace("extern counter ", "extern ")
    src = "\n".join(line for line in src.splitlines()
                    if not line.startswith((f"extern {dtype} STEP", f"extern {dtype} LR"))
                    and not line.split(" ")[-1].startswith(("M_", "V_"))) + "\n"
    path = tmp_path / f"{Path(model).stem}_grads.xg"
    path.write_text(src)
    return path
