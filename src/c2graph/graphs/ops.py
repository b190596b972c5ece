"""Which dispatcher ops launch a kernel, and the tensors an op takes or returns.

Asked by the record of a capture (:mod:`.op_record`), the CPU emulation that replays it
(:mod:`.emulation`), and the op counter (:mod:`c2graph.measure.opcount`).
"""

from __future__ import annotations

import torch
from torch.utils._pytree import tree_leaves

aten = torch.ops.aten

_NOT_LAUNCHES = {
    aten.empty.memory_format,
    aten.empty_strided.default,
    aten.empty_permuted.default,
    aten.empty_like.default,
    aten.new_empty.default,
    aten.new_empty_strided.default,
    aten._unsafe_view.default,
    aten.sym_size.int,
    aten.sym_stride.int,
    aten.sym_numel.default,
    aten.sym_storage_offset.default,
    aten.is_contiguous.default,
}
"""Ops that reach the dispatcher but start no kernel (besides views and in-place view changes)."""


def launches_kernel(func) -> bool:
    """Whether the dispatcher op ``func`` starts a kernel: not a view (``is_view``), not an in-place
    change of a view's shape (tag ``inplace_view``: ``t_``, ``unsqueeze_``), not a bare allocation,
    not a metadata query. The one definition."""
    return not (func.is_view or torch.Tag.inplace_view in func.tags or func in _NOT_LAUNCHES
                or func.namespace == "prim")


def tensors_in(tree) -> list[torch.Tensor]:
    """Every tensor in a tree of lists, tuples and dicts (an op's arguments, its outputs)."""
    return [leaf for leaf in tree_leaves(tree) if isinstance(leaf, torch.Tensor)]
