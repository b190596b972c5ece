"""What an exercise's check returns: pass, or which rows or slots differ, in words."""

from __future__ import annotations

import os
import re
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class CheckResult:
    """The outcome of one exercise check. ``ok`` is true only when every case passed.

    ``lines`` say, case by case, what was compared and what differed; ``figure`` is an optional
    matplotlib figure that shows where (shown under the text in a notebook).
    """

    name: str
    ok: bool
    lines: list[str] = field(default_factory=list)
    figure: Any = None

    def __bool__(self) -> bool:
        return self.ok

    def __str__(self) -> str:
        head = f"{self.name}: {'pass' if self.ok else 'not yet'}"
        return "\n".join([head] + [f"  {line}" for line in self.lines])

    __repr__ = __str__

    def _repr_pretty_(self, p, cycle) -> None:  # IPython shows the text, then the picture
        p.text(str(self))
        if self.figure is not None:
            from IPython.display import display

            display(self.figure)


def run_check(name: str, cases: Callable[[], list[tuple[bool, str]]], figure: Callable[[], Any] | None = None) -> CheckResult:
    """Run ``cases()`` (a list of ``(passed, what)`` pairs) and collect the outcome.

    An exception from the reader's code (``NotImplementedError`` from a student copy's stub,
    a shape error, an error raised inside Triton or torch, ...) is reported as a failed case at the
    reader's own line, with what to change there, never raised. ``figure()`` is drawn only when a
    case failed.
    """
    try:
        results = cases()
    except NotImplementedError as e:
        return CheckResult(name, False, [f"your {_raised_in(e)} is not written yet: its body still raises "
                                         "NotImplementedError; write it (the task is in the cell above it)"])
    except Exception as e:  # the reader's code failed: say how, do not raise
        return CheckResult(name, False, [raised_words(e)])
    ok = all(passed for passed, _ in results)
    lines = [f"{'pass' if passed else 'FAIL'}: {what}" for passed, what in results]
    fig = figure() if (figure is not None and not ok) else None
    return CheckResult(name, ok, lines, fig)


def raised_words(error: BaseException) -> str:
    """``your function `f` (at `<its line>`) raised <error>: <what to change>``: the reader's own line
    (never Triton's, torch's or this package's), the error's first line, and, for the errors a reader
    meets most (:data:`HINTS`), what to change at that line."""
    lines = [line for line in str(error).strip().splitlines() if line.strip()] or [""]
    said = lines[0]
    if type(error).__name__ == "CompilationError":  # compiled Triton: "at 4:11:", the kernel's source, the message
        at = re.match(r"at (\d+):(\d+):", lines[0])
        said = lines[-1] + (f" (line {at.group(1)} of the kernel, its `def` line counted as 1)" if at else "")
    text = f"{type(error).__name__}: {said.strip()}" if said else type(error).__name__
    hint = next((says for pattern, says in HINTS if re.search(pattern, f"{type(error).__name__}: {error}")), None)
    return f"your {_raised_in(error)} raised {text}" + (f": {hint}" if hint else "")


HINTS = (
    (r"pointer<\w+> and pointer<|pointer<\w+>.*(cannot|invalid)|invalid operands of type pointer",
     "a tensor went into a kernel argument that takes a number: Triton passes every tensor argument as a "
     "pointer (the address of its first element), so the kernel did arithmetic on an address. Pass tensors "
     "only to `*_ptr` arguments and `tl.load` the number inside the kernel"),
    (r"must match the (existing )?size",
     "two tensors of different lengths meet on that line: slices on both sides must cover the same rows "
     "(`x[1:]` with `x[:-1]`), and a per-row result has one value per row of the batch (`batch.num_rows`)"),
    (r"shape '\[.*\]' is invalid for input of size|view size is not compatible",
     "a reshape or view on that line asks for a shape whose number of elements is not the tensor's"),
    (r"out of bounds|out of range",
     "an index on that line points past the end of its tensor: clamp it, or mask the rows that have none"),
    (r"can't be cast to the desired output type|expected scalar type|same dtype",
     "two dtypes meet on that line: give both sides the dtype of the tensor written into (`.to(t.dtype)`)"),
    (r"Expected all tensors to be on the same device",
     "tensors on two devices meet on that line: make new tensors on the batch's device (`device=batch.pos.device`)"),
)
"""``(pattern, what to change)``: the errors raised inside Triton or torch that a reader meets most, each
with the change in the reader's terms (matched against ``"<Type>: <the whole message>"``)."""


def _raised_in(error: BaseException) -> str:
    """``function `my_park_mask` (at `<its line>`)``: the innermost frame of the reader's code (not
    Triton's, torch's or this package's) in the traceback, where the error was raised."""
    library = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
    others = (f"{os.sep}torch{os.sep}", f"{os.sep}triton{os.sep}", f"{os.sep}site-packages{os.sep}")
    frames = [f for f in traceback.extract_tb(error.__traceback__)
              if not os.path.abspath(f.filename).startswith(library) and not any(o in f.filename for o in others)]
    if not frames:
        return "function"
    last = frames[-1]
    return f"function `{last.name}`" + (f" (at `{last.line.strip()}`)" if last.line and "NotImplementedError" not in last.line else "")
