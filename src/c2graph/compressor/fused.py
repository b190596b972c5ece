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
  :class:`Pools`, and launches once;
- :func:`compress_fused_op` is the launch on plain tensors, the torch custom op
  ``c2graph::compress_fused`` (:func:`compress_fused_custom_op`, after a look at its arguments'
  types, which the op's schema would refuse in torch's words) so that dispatch-level tools (the op counter, the CPU emulation of
  CUDA graphs) see the launch as one op and can run it again. It checks every tensor it is given
  (shapes, dtypes, devices, layouts: no values, so it runs inside a capture) before it launches.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton

from .._runtime import INTERPRET
from .arguments import FLOAT32_MAX, FLOAT32_TINY, as_float32_real, as_int, check_no_overlap, check_tensor
from .batch import MAX_ROWS, ExtendBatch
from .checks import check_latent_out, check_layer_batch_pools, check_outputs
from .config import MAX_RING_SIZE
from .extend_offsets import check_extend_offsets
from .fused_kernel import compress_fused_kernel
from .pools import Pools
from .source_layer import SourceLayer


@dataclass(frozen=True)
class KernelBlocks:
    """How the kernel cuts its work: compile-time sizes and launch options, never the batch's.

    - ``groups_per_block``: groups per block (one program each, unless persistent); each group
      takes a *lane* of the block's tiles, which have at least 16 lanes (``tl.dot``'s smallest tile)
    - ``chunk``: columns per step of the gate's sweep (pass A; at most ``D``)
    - ``block_k``: latent columns per step of the normalising sweep and the index-key product
      (pass B; at most ``D``)
    - ``num_warps``, ``num_stages``: Triton's launch options
    - ``gate_stages``: pass A's software pipeline (``tl.range(..., num_stages=gate_stages)``): its
      loads run ``gate_stages - 1`` chunks ahead of its math (1: none). Changes no arithmetic,
      only when the loads are issued
    - ``gate_halves``: pass A gates each chunk as two tiles of half its columns (the same bits):
      each thread's copy from memory stays 16 contiguous bytes where a block's warps are few
    """

    groups_per_block: int
    chunk: int
    block_k: int
    num_warps: int
    num_stages: int = 1
    gate_stages: int = 1
    gate_halves: bool = False

    def __post_init__(self) -> None:
        """``ValueError`` naming the field, before Triton sees it: tile sizes and warps are powers of
        two (``tl.arange`` and the tiles need them), the stages positive ints."""
        for name in ("groups_per_block", "chunk", "block_k", "num_warps"):
            value = as_int(f"KernelBlocks.{name}", getattr(self, name), least=1)
            if value & (value - 1):
                raise ValueError(f"KernelBlocks.{name} = {value}; expected a power of two (the kernel's tiles "
                                 "and Triton's warps come in powers of two)")
        for name in ("num_stages", "gate_stages"):
            as_int(f"KernelBlocks.{name}", getattr(self, name), least=1)
        if self.gate_halves not in (True, False):  # 1 and 0 too, as the sweep spells it (".h1")
            raise ValueError(f"KernelBlocks.gate_halves = {self.gate_halves!r}; expected True or False")

    @property
    def lanes(self) -> int:
        return block_lanes(self.groups_per_block)

    @property
    def name(self) -> str:
        """The blocks in one word, as the pictures and ``benchmarks/NOTES.md`` spell them:
        ``g<groups_per_block>.c<chunk>.k<block_k>.w<num_warps>.st<num_stages>.a<gate_stages>[.h1]``."""
        return (f"g{self.groups_per_block}.c{self.chunk}.k{self.block_k}.w{self.num_warps}.st{self.num_stages}"
                f".a{self.gate_stages}{'.h1' if self.gate_halves else ''}")


def block_lanes(groups_per_block: int) -> int:
    """Lanes of a block's tiles, one group each: ``groups_per_block``, or 16 (``tl.dot``'s smallest
    tile) if fewer."""
    return max(16, groups_per_block)


SMALL_BLOCKS = KernelBlocks(groups_per_block=8, chunk=64, block_k=64, num_warps=4)
"""Layers with ``D < 256`` (the ``tiny`` preset): few, small programs, quick in the interpreter."""

WIDE_SMALL_BUCKET = KernelBlocks(groups_per_block=8, chunk=64, block_k=64, num_warps=8, num_stages=3, gate_stages=4)
"""Layers with ``D >= 256`` (``dsv41``) in buckets of at most :data:`SMALL_BUCKET_ROWS` rows: the
most programs (8 groups in 16-lane tiles), about one an SM, so a replay takes one program's chain
of memory round trips: 8 warps share each step, and the loads of pass A run three chunks ahead of
its math, those of pass B's product two steps ahead (measured on an H200: ``benchmarks/NOTES.md``)."""

WIDE_LARGE_BUCKET = KernelBlocks(groups_per_block=16, chunk=64, block_k=64, num_warps=4, num_stages=3, gate_stages=3,
                                gate_halves=True)
"""Layers with ``D >= 256`` in larger buckets: 16 groups a block, every lane busy, 4 warps, so that
four programs fit on an SM and hide each other's loads. Pass A gates each chunk in two half-width
tiles: a ``[16, 64]`` fp32 tile over 4 warps gives a thread 32 contiguous bytes, copied in two
16-byte pieces that each fetch half of every sector the warp touches, so every sector came from
the L2 twice (``benchmarks/NOTES.md``). The same chunks and column sweeps as
:data:`WIDE_SMALL_BUCKET`, and sums in a fixed order (:func:`~c2graph.compressor.fused_math.row_sum`;
a chunk's pairwise sum ends by adding its two halves'), so each group's arithmetic, and every bit
of its results, is the same in every bucket."""

