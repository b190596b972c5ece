"""c2graph: DeepSeek-V4.1's ratio-2 KV compressor, CUDA graphs, and a fused Triton kernel.

Importing the package decides how its kernels run: compiled on a CUDA machine, in Triton's
interpreter everywhere else (``TRITON_INTERPRET=1`` only while it imports Triton and decorates its
kernels: ``os.environ`` is as it was afterwards). A program's own kernels are interpreted on such a
machine after ``c2graph.interpret_triton()`` (:mod:`c2graph._runtime` says why). The import
changes no function of torch or Triton, imports no notebook library (matplotlib, ipywidgets,
IPython, ...) and prints nothing: ``c2graph.banner()`` says which machine this is.

The parts, one subpackage each, each building only on those before it: :mod:`c2graph.compressor`
(the layer, the batch, the caches, the torch and fused paths), :mod:`c2graph.graphs` (capture and
replay, the record, the audit), :mod:`c2graph.prefill` (the prefill graph runner and its static
batch), :mod:`c2graph.measure` (comparing, counting, benchmarking), :mod:`c2graph.pictures`
(drawings and the explorer), :mod:`c2graph.workshop` (the notebooks' exercises and checks).
"""

from ._runtime import (DEFAULT_DEVICE, HAS_CUDA, INTERPRET, banner, environment, interpret_triton,  # noqa: I001  (first)
                       kernels_decorated)

with kernels_decorated():  # the package's kernels, decorated for this machine's Triton; os.environ as it was after
    from .compressor.batch import ExtendBatch, Request
    from .compressor.config import Config
    from .compressor.extend_offsets import build_extend_offsets, check_extend_offsets
    from .compressor.fused import compress_fused, compress_fused_op
    from .compressor.programs import program_plan
    from .compressor.rows import BatchPlan, Partner, RowPlan, plan_rows
    from .measure.traffic import minimum_bytes
    from .graphs.graph import Graph, warmup
    from .measure.opcount import count_cuda_kernels, count_ops
    from .compressor.pools import Pools
    from .prefill.runner import PrefillGraphRunner, PrefillStep
    from .compressor.req_to_token import ReqToTokenPool
    from .compressor.ring import new_ring, ring_row
    from .compressor.source_layer import SourceLayer, project, project_fused, split_projected
    from .prefill.static_batch import StaticBatch
    from .compressor.torch_path import compress_torch
    from .compressor.compress import compress, layer_path, project_padded

# The pictures import matplotlib and ipywidgets: loaded on first use, so that ``import c2graph``
# (in every data-parallel rank too) loads no plotting library.
_PICTURES = {"explain_batch": "explorer", "explorer_widget": "explorer"}


def __getattr__(name: str):
    if name in _PICTURES:
        import importlib

        value = getattr(importlib.import_module(f".pictures.{_PICTURES[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_PICTURES])


__all__ = [
    "BatchPlan",
    "Partner",
    "RowPlan",
    "plan_rows",
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
    "StaticBatch",
    "banner",
    "build_extend_offsets",
    "check_extend_offsets",
    "compress",
    "compress_fused",
    "count_cuda_kernels",
    "count_ops",
    "compress_torch",
    "environment",
    "interpret_triton",
    "explain_batch",
    "explorer_widget",
    "compress_fused_op",
    "layer_path",
    "minimum_bytes",
    "program_plan",
    "new_ring",
    "project",
    "project_fused",
    "project_padded",
    "ring_row",
    "split_projected",
    "warmup",
]

__version__ = "0.1.0"

# Many source layers, the capture audit (appended: the names above keep their order).
from .compressor.model import layer_pools, model_preset, served_layers  # noqa: E402
from .graphs.audit import GraphAudit, audit, audit_capture  # noqa: E402

__all__ += ["GraphAudit", "audit", "audit_capture", "layer_pools", "model_preset", "served_layers"]
