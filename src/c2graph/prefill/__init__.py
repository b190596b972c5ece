"""The prefill graph: the compressor of every source layer run inside one captured graph per bucket.

The part an engine would take into its own prefill graph is :mod:`.fused_graph`, on one page: the
static offsets tensor refreshed with ``copy_``, a grid from the bucket, the capture on the dummy
batch, over the engine's own metadata. :mod:`.runner` is the teaching runner around the same
launch: many layers (torch and fused), buckets, checks of every batch, the source projection,
the audit (the tests compare it with :mod:`.fused_graph`, bitwise).

- :mod:`.fused_graph`: the engine's piece (imports torch and the fused kernel's launch alone)
- :mod:`.static_batch`: the batch a captured graph reads, at fixed addresses, and every layer's buffers
- :mod:`.runner`: :class:`~.runner.PrefillGraphRunner`, capture and replay per bucket; its public
  step and load (``step``, ``load_capture_batch``, ``refresh``) are what the audit drives
- :mod:`.captured`: what a runner's graphs captured, and the one check a step that it still holds it
- :mod:`.runner_audit`: what a runner's graph froze from the batch (the capture audit of
  :mod:`c2graph.graphs.audit`, run over the dummy batch and a ragged one)

Built on :mod:`c2graph.compressor` (the paths) and :mod:`c2graph.graphs` (capture and replay).
"""
