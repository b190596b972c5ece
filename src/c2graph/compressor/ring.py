"""The ring: each pool request's pending rows, kept between chunks of a chunked prefill (docs/design.md, "The ring").

Shape ``[pool_requests * ring_size + 1, 2D]`` fp32; each row is ``| kv | score |`` of one token.
Token ``pos`` of pool request ``req`` lives at row ``req * ring_size + pos % ring_size``. The last
row is the *sentinel* ``(kv = 0, score = -inf)``: pairing with it gives a row its own kv back.
"""

from __future__ import annotations

import torch

from .arguments import as_device, as_int, check_fits_memory


def new_ring(pool_requests: int, ring_size: int, D: int, device=None) -> torch.Tensor:
    """A ring with every row set to the sentinel ``| 0 | -inf |``: ``[pool_requests * ring_size + 1, 2D]`` fp32.

    Sizes are checked (ints, and a ring the device can hold) before anything is allocated."""
    pool_requests = as_int("pool_requests", pool_requests, least=1)
    ring_size = as_int("ring_size", ring_size, least=1)
    D = as_int("D", D, least=1)
    device = as_device("device", device, torch.get_default_device())
    check_fits_memory(f"pool_requests = {pool_requests} with ring_size = {ring_size} and D = {D}",
                      ring_bytes(pool_requests, ring_size, D), device, "the ring")
    with torch.inference_mode(False):  # a normal tensor, whatever the caller's mode
        ring = torch.zeros(pool_requests * ring_size + 1, 2 * D, dtype=torch.float32, device=device)
        ring[:, D:] = float("-inf")
    return ring


def ring_bytes(pool_requests: int, ring_size: int, D: int) -> int:
    """Bytes of the ring of ``pool_requests`` requests of ``ring_size`` rows: fp32 rows of ``2D``."""
    return (pool_requests * ring_size + 1) * 2 * D * 4


def sentinel_row(ring: torch.Tensor) -> int:
    """Index of the sentinel row (the last one)."""
    return ring.shape[0] - 1


def restore_sentinel(ring: torch.Tensor, D: int) -> None:
    """Put ``| 0 | -inf |`` back into the sentinel row, in place."""
    ring[-1, :D] = 0.0
    ring[-1, D:] = float("-inf")


def ring_row(req: torch.Tensor, pos: torch.Tensor, ring_size: int) -> torch.Tensor:
    """Ring row of token ``pos`` of pool request ``req`` (int64 tensors of one shape)."""
    return req * ring_size + pos % ring_size
