"""The variants of the fused kernel the benchmarks compile and time.

A variant is the library's :class:`~c2graph.compressor.fused.KernelBlocks` (the compile-time
sizes :func:`~c2graph.compressor.fused.compress_fused` chooses from) plus two launch options that
only a benchmark turns:

- ``programs_per_sm``: launch at most that many programs per SM, each looping over blocks (a
  persistent grid: the kernel's block loop strides by the number of programs), where the library
  launches one program a block;
- ``max_registers``: a cap on registers per thread (Triton's ``maxnreg``), so that more programs
  fit on an SM at once.

Spelled as ``benchmarks/NOTES.md`` spells them:
``g<groups_per_block>.c<chunk>.k<block_k>.w<num_warps>.st<num_stages>[.p<programs_per_sm>][.r<max_registers>].a<gate_stages>[.h1]``
(:func:`parse_variant` reads it back; ``default`` is the library's own choice).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from c2graph.compressor import fused
from c2graph.compressor.arguments import as_int
from c2graph.compressor.fused_kernel import compress_fused_kernel


@dataclass(frozen=True)
class Variant:
    """The library's blocks, and the launch options a benchmark may add (``None``: the library's)."""

    blocks: fused.KernelBlocks
    programs_per_sm: int | None = None
    max_registers: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.blocks, fused.KernelBlocks):
            raise ValueError(f"blocks is a {type(self.blocks).__name__}; expected a KernelBlocks")
        for name in ("programs_per_sm", "max_registers"):
            if getattr(self, name) is not None:
                as_int(f"Variant.{name}", getattr(self, name), least=1, least_is="1, or None")

    @classmethod
    def default(cls, D: int, rows: int) -> Variant:
        """What the library launches for a layer of latent width ``D`` in a bucket of ``rows`` rows."""
        return cls(fused.kernel_blocks(D, rows))

    @property
    def name(self) -> str:
        """The variant as ``NOTES.md`` spells it: the blocks' name with ``.p`` and ``.r`` before ``.a``."""
        head, _, tail = self.blocks.name.partition(".a")
        extra = "".join(f".{key}{value}" for key, value in (("p", self.programs_per_sm), ("r", self.max_registers))
                        if value is not None)
        return f"{head}{extra}.a{tail}"

    def constants(self, D: int, index_dim: int, rope_dim: int, ring_size: int, request_slots: int) -> dict:
        """The library's compile-time constants and launch options, with the register cap added."""
        return self.with_cap(fused.kernel_constants(D, index_dim, rope_dim, ring_size, request_slots, self.blocks))

    def with_cap(self, constants: dict) -> dict:
        """``constants`` with the register cap (Triton's ``maxnreg``) added, where the variant sets one."""
        return constants if self.max_registers is None else {**constants, "maxnreg": self.max_registers}


KEYS = {"g": "groups_per_block", "c": "chunk", "k": "block_k", "w": "num_warps", "st": "num_stages",
        "a": "gate_stages", "h": "gate_halves"}
OPTIONS = {"p": "programs_per_sm", "r": "max_registers"}


def parse_variant(spec: str) -> Variant | None:
    """``default`` -> ``None`` (the library's path); ``g16.c64.k64.w4[.st2][.p2][.r128][.a3][.h1]`` -> a :class:`Variant`."""
    if spec == "default":
        return None
    blocks, options = {}, {}
    for part in spec.split("."):
        key = part.rstrip("0123456789")
        if key not in KEYS and key not in OPTIONS or key == part:
            raise ValueError(f"variant {spec!r}: {part!r} is not one of "
                             f"{', '.join(k + '<n>' for k in (*KEYS, *OPTIONS))}")
        value = int(part[len(key):])
        if key in OPTIONS:
            options[OPTIONS[key]] = value
        else:
            blocks[KEYS[key]] = value
    return Variant(fused.KernelBlocks(**blocks), **options)


@functools.lru_cache(maxsize=None)
def sm_count(device: torch.device) -> int:
    """The device's streaming multiprocessors; 1 for the interpreter, which runs one program at a time."""
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 1


def grid_size(num_blocks: int, variant: Variant, device: torch.device) -> int:
    """Programs launched for ``num_blocks`` blocks: one a block, or at most ``programs_per_sm`` an SM."""
    if variant.programs_per_sm is None:
        return num_blocks
    return min(num_blocks, variant.programs_per_sm * sm_count(device))


def launch_variant(*tensors_and_sizes, variant: Variant):
    """Launch the fused kernel once as ``variant``, on the arguments of
    :func:`~c2graph.compressor.fused.compress_fused_op` (tensors
    :func:`~c2graph.compressor.fused.check_launch` accepted). Returns Triton's compiled kernel
    (``n_regs``, ``n_spills``: what a sweep reports), or ``None`` where there is none (no block to
    run, or the interpreter)."""
    num_blocks, args, constants = fused.kernel_arguments(*tensors_and_sizes, blocks=variant.blocks)
    if num_blocks == 0:
        return None
    projected = args[0]
    compiled = compress_fused_kernel[(grid_size(num_blocks, variant, projected.device),)](*args,
                                                                                        **variant.with_cap(constants))
    return compiled if projected.device.type == "cuda" else None
