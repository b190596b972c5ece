"""What the benchmark times: its batches, the input sets it rotates, and the calls of each path.

A *case* is one row count (a bucket): a ragged batch of 8 to 16 requests with odd and even
prefixes, its live rows 15/16 of the bucket (the rest padding), in a batch of 16 request slots.
An *input set* is everything one call reads and writes (the batch's metadata, the projection
output, the caches and the ring, the latents); the benchmark makes enough copies of it that
together they are twice the L2 cache, and times the copies in turn.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch

from ..compressor.batch import ExtendBatch, Request
from ..compressor.config import Config
from ..compressor.fused import compress_fused, kernel_blocks
from ..compressor.pools import Pools
from ..compressor.programs import program_plan
from ..compressor.req_to_token import ReqToTokenPool
from ..compressor.source_layer import SourceLayer
from ..compressor.torch_path import compress_torch
from ..graphs.graph import Graph
from .traffic import minimum_bytes

REQUESTS = (8, 16)
"""Fewest and most requests of a case's batch; the batch has ``REQUESTS[1]`` request slots."""
MAX_PREFIX = 512
"""Prefixes are drawn below this, half of them odd."""


def bench_requests(rows: int, seed: int) -> list[tuple[int, int, int]]:
    """``(pool_index, prefix_len, extend_len)`` of 8 to 16 requests (fewer if ``rows`` is tiny).

    Their extend lengths are a random split of ``rows - rows // 16`` live rows; prefixes are
    random, odd for every second request, so half the requests start at an odd position and read
    their first partner from the ring. Pool indices are shuffled.
    """
    if not isinstance(rows, int) or rows < 2:
        raise ValueError(f"rows = {rows!r}; expected an int >= 2")
    g = torch.Generator().manual_seed(seed)
    live = rows - rows // 16
    n = min(int(torch.randint(REQUESTS[0], REQUESTS[1] + 1, (1,), generator=g)), live)
    cuts = sorted(torch.randperm(live - 1, generator=g)[: n - 1].add(1).tolist())
    lengths = [b - a for a, b in zip([0, *cuts], [*cuts, live])]
    prefixes = [2 * int(torch.randint(0, MAX_PREFIX // 2, (1,), generator=g)) + i % 2 for i in range(n)]
    pool = torch.randperm(n, generator=g).tolist()
    return [(p, prefix, length) for p, prefix, length in zip(pool, prefixes, lengths)]


@dataclass
class Case:
    """One row count: the batch (on the device), its allocator, and what the records say about it."""

    rows: int
    requests: list[tuple[int, int, int]]
    allocator: ReqToTokenPool
    batch: ExtendBatch
    programs: int
    floor_bytes: int
    bytes_weights_per_program: int
    copies: int

    def info(self) -> dict:
        """The case as the results file stores it."""
        return {
            "rows": self.rows,
            "live_rows": self.batch.live_rows,
            "requests": self.batch.batch_size,
            "odd_prefixes": sum(r[1] % 2 for r in self.requests),
            "programs": self.programs,
            "floor_bytes": self.floor_bytes,
            "bytes_weights_per_program": self.bytes_weights_per_program,
            "copies": self.copies,
        }


def make_case(cfg: Config, rows: int, device: torch.device, *, cache_bytes: int, copies: tuple[int, int],
              seed: int = 0) -> Case:
    """The case of ``rows`` rows. Its input sets together make at least twice ``cache_bytes``:
    as many copies as that takes, within ``copies = (fewest, most)``."""
    requests = bench_requests(rows, seed=seed + rows)
    longest = max(prefix + n for _, prefix, n in requests)
    allocator = ReqToTokenPool(cfg, REQUESTS[1], longest, seed=seed)
    batch = ExtendBatch.build(requests, allocator, request_slots=REQUESTS[1], pad_to=rows, device=device)
    # Each program of the fused kernel that has groups reads the weights: ask the kernel's own plan how many.
    plan = program_plan(batch, cfg.ring_size, groups_per_block=kernel_blocks(cfg.D, batch.num_rows).groups_per_block)
    programs = sum(bool(p["groups"]) for p in plan)
    floor_bytes = sum(minimum_bytes(cfg, batch).values())
    per_program = sum(minimum_bytes(cfg, batch, programs=programs).values())
    fewest, most = copies
    n = max(fewest, min(most, math.ceil(2 * cache_bytes / floor_bytes)))
    return Case(rows, requests, allocator, batch, programs, floor_bytes, per_program, n)


@dataclass
class InputSet:
    """What one call reads and writes. ``projected``: ``[T, 2D]`` fp32 ``| kv | score |`` (fused
    path); ``kv``, ``score``: ``[T, D]`` fp32, separate buffers (torch path); ``latent``: ``[T, D]``
    bf16. Padding rows of the projection are zero, as the prefill graph's refresh leaves them."""

    batch: ExtendBatch
    pools: Pools
    projected: torch.Tensor
    kv: torch.Tensor
    score: torch.Tensor
    latent: torch.Tensor


def input_sets(cfg: Config, case: Case, copies: int, seed: int = 0) -> list[InputSet]:
    """``copies`` independent input sets of ``case``, filled with seeded random values."""
    device, T, live, D = case.batch.device, case.rows, case.batch.live_rows, cfg.D
    g = torch.Generator(device=device).manual_seed(seed)
    sets = []
    for _ in range(copies):
        tensors = {f: getattr(case.batch, f).clone() for f in ("pos", "req", "raw_out_loc", "c2_slot", "extend_offsets")}
        projected = torch.randn(T, 2 * D, generator=g, device=device)
        projected[:, D:] *= 3.0  # scores spread over a few units, as the gate's weights give them
        projected[live:] = 0.0
        sets.append(InputSet(
            batch=dataclasses.replace(case.batch, **tensors),
            pools=Pools(cfg, case.allocator.pool_requests, case.allocator.kv_slots, device=device),
            projected=projected,
            kv=projected[:, :D].clone(),
            score=projected[:, D:].clone(),
            latent=torch.full((T, D), float("nan"), dtype=torch.bfloat16, device=device),
        ))
    return sets


def graph_view(batch: ExtendBatch) -> ExtendBatch:
    """The batch as a captured graph sees it: the same tensors, and the host-side request list of
    the prefill graph's dummy batch (one request over every row). Host-side fields are all a
    compiled function guards on, so every batch of one row count reuses one compilation."""
    return dataclasses.replace(batch, requests=(Request(0, 0, batch.num_rows),), kv_slots_needed=1)


def torch_calls(layer: SourceLayer, sets: list[InputSet]) -> list[Callable[[], object]]:
    """The torch path on each set's separate kv and score buffers."""
    return [partial(compress_torch, layer, s.kv, s.score, s.batch, s.pools, latent_out=s.latent) for s in sets]


def fused_calls(layer: SourceLayer, sets: list[InputSet]) -> list[Callable[[], object]]:
    """The fused path on each set's ``| kv | score |`` buffer, without the host check of the offsets."""
    return [partial(compress_fused, layer, s.projected, s.batch, s.pools, latent_out=s.latent, validate=False)
            for s in sets]


def compiled_calls(fn: Callable, layer: SourceLayer, sets: list[InputSet]) -> list[Callable[[], object]]:
    """A compiled torch path ``fn`` (same arguments as ``compress_torch``) on each set, as a graph sees the batch."""
    return [partial(fn, layer, s.kv, s.score, graph_view(s.batch), s.pools, latent_out=s.latent) for s in sets]


def capture_buckets(calls: list[Callable[[], object]]) -> list[Graph]:
    """One graph per call, each warmed up then captured (:meth:`~c2graph.graphs.graph.Graph.capture_fn`); all
    share the first graph's memory pool (they replay one after another, never at the same time, as a
    serving engine's buckets do).
    No op records: under their dispatch mode a compiled function would run eagerly."""
    graphs: list[Graph] = []
    for call in calls:
        graph = Graph(pool=graphs[0].pool() if graphs else None)
        graph.capture_fn(call, record=False)
        graphs.append(graph)
    return graphs
