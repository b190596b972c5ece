"""The checks behind notebook 02's exercise: one stage of the fused kernel, written by the reader.

:func:`check_gate` takes the reader's gate, a ``@triton.jit`` function
``gate(kv_prev, score_prev, kv, score) -> pooled`` on ``[rows, D]`` fp32 tiles, runs it inside a
one-program kernel (Triton's interpreter on a CPU, compiled on a GPU), and compares what it
returns with the torch path's :func:`~c2graph.compressor.torch_path.gate`.
"""

from __future__ import annotations

import inspect

import torch
import triton
import triton.language as tl
from matplotlib.figure import Figure

from .._runtime import DEFAULT_DEVICE, INTERPRET
from ..compressor.pools import POISON
from ..compressor.torch_path import gate as torch_gate
from . import puzzles
from .check import CheckResult, run_check

ROWS, D = 16, 32
"""The tile the check runs: 16 rows (``tl.dot``'s smallest, as in the kernel) of 32 channels."""
TOLERANCE = 1e-5
"""Relative and absolute: ``exp`` and division may differ in the last bits between numpy, the GPU and torch."""


@triton.jit
def _gate_harness(kv_prev_ptr, score_prev_ptr, kv_ptr, score_ptr, out_ptr,
                  ROWS: tl.constexpr, D: tl.constexpr, GATE: tl.constexpr):
    # One program: load four [ROWS, D] fp32 tiles (row-major), call the reader's gate, store its tile.
    offs = tl.arange(0, ROWS)[:, None] * D + tl.arange(0, D)[None, :]
    pooled = GATE(tl.load(kv_prev_ptr + offs), tl.load(score_prev_ptr + offs),
                  tl.load(kv_ptr + offs), tl.load(score_ptr + offs))
    tl.store(out_ptr + offs, pooled)


def _run(fn, kv_prev, score_prev, kv, score) -> torch.Tensor:
    out = torch.full_like(kv, POISON)
    try:
        _gate_harness[(1,)](kv_prev, score_prev, kv, score, out, ROWS=ROWS, D=D, GATE=fn)
    except Exception as e:  # the interpreter and the compiler wrap the reader's own exception
        cause = e
        while cause is not None and not isinstance(cause, NotImplementedError):
            cause = cause.__cause__ or cause.__context__
        if cause is not None or "NotImplementedError" in str(e):  # compiled: only its text is left
            raise NotImplementedError(*(cause.args if cause is not None else ())) from e
        raise
    return out


def _cases(seed: int) -> list[tuple[str, tuple[torch.Tensor, ...]]]:
    """``(what, (kv_prev, score_prev, kv, score))``: fresh random tiles on the default device."""
    g = torch.Generator().manual_seed(seed)

    def rand(scale=1.0):
        return (scale * torch.randn(ROWS, D, generator=g)).to(DEFAULT_DEVICE)

    big = 80.0 + 40.0 * torch.rand(ROWS, D, generator=g)
    sign = torch.where(torch.rand(ROWS, D, generator=g) < 0.5, -1.0, 1.0)
    return [
        ("scores a few units apart", (rand(), rand(3.0), rand(), rand(3.0))),
        ("scores of +-80 to 120 (exp overflows fp32 unless the larger score is subtracted first)",
         (rand(), (sign * big).to(DEFAULT_DEVICE), rand(), (-sign * big + rand(2.0).cpu()).to(DEFAULT_DEVICE))),
        ("the partner is the ring's sentinel (kv 0, score -inf): pooled must be kv itself",
         (torch.zeros(ROWS, D, device=DEFAULT_DEVICE), torch.full((ROWS, D), float("-inf"), device=DEFAULT_DEVICE),
          rand(), rand(3.0))),
    ]


def _differences(got: torch.Tensor, want: torch.Tensor) -> torch.Tensor:
    """``[ROWS, D]`` bool: where ``got`` is not within ``TOLERANCE`` of ``want`` (NaN never is)."""
    got, want = got.cpu().double(), want.cpu().double()
    return ~((got - want).abs() <= TOLERANCE * (1 + want.abs()))


