"""Check mode's asynchronous verdicts (runtime/verdicts.py), on the host: what each kind of evidence
reports, in which order, naming which run, and that every failed run is reported once and in order.
The evidence values stand in for what a GPU run copies back (tests/gpu covers the device side)."""

from __future__ import annotations

import ctypes

import pytest
import torch

from xgbuild.compiler.driver import compile_source
from xgbuild.compiler.passes.specialize import bind_symbols, specialize
from xgbuild.errors import ExecutionError, InputError
from xgbuild.runtime.cuda import CudaRuntimeError
from xgbuild.runtime.verdicts import Evidence, Mailbox, Pending, Verdicts

SOURCE = "extern Tensor[float32, N] X\ndef main() {\n    y = log(X)\n    return y * 2.0\n}\n"


@pytest.fixture(scope="module")
def graph():
    g = compile_source(SOURCE, "v.xg").optimized.main
    return specialize(g, bind_symbols(g, {"X": (4,)}))


def pending(graph, inputs, values, **evidence) -> Pending:
    p = Pending(graph, inputs, Evidence(**evidence))
    p.values = list(values)
    return p


def test_clean_evidence_settles_quietly(graph) -> None:
    p = pending(graph, {"X": torch.rand(4) + 1}, [0], flags=torch.zeros(1, dtype=torch.int32))
    p.settle(later=False)
    assert p.settled


def test_a_raised_flag_is_traced_on_the_cpu_while_the_inputs_live(graph) -> None:
    x = torch.tensor([1.0, -1.0, 2.0, 3.0])
    p = pending(graph, {"X": x}, [1], flags=torch.zeros(1, dtype=torch.int32))
    with pytest.raises(ExecutionError, match=r"NaN.*`log`.*line 3.*traced on the CPU reference"):
        p.settle(later=False)
    p.settle(later=False)               # reported once


def test_a_raised_flag_whose_inputs_are_gone_names_the_storing_kernels(graph) -> None:
    p = pending(graph, {"X": torch.tensor([1.0, -1.0, 2.0, 3.0])}, [1], flags=torch.zeros(1, dtype=torch.int32),
                stored_by="v.xg line 4")
    with pytest.raises(ExecutionError, match=r"stored by v.xg line 4\); its inputs are gone"):
        p.settle(later=False)


def test_a_later_report_names_the_run(graph) -> None:
    x = torch.tensor([1.0, -1.0, 2.0, 3.0])
    p = pending(graph, {"X": x}, [1], flags=torch.zeros(1, dtype=torch.int32))
    with pytest.raises(ExecutionError, match=rf"^run #{p.run} of this engine, queued earlier .*`log`"):
        p.settle(later=True)


def test_an_input_out_of_range_is_named_before_anything_else(graph) -> None:
    idx = torch.tensor([0, 7])
    gathers = ([(graph.nodes[-1], 4)], torch.zeros(1, 2))
    p = pending(graph, {"X": torch.rand(4)}, [1, -3, 9, 0, 7],
                flags=torch.zeros(1, dtype=torch.int32), gathers=gathers,
                ranges=[("tokens", 0, 5, torch.stack(torch.aminmax(idx)))])
    with pytest.raises(InputError, match=r"input `tokens` holds 7, outside \[0, 5\)"):
        p.settle(later=False)


def test_a_computed_index_out_of_bounds(graph) -> None:
    gathers = ([(graph.nodes[-1], 4)], torch.zeros(1, 2))
    p = pending(graph, {"X": torch.rand(4)}, [-3, 2], gathers=gathers)
    with pytest.raises(ExecutionError, match=r"index -3 is out of bounds for a table of 4 rows"):
        p.settle(later=False)


def test_an_unguarded_output_holding_nan(graph) -> None:
    out = graph.output["t"]
    x = torch.tensor([1.0, 2.0, 3.0, 4.0])            # held: the CPU reference runs on it
    p = pending(graph, {"X": x}, [1], unguarded=[(out, torch.zeros(4))])
    with pytest.raises(ExecutionError, match=rf"node %{out}.*not on the CPU reference: the kernels' result is wrong"):
        p.settle(later=False)


def test_verdicts_report_each_failed_run_once_in_order(graph) -> None:
    bad = torch.tensor([1.0, -1.0, 2.0, 3.0])
    flags = torch.zeros(1, dtype=torch.int32)
    queue = Verdicts()
    runs = [pending(graph, {"X": bad}, [v], flags=flags) for v in (0, 1, 0, 1)]
    for p in runs:
        queue.add(p)
    with pytest.raises(ExecutionError, match=rf"run #{runs[1].run} "):
        queue.settle_ready()                # the finished runs, oldest first: the first failure
    assert len(queue) == 2
    with pytest.raises(ExecutionError, match=rf"run #{runs[3].run} "):
        queue.settle_through(None, later=True)
    queue.settle_through(None, later=True)  # nothing left
    assert len(queue) == 0 and all(p.settled for p in runs)


def test_settling_one_run_settles_the_earlier_ones_first(graph) -> None:
    bad = torch.tensor([1.0, -1.0, 2.0, 3.0])
    flags = torch.zeros(1, dtype=torch.int32)
    queue = Verdicts()
    first, second = pending(graph, {"X": bad}, [1], flags=flags), pending(graph, {"X": bad}, [0], flags=flags)
    queue.add(first)
    queue.add(second)
    with pytest.raises(ExecutionError, match=rf"run #{first.run} "):
        queue.settle_through(second, later=False)       # the earlier failure is the one to hear of first
    queue.settle_through(second, later=False)
    assert second.settled and len(queue) == 0