SMALL_BUCKET_ROWS = 4096

SMALL_BUCKET_GROUPS_PER_BLOCK = SMALL_BLOCKS.groups_per_block
"""Groups per block in small buckets: every ``tiny`` layer's, and ``dsv41``'s in buckets of at most
:data:`SMALL_BUCKET_ROWS` rows (larger ones use 16); :func:`kernel_blocks` gives any layer's."""


def grid_blocks(grid_rows: int, request_slots: int, groups_per_block: int) -> int:
    """Blocks of ``groups_per_block`` groups a grid over ``grid_rows`` rows has: enough for every
    group of any batch of those rows and request slots, and for the group number just past the last
    (the block that parks trailing requests with no rows).

    The kernel numbers a request's groups by its rows 0 and 1, 2 and 3, ..., so a request of ``n``
    rows has at most ``(n + 1) // 2`` groups; at most ``min(grid_rows, request_slots)`` requests have
    a row, so a batch has at most ``(grid_rows + min(grid_rows, request_slots)) // 2`` groups. A
    static size: the grid never depends on the batch's requests, and request slots past the rows
    (4096 slots in a bucket of 16 rows) add no block.
    """
    most_requests = min(grid_rows, request_slots)
    return (grid_rows + most_requests) // (2 * groups_per_block) + 1 if grid_rows > 0 else 0


def kernel_blocks(D: int, rows: int) -> KernelBlocks:
    """The blocks the kernel uses for a layer of latent width ``D`` on a buffer of ``rows`` rows
    (the bucket: a static size, so a captured graph keeps its blocks)."""
    if D < 256:
        return SMALL_BLOCKS
    return WIDE_SMALL_BUCKET if rows <= SMALL_BUCKET_ROWS else WIDE_LARGE_BUCKET


def check_kernel_sizes(D: int, index_dim: int, rope_dim: int) -> None:
    """Raise ``ValueError`` unless the kernel's tiles fit: powers of two (``tl.arange`` needs them),
    ``D`` and ``index_dim`` at least 16 (``tl.dot`` needs it)."""
    for name, value, least in (("D", D, 16), ("index_dim", index_dim, 16), ("rope_dim", rope_dim, 2)):
        if value < least or value & (value - 1):
            raise ValueError(
                f"Config.{name} = {value}; the fused kernel needs a power of two >= {least} "
                "(its tiles are tl.arange ranges, and tl.dot's are at least 16 wide)"
            )


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


@torch.library.custom_op("c2graph::compress_fused", mutates_args=("ring", "kv_cache", "index_k", "latent_out"))
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
    ``index_k`` and ``latent_out`` in place.

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
    check_launch(projected, ring, pos, req, raw_out_loc, extend_offsets, norm_w, wk, k_norm_w, inv_freq,
                 kv_cache, index_k, latent_out, eps, ring_size, grid_rows)
    launch_fused(projected, ring, pos, req, raw_out_loc, extend_offsets, norm_w, wk, k_norm_w, inv_freq,
                 kv_cache, index_k, latent_out, eps, ring_size, grid_rows)


@compress_fused_custom_op.register_fake
def _compress_fused_fake(projected, ring, pos, req, raw_out_loc, extend_offsets, norm_w, wk, k_norm_w,
                         inv_freq, kv_cache, index_k, latent_out, eps, ring_size, grid_rows) -> None:
    return None


# --------------------------------------------------------------------------------------------
# The path: a layer, a batch and its pools, one launch
# --------------------------------------------------------------------------------------------


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
    check_layer_batch_pools(layer, batch, pools)
    cfg = layer.cfg
    if not layer.use_fused_gate:
        raise ValueError(
            "layer.use_fused_gate is False; the fused path reads the one | kv | score | buffer of "
            "the fused-gate projection: use compress_torch for this layer"
        )
    # The op takes tensors only (its schema): anything else is refused here, by name.
    for name, t, want in (("projected", projected, "[T, 2D] fp32"), ("latent_out", latent_out, "[T, D] bf16")):
        if (t is not None or name == "projected") and not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} is a {type(t).__name__}; expected one {want} tensor")
    check_tensor("projected", projected, (batch.num_rows, 2 * cfg.D), torch.float32, pools.device, dense=True)
    check_latent_out(latent_out, batch.num_rows, cfg.D, pools.device)
    check_outputs(layer, pools, latent_out, {"projected": projected, "batch": batch})
    if validate:
        batch.check(pools)
    if latent_out is None:
        latent_out = torch.full((batch.num_rows, cfg.D), float("nan"), dtype=torch.bfloat16, device=pools.device)
    compress_fused_custom_op(  # arguments of the schema's types: no need of compress_fused_op's look at them
        projected, pools.ring, batch.pos, batch.req, batch.raw_out_loc, batch.extend_offsets,
        layer.norm_w, layer.wk, layer.k_norm_w, layer.inv_freq,
        pools.kv_cache, pools.index_k, latent_out,
        cfg.eps, cfg.ring_size, batch.num_rows,
    )
    return latent_out
