"""Extend offsets: where each request of a batch starts in the flattened rows, and how many rows it has.

An int32 tensor ``[2, request_slots]``: ``[0, r]`` is the first row of request slot
``r``, ``[1, r]`` its row count. Slots past the batch hold count 0 and start equal to the number
of live rows, so starts never decrease. Padding rows lie in no ``[start, start + count)``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .arguments import as_int


def build_extend_offsets(counts: Sequence[int], request_slots: int, device=None) -> torch.Tensor:
    """Offsets for requests with ``counts`` rows each, in ``request_slots`` slots: ``[2, S]`` int32."""
    request_slots = as_int("request_slots", request_slots, least=0)
    if isinstance(counts, (str, bytes)) or not hasattr(counts, "__len__"):
        raise ValueError(f"counts = {counts!r}; expected a sequence of row counts (ints >= 0)")
    counts = [as_int(f"counts[{i}]", c, least=0) for i, c in enumerate(counts)]
    if len(counts) > request_slots:
        raise ValueError(
            f"the batch has {len(counts)} requests but request_slots = {request_slots}; "
            "expected at most one request per slot"
        )
    if sum(counts) >= 2**31:
        raise ValueError(f"counts add up to {sum(counts)} rows; expected fewer than 2**31 (the offsets are int32)")
    offsets = torch.tensor(offset_rows(counts, request_slots), dtype=torch.int32)
    return offsets.to(device) if device is not None else offsets


def offset_rows(counts: Sequence[int], request_slots: int) -> tuple[list[int], list[int]]:
    """The two rows of the offsets of checked ``counts`` (ints >= 0, at most ``request_slots`` of
    them): each slot's first row (the live rows' count past the batch) and its row count (0 there)."""
    starts, total = [], 0
    for c in counts:
        starts.append(total)
        total += c
    pad = request_slots - len(counts)
    return starts + [total] * pad, list(counts) + [0] * pad


def check_extend_offsets(offsets: torch.Tensor, num_rows: int) -> tuple[list[int], list[int]]:
    """Raise ``ValueError`` unless ``offsets`` describe disjoint, ordered requests within ``num_rows``
    rows; return what it read: the first rows and the row counts, as lists.

    Reads the tensor on the host (a sync): call it before a launch, never inside a graph capture.
    """
    if not isinstance(offsets, torch.Tensor) or offsets.dim() != 2 or offsets.shape[0] != 2:
        shape = tuple(offsets.shape) if isinstance(offsets, torch.Tensor) else type(offsets).__name__
        raise ValueError(f"extend_offsets has shape {shape}; expected [2, request_slots]")
    if offsets.dtype != torch.int32:
        raise ValueError(f"extend_offsets has dtype {offsets.dtype}; expected torch.int32")
    starts, counts = offsets.tolist()
    end = 0
    for r, (s, c) in enumerate(zip(starts, counts)):
        if s < 0:
            raise ValueError(f"extend_offsets[0, {r}] = {s}: a first row must be >= 0")
        if c < 0:
            raise ValueError(f"extend_offsets[1, {r}] = {c}: a row count must be >= 0")
        if s < end:
            if s < starts[r - 1]:
                raise ValueError(
                    f"extend_offsets[0, {r}] = {s} < extend_offsets[0, {r - 1}] = {starts[r - 1]}; "
                    "expected non-decreasing starts"
                )
            raise ValueError(
                f"request slot {r} starts at row {s}, inside request slot {r - 1} "
                f"(rows [{starts[r - 1]}, {end})); expected disjoint requests"
            )
        if s + c > num_rows:
            raise ValueError(
                f"request slot {r} covers rows [{s}, {s + c}), past the buffer's {num_rows} rows"
            )
        end = s + c
    return starts, counts