def _picture(bad: torch.Tensor, what: str) -> Figure:
    fig = Figure(figsize=(6.4, 2.6), layout="constrained")
    ax = fig.add_subplot()
    ax.imshow(bad.numpy(), cmap="Reds", vmin=0, vmax=1, aspect="auto", interpolation="nearest")
    ax.set_xlabel("channel")
    ax.set_ylabel("row")
    ax.set_title(f"red: values that differ from the torch path's gate\n({what})", fontsize=10)
    return fig


def check_gate(fn, seed: int = 0) -> CheckResult:
    """Check the reader's ``@triton.jit`` gate against the torch path's, on three kinds of tiles.

    Says pass, or which case failed, how many of the ``16 x 32`` values differ and the first of
    them; a picture marks every differing value of the first failed case. Never raises for a
    wrong or unfinished ``fn``.
    """
    failed: list[tuple[torch.Tensor, str]] = []

    def cases():
        if not isinstance(fn, triton.runtime.jit.KernelInterface):
            return [(False, f"{getattr(fn, '__name__', fn)!s} is not a Triton function: decorate it with @triton.jit")]
        if "raise NotImplementedError" in getattr(fn, "src", ""):
            # a student copy's stub: the compiler would only report that it cannot compile a raise
            raise NotImplementedError("the gate still raises NotImplementedError")
        results = []
        for what, tiles in _cases(seed):
            got, want = _run(fn, *tiles), torch_gate(*tiles)
            bad = _differences(got, want)
            if not bad.any():
                results.append((True, f"{what}: all {bad.numel()} values match"))
                continue
            r, c = (int(i) for i in bad.nonzero()[0])
            results.append((False, f"{what}: {int(bad.sum())} of {bad.numel()} values differ; first at row {r}, "
                                   f"channel {c}: got {float(got[r, c]):.6g}, expected {float(want[r, c]):.6g}"))
            failed.append((bad, what))
        return results

    return run_check("gate (a @triton.jit stage)", cases, figure=lambda: _picture(*failed[0]) if failed else None)


# --------------------------------------------------------------------------------------------
# The puzzles: the fused kernel's pieces, one at a time (batches and answers in .puzzles)
# --------------------------------------------------------------------------------------------

BLOCK, S_PAD, SUM_ROWS, LOG2_N = 8, 8, 16, 5
"""The puzzles' sizes: rows a program, lanes of request slots, and the row sum's ``[16, 32]`` tile."""
INT_POISON = puzzles.INT_POISON


def _kernel_problem(fn, params: list[str]) -> str | None:
    """What keeps the check from launching ``fn`` (a stub raises ``NotImplementedError``), or ``None``."""
    name = getattr(fn, "__name__", None) or getattr(getattr(fn, "fn", None), "__name__", repr(fn))
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


def _launch(kernel, grid, *args, **kwargs) -> None:
    """Launch ``kernel``; a stub's ``NotImplementedError`` comes out as itself, a ``static_assert`` as its message."""
    try:
        kernel[grid](*args, **kwargs)
    except Exception as e:
        cause = e
        while cause is not None and not isinstance(cause, NotImplementedError):
            cause = cause.__cause__ or cause.__context__
        if cause is not None or "NotImplementedError" in str(e):
            raise NotImplementedError(*(cause.args if cause is not None else ())) from e
        said = next((line for line in str(e).splitlines() if "must return" in line), None)
        if said:
            raise ValueError(said[said.index("row_sum must"):].rstrip("')\"."))
        raise


def _dev(t: torch.Tensor) -> torch.Tensor:
    return t.to(DEFAULT_DEVICE)


# --- puzzle 1 ---------------------------------------------------------------------------------------

ROW_SLOTS = ["offsets_ptr", "slot_ptr", "num_rows", "request_slots", "BLOCK", "S_PAD"]


