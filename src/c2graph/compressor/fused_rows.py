"""The fused kernel's row stages: which rows lie in a request, which complete a group, which row
each lane computes, where it stores, and the park. Every fact about a lane's row is found once,
in :func:`lane_rows`, from one read of the extend offsets; the math stages
(:mod:`~c2graph.compressor.fused_math`) only use them.

Every address a program reads or writes is kept inside its tensor by the masks here, whatever
the offsets, ``pos``, ``req`` or ``raw_out_loc`` hold: a lane whose c2 slot lies past the caches,
or whose ring partner lies outside the ring, stores nothing; a row parked outside the ring is not
parked. (The host checks a batch built by :meth:`ExtendBatch.build`; these masks keep a batch
changed by hand from writing past a tensor.)
"""

from __future__ import annotations

import triton
import triton.language as tl

NO_ROW = tl.constexpr(2**62)
"""The first row given to the padding lanes of the request-slot table: past every row."""


@triton.jit
def request_slot_table(offsets_ptr, request_slots, S_PAD: tl.constexpr):
    """Every request slot's first row and end (one past its last row): two ``[S_PAD]`` int64.

    Read from the extend offsets (``[2, request_slots]`` int32: first rows, then row counts),
    a tensor refreshed before every replay. Lanes past ``request_slots`` start after every row.
    """
    s = tl.arange(0, S_PAD)
    real = s < request_slots
    starts = tl.load(offsets_ptr + s, mask=real, other=0).to(tl.int64)
    counts = tl.load(offsets_ptr + request_slots + s, mask=real, other=0).to(tl.int64)
    return tl.where(real, starts, NO_ROW), tl.where(real, starts + counts, 0)


