"""The bytes the c2 compressor must move: the floor for a memory-bound kernel."""

from __future__ import annotations

from ..compressor.batch import ExtendBatch
from ..compressor.config import Config


def weight_bytes(cfg: Config) -> int:
    """Bytes of the weights the compressor reads after the projection: ``norm_w`` ``[D]`` bf16,
    ``wk`` ``[index_dim, D]`` bf16, ``k_norm_w`` ``[index_dim]`` bf16, ``inv_freq`` ``[rope_dim // 2]`` fp32."""
    D, I = cfg.D, cfg.index_dim
    return D * 2 + I * D * 2 + I * 2 + cfg.rope_dim // 2 * 4


def minimum_bytes(cfg: Config, batch: ExtendBatch, *, programs: int = 1) -> dict[str, int]:
    """Bytes any implementation of the c2 compressor must move for ``batch`` (host-side counts).

    Reads: the ``[T, 2D]`` fp32 buffer, the per-row metadata (``pos``, ``req``, ``raw_out_loc``:
    int64), the extend offsets, the weights, and one ring row per request that starts at an
    odd position. Writes: a latent (bf16) and an index key (bf16) per group into the caches,
    the pre-RoPE latent (bf16) per group, and each request's last ``min(rows, ring_size)``
    ring rows (fp32).

    ``programs``: how many programs of a kernel each read the weights (a kernel whose programs
    share no memory reads them once per program; ``wk`` alone is 128 KiB at ``dsv41``). The
    default, 1, is the floor of an ideal kernel.
    """
    if not isinstance(cfg, Config):
        raise ValueError(f"cfg is a {type(cfg).__name__}; expected a c2graph.Config")
    if not isinstance(batch, ExtendBatch):
        raise ValueError(f"batch is a {type(batch).__name__}; expected a c2graph.ExtendBatch")
    if isinstance(programs, bool) or not isinstance(programs, int) or programs < 1:
        raise ValueError(f"programs = {programs!r}; expected an int >= 1")
    T, D, I = batch.num_rows, cfg.D, cfg.index_dim
    groups = len(batch.group_rows)
    return {
        "read | kv | score |": T * 2 * D * 4,
        "read pos, req, raw_out_loc": 3 * T * 8,
        "read extend offsets": batch.extend_offsets.numel() * 4,
        "read weights": weight_bytes(cfg) * programs,
        "read ring partners": len(batch.ring_partner_rows) * 2 * D * 4,
        "write kv_cache": groups * D * 2,
        "write index_k": groups * I * 2,
        "write latents": groups * D * 2,
        "write ring": len(batch.parked_ring_rows(cfg.ring_size)) * 2 * D * 4,
    }