def check_row_slots(fn, seed: int = 0) -> CheckResult:
    """Puzzle 1: ``fn`` writes each row's request slot, read from the extend offsets (-1: padding).

    Launched as ``fn[(cdiv(num_rows, BLOCK),)](offsets, slot, num_rows, request_slots, BLOCK=8,
    S_PAD=8)`` on three batches; the offsets sit in a buffer whose next elements hold 1000, the
    output in one with ``BLOCK`` poisoned elements past its end. Says which row, never written
    or written wrong, and why.
    """
    def cases():
        problem = _kernel_problem(fn, ROW_SLOTS)
        if problem:
            return [(False, problem)]
        results = []
        for p in puzzles.puzzles(seed):
            S, T = p.request_slots, p.num_rows
            offsets = torch.full((2 * S + S_PAD,), 1000, dtype=torch.int32)
            offsets[:2 * S] = p.offsets().flatten()
            out = _dev(torch.full((T + BLOCK,), INT_POISON, dtype=torch.int32))
            _launch(fn, (triton.cdiv(T, BLOCK),), _dev(offsets), out, T, S, BLOCK=BLOCK, S_PAD=S_PAD)
            got, want = out.cpu().tolist(), p.slots().tolist()
            wrong = [r for r in range(T) if got[r] != want[r]]
            past = [i for i in range(T, T + BLOCK) if got[i] != INT_POISON]
            if wrong:
                r = puzzles.first_mistake(wrong, got, S)
                results.append((False, f"{p.what}: {len(wrong)} of {T} rows wrong; first: "
                                       f"{puzzles.slot_mistake(p, r, got[r], want[r], BLOCK)}"))
            elif past:
                results.append((False, f"{p.what}: slot[{past[0]}] was written, past the last row ({T} rows): "
                                       "mask the store with rows < num_rows"))
            else:
                results.append((True, f"{p.what}: all {T} rows right, nothing written past them"))
        return results

    return run_check("row_slots (puzzle 1)", cases)


# --- puzzle 2 ---------------------------------------------------------------------------------------

PARTNERS = ["x_ptr", "ring_ptr", "pos_ptr", "req_ptr", "first_ptr", "group_ptr", "out_ptr", "num_rows", "D", "RING", "BLOCK"]


def check_partners(fn, seed: int = 0) -> CheckResult:
    """Puzzle 2: ``fn`` copies each group row's partner row into ``out``, and writes no other row.

    Launched as ``fn[(cdiv(num_rows, BLOCK),)](x, ring, pos, req, first, group, out, num_rows,
    D=16, RING=2, BLOCK=8)``. Every row of ``x`` and of the ring holds values that say which row
    it is, so a wrong row is named: which one was copied, and which was expected. Rows before and
    after ``x`` and past the ring are guards that name a read out of bounds; ``out`` is poisoned.
    """
    def cases():
        problem = _kernel_problem(fn, PARTNERS)
        if problem:
            return [(False, problem)]
        results = []
        for p in puzzles.puzzles(seed):
            T, x, ring = p.num_rows, puzzles.named_x(p.num_rows), puzzles.named_ring()
            tail = torch.ones(BLOCK, dtype=torch.int64)  # past the last row: odd pos, a group, as if real
            meta = [torch.cat([p.batch.pos, tail]), torch.cat([p.batch.req, 0 * tail]),
                    torch.cat([p.first(), 0 * tail.bool()]), torch.cat([p.group(), tail.bool()])]
            out = _dev(torch.full((T + BLOCK, puzzles.D), POISON))
            _launch(fn, (triton.cdiv(T, BLOCK),), _dev(x)[1:], _dev(ring), *map(_dev, meta), out, T,
                    D=puzzles.D, RING=puzzles.RING, BLOCK=BLOCK)
            got, want = out.cpu(), p.partner_source()
            expect = [None if w is None else x[w[1] + 1] if w[0] == "row" else ring[w[1]] for w in want]
            wrong = [r for r in range(T) if (expect[r] is None and not bool((got[r] == POISON).all()))
                     or (expect[r] is not None and not torch.equal(got[r], expect[r]))]
            past = [i for i in range(T, T + BLOCK) if not bool((got[i] == POISON).all())]
            if wrong:
                results.append((False, f"{p.what}: {len(wrong)} of {T} rows wrong; first: "
                                       f"{puzzles.partner_mistake(p, wrong[0], got[wrong[0]])}"))
            elif past:
                results.append((False, f"{p.what}: out[{past[0]}] was written, past the last row ({T} rows): "
                                       "mask the loads and the store with rows < num_rows"))
            else:
                n = sum(w is not None for w in want)
                results.append((True, f"{p.what}: the {n} group rows' partners right, the other {T - n} rows untouched"))
        return results

    return run_check("gather_partners (puzzle 2)", cases)


