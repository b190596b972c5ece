"""A batch's requests, its rows made on the host and sent in one copy, and the values of its rows
against them, compared a slice at a time.

:meth:`ExtendBatch.check <c2graph.compressor.batch.ExtendBatch.check>` says, row by row, where a
batch's tensors contradict its request list. :func:`rows_agree` finds whether they do by comparing
whole slices of the rows read back (one Python step per request, the rows compared in C), so a
right batch, the common case, is checked quickly; only a batch it finds wrong goes through the
row-by-row rules, which name the row.
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import accumulate
from typing import NamedTuple

import numpy as np
import torch

from .arguments import as_int
from .extend_offsets import offset_rows


class Request(NamedTuple):
    """One request of an extend batch: its pool index and the positions it extends."""

    pool_index: int
    prefix_len: int
    extend_len: int


def as_requests(requests) -> tuple[Request, ...]:
    """``requests`` as :class:`Request` tuples of ints ``>= 0``; ``ValueError`` naming the request
    and the field unless each has three (what a batch made by hand, or ``dataclasses.replace``,
    holds is checked so)."""
    if isinstance(requests, (str, bytes)) or not isinstance(requests, Iterable):
        raise ValueError(f"requests = {requests!r}; expected a list of (pool_index, prefix_len, extend_len) tuples")
    out = []
    for i, r in enumerate(requests):
        one = isinstance(r, (str, bytes)) or (isinstance(r, torch.Tensor) and r.dim() == 0)
        fields = tuple(r) if isinstance(r, Iterable) and not one else ()
        if len(fields) != 3:
            raise ValueError(f"request {i} = {r!r}; expected three fields (pool_index, prefix_len, extend_len)")
        out.append(Request(*(as_int(f"request {i}: {n}", v, least=0) for n, v in zip(Request._fields, fields))))
    return tuple(out)


def rows_agree(requests, starts: list[int], counts: list[int], pos: list[int], req: list[int], raw: list[int],
               c2: list[int]) -> bool:
    """Whether the rows (lists, read from the host: ``pos``, ``req``, ``raw_out_loc``, ``c2_slot``)
    and the extend offsets (``starts``, ``counts``) say what ``requests`` say:

    - slot ``r`` of a request starts where the requests before it end and holds its
      ``extend_len`` rows; slots past the batch hold none;
    - a request's rows hold its pool index and consecutive positions from ``prefix_len``, and
      either all of them a token slot or none; rows past the requests are padding (0, 0, 0);
    - ``c2_slot`` is ``raw_out_loc // 2`` on rows at odd positions that hold a token slot, else 0,
      and no two rows store at one c2 slot.

    Compares whole slices (one loop over the requests, none over the rows in Python).
    """
    n, lens = len(requests), [r.extend_len for r in requests]
    ends = list(accumulate(lens))
    if n > len(starts) or starts[:n] != [e - k for e, k in zip(ends, lens)] or counts[:n] != lens or any(counts[n:]):
        return False
    live, total = (ends[-1] if ends else 0), len(pos)
    padding = [0] * (total - live)
    if live > total or pos[live:] != padding or req[live:] != padding or raw[live:] != padding or c2[live:] != padding:
        return False
    stored = []
    for r, end in zip(requests, ends):
        a, k = end - r.extend_len, r.extend_len
        if req[a:end] != [r.pool_index] * k or pos[a:end] != list(range(r.prefix_len, r.prefix_len + k)):
            return False
        if raw[a:end].count(0) not in (0, k):
            return False
        odd = a + (r.prefix_len + 1) % 2  # the request's first row at an odd position
        even = a + r.prefix_len % 2
        groups = [x // 2 for x in raw[odd:end:2]] if raw[a:end].count(0) == 0 else [0] * len(range(odd, end, 2))
        if c2[odd:end:2] != groups or c2[even:end:2].count(0) != len(range(even, end, 2)):
            return False
        stored += groups
    stored = [s for s in stored if s]
    return len(set(stored)) == len(stored)


def rows_on_device(rows, lens: list[int], slots: int, num_rows: int, dev: torch.device) -> tuple[torch.Tensor, ...]:
    """``pos``, ``req``, ``raw_out_loc``, ``c2_slot`` (``rows``: the first three, of the live rows,
    padded with zeros to ``num_rows``) and the extend offsets of requests of ``lens`` rows in
    ``slots`` slots, made in one host buffer and sent in one copy (from pinned memory to a CUDA
    device): views of one block on ``dev``, nothing read back."""
    live = sum(lens)
    stage = np.empty(4 * num_rows + slots, dtype=np.int64)  # numpy: a few µs where torch's calls take tens
    table = stage[: 4 * num_rows].reshape(4, num_rows)
    table[:, live:] = 0
    pos, req, raw = rows
    table[0, :live], table[1, :live], table[2, :live] = pos, req, raw
    # c2_slot: raw_out_loc // 2 on group rows (odd pos); 0 elsewhere (a padding row's raw_out_loc is 0)
    np.multiply(raw >> 1, pos & 1, out=table[3, :live])
    stage[4 * num_rows:].view(np.int32).reshape(2, slots)[:] = offset_rows(lens, slots)
    host = torch.from_numpy(stage)
    if dev.type == "cuda":  # from pinned memory the copy is queued, and the call returns at once
        host = torch.empty(host.shape, dtype=host.dtype, pin_memory=True).copy_(host).to(dev, non_blocking=True)
    elif dev != host.device:
        host = host.to(dev)
    return (*host[: 4 * num_rows].view(4, num_rows).unbind(), host[4 * num_rows:].view(torch.int32).view(2, slots))
