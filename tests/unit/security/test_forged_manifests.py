"""Forged engines that are sealed correctly (written with the packager's own writer) but whose
manifest, program or weights lie: huge, negative and non-integer dims, deep and huge JSON, a
signature that is not the program's, garbage weights, repeated references. Each is refused by
verification, in one `EngineError` line (or one `error:` line from `xgrun`), before anything
allocates the shapes it declares, and in bounded time."""

from __future__ import annotations

import json
import time

import pytest
import torch

from .bombs_support import Forger, assert_refused, build_engine, xgrun
from xgbuild.errors import EngineError
from xgbuild.packager.engine_file import read_engine
from xgbuild.packager.manifest import sha256
from xgbuild.packager.weights import weights_blob
from xgbuild.runtime.engine import Engine


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    return build_engine(tmp_path_factory.mktemp("engine"))


@pytest.fixture(scope="module")
def forger(engine):
    return Forger.of(engine)


def refused(path, *needles: str) -> str:
    started = time.monotonic()
    with pytest.raises(EngineError) as caught:
        read_engine(path)
    assert time.monotonic() - started < 10
    message = str(caught.value)
    assert message.startswith(f"engine {path}") and "\n" not in message and len(message) < 600, message
    for needle in needles:
        assert needle in message, message
    return message


def with_dim(forger: Forger, value, *, consistent: bool):
    """The program with A's first dim set to `value`; `consistent`: the matmul's and the manifest's
    shapes too, so that only the value itself is wrong (as a careful forger would)."""
    program, manifest = forger.program(), forger.manifest()
    program["nodes"][0]["shape"][0] = value
    if consistent:
        program["nodes"][2]["shape"][0] = value
        manifest["entry"]["inputs"][0]["shape"][0] = value
        manifest["entry"]["output"]["tensor"]["shape"][0] = value
    return manifest, program


@pytest.mark.parametrize("value, needle", [
    (-5, "dim -5 is outside"),
    (10**40, "(41 digits) is outside"),
    (2**62, "is outside"),
    (1e11, "dim '100000000000.0' is not an integer"),
    (1.5, "dim '1.5' is not an integer"),
    (True, "dim 'True' is not an integer"),
    ([4], "is not an integer or a symbol"),
    ("N; import os", "is not a symbolic size"),
    ("x" * 500, "is not a symbolic size"),
])
def test_bad_dims_in_the_program_are_refused(tmp_path, forger, value, needle):
    manifest, program = with_dim(forger, value, consistent=True)
    refused(forger.write(tmp_path / "e.xge", manifest=manifest, program=program), "invalid program", needle)


@pytest.mark.timeout(60)
def test_a_consistent_huge_dim_is_refused_by_the_targets_memory(tmp_path, forger):
    # 10^11 x 8 float32: 3.2 TB, a plausible integer in every field, more than the H100 holds.
    manifest, program = with_dim(forger, 10**11, consistent=True)
    path = forger.write(tmp_path / "e.xge", manifest=manifest, program=program)
    refused(path, "node %0 (input) is float32[100000000000, 8]", "more than the 80000000000 bytes")
    assert_refused(xgrun(path), "more than the 80000000000 bytes")


def test_a_huge_rank_is_refused(tmp_path, forger):
    program = forger.program()
    program["nodes"][0]["shape"] = [1] * 1000
    refused(forger.write(tmp_path / "e.xge", program=program), "rank 1000, over the limit")


@pytest.mark.parametrize("value", [-5, 10**11, 1.5, "M"])
def test_a_signature_that_is_not_the_programs_is_refused(tmp_path, forger, value):
    # Without --inputs, xgrun would allocate random inputs of the manifest's shapes.
    manifest = forger.manifest()
    manifest["entry"]["inputs"][0]["shape"][0] = value
    path = forger.write(tmp_path / "e.xge", manifest=manifest)
    refused(path, "malformed manifest", "the program's input is A: float32[4, 8]")


@pytest.mark.timeout(60)
def test_xgrun_refuses_a_forged_signature_with_one_line(tmp_path, forger):
    manifest = forger.manifest()
    manifest["entry"]["inputs"][0]["shape"] = [10**11, 8]
    assert_refused(xgrun(forger.write(tmp_path / "e.xge", manifest=manifest)), "malformed manifest")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("where", ["manifest", "program", "output-tree"])
def test_json_nested_100k_deep_is_refused_before_parsing(tmp_path, forger, where):
    deep = "[" * 100_000 + "]" * 100_000
    if where == "manifest":
        path = forger.write(tmp_path / "e.xge", raw_manifest=('{"format_version":1,"x":' + deep + "}").encode())
        needle = "manifest.json nests 100001 levels deep"
    elif where == "program":
        path = forger.write(tmp_path / "e.xge", program=deep.encode())
        needle = "program IR nests 100000 levels deep"
    else:
        program = forger.program()
        program["output"] = "@"
        tree = '{"tuple":[' * 50_000 + '{"t":2}' + "]}" * 50_000
        path = forger.write(tmp_path / "e.xge", program=json.dumps(program).replace('"@"', tree).encode())
        needle = "levels deep, over the limit"
    refused(path, needle)
    assert_refused(xgrun(path), needle)


@pytest.mark.timeout(60)
def test_json_of_millions_of_tiny_values_is_refused_before_parsing(tmp_path, forger):
    # 15 MB of `[],` would become millions of list objects, gigabytes of Python memory.
    swarm = b'{"format":1,"nodes":[' + b"[]," * 5_000_000 + b"[]]}"
    refused(forger.write(tmp_path / "e.xge", program=swarm), "JSON values, over the limit")