# --- puzzle 3 ---------------------------------------------------------------------------------------


@triton.jit
def _row_sum_harness(x_ptr, out_ptr, ROWS: tl.constexpr, LOG2_N: tl.constexpr, ROW_SUM: tl.constexpr):
    # One program: load a [ROWS, 2**LOG2_N] fp32 tile, call the reader's row_sum, store its [ROWS] tile.
    rows = tl.arange(0, ROWS)
    s = ROW_SUM(tl.load(x_ptr + rows[:, None] * (1 << LOG2_N) + tl.arange(0, 1 << LOG2_N)[None, :]), LOG2_N)
    tl.static_assert(len(s.shape) == 1, "row_sum must return one value a row, a [rows] tile: tl.reshape the last one")
    tl.static_assert(s.dtype == tl.float32, "row_sum must return fp32, as its tile is")
    tl.store(out_ptr + rows, s)


def check_row_sum(fn, seed: int = 0) -> CheckResult:
    """Puzzle 3: ``fn(x, LOG2_N)`` sums each row of ``x`` (``[16, 32]`` fp32) neighbours first, to the bit.

    Compares with the same order in torch; a sum in another order is named when it is one of
    the usual ones (column after column; column ``c`` plus ``c + N/2``), or told to be
    ``tl.sum``'s kind. Compiled on a GPU, also runs it with 1, 4 and 8 warps.
    """
    def cases():
        if not isinstance(fn, triton.runtime.jit.KernelInterface):
            return [(False, f"{getattr(fn, '__name__', fn)!s} is not a Triton function: decorate it with @triton.jit")]
        _kernel_problem(fn, list(inspect.signature(fn.fn).parameters))  # a stub raises NotImplementedError
        x = puzzles.sum_rows(seed, SUM_ROWS, 1 << LOG2_N)
        want = puzzles.halving_sum(x)
        outs = {}
        for warps in ((None,) if INTERPRET else (1, 4, 8)):
            out = _dev(torch.full((SUM_ROWS,), POISON))
            options = {} if warps is None else {"num_warps": warps}
            try:
                _launch(_row_sum_harness, (1,), _dev(x), out, ROWS=SUM_ROWS, LOG2_N=LOG2_N, ROW_SUM=fn, **options)
            except ValueError as e:
                return [(False, str(e))]
            outs[warps] = out.cpu()
        got = next(iter(outs.values()))
        results = []
        if torch.equal(got, want):
            results.append((True, f"all {SUM_ROWS} rows of 32 values: the fixed order's sum, to the bit"))
        else:
            r = int((got != want).nonzero()[0])
            exact = float(x[r].double().sum())
            line = f"row {r}: got {float(got[r])!r}, neighbours first gives {float(want[r])!r}"
            if torch.equal(got, puzzles.sequential_sum(x)):
                why = "you added the columns one after another, ((x0 + x1) + x2) + ...: add neighbours in pairs, then pairs of pairs"
            elif torch.equal(got, puzzles.halves_sum(x)):
                why = "you added column c to column c + N/2 (the two halves): split neighbours (2c, 2c + 1) instead"
            elif abs(float(got[r]) - exact) > 1e-3 * float(x[r].abs().sum()):
                why = f"that is not the row's sum at all (about {exact:.6g}): sum over axis 1, every column once"
            else:
                why = ("the right sum in another order of adds (tl.sum adds in the order its threads hold the values, "
                       "which changes with num_warps): reshape to [rows, N/2, 2], tl.split, add, LOG2_N times")
            results.append((False, f"{int((got != want).sum())} of {SUM_ROWS} rows differ from the fixed order's sum; first: {line}: {why}"))
        for warps, out in outs.items():
            if not torch.equal(out, got):
                results.append((False, f"with num_warps={warps} the sums differ from num_warps=1: the order is not fixed"))
        return results

    return run_check("row_sum (puzzle 3)", cases)


