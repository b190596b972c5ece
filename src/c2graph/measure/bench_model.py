"""The benchmark's many-layer variant: one prefill graph over every source layer of a model.

The engine captures all ratio-2 source layers of the model in one graph per bucket: layers with
the fused gate run the fused path, the others the torch path, and one set of row metadata and
one ``low_ratio_extend_offsets`` serve them all. This times one replay of that graph, for the
served model's layer pattern (:func:`c2graph.compressor.model.model_preset`).
"""

from __future__ import annotations

import math

from ..compressor.config import Config
from ..prefill.runner import PrefillGraphRunner
from .bench_cases import REQUESTS, Case
from .results import FRACTIONS
from .timing import replay_us


def measure_model(cfg: Config, case: Case, reps: int) -> dict:
    """One record: the replay of a many-layer model's prefill graph at ``case.rows`` rows.

    The ``dsv41`` preset (the ``tiny`` one for a ``tiny`` ``cfg``). Several runners, each with its
    own buffers and caches, take turns where one model's inputs would fit in the L2 cache.
    """
    from ..compressor.model import layer_pools, model_preset  # the many-layer model (and its runner)

    device = case.batch.device
    preset = "dsv41" if cfg == Config.dsv41() else "tiny"
    layers = model_preset(preset, device=device)
    if layers[0].cfg != cfg:
        raise ValueError(f"cfg = {cfg}; expected the config of a model preset (tiny or dsv41)")
    x = layers[0].random_hidden(case.batch.live_rows, seed=case.rows)  # every layer projects the same rows
    # A graph holds none of the tensors it reads and writes: the runners (their buffers) and their
    # pools must live as long as their graphs are replayed, or the replays touch freed memory.
    runners, nodes = [], 0
    for _ in range(max(1, math.ceil(case.copies / len(layers)))):
        pools = layer_pools(layers, case.allocator.pool_requests, case.allocator.kv_slots, device=device)
        runner = PrefillGraphRunner(layers, pools, buckets=[case.rows], request_slots=REQUESTS[1])
        nodes = len(runner.nodes(case.rows))  # listing the nodes replays the dummy batch on CUDA ...
        step = runner.run(case.requests, case.allocator, [x] * len(layers))  # ... so load the batch after
        if step.mode != "graph":
            raise RuntimeError(f"the runner ran {case.rows} rows eagerly; expected a replay of its graph")
        runners.append(runner)
    fused = sum(layer.use_fused_gate for layer in layers)
    graphs = [runner.graphs[case.rows] for runner in runners]
    return dict(rows=case.rows, path="model", mode="graph", variant=f"{len(layers)} layers, {fused} with the fused gate",
                median_us=replay_us(graphs, reps, device), nodes=nodes, launches=None,
                **dict.fromkeys(FRACTIONS), layers=len(layers), fused_layers=fused)
