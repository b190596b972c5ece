"""The checks behind notebook 02's puzzles: four pieces of the fused kernel, written by the reader.

Each check takes the reader's ``@triton.jit`` function, launches it (Triton's interpreter on a CPU,
in well under a second; compiled on a GPU) on the batches of :func:`c2graph.workshop.puzzles.puzzles`,
and compares what it wrote or returned with the answer computed in torch. It says pass, or which
row (or ring row) is wrong, whether it was never written (still the poison) or written wrong, and
the usual mistake behind it. It never raises for a wrong or unfinished function: a stub's
``NotImplementedError`` is reported as "not written yet", a function that is not a Triton function
or has another signature is named first, and an error raised inside Triton or torch by the
reader's code is reported at the reader's line, in the reader's terms (:mod:`c2graph.workshop.launch`;
the assembly's checks, :mod:`c2graph.workshop.assembly`, launch through it too). The batches are the
same on every run (hand-made edge cases, then one drawn from ``seed``), so is the verdict.

1. :func:`check_row_slots`: each row's request slot, from the extend offsets;
2. :func:`check_partners`: each group row's partner, the previous row or a ring row;
3. :func:`check_row_sum`: a row sum in one fixed order, to the bit;
4. :func:`check_park`: the park loop, one program a request, with bounds read at run time.
"""

from __future__ import annotations

import ast
import inspect
import textwrap

import torch
import triton
import triton.language as tl

from .._runtime import DEFAULT_DEVICE, INTERPRET
from ..compressor.pools import POISON
from ..pictures.style import plural
from . import puzzles
from .check import CheckResult, run_check
from .launch import check_on_puzzles, guarded, kernel_problem, launch, name_of, reported

ROWS, S_PAD, SUM_ROWS, LOG2_N = 8, 8, 16, 5
"""The puzzles' sizes: rows a program, lanes of request slots, and the row sum's ``[16, 32]`` tile."""
INT_POISON = puzzles.INT_POISON


def _dev(t: torch.Tensor) -> torch.Tensor:
    return t.to(DEFAULT_DEVICE)


def _span(p: puzzles.Puzzle, slot: int) -> str:
    rows = p.batch.row_ranges()[slot]
    return f"rows {rows.start} to {rows.stop - 1}" if len(rows) > 1 else f"row {rows.start} only"


def _slot_mistake(p: puzzles.Puzzle, r: int, got: int, want: int, rows: int) -> str:
    """Puzzle 1: what is wrong with ``slot[r] = got`` where ``want`` was due."""
    S = p.request_slots
    starts, counts = p.offsets().tolist()
    if got == INT_POISON:
        return f"slot[{r}] was never written (still the poison {INT_POISON}); row {r} is program {r // rows}'s"
    if got >= S or got < -1:
        return (f"row {r} got request slot {got}, but there are only {S} (0 to {S - 1}): the lanes of "
                "tl.arange(0, S_PAD) from request_slots on must claim no row; load the offsets with "
                "mask=s < request_slots (other=0: start 0, count 0, an empty range)")
    said = (f"row {r} is a padding row (in no request slot)" if want < 0
            else f"row {r} lies in request slot {want} ({_span(p, want)})")
    hint = ""
    if got >= 0 and r == starts[got] + counts[got]:
        hint = (f": row {r} is slot {got}'s start + count ({starts[got]} + {counts[got]}), one past its last row; "
                "a row lies in slot s when start <= row < start + count")
    return f"{said} but slot[{r}] = {got}{hint}"


def _first_mistake(wrong: list[int], got: list[int], request_slots: int) -> int:
    """Puzzle 1: the wrong row to report: one never written, else a real slot wrongly given, else the first."""
    for keep in (lambda g: g == INT_POISON, lambda g: -1 <= g < request_slots):
        found = [r for r in wrong if keep(got[r])]
        if found:
            return found[0]
    return wrong[0]


