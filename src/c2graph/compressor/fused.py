"""The fused path: the whole c2 compressor of one extend batch in ONE Triton launch.

The torch path (:mod:`c2graph.compressor.torch_path`) spends about 160 small launches per
source layer, each reading its inputs from memory and writing its result back. The fused kernel
(:mod:`c2graph.compressor.fused_kernel`) reads the ``| kv | score |`` buffer once, keeps every
intermediate in registers (it reads back only the latent rows it just stored, for the index-key
product), and writes only what the batch must write: the compressed KV cache, the index-K cache,
the ring and the pre-RoPE latents.

The grid depends only on static sizes (the rows of the buffer, normally the bucket, which also
picks the blocks; the request slots; and, for a persistent grid, the device's SM count), never on
how the rows are split into requests: the extend offsets are read *inside* the kernel, from a
tensor. That is what lets a CUDA graph capture the launch. Whatever those tensors hold, the kernel
masks every store by the real extents of the caches and the ring: it never writes outside them.

Entry points:

- :func:`compress_fused` takes a layer, the projected buffer, an :class:`ExtendBatch` and the
  :class:`Pools`, and launches once: through the op wherever a dispatch-level tool, the compiler
  or the profiler watches, else directly (the op would do nothing more). It checks its arguments
  once for one set of them (the same tensors where they were, the same objects' fields: the
  record of :class:`~c2graph.compressor.arguments.Passed`), so a step's call costs the host
  little more than the launch;
- :func:`compress_fused_op` is the launch on plain tensors, the torch custom op
  ``c2graph::compress_fused`` (:func:`compress_fused_custom_op`, after a look at its arguments'
  types, which the op's schema would refuse in torch's words) so that dispatch-level tools (the op counter, the CPU emulation of
  CUDA graphs) see the launch as one op and can run it again. It checks every tensor it is given
  (shapes, dtypes, devices, layouts: no values, so it runs inside a capture) before it launches.
"""

from __future__ import annotations

import torch
import triton

from .._runtime import INTERPRET
from .arguments import (FLOAT32_MAX, FLOAT32_TINY, Passed, as_float32_real, as_int, check_no_overlap,
                        check_tensor, fingerprint)
from .batch import MAX_ROWS, ExtendBatch
from .checks import check_latent_out, check_layer_batch_pools, check_outputs
from .config import MAX_RING_SIZE
from .extend_offsets import check_extend_offsets
from .fused_blocks import (  # noqa: F401  (the blocks, imported from here too)
    SMALL_BLOCKS, SMALL_BUCKET_GROUPS_PER_BLOCK, SMALL_BUCKET_ROWS, WIDE_LARGE_BUCKET, WIDE_SMALL_BUCKET,
    KernelBlocks, block_lanes, check_kernel_sizes, grid_blocks, kernel_blocks,
)
from .fused_kernel import compress_fused_kernel
from .pools import Pools
from .source_layer import SourceLayer, layer_tensors


# --------------------------------------------------------------------------------------------
# The launch: one check of every argument, then one custom op, one launch
# --------------------------------------------------------------------------------------------


LAUNCH_TENSORS = ("projected", "ring", "pos", "req", "raw_out_loc", "extend_offsets", "norm_w", "wk", "k_norm_w",
                  "inv_freq", "kv_cache", "index_k", "latent_out")
"""The tensor arguments of :func:`compress_fused_op`, in order (then ``eps``, ``ring_size``, ``grid_rows``)."""


def check_tensor_arguments(tensors) -> None:
    """Each of the :data:`LAUNCH_TENSORS`, given in that order, is a tensor (``ValueError`` naming it)."""
    for name, t in zip(LAUNCH_TENSORS, tensors):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} is a {type(t).__name__}; expected a tensor")


