"""The ring: each pool request's pending rows, kept between chunks of a chunked prefill (docs/design.md, "The ring").

Shape ``[pool_requests * ring_size + 1, 2D]`` fp32; each row is ``| kv | score |`` of one token.
Token ``pos`` of pool request ``req`` lives at row ``req * ring_size + pos % ring_size``. The last
row is the *sentinel* ``(kv = 0, score = -inf)``: pairing with it gives a row its own kv back.
"""

from __future__ import annotations

import torch


def new_ring(pool_requests: int, ring_size: int, D: int, device=None) -> torch.Tensor:
    """A ring with every row set to the sentinel ``| 0 | -inf |``: ``[pool_requests * ring_size + 1, 2D]`` fp32."""
    ring = torch.zeros(pool_requests * ring_size + 1, 2 * D, dtype=torch.float32, device=device)
    ring[:, D:] = float("-inf")
    return ring


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