def _partner_mistake(p: puzzles.Puzzle, r: int, got: torch.Tensor) -> str:
    """Puzzle 2: what is wrong with ``out[r] = got``."""
    pos, req = int(p.batch.pos[r]), int(p.batch.req[r])
    want = p.partner_source()[r]
    if want is None:
        why = "a padding row" if int(p.batch.raw_out_loc[r]) == 0 else f"pos {pos} is even"
        return (f"row {r} completes no group ({why}) but out[{r}] was written ({puzzles.source_of(got)}): "
                "mask the store with the group rows")
    expected = f"x row {want[1]}" if want[0] == "row" else f"ring row {want[1]}"
    if bool((got == POISON).all()):
        return (f"row {r} (pos {pos}, a group row): out[{r}] was never written (still the poison {POISON:g}); "
                f"expected {expected}")
    found, hint = puzzles.source_of(got), ""
    if want[0] == "ring":
        hint = (f": row {r} is the first row of its request, so its partner (pos {pos - 1}) is in the ring, at "
                f"req * RING + (pos - 1) % RING = {req} * {puzzles.RING} + {(pos - 1) % puzzles.RING}")
        if found == f"ring row {req * puzzles.RING + pos % puzzles.RING}":
            hint += " (you used pos % RING: that is where this row itself would be parked)"
    elif found.startswith("ring"):
        hint = f": row {r} is not the first row of its request, so its partner is the previous row of x"
    return f"row {r} (pos {pos}, req {req}): out[{r}] holds {found}; expected {expected}{hint}"


