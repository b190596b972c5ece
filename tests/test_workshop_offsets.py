"""Notebook 04's exercise checks: each passes on a right solution, and reports (never raises) a
stub that raises ``NotImplementedError`` and a plausible wrong solution."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import c2graph  # noqa: E402, F401  (first: on a machine without CUDA it sets Triton's interpreter up)
import pytest  # noqa: E402
import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from c2graph.workshop import CheckResult  # noqa: E402
from c2graph.workshop.offsets import check_offsets_builder, check_padding_zeroed, check_refresh  # noqa: E402

METADATA = ("pos", "req", "raw_out_loc", "c2_slot")


def build_offsets(extend_lens, request_slots):
    """Right: first rows are the running sum; slots past the batch start at the live rows, count 0."""
    starts, total = [], 0
    for n in extend_lens:
        starts.append(total)
        total += n
    pad = request_slots - len(extend_lens)
    return torch.tensor([starts + [total] * pad, list(extend_lens) + [0] * pad], dtype=torch.int32)


def build_offsets_zero_start(extend_lens, request_slots):
    """Wrong: slots past the batch start at row 0 (starts would decrease)."""
    out = build_offsets(extend_lens, request_slots)
    out[0, len(extend_lens):] = 0
    return out


def build_offsets_int64(extend_lens, request_slots):
    """Wrong: the default integer dtype."""
    return build_offsets(extend_lens, request_slots).long()


def stub(*args):
    """A student copy's stub."""
    raise NotImplementedError("write this function")


def refresh_metadata(static, batch):
    """Right: copy_ into the captured tensors."""
    for name in METADATA:
        getattr(static, name)[: batch.num_rows].copy_(getattr(batch, name))
    static.low_ratio_extend_offsets.copy_(batch.extend_offsets)


def refresh_by_rebinding(static, batch):
    """Wrong: new tensors under the old names; the graph never sees them."""
    for name in METADATA:
        setattr(static, name, getattr(batch, name))
    static.low_ratio_extend_offsets = batch.extend_offsets


def refresh_live_rows_only(static, batch):
    """Wrong: copies the live rows only, so padding rows keep an earlier batch's metadata."""
    n = batch.live_rows
    for name in METADATA:
        getattr(static, name)[:n].copy_(getattr(batch, name)[:n])
    static.low_ratio_extend_offsets.copy_(batch.extend_offsets)


def refresh_without_c2_slot(static, batch):
    """Wrong: forgets one of the captured tensors."""
    for name in METADATA[:3]:
        getattr(static, name)[: batch.num_rows].copy_(getattr(batch, name))
    static.low_ratio_extend_offsets.copy_(batch.extend_offsets)


def refresh_by_data(static, batch):
    """Wrong: gives the captured tensors the batch's memory (``.data =``); the graph keeps the old memory."""
    for name in METADATA:
        getattr(static, name).data = getattr(batch, name)
    static.low_ratio_extend_offsets.data = batch.extend_offsets


def test_offsets_builder_check():
    ok = check_offsets_builder(build_offsets)
    assert isinstance(ok, CheckResult) and ok.ok and ok.figure is None, str(ok)
    wrong = check_offsets_builder(build_offsets_zero_start)
    assert not wrong.ok and wrong.figure is not None
    assert "a slot past the batch starts at the live rows" in str(wrong)
    assert "pass: a full batch" in str(wrong), "a batch with no slot past it is right even so"
    assert "expected torch.int32" in str(check_offsets_builder(build_offsets_int64))
    unfinished = check_offsets_builder(stub)
    assert not unfinished.ok and "not written yet" in str(unfinished)


def test_refresh_check():
    ok = check_refresh(refresh_metadata)
    assert ok.ok and len(ok.lines) == 5, str(ok)
    rebound = check_refresh(refresh_by_rebinding)
    assert not rebound.ok and "You rebound static.pos, static.req" in str(rebound) and rebound.figure is not None
    stale = check_refresh(refresh_live_rows_only)
    assert not stale.ok, str(stale)
    assert [line.startswith("pass") for line in stale.lines][:2] == [True, True]
    assert stale.lines[2].startswith("FAIL: a smaller batch after a larger one"), stale.lines
    assert "static.req: never written at rows [5, 6, 7" in stale.lines[2], stale.lines
    assert "are padding rows, from row 3: they belong to the batch too" in stale.lines[2], stale.lines
    forgot = check_refresh(refresh_without_c2_slot)
    assert not forgot.ok and "static.c2_slot was never written" in str(forgot), str(forgot)
    assert "static.pos was" not in str(forgot), "only the tensor that was not refreshed is named"
    moved = check_refresh(refresh_by_data)
    assert not moved.ok and "static.pos, static.req, static.raw_out_loc, static.c2_slot, static.low_ratio_extend_offsets now have other memory" in str(moved), str(moved)
    assert "not written yet" in str(check_refresh(stub))
    assert check_refresh(refresh_metadata).ok, "a check leaves nothing behind for the next one"


