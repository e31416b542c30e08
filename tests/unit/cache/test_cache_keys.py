"""Cache keys: every named part gives the same key for the same inputs and a new key when changed."""

from __future__ import annotations

import hashlib
import json
import math
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from .cache_helpers import REPO, TOOLCHAIN, make_key
from xgbuild.cache import CacheKey, KeyPartError, diff_keys, explain
from xgbuild.cache import fingerprint
from xgbuild.cache.canonical import canonical_json
from xgbuild.cache.keys import ABSENT, part_names

# For each part: a value, the same value built in another order, and a changed value.
PARTS = {
    "kernel_ir": (
        {"ops": ["load", "dot", "store"], "attrs": {"acc": "fp32", "trans_b": False}},
        {"attrs": {"trans_b": False, "acc": "fp32"}, "ops": ["load", "dot", "store"]},
        {"ops": ["load", "dot", "relu", "store"], "attrs": {"acc": "fp32", "trans_b": False}},
    ),
    "shapes": (
        {"A": [128, 64], "B": [64, 32]},
        {"B": [64, 32], "A": [128, 64]},
        {"A": [128, 64], "B": [64, 33]},
    ),
    "dtypes": (
        {"A": "float16", "B": "float16", "out": "float32"},
        {"out": "float32", "B": "float16", "A": "float16"},
        {"A": "bfloat16", "B": "float16", "out": "float32"},
    ),
    "gpu_profile": (
        {"name": "H100", "sm": 90, "sms": 132, "hbm_gbps": 3350.0},
        {"hbm_gbps": 3350.0, "sms": 132, "sm": 90, "name": "H100"},
        {"name": "GB200", "sm": 100, "sms": 148, "hbm_gbps": 8000.0},
    ),
    "search_space": (
        {"BLOCK_M": [64, 128], "num_warps": [4, 8], "num_stages": [3]},
        {"num_stages": [3], "num_warps": [4, 8], "BLOCK_M": [64, 128]},
        {"BLOCK_M": [64, 128, 256], "num_warps": [4, 8], "num_stages": [3]},
    ),
    "policy": (
        {"mode": "measure", "repeats": 50, "warmup": 10},
        {"warmup": 10, "repeats": 50, "mode": "measure"},
        {"mode": "predict", "repeats": 50, "warmup": 10},
    ),
    "toolchain": (
        dict(TOOLCHAIN),
        dict(reversed(list(TOOLCHAIN.items()))),
        {**TOOLCHAIN, "triton": "3.5.1"},
    ),
    "kind": ("tuned-kernel", "tuned-kernel", "compiled-cubin"),
}


def key_with(part: str, variant: int) -> CacheKey:
    base = {name: values[0] for name, values in PARTS.items()}
    base[part] = PARTS[part][variant]
    return CacheKey(**base)


def test_every_named_part_is_covered():
    assert set(PARTS) == set(part_names())


@pytest.mark.parametrize("part", sorted(PARTS))
def test_same_inputs_give_the_same_key(part):
    assert key_with(part, 0).digest == key_with(part, 0).digest
    # The same content built in another dict order hashes the same.
    assert key_with(part, 1).digest == key_with(part, 0).digest


@pytest.mark.parametrize("part", sorted(PARTS))
def test_changing_a_part_changes_the_key(part):
    changed = key_with(part, 2)
    assert changed.digest != key_with(part, 0).digest
    assert {d.path.split(".")[0] for d in diff_keys(key_with(part, 0), changed)} == {part}


_CHILD = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, sys.argv[1])
    sys.path.insert(0, sys.argv[2])
    from cache.test_cache_keys import PARTS, key_with
    print(json.dumps({p: [key_with(p, v).digest for v in range(3)] for p in PARTS}))