def test_a_failure_nobody_read_is_printed_at_exit(tmp_path) -> None:
    import subprocess
    import sys
    script = tmp_path / "unread.py"
    script.write_text(
        "import torch\n"
        "from xgbuild.compiler.driver import compile_source\n"
        "from xgbuild.compiler.passes.specialize import bind_symbols, specialize\n"
        "from xgbuild.runtime.verdicts import Evidence, Pending, Verdicts\n"
        f"g = compile_source({SOURCE!r}, 'v.xg').optimized.main\n"
        "g = specialize(g, bind_symbols(g, {'X': (4,)}))\n"
        "x = torch.tensor([1.0, -1.0, 2.0, 3.0])\n"
        "queue = Verdicts()\n"
        "p = Pending(g, {'X': x}, Evidence(flags=torch.zeros(1, dtype=torch.int32)))\n"
        "p.values = [1]\n"
        "queue.add(p)\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0
    assert "xg: a queued GPU run's check failed and nothing read it before exit" in done.stderr
    assert "`log`" in done.stderr and "Traceback" not in done.stderr


def test_kept_inputs_are_held_and_the_callers_are_not(graph) -> None:
    # An engine's weights live as long as it does: held, so a trace has them; the caller's inputs
    # only while the caller holds them.
    import gc
    weights = {"W": torch.ones(2)}
    x = torch.tensor([1.0, -1.0, 2.0, 3.0])
    p = pending(graph, {"X": x, **weights}, [0], flags=torch.zeros(1, dtype=torch.int32))
    p2 = Pending(graph, {"X": x, **weights}, Evidence(), kept=weights)
    assert p2._alive() == {"W": weights["W"], "X": x}
    del x
    gc.collect()
    assert p2._alive() is None and p._alive() is None


class _Driver:
    """The driver calls `Mailbox` makes, over host memory: a copy lands at once (`land`) or when its
    stream is synchronised, or fails (`fail`)."""

    def __init__(self, land: bool = True, fail: bool = False) -> None:
        from xgbuild.runtime.cuda import driver_module
        real = driver_module()
        self.CUresult, self.CUevent_flags = real.CUresult, real.CUevent_flags
        self.land, self.fail, self.queued, self.syncs, self._buffers = land, fail, [], 0, []

    def cuMemHostAlloc(self, nbytes, flags):
        buf = ctypes.create_string_buffer(nbytes)
        self._buffers.append(buf)
        return self.CUresult.CUDA_SUCCESS, ctypes.addressof(buf)

    def cuEventCreate(self, flags):
        return self.CUresult.CUDA_SUCCESS, object()

    def cuMemcpyDtoHAsync(self, dst, src, nbytes, stream):
        if self.fail:
            return (self.CUresult.CUDA_ERROR_ILLEGAL_ADDRESS,)
        if self.land:
            ctypes.memmove(dst, src, nbytes)
        else:
            self.queued.append((dst, src, nbytes))
        return (self.CUresult.CUDA_SUCCESS,)

    def cuStreamSynchronize(self, stream):
        self.syncs += 1
        for dst, src, nbytes in self.queued:
            ctypes.memmove(dst, src, nbytes)
        self.queued.clear()
        return (self.CUresult.CUDA_SUCCESS,)

    def cuGetErrorString(self, err):
        return self.CUresult.CUDA_SUCCESS, b"an illegal memory access was encountered"


def _mailbox(driver: _Driver, slots: int = 3) -> Mailbox:
    return Mailbox(lambda: False, lambda pushed: None, slots=slots, driver=driver)


def test_mailbox_flag_words_land_and_free_their_slots() -> None:
    box = _mailbox(_Driver())
    words = [torch.tensor([bits], dtype=torch.int32) for bits in (0, 5, 0, 9)]
    for k, word in enumerate(words):            # more words than slots: each read frees its slot
        # `post` of one int32 word (a run's flag word) takes `post_word`'s path
        slot = box.post(word, stream=7) if k % 2 else box.post_word(word.data_ptr(), stream=7)
        assert box._single[slot]
        assert box.ready(slot)
        assert box.take(slot, 1, False) == [int(word)]
    assert sorted(box.free) == [0, 1, 2]


def test_mailbox_waits_for_a_word_not_yet_landed() -> None:
    driver = _Driver(land=False)
    box = _mailbox(driver)
    word = torch.tensor([3], dtype=torch.int32)
    slot = box.post_word(word.data_ptr(), stream=7)
    assert not box.ready(slot) and driver.syncs == 0
    assert box.take(slot, 1, False) == [3] and driver.syncs == 1


def test_mailbox_full_or_failing_copy_gives_its_slot_back() -> None:
    box = _mailbox(_Driver(), slots=1)
    word = torch.tensor([1], dtype=torch.int32)
    slot = box.post_word(word.data_ptr(), stream=0)
    assert box.post_word(word.data_ptr(), stream=0) is None      # no free slot: the caller falls back
    box.take(slot, 1, False)
    failing = _mailbox(_Driver(fail=True), slots=2)
    with pytest.raises(CudaRuntimeError, match=r"cuMemcpyDtoHAsync failed: CUDA_ERROR_ILLEGAL_ADDRESS"):
        failing.post_word(word.data_ptr(), stream=0)
    assert sorted(failing.free) == [0, 1]
