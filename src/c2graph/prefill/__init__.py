"""The prefill graph: the compressor of every source layer run inside one captured graph per bucket.

The part an engine would take into its own prefill graph is :mod:`.runner` with the static batch
it refreshes (:mod:`.static_batch`): capture per bucket over static buffers, then before every
replay ``copy_`` the batch's metadata in, run the source projection on the live rows, and replay.

- :mod:`.static_batch`: the batch a captured graph reads, at fixed addresses
- :mod:`.runner`: :class:`~.runner.PrefillGraphRunner`, capture and replay per bucket; its public
  step and load (``step``, ``load_capture_batch``, ``refresh``) are what the audit drives
- :mod:`.runner_audit`: what a runner's graph froze from the batch (the capture audit of
  :mod:`c2graph.graphs.audit`, run over the dummy batch and a ragged one)
- :mod:`.broken_offsets`: the runner with its offsets handled the ways that break in a graph

Built on :mod:`c2graph.compressor` (the paths) and :mod:`c2graph.graphs` (capture and replay).
"""
