"""How a capture sees a Triton launch: where ``kernel[grid](...)`` enters Triton's launcher.

Triton launches never pass through torch's dispatcher, and Triton's own hooks do not see them
whole: ``triton.knobs.runtime.launch_enter_hook`` is called by the compiled launcher only (not by
the interpreter that runs the kernels on a CPU) with the launch's metadata, not its arguments; a
kernel's ``add_pre_run_hook`` gets the arguments but not the grid. So a capture wraps the
launcher: ``kernel[grid](*args)`` calls ``kernel.run(*args, grid=grid, warmup=False)``, and
autotuners and heuristics call the ``run`` of the kernel they wrap: ``JITFunction.run`` when
Triton compiles (triton 3.6 as 3.9), ``InterpretedFunction.run`` under its interpreter. During a
capture, on either backend, both hand each launch *of the capturing thread* to the capture's
:class:`~c2graph.graphs.op_record.Recording`, which evaluates the grid in the captured code (so
a host read there is refused, as a capture refuses it), records the launch and runs it once.

A capture stays in its thread, as a CUDA capture records only the work of its own stream: the
recording a launch goes to is the launching thread's own (a thread-local), and a launch of any
other thread goes straight to Triton, neither recorded nor run under the capture's rules. The
wrapper is on the class (Triton keeps no per-thread launcher): it goes on when the first capture
begins and comes off when the last one ends, on every exit, an exception or a
``KeyboardInterrupt`` included.
"""

from __future__ import annotations

import contextlib
import inspect
import threading

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


_WRAPPED = {"captures": 0, "originals": []}  # captures in progress; each class and its own launcher
_WRAP_LOCK = threading.Lock()
_THIS_THREAD = threading.local()  # .recording: the recording of this thread's capture, if any


def _wrap(launcher):
    """``launcher`` (a class's own ``run``), handing the launches of a capturing thread to its recording."""

    def run(kernel, *args, grid, warmup, **kwargs):
        recording = getattr(_THIS_THREAD, "recording", None)
        if recording is None or warmup:  # another thread's launch, or a compile without launch
            return launcher(kernel, *args, grid=grid, warmup=warmup, **kwargs)
        return recording.launch(launcher, kernel, grid, args, kwargs)

    return run


@contextlib.contextmanager
def launches_seen_by(recording):
    """Hand every Triton launch of this thread in the ``with`` block to ``recording.launch(launcher,
    kernel, grid, args, kwargs)``; other threads' launches run as they would without it."""
    with _WRAP_LOCK:
        if _WRAPPED["captures"] == 0:
            _WRAPPED["originals"] = [(cls, cls.__dict__["run"]) for cls in _KERNEL_CLASSES]
            for cls, launcher in _WRAPPED["originals"]:
                cls.run = _wrap(launcher)
        _WRAPPED["captures"] += 1
    outer = getattr(_THIS_THREAD, "recording", None)
    _THIS_THREAD.recording = recording
    try:
        yield
    finally:
        _THIS_THREAD.recording = outer
        with _WRAP_LOCK:
            _WRAPPED["captures"] -= 1
            if _WRAPPED["captures"] == 0:
                for cls, launcher in _WRAPPED["originals"]:
                    cls.run = launcher
