"""Shared helpers for the tests: fresh random cases, hypothesis strategies, poison checks."""

from __future__ import annotations

import torch
from hypothesis import strategies as st

import c2graph as c2
from c2graph.compressor.pools import POISON  # noqa: F401  (re-exported to the tests)


def make_case(cfg=None, *, pool_requests=6, max_seq_len=96, seed=0, use_fused_gate=True, device=None):
    """A layer, a req_to_token allocator and poisoned pools, all seeded."""
    cfg = cfg or c2.Config.tiny()
    layer = c2.SourceLayer(cfg, seed=seed, use_fused_gate=use_fused_gate, device=device)
    alloc = c2.ReqToTokenPool(cfg, pool_requests, max_seq_len, seed=seed)
    pools = c2.Pools(cfg, pool_requests, alloc.kv_slots, device=device).poison(POISON)
    return layer, alloc, pools


@st.composite
def ragged_requests(draw, pool_requests=6, max_requests=4, max_prefix=20, max_len=9):
    """1..max_requests requests on distinct pool indices, odd and even prefixes, lengths 1..max_len."""
    n = draw(st.integers(1, max_requests))
    pools = draw(st.permutations(range(pool_requests)))[:n]
    return [
        (p, draw(st.integers(0, max_prefix)), draw(st.integers(1, max_len)))
        for p in pools
    ]


def random_hidden(layer, rows: int, seed: int) -> torch.Tensor:
    return layer.random_hidden(rows, seed)


def untouched_slots_keep_poison(pools: c2.Pools, written: set[int], *, skip_slot0: bool) -> list[int]:
    """c2 slots outside ``written`` that no longer hold the poison (should be empty)."""
    bad = []
    for t in (pools.kv_cache, pools.index_k):
        keeps = (t.float().cpu() == POISON).all(dim=1)
        for s in range(t.shape[0]):
            if s in written or (skip_slot0 and s == 0):
                continue
            if not keeps[s]:
                bad.append(s)
    return sorted(set(bad))


def written_slots_hold_no_poison(pools: c2.Pools, written: set[int]) -> list[int]:
    """c2 slots in ``written`` whose rows still hold the poison somewhere (should be empty)."""
    bad = []
    for t in (pools.kv_cache, pools.index_k):
        still = (t.float().cpu() == POISON).any(dim=1)
        bad += [s for s in written if still[s]]
    return sorted(set(bad))
