"""c2graph: DeepSeek-V4.1's ratio-2 KV compressor, CUDA graphs, and a fused Triton kernel.

Importing the package decides how Triton runs: compiled on a CUDA machine, interpreted
(``TRITON_INTERPRET=1``, set before Triton is imported) everywhere else.
"""

from ._runtime import DEFAULT_DEVICE, HAS_CUDA, INTERPRET, banner, environment  # noqa: I001  (first)
from .batch import ExtendBatch, Request
from .config import Config
from .explorer import explain_batch, explorer_widget
from .extend_offsets import build_extend_offsets, check_extend_offsets
from .fused import BLOCK_M, compress_fused, fused_compress_, minimum_bytes, program_plan
from .graph import Graph, warmup
from .opcount import count_cuda_kernels, count_ops
from .pools import Pools
from .prefill_graph import PrefillGraphRunner, PrefillStep
from .req_to_token import ReqToTokenPool
from .ring import new_ring, ring_row
from .source_layer import SourceLayer, project, project_fused, split_projected
from .torch_path import compress_torch

__all__ = [
    "BLOCK_M",
    "DEFAULT_DEVICE",
    "HAS_CUDA",
    "INTERPRET",
    "Config",
    "ExtendBatch",
    "Graph",
    "Pools",
    "PrefillGraphRunner",
    "PrefillStep",
    "ReqToTokenPool",
    "Request",
    "SourceLayer",
    "banner",
    "build_extend_offsets",
    "check_extend_offsets",
    "compress_fused",
    "count_cuda_kernels",
    "count_ops",
    "compress_torch",
    "environment",
    "explain_batch",
    "explorer_widget",
    "fused_compress_",
    "minimum_bytes",
    "program_plan",
    "new_ring",
    "project",
    "project_fused",
    "ring_row",
    "split_projected",
    "warmup",
]

print(banner())
__version__ = "0.1.0"