def test_repeated_references_to_a_large_entry_cost_one_hash(tmp_path, forger):
    # 100k kernel variants naming the same 8 MiB entry: the digests come from the bundle's index,
    # hashed once, not 100k times.
    manifest = forger.manifest()
    blob = bytes(range(256)) * (1 << 15)
    digest = sha256(blob)
    variant = {"arch": 90, "cubin": "kernels/k.cubin", "cubin_sha256": digest,
               "ptx": "kernels/k.cubin", "ptx_sha256": digest}
    manifest["kernels"] = [{"key": "k", "variants": [variant] * 100_000}]
    path = forger.write(tmp_path / "e.xge", manifest=manifest, files={"kernels/k.cubin": blob})
    started = time.monotonic()
    read_engine(path)
    assert time.monotonic() - started < 10


def test_a_path_that_is_not_an_entry_is_refused(tmp_path, forger):
    manifest = forger.manifest()
    manifest["sources"].append({"path": "sources/missing.xg", "sha256": "0" * 64})
    refused(forger.write(tmp_path / "e.xge", manifest=manifest), "malformed manifest")


@pytest.mark.parametrize("value", [0, -1, 10**9, "8", None])
def test_a_forged_gpu_count_is_refused(tmp_path, forger, value):
    manifest = forger.manifest()
    manifest["num_gpu"] = value
    refused(forger.write(tmp_path / "e.xge", manifest=manifest), "malformed manifest", "num_gpu")


def test_a_forged_target_memory_is_refused(tmp_path, forger):
    manifest = forger.manifest()
    manifest["target_profile"]["hbm_bytes"] = 10**40
    refused(forger.write(tmp_path / "e.xge", manifest=manifest), "hbm_bytes")


# --- weights --------------------------------------------------------------------------------------

def weighted(forger: Forger, blob: bytes, declared: list[dict]) -> tuple[dict, dict]:
    """The manifest and program with input B bound by weights (`declared`) held in `blob`."""
    manifest = forger.manifest()
    manifest["entry"]["inputs"] = manifest["entry"]["inputs"][:1]
    manifest["weights"] = {"path": "weights.safetensors", "sha256": sha256(blob), "tensors": declared}
    return manifest, forger.program()


_LYING = b'{"B":{"dtype":"F32","shape":[8,2],"data_offsets":[0,8]}}'     # needs 64 bytes, 8 given
_SHORT = b'{"B":{"dtype":"F32","shape":[8,2],"data_offsets":[0,64]}}'    # the 64 bytes are missing
B_DECLARED = [{"name": "B", "dtype": "float32", "shape": [8, "N"]}]


@pytest.mark.parametrize("blob, needle", [
    (b"garbage, not safetensors at all", "is not a valid safetensors file"),
    ((2**60).to_bytes(8, "little") + b"{}", "its header claims 1152921504606846976 bytes"),
    (b"\x10\x00\x00\x00\x00\x00\x00\x00" + b"[" * 16, "is not JSON"),
    (len(_LYING).to_bytes(8, "little") + _LYING, "is float32[8, 2], 64 bytes, but its data offsets give 8"),
    (len(_SHORT).to_bytes(8, "little") + _SHORT, f"its header accounts for {len(_SHORT) + 72} bytes, but the "
                                                 f"file has {len(_SHORT) + 8}"),
])
def test_garbage_weights_are_refused(tmp_path, forger, blob, needle):
    manifest, program = weighted(forger, blob, B_DECLARED)
    path = forger.write(tmp_path / "e.xge", manifest=manifest, program=program, files={"weights.safetensors": blob})
    refused(path, "weights.safetensors", needle)


def test_weights_that_are_not_what_the_manifest_declares_are_refused(tmp_path, forger):
    blob, _ = weights_blob({"B": torch.zeros(8, 3)})
    manifest, program = weighted(forger, blob, [{"name": "B", "dtype": "float32", "shape": [8, 2]}])
    path = forger.write(tmp_path / "e.xge", manifest=manifest, program=program, files={"weights.safetensors": blob})
    refused(path, "malformed manifest")          # [8, 2] is not the program's B [8, N]
    manifest, program = weighted(forger, blob, B_DECLARED)
    path = forger.write(tmp_path / "e.xge", manifest=manifest, program=program, files={"weights.safetensors": blob})
    refused(path, "weights.safetensors holds 'B' as ('float32', [8, 3])")


def test_sound_weights_still_load_and_run(tmp_path, forger):
    # The forger's own weights, sound and consistent: the checks refuse lies, not weights.
    program = forger.program()
    program["nodes"][1]["shape"] = [8, 3]
    program["nodes"][2]["shape"] = [4, 3]
    blob, entry = weights_blob({"B": torch.ones(8, 3)})
    manifest = forger.manifest()
    manifest["entry"]["inputs"] = manifest["entry"]["inputs"][:1]
    manifest["entry"]["output"]["tensor"]["shape"] = [4, 3]
    manifest["weights"] = entry
    path = forger.write(tmp_path / "e.xge", manifest=manifest, program=program, files={"weights.safetensors": blob})
    result = Engine.load(path).run({"A": torch.ones(4, 8)})
    assert torch.equal(result.value, torch.full((4, 3), 8.0))
