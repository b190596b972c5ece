"""Which lines of the reader's code issued a captured op: the frames outside this package, torch
and Triton, from the launch outward, each as ``file.py:42 in f`` (a notebook cell as ``cell 12,
line 3``); and the ``torch.compile``'d functions of that code the op ran in, which a recorded
capture runs op by op (:func:`~c2graph.graphs.graph.compiled_code_run_eagerly`). The record
(:mod:`.op_record`) and the capture (:mod:`.graph`) ask this module."""

from __future__ import annotations

import contextlib
import linecache
import os
import sys

import torch
import triton

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_LIBRARIES = (*(os.path.dirname(m.__file__) + os.sep for m in (torch, triton)), contextlib.__file__)
_COMPILED = os.path.join(os.path.dirname(torch.__file__), "_dynamo", "eval_frame.py")  # torch.compile's wrapper
# The modules that run a capture: never the line that issued an op.
_MACHINERY = tuple(os.path.join(_PACKAGE, "graphs", name) for name in (
    "graph.py", "emulation.py", "op_record.py", "refusals.py", "triton_launches.py", "audit.py", "lines.py"))


def locate(frames, stop, compiled: list[str] | None = None) -> tuple[str, str, tuple[tuple[str, str], ...]]:
    """``(where, code, stack)`` of the captured code: ``stack``, ``(where, code)`` of each of its
    frames outside this package, torch and Triton, innermost first, else of its innermost frame in
    the package; ``where``, their places joined (``"a.py:3 in f, called from b.py:9 in g"``);
    ``code``, the innermost line's source (``("", "", ())`` where there is no such frame).
    ``frames``: ``(frame, line)`` pairs, innermost first; the captured code ends at ``stop``, the
    frame that entered the capture. ``compiled``: where given, each ``torch.compile``'d function
    of the captured code the frames pass through is added to it, once (``"f (model.py:12)"``)."""
    mine, package = [], []
    for frame, line in frames:
        path = frame.f_code.co_filename
        if compiled is not None and path == _COMPILED and frame.f_code.co_name == "compile_wrapper":
            name = _function(frame.f_locals.get("fn"))
            if name not in compiled:
                compiled.append(name)
        if not path.startswith(_LIBRARIES + _MACHINERY):
            here = (f"{_place(path, line)} in {frame.f_code.co_name}", linecache.getline(path, line).strip())
            (package if path.startswith(_PACKAGE) else mine).append(here)
        if frame is stop:
            break
    stack = tuple(mine or package[:1])
    if not stack:
        return "", "", ()
    return ", called from ".join(w for w, _ in stack), stack[0][1], stack


def _function(fn) -> str:
    """``"f (model.py:12)"``: a function by its name and where it is defined; a compiled module by
    its class's ``forward`` (``"Model.forward (model.py:30)"``)."""
    owner = getattr(fn, "__self__", None)
    if isinstance(owner, torch.nn.Module):
        fn = type(owner).forward
    code = getattr(fn, "__code__", None)
    name = getattr(fn, "__qualname__", type(fn).__name__)
    return f"{name} ({os.path.basename(code.co_filename)}:{code.co_firstlineno})" if code else name


def ran_eagerly_lines(compiled: list[str]) -> list[str]:
    """The words a record's table begins with where the capture ran compiled functions op by op."""
    if not compiled:
        return []
    return [f"compiled code ran op by op in this capture, not compiled: {', '.join(compiled)}; its ops are "
            "recorded here, and are what the graph holds (a capture with record=False runs it compiled)"]


def _place(path: str, line: int) -> str:
    """``"model.py:42"``; a notebook's cell in words: ``"cell 12, line 3"``, 12 being the number
    Jupyter shows beside the cell (its execution count), or ``"a notebook cell, line 3"`` where
    the cell was run without a number of its own (kept out of the history, as a test runner does)."""
    if "ipykernel_" not in path and not path.startswith("<ipython"):
        return f"{os.path.basename(path)}:{line}"
    shell = sys.modules["IPython"].get_ipython() if "IPython" in sys.modules else None
    number = getattr(getattr(shell, "compile", None), "_filename_map", {}).get(path)
    history = shell.user_ns.get("In", []) if shell is not None else []
    if number is not None and number < len(history) and history[number].rstrip() == "".join(
            linecache.getlines(path)).rstrip():
        return f"cell {number}, line {line}"
    return f"a notebook cell, line {line}"


def entering_frame():
    """The frame whose ``with`` entered the capture: the first outside ``contextlib`` and ``graph.py``."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename in (contextlib.__file__, _MACHINERY[0]):
        frame = frame.f_back
    return frame
