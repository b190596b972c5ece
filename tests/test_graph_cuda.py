"""The CUDA twins of ``tests/test_graph.py``: the same scenarios, on real CUDA graphs.

Each test runs the ``check_*`` scenario of ``tests/test_graph.py`` with ``backend="cuda"``, so
the emulation and CUDA are held to the same assertions. Scenarios that fail a capture on
purpose get a graph of their own, and so a capture stream of their own (``Graph`` makes one per
graph), and the device is synchronized after every test, so a broken capture cannot leak into
the next one.
"""

from __future__ import annotations

import c2graph  # noqa: F401, I001  (first: decides TRITON_INTERPRET before Triton is imported)

import pytest
import torch

import test_graph as twins

CUDA = "cuda"

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available(),
        reason="needs a CUDA device: the CUDA-graph twins of tests/test_graph.py (run by `make gpu-test`)",
    ),
]


@pytest.fixture(autouse=True)
def idle_device_after_each_test():
    yield
    torch.cuda.synchronize()


def test_capture_launches_nothing():
    twins.check_capture_launches_nothing(CUDA)


def test_python_int_is_frozen():
    twins.check_python_int_is_frozen(CUDA)


def test_tensor_from_list_outside_capture_is_frozen():
    twins.check_tensor_from_list_outside_capture_is_frozen(CUDA)


def test_copy_into_input_is_seen_rebinding_is_not():
    twins.check_copy_into_input_is_seen_rebinding_is_not(CUDA)


def test_outputs_are_overwritten_by_each_replay():
    twins.check_outputs_are_overwritten_by_each_replay(CUDA)


def test_stale_padding_persists():
    twins.check_stale_padding_persists(CUDA)


def test_views_alias_the_base():
    twins.check_views_alias_the_base(CUDA)


def test_slice_bakes_its_offset():
    twins.check_slice_bakes_its_offset(CUDA)


def test_custom_op_is_one_node_and_reruns():
    twins.check_custom_op_is_one_node_and_reruns(CUDA)


def test_triton_custom_op_reruns_with_frozen_scalar():
    twins.check_triton_custom_op_reruns_with_frozen_scalar(CUDA)


def test_no_caller_python_runs_on_replay():
    twins.check_no_caller_python_runs_on_replay(CUDA)


def test_random_ops_draw_fresh_numbers_each_replay():
    twins.check_random_ops_draw_fresh_numbers_each_replay(CUDA)


def test_graphs_share_a_pool():
    twins.check_graphs_share_a_pool(CUDA)


def test_capture_fn_warms_up_then_captures():
    twins.check_capture_fn_warms_up_then_captures(CUDA)


def test_resized_input_after_capture():
    twins.check_resized_input_after_capture(CUDA)


@pytest.mark.parametrize("name", twins.HOST_SYNCS)
def test_host_sync_raises_and_ending_capture_raises(name):
    twins.check_host_sync_raises_and_ending_capture_raises(CUDA, name)


@pytest.mark.parametrize("name", twins.HOST_SYNCS)
def test_uncaught_host_sync_escapes_as_901(name):
    twins.check_uncaught_host_sync_escapes_as_901(CUDA, name)


@pytest.mark.parametrize("name", twins.HOST_COPIES)
def test_host_copy_raises_and_capture_stays_valid(name):
    # Pinned here: building a tensor from Python data inside a capture raises on CUDA (a pageable
    # host-to-device copy), as do `.cpu()` and `.tolist()`; torch checks before any CUDA call, so
    # the capture is still valid once the error is caught.
    twins.check_host_copy_raises_and_capture_stays_valid(CUDA, name)


@pytest.mark.parametrize("name", twins.HOST_COPIES)
def test_uncaught_host_copy_fails_the_graph(name):
    twins.check_uncaught_host_copy_fails_the_graph(CUDA, name)


def test_numpy_raises_type_error():
    twins.check_numpy_raises_type_error(CUDA)


def test_bool_mask_assign_of_number_is_a_masked_fill():
    twins.check_bool_mask_assign_of_number_is_a_masked_fill(CUDA)


def test_unrelated_error_fails_the_graph():
    twins.check_unrelated_error_fails_the_graph(CUDA)


def test_replay_before_capture_and_capturing_twice():
    twins.check_replay_before_capture_and_capturing_twice(CUDA)


def test_inference_mode_capture():
    twins.check_inference_mode_capture(CUDA)


def test_grad_mode_capture():
    twins.check_grad_mode_capture(CUDA)
