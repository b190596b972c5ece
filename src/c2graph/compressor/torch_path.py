"""The torch path: the c2 compressor as plain torch ops, one line per step of the math.

This is the reference the fused kernel is checked against, and what the engine's prefill
graph ran before the fix: every line below is one or more small kernel launches.

Its two reductions (the RMSNorm's sum of squares and the index-key GEMM), like the source
projection in :mod:`c2graph.compressor.source_layer`, are accumulated in float64, so that each
row's result does not depend on how many rows share the launch, nor on the order of the sum:
that is what makes chunked prefill give bit-for-bit the caches of whole prefill. Precisely: a
product or square of bf16 values (8 significant bits each) has at most 16 significant bits and
is exact in float64 (53). A sum of ``n`` such terms is exact, in any order, when the exponents of
its terms span at most ``53 - 16 - log2(n)`` bits, since every partial sum then fits in 53 bits.
The ``tiny`` preset's seeded activations stay well inside that bound. At the ``dsv41`` sizes the
terms can span more than it allows (``n = 5120`` leaves 24.7 bits), so exactness is no longer
guaranteed there, though the sums checked against exact integer arithmetic were exact; inputs
of an extreme range can round, and a row's last bit could then depend on the order.
"""

from __future__ import annotations

import torch

from .batch import ExtendBatch
from .pools import Pools
from .ring import restore_sentinel, ring_row, sentinel_row
from .source_layer import SourceLayer
from .checks import check_latent_out, check_layer_batch_pools, check_outputs, check_projected


def previous_row_is_partner(batch: ExtendBatch) -> torch.Tensor:
    """``[T]`` bool: the previous row of the batch is this row's partner (same request, ``pos - 1``)."""
    live = batch.raw_out_loc != 0
    prev_live = torch.cat([live.new_zeros(1), live[:-1]])
    prev_req = torch.cat([batch.req.new_full((1,), -1), batch.req[:-1]])
    prev_pos = torch.cat([batch.pos.new_full((1,), -2), batch.pos[:-1]])
    return live & prev_live & (prev_req == batch.req) & (prev_pos == batch.pos - 1)


def ring_read_rows(batch: ExtendBatch, ring_size: int, sentinel: int) -> torch.Tensor:
    """``[T]`` int64: the ring row each row reads its partner from; the sentinel when it needs none.

    Only an odd row whose partner is not in the batch (the first row of a chunk that starts
    at an odd position) reads a real ring row. Padding rows and even rows read the sentinel.
    """
    live = batch.raw_out_loc != 0
    needs_ring = live & (batch.pos % 2 == 1) & ~previous_row_is_partner(batch)
    return inside(torch.where(needs_ring, ring_row(batch.req, batch.pos - 1, ring_size), sentinel), sentinel, sentinel)


def inside(index: torch.Tensor, size: int, outside: int) -> torch.Tensor:
    """``index`` (``[T]`` int64) where it lies in ``[0, size)``, ``outside`` elsewhere: whatever a
    batch holds (a row changed by hand, a negative slot that Python would count from the end), no
    read or write lands outside a tensor. A batch the host checked is never changed by it."""
    return torch.where((index >= 0) & (index < size), index, outside)


