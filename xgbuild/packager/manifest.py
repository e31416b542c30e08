"""The engine manifest: what an engine is, in one canonical JSON document.

Everything in it is a pure function of the sources, the options and the toolchain: no paths,
times, users or host names, so two builds of the same inputs give the same bytes. `check_manifest`
is the reading side: what a manifest from an untrusted file must hold before the runtime uses it.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any


from .. import __version__
from ..compiler.ir.graph import Graph
from ..compiler.ir.verify import shape_problem
from ..dtypes import ITEMSIZE
from ..errors import EngineError
from ..hw import GpuProfile

FORMAT_VERSION = 1


def canonical_json(obj: Any) -> bytes:
    return (json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True) + "\n").encode()


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _tensor_sig(graph: Graph, nid: int) -> dict:
    n = graph.node(nid)
    return {"dtype": n.dtype, "shape": list(n.shape)}


def _output_sig(graph: Graph, tree: dict) -> dict:
    if "t" in tree:
        return {"tensor": _tensor_sig(graph, tree["t"])}
    if "tuple" in tree:
        return {"tuple": [_output_sig(graph, t) for t in tree["tuple"]]}
    return {"result": _output_sig(graph, tree["result"]["value"])}


def build_manifest(*, graph: Graph, program_blob: bytes, profile: GpuProfile, num_gpu: int, sources: dict[str, bytes],
                   passes: list[str], shards: list[dict], kernels: list[dict] | None = None,
                   launches: list[dict] | None = None, plan: dict | None = None, weights: dict | None = None,
                   ranges: dict[str, list[int]] | None = None, consts: dict | None = None,
                   state: Any = None) -> dict:
    """`plan`: the SPMD plan of a many-GPU engine; `weights` (imported models): {"path", "sha256",
    "tensors": [{name, dtype, shape}]}, the INPUTs the engine binds itself, left out of the entry
    signature; `ranges`: [lo, hi) of integer inputs used as indices (checked before a run);
    `profile`: the target's, recorded whole so a deploy host needs no hw/ directory; `consts`: the
    file constants overridden (`xgc --const`), recorded only when there are any, so that the
    sources rebuild the engine; `state` (frontend/state.py `StatePlan`): a training step's outputs
    that feed its inputs at the next step, and its step counters, recorded only when there are any
    (`entry.state`, `entry.counters`), so engines without state keep their bytes."""
    bound = {t["name"] for t in weights["tensors"]} if weights else set()
    ranges = ranges or {}
    inputs = [{"name": name, **_tensor_sig(graph, nid), **({"range": list(ranges[name])} if name in ranges else {})}
              for name, nid in graph.inputs if name not in bound]
    manifest = {
        "format_version": FORMAT_VERSION,
        "toolchain": {"xg": __version__, "triton": _triton_version()},
        "target": profile.name,
        "target_profile": profile.to_dict(),
        "num_gpu": num_gpu,
        "entry": {
            "inputs": inputs,
            "output": _output_sig(graph, graph.output),
        },
        "sharding": shards,
        "sharding_plan": plan,       # passes/shard.py's plan_of: layouts, collectives, bytes, footprint
        "kernels": kernels or [],
        "launches": launches or [],
        "program": {"path": "program.json", "sha256": sha256(program_blob), "passes": passes},
        "sources": [{"path": f"sources/{name}", "sha256": sha256(data)} for name, data in sorted(sources.items())],
    }
    if state is not None and state.pairs:
        manifest["entry"]["state"] = [{"input": i, "output": o} for i, o in state.pairs]
    if state is not None and state.counters:
        manifest["entry"]["counters"] = list(state.counters)
    if weights:
        manifest["weights"] = weights
    if consts:
        manifest["consts"] = dict(sorted(consts.items()))
    return manifest


# --- reading: what a manifest from an untrusted file must hold before anything uses it -----------

MAX_GPUS = 1 << 16
MAX_GPU_MEMORY = 1 << 44         # bytes of one GPU's memory: 16 TiB, far past any made


def check_manifest(manifest: dict, graph: Graph, entries: set[str], where: str) -> None:
    """Refuse, as an `EngineError`, a manifest that disagrees with its program or that declares
    what no build makes: the entry signature must be the program's inputs (less the weights it
    binds, which must be inputs too), every tensor no larger than the target's memory, every path
    an entry of the bundle. `graph` is verified already, so its shapes are sound."""
    def bad(detail: str) -> EngineError:
        return EngineError(f"{where}: malformed manifest ({detail})")

    num_gpu = manifest.get("num_gpu")
    if type(num_gpu) is not int or not 1 <= num_gpu <= MAX_GPUS:
        raise bad(f"num_gpu is {str(num_gpu)[:40]}, not an integer in [1, {MAX_GPUS}]")
    profile = manifest.get("target_profile")
    memory = profile.get("hbm_bytes") if isinstance(profile, dict) else None
    if type(memory) is not int or not 0 < memory <= MAX_GPU_MEMORY:
        raise bad(f"the target's hbm_bytes is {str(memory)[:40]}, not an integer in [1, {MAX_GPU_MEMORY}]")
    weights = manifest.get("weights")
    bound = {}
    if weights is not None:
        if not isinstance(weights, dict) or not isinstance(weights.get("tensors"), list):
            raise bad("weights is not an object with a list of tensors")
        bound = {t.get("name"): t for t in weights["tensors"] if isinstance(t, dict)}
        if len(bound) != len(weights["tensors"]):
            raise bad("the weights' tensors are not distinct objects with names")
    entry = manifest.get("entry")
    declared = entry.get("inputs") if isinstance(entry, dict) else None
    if not isinstance(declared, list):
        raise bad("entry.inputs is not a list")
    free = [(name, nid) for name, nid in graph.inputs if name not in bound]
    if len(declared) != len(free):
        raise bad(f"entry.inputs lists {len(declared)} inputs, the program takes {len(free)}")
    for spec, (name, nid) in zip(declared, free):
        node = graph.node(nid)
        if not isinstance(spec, dict) or (spec.get("name"), spec.get("dtype"), spec.get("shape")) != \
                (name, node.dtype, list(node.shape)):
            raise bad(f"entry.inputs declares {str(spec)[:80]}, the program's input is "
                      f"{name}: {node.dtype}{list(node.shape)}")
        span = spec.get("range")
        if span is not None and not (isinstance(span, list) and len(span) == 2
                                     and all(type(v) is int for v in span) and span[0] < span[1]):
            raise bad(f"input {name!r} has a malformed range")
    inputs = dict(graph.inputs)
    for name, spec in bound.items():
        node = graph.node(inputs[name]) if name in inputs else None
        if node is None or (spec.get("dtype"), spec.get("shape")) != (node.dtype, list(node.shape)):
            raise bad(f"weights declare {str(name)[:40]!r} as {spec.get('dtype')}{spec.get('shape')}, "
                      "which is not an input of the program")
    problem = state_problem(entry, graph)
    if problem:
        raise bad(problem)
    consts = manifest.get("consts", {})
    # A value is a number or a boolean, or a dtype name (`COMPUTE=float32`, frontend/precision.py).
    if not isinstance(consts, dict) or not all(isinstance(k, str) and (type(v) in (int, float, bool) or (
            isinstance(v, str) and v.isidentifier() and len(v) <= 32)) for k, v in consts.items()):
        raise bad("consts is not an object of constant names to numbers, booleans or dtype names")
    check_sizes(graph, manifest, where)
    for path in _paths(manifest):
        if not isinstance(path, str) or path not in entries:
            raise bad(f"it names {str(path)[:80]!r}, which is not an entry of the bundle")


def state_problem(entry: dict, graph: Graph) -> str | None:
    """What is wrong with the entry's state pairs and counters (None: nothing; an engine from
    before them has neither): each pair an input and an output leaf of one dtype and shape, each
    input and counter once, every counter a scalar input."""
    pairs, counters = entry.get("state", []), entry.get("counters", [])
    if not isinstance(pairs, list) or not isinstance(counters, list):
        return "entry.state or entry.counters is not a list"
    inputs = {name: _tensor_sig(graph, nid) for name, nid in graph.inputs}
    outputs = {name: _tensor_sig(graph, nid) for name, nid in _leaves(graph.output)} if pairs else {}
    seen: set = set()
    for pair in pairs:
        if not isinstance(pair, dict) or not all(isinstance(pair.get(k), str) for k in ("input", "output")):
            return f"entry.state holds {str(pair)[:80]}, not an input and an output"
        name, out = pair["input"], pair["output"]
        if name in seen or name not in inputs or out not in outputs:
            return f"entry.state pairs {name[:40]!r} with {out[:40]!r}: not a distinct input and an output"
        if inputs[name] != outputs[out]:
            return (f"entry.state pairs input {name!r} ({inputs[name]}) with output {out!r} "
                    f"({outputs[out]}) of another dtype or shape")
        seen.add(name)
    for name in counters:
        if not isinstance(name, str) or name in seen or name not in inputs or inputs[name]["shape"]:
            return f"entry.counters names {str(name)[:40]!r}, not a scalar input of its own"
        seen.add(name)
    return None


def _leaves(tree: dict, prefix: str = "out") -> list[tuple[str, int]]:
    """The program's output leaves as (name, node id), named as the runtime names them (`out`,
    `out_0`, `out_1_0`, ...); none inside a Result (state never passes through one)."""
    if "t" in tree:
        return [(prefix, tree["t"])]
    if "tuple" in tree:
        return [leaf for i, t in enumerate(tree["tuple"]) for leaf in _leaves(t, f"{prefix}_{i}")]
    return []


def check_sizes(graph: Graph, manifest: dict, where: str) -> None:
    """Refuse a node whose dims are not sizes, or whose fixed dims make it larger than all the
    target's GPUs together (`manifest` checked already). xgc refuses a plan that overflows the
    target's memory, so no real engine has one; a forged shape is refused here before anything
    allocates it. The runtime calls it again once symbolic dims take the inputs' sizes."""
    limit = manifest["target_profile"]["hbm_bytes"] * manifest["num_gpu"]
    for n in graph.nodes:
        problem = shape_problem(n.shape)
        if problem:
            raise EngineError(f"{where}: node %{n.id} ({n.op.value}) has a malformed shape ({problem})")
        size = math.prod(d for d in n.shape if isinstance(d, int)) * ITEMSIZE[n.dtype]
        if size > limit:
            raise EngineError(f"{where}: node %{n.id} ({n.op.value}) is {n.dtype}{list(n.shape)}, "
                              f"{size} bytes, more than the {limit} bytes of memory of the target's GPUs")


def _paths(manifest: dict) -> list:
    """Every entry path the manifest names (the program, sources, kernels, weights)."""
    try:
        paths = [manifest["program"]["path"]]
        paths += [s["path"] for s in manifest["sources"]]
        paths += [v[what] for k in manifest.get("kernels", []) for v in k["variants"] for what in ("cubin", "ptx")]
        if manifest.get("weights") is not None:
            paths.append(manifest["weights"]["path"])
    except (KeyError, TypeError, IndexError, AttributeError) as exc:
        raise ValueError(f"{type(exc).__name__}: {exc}") from None
    return paths


def _triton_version() -> str:
    """Triton's version, for a manifest being built (imported here: reading an engine needs no Triton)."""
    import triton
    return triton.__version__