@triton.jit
def pair_table(offsets_ptr, request_slots, S_PAD: tl.constexpr):
    """Every request slot's *pairs* of rows: its first row and end, its number of pairs, and the
    batch-wide number of its first pair (the pairs of the slots before it): ``[S_PAD]`` int64 each.

    A request of ``n`` rows is cut into ``(n + 1) // 2`` pairs: its rows 0 and 1, 2 and 3, ... (the
    last pair of an odd ``n`` has one row). Two consecutive positions hold exactly one odd one, so
    each pair completes at most one group. Counted in slot order, the pairs are numbered in row
    order. Read from the extend offsets alone, once a program; slots past ``request_slots`` have
    no pairs and a first pair number past every pair.
    """
    starts, ends = request_slot_table(offsets_ptr, request_slots, S_PAD)
    real = tl.arange(0, S_PAD) < request_slots
    pairs = tl.where(real, tl.maximum(ends - starts + 1, 0) // 2, 0)
    first_pair = tl.cumsum(pairs, axis=0) - pairs
    return starts, ends, pairs, tl.where(real, first_pair, NO_ROW)


@triton.jit
def in_request(mine):
    """``[N]`` bool: each lane's pair lies inside a request (``mine``: ``[S_PAD, N]``, which request
    slot's pairs hold each lane's pair number); padding rows lie in none.

    Only the offsets decide where one request stops and the next begins: ``pos`` and ``req`` are
    not compared.
    """
    return tl.max(mine.to(tl.int32), axis=0) != 0


@triton.jit
def first_rows(k, take_first):
    """``[N]`` bool: each lane's row is the first row of its request (whose partner may be in the
    ring): the first row (``take_first``) of its request's pair number ``k == 0``."""
    return take_first & (k == 0)


@triton.jit
def lane_rows(block, starts, ends, pairs, first_pair, pos_ptr, req_ptr, raw_ptr, num_rows,
              LANES: tl.constexpr, GROUPS_PER_BLOCK: tl.constexpr):
    """Every fact about the row each lane computes, found once: the row, its ``pos``, ``req`` and
    ``raw_out_loc`` (``[LANES]`` int64 each) and whether it is its request's first row (``[LANES]``
    bool), from the pair table (:func:`pair_table`).

    Lane ``t`` of block ``b`` takes the batch's group number ``b * GROUPS_PER_BLOCK + t``: a pair
    of rows of the request whose pairs hold it, and computes the pair's row at an odd ``pos``.
    ``pos``, ``req`` and ``raw_out_loc`` are loaded for both rows at once (one trip to memory). A
    lane past ``GROUPS_PER_BLOCK`` (``tl.dot`` needs 16 lanes) or past the batch's last group gets
    ``num_rows``: past the buffer, so it loads and stores nothing; so does a lane whose pair has no
    odd position (a request's last row, alone and at an even position).
    """
    lane = tl.arange(0, LANES)
    p = block * GROUPS_PER_BLOCK + lane.to(tl.int64)
    # [S_PAD, LANES]: each lane's pair number inside each request (the request slots down the
    # tile: summed over axis 0, the lanes' rows come out in the layout the lanes' tiles use).
    k = p[None, :] - first_pair[:, None]
    mine = (k >= 0) & (k < pairs[:, None])
    k = tl.sum(tl.where(mine, k, 0), axis=0)  # the lane's pair number inside its request
    first = tl.sum(tl.where(mine, starts[:, None], 0), axis=0) + 2 * k  # the pair's first row
    end = tl.sum(tl.where(mine, ends[:, None], 0), axis=0)  # one past its request's last row
    # The lowest row a pair reads is its partner, the row before it (but for a request's first pair,
    # whose partner is a ring row): offsets that start before row 0 must not read before the buffer.
    a = in_request(mine) & (lane < GROUPS_PER_BLOCK) & (first - tl.minimum(k, 1) >= 0) & (first < num_rows)
    b = a & (first + 1 < end) & (first + 1 < num_rows)
    # Both rows' metadata, in one trip: under offsets that are right, the second row's pos is the
    # first's plus one and its req the same, but a graph replaying frozen offsets can put a pair
    # across two requests, and the lane must then see the rows as they are (no group where neither
    # pos is odd), or two lanes would race to store one c2 slot.
    pos_a = tl.load(pos_ptr + first, mask=a, other=0)
    pos_b = tl.load(pos_ptr + first + 1, mask=b, other=0)
    req_a = tl.load(req_ptr + first, mask=a, other=0)
    req_b = tl.load(req_ptr + first + 1, mask=b, other=0)
    raw_a = tl.load(raw_ptr + first, mask=a, other=0)
    raw_b = tl.load(raw_ptr + first + 1, mask=b, other=0)
    take_a = a & (pos_a % 2 == 1)
    take_b = b & ~take_a & (pos_b % 2 == 1)
    rows = tl.where(take_a, first, tl.where(take_b, first + 1, num_rows))
    return (rows, tl.where(take_a, pos_a, pos_b), tl.where(take_a, req_a, req_b),
            tl.where(take_a, raw_a, tl.where(take_b, raw_b, 0)), first_rows(k, take_a))


@triton.jit
def ring_row(req, pos, RING: tl.constexpr):
    """The ring row of the row at ``pos`` of pool request ``req`` (``[N]`` int64): ``req * RING + pos % RING``."""
    return req * RING + pos % RING


@triton.jit
def stores_group(rows, pos, req, raw, from_ring, num_rows, kv_slots, ring_rows, RING: tl.constexpr):
    """``[N]`` bool: each lane's row (``[N]`` int64, with its ``pos``, ``req``, ``raw_out_loc`` and
    whether its partner is a ring row) completes a group, and stores it.

    A lane has a row (``rows < num_rows``) only where :func:`lane_rows` found a live row at an odd
    ``pos``. ``raw_out_loc == 0`` marks a padding row: it never stores, even if the offsets claimed
    it. And a row whose c2 slot lies past the caches (``kv_slots`` rows), or whose ring partner lies
    outside the ring's request rows (``ring_rows - 1``), stores nothing: no address outside a tensor.
    """
    slot = raw // 2
    partner = ring_row(req, pos - 1, RING)
    in_ring = (partner >= 0) & (partner < ring_rows - 1)
    return (rows < num_rows) & (raw != 0) & (slot >= 0) & (slot < kv_slots) & (~from_ring | in_ring)


@triton.jit
def park_in_ring(projected_ptr, ring_ptr, pos_ptr, req_ptr, raw_ptr, starts, ends, first_pair, block,
                 num_rows, ring_rows, D: tl.constexpr, RING: tl.constexpr, RING_PAD: tl.constexpr,
                 GROUPS_PER_BLOCK: tl.constexpr, S_PAD: tl.constexpr):
    """Park each request's last ``min(count, RING)`` rows at ring row ``req * RING + pos % RING``.

    A block parks the requests whose first pair is one of its lanes' (a request with no rows: the
    number its first pair would have had). Only a request's first row reads that request's ring
    rows, in its first pair's lane, and this program read them in pass A, before the barrier: no
    program can race with these writes. First pair numbers never decrease, so those requests are
    the request slots ``[lo, hi)``: a loop with run-time bounds, each request's rows taken from
    the pair table already in registers (no trip to memory before its rows are loaded). A ring
    row outside the ring's request rows (``ring_rows - 1``) is not written.
    """
    lo = tl.sum((first_pair < block * GROUPS_PER_BLOCK).to(tl.int32), axis=0)
    hi = tl.sum((first_pair < (block + 1) * GROUPS_PER_BLOCK).to(tl.int32), axis=0)
    j = tl.arange(0, RING_PAD)
    both = tl.arange(0, 2 * D)  # | kv | score |
    slots = tl.arange(0, S_PAD)
    # The slots past the last request with rows park nothing (the slots past the batch all share
    # one first pair number, in one block): the loop stops before them, whatever the request slots.
    hi = tl.minimum(hi, tl.max(tl.where(ends > starts, slots, -1), axis=0) + 1)
    for r in range(lo, hi):
        end = tl.sum(tl.where(slots == r, ends, 0), axis=0)
        n_park = tl.maximum(tl.minimum(end - tl.sum(tl.where(slots == r, starts, 0), axis=0), RING), 0)
        src = end - n_park + j  # the request's last rows
        ok = (j < n_park) & (src >= 0) & (src < num_rows)
        # The rows and what they hold, in one trip to memory: the rows' loads need only ``src``.
        rows = tl.load(projected_ptr + src[:, None] * (2 * D) + both[None, :], mask=ok[:, None])
        pos = tl.load(pos_ptr + src, mask=ok, other=0)
        req = tl.load(req_ptr + src, mask=ok, other=0)
        dst = ring_row(req, pos, RING)
        ok = ok & (tl.load(raw_ptr + src, mask=ok, other=0) != 0) & (dst >= 0) & (dst < ring_rows - 1)
        tl.store(ring_ptr + dst[:, None] * (2 * D) + both[None, :], rows, mask=ok[:, None])
