"""Every stage of the fused kernel beside the torch-path function(s) it replaces: the table the
tests hold the kernel's sources to (each stage's source readable, the timed copy calling the same
stages in the same order).

Built from the modules as they are when a test reads it: under Triton's interpreter the package
swaps each stage's ``@triton.jit`` wrapper for its Python function, so a stage is either; its
name is ``getattr(stage.kernel, "fn", stage.kernel).__name__`` in both cases.
"""

from __future__ import annotations

from typing import NamedTuple

from c2graph.compressor import fused_kernel, fused_math, fused_rows, torch_path


class Stage(NamedTuple):
    """One stage of the kernel: its name, its function, the torch-path function(s) it replaces
    (none where the torch path has no such step: it gives every row a lane)."""

    name: str
    kernel: object
    torch: tuple

    @property
    def function_name(self) -> str:
        return getattr(self.kernel, "fn", self.kernel).__name__


def stages() -> tuple[Stage, ...]:
    """Every stage of :func:`~c2graph.compressor.fused_kernel.compress_fused_kernel`, in the order the math runs them."""
    return (
        Stage("rows inside a request", fused_rows.in_request, (torch_path.previous_row_is_partner,)),
        Stage("first rows of requests", fused_rows.first_rows, (torch_path.ring_read_rows,)),
        Stage("pairs of rows", fused_rows.pair_table, ()),
        Stage("the group of each lane", fused_rows.lane_rows, ()),
        Stage("rows that store a group", fused_rows.stores_group, ()),
        Stage("partners", fused_math.partners, (torch_path.pair_partners,)),
        Stage("gate", fused_math.gate, (torch_path.gate,)),
        Stage("RMSNorm", fused_math.rms_norm, (torch_path.finish, torch_path.rms_norm)),
        Stage("RoPE angles", fused_math.rope_angles, (torch_path.rope,)),
        Stage("RoPE", fused_math.rope, (torch_path.rope,)),
        Stage("pass A: gate and sum of squares", fused_math.gate_and_sum_squares, (torch_path.gate,)),
        Stage("pass B: latent, KV cache, index key", fused_math.latent_and_index_key,
              (torch_path.finish, torch_path.index_key)),
        Stage("index key's weights, once a program", fused_math.index_key_weights, (torch_path.index_key,)),
        Stage("index key to its cache", fused_math.index_key_to_cache, (torch_path.index_key,)),
        Stage("park", fused_rows.park_in_ring, (torch_path.park_mask, torch_path.park)),
        Stage("one program", fused_kernel.compress_fused_kernel, (torch_path.compress_torch,)),
    )
