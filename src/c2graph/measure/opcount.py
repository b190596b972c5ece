"""Launch counts: how many kernels a piece of code starts, seen two ways.

- :func:`count_ops` (any device) counts the ATen ops and custom ops that reach torch's dispatcher,
  with a :class:`~torch.utils._python_dispatch.TorchDispatchMode`. Pure views and metadata ops
  (``view``, ``slice``, ``select``, ``detach``, allocations without a fill, shape queries) launch
  nothing and are left out (:func:`launches_kernel`), so each op counted is roughly one kernel
  launch on a GPU (a copy between host and device, such as reading a CUDA tensor with
  ``.tolist()``, is counted too, though it is a memory copy rather than a kernel). A Triton
  kernel wrapped in a registered custom op (``c2graph::compress_fused``) counts as one op; one
  launched directly (``kernel[grid](...)``) never reaches the dispatcher and is not counted.
- :func:`count_cuda_kernels` (CUDA only) counts the kernels the GPU actually ran, with
  :mod:`torch.profiler`.

The dispatch counter also estimates the bytes each op moves through memory: the sizes of its
tensor inputs and outputs (see :func:`op_bytes`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ..graphs.graph import compiled_code_run_eagerly
from ..graphs.ops import launches_kernel, tensors_in

aten = torch.ops.aten

_OVERWRITES_SELF = {aten.copy_.default, aten.fill_.Scalar, aten.fill_.Tensor, aten.zero_.default}
"""In-place ops that write ``self`` without reading it."""

_GATHERS = {aten.index.Tensor}
_SCATTERS = {aten.index_put_.default, aten.index_put.default, aten._index_put_impl_.default}


def _nbytes(x) -> int:
    return sum(t.numel() * t.element_size() for t in tensors_in(x))


def op_bytes(func, args: tuple, kwargs: dict, out) -> int:
    """Bytes an op reads and writes: its tensor inputs plus its tensor outputs.

    Refinements, so the estimate is not dominated by tensors an op barely touches:
    a gather (``x[idx]``) reads only the rows it returns, a scatter (``x[idx] = v``) writes
    only ``v``'s worth of ``x``, and ``copy_``/``fill_``/``zero_`` do not read what they overwrite.
    Any other op, a custom op included, counts every tensor argument whole: for a kernel that
    touches a few rows of a large cache that is an upper bound, not an estimate.
    """
    if func in _GATHERS:  # reads idx and the gathered rows, writes them out
        return _nbytes(args[1:]) + 2 * _nbytes(out)
    if func in _SCATTERS:  # reads idx and values, writes values' worth of self
        return _nbytes(args[1:]) + _nbytes(args[2])
    if func in _OVERWRITES_SELF:
        return _nbytes(args[1:]) + _nbytes(kwargs) + _nbytes(out)
    return _nbytes(args) + _nbytes(kwargs) + _nbytes(out)


@dataclass
class OpCounts:
    """What :func:`count_ops` saw: ops by name (``aten.add.Tensor``, ``c2graph.compress_fused.default``)
    in the order first seen, with the bytes each name moved in total."""

    counts: Counter = field(default_factory=Counter)
    bytes: Counter = field(default_factory=Counter)

    @property
    def total(self) -> int:
        """Ops counted: roughly the kernel launches on a GPU."""
        return sum(self.counts.values())

    @property
    def total_bytes(self) -> int:
        return sum(self.bytes.values())

    def __getitem__(self, name: str) -> int:
        return self.counts[name]

    def table(self, top: int | None = None) -> str:
        """One line per op name: how many times, and the bytes moved (MiB), most frequent first."""
        names = sorted(self.counts, key=lambda n: -self.counts[n])[:top]
        width = max((len(n) for n in names), default=2)
        lines = [f"{'op':<{width}}  {'calls':>5}  {'MiB moved':>10}"]
        lines += [f"{n:<{width}}  {self.counts[n]:>5}  {self.bytes[n] / 2**20:>10.2f}" for n in names]
        if top is not None and len(self.counts) > top:
            rest = sorted(self.counts, key=lambda n: -self.counts[n])[top:]
            lines.append(f"{f'... {len(rest)} more':<{width}}  {sum(self.counts[n] for n in rest):>5}")
        lines.append(f"{'total':<{width}}  {self.total:>5}  {self.total_bytes / 2**20:>10.2f}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        mib = self.total_bytes / 2**20
        return f"OpCounts(total={self.total}, distinct={len(self.counts)}, MiB moved={mib:.2f})"


class count_ops(TorchDispatchMode):
    """Count the ops that reach torch's dispatcher inside the block::

        with count_ops() as ops:
            compress_torch(layer, *split_projected(projected), batch, pools)
        ops.total, ops.table()

    Views and metadata ops are not counted (:func:`launches_kernel`); ops run as usual. A
    ``torch.compile``'d function runs op by op in the block, its ops counted, and compiled again
    after it (:func:`~c2graph.graphs.graph.compiled_code_run_eagerly`).
    """

    def __init__(self):
        super().__init__()
        self.result = OpCounts()

    def __enter__(self) -> OpCounts:
        self._eager = compiled_code_run_eagerly()
        self._eager.__enter__()
        super().__enter__()
        return self.result

    def __exit__(self, *exc):
        try:
            super().__exit__(*exc)
        finally:
            self._eager.__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if launches_kernel(func):
            name = str(func)
            self.result.counts[name] += 1
            self.result.bytes[name] += op_bytes(func, args, kwargs, out)
        return out


@dataclass
class KernelCounts:
    """What :func:`count_cuda_kernels` saw: GPU kernels by name, and the GPU time each name took (µs)."""

    counts: Counter = field(default_factory=Counter)
    device_us: Counter = field(default_factory=Counter)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    @property
    def total_device_us(self) -> float:
        """Time the kernels ran on the GPU, added up (launch gaps between them not included)."""
        return sum(self.device_us.values())

    def table(self, top: int | None = None) -> str:
        names = sorted(self.counts, key=lambda n: -self.counts[n])[:top]
        lines = [f"{self.counts[n]:>5}  {self.device_us[n]:>9.1f} us  {n[:90]}" for n in names]
        lines.append(f"{self.total:>5}  {self.total_device_us:>9.1f} us  total")
        return "\n".join(lines)

    def __repr__(self) -> str:
        us = self.total_device_us
        return f"KernelCounts(total={self.total}, distinct={len(self.counts)}, device_us={us:.1f})"


def count_cuda_kernels(fn: Callable[[], object], *, warmup: int = 1) -> KernelCounts:
    """Run ``fn()`` under :mod:`torch.profiler` and count the CUDA kernels it launched, with their GPU time.

    ``fn`` runs ``warmup`` times first (Triton compiles, cuBLAS sets up), then once profiled.
    Memory copies and memsets are not kernels and are not counted. Needs a CUDA device.
    """
    if not torch.cuda.is_available():
        raise RuntimeError("count_cuda_kernels needs a CUDA device; on a CPU use count_ops")
    from torch.profiler import ProfilerActivity, profile

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    result = KernelCounts()
    for event in prof.events():
        if event.device_type != torch.autograd.DeviceType.CUDA:
            continue
        if event.name.startswith(("Memcpy", "Memset")) or event.name.lower().startswith(("memcpy", "memset")):
            continue
        result.counts[event.name] += 1
        result.device_us[event.name] += event.time_range.elapsed_us()
    return result