def pair_partners(
    kv: torch.Tensor, score: torch.Tensor, batch: ExtendBatch, ring: torch.Tensor, ring_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's partner: ``(kv_prev, score_prev)``, ``[T, D]`` fp32 each.

    The previous batch row where it is the partner, else the ring row (``ring_read_rows``).
    The ring is gathered here, before any ring write of the batch.
    """
    D = kv.shape[1]
    from_ring = ring[ring_read_rows(batch, ring_size, sentinel_row(ring))]
    in_batch = previous_row_is_partner(batch)[:, None]
    kv_prev = torch.where(in_batch, kv.roll(1, 0), from_ring[:, :D])
    score_prev = torch.where(in_batch, score.roll(1, 0), from_ring[:, D:])
    return kv_prev, score_prev


def gate(kv_prev: torch.Tensor, score_prev: torch.Tensor, kv: torch.Tensor, score: torch.Tensor) -> torch.Tensor:
    """Per-channel softmax over the two scores, weighting the two kv rows: ``[T, D]`` fp32.

    ``pooled = kv_prev * w0 + kv * w1`` with ``(w0, w1) = softmax(score_prev, score)``.
    """
    m = torch.maximum(score_prev, score)
    e0, e1 = torch.exp(score_prev - m), torch.exp(score - m)
    w0, w1 = e0 / (e0 + e1), e1 / (e0 + e1)
    return kv_prev * w0 + kv * w1


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dim in fp32, rounded to bf16. ``x``: ``[T, N]`` bf16, ``weight``: ``[N]`` bf16.

    The sum of squares is accumulated in float64: exact while the squares' exponents span at most
    ``53 - 16 - log2(N)`` bits (see the module docstring), so independent of the reduction order.
    """
    p = x.float()
    mean_sq = (p.double() ** 2).sum(-1, keepdim=True).div(p.shape[-1]).float()
    return (p * torch.rsqrt(mean_sq + eps) * weight.float()).to(torch.bfloat16)


def finish(pooled: torch.Tensor, norm_w: torch.Tensor, eps: float) -> torch.Tensor:
    """``pooled`` (``[T, D]`` fp32) rounded to bf16, then RMSNorm: the pre-RoPE latent, ``[T, D]`` bf16."""
    return rms_norm(pooled.to(torch.bfloat16), norm_w, eps)


def rope(x: torch.Tensor, group_pos: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """RoPE on the last ``2 * len(inv_freq)`` dims of ``x`` (``[T, N]`` bf16), interleaved pairs.

    Pair ``(b + 2i, b + 2i + 1)`` turns by ``group_pos * inv_freq[i]`` (fp32); result in bf16.
    """
    rope_dim = 2 * inv_freq.shape[0]
    b = x.shape[1] - rope_dim
    tail = x[:, b:].float().unflatten(1, (rope_dim // 2, 2))
    angle = group_pos.float()[:, None] * inv_freq[None, :]
    cos, sin = torch.cos(angle), torch.sin(angle)
    xe, xo = tail[..., 0], tail[..., 1]
    turned = torch.stack([xe * cos - xo * sin, xe * sin + xo * cos], dim=-1).flatten(1)
    return torch.cat([x[:, :b], turned.to(torch.bfloat16)], dim=1)


def index_key(latent: torch.Tensor, layer: SourceLayer, group_pos: torch.Tensor) -> torch.Tensor:
    """The index key from the pre-RoPE latent: ``wk``, ``k_norm``, RoPE. ``[T, D]`` -> ``[T, index_dim]`` bf16.

    The ``wk`` GEMM is accumulated in float64, exact under the same bound as the RMSNorm's sum
    (module docstring), then rounded to bf16.
    """
    k = (latent.double() @ layer.wk.double().T).float().to(torch.bfloat16)
    return rope(rms_norm(k, layer.k_norm_w, layer.cfg.eps), group_pos, layer.inv_freq)


def park_mask(batch: ExtendBatch, ring_size: int) -> torch.Tensor:
    """``[T]`` bool: the row is one of its request's last ``ring_size`` rows, so it is parked in the ring.

    A live row is *not* among them exactly when the row ``ring_size`` further on is the same
    request at ``pos + ring_size``.
    """
    live = batch.raw_out_loc != 0
    R = ring_size
    tail = min(R, batch.num_rows)  # rows with nothing R rows further on
    ahead_live = torch.cat([live[R:], live.new_zeros(tail)])
    ahead_req = torch.cat([batch.req[R:], batch.req.new_full((tail,), -1)])
    ahead_pos = torch.cat([batch.pos[R:], batch.pos.new_full((tail,), -1)])
    continues = ahead_live & (ahead_req == batch.req) & (ahead_pos == batch.pos + R)
    return live & ~continues


def park(ring: torch.Tensor, kv: torch.Tensor, score: torch.Tensor, batch: ExtendBatch, ring_size: int) -> None:
    """Write ``| kv | score |`` of each request's last ``ring_size`` rows into the ring, in place.

    Rows that are not parked are sent to the sentinel row, which is restored afterwards; so is a
    row whose ring row lies outside the ring (a batch changed by hand: :func:`inside`).
    """
    D, sentinel = kv.shape[1], sentinel_row(ring)
    rows = inside(torch.where(park_mask(batch, ring_size), ring_row(batch.req, batch.pos, ring_size), sentinel),
                  sentinel, sentinel)
    ring[rows] = torch.cat([kv, score], dim=1)
    restore_sentinel(ring, D)


def compress_torch(
    layer: SourceLayer,
    kv: torch.Tensor,
    score: torch.Tensor,
    batch: ExtendBatch,
    pools: Pools,
    *,
    latent_out: torch.Tensor | None = None,
    validate: bool = False,
) -> torch.Tensor:
    """Compress one extend batch with torch ops: write ``pools.kv_cache``, ``pools.index_k``, ``pools.ring``.

    ``kv``, ``score``: ``[T, D]`` fp32 each, the source projection of every row (two buffers, or
    the two halves of one ``| kv | score |`` buffer: :func:`~c2graph.compressor.source_layer.split_projected`).
    Returns the pre-RoPE latents ``[T, D]`` bf16 (``latent_out`` if given); only rows that
    complete a group are written, every other row keeps its value (NaN in a new buffer).
    :func:`~c2graph.compressor.compress.compress` starts from the hidden states instead.

    Everything is checked before the first write: the layer's tensors, the pools', the batch's,
    ``kv``, ``score`` and ``latent_out`` (shape, dtype, device; outside autograd; ``latent_out``
    dense), the outputs sharing no memory (by address: views count) with each other or with
    anything the call reads, the layer's weights included. With ``validate=True`` the batch is also
    checked against itself and the pools on the host (:meth:`ExtendBatch.check`: a sync), as
    :func:`~c2graph.compressor.compress.compress` does by default. The default, ``False``, reads no
    tensor values, so the torch path runs inside a graph capture as it is (``torch.compile`` traces
    its steps, :func:`compress_steps`); whatever the batch then holds, no read or write lands outside the caches and the ring
    (:func:`inside`; unwanted stores go to c2 slot 0).
    """
    check_layer_batch_pools(layer, batch, pools)
    cfg, T = layer.cfg, batch.num_rows
    kv, score = check_projected(layer, (kv, score), T, pools.device)
    check_latent_out(latent_out, T, cfg.D, pools.device)
    check_outputs(layer, pools, latent_out, {"kv": kv, "score": score, "batch": batch})
    if validate:
        batch.check(pools)
    if latent_out is None:
        latent_out = torch.full((T, cfg.D), float("nan"), dtype=torch.bfloat16, device=pools.device)
    return compress_steps(layer, kv, score, batch, pools, latent_out=latent_out)


def compress_steps(
    layer: SourceLayer,
    kv: torch.Tensor,
    score: torch.Tensor,
    batch: ExtendBatch,
    pools: Pools,
    *,
    latent_out: torch.Tensor,
    finish=finish,
    index_key=index_key,
) -> torch.Tensor:
    """The steps of :func:`compress_torch`, one line each, with no argument checks: what
    ``torch.compile`` traces for the benchmark (a check that asks where a tensor lives would break
    its graph). ``latent_out``: ``[T, D]`` bf16, written on group rows; returns it. ``finish`` and
    ``index_key`` are the two steps that reduce (in float64 here); the benchmark's fp32 port
    passes its own."""
    cfg = layer.cfg
    kv_prev, score_prev = pair_partners(kv, score, batch, pools.ring, cfg.ring_size)
    pooled = gate(kv_prev, score_prev, kv, score)
    latent = finish(pooled, layer.norm_w, cfg.eps)
    group_pos = batch.pos - batch.pos % 2
    c2_slot = inside(batch.c2_slot, pools.kv_slots, 0)  # a slot of the caches, whatever the batch holds
    stores = (c2_slot != 0)[:, None]
    pools.index_k[c2_slot] = index_key(latent, layer, group_pos)
    pools.kv_cache[c2_slot] = rope(latent, group_pos, layer.inv_freq)
    latent_out.copy_(torch.where(stores, latent, latent_out))
    park(pools.ring, kv, score, batch, cfg.ring_size)
    return latent_out
