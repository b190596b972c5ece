"""The graphs: a general toolkit for capture and replay, on CUDA graphs or their CPU emulation.

- :mod:`.graph`: :class:`~.graph.Graph` (capture, replay, nodes, the record) and ``warmup``
- :mod:`.emulation`: the CPU emulation of capture and replay; :mod:`.triton_launches`: how a
  capture sees a Triton launch
- :mod:`.op_record`: the record of a capture (every op, its frozen scalars, grids and tensors);
  :mod:`.ops`: which dispatcher ops launch a kernel, and the tensors an op touches;
  :mod:`.lines`: which lines of the reader's code issued an op (and which of its compiled
  functions a recorded capture ran op by op)
- :mod:`.refusals`: what a capture refuses (host syncs, host copies), in CUDA's words
- :mod:`.audit`: whether a graph captured on one batch does, on another, what the step does:
  :mod:`.audit_replay` replays it against an eager call, :mod:`.audit_compare` compares records
  and says why, :mod:`.audit_report` writes the verdict in words and HTML; :mod:`.frozen_values`:
  what a record holds by value besides numbers (strings, dtypes, generators, a kernel's code)
- :mod:`.cuda_nodes`: the nodes of a captured CUDA graph, read without launching it

It knows nothing of the compressor: the prefill graph that uses it is :mod:`c2graph.prefill`.
"""
