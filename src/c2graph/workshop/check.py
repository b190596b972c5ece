"""What an exercise's check returns: pass, or which rows or slots differ, in words."""

from __future__ import annotations

import os
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
    a shape error, ...) is reported as a failed case with its last line, never raised.
    ``figure()`` is drawn only when a case failed.
    """
    try:
        results = cases()
    except NotImplementedError as e:
        return CheckResult(name, False, [f"your {_raised_in(e)} is not written yet: its body still raises "
                                         "NotImplementedError; write it (the task is in the cell above it)"])
    except Exception as e:  # the reader's code failed: say how, do not raise
        where = traceback.format_exception_only(type(e), e)[-1].strip()
        return CheckResult(name, False, [f"your {_raised_in(e)} raised {where}"])
    ok = all(passed for passed, _ in results)
    lines = [f"{'pass' if passed else 'FAIL'}: {what}" for passed, what in results]
    fig = figure() if (figure is not None and not ok) else None
    return CheckResult(name, ok, lines, fig)


def _raised_in(error: BaseException) -> str:
    """``function `my_park_mask` (at `<its line>`)``: the innermost frame of the reader's code (not torch's,
    not this package's) in the traceback, where the error was raised."""
    library = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
    frames = [f for f in traceback.extract_tb(error.__traceback__)
              if not os.path.abspath(f.filename).startswith(library) and f"{os.sep}torch{os.sep}" not in f.filename]
    if not frames:
        return "function"
    last = frames[-1]
    return f"function `{last.name}`" + (f" (at `{last.line.strip()}`)" if last.line and "NotImplementedError" not in last.line else "")
