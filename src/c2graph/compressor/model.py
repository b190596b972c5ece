"""A model of many source layers: the served model's ratio-2 layers, each with its own caches.

DeepSeek-V4.1's layer layout has 18 ratio-2 layers (after two layers without compression, and
before twenty of ratio 1). The prefill graph compresses all of them, one after the other, over
one shared set of row metadata and one extend offsets tensor. The engine decides per
compressor whether it runs the fused path (``use_fused_gate``); here every ``unfused_every``-th
layer runs without the fused gate, so one graph holds both paths.

- :func:`served_layers`: the layers (seeded weights, seed ``seed + i`` for layer ``i``);
- :func:`layer_pools`: one :class:`Pools` per layer;
- :func:`model_preset`: ``"tiny"`` (a CPU replays it in seconds) or ``"dsv41"`` (the served
  sizes, for a GPU);
- :func:`one_layer`: the one-layer shortcut of anything kept per layer (``runner.layer`` for
  ``runner.layers[0]``), refused where there are several.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from .._runtime import DEFAULT_DEVICE
from .arguments import as_device, as_int, check_no_overlap, check_type
from .checks import check_layer_pools, check_pools
from .config import Config
from .pools import Pools, check_pools_fit
from .source_layer import SourceLayer, check_layer, layer_tensors

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
    n_layers = as_int("n_layers", n_layers, least=1)
    if unfused_every is not None:
        unfused_every = as_int("unfused_every", unfused_every, least=1)
    return [
        SourceLayer(cfg, seed=seed + i, use_fused_gate=is_fused(i, unfused_every), device=device)
        for i in range(n_layers)
    ]


def layer_pools(layers: Sequence[SourceLayer], pool_requests: int, kv_slots: int, device=None) -> list[Pools]:
    """One :class:`Pools` per layer (each layer writes its own caches and ring), all of one size.
    Every argument is checked, and the memory of all of them against the device, before the first
    is allocated."""
    if isinstance(layers, SourceLayer) or not isinstance(layers, Sequence) or not layers:
        raise ValueError(f"layers is a {type(layers).__name__}; expected a non-empty list of SourceLayers")
    for i, layer in enumerate(layers):
        check_type(f"layers[{i}]", layer, SourceLayer, "a c2graph.SourceLayer")
    pool_requests = as_int("pool_requests", pool_requests, least=1)
    kv_slots = as_int("kv_slots", kv_slots, least=2)
    device = as_device("device", device, DEFAULT_DEVICE)
    check_pools_fit([(layer.cfg, pool_requests, kv_slots) for layer in layers], device)
    return [Pools(layer.cfg, pool_requests, kv_slots, device=device) for layer in layers]


def model_preset(name: str, *, seed: int = 0, device=None) -> list[SourceLayer]:
    """The layers of a preset: ``"tiny"`` (4 layers, every 2nd without the fused gate: a CPU
    replays it in seconds) or ``"dsv41"`` (the served model's 18 ratio-2 layers at full size,
    every 3rd without the fused gate)."""
    if name not in PRESETS:
        raise ValueError(f"name = {name!r}; expected one of {sorted(PRESETS)}")
    p = PRESETS[name]
    return served_layers(p["config"](), p["n_layers"], unfused_every=p["unfused_every"], seed=seed, device=device)


def check_layers_and_pools(layers, pools) -> tuple[tuple[SourceLayer, ...], tuple[Pools, ...]]:
    """One layer and one ``Pools``, or two lists of the same length: one Config and device for all,
    each layer's pools made for it and as it says (:func:`~c2graph.compressor.checks.check_pools`),
    each layer's weights as its Config says, and no memory written by two layers (a ``Pools``, or
    one of its tensors or a view of it, given to two layers) nor over a weight."""
    if isinstance(layers, SourceLayer) != isinstance(pools, Pools):
        raise ValueError(
            f"layers is a {type(layers).__name__} and pools a {type(pools).__name__}; expected one "
            "SourceLayer and one Pools, or a list of each"
        )
    for name, value in (("layers", layers), ("pools", pools)):
        if not isinstance(value, (SourceLayer, Pools, Iterable)) or isinstance(value, (str, bytes)):
            raise ValueError(f"{name} is a {type(value).__name__}; expected one, or a list")
    layers = (layers,) if isinstance(layers, SourceLayer) else tuple(layers)
    pools = (pools,) if isinstance(pools, Pools) else tuple(pools)
    if not layers or len(layers) != len(pools):
        raise ValueError(f"{len(layers)} layers and {len(pools)} pools; expected one Pools per layer, at least one")
    for i, (layer, p) in enumerate(zip(layers, pools)):
        where = f"pools[{i}]: " if len(layers) > 1 else ""
        if not isinstance(layer, SourceLayer) or not isinstance(p, Pools):
            raise ValueError(f"layers[{i}] / pools[{i}] are {type(layer).__name__} / {type(p).__name__}; "
                             "expected a SourceLayer and a Pools")
        if layer.cfg != layers[0].cfg:
            raise ValueError(f"layers[{i}].cfg differs from layers[0].cfg; expected one Config for every "
                             "layer (they share the row metadata)")
        check_pools(p)
        if p.device != pools[0].device:
            raise ValueError(f"pools[{i}] is on {p.device}; expected {pools[0].device}, as pools[0]")
        check_layer_pools(layer, p, where=where)
        check_layer(layer)
    owner: dict[int, str] = {}  # id of a pools tensor -> the first pools that holds it
    for i, p in enumerate(pools):
        for name, t in p.tensors().items():
            first = owner.setdefault(id(t), f"pools[{i}].{name}")
            if first != f"pools[{i}].{name}":
                raise ValueError(f"pools[{i}].{name} is {first}; expected one Pools per layer, each its own "
                                 "(every layer writes its own caches and ring)")
    # nor views of one memory (by address), nor memory over a weight any layer reads
    written = {f"pools[{i}].{name}": t for i, p in enumerate(pools) for name, t in p.tensors().items()}
    read = {f"layers[{i}].{name}": t for i, layer in enumerate(layers) for name, t in layer_tensors(layer).items()}
    check_no_overlap(written, read)
    return layers, pools


def one_layer(many: str, field: str | None = None, *, owner: str) -> property:
    """A property for objects that keep a list per layer: ``self.<many>[0]`` (its ``field`` where
    given) when there is one layer; ``AttributeError`` naming ``<owner>.<many>[i]`` otherwise."""

    def get(self):
        items = getattr(self, many)
        if len(items) != 1:
            raise AttributeError(f"this {owner} has {len(items)} layers; use {owner}.{many}[i]")
        return items[0] if field is None else getattr(items[0], field)

    return property(get, doc=f"The one layer's ``{field or many}``: ``{owner}.{many}[0]``"
                             + (f"``.{field}``" if field else "") + " (one-layer objects only).")