def check_launch(projected, ring, pos, req, raw_out_loc, extend_offsets, norm_w, wk, k_norm_w, inv_freq,
                 kv_cache, index_k, latent_out, eps, ring_size, grid_rows) -> None:
    """Every argument of :func:`compress_fused_op`, against the batch (``pos``: ``T`` rows), the
    layer (``norm_w``: ``D``; ``wk``: ``index_dim``) and the pools (``kv_cache``: the device).

    Every tensor dense and outside autograd, those written no inference tensor outside inference
    mode, and none written sharing memory with another tensor of the call. Reads no tensor values
    (no host sync), so it can run inside a graph capture. Raises ``ValueError`` naming the
    argument, its value and what was expected.
    """
    check_tensor_arguments((projected, ring, pos, req, raw_out_loc, extend_offsets, norm_w, wk, k_norm_w, inv_freq,
                            kv_cache, index_k, latent_out))
    if projected.device.type != "cuda" and not INTERPRET:
        raise ValueError(
            f"projected is on {projected.device}, but Triton runs compiled on this machine: the fused "
            "kernel needs CUDA tensors (build the layer, batch and pools on the default device, cuda); "
            "Triton's interpreter runs it on the CPU only when TRITON_INTERPRET=1 is set before "
            "c2graph is imported"
        )
    for name, value, least, below in (("ring_size", ring_size, 2, MAX_RING_SIZE + 1), ("grid_rows", grid_rows, 0, MAX_ROWS)):
        if isinstance(value, bool) or not isinstance(value, int) or not least <= value < below:
            raise ValueError(f"{name} = {value!r}; expected an int >= {least} and < {below}")
    if isinstance(eps, bool) or not isinstance(eps, float) or not FLOAT32_TINY <= eps <= FLOAT32_MAX:
        as_float32_real("eps", eps)  # the words of Config.eps's refusal
    dev = kv_cache.device
    for name, t in (("norm_w", norm_w), ("wk", wk), ("inv_freq", inv_freq), ("pos", pos), ("ring", ring),
                    ("kv_cache", kv_cache), ("extend_offsets", extend_offsets)):
        dims = 1 if name in ("norm_w", "inv_freq", "pos") else 2
        if t.dim() != dims:
            raise ValueError(f"{name} has shape {tuple(t.shape)}; expected a {dims}-d tensor")
    T, D, index_dim, rope_dim = pos.shape[0], norm_w.shape[0], wk.shape[0], 2 * inv_freq.shape[0]
    check_kernel_sizes(D, index_dim, rope_dim)
    expected = {
        "projected": (projected, (T, 2 * D), torch.float32),
        "ring": (ring, (ring.shape[0], 2 * D), torch.float32),
        "pos": (pos, (T,), torch.int64),
        "req": (req, (T,), torch.int64),
        "raw_out_loc": (raw_out_loc, (T,), torch.int64),
        "extend_offsets": (extend_offsets, (2, extend_offsets.shape[-1]), torch.int32),
        "norm_w": (norm_w, (D,), torch.bfloat16),
        "wk": (wk, (index_dim, D), torch.bfloat16),
        "k_norm_w": (k_norm_w, (index_dim,), torch.bfloat16),
        "inv_freq": (inv_freq, (rope_dim // 2,), torch.float32),
        "kv_cache": (kv_cache, (kv_cache.shape[0], D), torch.bfloat16),
        "index_k": (index_k, (kv_cache.shape[0], index_dim), torch.bfloat16),
        "latent_out": (latent_out, (T, D), torch.bfloat16),
    }
    written = ("latent_out", "ring", "kv_cache", "index_k")
    for name, (t, shape, dtype) in expected.items():
        check_tensor(name, t, shape, dtype, dev, written=name in written, dense=True)
    if ring.shape[0] % ring_size != 1:
        raise ValueError(f"ring has {ring.shape[0]} rows; expected pool_requests * ring_size ({ring_size}) + 1")
    check_no_overlap({name: expected[name][0] for name in written},
                     {name: t for name, (t, _, _) in expected.items() if name not in written})


def kernel_constants(D: int, index_dim: int, rope_dim: int, ring_size: int, request_slots: int,
                     blocks: KernelBlocks) -> dict:
    """The kernel's compile-time constants (``tl.constexpr`` arguments) and Triton's launch options
    (``num_warps``, ``num_stages``) for a layer's sizes and ``blocks``: one dict, as a launch takes
    them by keyword."""
    lanes = blocks.lanes
    return dict(
        D=D, I=index_dim, ROPE=rope_dim, RING=ring_size,
        GROUPS_PER_BLOCK=blocks.groups_per_block, LANES=lanes,
        CHUNK=min(blocks.chunk, D), LOG2_CHUNK=min(blocks.chunk, D).bit_length() - 1,
        BLOCK_K=min(blocks.block_k, D), GATE_STAGES=blocks.gate_stages, GATE_HALVES=blocks.gate_halves,
        S_PAD=triton.next_power_of_2(max(request_slots, 1)),
        RING_PAD=triton.next_power_of_2(ring_size),
        num_warps=blocks.num_warps, num_stages=blocks.num_stages,
    )


def kernel_arguments(projected, ring, pos, req, raw_out_loc, extend_offsets, norm_w, wk, k_norm_w, inv_freq,
                     kv_cache, index_k, latent_out, eps, ring_size, grid_rows,
                     blocks: KernelBlocks | None = None) -> tuple[int, tuple, dict]:
    """``(blocks to run, the kernel's run-time arguments, its constants and options)`` for one launch
    on tensors :func:`check_launch` accepted; ``blocks`` defaults to :func:`kernel_blocks` for
    ``grid_rows``. The number of blocks comes from sizes, never from the requests."""
    D, index_dim, rope_dim = norm_w.shape[0], wk.shape[0], 2 * inv_freq.shape[0]
    request_slots = extend_offsets.shape[1]
    blocks = blocks or kernel_blocks(D, grid_rows)
    num_blocks = grid_blocks(grid_rows, request_slots, blocks.groups_per_block)
    args = (projected, ring, pos, req, raw_out_loc, extend_offsets, norm_w, wk, k_norm_w, inv_freq,
            kv_cache, index_k, latent_out, projected.shape[0], request_slots, num_blocks, kv_cache.shape[0],
            ring.shape[0], eps)
    return num_blocks, args, kernel_constants(D, index_dim, rope_dim, ring_size, request_slots, blocks)


def launch_fused(*tensors_and_sizes, blocks: KernelBlocks | None = None) -> None:
    """Launch the kernel once, one program a block, on the arguments of :func:`compress_fused_op`
    (tensors :func:`check_launch` accepted); ``blocks`` as in :func:`kernel_arguments`."""
    num_blocks, args, constants = kernel_arguments(*tensors_and_sizes, blocks=blocks)
    if num_blocks:
        compress_fused_kernel[(num_blocks,)](*args, **constants)


def compress_fused_op(projected, ring, pos, req, raw_out_loc, extend_offsets, norm_w, wk, k_norm_w, inv_freq,
                      kv_cache, index_k, latent_out, eps, ring_size, grid_rows) -> None:
    """The custom op ``c2graph::compress_fused`` (:func:`compress_fused_custom_op`: the arguments),
    with the types its schema takes checked first, in the package's words: every tensor argument a
    tensor, ``eps`` a number, ``ring_size`` and ``grid_rows`` ints (the op then checks the rest:
    :func:`check_launch`)."""
    tensors = (projected, ring, pos, req, raw_out_loc, extend_offsets, norm_w, wk, k_norm_w, inv_freq, kv_cache,
               index_k, latent_out)
    check_tensor_arguments(tensors)
    compress_fused_custom_op(*tensors, as_float32_real("eps", eps), as_int("ring_size", ring_size),
                             as_int("grid_rows", grid_rows))


def compress_fused_custom_op(
    projected: torch.Tensor,
    ring: torch.Tensor,
    pos: torch.Tensor,
    req: torch.Tensor,
    raw_out_loc: torch.Tensor,
    extend_offsets: torch.Tensor,
    norm_w: torch.Tensor,
    wk: torch.Tensor,
    k_norm_w: torch.Tensor,
    inv_freq: torch.Tensor,
    kv_cache: torch.Tensor,
    index_k: torch.Tensor,
    latent_out: torch.Tensor,
    eps: float,
    ring_size: int,
    grid_rows: int,
) -> None:
    """Check every argument, then launch the fused kernel once, writing ``ring``, ``kv_cache``,
    ``index_k`` and ``latent_out`` in place: the op ``torch.ops.c2graph.compress_fused``, called
    through torch's dispatcher (so dispatch-level tools see it).

    - ``projected``: ``[T, 2D]`` fp32, ``| kv | score |`` of every row
    - ``ring``: ``[pool_requests * ring_size + 1, 2D]`` fp32 (read, then each request's last rows parked)
    - ``pos``, ``req``, ``raw_out_loc``: ``[T]`` int64 per-row metadata
    - ``extend_offsets``: ``[2, request_slots]`` int32, first row and row count of each request slot
    - ``norm_w``: ``[D]`` bf16; ``wk``: ``[index_dim, D]`` bf16; ``k_norm_w``: ``[index_dim]`` bf16;
      ``inv_freq``: ``[rope_dim // 2]`` fp32
    - ``kv_cache``: ``[kv_slots, D]`` bf16 and ``index_k``: ``[kv_slots, index_dim]`` bf16, written
      at the c2 slot of each group row; ``latent_out``: ``[T, D]`` bf16, written on group rows only
    - ``grid_rows``: the rows the grid is sized for (:func:`grid_blocks`: blocks of :func:`kernel_blocks`'s ``groups_per_block`` groups)
      (normally ``T``); groups in blocks past it are not computed

    Whatever the values of the offsets, ``pos``, ``req`` and ``raw_out_loc``, the kernel writes
    nothing outside ``ring``, ``kv_cache``, ``index_k`` and ``latent_out``: a group whose c2 slot
    lies past the caches, or whose ring partner lies outside the ring, stores nothing, and a row
    parked outside the ring is not parked. Right results need right values: check the offsets
    first (:meth:`ExtendBatch.check <c2graph.compressor.batch.ExtendBatch.check>`).
    """
    torch.ops.c2graph.compress_fused.default(projected, ring, pos, req, raw_out_loc, extend_offsets, norm_w, wk,
                                             k_norm_w, inv_freq, kv_cache, index_k, latent_out, eps, ring_size,
                                             grid_rows)


_PLANS = Passed()
"""Launches whose arguments passed :func:`check_launch`: their key -> ``(blocks, the launch's int
and float arguments, its constants)``, worked out once."""


def _compress_fused_kernel(projected, ring, pos, req, raw_out_loc, extend_offsets, norm_w, wk, k_norm_w, inv_freq,
                           kv_cache, index_k, latent_out, eps, ring_size, grid_rows) -> None:
    """The op's kernel on the CPU (Triton's interpreter) and on CUDA: check the arguments (once for
    arguments of one :func:`~.arguments.fingerprint`: :class:`~.arguments.Passed`), launch, and bump
    the version counter of each tensor written, as torch's own in-place ops do."""
    tensors = (projected, ring, pos, req, raw_out_loc, extend_offsets, norm_w, wk, k_norm_w, inv_freq, kv_cache,
               index_k, latent_out)
    key = fingerprint(tensors)
    key = key and (key, eps, ring_size, grid_rows, torch.is_inference_mode_enabled())
    plan = _PLANS.get(key)
    if plan is None:
        plan = _checked_plan(tensors, eps, ring_size, grid_rows)
        _PLANS.add(key, plan)
    _launch(tensors, plan)


def _checked_plan(tensors, eps, ring_size, grid_rows) -> tuple:
    """:func:`check_launch` the arguments, then ``(blocks, the launch's int and float arguments, its
    constants)`` for them."""
    check_launch(*tensors, eps, ring_size, grid_rows)
    num_blocks, args, constants = kernel_arguments(*tensors, eps, ring_size, grid_rows)
    return num_blocks, args[len(tensors):], constants


def _launch(tensors, plan) -> None:
    """Launch the kernel on checked ``tensors`` (:func:`_checked_plan`'s ``plan``), then bump the
    version counter of each tensor written, as torch's own in-place ops do."""
    num_blocks, sizes, constants = plan
    if num_blocks:
        compress_fused_kernel[(num_blocks,)](*tensors, *sizes, **constants)
    torch._C._increment_version(tensors[1:2] + tensors[10:13])  # ring, kv_cache, index_k, latent_out


def _nothing_watches() -> bool:
    """No torch dispatch or function mode (the emulation's record, ``count_ops``, fake tensors), no
    compile and no profiler: the op would only launch the kernel, so :func:`compress_fused` may launch
    it itself, without the dispatcher's hop. Anything else goes through the op, which they see."""
    return (torch._C._len_torch_dispatch_stack() == 0 and torch._C._len_torch_function_stack() == 0
            and not torch.compiler.is_compiling() and not torch.autograd._profiler_enabled())


def _compress_fused_fake(projected, ring, pos, req, raw_out_loc, extend_offsets, norm_w, wk, k_norm_w,
                         inv_freq, kv_cache, index_k, latent_out, eps, ring_size, grid_rows) -> None:
    return None


# The op, defined with torch.library.Library and its kernels registered for the CPU and CUDA
# directly: a call costs the dispatcher a few microseconds (torch.library.custom_op's wrappers
# cost some tens more, on every call). The schema names the tensors it writes (``(a!)``...).
_LIBRARY = torch.library.Library("c2graph", "DEF")
_LIBRARY.define(
    "compress_fused(Tensor projected, Tensor(a!) ring, Tensor pos, Tensor req, Tensor raw_out_loc, "
    "Tensor extend_offsets, Tensor norm_w, Tensor wk, Tensor k_norm_w, Tensor inv_freq, Tensor(b!) kv_cache, "
    "Tensor(c!) index_k, Tensor(d!) latent_out, float eps, int ring_size, int grid_rows) -> ()")
for _key in ("CPU", "CUDA"):
    _LIBRARY.impl("compress_fused", _compress_fused_kernel, _key)
torch.library.register_fake("c2graph::compress_fused", _compress_fused_fake, lib=_LIBRARY)


# --------------------------------------------------------------------------------------------
# The path: a layer, a batch and its pools, one launch
# --------------------------------------------------------------------------------------------

_PATHS = Passed()
"""Calls of :func:`compress_fused` whose layer, batch, pools and buffers passed its checks (by :func:`_path_key`)."""


def _path_key(layer, projected, batch, pools, latent_out) -> tuple | None:
    """Everything :func:`compress_fused`'s checks read: the tensors' fingerprints, the objects'
    fields (Configs, sizes, the batch's requests and extents); ``None`` (check in full) for an
    argument of another type."""
    if type(layer) is not SourceLayer or type(batch) is not ExtendBatch or type(pools) is not Pools:
        return None
    tensors = fingerprint((projected, latent_out, batch.pos, batch.req, batch.raw_out_loc, batch.c2_slot,
                           batch.extend_offsets, pools.ring, pools.kv_cache, pools.index_k,
                           *layer_tensors(layer).values()))
    return tensors and (tensors, layer.cfg, layer.device, layer.use_fused_gate, pools.cfg, pools.pool_requests,
                        pools.kv_slots, batch.requests, tuple(batch.extents.items()), batch.kv_slots_needed,
                        torch.is_inference_mode_enabled())


def compress_fused(
    layer: SourceLayer,
    projected: torch.Tensor,
    batch: ExtendBatch,
    pools: Pools,
    *,
    latent_out: torch.Tensor | None = None,
    validate: bool = True,
) -> torch.Tensor:
    """Compress one extend batch in one launch: write ``pools.kv_cache``, ``pools.index_k``, ``pools.ring``.

    ``projected``: ``[T, 2D]`` fp32, the one ``| kv | score |`` buffer of the fused-gate source
    projection (``T = batch.num_rows``). Returns the pre-RoPE latents ``[T, D]`` bf16
    (``latent_out`` if given, else a new buffer filled with NaN); only rows that complete a group
    are written. Computes the same function as :func:`compress_torch` (within ``rtol = atol =
    2**-6``; the ring bitwise), but never writes for even rows, padding rows or slots past the
    batch, not even c2 slot 0.

    With ``validate`` (the default) the batch is also checked against itself and the pools on the
    host (:meth:`ExtendBatch.check`: the offsets against the rows, ``c2_slot`` against
    ``raw_out_loc``, the extents of the tensors as they are now), a sync; ``validate=False`` skips
    only that check, so the call reads no tensor values (graph capture). The tensors are checked by
    the op itself (:func:`check_launch`: shapes, dtypes, no output sharing memory with another
    tensor), before it launches; whatever their values, the kernel writes nothing outside them.
    """
    key = _path_key(layer, projected, batch, pools, latent_out)
    plan = _PATHS.get(key)
    if plan is None:  # checked once a key: the same facts would get the same verdict
        check_layer_batch_pools(layer, batch, pools)
        if not layer.use_fused_gate:
            raise ValueError(
                "layer.use_fused_gate is False; the fused path reads the one | kv | score | buffer of "
                "the fused-gate projection: use compress_torch for this layer"
            )
        # The op takes tensors only (its schema): anything else is refused here, by name.
        for name, t, want in (("projected", projected, "[T, 2D] fp32"), ("latent_out", latent_out, "[T, D] bf16")):
            if (t is not None or name == "projected") and not isinstance(t, torch.Tensor):
                raise ValueError(f"{name} is a {type(t).__name__}; expected one {want} tensor")
        check_tensor("projected", projected, (batch.num_rows, 2 * layer.cfg.D), torch.float32, pools.device,
                     dense=True)
        check_latent_out(latent_out, batch.num_rows, layer.cfg.D, pools.device)
        check_outputs(layer, pools, latent_out, {"projected": projected, "batch": batch})
    cfg = layer.cfg
    if validate:
        batch.check(pools)
    if latent_out is None:
        latent_out = torch.full((batch.num_rows, cfg.D), float("nan"), dtype=torch.bfloat16, device=pools.device)
    tensors = (projected, pools.ring, batch.pos, batch.req, batch.raw_out_loc, batch.extend_offsets, layer.norm_w,
               layer.wk, layer.k_norm_w, layer.inv_freq, pools.kv_cache, pools.index_k, latent_out)
    if plan is None:
        plan = _checked_plan(tensors, cfg.eps, cfg.ring_size, batch.num_rows)  # (a new latent_out shares no memory)
        _PATHS.add(key, plan)
    if _nothing_watches():
        _launch(tensors, plan)
    else:  # through the op, which the mode, the compiler or the profiler sees
        compress_fused_custom_op(*tensors, cfg.eps, cfg.ring_size, batch.num_rows)
    return latent_out
