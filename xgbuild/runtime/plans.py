"""An engine's kernel table read back as the executor's launch plans: what the runtime needs of
the build's kernels (which it never tunes or compiles itself).
"""

from __future__ import annotations

from typing import Any

from ..compiler.codegen.launch_abi import Compiled, ExternStep, KernelPlan, Variant
from ..compiler.codegen.spec import Binding, KernelSpec
from .cuda import KernelBinary


def plans_from_manifest(manifest: dict, entries: dict[str, bytes] | None,
                        variant: Any = None) -> list[KernelPlan | ExternStep]:
    """The executor's plans from an engine's kernel table (files already verified by the archive).
    `variant(spec, entry)` makes each variant's `Compiled` (default: its cubin, for the CUDA driver)."""
    def cubin(spec: KernelSpec, v: dict) -> Compiled:
        return Compiled(Variant.from_json(v["variant"]), dict(v["config"]), [tuple(p) for p in v["params"]],
                        list(v["div16"]), KernelBinary.from_metadata(v, entries[v["cubin"]]))
    make = variant or cubin
    by_id: dict[str, tuple[KernelSpec, list[Compiled]]] = {}
    for k in manifest.get("kernels", []):
        spec = KernelSpec.from_canonical(k["spec"])
        by_id[k["id"]] = (spec, [make(spec, v) for v in k["variants"]])
    plans: list[KernelPlan | ExternStep] = []
    for launch in manifest.get("launches", []):
        if "extern" in launch:
            plans.append(ExternStep(int(launch["extern"])))
            continue
        spec, variants = by_id[launch["kernel"]]
        plans.append(KernelPlan(spec, Binding.from_json(launch["binding"]), variants))
    return plans