""")


@pytest.fixture(scope="module")
def digests_in_other_processes() -> list[dict]:
    out = []
    for seed in ("0", "4242"):
        env = {"PYTHONHASHSEED": seed, "PATH": "/usr/bin:/bin"}
        proc = subprocess.run(
            [sys.executable, "-c", _CHILD, str(REPO), str(Path(__file__).parent.parent)],
            capture_output=True, text=True, env=env, timeout=60,
        )
        assert proc.returncode == 0, proc.stderr
        out.append(json.loads(proc.stdout))
    return out


@pytest.mark.parametrize("part", sorted(PARTS))
def test_key_is_the_same_in_another_process_and_hash_seed(part, digests_in_other_processes):
    here = [key_with(part, v).digest for v in range(3)]
    for there in digests_in_other_processes:
        assert there[part] == here


GOLDEN_CANONICAL = (
    b'{"format":"xg-cache-key/1","parts":{"dtypes":{"A":"float16","B":"float16","out":"float32"},'
    b'"gpu_profile":{"name":"H100","sm":90,"smem_per_sm":232448},"kernel_ir":{"id":0,"ops":'
    b'["load","dot","store"]},"kind":"tuned-kernel","policy":{"mode":"measure","repeats":50},'
    b'"search_space":{"BLOCK_M":[64,128],"num_warps":[4,8]},"shapes":{"A":[128,64],"B":[64,32]},'
    b'"toolchain":{"cuda":"13.0","python":"3.11","triton":"3.6.0","xg_source":"' + b"0" * 64 + b'"}}}'
)


def test_key_format_is_stable():
    # Golden bytes: if these change, every stored cache stops matching. Bump KEY_FORMAT if it must.
    key = make_key(0)
    assert key.canonical == GOLDEN_CANONICAL
    assert key.digest == hashlib.sha256(GOLDEN_CANONICAL).hexdigest()
    assert key.digest == "d161e6d23e877ccdce606ef734c716b0220ef9c7e49b37aad7237ccb5b98c84b"


def test_canonical_form_sorted_compact_ascii():
    assert canonical_json({"b": 1, "a": [1.5, "é", None, True]}) == b'{"a":[1.5,"\\u00e9",null,true],"b":1}'


@pytest.mark.parametrize("bad", [
    {1, 2}, b"bytes", float("nan"), math.inf, -math.inf, {1: "int key"}, object(), {"a": {"b": {3}}},
])
def test_values_without_a_canonical_form_are_refused(bad):
    with pytest.raises(KeyPartError):
        make_key(shapes=bad)


def test_numpy_scalars_are_refused_not_stringified():
    np = pytest.importorskip("numpy")
    with pytest.raises(KeyPartError, match="float32"):
        make_key(shapes={"A": [np.float32(1.0)]})


def test_types_are_part_of_the_key():
    assert make_key(shapes=[1]).digest != make_key(shapes=[1.0]).digest
    assert make_key(shapes=[1]).digest != make_key(shapes=[True]).digest
    assert make_key(shapes=[1]).digest != make_key(shapes=["1"]).digest
    # A tuple and a list are the same JSON array.
    assert make_key(shapes=(1, 2)).digest == make_key(shapes=[1, 2]).digest


def test_a_built_key_is_immutable():
    shapes = {"A": [128, 64]}
    key = make_key(shapes=shapes)
    before = key.digest
    shapes["A"].append(1)
    shapes["B"] = [1]
    assert make_key(shapes={"A": [128, 64]}).digest == before == key.digest
    with pytest.raises(TypeError):
        key.shapes["A"] = [1]
    with pytest.raises(AttributeError):
        key.shapes = {}


def test_payload_round_trip_and_strict_parts():
    key = make_key(3)
    assert CacheKey.from_payload(json.loads(key.canonical)) == key
    payload = json.loads(key.canonical)
    payload["parts"]["hostname"] = "node17"
    with pytest.raises(KeyPartError, match="exactly"):
        CacheKey.from_payload(payload)
    del payload["parts"]["hostname"], payload["parts"]["policy"]
    with pytest.raises(KeyPartError):
        CacheKey.from_payload(payload)


def test_default_toolchain_is_the_fingerprint():
    key = CacheKey(kernel_ir="x", shapes=[], dtypes=[], gpu_profile={}, search_space={}, policy="cache")
    assert dict(key.toolchain) == dict(fingerprint.toolchain_fingerprint())


def test_explain_lists_every_part():
    lines = explain(make_key(1))
    assert lines[0] == f"key {make_key(1).digest}"
    assert [line.split(":")[0].strip() for line in lines[1:]] == list(part_names())


def test_diff_names_the_nested_field_and_absent_fields():
    a = make_key(gpu_profile={"name": "H100", "sm": 90})
    b = make_key(gpu_profile={"name": "H100", "sm": 100, "l2_mb": 50})
    diffs = {d.path: (d.left, d.right) for d in diff_keys(a, b)}
    assert diffs == {"gpu_profile.sm": (90, 100), "gpu_profile.l2_mb": (ABSENT, 50)}
    assert diff_keys(a, a) == []


# -- the toolchain fingerprint -------------------------------------------------------------

def _copy_sources(dest: Path) -> Path:
    shutil.copytree(REPO / "xgbuild", dest, ignore=shutil.ignore_patterns("__pycache__"))
    return dest


def test_source_hash_is_path_independent(tmp_path):
    a = _copy_sources(tmp_path / "one" / "xgbuild")
    b = _copy_sources(tmp_path / "elsewhere" / "deeper" / "xgbuild")
    assert fingerprint.source_digest(a) == fingerprint.source_digest(b)


def test_source_hash_changes_with_any_source_edit(tmp_path):
    a = _copy_sources(tmp_path / "a")
    before = fingerprint.source_digest(a)
    b = _copy_sources(tmp_path / "b")
    target = b / "cache" / "keys.py"
    target.write_text(target.read_text() + "\n# an edit\n")
    assert fingerprint.source_digest(b) != before
    c = _copy_sources(tmp_path / "c")
    (c / "cache" / "keys.py").rename(c / "cache" / "keys2.py")   # a rename alone changes it
    assert fingerprint.source_digest(c) != before


def test_source_hash_ignores_bytecode_and_non_sources(tmp_path):
    a = _copy_sources(tmp_path / "a")
    before = fingerprint.source_digest(a)
    b = _copy_sources(tmp_path / "b")
    (b / "cache" / "__pycache__").mkdir()
    (b / "cache" / "__pycache__" / "keys.cpython-311.pyc").write_bytes(b"\0junk")
    (b / "notes.txt").write_text("not a source")
    assert fingerprint.source_digest(b) == before


def test_toolchain_names_its_components():
    tc = fingerprint.toolchain_fingerprint()
    assert set(tc) == {"xg_source", "triton", "cuda", "python"}
    assert tc["python"] == f"{sys.version_info.major}.{sys.version_info.minor}"
    assert len(tc["xg_source"]) == 64
    import importlib.metadata
    assert tc["triton"] == importlib.metadata.version("triton")
