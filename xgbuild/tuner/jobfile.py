"""Tuning jobs and their results as files: what lets a build system fan tuning out as actions.

A program's jobs are split into a fixed number of shards by a stable hash of each job's identity,
so editing one function changes only the shards whose jobs changed, and a build system that caches
actions by their inputs (Bazel) re-tunes only those. Three steps, each a pure function of its inputs:

    jobs:   program + target + dims          -> shard files (self-contained jobs: spec, shape, graph)
    tune:   one shard file + policy          -> one result file (winners, compiled cubins and PTX)
    link:   program + every result file      -> the engine's kernel table (nothing tuned or compiled)

Both file kinds are canonical JSON (sorted keys, no timestamps, paths or host names), so equal
inputs give equal bytes on any machine.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import XGError

if TYPE_CHECKING:
    from .jobs import Job

SHARD_FORMAT = "xg-tune-shard/1"
RESULT_FORMAT = "xg-tune-result/1"


class JobFileError(XGError):
    """A shard or result file that is missing, malformed, or made for another build."""


def shard_of(ident: str, shards: int) -> int:
    """The shard a job belongs to: stable across programs, edits and machines."""
    return int.from_bytes(hashlib.sha256(ident.encode()).digest()[:8], "big") % shards


def canonical_bytes(doc: Any) -> bytes:
    return (json.dumps(doc, sort_keys=True, separators=(",", ":"), allow_nan=False) + "\n").encode()


def _layout_json(lay: Any) -> Any:
    return lay if lay == "dense" else list(lay)


def _layout_from(lay: Any) -> Any:
    if lay == "dense":
        return lay
    if not isinstance(lay, list) or not all(s in (0, 1, None) for s in lay):
        raise JobFileError(f"malformed operand layout {lay!r}")
    return tuple(lay)


def job_to_json(job: "Job") -> dict:
    from ..compiler.ir.serialize import to_json as graph_to_json
    out = {"ident": job.ident, "spec": job.spec.canonical(), "problem": dataclasses.asdict(job.problem),
           "layouts": [_layout_json(lay) for lay in job.layouts], "sizes": dict(sorted(job.sizes.items())),
           "max_extent": job.max_extent, "graph": graph_to_json(job.graph),
           "sites": [[b.to_json(), list(nodes)] for b, nodes in job.sites]}
    if job.misaligned:
        out["misaligned"] = True
    return out


def job_from_json(d: dict) -> "Job":
    # Imported here: reading a shard with no jobs must not pay for importing torch.
    from ..compiler.codegen.spec import Binding, KernelSpec
    from ..compiler.ir.serialize import from_json as graph_from_json
    from .jobs import Job
    from ..compiler.codegen.templates import template
    from ..compiler.codegen.templates.base import Problem
    try:
        problem = Problem(**d["problem"])
        template(problem.kind)          # an unknown kernel kind is a malformed job, found at load
        job = Job(KernelSpec.from_canonical(d["spec"]), problem,
                  tuple(_layout_from(lay) for lay in d["layouts"]),
                  {str(k): int(v) for k, v in d["sizes"].items()}, graph_from_json(d["graph"]),
                  [(Binding.from_json(b), [int(n) for n in nodes]) for b, nodes in d["sites"]],
                  max_extent=int(d["max_extent"]), misaligned=d.get("misaligned", False) is True)
    except JobFileError:
        raise
    except XGError as exc:
        raise JobFileError(f"malformed job: {exc}") from None
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise JobFileError(f"malformed job: {type(exc).__name__}: {exc}") from None
    if job.ident != d.get("ident"):
        # The identity is recomputed, never trusted: a job edited by hand or written by another
        # version of XG would otherwise be linked under a name it does not have.
        raise JobFileError(f"job {d.get('ident')!r} does not match its own contents (recomputed {job.ident!r}); "
                           f"was it written by another version of XG?")
    return job


def portable(job: "Job") -> "Job":
    """The job with only the part of the program its tuning reads, renumbered from 0 and without
    source positions: its first site's kernel nodes, what they read, and the views those values are
    taken through. An edit elsewhere in the program (or one that only moves code) leaves the shard
    file's bytes, and so a build system's cached tuning action, unchanged."""
    from ..compiler.codegen.schedule import VIEWS
    from ..compiler.codegen.spec import Binding
    from ..compiler.ir.graph import Graph, Node, Op, attrs_of
    from .jobs import Job
    graph = job.graph
    binding, nodes = job.sites[0]
    need: set[int] = set()
    stack = [*nodes, *binding.operands, *binding.outputs, binding.domain]
    stack += [i for nid in nodes for i in graph.node(nid).inputs]
    while stack:
        nid = stack.pop()
        if nid not in need:
            need.add(nid)
            if graph.node(nid).op in VIEWS:
                stack.extend(graph.node(nid).inputs)
    new = {n.id: i for i, n in enumerate(n for n in graph.nodes if n.id in need)}
    kept = []
    for n in graph.nodes:
        if n.id not in need:
            continue
        if all(i in need for i in n.inputs):
            kept.append(Node(new[n.id], n.op, tuple(new[i] for i in n.inputs), n.dtype, n.shape, n.attrs, None))
        else:
            # A value the kernel reads but does not compute: tuning fills it with seeded random data
            # whatever computed it, so it becomes an input of the job's graph.
            kept.append(Node(new[n.id], Op.INPUT, (), n.dtype, n.shape, attrs_of(name=f"v{new[n.id]}"), None))
    inputs = tuple((n.attr("name"), n.id) for n in kept if n.op is Op.INPUT)
    sub = Graph(f"job:{job.ident}", tuple(kept), inputs, {"tuple": []})
    site = Binding(tuple(new[i] for i in binding.operands), tuple(new[i] for i in binding.outputs),
                   new[binding.domain], binding.domain_from, binding.perm)
    return Job(job.spec, job.problem, job.layouts, dict(job.sizes), sub, [(site, [new[i] for i in nodes])],
               max_extent=job.max_extent, misaligned=job.misaligned)


def shard_docs(jobs: list["Job"], target: str, shards: int) -> list[dict]:
    """The shard files' contents: every job in exactly one shard, each shard's jobs sorted."""
    if shards < 1:
        raise JobFileError(f"shards must be at least 1, got {shards}")
    buckets: list[list["Job"]] = [[] for _ in range(shards)]
    for job in jobs:
        buckets[shard_of(job.ident, shards)].append(job)
    return [{"format": SHARD_FORMAT, "target": target, "shard": i, "shards": shards,
             "jobs": [job_to_json(portable(j)) for j in sorted(b, key=lambda j: j.ident)]}
            for i, b in enumerate(buckets)]


def _read_json(path: Path, kind: str) -> dict:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise JobFileError(f"{kind} file {str(path)!r} does not exist") from None
    except OSError as exc:
        raise JobFileError(f"cannot read {kind} file {str(path)!r}: {exc.strerror or exc}") from None
    try:
        doc = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise JobFileError(f"{kind} file {str(path)!r} is not JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise JobFileError(f"{kind} file {str(path)!r} is not a JSON object")
    return doc


def read_shard(path: Path) -> tuple[str, list[dict]]:
    """(target, raw jobs) of a shard file. Jobs are decoded lazily by `job_from_json`: an empty
    shard is answered without importing torch."""
    doc = _read_json(path, "shard")
    if doc.get("format") != SHARD_FORMAT:
        raise JobFileError(f"{str(path)!r} is not a tuning shard (format {doc.get('format')!r}, "
                           f"expected {SHARD_FORMAT!r})")
    jobs = doc.get("jobs")
    if not isinstance(doc.get("target"), str) or not isinstance(jobs, list):
        raise JobFileError(f"shard file {str(path)!r} is malformed")
    return doc["target"], jobs


def result_doc(target: str, arch: int, entries: dict[str, dict], files: dict[str, bytes]) -> dict:
    return {"format": RESULT_FORMAT, "target": target, "arch": arch,
            "kernels": dict(sorted(entries.items())),
            "files": {p: base64.b64encode(b).decode() for p, b in sorted(files.items())}}


def read_results(paths: list[Path], target: str, arch: int) -> tuple[dict[str, dict], dict[str, bytes]]:
    """Every result file's kernel entries and files, checked to be for this target's arch."""
    entries: dict[str, dict] = {}
    files: dict[str, bytes] = {}
    for path in paths:
        doc = _read_json(path, "tuning result")
        if doc.get("format") != RESULT_FORMAT:
            raise JobFileError(f"{str(path)!r} is not a tuning result (format {doc.get('format')!r}, "
                               f"expected {RESULT_FORMAT!r})")
        if doc.get("arch") != arch or doc.get("target") != target:
            raise JobFileError(f"tuning result {str(path)!r} was made for {doc.get('target')} "
                               f"(sm_{doc.get('arch')}), not {target} (sm_{arch}); tune again for this target")
        try:
            for ident, entry in doc["kernels"].items():
                entries[str(ident)] = dict(entry)
            for p, b64 in doc["files"].items():
                files[str(p)] = base64.b64decode(b64, validate=True)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise JobFileError(f"tuning result {str(path)!r} is malformed ({type(exc).__name__}: {exc})") from None
    for ident, entry in entries.items():
        for v in entry.get("variants", []):
            for kind in ("cubin", "ptx"):
                blob = files.get(v.get(kind, ""))
                if blob is None or hashlib.sha256(blob).hexdigest() != v.get(f"{kind}_sha256"):
                    raise JobFileError(f"tuning results: the {kind} of kernel {ident} is missing or corrupt")
    return entries, files
