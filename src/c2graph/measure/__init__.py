"""The measurements.

- comparing: :mod:`.compare` (tensors and pools, bitwise or within a tolerance) and
  :mod:`.slots` (which c2 slots a graph replay got wrong, and why)
- counting: :mod:`.opcount` (dispatcher ops, CUDA kernels) and :mod:`.traffic` (the bytes the
  compressor must move)
- benchmarking on a GPU: :mod:`.bench` (``python -m c2graph bench``), its cases
  (:mod:`.bench_cases`, :mod:`.bench_model`, :mod:`.compiled`), its timers (:mod:`.timing`), the
  stored results' schema (:mod:`.results`) and the host-cost table (:mod:`.bench_host`)
"""
