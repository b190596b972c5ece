"""Values a capture freezes that are neither tensors nor numbers, as the record holds them.

A random generator by its seed and whether it was just seeded (:class:`GeneratorArg`); a Triton
kernel by its code (:class:`KernelCode`: its module and a digest of its source, never its name
alone, which two modules' kernels may share); strings, dtypes, devices, layouts and memory
formats by value (:data:`BY_VALUE`). :mod:`.op_record` records them; :mod:`.audit` compares them.
"""

from __future__ import annotations

import hashlib
import inspect
import weakref
from dataclasses import dataclass

import torch

from .triton_launches import kernel_name


@dataclass(frozen=True)
class GeneratorArg:
    """A random generator handed to an op, by the seed it was last seeded with; ``fresh``: whether
    its state is that seed's first (it was seeded and has drawn nothing since: seeded in the step)."""

    seed: int
    fresh: bool = False

    def __str__(self) -> str:
        return f"a torch.Generator seeded with {self.seed}"

    __repr__ = __str__


@dataclass(frozen=True)
class KernelCode:
    """A Triton kernel by its code: its name, the module that defines it and a digest of its
    source, so that two modules' kernels of one name are told apart."""

    name: str
    module: str
    digest: str

    def __str__(self) -> str:
        return f"{self.name} of {self.module} (source {self.digest})"

    __repr__ = __str__


BY_VALUE = (str, torch.dtype, torch.device, torch.layout, torch.memory_format)
"""Arguments that are neither tensors nor numbers, recorded by value (``rounding_mode="floor"``, ``dtype``)."""


def generator_arg(generator: torch.Generator) -> GeneratorArg:
    """``generator`` by its seed, and whether it is in that seed's first state (seeded, nothing drawn since)."""
    try:
        first = torch.Generator(device=generator.device).manual_seed(generator.initial_seed()).get_state()
        fresh = torch.equal(first, generator.get_state())
    except RuntimeError:  # a generator whose state cannot be read here (a CUDA one during a capture)
        fresh = False
    return GeneratorArg(generator.initial_seed(), fresh)


_CODES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # kernel function -> its KernelCode


def kernel_code(kernel) -> KernelCode:
    """A Triton kernel by its code (:class:`KernelCode`), read once per kernel function (kept no
    longer than the function lives)."""
    fn = getattr(kernel, "fn", kernel)
    code = _CODES.get(fn)
    if code is None:
        try:
            source = inspect.getsource(fn)
        except (OSError, TypeError):  # no source file: its bytecode stands for its code
            source = repr(getattr(getattr(fn, "__code__", None), "co_code", fn))
        digest = hashlib.sha1(source.encode()).hexdigest()[:10]
        code = _CODES[fn] = KernelCode(kernel_name(kernel), getattr(fn, "__module__", None) or "?", digest)
    return code
