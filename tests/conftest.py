"""Hypothesis profiles: ``ci`` where the environment variable ``CI`` is set (CI sets it), else ``dev``.

A profile's ``max_examples`` applies to every property test that does not set its own: the
graph-vs-eager property test of ``tests/test_prefill_graph.py``, where each example is one random
sequence of batches. CI sends 200 of them through the graph on every run; ``dev`` keeps ``make
test`` quick on a laptop. Every other property test sets its own count.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from hypothesis import HealthCheck, settings

import c2graph

# The tests' own Triton kernels run where the package's do: in Triton's interpreter on a machine
# without CUDA (importing c2graph leaves os.environ as it was; the tests ask for it, as a notebook does).
c2graph.interpret_triton()

settings.register_profile("ci", max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow],
                          print_blob=True)
settings.register_profile("dev", max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("ci" if os.environ.get("CI") else "dev")

# The benchmark tools (``benchmarks/*.py``) are scripts, not a package: their tests import them by name.
sys.path.append(str(Path(__file__).resolve().parents[1] / "benchmarks"))
