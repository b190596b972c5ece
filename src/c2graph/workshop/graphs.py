"""Notebook 03's workbench: capture a compressor on a static batch and replay it against eager,
and the checks of 03's exercises (the graph-safe store and the graph-safe park).

:func:`replay_against_eager` captures ``compress(layer, x, batch, pools)`` once, on a dummy batch
(one request covering all rows, every row padding), then for each batch ``copy_``-es its metadata
and hidden states into the static tensors, replays, and compares the pools with the library's
torch path run eagerly on the same padded batch. It is how notebook 03 shows that notebook 01's
``my_compress`` is refused by a capture, and what each graph-safe change fixes.

The checks take the reader's function, run it eagerly on hand-made and fresh random batches
against notebook 01's eager version, then capture it once and replay it on other batches. They
say pass, or which c2 slots or ring rows differ and why; they never raise because the reader's
code does.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import torch

from .._runtime import DEFAULT_DEVICE
from ..compressor.batch import ExtendBatch
from ..compressor.config import Config
from ..compressor.pools import POISON, Pools
from ..compressor.req_to_token import ReqToTokenPool
from ..compressor.rows import plan_rows
from ..compressor.source_layer import SourceLayer, project
from ..compressor.torch_path import compress_torch, park
from ..measure.compare import Comparison, compare, compare_pools
from .check import CheckResult, run_check
from .compressor import (
    StaticBatch,
    capture,
    fresh_rng,
    my_store,
    practice_batches,
    practice_pools,
    row_words,
    rows_figure,
)



@dataclass
class ReplayReport:
    """What :func:`replay_against_eager` saw: the capture's refusal (``error``, ``where``), or for
    each batch (its requests) the comparisons of both caches and the ring with eager."""

    error: str | None = None
    where: str | None = None
    batches: list[tuple[list, list[Comparison]]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.error is None and all(all(c) for _, c in self.batches)

    def __bool__(self) -> bool:
        return self.ok

    def __str__(self) -> str:
        if self.error:
            return f"the capture refused it, in {self.where}:\n  {self.error}"
        lines = []
        for requests, comparisons in self.batches:
            lines.append(f"replay of {requests}:")
            lines += [f"  {c}" for c in comparisons]
        return "\n".join(lines)

    __repr__ = __str__


def replay_against_eager(compress_fn, batches, *, bucket: int = 16, request_slots: int = 4,
                         seed: int = 0) -> ReplayReport:
    """Capture ``compress_fn(layer, x, batch, pools)`` on a dummy batch of ``bucket`` rows, then replay
    it on each batch of ``batches`` (lists of ``(pool_index, prefix_len, extend_len)``) and compare
    the pools with :func:`~c2graph.compressor.torch_path.compress_torch` run eagerly on the same
    padded batch. Both sets of pools start poisoned; c2 slot 0 is not compared (the torch path's
    dump slot). ``x`` is ``[bucket, hidden]`` bf16: the live rows' hidden states, then zeros.
    """
    cfg = Config.tiny()
    layer = SourceLayer(cfg, seed=seed, use_fused_gate=False)
    alloc = ReqToTokenPool(cfg, pool_requests=6, max_seq_len=64, seed=seed)
    graph_pools = Pools(cfg, 6, alloc.kv_slots).poison(POISON)
    eager_pools = graph_pools.clone()
    static = StaticBatch(bucket, request_slots, device=DEFAULT_DEVICE)
    x = torch.zeros(bucket, cfg.hidden, dtype=torch.bfloat16, device=DEFAULT_DEVICE)
    got = capture(lambda: compress_fn(layer, x, static.batch, graph_pools))
    if got.error:
        return ReplayReport(got.error, got.where)
    report = ReplayReport()
    for i, requests in enumerate(batches):
        batch = ExtendBatch.build(requests, alloc, request_slots=request_slots, pad_to=bucket)
        x.zero_()
        x[: batch.live_rows] = layer.random_hidden(batch.live_rows, seed=seed + 1 + i)
        static.load(batch)
        got.graph.replay()
        compress_torch(layer, *project(layer, x), batch, eager_pools)
        report.batches.append((list(requests), compare_pools(graph_pools, eager_pools)))
    return report


# --- the checks of notebook 03's exercises --------------------------------------------------------


def _random(rng: random.Random, *shape, dtype=torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(rng.randrange(2**31))
    return torch.randn(*shape, generator=g).to(dtype).to(DEFAULT_DEVICE)


def _slot_words(batch: ExtendBatch, slot: int, eager_kept_poison: bool) -> str:
    """Which row writes c2 slot ``slot`` in this batch, or that none should."""
    plan = plan_rows(batch, 2)
    writer = next((p.row for p in plan.rows if p.c2_slot == slot), None)
    if writer is not None:
        return f"c2 slot {slot} ({row_words(plan, writer)})"
    rows = [p.row for p in plan.rows if not p.is_padding and p.raw_out_loc // 2 == slot]
    who = f" (the slot of {row_words(plan, rows[0])}, an even row: its group is not complete)" if rows else ""
    return f"c2 slot {slot}{who} should not be written" if eager_kept_poison else f"c2 slot {slot}{who}"


def _ring_words(batch: ExtendBatch, ring_row: int, sentinel: int) -> str:
    plan = plan_rows(batch, 2)
    if ring_row == sentinel:
        return f"ring row {ring_row} (the sentinel: it must hold | 0 | -inf | after the park)"
    if ring_row in plan.parked:
        return f"ring row {ring_row} (should hold {row_words(plan, plan.parked[ring_row])})"
    return f"ring row {ring_row} (this batch parks nothing there: it should keep what it held)"


def _rows_of(batch: ExtendBatch, slots: list[int]) -> list[int]:
    """Batch rows whose ``raw_out_loc // 2`` is one of ``slots`` (for the picture)."""
    raw = (batch.raw_out_loc // 2).cpu().tolist()
    return [row for row in range(batch.num_rows) if raw[row] in slots and batch.raw_out_loc[row] != 0]


def _diff_slots(got: Pools, want: Pools, batch: ExtendBatch) -> tuple[list[int], str]:
    """c2 slots (slot 0 aside) where either cache differs, and up to three of them in words."""
    bad = sorted(set(compare(got.kv_cache, want.kv_cache, "kv_cache", rows=slice(1, None)).bad)
                 | set(compare(got.index_k, want.index_k, "index_k", rows=slice(1, None)).bad))
    words = [_slot_words(batch, s, bool((want.kv_cache[s] == POISON).all())) for s in bad[:3]]
    return bad, "; ".join(words) + (f" (and {len(bad) - 3} more)" if len(bad) > 3 else "")


def _requests_text(batch: ExtendBatch) -> str:
    pad = f" padded to {batch.num_rows}" if batch.num_rows > batch.live_rows else ""
    return f"{[tuple(r) for r in batch.requests]}{pad}"


def _graph_phase(cfg, rng, state, capture_fn, load_inputs, run_eager, differs, bucket=16, slots=4):
    """Capture once on the dummy batch, then replay on fresh batches against ``run_eager``."""
    static = StaticBatch(bucket, slots, device=DEFAULT_DEVICE)
    got = capture(lambda: capture_fn(static.batch))
    if got.error:
        return [(False, f"the capture refused your function, in {got.where}: {got.error}")]
    replays = practice_batches(cfg, rng, 8, bucket=bucket, request_slots=slots)
    for what, batch in replays:
        load_inputs(batch)
        static.load(batch)
        got.graph.replay()
        run_eager(batch)
        bad_rows, words = differs(batch)
        if bad_rows is not None:
            state.setdefault("fig", (batch, bad_rows, f"graph replay: {what}"))
            return [(False, f"captured once, replayed on {what} ({_requests_text(batch)}): {words}")]
    return [(True, f"captured once on a dummy batch, replayed on {len(replays)} batches of {bucket} rows: "
                   "every replay equal to eager")]


def check_store_graph_safe(fn) -> CheckResult:
    """Check ``fn(pools, latent, key, batch, layer)``: writes what notebook 01's ``my_store`` writes
    (slot 0 aside), and can be captured once and replayed on any batch."""
    cfg, rng, state = Config.tiny(), fresh_rng(), {}
    layer = SourceLayer(cfg, seed=rng.randrange(2**31), use_fused_gate=False)

    def cases():
        for what, batch in practice_batches(cfg, rng):
            T = batch.num_rows
            latent, key = _random(rng, T, cfg.D, dtype=torch.bfloat16), _random(rng, T, cfg.index_dim, dtype=torch.bfloat16)
            mine, want = practice_pools(cfg, POISON), practice_pools(cfg, POISON)
            fn(mine, latent, key, batch, layer)
            my_store(want, latent, key, batch, layer)
            bad, words = _diff_slots(mine, want, batch)
            if bad:
                state.setdefault("fig", (batch, _rows_of(batch, bad), f"store, run eagerly: {what}"))
                return [(False, f"run eagerly on {what} ({_requests_text(batch)}): {words}")]
        eager = (True, "run eagerly on 16 batches (request boundaries, odd starts, padding, an idle rank, "
                       "random ones): the same c2 slots as notebook 01's store")
        bucket = 16
        static_latent = torch.zeros(bucket, cfg.D, dtype=torch.bfloat16, device=DEFAULT_DEVICE)
        static_key = torch.zeros(bucket, cfg.index_dim, dtype=torch.bfloat16, device=DEFAULT_DEVICE)
        pools, ref = practice_pools(cfg, POISON), practice_pools(cfg, POISON)

        def load_inputs(batch):
            static_latent.copy_(_random(rng, bucket, cfg.D, dtype=torch.bfloat16))
            static_key.copy_(_random(rng, bucket, cfg.index_dim, dtype=torch.bfloat16))

        def differs(batch):
            bad, words = _diff_slots(pools, ref, batch)
            return (_rows_of(batch, bad), words) if bad else (None, "")

        return [eager] + _graph_phase(
            cfg, rng, state, lambda b: fn(pools, static_latent, static_key, b, layer), load_inputs,
            lambda b: my_store(ref, static_latent, static_key, b, layer), differs, bucket)

    return run_check("graph-safe store", cases, lambda: rows_figure(*state["fig"]) if "fig" in state else None)


def check_park_graph_safe(fn) -> CheckResult:
    """Check ``fn(ring, kv, score, batch, ring_size)``: parks what the library's torch path parks (the
    whole ring bitwise, sentinel included), and can be captured once and replayed on any batch."""
    cfg, rng, state = Config.tiny(), fresh_rng(), {}
    R, D = cfg.ring_size, cfg.D

    def ring_diff(got, want, batch):
        bad = compare(got, want, "ring").bad
        words = "; ".join(_ring_words(batch, r, got.shape[0] - 1) for r in bad[:3])
        rows = [plan_rows(batch, R).parked.get(r) for r in bad]
        return bad, [r for r in rows if r is not None], words + (f" (and {len(bad) - 3} more)" if len(bad) > 3 else "")

    def cases():
        for what, batch in practice_batches(cfg, rng):
            T = batch.num_rows
            kv, score = _random(rng, T, D), _random(rng, T, D)
            mine, want = practice_pools(cfg, POISON).ring, practice_pools(cfg, POISON).ring
            fn(mine, kv, score, batch, R)
            park(want, kv, score, batch, R)
            bad, rows, words = ring_diff(mine, want, batch)
            if bad:
                state.setdefault("fig", (batch, rows, f"park, run eagerly: {what}"))
                return [(False, f"run eagerly on {what} ({_requests_text(batch)}): ring rows differ: {words}")]
        eager = (True, "run eagerly on 16 batches (request boundaries, odd starts, padding, an idle rank, "
                       "random ones): the same ring, sentinel included")
        bucket = 16
        kv, score = (torch.zeros(bucket, D, device=DEFAULT_DEVICE) for _ in range(2))
        ring, ref = practice_pools(cfg, POISON).ring, practice_pools(cfg, POISON).ring

        def load_inputs(batch):
            kv.copy_(_random(rng, bucket, D))
            score.copy_(_random(rng, bucket, D))

        def differs(batch):
            bad, rows, words = ring_diff(ring, ref, batch)
            return (rows, f"ring rows differ: {words}") if bad else (None, "")

        return [eager] + _graph_phase(cfg, rng, state, lambda b: fn(ring, kv, score, b, R), load_inputs,
                                      lambda b: park(ref, kv, score, b, R), differs, bucket)

    return run_check("graph-safe park", cases, lambda: rows_figure(*state["fig"]) if "fig" in state else None)
