"""What a user tries first: ``torch.compile`` of the torch path, for the benchmark.

Two torch paths are compiled. The torch path as the notebooks teach it (its steps,
:func:`~c2graph.compressor.torch_path.compress_steps`, without the argument checks, which run
before the call) accumulates its two reductions (the
RMSNorm's sum of squares and the index-key GEMM) in float64, so that chunked prefill is bitwise
whole prefill; float64 is slow on a GPU and a compiler cannot turn it back into fp32. A plain port
would reduce in fp32 and run the index-key GEMM in bf16: :func:`compress_torch_fp32` is that port,
the same steps otherwise, so the compiler gets its best chance. The benchmark times both and
quotes the faster.
"""

from __future__ import annotations

import torch

from ..compressor.batch import ExtendBatch
from ..compressor.pools import Pools
from ..compressor.source_layer import SourceLayer
from ..compressor.torch_path import compress_steps, gate, pair_partners, park, rope

def rms_norm_fp32(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dim, reduced in fp32, rounded to bf16. ``x``: ``[T, N]`` bf16, ``weight``: ``[N]`` bf16."""
    p = x.float()
    return (p * torch.rsqrt(p.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(torch.bfloat16)


def compress_torch_fp32(
    layer: SourceLayer,
    kv: torch.Tensor,
    score: torch.Tensor,
    batch: ExtendBatch,
    pools: Pools,
    *,
    latent_out: torch.Tensor,
) -> torch.Tensor:
    """The torch path with fp32 reductions and a bf16 index-key GEMM; otherwise :func:`compress_torch`.

    ``kv``, ``score``: ``[T, D]`` fp32; ``latent_out``: ``[T, D]`` bf16, written on group rows.
    Writes ``pools.kv_cache``, ``pools.index_k`` (c2 slot 0 takes the unwanted stores) and the ring.
    Its results agree with the torch path within ``2**-6`` of each row's largest value (the
    benchmark's check: :func:`~c2graph.measure.bench.disagreement`), but not bit for bit, and they
    may depend on how many rows share a launch. No argument checks: the benchmark builds its
    arguments with the checked torch path's own helpers.
    """
    cfg = layer.cfg
    kv_prev, score_prev = pair_partners(kv, score, batch, pools.ring, cfg.ring_size)
    latent = rms_norm_fp32(gate(kv_prev, score_prev, kv, score).to(torch.bfloat16), layer.norm_w, cfg.eps)
    group_pos = batch.pos - batch.pos % 2
    key = rms_norm_fp32(latent @ layer.wk.T, layer.k_norm_w, cfg.eps)  # bf16 GEMM, fp32 accumulation
    pools.index_k[batch.c2_slot] = rope(key, group_pos, layer.inv_freq)
    pools.kv_cache[batch.c2_slot] = rope(latent, group_pos, layer.inv_freq)
    latent_out.copy_(torch.where((batch.c2_slot != 0)[:, None], latent, latent_out))
    park(pools.ring, kv, score, batch, cfg.ring_size)
    return latent_out


VARIANTS = {"float64 reductions": compress_steps, "fp32 reductions": compress_torch_fp32}
"""The torch paths the benchmark compiles, by the name its records give them."""


def compiled(variant: str, backend: str):
    """``torch.compile`` of one variant's function (``VARIANTS``) with ``backend``, for static shapes.

    ``"inductor"`` (the default of ``torch.compile``) on a GPU; a CPU smoke run uses ``"eager"``,
    which traces the function the same way but generates no code (quick, and needs no compiler).

    ``dynamic=False``: each row count (a bucket, as a serving engine captures one graph per bucket)
    gets its own compilation, specialised to its sizes. Left to its default, ``torch.compile``
    compiles the second row count it sees again with symbolic sizes, and every later one reuses
    that code: on an H200 its replays at 16384 and 65536 rows took 1.8x as long as the specialised
    ones' (``benchmarks/NOTES.md``).
    """
    if variant not in VARIANTS:
        raise ValueError(f"variant = {variant!r}; expected one of {list(VARIANTS)}")
    return torch.compile(VARIANTS[variant], backend=backend, dynamic=False)
