"""What a prefill graph runner's graphs captured, and whether the runner still holds it there.

A graph writes the tensors it captured, whatever the runner holds later: a replay after a cache,
a ring, a layer's weights or a static buffer was rebound (or the runner's ``layer_pools``
replaced) would write the old memory. :class:`CapturedTensors` keeps, at capture, every such
tensor and its address; :meth:`CapturedTensors.check` compares them with what the runner holds,
once a step: identities and data pointers, no tensor value read, names worked out only to say
which one moved.
"""

from __future__ import annotations

import operator

import torch

_WEIGHTS = ("norm_w", "wk", "k_norm_w", "inv_freq")
"""A layer's tensors the captured work reads (its projection weights are read before the graph)."""
_weights = operator.attrgetter(*_WEIGHTS)


def held_tensors(runner) -> list:
    """Every tensor ``runner``'s captured work reads or writes, in :func:`named_targets`' order."""
    s = runner.static
    held = [s.pos, s.req, s.raw_out_loc, s.c2_slot, s.low_ratio_extend_offsets]
    for layer, pools, buf in zip(runner.layers, runner.layer_pools, s.layers):
        held += pools.tensors().values()
        held += _weights(layer)
        held += vars(buf).values()
    return held


def named_targets(runner) -> dict[str, tuple]:
    """Where every tensor ``runner``'s captured work reads or writes lives: name -> (data pointer,
    shape, strides, dtype), or the type's name of what is not a tensor. Reads no tensor value."""
    tensors = {f"static.{name}": t for name, t in runner.static.metadata().items()}
    for i, (layer, pools, buf) in enumerate(zip(runner.layers, runner.layer_pools, runner.static.layers)):
        tensors.update({f"layer_pools[{i}].{name}": t for name, t in pools.tensors().items()})
        tensors.update({f"layers[{i}].{name}": getattr(layer, name) for name in _WEIGHTS})
        tensors.update({f"static.layers[{i}].{name}": t for name, t in buf.tensors().items()})
    return {name: (t.data_ptr(), tuple(t.shape), t.stride(), t.dtype) if isinstance(t, torch.Tensor)
            else (type(t).__name__,) for name, t in tensors.items()}


class CapturedTensors:
    """The tensors a runner's graphs captured (kept, with their data pointers and, by name, their
    shapes and strides), taken when the runner is built."""

    def __init__(self, runner):
        self.held = held_tensors(runner)
        self.at = [t.data_ptr() for t in self.held]
        self.named = named_targets(runner)

    def check(self, runner) -> None:
        """``ValueError`` naming the first tensor ``runner`` no longer holds where it was captured.
        One comparison a step: the same objects, at the same addresses."""
        now = held_tensors(runner)
        if len(now) == len(self.held) and all(map(operator.is_, now, self.held)) and \
                [t.data_ptr() for t in now] == self.at:
            return
        named = named_targets(runner)
        for name, was in self.named.items():
            if named.get(name) != was:
                raise ValueError(
                    f"runner.{name} is not the tensor the graphs captured (it was rebound, or its layer or "
                    "pools replaced, after capture); a replay would write the captured memory, not it. "
                    "Expected the captured tensor: put it back, or build a new PrefillGraphRunner")
        raise ValueError(f"runner.layers has {len(runner.layers)} layers and runner.layer_pools "
                         f"{len(runner.layer_pools)} pools; expected the {len(runner.static.layers)} captured")
