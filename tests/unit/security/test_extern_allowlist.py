"""Attacks on the eager fallback (EXTERN): forged-but-sealed engines whose program calls PyTorch.

An engine file is data: whoever can write it can edit its program and seal it again. These tests
build a real `fallback="eager"` engine, rewrite its EXTERN node the way an attacker would (another
operator, another attribute path, arguments the schema forbids, sizes that would exhaust memory),
re-seal it with the packager's own writer, and check that loading refuses it before anything
runs, with one clear message, nothing written and no traceback.
"""

from __future__ import annotations

import copy
import hashlib
import json
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Callable

import pytest
import torch

import xg
from xgbuild.compiler.importers.imported import UnsupportedOps
from xgbuild.compiler.ops.extern_allow import ALLOWED, STRINGS
from xgbuild.errors import EngineError, ExecutionError
from xgbuild.packager.engine_file import make_engine_file, save_engine_file

ROOT = Path(__file__).resolve().parents[3]
XGRUN = Path(sys.executable).parent / "xgrun"


class Cumprod(torch.nn.Module):
    def forward(self, x):
        return torch.cumprod(x, dim=-1) + 1


@pytest.fixture(scope="module")
def built():
    """A real engine that calls `aten.cumprod.default` through the eager fallback."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return xg.compile(Cumprod(), (torch.randn(3, 4),), kernels=False, fallback="eager").engine.file


def forge(file, path: Path, edit: Callable[[dict], None]) -> Path:
    """`file` with its program edited by `edit` and sealed again, as an attacker with write
    access to the file would: a new program digest in the manifest, a new bundle digest."""
    program = json.loads(file.entries["program.json"])
    edit(program)
    blob = json.dumps(program, sort_keys=True, separators=(",", ":")).encode()
    manifest = copy.deepcopy(file.manifest)
    manifest["program"]["sha256"] = hashlib.sha256(blob).hexdigest()
    files = {k: v for k, v in file.entries.items() if k not in ("manifest.json", "program.json")
             and not k.startswith("sources/")}
    save_engine_file(make_engine_file(manifest, file.graph, blob, file.sources, files), path)
    return path


def extern_node(program: dict) -> dict:
    return next(n for n in program["nodes"] if n["op"] == "extern")


def set_call(call, args=None) -> Callable[[dict], None]:
    def edit(program: dict) -> None:
        node = extern_node(program)
        attrs = dict(node["attrs"])
        attrs["call"] = call
        if args is not None:
            attrs["args"] = args if isinstance(args, str) else json.dumps(args)
        node["attrs"] = sorted([k, v] for k, v in attrs.items())
    return edit


def test_a_fallback_engine_from_a_file_needs_the_opt_in(built, tmp_path: Path) -> None:
    path = tmp_path / "honest.xge"
    save_engine_file(built, path)
    with pytest.raises(EngineError, match=r"calls 1 PyTorch operator.*aten\.cumprod\.default.*--allow-fallback"):
        xg.load_engine(path)
    with pytest.raises(EngineError, match="allow_fallback=True"):
        xg.load_model_engine(path)
    engine = xg.load_model_engine(path, allow_fallback=True)
    x = torch.rand(3, 4)
    assert torch.allclose(engine(x), torch.cumprod(x, -1) + 1)
    refused = subprocess.run([str(XGRUN), str(path)], capture_output=True, text=True, timeout=120)
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert "--allow-fallback" in refused.stderr and len(refused.stderr.strip().splitlines()) == 1
    ran = subprocess.run([str(XGRUN), str(path), "--allow-fallback", "--json"], capture_output=True, text=True,
                         timeout=120)
    assert ran.returncode == 0, ran.stderr


PASSWD = [["/etc/passwd", False, 64], {}]
PAYLOADS = {
    # operators that read, write, load or allocate: not on the list
    "from_file": ("aten.from_file.default", PASSWD),
    "empty": ("aten.empty.memory_format", [[[1 << 40]], {}]),
    "new_empty": ("aten.new_empty.default", [[{"$t": 0}, [1 << 40]], {}]),
    "full": ("aten.full.default", [[[1 << 20, 1 << 20], 1.0], {}]),
    "random": ("aten.bernoulli.default", [[{"$t": 0}], {}]),
    "in_place": ("aten.add_.Tensor", [[{"$t": 0}, {"$t": 0}], {}]),
    "out_variant": ("aten.cumprod.out", [[{"$t": 0}, -1], {"out": {"$t": 0}}]),
    "copy_into": ("aten.copy_.default", [[{"$t": 0}, {"$t": 0}], {}]),
    "storage": ("aten.set_.source_Storage", [[{"$t": 0}, None], {}]),
    "dense_scalar": ("aten._local_scalar_dense.default", [[{"$t": 0}], {}]),
    # other namespaces and attribute paths
    "profiler": ("profiler._record_function_enter.default", [["x", None], {}]),
    "load_library": ("ops.load_library.default", [["/tmp/evil.so"], {}]),
    "torch_load": ("torch.load.default", [["/tmp/x.pt"], {}]),
    "builtins": ("builtins.exec.default", [["import os"], {}]),
    "call_chain": ("aten.cumprod.default.__call__", [[{"$t": 0}, -1], {}]),
    "dunder": ("aten.__class__.__init__", [[], {}]),
    "dunder_overload": ("aten.cumprod.__call__", [[{"$t": 0}, -1], {}]),
    "packet_only": ("aten.cumprod", [[{"$t": 0}, -1], {}]),
    "not_a_string": (["aten", "cumprod", "default"], [[{"$t": 0}, -1], {}]),
    # an allowed operator with arguments its schema forbids
    "bad_index": ("aten.cumprod.default", [[{"$t": 5}, -1], {}]),
    "negative_index": ("aten.cumprod.default", [[{"$t": -1}, -1], {}]),
    "bool_index": ("aten.cumprod.default", [[{"$t": True}, -1], {}]),
    "string_index": ("aten.cumprod.default", [[{"$t": "0"}, -1], {}]),
    "tensor_with_extra_key": ("aten.cumprod.default", [[{"$t": 0, "path": "/etc/passwd"}, -1], {}]),
    "string_dim": ("aten.cumprod.default", [[{"$t": 0}, "/etc/passwd"], {}]),
    "path_as_tensor": ("aten.cumprod.default", [["/etc/passwd", -1], {}]),
    "unknown_dtype": ("aten.cumprod.default", [[{"$t": 0}, -1], {"dtype": {"$dtype": "complex64"}}]),
    "dtype_as_string": ("aten.cumprod.default", [[{"$t": 0}, -1], {"dtype": "torch.float32"}]),
    "unknown_kwarg": ("aten.cumprod.default", [[{"$t": 0}, -1], {"out": {"$t": 0}}]),
    "too_many_args": ("aten.cumprod.default", [[{"$t": 0}, -1, None, 1, 2], {}]),
    "twice": ("aten.cumprod.default", [[{"$t": 0}, -1], {"dim": 0}]),
    "missing_dim": ("aten.cumprod.default", [[{"$t": 0}], {}]),
    "huge_int": ("aten.cumprod.default", [[{"$t": 0}, 1 << 70], {}]),
    "device_string": ("aten._to_copy.default", [[{"$t": 0}], {"device": "cuda:7"}]),
    "layout": ("aten._to_copy.default", [[{"$t": 0}], {"layout": 0}]),
    "bad_mode": ("aten.gelu.default", [[{"$t": 0}], {"approximate": "/etc/passwd"}]),
    "huge_list": ("aten.permute.default", [[{"$t": 0}, list(range(100_000))], {}]),
    "not_json": ("aten.cumprod.default", "[[{\"$t\": 0}, -1], {}"),
    "deep_json": ("aten.cumprod.default", "[" * 100_000 + "]" * 100_000),
    "not_a_pair": ("aten.cumprod.default", [{"$t": 0}, -1]),
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", sorted(PAYLOADS))
def test_a_forged_call_is_refused_at_load_even_with_the_opt_in(built, tmp_path: Path, name: str) -> None:
    call, args = PAYLOADS[name]
    path = forge(built, tmp_path / f"{name}.xge", set_call(call, args))
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(EngineError) as err:
        xg.load_engine(path, allow_fallback=True)
    text = str(err.value)
    assert "refused" in text and "\n" not in text and len(text) < 1200, text
    assert sorted(p.name for p in tmp_path.iterdir()) == before          # nothing written


@pytest.mark.timeout(120)
def test_xgrun_refuses_a_forged_engine_with_one_line(built, tmp_path: Path) -> None:
    path = forge(built, tmp_path / "passwd.xge", set_call("aten.from_file.default", PASSWD))
    run = subprocess.run([str(XGRUN), str(path), "--allow-fallback", "--json"], capture_output=True, text=True,
                         timeout=120, cwd=str(tmp_path))
    assert run.returncode == 1 and run.stdout == "" and "root:" not in run.stdout + run.stderr
    assert "Traceback" not in run.stderr and run.stderr.startswith("error: ")
    assert "aten.from_file.default" in run.stderr and "not on XG's list" in run.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["passwd.xge"]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("call,args", [
    ("aten.repeat.default", [[{"$t": 0}, [1 << 16, 1 << 16]], {}]),
    ("aten.constant_pad_nd.default", [[{"$t": 0}, [0, 1 << 31]], {}]),
    ("aten.tile.default", [[{"$t": 0}, [1 << 20, 1 << 20]], {}]),
    ("aten.expand.default", [[{"$t": 0}, [1 << 20, 3, 4]], {}]),
])
def test_an_allowed_operator_asked_to_allocate_without_bound_is_refused_before_allocating(
        built, tmp_path: Path, call: str, args: list) -> None:
    """Sizes pass the schema (they are ints), so the call is dry-run on `meta` tensors first: a
    result far larger than the node declares is refused before any memory is taken."""
    path = forge(built, tmp_path / "bomb.xge", set_call(call, args))
    engine = xg.load_engine(path, allow_fallback=True)
    with pytest.raises(ExecutionError, match=r"would allocate \d+ bytes"):
        engine.run({"x": torch.rand(3, 4)})


def test_an_operator_off_the_list_is_an_unsupported_op_at_compile_time() -> None:
    class Bessel(torch.nn.Module):
        def forward(self, x):
            return torch.special.bessel_j0(x) + 1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(UnsupportedOps) as err:
            xg.compile(Bessel(), (torch.rand(3, 4),), kernels=False, fallback="eager")
    text = str(err.value)
    assert "aten.special_bessel_j0" in text and "not on XG's list" in text


def test_engines_built_in_this_process_keep_the_fallback() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        engine = xg.compile(Cumprod(), (torch.randn(3, 4),), kernels=False, fallback="eager")
    x = torch.rand(3, 4)
    assert torch.allclose(engine(x), torch.cumprod(x, -1) + 1)


def test_the_allow_list_holds_only_pure_aten_tensor_ops() -> None:
    """Every entry exists, writes nothing, takes no Generator, Storage or Dimname, returns
    tensors, has a Meta kernel (for the dry run), and strings appear only where `STRINGS` says."""
    for name in sorted(ALLOWED):
        ns, packet, overload = name.split(".")
        assert ns == "aten"
        op = getattr(getattr(torch.ops.aten, packet), overload)
        schema = op._schema
        assert not schema.is_mutable, name
        assert not any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments), name
        types = [str(a.real_type) for a in schema.arguments]
        assert not any(w in t for t in types for w in ("Generator", "Storage", "Dimname")), name
        assert all(str(r.type) in ("Tensor", "List[Tensor]") for r in schema.returns), name
        assert torch._C._dispatch_has_computed_kernel_for_dispatch_key(op.name(), "Meta"), name
        for a in schema.arguments:
            if "str" in str(a.real_type):
                assert (name, a.name) in STRINGS, (name, a.name)
        for word in ("rand", "dropout", "bernoulli", "file", "save", "load", "empty", "copy_", "set_"):
            assert word not in packet, name


def test_a_trusted_signature_is_the_opt_in(built, tmp_path: Path) -> None:
    """An engine that uses the fallback runs without --allow-fallback when a key the deploy host
    trusts signed it (the signature covers the program, so its calls are the builder's); the same
    engine re-sealed by anyone else is refused by the signature before its calls matter."""
    xgbuild = Path(sys.executable).parent / "xgbuild"
    path = tmp_path / "signed.xge"
    save_engine_file(built, path)
    keys = tmp_path / "keys"
    for args in (("keygen", "--out", str(keys / "release")), ("sign", str(path), "--key", str(keys / "release"))):
        res = subprocess.run([str(xgbuild), *args], capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, res.stderr
    trusted = tmp_path / "trusted"
    trusted.mkdir()
    (trusted / "release.pub").write_bytes((keys / "release.pub").read_bytes())
    engine = xg.load_model_engine(path, trusted_keys=trusted)
    x = torch.rand(3, 4)
    assert torch.allclose(engine(x), torch.cumprod(x, -1) + 1)
    ran = subprocess.run([str(XGRUN), str(path), "--trusted-keys", str(trusted), "--json"], capture_output=True,
                         text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr
    forged = forge(built, tmp_path / "forged.xge", set_call("aten.cumsum.default"))
    refused = subprocess.run([str(XGRUN), str(forged), "--trusted-keys", str(trusted)], capture_output=True,
                             text=True, timeout=120)
    assert refused.returncode == 1 and "Traceback" not in refused.stderr and "sign" in refused.stderr
