"""Launching a reader's ``@triton.jit`` function for a check, and saying what went wrong in the
reader's terms: a stub's ``NotImplementedError`` as itself, a function of another signature named
before it is launched (:func:`kernel_problem`), and an error raised inside Triton or torch by the
reader's code at the reader's own line, with what to change (:func:`launch`), and the frame of
every check that runs a reader's kernel on the puzzles' batches (:func:`check_on_puzzles`).
Notebook 02's puzzle checks (:mod:`c2graph.workshop.kernel`) and its assembly
(:mod:`c2graph.workshop.assembly`) launch through it.
"""

from __future__ import annotations

import inspect
import traceback

import triton

from . import puzzles
from .check import CheckResult, run_check


def kernel_problem(fn, params: list[str]) -> str | None:
    """What keeps the check from launching ``fn`` (a stub raises ``NotImplementedError``), or ``None``."""
    name = name_of(fn)
    if not isinstance(fn, triton.runtime.jit.KernelInterface):
        return f"{name} is not a Triton function: decorate it with @triton.jit"
    try:
        src = getattr(fn, "src", None) or inspect.getsource(fn.fn)
    except (OSError, TypeError):
        src = ""
    if "raise NotImplementedError" in src:  # a student copy's stub: compiled, a raise does not compile
        raise NotImplementedError(f"{name} still raises NotImplementedError")
    names = list(inspect.signature(fn.fn).parameters)
    if names != params:
        return f"{name} takes ({', '.join(names)}); the check launches it with ({', '.join(params)}): keep the signature"
    return None


def name_of(fn) -> str:
    return getattr(fn, "__name__", None) or getattr(getattr(fn, "fn", None), "__name__", repr(fn))


class Failed(Exception):
    """The reader's function failed inside Triton or torch; the message says where, in its own terms."""


# Errors Triton raises for the usual mistakes, said in the reader's terms.
_PLAIN = {
    "reshape() cannot change total number of elements": (
        "tl.reshape must keep the number of elements: a [rows, n] tile can become [rows, n // 2, 2], "
        "never more or fewer values"),
    "Loop-carried variable": (
        "the loop is compiled as a loop that runs on the GPU (range and tl.range), and a variable it "
        "changes must keep its shape; the tile halves every round: loop with tl.static_range, which the "
        "compiler unrolls into one copy of the body per round"),
}


def _reader_line(error: BaseException, reader) -> tuple[str, str] | None:
    """``(the reader's line, the innermost message)`` of an error raised in ``reader``'s code, or ``None``."""
    code = getattr(getattr(reader, "fn", reader), "__code__", None)
    chain, seen = [], error
    while seen is not None and seen not in chain:
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    name = getattr(code, "co_name", None)
    for e in reversed(chain):  # the innermost first
        # Interpreted: a frame of the reader's file. Compiled: Triton's error carries the source of
        # the function it was compiling and the node it stopped at.
        frames = [f for f in traceback.extract_tb(e.__traceback__) if code is not None and f.filename == code.co_filename]
        if frames:
            return (frames[-1].line or "").strip(), str(e).strip() or type(e).__name__
        src, line = getattr(e, "src", None), getattr(getattr(e, "node", None), "lineno", None)
        if isinstance(src, str) and line and name and f"def {name}(" in src:
            lines = src.split("\n")
            return (lines[line - 1].strip() if line <= len(lines) else ""), str(getattr(e, "error_message", "") or e)
    return None


def launch(kernel, grid, *args, reader=None, said: str | None = None, **kwargs) -> None:
    """Launch ``kernel``. A stub's ``NotImplementedError`` comes out as itself; a harness's
    ``static_assert`` whose message starts with ``said`` (``"row_sum must"``) as :class:`Failed` with
    that message; an error raised inside Triton or torch by the reader's function ``reader`` (the
    kernel itself when ``None``) as :class:`Failed`, naming the reader's line."""
    try:
        kernel[grid](*args, **kwargs)
    except Exception as e:
        cause = e
        while cause is not None and not isinstance(cause, NotImplementedError):
            cause = cause.__cause__ or cause.__context__
        if cause is not None or "NotImplementedError" in str(e):
            raise NotImplementedError(*(cause.args if cause is not None else ())) from e
        # Compiled, the message quotes the harness's source too: skip its static_assert(...) lines.
        text = str(e)
        said_line = said and next((line for line in text.splitlines() if said in line and "static_assert(" not in line),
                                  None)
        if said_line:
            raise Failed(said_line[said_line.index(said):].rstrip("')\".")) from e
        reader = kernel if reader is None else reader
        where = _reader_line(e, reader)
        plain = next((v for k, v in _PLAIN.items() if k in text or (where and k in where[1])), None)
        if where is None and plain is None:
            raise
        at = f" at `{where[0]}`" if where and where[0] else ""
        raise Failed(f"your {name_of(reader)} failed{at}: {plain or where[1]}") from e


def reported(cases):
    """``cases`` with a :class:`Failed` launch reported as one failed case, never raised."""
    def run():
        try:
            return cases()
        except Failed as e:
            return [(False, str(e))]
    return run


def check_on_puzzles(name: str, fn, params: list[str], seed: int, one) -> CheckResult:
    """The check called ``name`` of a reader's kernel ``fn`` on the puzzles' batches: ``fn``'s
    signature against ``params`` first (the difference named, nothing launched), then ``one(p)``,
    ``(passed, words)``, on every batch of :func:`~c2graph.workshop.puzzles.puzzles` (``seed``); a
    launch that fails is reported as a failed case, never raised."""
    def cases():
        problem = kernel_problem(fn, params)
        if problem:
            return [(False, problem)]
        return [one(p) for p in puzzles.puzzles(seed)]

    return run_check(name, reported(cases))