def _park_mistake(p: puzzles.Puzzle, got: dict[int, str], programs: int, groups_per_block: int) -> str | None:
    """Puzzle 4: what is wrong with the ring rows ``got`` (``{ring row: what it holds}``) after
    programs ``0 .. programs - 1`` ran, each parking its own requests; ``None`` when nothing is."""
    fp, parked = p.first_pairs().tolist(), p.parked()
    owner = {k: fp[int(p.slots()[r])] // groups_per_block for k, r in parked.items()}
    for k in sorted(set(got) | {k for k in parked if owner[k] < programs}):
        g, w = got.get(k), (f"x row {parked[k]}" if k in parked else None)
        if g is not None and g.startswith("values that are no row"):
            return (f"ring row {k} holds values that are no row of x: what a masked load leaves on a lane whose "
                    "mask is off (j >= n_park: a request of fewer than RING rows, or none), stored at the "
                    "ring row its masked pos and req make: mask the store with j < n_park too, as the loads are")
        if g == w and owner[k] < programs:
            continue
        if g == w:
            slot = int(p.slots()[parked[k]])
            return (f"ring row {k} was written, but request slot {slot}'s first pair is pair {fp[slot]}, program "
                    f"{owner[k]}'s: each request is parked by one program only; loop over the slots [lo, hi) whose "
                    "first pair lies in your block, counted over the request_slots real lanes only")
        n = int(g.split()[-1]) if g is not None and g.startswith("x row") else None
        if w is None:
            return (f"ring row {k} should not be written (no request parks a row there) but holds {g}"
                    f"{_park_destination(p, k, n)}")
        slot = int(p.slots()[parked[k]])
        said = f"ring row {k} should hold {w}, one of the last rows of request slot {slot} ({_span(p, slot)})"
        if g is None:
            return f"{said}, but was never written (still the poison {POISON:g})"
        rows, hint = p.batch.row_ranges()[slot], _park_destination(p, k, n)
        if hint:
            return f"{said}, but holds {g}{hint}"
        if n is not None and n in rows:
            hint = f": x row {n} is not one of its last {puzzles.RING} rows; they start at start + count - min(count, RING)"
        elif "before x" in g or (n is not None and n < rows.start):
            hint = ": a request of fewer than RING rows parks only its own: n_park = min(count, RING)"
        return f"{said}, but holds {g}{hint}"
    return None


def _park_destination(p: puzzles.Puzzle, k: int, n: int | None) -> str:
    """Puzzle 4: when x row ``n``, found at ring row ``k``, is one a request parks, that its ring row
    is what is wrong; else ``""``."""
    if n is None or n not in p.parked().values():
        return ""
    pos, req = int(p.batch.pos[n]), int(p.batch.req[n])
    hint = (f": x row {n} is rightly parked, but at the wrong ring row; x row {n} (pos {pos}, req {req}) "
            f"belongs at req * RING + pos % RING = {req * puzzles.RING + pos % puzzles.RING}")
    if k == req * puzzles.RING + (pos - 1) % puzzles.RING:
        hint += " ((pos - 1) % RING is where a row's partner is read from, not where the row is parked)"
    return hint


# --- puzzle 1 ---------------------------------------------------------------------------------------

ROW_SLOTS = ["offsets_ptr", "slot_ptr", "num_rows", "request_slots", "ROWS", "S_PAD"]


def check_row_slots(fn, seed: int = 0) -> CheckResult:
    """Puzzle 1: ``fn`` writes each row's request slot, read from the extend offsets (-1: padding).

    Launched as ``fn[(cdiv(num_rows, ROWS),)](offsets, slot, num_rows, request_slots, ROWS=8,
    S_PAD=8)`` on every batch of :func:`~c2graph.workshop.puzzles.puzzles`; the offsets (flat,
    ``2 * request_slots`` values) in the middle of poisoned memory, the output in a buffer with
    ``ROWS`` poisoned elements past its end. Says which row, never written or written wrong, or
    which read lay outside the offsets, and why.
    """
    def one(p) -> tuple[bool, str]:
        S, T = p.request_slots, p.num_rows
        offsets = guarded(_dev(p.offsets().flatten()), INT_POISON)
        out = _dev(torch.full((T + ROWS,), INT_POISON, dtype=torch.int32))

        def hint(name, row):
            return ("the lanes of tl.arange(0, S_PAD) from request_slots on must claim no row and load nothing: "
                    "load the offsets with mask=s < request_slots (other=0: start 0, count 0, an empty range)"
                    if name == "offsets_ptr" and row >= 2 * S else "")
        launch(fn, (triton.cdiv(T, ROWS),), offsets, out, T, S, ROWS=ROWS, S_PAD=S_PAD, outside=hint)
        got, want = out.cpu().tolist(), p.slots().tolist()
        wrong = [r for r in range(T) if got[r] != want[r]]
        past = [i for i in range(T, T + ROWS) if got[i] != INT_POISON]
        if wrong:
            r = _first_mistake(wrong, got, S)
            return (False, f"{p.what}: {len(wrong)} of {T} rows wrong; first: "
                           f"{_slot_mistake(p, r, got[r], want[r], ROWS)}")
        elif past:
            return (False, f"{p.what}: slot[{past[0]}] was written, past the last row ({T} rows): "
                           "mask the store with rows < num_rows")
        else:
            return (True, f"{p.what}: {'the one row' if T == 1 else f'all {T} rows'} right, nothing written past them")

    return check_on_puzzles("row_slots (puzzle 1)", fn, ROW_SLOTS, seed, one)


# --- puzzle 2 ---------------------------------------------------------------------------------------

PARTNERS = ["x_ptr", "ring_ptr", "pos_ptr", "req_ptr", "first_ptr", "group_ptr", "out_ptr", "num_rows", "D", "RING", "ROWS"]


def check_partners(fn, seed: int = 0) -> CheckResult:
    """Puzzle 2: ``fn`` copies each group row's partner row into ``out``, and writes no other row.

    Launched as ``fn[(cdiv(num_rows, ROWS),)](x, ring, pos, req, first, group, out, num_rows,
    D=16, RING=2, ROWS=8)``. Every row of ``x`` and of the ring holds values that say which row
    it is, so a wrong row is named: which one was copied, and which was expected. Every input lies
    in the middle of poisoned memory, and a read outside it is named; ``out`` is poisoned.
    """
    def one(p) -> tuple[bool, str]:
        T, x, ring = p.num_rows, puzzles.named_x(p.num_rows), puzzles.named_ring()
        meta = [guarded(_dev(t), 0 if t.dtype == torch.bool else INT_POISON)
                for t in (p.batch.pos, p.batch.req, p.first(), p.group())]  # first and group: bool
        out = _dev(torch.full((T + ROWS, puzzles.D), POISON))

        def hint(name, row):
            r = row + 1  # the group row whose previous row this is
            if name == "x_ptr" and 0 <= r < T and bool(p.first()[r]) and bool(p.group()[r]):
                pos, req = int(p.batch.pos[r]), int(p.batch.req[r])
                return (f"row {r} is the first row of its request, so its partner (pos {pos - 1}) is in the ring, "
                        f"at req * RING + (pos - 1) % RING = {req * puzzles.RING + (pos - 1) % puzzles.RING}, not "
                        f"row {row} of x")
            return (f"row {row} is past the last row ({T} rows): mask the loads and the store with rows < num_rows"
                    if row >= T else "the partner of a row that completes no group is never read: mask with group")
        launch(fn, (triton.cdiv(T, ROWS),), guarded(_dev(x[1:T + 1]), POISON), guarded(_dev(ring[:-1]), POISON),
               *meta, out, T, D=puzzles.D, RING=puzzles.RING, ROWS=ROWS, outside=hint)
        got, want = out.cpu(), p.partner_source()
        expect = [None if w is None else x[w[1] + 1] if w[0] == "row" else ring[w[1]] for w in want]
        wrong = [r for r in range(T) if (expect[r] is None and not bool((got[r] == POISON).all()))
                 or (expect[r] is not None and not torch.equal(got[r], expect[r]))]
        past = [i for i in range(T, T + ROWS) if not bool((got[i] == POISON).all())]
        if wrong:
            return (False, f"{p.what}: {len(wrong)} of {T} rows wrong; first: "
                           f"{_partner_mistake(p, wrong[0], got[wrong[0]])}")
        elif past:
            return (False, f"{p.what}: out[{past[0]}] was written, past the last row ({T} rows): "
                           "mask the loads and the store with rows < num_rows")
        else:
            n = sum(w is not None for w in want)
            return (True, f"{p.what}: the partners of {plural(n, 'group row')} right, the other "
                          f"{plural(T - n, 'row')} untouched")

    return check_on_puzzles("gather_partners (puzzle 2)", fn, PARTNERS, seed, one)


# --- puzzle 3 ---------------------------------------------------------------------------------------


@triton.jit
def _row_sum_harness(x_ptr, out_ptr, ROWS: tl.constexpr, LOG2_N: tl.constexpr, ROW_SUM: tl.constexpr):
    # One program: load a [ROWS, 2**LOG2_N] fp32 tile, call the reader's row_sum, store its [ROWS] tile.
    rows = tl.arange(0, ROWS)
    s = ROW_SUM(tl.load(x_ptr + rows[:, None] * (1 << LOG2_N) + tl.arange(0, 1 << LOG2_N)[None, :]), LOG2_N)
    tl.static_assert(len(s.shape) == 1, "row_sum must return one value a row, a [rows] tile: tl.reshape the last one")
    tl.static_assert(s.dtype == tl.float32, "row_sum must return fp32, as its tile is")
    tl.store(out_ptr + rows, s)


def _runtime_loop(fn) -> str | None:
    """Puzzle 3: a ``for`` over ``range`` or ``tl.range`` in ``fn``, said as compiled Triton says it.

    The interpreter runs such a loop as a Python loop, so a tile that halves every round passes
    there; compiled Triton makes it one loop on the GPU (``scf.for``), whose variables must keep
    their type and shape, and refuses the function ("Loop-carried variable x has initial type
    ... but is re-assigned to ... in loop!"). Only ``tl.static_range`` is unrolled.
    """
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn.fn)))
    except (OSError, TypeError, SyntaxError):
        return None
    for node in ast.walk(tree):
        if isinstance(node, ast.For) and isinstance(node.iter, ast.Call):
            f = node.iter.func
            called = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
            if called == "range":
                return (f"{name_of(fn)} loops with {ast.unparse(node.iter)}: the interpreter runs it as a Python "
                        "loop, but compiled on a GPU, range (like tl.range) is one loop on the GPU whose "
                        "variables must keep their shape, and x halves every round: Triton refuses it "
                        "(\"Loop-carried variable x ... re-assigned\"). Loop with tl.static_range, which the "
                        "compiler unrolls")
    return None


