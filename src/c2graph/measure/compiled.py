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
from ..compressor.torch_path import compress_steps, rope


def rms_norm_fp32(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dim, reduced in fp32, rounded to bf16. ``x``: ``[T, N]`` bf16, ``weight``: ``[N]`` bf16."""
    p = x.float()
    return (p * torch.rsqrt(p.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(torch.bfloat16)


def finish_fp32(pooled: torch.Tensor, norm_w: torch.Tensor, eps: float) -> torch.Tensor:
    """``pooled`` rounded to bf16, then RMSNorm reduced in fp32: the pre-RoPE latent, ``[T, D]`` bf16."""
    return rms_norm_fp32(pooled.to(torch.bfloat16), norm_w, eps)


def index_key_fp32(latent: torch.Tensor, layer: SourceLayer, group_pos: torch.Tensor) -> torch.Tensor:
    """The index key with a bf16 GEMM (fp32 accumulation) and an fp32 RMSNorm, then RoPE."""
    return rope(rms_norm_fp32(latent @ layer.wk.T, layer.k_norm_w, layer.cfg.eps), group_pos, layer.inv_freq)


def compress_torch_fp32(layer: SourceLayer, kv: torch.Tensor, score: torch.Tensor, batch: ExtendBatch, pools: Pools,
                        *, latent_out: torch.Tensor) -> torch.Tensor:
    """The torch path's steps with fp32 reductions and a bf16 index-key GEMM (:func:`finish_fp32`,
    :func:`index_key_fp32`); otherwise :func:`~c2graph.compressor.torch_path.compress_steps`.

    ``kv``, ``score``: ``[T, D]`` fp32; ``latent_out``: ``[T, D]`` bf16, written on group rows.
    Writes ``pools.kv_cache``, ``pools.index_k`` (c2 slot 0 takes the unwanted stores) and the ring.
    Its results agree with the torch path within ``2**-6`` of each row's largest value (the
    benchmark's check: :func:`~c2graph.measure.bench.disagreement`), but not bit for bit, and they
    may depend on how many rows share a launch. No argument checks: the benchmark builds its
    arguments with the checked torch path's own helpers.
    """
    return compress_steps(layer, kv, score, batch, pools, latent_out=latent_out, finish=finish_fp32,
                          index_key=index_key_fp32)


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
