"""Dimensions of one ratio-2 source layer (the design page, docs/design.md, lists the math)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from .arguments import as_float32_real, as_int

MAX_RING_SIZE = 1024
"""The largest ``ring_size``: the fused kernel parks a request's last ``ring_size`` rows in one tile
(ratio 2 needs 2; larger rings only keep more rows)."""


@dataclass(frozen=True)
class Config:
    """Sizes and constants of the c2 compressor.

    ``D`` is the latent width (``D_nope + rope_dim``), ``index_dim`` the index-key width.
    RoPE rotates the last ``rope_dim`` dims of both the latent and the index key.
    ``eps`` is a finite number that float32 holds (>= about 1.2e-38: a smaller one rounds to 0 and
    an all-zero row then normalises to NaN); ``rope_theta`` a finite number >= 1 (RoPE's base: a
    smaller one gives frequencies that grow with the pair, angles past float32 and NaN);
    ``ring_size`` from 2 to :data:`MAX_RING_SIZE`.
    """

    hidden: int
    D: int
    rope_dim: int
    index_dim: int
    page_size: int
    ring_size: int = 2
    eps: float = 1e-6
    rope_theta: float = 10000.0

    def __post_init__(self) -> None:
        # Numpy ints and floats are stored as Python ones, so equal Configs compare equal.
        for name in ("hidden", "D", "rope_dim", "index_dim", "page_size"):
            object.__setattr__(self, name, as_int(f"Config.{name}", getattr(self, name), least=1))
        object.__setattr__(self, "ring_size", as_int("Config.ring_size", self.ring_size, least=2,
                                                     below=MAX_RING_SIZE + 1, below_is=f"{MAX_RING_SIZE + 1}"))
        # Either one out of these bounds gives NaN caches.
        object.__setattr__(self, "eps", as_float32_real("Config.eps", self.eps))
        object.__setattr__(self, "rope_theta", as_float32_real("Config.rope_theta", self.rope_theta, least=1.0,
                                                               what=" (RoPE's base: 10000 in the served model)"))
        if self.rope_dim % 2 or self.rope_dim > min(self.D, self.index_dim):
            raise ValueError(
                f"Config.rope_dim = {self.rope_dim}; expected an even number <= D ({self.D}) "
                f"and <= index_dim ({self.index_dim})"
            )
        if self.page_size % 2:
            raise ValueError(
                f"Config.page_size = {self.page_size}; expected an even number, so the two "
                "tokens of a group share a page and one c2 slot"
            )

    @property
    def D_nope(self) -> int:
        return self.D - self.rope_dim

    @classmethod
    def tiny(cls, **overrides) -> "Config":
        """CPU-sized: every notebook runs in seconds with it."""
        return replace(cls(hidden=64, D=32, rope_dim=8, index_dim=16, page_size=16), **overrides)

    @classmethod
    def dsv41(cls, **overrides) -> "Config":
        """DeepSeek-V4.1's c2 source layer: D = 448 nope + 64 rope, index key 128."""
        return replace(
            cls(hidden=5120, D=512, rope_dim=64, index_dim=128, page_size=256), **overrides
        )