def check_row_sum(fn, seed: int = 0) -> CheckResult:
    """Puzzle 3: ``fn(x, LOG2_N)`` sums each row of ``x`` (``[16, 32]`` fp32) neighbours first, to the bit.

    Compares with the same order in torch; a sum in another order is named when it is one of
    the usual ones (column after column; column ``c`` plus ``c + N/2``), or told to be
    ``tl.sum``'s kind. Compiled on a GPU, also runs it with 1, 4 and 8 warps.
    """
    def cases():
        if not isinstance(fn, triton.runtime.jit.KernelInterface):
            return [(False, f"{getattr(fn, '__name__', fn)!s} is not a Triton function: decorate it with @triton.jit")]
        kernel_problem(fn, list(inspect.signature(fn.fn).parameters))  # a stub raises NotImplementedError
        loop = _runtime_loop(fn)
        if loop:
            return [(False, loop)]
        x = puzzles.sum_rows(seed, SUM_ROWS, 1 << LOG2_N)
        want = puzzles.halving_sum(x)
        outs = {}
        for warps in ((None,) if INTERPRET else (1, 4, 8)):
            out = _dev(torch.full((SUM_ROWS,), POISON))
            options = {} if warps is None else {"num_warps": warps}
            launch(_row_sum_harness, (1,), _dev(x), out, ROWS=SUM_ROWS, LOG2_N=LOG2_N, ROW_SUM=fn, reader=fn,
                   said="row_sum must", **options)
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
                why = ("you added the columns one after another, ((x0 + x1) + x2) + ...: add neighbours in pairs, "
                       "then pairs of pairs")
            elif torch.equal(got, puzzles.halves_sum(x)):
                why = "you added column c to column c + N/2 (the two halves): split neighbours (2c, 2c + 1) instead"
            elif abs(float(got[r]) - exact) > 1e-3 * float(x[r].abs().sum()):
                why = f"that is not the row's sum at all (about {exact:.6g}): sum over axis 1, every column once"
            else:
                why = ("the right sum in another order of adds (tl.sum adds in the order its threads hold the values, "
                       "which changes with num_warps): reshape to [rows, N/2, 2], tl.split, add, LOG2_N times")
            results.append((False, f"{int((got != want).sum())} of {SUM_ROWS} rows differ from the fixed order's sum; "
                                   f"first: {line}: {why}"))
        for warps, out in outs.items():
            if not torch.equal(out, got):
                results.append((False, f"with num_warps={warps} the sums differ from num_warps=1: the order is not fixed"))
        return results

    return run_check("row_sum (puzzle 3)", reported(cases))


