"""Launching a reader's ``@triton.jit`` function for a check, and saying what went wrong in the
reader's terms: a stub's ``NotImplementedError`` as itself, a function of another signature named
before it is launched (:func:`kernel_problem`), and an error raised inside Triton or torch by the
reader's code at the reader's own line, with what to change (:func:`launch`), and the frame of
every check that runs a reader's kernel on the puzzles' batches (:func:`check_on_puzzles`).

Every tensor a check hands a reader's kernel is a view of the middle of a larger poisoned buffer
(:func:`guarded`), and in Triton's interpreter (on a CPU) every load is checked before it is made
(:func:`reads_inside`): a load whose mask lets through an element outside the tensors the kernel
was given (a row past ``num_rows``, the row before the first, a lane past ``request_slots``) stops
the launch at the reader's line, naming the tensor and the element, on every run the same.
Compiled on a GPU, such a read reads the poison around the view.
Notebook 02's puzzle checks (:mod:`c2graph.workshop.kernel`) and its assembly
(:mod:`c2graph.workshop.assembly`) launch through it.
"""

from __future__ import annotations

import inspect
import traceback
from contextlib import contextmanager

import numpy as np
import torch
import triton

from .._runtime import INTERPRET
from . import puzzles
from .check import CheckResult, run_check


# The rows a program takes were called BLOCK before "block" came to mean a run of pairs alone: a
# function written with the former name is launched by it.
FORMER_NAMES = {"ROWS": "BLOCK"}


def by_former_names(kernel, kwargs: dict) -> dict:
    """``kwargs`` with each name the kernel still spells the former way (:data:`FORMER_NAMES`) renamed so."""
    params = inspect.signature(kernel.fn).parameters
    return {FORMER_NAMES[k] if k in FORMER_NAMES and k not in params and FORMER_NAMES[k] in params else k: v
            for k, v in kwargs.items()}


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
    if names != params and [FORMER_NAMES.get(n, n) for n in params] != names:
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


MARGIN = 32
"""Poisoned rows (elements, for a 1-D tensor) :func:`guarded` puts before and after every view."""


def guarded(t: torch.Tensor, poison) -> torch.Tensor:
    """A copy of ``t`` (on ``t``'s device) that is the middle of a buffer of :data:`MARGIN` more rows
    on each side, filled with ``poison``: a read past either end reads ``poison``, never memory of
    another tensor."""
    big = torch.full((t.shape[0] + 2 * MARGIN, *t.shape[1:]), poison, dtype=t.dtype, device=t.device)
    big[MARGIN:MARGIN + t.shape[0]] = t
    return big[MARGIN:MARGIN + t.shape[0]]


class ReadOutside(Exception):
    """A load of the reader's kernel whose mask let through an element outside its tensors."""


def _region(name: str, t: torch.Tensor) -> tuple:
    """``(name, first byte, end byte, bytes a row, rows, the storage's first byte, its end)``."""
    row = t.stride(0) * t.element_size() if t.dim() > 1 else t.element_size()
    storage = t.untyped_storage()
    return (name, t.data_ptr(), t.data_ptr() + t.numel() * t.element_size(), row, t.shape[0],
            storage.data_ptr(), storage.data_ptr() + storage.nbytes(), t.dim())


def _outside_words(addr: int, regions: list[tuple], hint) -> tuple[str, str]:
    """The element at ``addr``, outside every region, in words (which tensor, which row), and what
    to change (``hint(name, row)``, or ``""``)."""
    for name, lo, hi, row_bytes, rows, home_lo, home_hi, dim in regions:
        if home_lo <= addr < home_hi:
            row = (addr - lo) // row_bytes
            what = f"{name}[{row}]" if dim == 1 else f"row {row} of {name}"
            unit = "value" if dim == 1 else "row"
            where = (f"before its first {unit}" if row < 0 else
                     f"past its last {unit} ({rows} {unit}{'s' if rows != 1 else ''}, 0 to {rows - 1})")
            return f"{what}, {where}", (hint(name, row) if hint else "")
    return "memory outside every tensor the check passed (a pointer computed from a wrong index)", ""