def zero_padding(rows):
    """Right: the live row count read from the offsets tensor, on the device."""
    live = rows.offsets[1].sum()
    rows.out.masked_fill_(torch.arange(rows.ROWS, device=rows.out.device) >= live, 0.0)


def zero_padding_from_python_int(rows):
    """Wrong: the live row count as a Python int, frozen into the slice at capture."""
    rows.out[rows.live:].zero_()


def test_padding_check():
    ok = check_padding_zeroed(zero_padding)
    assert ok.ok and len(ok.lines) == 3 and "rows 12 to 15 zeroed" in ok.lines[1], str(ok)
    assert "replayed after batch 3" in ok.lines[2] and "no padding row, the live rows untouched" in ok.lines[2]
    frozen = check_padding_zeroed(zero_padding_from_python_int)
    assert not frozen.ok and "`start` = 8 at capture 1, 12 at capture 2" in frozen.lines[0], str(frozen)
    assert "in zero_padding_from_python_int" in frozen.lines[0] and "rows [8, 9, 10, 11] wrong" in frozen.lines[1]
    assert "not written yet" in str(check_padding_zeroed(stub))


def zero_padding_from_the_last_start(rows):
    """Wrong: the last request slot's first row taken as the live row count; right while that slot is
    past the batch, wrong when every slot is full."""
    rows.out.masked_fill_(torch.arange(rows.ROWS, device=rows.out.device) >= rows.offsets[0, -1], 0.0)


def zero_padding_read_on_the_host(rows):
    """Wrong: the live row count read back to the host (a host sync, refused in a capture)."""
    rows.out[int(rows.offsets[1].sum()):].zero_()


@triton.jit
def zero_rows(out_ptr, first_row, n_rows, BLOCK: tl.constexpr):
    offs = first_row + tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, 0.0, mask=offs < n_rows)


def zero_padding_tensor_as_number(rows):
    """Wrong: a tensor handed to the kernel's number argument `first_row` (Triton passes it as a pointer)."""
    zero_rows[(rows.ROWS // 4,)](rows.out, rows.offsets[1].sum(), rows.ROWS, BLOCK=4)


WRONG_PADDING = [
    (zero_padding_from_python_int, "`start` = 8 at capture 1, 12 at capture 2"),
    (zero_padding_from_the_last_start, "the last request slot's first row (`offsets[0, -1]`)"),
    (zero_padding_read_on_the_host, "That is a host sync"),
    (zero_padding_tensor_as_number, "your function `zero_padding_tensor_as_number` (at `zero_rows[(rows.ROWS // 4,)]"
                                    "(rows.out, rows.offsets[1].sum(), rows.ROWS, BLOCK=4)`) raised"),
]


@pytest.mark.parametrize("wrong, says", WRONG_PADDING, ids=[w.__name__ for w, _ in WRONG_PADDING])
def test_padding_check_names_each_mistake_the_same_way_in_every_run(wrong, says):
    texts = [str(check_padding_zeroed(wrong)) for _ in range(3)]
    assert texts == [texts[0]] * 3 and texts[0].startswith("zero the padding rows: not yet"), texts
    assert says in texts[0], texts[0]


def test_a_tensor_given_to_a_kernels_number_is_named_in_the_readers_terms():
    text = str(check_padding_zeroed(zero_padding_tensor_as_number))
    assert "Pass tensors only to `*_ptr` arguments and `tl.load` the number inside the kernel" in text, text
    assert "__call__" not in text and "raise InterpreterError" not in text, text


def test_the_last_start_passes_while_a_slot_is_free_and_fails_when_every_slot_is_full():
    lines = check_padding_zeroed(zero_padding_from_the_last_start).lines
    assert [line.split(":")[0] for line in lines] == ["pass", "pass", "FAIL"], lines
    assert "replayed after batch 3" in lines[2] and "every slot is full" in lines[2], lines


@pytest.mark.parametrize("check, right, wrong", [
    (check_offsets_builder, build_offsets, build_offsets_zero_start),
    (check_refresh, refresh_metadata, refresh_live_rows_only),
])
def test_the_other_checks_of_04_give_the_same_words_in_every_run(check, right, wrong):
    for answer, ok in ((right, True), (wrong, False)):
        results = [check(answer) for _ in range(3)]
        assert [r.ok for r in results] == [ok] * 3 and [str(r) for r in results] == [str(results[0])] * 3
