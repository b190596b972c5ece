"""The benchmark's many-layer variant: one prefill graph over every source layer of a model.

The engine captures all source layers of the model in one graph per bucket; layers with the fused
gate run the fused path, the others the torch path, and one set of row metadata and extend
offsets serves them all. This times one replay of that graph.
"""

from __future__ import annotations

import importlib

from ..compressor.config import Config
from .bench_cases import Case
from .timing import median_us


def measure_model(cfg: Config, case: Case, reps: int) -> dict:
    """One record: the replay of a many-layer model's prefill graph at ``case.rows`` rows."""
    try:
        importlib.import_module("c2graph.compressor.model")
    except ImportError as e:
        raise RuntimeError(
            "needs c2graph.compressor.model (a many-layer preset) and a PrefillGraphRunner that takes "
            "lists of layers and pools"
        ) from e
    raise NotImplementedError("the many-layer runner's API is not in this checkout yet")
