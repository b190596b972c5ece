"""A model of many source layers: the served model's ratio-2 layers, each with its own caches.

DeepSeek-V4.1's layer layout has 18 ratio-2 layers (after two layers without compression, and
before twenty of ratio 1). The prefill graph compresses all of them, one after the other, over
one shared set of row metadata and one extend offsets tensor. The engine decides per
compressor whether it runs the fused path (``use_fused_gate``); here every ``unfused_every``-th
layer runs without the fused gate, so one graph holds both paths.

- :func:`served_layers`: the layers (seeded weights, seed ``seed + i`` for layer ``i``);
- :func:`layer_pools`: one :class:`Pools` per layer;
- :func:`model_preset`: ``"tiny"`` (a CPU replays it in seconds) or ``"dsv41"`` (the served
  sizes, for a GPU).
"""

from __future__ import annotations

from collections.abc import Sequence

from .config import Config
from .pools import Pools
from .source_layer import SourceLayer

SERVED_C2_LAYERS = 18
"""Ratio-2 layers of DeepSeek-V4.1's layout (ratios ``[0] * 2 + [2] * 18 + [1] * 20``)."""

PRESETS: dict[str, dict] = {
    "tiny": dict(config=Config.tiny, n_layers=4, unfused_every=2),
    "dsv41": dict(config=Config.dsv41, n_layers=SERVED_C2_LAYERS, unfused_every=3),
}
"""``model_preset`` sizes: the Config, the number of layers, and which of them lack the fused gate."""


def is_fused(i: int, unfused_every: int | None) -> bool:
    """Whether layer ``i`` has the fused gate: all but every ``unfused_every``-th layer (the last
    of each run of ``unfused_every``); every layer when ``unfused_every`` is ``None``."""
    return unfused_every is None or (i + 1) % unfused_every != 0


def served_layers(
    cfg: Config,
    n_layers: int = SERVED_C2_LAYERS,
    *,
    unfused_every: int | None = 3,
    seed: int = 0,
    device=None,
) -> list[SourceLayer]:
    """``n_layers`` ratio-2 source layers of ``cfg``; layer ``i`` has seed ``seed + i`` and lacks the
    fused gate when ``(i + 1) % unfused_every == 0`` (``unfused_every=None``: every layer has it)."""
    if not isinstance(cfg, Config):
        raise ValueError(f"cfg is a {type(cfg).__name__}; expected a c2graph.Config")
    if isinstance(n_layers, bool) or not isinstance(n_layers, int) or n_layers <= 0:
        raise ValueError(f"n_layers = {n_layers!r}; expected a positive int")
    if unfused_every is not None and (isinstance(unfused_every, bool) or not isinstance(unfused_every, int)
                                      or unfused_every <= 0):
        raise ValueError(f"unfused_every = {unfused_every!r}; expected a positive int or None")
    return [
        SourceLayer(cfg, seed=seed + i, use_fused_gate=is_fused(i, unfused_every), device=device)
        for i in range(n_layers)
    ]


def layer_pools(layers: Sequence[SourceLayer], pool_requests: int, kv_slots: int, device=None) -> list[Pools]:
    """One :class:`Pools` per layer (each layer writes its own caches and ring), all of one size."""
    return [Pools(layer.cfg, pool_requests, kv_slots, device=device) for layer in layers]


def model_preset(name: str, *, seed: int = 0, device=None) -> list[SourceLayer]:
    """The layers of a preset: ``"tiny"`` (4 layers, every 2nd without the fused gate: a CPU
    replays it in seconds) or ``"dsv41"`` (the served model's 18 ratio-2 layers at full size,
    every 3rd without the fused gate)."""
    if name not in PRESETS:
        raise ValueError(f"name = {name!r}; expected one of {sorted(PRESETS)}")
    p = PRESETS[name]
    return served_layers(p["config"](), p["n_layers"], unfused_every=p["unfused_every"], seed=seed, device=device)
