"""runtime/determinism.py: an engine's verdict from its kernels' PTX and its eager calls."""

from xgbuild.compiler.ir.graph import Graph
from xgbuild.runtime.determinism import determinism


def kernel(name: str, kind: str = "matmul", ptx: str | None = "k.ptx") -> dict:
    return {"name": name, "kind": kind, "variants": [{"arch": 90, **({"ptx": ptx} if ptx else {})}]}


def verdict(kernels: list, entries: dict, num_gpu: int = 1):
    return determinism({"kernels": kernels, "num_gpu": num_gpu}, Graph("main", [], [], {"tuple": []}), entries)


def test_no_atomics_is_deterministic() -> None:
    v = verdict([kernel("mm")], {"k.ptx": b"ld.global.f32 %f1, [%rd1];\nst.global.f32 [%rd2], %f1;\n"})
    assert v.deterministic and v.line().startswith("deterministic")


def test_float_atomic_add_is_not() -> None:
    v = verdict([kernel("mm_splitk")], {"k.ptx": b"  red.global.add.f32 [%rd1], %f1;\n"})
    assert not v.deterministic
    assert v.reasons == ("kernel mm_splitk adds with floating-point atomics (`red.global.add.f32` in its PTX)",)
    assert v.line().startswith("not deterministic: kernel mm_splitk")


def test_integer_atomics_are_order_free() -> None:
    assert verdict([kernel("count")], {"k.ptx": b"atom.global.add.u32 %r1, [%rd1], 1;\n"}).deterministic


def test_a_kind_xg_does_not_emit_without_ptx_is_not_assumed_safe() -> None:
    assert verdict([kernel("mm", ptx=None)], {}).deterministic
    assert not verdict([kernel("odd", kind="other", ptx=None)], {}).deterministic


def test_every_kernel_kind_xg_emits_is_judged_atomic_free() -> None:
    # A kind left out would make every engine using it "carries no PTX to check" when judged by kind.
    from xgbuild.compiler.codegen.templates import KINDS
    from xgbuild.runtime.determinism import ATOMIC_FREE_KINDS
    assert set(KINDS) <= ATOMIC_FREE_KINDS
