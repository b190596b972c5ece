"""The assembly's check, stage by stage: which step of the reader's ``my_compressor`` is wrong.

The reader's kernel runs on a batch of :func:`c2graph.workshop.puzzles.puzzles` with a real
``tiny`` layer (:class:`Run`), every input in the middle of poisoned memory and every read checked
(:mod:`c2graph.workshop.launch`). When its latents or its ring differ from the torch path's, the
stages are judged in the kernel's order, each against the torch path, so that a mistake is blamed
on the step that made it:

1. the rows it loads (:func:`load_mistake`): the kernel runs again with ``gate_rms_norm`` replaced
   by a probe that returns one of its four arguments (``kv0, s0, kv1, s1``), so the latent stored
   is the tile the kernel loaded; each is found in memory (which row of ``projected`` or of the
   ring, which columns) and named;
2. the gate and RMSNorm: the rows loaded are right, the latent is not;
3. the park (:func:`park_mistake`): the ring after the whole grid, and after programs ``0 .. b``
   alone, so a program that parks another program's request is named;
4. the store: rows that complete no group untouched, nothing written past the last row.
"""

from __future__ import annotations

import ast
import inspect
import linecache
import textwrap
import types

import torch
import triton
import triton.language as tl

from .._runtime import DEFAULT_DEVICE
from ..compressor.batch import ExtendBatch
from ..compressor.config import Config
from ..compressor.pools import POISON, Pools
from ..compressor.req_to_token import ReqToTokenPool
from ..compressor.source_layer import SourceLayer, project_fused, split_projected
from ..compressor.torch_path import compress_torch
from . import puzzles
from .launch import MARGIN, guarded, launch, name_of

ROWS, S_PAD = 8, 8
"""Rows a program, and lanes of request slots (``request_slots`` rounded up to a power of two)."""
INT_POISON = puzzles.INT_POISON


