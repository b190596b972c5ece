"""How the emulation sees a Triton launch: where ``kernel[grid](...)`` enters Triton's launcher.

``kernel[grid](*args)`` calls ``kernel.run(*args, grid=grid, warmup=False)``, and autotuners and
heuristics call the ``run`` of the kernel they wrap: ``JITFunction.run`` when Triton compiles,
``InterpretedFunction.run`` under its interpreter (``TRITON_INTERPRET=1``, how the kernels run on
a CPU). During an emulated capture both are wrapped, so each launch is run once, with the
capture's Python modes off (Triton's own tensor reads and copies are the launch, not the
caller's code), and recorded as a :class:`Launch`: the kernel, the grid frozen at its capture-time
value, the arguments as captured (tensors by identity, scalars by value). A replay calls the
same ``run`` with them again; no Python of the caller, or of a custom op around the launch, runs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from triton.runtime.interpreter import InterpretedFunction
from triton.runtime.jit import JITFunction

_KERNEL_CLASSES = (JITFunction, InterpretedFunction)


@dataclass(frozen=True)
class Launch:
    """One recorded Triton launch, relaunched by :meth:`run` with its capture-time grid and arguments."""

    kernel: Any
    launcher: Callable  # the kernel class's own ``run``, not the capture's wrapper
    grid: tuple
    args: tuple
    kwargs: dict

    def __str__(self) -> str:
        return kernel_name(self.kernel)

    def run(self) -> None:
        self.launcher(self.kernel, *self.args, grid=self.grid, warmup=False, **self.kwargs)


def kernel_name(kernel) -> str:
    """The name of a Triton kernel, the name CUDA gives its graph node."""
    return getattr(kernel, "__name__", type(kernel).__name__)


class FrozenGrid:
    """A launch's grid, evaluated once (at capture) and returned as that tuple ever after.

    ``grid``: a tuple of ints, or Triton's callable of the launch's meta-parameters. A grid
    element that is a tensor would be read on the host at every launch: ``refuse_sync`` refuses it.
    """

    def __init__(self, grid, kernel, refuse_sync: Callable[[str], Any]):
        self._grid, self._kernel, self._refuse_sync = grid, kernel, refuse_sync
        self.value: tuple | None = None if callable(grid) else self._checked(grid)

    def __call__(self, meta) -> tuple:
        if self.value is None:
            self.value = self._checked(self._grid(meta))
        return self.value

    def _checked(self, grid) -> tuple:
        grid = tuple(grid)
        if any(isinstance(size, torch.Tensor) for size in grid):
            self._refuse_sync(f"the grid of {kernel_name(self._kernel)} reads a tensor's value on the host")
        return grid


def python_modes_off():
    """No torch-function or dispatch mode sees the ops run in this block (the launch's own tensor work)."""
    stack = contextlib.ExitStack()
    stack.enter_context(torch._C.DisableTorchFunction())
    stack.enter_context(torch._C._DisableTorchDispatch())
    return stack


def run_and_record(launcher: Callable, kernel, grid, args: tuple, kwargs: dict, refuse_sync) -> tuple[Launch, Any]:
    """Launch once (call it with :func:`python_modes_off`); return the :class:`Launch` and what ``run`` returned."""
    frozen = FrozenGrid(grid, kernel, refuse_sync)
    out = launcher(kernel, *args, grid=frozen if frozen.value is None else frozen.value, warmup=False, **kwargs)
    if frozen.value is None:
        raise RuntimeError(f"the launch of {kernel_name(kernel)} never evaluated its grid; it cannot be recorded")
    return Launch(kernel, launcher, frozen.value, args, kwargs), out


@contextlib.contextmanager
def recording_triton_launches(capture):
    """Route every Triton launch of the ``with`` block to ``capture.launch(launcher, kernel, grid, args, kwargs)``."""
    originals = [(cls, cls.__dict__["run"]) for cls in _KERNEL_CLASSES]

    def wrap(launcher):
        def run(kernel, *args, grid, warmup, **kwargs):
            if warmup:  # compiles without launching: nothing to record
                return launcher(kernel, *args, grid=grid, warmup=warmup, **kwargs)
            return capture.launch(launcher, kernel, grid, args, kwargs)

        return run

    for cls, launcher in originals:
        cls.run = wrap(launcher)
    try:
        yield
    finally:
        for cls, launcher in originals:
            cls.run = launcher