@contextmanager
def reads_inside(args: list, names: list[str], hint=None):
    """In Triton's interpreter: every load made meanwhile must lie inside one of the tensors of
    ``args`` (named by ``names``, positionally); one that does not raises :class:`ReadOutside`
    before it reads. Compiled, nothing is checked (the poison of :func:`guarded` shows instead).
    ``hint(name, row)`` adds what to change for a read of that row of that tensor."""
    if not INTERPRET or not names:
        yield
        return
    from triton.runtime import interpreter

    regions = [_region(n, a) for n, a in zip(names, args) if isinstance(a, torch.Tensor)]
    bounds = [(lo, hi) for _, lo, hi, *_ in regions]
    builder = interpreter.interpreter_builder
    load = builder.create_masked_load

    def checked(ptrs, mask, other, *rest):
        addrs, on = np.broadcast_arrays(ptrs.data, mask.data)
        addrs = addrs[on.astype(bool)].astype(np.int64)
        inside = np.zeros(addrs.shape, dtype=bool)
        for lo, hi in bounds:
            inside |= (addrs >= lo) & (addrs < hi)
        if not inside.all():
            raise ReadOutside(*_outside_words(int(addrs[~inside][0]), regions, hint))
        return load(ptrs, mask, other, *rest)

    builder.create_masked_load = checked
    try:
        yield
    finally:
        del builder.create_masked_load


def launch(kernel, grid, *args, reader=None, said: str | None = None, outside=None, **kwargs) -> None:
    """Launch ``kernel``; when it is the reader's own (``reader`` is ``None``), every load it makes
    must lie inside its tensor arguments (:func:`reads_inside`, ``outside`` its hint). A stub's
    ``NotImplementedError`` comes out as itself; a harness's
    ``static_assert`` whose message starts with ``said`` (``"row_sum must"``) as :class:`Failed` with
    that message; an error raised inside Triton or torch by the reader's function ``reader`` (the
    kernel itself when ``None``) as :class:`Failed`, naming the reader's line."""
    names = list(inspect.signature(kernel.fn).parameters) if reader is None else []
    try:
        with reads_inside(list(args), names, outside):
            kernel[grid](*args, **by_former_names(kernel, kwargs))
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
        read = _in_chain(e, ReadOutside)
        if read is not None:
            at = f" at `{where[0]}`" if where and where[0] else ""
            what, why = read.args
            raise Failed(f"your {name_of(reader)} read {what}{at}: a load may touch only what its mask lets "
                         f"through, inside the tensor it was given{'; ' + why if why else ''}") from e
        plain = next((v for k, v in _PLAIN.items() if k in text or (where and k in where[1])), None)
        if where is None and plain is None:
            raise
        at = f" at `{where[0]}`" if where and where[0] else ""
        raise Failed(f"your {name_of(reader)} failed{at}: {plain or where[1]}") from e


def _in_chain(error: BaseException, kind: type) -> BaseException | None:
    """The first exception of type ``kind`` among ``error``, its cause and its context, or ``None``."""
    seen = []
    while error is not None and error not in seen:
        if isinstance(error, kind):
            return error
        seen.append(error)
        error = error.__cause__ or error.__context__
    return None


def reported(cases):
    """``cases`` with a :class:`Failed` launch reported as one failed case, never raised."""
    def run():
        try:
            return cases()
        except Failed as e:
            return [(False, str(e))]
    return run


def check_on_puzzles(name: str, fn, params: list[str], seed: int, one, refuse=None) -> CheckResult:
    """The check called ``name`` of a reader's kernel ``fn`` on the puzzles' batches: ``fn``'s
    signature against ``params`` first (the difference named, nothing launched), then what
    ``refuse(fn)`` says is missing from its source (``None``: nothing), then ``one(p)``,
    ``(passed, words)``, on every batch of :func:`~c2graph.workshop.puzzles.puzzles` (``seed``); a
    launch that fails is reported as a failed case, never raised."""
    def cases():
        problem = kernel_problem(fn, params)
        if problem:
            return [(False, problem)]
        refused = refuse(fn) if refuse else None
        if refused:
            return [(False, refused)]
        found = []
        for p in puzzles.puzzles(seed):
            try:
                found.append(one(p))
            except Failed as e:  # the launch failed on this batch: say which, and go on with the others
                found.append((False, f"{p.what}: {e}"))
        return found

    return run_check(name, reported(cases))