class Run:
    """One batch of :func:`~c2graph.workshop.puzzles.puzzles` with a real ``tiny`` layer: the ring
    after a previous chunk, the projected ``| kv | score |`` rows, and the torch path's answer.
    The padding rows' ``pos`` and ``req`` hold values a request's rows could hold (odd positions,
    a real pool request): only the extend offsets say which rows are live."""

    def __init__(self, p: puzzles.Puzzle, seed: int):
        self.p, cfg = p, Config.tiny()
        self.cfg = cfg
        self.layer = SourceLayer(cfg, seed=seed, device="cpu")
        alloc = ReqToTokenPool(cfg, pool_requests=puzzles.POOL_REQUESTS, max_seq_len=96, seed=seed)
        self.pools = Pools(cfg, puzzles.POOL_REQUESTS, alloc.kv_slots, device="cpu")
        requests = [(r.pool_index, r.prefix_len, r.extend_len) for r in p.batch.requests]
        before = [(pool, 0, prefix) for pool, prefix, _ in requests if prefix > 0]
        if before:  # a previous chunk fills the ring rows this batch reads
            previous = ExtendBatch.build(before, alloc, request_slots=len(before), device="cpu")
            x = project_fused(self.layer, self.layer.random_hidden(previous.num_rows, seed=seed + 1))
            compress_torch(self.layer, *split_projected(x), previous, self.pools)
        self.batch = ExtendBatch.build(requests, alloc, request_slots=p.request_slots, pad_to=p.num_rows, device="cpu")
        self.projected = project_fused(self.layer, self.layer.random_hidden(self.batch.num_rows, seed=seed + 2))
        self.want_pools = self.pools.clone()
        self.want = compress_torch(self.layer, *split_projected(self.projected), self.batch, self.want_pools)
        self.plan = self.batch.plan(cfg.ring_size)
        live = torch.tensor([r.request_slot is not None for r in self.plan.rows])
        rows = torch.arange(self.batch.num_rows)
        self.pos = torch.where(live, self.batch.pos, 2 * rows + 1)  # padding: odd, as a group row's
        self.req = torch.where(live, self.batch.req, self.batch.requests[0].pool_index if self.batch.requests else 0)

    @property
    def programs(self) -> int:
        return triton.cdiv(self.batch.num_rows, ROWS)

    def launch(self, fn, programs: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Run ``fn`` (its first ``programs`` programs; all by default) on a copy of the ring and a
        poisoned latent buffer with ``ROWS`` rows past its end: ``(latent [T + ROWS, D], ring)``."""
        cfg, T, b = self.cfg, self.batch.num_rows, self.batch
        dev = DEFAULT_DEVICE
        ring = guarded(self.pools.ring.to(dev), POISON)
        latent = torch.full((T + ROWS, cfg.D), POISON, dtype=torch.bfloat16, device=dev)
        ints = [guarded(t.to(dev), INT_POISON) for t in (self.pos, self.req, b.extend_offsets.flatten())]
        launch(fn, (self.programs if programs is None else programs,), guarded(self.projected.to(dev), POISON), ring,
               *ints, guarded(self.layer.norm_w.to(dev), POISON), latent, T, b.request_slots, cfg.eps,
               D=cfg.D, LOG2_D=cfg.D.bit_length() - 1, RING=cfg.ring_size, ROWS=ROWS, S_PAD=S_PAD,
               outside=self.read_hint)
        return latent.cpu(), ring.cpu()

    def read_hint(self, name: str, row: int) -> str:
        """What to change when the kernel read ``row`` of ``name`` outside it."""
        T, S = self.batch.num_rows, self.batch.request_slots
        ends = {r.stop: s for s, r in enumerate(self.batch.row_ranges())}
        if name in ("pos_ptr", "req_ptr") and row in ends:
            return (f"row {row} is request slot {ends[row]}'s start + count, one past its last row: a row lies in "
                    f"slot s when start <= row < start + count (<, not <=)")
        if name in ("pos_ptr", "req_ptr"):
            return f"row {row} is past the last row ({T} rows): load pos and req of the live rows only (mask=live)"
        if name == "offsets_ptr" and row >= 2 * S:
            return "the lanes of tl.arange(0, S_PAD) from request_slots on load nothing: mask=s < request_slots"
        ring_row = self.plan.rows[0].partner_ring_row if T else None
        if name == "projected_ptr" and row < 0 and ring_row is not None:
            return (f"row -1 is what row 0's partner would be as the previous row, but row 0 is the first row of its "
                    f"request, so its partner (pos {int(self.batch.pos[0]) - 1}) is ring row "
                    f"req * RING + (pos - 1) % RING = {ring_row}")
        if name == "projected_ptr" and row < 0:
            return ("the partner of row 0 would be row -1: read partners only for group rows (mask=group), and a "
                    "request's first row takes its partner from the ring")
        if name in ("projected_ptr", "ring_ptr"):
            return ("a row's kv and score, and its partner's, are read for the group rows only: mask those loads "
                    "with group[:, None]; a ring row is req * RING + (pos - 1) % RING, 2 * D values wide")
        return ""

    def park_in(self, k: int) -> int | None:
        """The batch row the torch path parks in ring row ``k``, or ``None``."""
        return self.plan.parked.get(k)

    def expected_load(self, arg: str, r: int) -> tuple[str, int, int]:
        """Where ``arg`` (``kv0, s0, kv1, s1``) of group row ``r`` lies: ``(buffer, row, first column)``."""
        col = self.cfg.D if arg.startswith("s") else 0
        if arg.endswith("1"):
            return "projected", r, col
        ring_row = self.plan.rows[r].partner_ring_row
        return ("ring", ring_row, col) if ring_row is not None else ("projected", r - 1, col)

    def values(self, where: tuple[str, int, int]) -> torch.Tensor:
        buffer, row, col = where
        t = self.projected if buffer == "projected" else self.pools.ring
        return t[row, col:col + self.cfg.D]

    def find(self, got: torch.Tensor) -> tuple[str, int, int] | None:
        """Where in ``projected`` or the ring before the batch (margins included) the ``D`` values
        ``got`` (bf16, as stored) lie: ``(buffer, row, first column)``, or ``None``."""
        D, width = self.cfg.D, 2 * self.cfg.D
        for name, t in (("projected", self.projected), ("ring", self.pools.ring)):
            flat = guarded(t, POISON)._base.flatten()
            hits = _same(got[None, :], flat.unfold(0, D, 1)).nonzero()
            if len(hits):
                at = int(hits[0]) - MARGIN * width
                return name, at // width, at % width
        return None


def _same(stored: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """Whether bf16 ``stored`` is fp32 ``values`` rounded to bf16, either way (the interpreter's cast
    and the GPU's may round differently): all along the last dim."""
    return torch.isclose(stored.float(), values.float(), rtol=2**-7, atol=0).all(dim=-1)


def _say(where: tuple[str, int, int] | None, D: int, rows: int) -> str:
    if where is None:
        return "values that are in no row of projected or of the ring (no copy of a row)"
    buffer, row, col = where
    what = {0: "its kv", D: "its score"}.get(col, "no whole half of it")
    outside = " (the poison outside the buffer)" if row < 0 or row >= rows else ""
    return f"{buffer} row {row}, columns {col} to {col + D - 1} ({what}){outside}"


ARGS = {"kv0": "the partner's kv", "s0": "the partner's score", "kv1": "the row's own kv", "s1": "the row's own score"}


def _probe(arg: str):
    """A ``gate_rms_norm`` that returns its argument ``arg``: the latent stored is that tile."""
    source = (f"def probe_{arg}(kv0, s0, kv1, s1, norm_w_ptr, eps, D: tl.constexpr, LOG2_D: tl.constexpr):\n"
              f"    return {arg}\n")
    namespace = {"tl": tl}
    filename = f"<the check's probe of {arg}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
    exec(compile(source, filename, "exec"), namespace)
    return triton.jit(namespace[f"probe_{arg}"])


PROBES = {arg: _probe(arg) for arg in ARGS}


def with_gate(fn, gate):
    """``fn`` compiled with ``gate`` in place of the ``gate_rms_norm`` it calls."""
    f = fn.fn
    new = types.FunctionType(f.__code__, {**f.__globals__, "gate_rms_norm": gate}, f.__name__, f.__defaults__,
                             f.__closure__)
    new.__qualname__, new.__doc__ = f.__qualname__, f.__doc__
    return triton.jit(new)


def load_mistake(run: Run, fn, rows: list[int]) -> str | None:
    """Stage 1: the first of ``rows`` (group rows) whose ``kv0, s0, kv1`` or ``s1`` the kernel loaded
    wrong, with where it loaded it from and why that is wrong; ``None`` when every one is right."""
    D, T = run.cfg.D, run.batch.num_rows
    for arg, meaning in ARGS.items():
        latent, _ = run.launch(with_gate(fn, PROBES[arg]))
        for r in rows:
            want = run.expected_load(arg, r)
            if _same(latent[r], run.values(want)):
                continue
            found = run.find(latent[r])
            said = (f"row {r} (pos {int(run.batch.pos[r])}): gate_rms_norm's {arg} ({meaning}) was "
                    f"{_say(found, D, T)}; expected {_say(want, D, T)}")
            hint = _load_hint(run, arg, r, want, found)
            if hint == PARKED_FIRST:
                q = found[1]
                said += (f": batch row {q} is what the park puts in ring row {want[1]}, so the park wrote it there "
                         f"before row {r}'s partner was read")
                owner = ownership_mistake(run, fn)
                return said + (f"; {owner}" if owner else ": park in the same program after every load, behind "
                               "tl.debug_barrier()")
            return said + hint
    return None


def _load_hint(run: Run, arg: str, r: int, want, found) -> str:
    D, RING = run.cfg.D, run.cfg.ring_size
    pos, req = int(run.batch.pos[r]), int(run.batch.req[r])
    if found is None:
        return ""
    if found[0] == want[0] and found[1] == want[1]:
        return (": the score is columns D to 2 * D of a | kv | score | row: add D to the columns" if want[2] == D
                else ": the kv is columns 0 to D - 1 of a | kv | score | row")
    others = [a for a in ARGS if a != arg and run.expected_load(a, r) == found]
    if others:
        return (f": that is {others[0]}, {ARGS[others[0]]}: call gate_rms_norm(kv0, s0, kv1, s1, ...) with the "
                "partner's kv and score first, then the row's own")
    if found[0] == want[0] and found[1] * 2 * D + found[2] == want[1] * D + want[2]:
        return f": a row of {want[0]} is 2 * D values wide (| kv | score |): row k starts at k * 2 * D, not k * D"
    if want[0] == "ring" and found[0] == "projected":
        q = found[1]
        if run.park_in(want[1]) == q:
            return PARKED_FIRST
        return (f": row {r} is the first row of its request, so its partner (pos {pos - 1}) is ring row "
                f"req * RING + (pos - 1) % RING = {want[1]}")
    if want[0] == "ring" and found[0] == "ring":
        own = " (req * RING + pos % RING: where this row itself is parked)" if found[1] == req * RING + pos % RING else ""
        return f": the partner of pos {pos} is at req * RING + (pos - 1) % RING = {want[1]}{own}"
    if want[0] == "projected" and found[0] == "ring":
        return f": but row {r} is not the first row of its request: its partner is the previous row of the batch"
    return ""


PARKED_FIRST = "parked before it was read"


def park_mistake(run: Run, fn, ring: torch.Tensor) -> str | None:
    """Stage 3: what is wrong with the ring after the whole grid, or after programs ``0 .. b`` alone
    (each request parked by the program that holds its first row); ``None`` when nothing is."""
    return _ring_mistake(run, ring) or ownership_mistake(run, fn)


def ownership_mistake(run: Run, fn) -> str | None:
    """A request parked by a program other than the one that holds its first row, or ``None``: the
    kernel launched with programs ``0 .. b`` alone, for each ``b`` that owns a request and the one
    before it (a request parked early shows at ``b = owner - 1``, one parked late at ``owner``)."""
    before, ranges = run.pools.ring, run.batch.row_ranges()
    owner = {k: run.plan.rows[r].request_slot for k, r in run.plan.parked.items()}
    owners = {ranges[slot].start // ROWS for slot in owner.values()}
    for b in sorted(owners | {o - 1 for o in owners if o > 0}):  # each owner, and the programs before it
        _, partial = run.launch(fn, programs=b + 1)
        written = {k for k in range(partial.shape[0]) if not torch.equal(partial[k], before[k])}
        for k in sorted(set(owner) | written):
            slot = owner.get(k)
            first = ranges[slot].start if slot is not None else None
            mine = first is not None and first < (b + 1) * ROWS
            if (k in written) != mine and slot is not None:
                said = (f"request slot {slot}'s first row is row {first}, one of program {first // ROWS}'s rows, but "
                        f"with only programs 0 to {b} launched, its ring row {k} was "
                        f"{'written' if k in written else 'not written'}")
                return (said + ": each request is parked by the program that holds its first row: park(..., "
                        "first_pair_ptr=the offsets' first row (the starts), ..., GROUPS_PER_BLOCK=ROWS, ...)")
    return None


def _ring_mistake(run: Run, got: torch.Tensor) -> str | None:
    """What is wrong with the ring ``got`` after the whole grid, or ``None``."""
    want, parked, ring = run.want_pools.ring, run.plan.parked, run.cfg.ring_size
    for k in range(want.shape[0]):
        if torch.equal(got[k], want[k]):
            continue
        holds = _ring_row_holds(run, got[k], k)
        if k == want.shape[0] - 1:
            return f"the ring's last row (the sentinel) was written: it holds {holds}"
        if k not in parked:
            return f"ring row {k} should not be written (no request parks a row there) but holds {holds}"
        r = parked[k]
        slot = run.plan.rows[r].request_slot
        rows = run.batch.row_ranges()[slot]
        said = (f"ring row {k} should hold batch row {r} (pos {int(run.batch.pos[r])}), one of the last "
                f"{ring} rows of request slot {slot} (rows {rows.start} to {rows.stop - 1})")
        if holds.startswith("values that are no row"):
            holds += (": the park copies whole | kv | score | rows, 2 * D values each (pass 2 * D as park's D), "
                      "and masks its store with j < n_park")
        return f"{said}, but holds {holds}"
    return None


def _ring_row_holds(run: Run, row: torch.Tensor, k: int) -> str:
    for r in range(run.batch.num_rows):
        if torch.equal(row, run.projected[r]):
            return f"batch row {r} (pos {int(run.batch.pos[r])})"
    if torch.equal(row, run.pools.ring[k]):
        return "what it held before the batch (never written)"
    return "values that are no row of the batch"


def static_mistake(fn) -> str | None:
    """What the source of ``my_compressor`` lacks that the notebook requires: a call of the reader's
    ``gate_rms_norm`` and ``park``, and ``tl.debug_barrier()`` before the park; ``None`` if nothing."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn.fn)))
    except (OSError, TypeError, SyntaxError):
        return None
    calls: dict[str, int] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            called = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
            calls.setdefault(called, node.lineno)
            calls[called] = min(calls[called], node.lineno)
    name = name_of(fn)
    for piece, step in (("gate_rms_norm", "step 3"), ("park", "step 4")):
        if piece not in calls:
            return (f"{name} does not call {piece}: {step} calls your {piece} (the check follows your kernel "
                    "through it, stage by stage)")
    barrier = calls.get("debug_barrier")
    if barrier is None or barrier > calls["park"]:
        return (f"{name} parks without tl.debug_barrier() before park(...): on a GPU the threads of a program do "
                "not run in step, so without the barrier one thread can park a row in the ring before another "
                "has read its partner there (a race Triton's interpreter, which runs a program's lanes together, "
                "never shows): put tl.debug_barrier() after the loads, before the park")
    return None
