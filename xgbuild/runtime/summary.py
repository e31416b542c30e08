"""How run results and engines read when printed: `print(result.metadata)`, `repr(engine)`.

`RunMetadata` is the dict a run reports (code keeps indexing it, `json.dumps` keeps taking it);
only its `str` differs, a few aligned lines with rounded times instead of one line of 16-digit
floats. Engine summaries name the target, inputs and digest instead of dumping the manifest.
"""

from __future__ import annotations

from typing import Any

SLOWEST = 5         # ops the summary lists by time; the dict keeps every one


def _ms(value: Any) -> str:
    return f"{value:.3g} ms" if isinstance(value, (int, float)) else str(value)


def _at(line: Any) -> str:
    return f" (line {line})" if line else ""


def _shape(shape: Any) -> str:
    return f"[{', '.join(str(d) for d in shape)}]"


def signature_text(sig: list[dict]) -> str:
    """`X: float32[T, D], G: float32[D]` (symbolic dims by name)."""
    return ", ".join(f"{s['name']}: {s['dtype']}{_shape(s['shape'])}" for s in sig) or "no inputs"


def engine_summary(kind: str, manifest: dict, digest: str) -> str:
    """`Engine(X: float32[T, D] -> ...; target H100 x1, 3 kernels, digest d901f905ed7f)`."""
    gpus = manifest.get("num_gpu", 1)
    kernels = len(manifest.get("kernels", []))
    entry = manifest.get("entry", {})
    return (f"{kind}({signature_text(entry.get('inputs', []))}; target {manifest.get('target')}"
            f"{f' x{gpus}' if gpus != 1 else ''}, {kernels} kernel{'s' if kernels != 1 else ''}, "
            f"digest {digest[:12]})")


class RunMetadata(dict):
    """A run's metadata: a plain dict, printed as a short summary."""

    def __str__(self) -> str:
        rows: list[tuple[str, str]] = []
        gpus = self.get("num_gpu")
        rows.append(("target", f"{self.get('target')}" + (f" x{gpus} GPUs" if gpus not in (None, 1) else "")))
        ran = f"{self.get('device')} ({self.get('executor')})"
        if "world_size" in self:
            ran += f", {self['world_size']} rank{'s' if self['world_size'] != 1 else ''}"
            if "rank" in self:
                ran += f" (this is rank {self['rank']})"
        rows.append(("ran on", ran + ("" if self.get("check", True) else ", checks off")))
        if "engine_digest" in self:
            rows.append(("engine", str(self["engine_digest"])[:12]))
        spec = self.get("specialization")
        if spec:
            inputs = ", ".join(f"{n}: {v['dtype']}{_shape(v['shape'])}" for n, v in spec.get("inputs", {}).items())
            rows.append(("inputs", inputs or "none"))
            symbols = ", ".join(f"{k}={v}" for k, v in spec.get("symbols", {}).items())
            if symbols:
                rows.append(("symbols", symbols + (" (specialised before)" if spec.get("cached") else "")))
        timings = self.get("timings", {})
        if "total_ms" in timings:
            rows.append(("time", _ms(timings["total_ms"])))
        ops = [o for o in timings.get("ops", []) if isinstance(o, dict) and "ms" in o]
        if ops:
            slow = sorted(ops, key=lambda o: -o["ms"])[:SLOWEST]
            listed = ", ".join(f"{o['op']}{_at(o.get('line'))} {_ms(o['ms'])}" for o in slow)
            more = f" (of {len(ops)}: metadata['timings']['ops'])" if len(ops) > SLOWEST else ""
            rows.append(("slowest ops", listed + more))
        width = max(len(k) for k, _ in rows)
        return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def output_leaves(sig: dict, prefix: str = "out") -> list[tuple[str, str, list]]:
    """A manifest's output signature as (name, dtype, shape) leaves, named as the output files
    are (`out`, `out_0`, `out_1`, …, `out_value` inside a Result)."""
    if "tensor" in sig:
        return [(prefix, sig["tensor"]["dtype"], sig["tensor"]["shape"])]
    if "tuple" in sig:
        return [leaf for i, item in enumerate(sig["tuple"]) for leaf in output_leaves(item, f"{prefix}_{i}")]
    return output_leaves(sig["result"], f"{prefix}_value")
