"""How the fused kernel cuts its work: its blocks (compile-time sizes and launch options, never the
batch's) and the size of its grid, from static sizes alone (:mod:`c2graph.compressor.fused` launches it)."""

from __future__ import annotations

from dataclasses import dataclass

from .arguments import as_int


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