# --- puzzle 4 ---------------------------------------------------------------------------------------

def _park_launch(fn, p: puzzles.Puzzle, programs: int) -> dict[int, str]:
    """Launch ``programs`` programs of ``fn`` on a fresh poisoned ring; ``{ring row: what it holds}``
    for every ring row written. ``x``, ``pos`` and ``req`` have a guard before them; the offsets and
    the first pairs, ``S_PAD`` zeros after them."""
    S, zero = p.request_slots, torch.zeros(1, dtype=torch.int64)
    ring = _dev(torch.full((puzzles.POOL_REQUESTS * puzzles.RING + 1, puzzles.D), POISON))
    tail = torch.zeros(S_PAD, dtype=torch.int32)
    x, pos, req, offsets, first_pair = map(_dev, (puzzles.named_x(p.num_rows, after=False), torch.cat([zero, p.batch.pos]),
                                                 torch.cat([zero, p.batch.req]), torch.cat([p.offsets().flatten(), tail]),
                                                 torch.cat([p.first_pairs(), tail])))
    _launch(fn, (programs,), x[1:], ring, pos[1:], req[1:], offsets, first_pair, S,
            D=puzzles.D, RING=puzzles.RING, GROUPS=GROUPS, S_PAD=S_PAD)
    ring = ring.cpu()
    return {k: puzzles.source_of(ring[k]) for k in range(ring.shape[0]) if not bool((ring[k] == POISON).all())}


PARK = ["x_ptr", "ring_ptr", "pos_ptr", "req_ptr", "offsets_ptr", "first_pair_ptr", "request_slots", "D", "RING",
        "GROUPS", "S_PAD"]
GROUPS = 4
"""Pairs of rows a program in puzzle 4 (the kernel's is 8 or 16)."""


def check_park(fn, seed: int = 0) -> CheckResult:
    """Puzzle 4: program ``b`` parks the requests whose first pair is one of its ``GROUPS`` pairs.

    Launched as ``fn[(programs,)](x, ring, pos, req, offsets, first_pair, request_slots, D=16,
    RING=2, GROUPS=4, S_PAD=8)``, first with only program 0, then programs 0 and 1, and so on, each
    on a fresh poisoned ring: so a program that parks another program's request is caught, even
    when the whole grid's ring would look right. Says which ring row, never written or written
    wrong, and which row it holds.
    """
    def cases():
        problem = _kernel_problem(fn, PARK)
        if problem:
            return [(False, problem)]
        results = []
        for p in puzzles.puzzles(seed):
            programs = triton.cdiv((p.num_rows + p.request_slots) // 2 + 1, GROUPS)  # enough for any batch's pairs
            for b in range(programs):
                why = puzzles.park_mistake(p, _park_launch(fn, p, b + 1), b + 1, GROUPS)
                if why:
                    results.append((False, f"{p.what}: with {'only program 0' if b == 0 else f'programs 0 to {b}'} of {programs} launched, {why}"))
                    break
            else:
                results.append((True, f"{p.what}: the {len(p.parked())} parked ring rows right, each written by "
                                      "its request's program alone, no other ring row"))
        return results

    return run_check("park (puzzle 4)", cases)