# --- puzzle 4 ---------------------------------------------------------------------------------------

def _park_launch(fn, p: puzzles.Puzzle, programs: int) -> dict[int, str]:
    """Launch ``programs`` programs of ``fn`` on a fresh poisoned ring; ``{ring row: what it holds}``
    for every ring row written. Every input lies in the middle of poisoned memory; a read outside
    it is named."""
    S = p.request_slots
    ring = _dev(torch.full((puzzles.POOL_REQUESTS * puzzles.RING + 1, puzzles.D), POISON))
    x = puzzles.named_x(p.num_rows, after=False)[1:]
    args = [guarded(_dev(t), POISON if t.is_floating_point() else INT_POISON)
            for t in (x, p.batch.pos, p.batch.req, p.offsets().flatten(), p.first_pairs())]

    def hint(name, row):
        if name == "first_pair_ptr":
            return ("the lanes from request_slots on must load nothing: mask=s < request_slots with a large "
                    "other, so they count in neither bound (unmasked, a request may be parked by two programs "
                    "or none; each request is parked by one program only)")
        if name not in ("x_ptr", "pos_ptr", "req_ptr"):
            return ""
        return ("a request of fewer than RING rows parks only its own: n_park = min(count, RING), and the "
                "lanes j >= n_park load nothing (mask=j < n_park)" if row < 0 else
                "the lanes j >= n_park must load nothing: mask their loads with j < n_park")
    launch(fn, (programs,), args[0], ring, args[1], args[2], args[3], args[4], S,
           D=puzzles.D, RING=puzzles.RING, GROUPS_PER_BLOCK=GROUPS_PER_BLOCK, S_PAD=S_PAD, outside=hint)
    ring = ring.cpu()
    return {k: puzzles.source_of(ring[k]) for k in range(ring.shape[0]) if not bool((ring[k] == POISON).all())}


PARK = ["x_ptr", "ring_ptr", "pos_ptr", "req_ptr", "offsets_ptr", "first_pair_ptr", "request_slots", "D", "RING",
        "GROUPS_PER_BLOCK", "S_PAD"]
GROUPS_PER_BLOCK = 4
"""Pairs of rows a program in puzzle 4 (the kernel's is 8 or 16)."""


def check_park(fn, seed: int = 0) -> CheckResult:
    """Puzzle 4: program ``b`` parks the requests whose first pair is one of its ``GROUPS_PER_BLOCK`` groups.

    Launched as ``fn[(programs,)](x, ring, pos, req, offsets, first_pair, request_slots, D=16,
    RING=2, GROUPS_PER_BLOCK=4, S_PAD=8)``, first with only program 0, then programs 0 and 1, and so on, each
    on a fresh poisoned ring: so a program that parks another program's request is caught, even
    when the whole grid's ring would look right. Says which ring row, never written or written
    wrong, and which row it holds.
    """
    def one(p) -> tuple[bool, str]:
        programs = triton.cdiv((p.num_rows + p.request_slots) // 2 + 1, GROUPS_PER_BLOCK)  # enough for any batch's pairs
        for b in range(programs):
            why = _park_mistake(p, _park_launch(fn, p, b + 1), b + 1, GROUPS_PER_BLOCK)
            if why:
                launched = "only program 0" if b == 0 else f"programs 0 to {b}"
                return (False, f"{p.what}: with {launched} of {programs} launched, {why}")
        return (True, f"{p.what}: {plural(len(p.parked()), 'parked ring row')} right, each written by "
                      "its request's program alone, no other ring row")

    return check_on_puzzles("park (puzzle 4)", fn, PARK, seed, one)
