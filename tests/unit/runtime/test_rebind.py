"""Which buffers a captured CUDA graph is re-pointed at, and which launch arguments follow them
(runtime/rebind.py), on the host: the driver calls are exercised by tests/gpu/test_cuda_graphs.py;
here, the decisions that made a replay wrong when they were wrong (an output's addresses that an
earlier intermediate had used, an input an output views, buffers PyTorch operators touch)."""

from __future__ import annotations

import torch

from xgbuild.runtime.cuda import KernelBinary
from xgbuild.runtime.rebind import plan_buffers, pointer_slots

COPY = KernelBinary(name="copy", arch=90, cubin=b"", num_warps=4, shared=0, params=("*fp32", "*fp32", "i32"))


def launch(src: int, dst: int, n: int = 64) -> tuple:
    return (COPY, 1, (1, 1, 1), COPY.layout.pack(src, dst, n, 0, 0))


def test_pointers_into_a_buffer_follow_it_from_its_allocation_on() -> None:
    # The output lives at [5000, 5400) from launch 2 on; launch 0 wrote an intermediate that the
    # capture's pool had put at 5100 before: it must keep pointing there.
    buffers = {("in", "X"): (1000, 400, 0), ("out", 5000): (5000, 400, 2)}
    launches = [launch(1000, 5100), launch(5100, 9000), launch(9000, 5000), launch(5000 + 64, 7000)]
    slots = pointer_slots(launches, buffers)
    assert slots[0] == [(0, ("in", "X"), 0)]            # the intermediate at 5100 is not the output's
    assert slots[1] == []
    assert slots[2] == [(8, ("out", 5000), 0)]
    assert slots[3] == [(0, ("out", 5000), 64)]         # a view at an offset keeps its offset


def test_an_empty_buffer_is_never_matched() -> None:
    assert pointer_slots([launch(1000, 2000)], {("in", "E"): (1000, 0, 0)}) == [[]]


def test_plan_rebinds_inputs_and_kernel_outputs_only() -> None:
    x, y = torch.randn(8, 4), torch.randn(4, 4)
    out = torch.empty(8, 4)
    view = out.t()                                      # a second output viewing the same buffer
    const_out = torch.zeros(3)                          # made by a PyTorch operator in the capture
    births = {out.untyped_storage().data_ptr(): 1}
    touched = {y.untyped_storage().data_ptr(), const_out.untyped_storage().data_ptr()}
    buffers, fresh = plan_buffers({"X": x, "Y": y}, ("X", "Y"), {5: out, 6: view, 7: const_out}, touched, births)
    assert ("in", "X") in buffers and ("in", "Y") not in buffers   # Y: an operator read it, so it is copied
    key = ("out", out.untyped_storage().data_ptr())
    assert buffers[key] == (out.data_ptr(), out.numel() * 4, 1)
    assert set(fresh) == {5, 6} and fresh[5][0] == fresh[6][0] == key
    assert not fresh[5][6] and not fresh[6][6]          # shared: allocated once, as bytes, both viewed into it
    assert fresh[6][4] == (1, 4)                        # the view's own strides


def test_an_output_that_views_an_input_keeps_the_input_copied() -> None:
    x = torch.randn(8, 4)
    alias = x.reshape(32)
    made = torch.empty(4)
    births = {made.untyped_storage().data_ptr(): 0}
    buffers, fresh = plan_buffers({"X": x}, ("X",), {1: alias, 2: made}, set(), births)
    assert ("in", "X") not in buffers and 1 not in fresh
    assert fresh[2][6]                                  # its own buffer, whole: allocated as itself


def test_an_output_no_kernel_allocated_is_cloned() -> None:
    made = torch.empty(4)
    buffers, fresh = plan_buffers({}, (), {3: made}, set(), {})
    assert not buffers and not fresh


def test_a_binder_knows_the_buffers_its_nodes_use() -> None:
    import ctypes

    from xgbuild.runtime.rebind import Binder, _Site
    block = ctypes.create_string_buffer(16)
    site = _Site(node=None, params=None, block=block, pointers=None,
                 slots=[(0, ("in", "X"), 0), (8, ("out", 5000), 64)])
    binder = Binder(None, [site], {("in", "X"): 1000, ("out", 5000): 5000, ("in", "Y"): 2000},
                    lambda: False, lambda pushed: None)
    assert binder.keys == {("in", "X"), ("out", 5000)} and binder.inputs == ("X",)
    binder.bind({("in", "X"): 1000, ("out", 5000): 5000})     # nothing moved: no driver call at all
