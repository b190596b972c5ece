"""How a capture sees a Triton launch: where ``kernel[grid](...)`` enters Triton's launcher.

Triton launches never pass through torch's dispatcher, and Triton's own hooks do not see them
whole: ``triton.knobs.runtime.launch_enter_hook`` is called by the compiled launcher only (not by
the interpreter that runs the kernels on a CPU) with the launch's metadata, not its arguments; a
kernel's ``add_pre_run_hook`` gets the arguments but not the grid. So a capture wraps the
launcher: ``kernel[grid](*args)`` calls ``kernel.run(*args, grid=grid, warmup=False)``, and
autotuners and heuristics call the ``run`` of the kernel they wrap: ``JITFunction.run`` when
Triton compiles (triton 3.6 as 3.9), ``InterpretedFunction.run`` under its interpreter. During a
capture, on either backend, both hand each launch to the capture's
:class:`~c2graph.graphs.op_record.Recording`, which evaluates the grid in the captured code (so
a host read there is refused, as a capture refuses it), records the launch and runs it once.
"""

from __future__ import annotations

import contextlib
import inspect

import torch
from triton.runtime.interpreter import InterpretedFunction
from triton.runtime.jit import JITFunction

_KERNEL_CLASSES = (JITFunction, InterpretedFunction)


def kernel_name(kernel) -> str:
    """The name of a Triton kernel, the name CUDA gives its graph node."""
    return getattr(kernel, "__name__", type(kernel).__name__)


def grid_meta(kernel, args: tuple, kwargs: dict) -> dict:
    """What Triton hands a grid callable: every argument of the kernel by name, defaults included."""
    signature = inspect.signature(kernel.fn)
    bound = signature.bind_partial(*args, **{k: v for k, v in kwargs.items() if k in signature.parameters})
    bound.apply_defaults()
    return dict(bound.arguments)


def python_modes_off():
    """No torch-function or dispatch mode sees the ops run in this block (a launch's own tensor work)."""
    stack = contextlib.ExitStack()
    stack.enter_context(torch._C.DisableTorchFunction())
    stack.enter_context(torch._C._DisableTorchDispatch())
    return stack


@contextlib.contextmanager
def launches_seen_by(recording):
    """Hand every Triton launch of the ``with`` block to ``recording.launch(launcher, kernel, grid, args, kwargs)``."""
    originals = [(cls, cls.__dict__["run"]) for cls in _KERNEL_CLASSES]

    def wrap(launcher):
        def run(kernel, *args, grid, warmup, **kwargs):
            if warmup:  # compiles without launching: nothing to record
                return launcher(kernel, *args, grid=grid, warmup=warmup, **kwargs)
            return recording.launch(launcher, kernel, grid, args, kwargs)

        return run

    for cls, launcher in originals:
        cls.run = wrap(launcher)
    try:
        yield
    finally:
        for cls, launcher in originals:
            cls.run = launcher
