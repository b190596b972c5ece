"""The caches a source layer writes, and its ring (docs/design.md)."""

from __future__ import annotations

import torch

from .._runtime import DEFAULT_DEVICE
from .arguments import allocate, as_device, as_int
from .config import Config
from .ring import new_ring

#: The value every check fills caches and the ring with before a run: a slot that still holds it
#: after the run was never written (and never 0, which real outputs can hold).
POISON = 123.0


class Pools:
    """Everything a batch writes.

    - ``kv_cache``: ``[kv_slots, D]`` bf16, the compressed latent (after RoPE) at each c2 slot
    - ``index_k``: ``[kv_slots, index_dim]`` bf16, the index key at each c2 slot
    - ``ring``: ``[pool_requests * ring_size + 1, 2D]`` fp32 (see :mod:`c2graph.compressor.ring`)

    The engine quantizes both caches (fp8 / fp4); this package stores bf16 so that every
    value can be compared with a reference. c2 slot 0 belongs to the reserved page.
    """

    def __init__(self, cfg: Config, pool_requests: int, kv_slots: int, device=None):
        if not isinstance(cfg, Config):
            raise ValueError(f"cfg is a {type(cfg).__name__}; expected a c2graph.Config")
        self.cfg = cfg
        self.pool_requests = pool_requests = as_int("pool_requests", pool_requests, least=1)
        self.kv_slots = kv_slots = as_int("kv_slots", kv_slots, least=2)  # slot 0 is reserved
        device = as_device("device", device, DEFAULT_DEVICE)
        bf16 = dict(dtype=torch.bfloat16, device=device)
        self.kv_cache = allocate("kv_slots", kv_slots, lambda: torch.zeros(kv_slots, cfg.D, **bf16))
        self.index_k = allocate("kv_slots", kv_slots, lambda: torch.zeros(kv_slots, cfg.index_dim, **bf16))
        self.ring = allocate("pool_requests", pool_requests, lambda: new_ring(pool_requests, cfg.ring_size, cfg.D, device))

    @property
    def device(self) -> torch.device:
        return self.kv_cache.device

    def tensors(self) -> dict[str, torch.Tensor]:
        return {"kv_cache": self.kv_cache, "index_k": self.index_k, "ring": self.ring}

    def clone(self) -> "Pools":
        """A deep copy (same sizes, same contents)."""
        other = object.__new__(Pools)
        other.__dict__.update(self.__dict__)
        for name, t in self.tensors().items():
            setattr(other, name, t.clone())
        return other

    def poison(self, value: float = POISON) -> "Pools":
        """Fill both caches and every non-sentinel ring row with ``value``, in place.

        After a batch, a slot that still holds the poison was not written.
        """
        self.kv_cache.fill_(value)
        self.index_k.fill_(value)
        self.ring[:-1].fill_(value)
        return self

    def __repr__(self) -> str:
        return (
            f"Pools(pool_requests={self.pool_requests}, kv_slots={self.kv_slots}, "
            f"ring rows={self.ring.shape[0]}, device={self.device.type})"
        )
