"""The caches a source layer writes, and its ring (docs/design.md)."""

from __future__ import annotations

import torch

from .._runtime import DEFAULT_DEVICE
from .arguments import _shape, allocate, as_device, as_int, check_fits_memory, check_no_overlap, check_plain
from .config import Config
from .ring import new_ring, ring_bytes

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

    Sizes the device cannot hold are refused before anything is allocated; pools made under
    ``torch.inference_mode()`` hold normal tensors, which the paths write in any mode. Every path
    checks the three tensors before it writes (:func:`~c2graph.compressor.checks.check_pools`):
    rebound to another shape, dtype or device, a view of another (or of another layer's pools),
    or a tensor that requires grad, they are refused.
    """

    def __init__(self, cfg: Config, pool_requests: int, kv_slots: int, device=None):
        if not isinstance(cfg, Config):
            raise ValueError(f"cfg is a {type(cfg).__name__}; expected a c2graph.Config")
        pool_requests = as_int("pool_requests", pool_requests, least=1)
        kv_slots = as_int("kv_slots", kv_slots, least=2)  # slot 0 is reserved
        device = as_device("device", device, DEFAULT_DEVICE)
        check_pools_fit([(cfg, pool_requests, kv_slots)], device)
        self.cfg, self.pool_requests, self.kv_slots = cfg, pool_requests, kv_slots
        bf16 = dict(dtype=torch.bfloat16, device=device)
        with torch.inference_mode(False):  # normal tensors, whatever the caller's mode
            self.kv_cache = allocate("kv_slots", kv_slots, lambda: torch.zeros(kv_slots, cfg.D, **bf16))
            self.index_k = allocate("kv_slots", kv_slots, lambda: torch.zeros(kv_slots, cfg.index_dim, **bf16))
            self.ring = allocate("pool_requests", pool_requests,
                                 lambda: new_ring(pool_requests, cfg.ring_size, cfg.D, device))

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
        """Fill both caches and every non-sentinel ring row with ``value`` (a real number), in place.

        After a batch, a slot that still holds the poison was not written.
        """
        try:
            if isinstance(value, (bool, str, bytes)):
                raise TypeError
            value = float(value)
        except (TypeError, ValueError):
            raise ValueError(f"value = {value!r}; expected a real number") from None
        tensors = {f"pools.{name}": t for name, t in self.tensors().items()}
        for name, t in tensors.items():
            if not isinstance(t, torch.Tensor) or t.dim() != 2:
                raise ValueError(f"{name} has shape {_shape(t)}; expected a 2-d tensor")
            check_plain(name, t, written=True)
        check_no_overlap(tensors)
        self.kv_cache.fill_(value)
        self.index_k.fill_(value)
        self.ring[:-1].fill_(value)
        return self

    def __repr__(self) -> str:
        return (
            f"Pools(pool_requests={self.pool_requests}, kv_slots={self.kv_slots}, "
            f"ring rows={self.ring.shape[0]}, device={self.device.type})"
        )


def pools_bytes(cfg: Config, pool_requests: int, kv_slots: int) -> tuple[int, int]:
    """Bytes of one :class:`Pools`: ``(both caches, the ring)``."""
    return 2 * kv_slots * (cfg.D + cfg.index_dim), ring_bytes(pool_requests, cfg.ring_size, cfg.D)


def check_pools_fit(sizes, device: torch.device) -> None:
    """``ValueError`` naming the size, before anything is allocated, unless one pools of each
    ``(cfg, pool_requests, kv_slots)`` in ``sizes`` fit the device's memory together."""
    caches, ring = (sum(b[i] for b in (pools_bytes(*size) for size in sizes)) for i in (0, 1))
    cfg, pool_requests, kv_slots = sizes[0]
    times = f"{len(sizes)} pools: " if len(sizes) > 1 else ""
    check_fits_memory(f"kv_slots = {kv_slots}", caches, device, f"{times}the caches")
    check_fits_memory(f"pool_requests = {pool_requests}", ring, device, f"{times}the ring")
    check_fits_memory(f"kv_slots = {kv_slots} with pool_requests = {pool_requests}", caches + ring, device,
                      f"{times}the caches and the ring")
