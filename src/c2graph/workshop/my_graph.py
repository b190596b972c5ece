"""Notebook 03's workbench: capture a compressor on a static batch and replay it against eager,
and the checks of 03's exercises (the graph-safe store and the graph-safe park).

:func:`replay_against_eager` captures ``compress(layer, x, batch, pools)`` once, on a dummy batch
(to Python, one request of all rows; to the captured ops, every row padding, ``raw_out_loc`` 0, so
the capture writes nothing real), then for each batch ``copy_``-es its metadata
and hidden states into the static tensors, replays, and compares the pools with the library's
torch path run eagerly on the same padded batch. It is how notebook 03 shows that notebook 01's
``my_compress`` is refused by a capture, and what each graph-safe change fixes.

The checks take the reader's function, run it eagerly on the hand-made edge cases and then seeded
random batches (the same verdict in every run) against the eager reference, then capture it once and replay it on other batches. They check
first that the function wrote into the caches and the ring it was given (not new tensors), then
say pass, or, for each cache (``kv_cache``, ``index_k``, the ring) and c2 slot or ring row, whether
it was never written (it still holds :data:`~c2graph.compressor.pools.POISON`), written wrong, or
written where nothing should be. They never raise because the reader's code does.
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
from .practice import (
    HAND_MADE_WORDS,
    Captured,
    StaticBatch,
    capture_yours,
    check_rng,
    figure_of,
    practice_batches,
    practice_pools,
    refusal_words,
    requests_text,
    row_words,
)
from .my_compressor import my_store


@dataclass
class ReplayReport:
    """What :func:`replay_against_eager` saw: the capture's refusal (``refused``: why, at which
    line of which function), or for each batch (its requests) the comparisons of both caches and
    the ring with eager."""

    refused: Captured | None = None
    batches: list[tuple[list, list[Comparison]]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.refused is None and all(all(c) for _, c in self.batches)

    def __bool__(self) -> bool:
        return self.ok

    def __str__(self) -> str:
        if self.refused is not None:
            return f"the capture refused it, in {self.refused.at or 'your function'}:\n  {self.refused.error}"
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
    got = capture_yours(lambda: compress_fn(layer, x, static.batch, graph_pools))
    if got.error:
        return ReplayReport(got)
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

CACHES = ("kv_cache", "index_k")


def _random(rng: random.Random, *shape, dtype=torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(rng.randrange(2**31))
    return torch.randn(*shape, generator=g).to(dtype).to(DEFAULT_DEVICE)


def _more(items: list[str], total: int) -> str:
    return "; ".join(items) + (f" (and {total - len(items)} more)" if total > len(items) else "")


def _rebound(pools: Pools, before: dict[str, torch.Tensor]) -> str | None:
    """The caches must be written in place: a name of ``pools`` given a new tensor is the mistake."""
    for name, t in before.items():
        if getattr(pools, name) is not t:
            return (f"after your function, `pools.{name}` is a new tensor ({getattr(pools, name).dtype}, "
                    f"{tuple(getattr(pools, name).shape)}): it rebound the name instead of writing into the cache "
                    f"({t.dtype}, {tuple(t.shape)}); `pools.{name}[slots] = values` writes in place")
    return None


def _slot_words(plan, slot: int) -> str:
    """Which row writes c2 slot ``slot`` in this batch, or whose slot it is."""
    writer = next((p.row for p in plan.rows if p.c2_slot == slot), None)
    if writer is not None:
        return f"c2 slot {slot} ({row_words(plan, writer)})"
    rows = [p.row for p in plan.rows if not p.is_padding and p.raw_out_loc // 2 == slot]
    return (f"c2 slot {slot} (the slot of {row_words(plan, rows[0])}, an even row: its group is not complete)"
            if rows else f"c2 slot {slot} (no row of this batch)")


def _diff_slots(got: Pools, want: Pools, batch: ExtendBatch) -> tuple[list[int], str]:
    """c2 slots (slot 0 aside) where either cache differs, and up to three differences in words: the
    cache, the c2 slot and the row that writes it, and never written / written wrong / written where
    nothing should be."""
    plan, words, bad = plan_rows(batch, 2), [], set()
    for cache in CACHES:
        g, w = getattr(got, cache), getattr(want, cache)
        for slot in compare(g, w, cache, rows=slice(1, None)).bad:
            bad.add(slot)
            if bool((g[slot] == POISON).all()):
                kind = f"never written (still the poison {POISON:g})"
            elif bool((w[slot] == POISON).all()):
                kind = "written, but nothing should be stored there"
            else:
                kind = "written wrong"
                other = CACHES[1 - CACHES.index(cache)]
                if cache == "kv_cache" and compare(getattr(got, other)[slot:slot + 1], getattr(want, other)[slot:slot + 1]):
                    kind += " (index_k is right there: look at the RoPE of the latent, at the group position pos - pos % 2)"
            words.append(f"{cache} {_slot_words(plan, slot)}: {kind}")
    return sorted(bad), _more(words[:3], len(words))


def _rows_of(batch: ExtendBatch, slots: list[int]) -> list[int]:
    """Batch rows whose ``raw_out_loc // 2`` is one of ``slots`` (for the picture)."""
    raw = batch.raw_out_loc.cpu().tolist()
    return [row for row in range(batch.num_rows) if raw[row] != 0 and raw[row] // 2 in slots]


def _diff_ring(got: torch.Tensor, want: torch.Tensor, batch: ExtendBatch, rows: torch.Tensor,
               ring_size: int) -> tuple[list[int], list[int], str]:
    """Ring rows that differ, the batch rows that should have written them (for the picture), and up to
    three in words: the sentinel not restored, never written, written wrong (with whose values), or
    written where this batch parks nothing. ``rows``: the batch's ``| kv | score |`` ``[T, 2D]``."""
    plan, sentinel = plan_rows(batch, ring_size), got.shape[0] - 1
    bad, words = compare(got, want, "ring").bad, []
    for r in bad:
        if r == sentinel:
            words.append(f"ring row {r}, the sentinel: not restored to | 0 | -inf | after the park")
        elif r not in plan.parked:
            words.append(f"ring row {r}: written, but this batch parks nothing there (it should keep what it held)")
        elif bool((got[r] == POISON).all()):
            words.append(f"ring row {r} (should hold {row_words(plan, plan.parked[r])}): never written "
                         f"(still the poison {POISON:g})")
        else:
            match = (rows.cpu() == got[r].cpu()).all(dim=1).nonzero().flatten().tolist()
            holds = f": it holds {row_words(plan, match[0])}'s | kv | score |" if match else ""
            words.append(f"ring row {r} (should hold {row_words(plan, plan.parked[r])}): written wrong{holds}")
    writers = [plan.parked[r] for r in bad if r in plan.parked]
    return bad, writers, _more(words[:3], len(words))


def _graph_phase(cfg, rng, state, step, load_inputs, run_eager, differs, bucket=16, slots=4):
    """Capture ``step(batch)`` once on the dummy batch, then replay it on the practice batches against ``run_eager``."""
    static = StaticBatch(bucket, slots, device=DEFAULT_DEVICE)
    got = capture_yours(lambda: step(static.batch))
    if got.error:
        return [(False, refusal_words(got))]
    replays = practice_batches(cfg, rng, 8, bucket=bucket, request_slots=slots)
    for what, batch in replays:
        load_inputs(batch)
        static.load(batch)
        got.graph.replay()
        run_eager(batch)
        bad_rows, words = differs(batch)
        if bad_rows is not None:
            state.setdefault("fig", (batch, bad_rows, f"graph replay: {what}"))
            return [(False, f"captured once on a dummy batch (one request of all {bucket} rows), replayed on "
                            f"{what} {requests_text(batch)}: {words}")]
    return [(True, f"captured once on a dummy batch, replayed on {len(replays)} batches of {bucket} rows: "
                   "every replay equal to eager")]


def check_store_graph_safe(fn) -> CheckResult:
    """Check ``fn(pools, latent, key, batch, layer)``: writes what notebook 01's ``my_store`` writes
    (slot 0 aside) into ``pools.kv_cache`` and ``pools.index_k`` in place, and can be captured once
    and replayed on any batch."""
    cfg, rng, state = Config.tiny(), check_rng(), {}
    layer = SourceLayer(cfg, seed=rng.randrange(2**31), use_fused_gate=False)

    def cases():
        cases = practice_batches(cfg, rng)
        for what, batch in cases:
            T = batch.num_rows
            latent, key = _random(rng, T, cfg.D, dtype=torch.bfloat16), _random(rng, T, cfg.index_dim, dtype=torch.bfloat16)
            mine, want = practice_pools(cfg, POISON), practice_pools(cfg, POISON)
            before = {name: getattr(mine, name) for name in CACHES}
            fn(mine, latent, key, batch, layer)
            rebound = _rebound(mine, before)
            if rebound:
                return [(False, f"run eagerly on {what} {requests_text(batch)}: {rebound}")]
            my_store(want, latent, key, batch, layer)
            bad, words = _diff_slots(mine, want, batch)
            if bad:
                state.setdefault("fig", (batch, _rows_of(batch, bad), f"store, run eagerly: {what}"))
                return [(False, f"run eagerly on {what} {requests_text(batch)}: {words}")]
        eager = (True, f"run eagerly on {len(cases)} batches ({HAND_MADE_WORDS}; then random ones): the same "
                       "c2 slots as notebook 01's store, in both caches")
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

    return run_check("graph-safe store", cases, figure_of(state))


def check_park_graph_safe(fn) -> CheckResult:
    """Check ``fn(ring, kv, score, batch, ring_size)``: parks what the library's torch path parks into
    ``ring`` in place (the whole ring bitwise, sentinel included), and can be captured once and
    replayed on any batch."""
    cfg, rng, state = Config.tiny(), check_rng(), {}
    R, D = cfg.ring_size, cfg.D

    def cases():
        cases = practice_batches(cfg, rng)
        for what, batch in cases:
            T = batch.num_rows
            kv, score = _random(rng, T, D), _random(rng, T, D)
            mine, want = practice_pools(cfg, POISON).ring, practice_pools(cfg, POISON).ring
            fn(mine, kv, score, batch, R)
            park(want, kv, score, batch, R)
            bad, rows, words = _diff_ring(mine, want, batch, torch.cat([kv, score], 1), R)
            if bad:
                state.setdefault("fig", (batch, rows, f"park, run eagerly: {what}"))
                return [(False, f"run eagerly on {what} {requests_text(batch)}: {words}")]
        eager = (True, f"run eagerly on {len(cases)} batches ({HAND_MADE_WORDS}; then random ones): the same "
                       "ring, sentinel included")
        bucket = 16
        kv, score = (torch.zeros(bucket, D, device=DEFAULT_DEVICE) for _ in range(2))
        ring, ref = practice_pools(cfg, POISON).ring, practice_pools(cfg, POISON).ring

        def load_inputs(batch):
            kv.copy_(_random(rng, bucket, D))
            score.copy_(_random(rng, bucket, D))

        def differs(batch):
            bad, rows, words = _diff_ring(ring, ref, batch, torch.cat([kv, score], 1), R)
            return (rows, words) if bad else (None, "")

        return [eager] + _graph_phase(cfg, rng, state, lambda b: fn(ring, kv, score, b, R), load_inputs,
                                      lambda b: park(ref, kv, score, b, R), differs, bucket)

    return run_check("graph-safe park", cases, figure_of(state))
