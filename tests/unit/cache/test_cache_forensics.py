"""Cache forensics: predicted records (kept, explained, never a hit, never shadowing a measured one),
key prefixes, the nearest stored key, and naming a key's kernel (issue 25)."""

from __future__ import annotations

import pytest

from .cache_helpers import make_key
from xgbuild.cache import AmbiguousKeyError, CacheError, InvalidDigestError
from xgbuild.cache.forensics import Neighbours, describe, kernel_summary, miss_report, resolve_key

PREDICTED = {"how": "predicted", "config": {"BLOCK_M": 64}, "ms": 0.5, "candidates": 4}
MEASURED = {"how": "measured", "config": {"BLOCK_M": 128}, "ms": 0.1, "measured_on": "H100"}


def test_a_predicted_record_is_stored_and_explained_but_never_a_hit(open_cache):
    cache = open_cache()
    key = make_key(1)
    cache.store(key, PREDICTED)
    assert cache.lookup(key) is None
    record = cache.get_record(key.digest)
    assert record is not None and record.predicted and record.value["config"]["BLOCK_M"] == 64


def test_a_measure_replaces_a_prediction_and_a_prediction_never_replaces_a_measure(open_cache):
    cache = open_cache()
    key = make_key(1)
    cache.store(key, PREDICTED)
    cache.store(key, MEASURED)
    hit = cache.lookup(key)
    assert hit is not None and hit.value["config"]["BLOCK_M"] == 128
    cache.store(key, PREDICTED)             # e.g. a --tune=cache build that started earlier
    hit = cache.lookup(key)
    assert hit is not None and hit.value["how"] == "measured"
    assert not cache.get_record(key.digest).predicted


def test_a_local_prediction_does_not_shadow_a_measured_winner_on_the_remote(open_cache, nginx_cache):
    key = make_key(1)
    gpu_host = open_cache("gpu-host", remote=nginx_cache.url)
    cpu_host = open_cache("cpu-host", remote=nginx_cache.url)
    cpu_host.store(key, PREDICTED)                       # predicted before anyone measured
    assert not (nginx_cache.data / "ac" / key.digest).exists()   # predictions stay on their host
    gpu_host.store(key, MEASURED)
    hit = cpu_host.lookup(key)
    assert hit is not None and hit.source == "remote" and hit.value["how"] == "measured"
    cpu_host.adopt(hit)                                  # once checked by its consumer (the tuner)
    assert not cpu_host.local.get_record(key.digest).predicted   # it replaces the prediction


def _two_keys_sharing_a_prefix(n: int = 4):
    seen = {}
    for i in range(100_000):
        k = make_key(i)
        if k.digest[:n] in seen:
            return seen[k.digest[:n]], k
        seen[k.digest[:n]] = k
    raise AssertionError("unreachable: 65536 prefixes")


def test_key_prefixes_resolve_when_unique_and_fail_clearly_otherwise(local):
    from xgbuild.cache import Cache
    cache = Cache(local)
    a, b = _two_keys_sharing_a_prefix()
    c = make_key(-1)
    for k in (a, b, c):
        cache.store(k, MEASURED)
    assert resolve_key(local, c.digest) == c.digest
    assert resolve_key(local, a.digest[:16]) == a.digest and resolve_key(local, c.digest[:12]) == c.digest
    with pytest.raises(AmbiguousKeyError) as err:
        resolve_key(local, a.digest[:4])
    assert a.digest in str(err.value) and b.digest in str(err.value) and "give more characters" in str(err.value)
    unknown = next(p for p in ("0000", "ffff", "abab") if not any(k.digest.startswith(p) for k in (a, b, c)))
    with pytest.raises(CacheError, match=f"no record in the local cache has a key starting with {unknown}"):
        resolve_key(local, unknown)
    for bad in ("zz", "abc", "ABCD1234", "../../etc/passwd", "a" * 65, ""):
        with pytest.raises(InvalidDigestError):
            resolve_key(local, bad)


def _tuned(i: int, **parts) -> object:
    base = dict(kernel_ir={"kind": "matmul", "id": i}, shapes={"sizes": {"M": 64, "N": 32, "K": 16}, "layouts": []},
                dtypes=["float16", "float16"], gpu_profile={"name": "H100", "sm": 90})
    base.update(parts)
    return make_key(i, **base)


def test_the_nearest_key_has_the_same_kind_and_op_and_the_most_equal_parts(local):
    from xgbuild.cache import Cache
    cache = Cache(local)
    wanted = _tuned(1, toolchain={"triton": "3.6.0", "cuda": "13.0"})
    one_off = _tuned(1, toolchain={"triton": "3.5.1", "cuda": "12.8"})          # 1 part differs (2 fields)
    two_off = _tuned(1, toolchain=dict(wanted.toolchain), shapes={}, gpu_profile={"name": "H200"})   # 2 parts
    other_op = _tuned(1, kernel_ir={"kind": "rowwise", "id": 1})                  # another op: never a neighbour
    predicted = _tuned(1, toolchain={"triton": "3.6.1", "cuda": "13.0"})         # 1 part, 1 field: nearer
    for k in (one_off, two_off, other_op):
        cache.store(k, MEASURED)
    cache.store(predicted, PREDICTED)
    near = Neighbours.of(local).nearest(wanted)
    assert near is not None and near.record.digest == one_off.digest
    assert near.parts == ["toolchain"] and [d.path for d in near.diffs] == ["toolchain.cuda", "toolchain.triton"]
    assert Neighbours.of(local).nearest(wanted, measured_only=False).record.digest == predicted.digest
    assert Neighbours.of(local).nearest(make_key(9, kind="cubin")) is None

    lines = miss_report(wanted, Neighbours.of(local))
    text = "\n".join(lines)
    assert lines[0].startswith(f"key {wanted.digest} (tuned-kernel matmul K=16 M=64 N=32 float16,float16 H100)")
    assert "    toolchain: " in text and "    shapes: " in text
    assert f"nearest stored key {one_off.digest} differs in: toolchain" in text
    assert '      - "3.6.0"\n      + "3.5.1"' in text


def test_describe_names_the_kernel():
    key = _tuned(1)
    assert kernel_summary(key) == {"kind": "tuned-kernel", "op": "matmul", "shape": "K=16 M=64 N=32",
                                   "dtype": "float16,float16", "gpu": "H100"}
    cubin = make_key(2, kernel_ir={"name": "xg_matmul_0123", "source_sha256": "0" * 64}, shapes={}, dtypes={},
                     gpu_profile={"arch": "sm_90"}, kind="cubin")
    assert describe(cubin) == "cubin xg_matmul_0123 sm_90"
