"""The capture audit: what did a graph freeze from the batch it was captured with?

Every silent graph bug of the prefill story is a value frozen at capture that should have been
read at replay: a per-request Python int in a kernel's arguments, a grid sized from the live
rows, a fresh tensor per batch read at its old address, one launch per request. :func:`audit`
captures a step once per batch loaded and compares the captures' records (:mod:`c2graph.graphs.
op_record`, the records the CPU emulation replays): a scalar argument, a grid, a tensor's address
or shape, or the number and order of launches that differ came from the batch. Values are
compared as values (NaN equals NaN); a temporary (a tensor made inside the step) by the place, in
each capture, of the op that made it, so launches added before it do not make it differ. Each
:class:`Flag` names the lines that issued it, from the launch outward. A value equal in every
capture may still come from a batch: batches that differ wherever the work could look (starts,
counts, live rows) make that unlikely.
:func:`c2graph.prefill.runner_audit.audit_runner` audits a prefill graph runner's bucket.
"""

from __future__ import annotations

import html
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from difflib import SequenceMatcher

import torch

from .graph import Graph, check_step, warmup
from .op_record import (LAUNCH, CaptureRecord, GeneratorArg, OpRecord, TensorArg, check_labels, check_limit,
                        record_lines)


@dataclass(frozen=True)
class Flag:
    """Something frozen that differs between the captures: it came from the batch. ``what``:
    ``"value"``, ``"generator"``, ``"grid"``, ``"view"``, ``"address"``, ``"launches"`` (their
    number or order), ``"refused"`` (the capture refused the step) or ``"raised"`` (the step
    raised an error of its own); ``values``: one per capture; ``where``/``code``: the lines that
    issued it, from the launch outward, and the innermost one's source (``stack``: each line's
    ``(where, code)``); ``index``: its record in capture 1."""

    where: str
    op: str
    arg: str
    what: str
    values: tuple
    code: str = ""
    index: int = -1
    stack: tuple[tuple[str, str], ...] = ()

    def difference(self) -> str:
        """How the captures differ, in words."""
        if self.what == "address" and len(set(self.values)) == 1:
            return "read at a different address at each capture"
        return ", ".join(f"{v} at capture {i + 1}" for i, v in enumerate(self.values))

    def words(self) -> str:
        """What differs, and what to do about it, in words."""
        if self.what == "refused":
            return f"the capture was refused: {self.values[0]}"
        if self.what == "raised":
            return f"the step raised {self.values[0]} during its capture: {self.advice()}"
        subject = {"launches": "launched", "grid": "grid =", "view": f"`{self.arg}` is",
                   "address": f"`{self.arg}` is", "value": f"`{self.arg}` =",
                   "generator": f"`{self.arg}` is"}[self.what]
        return f"{subject} {self.difference()}: {self.advice()}"

    def advice(self) -> str:
        """What to do about it (a refused capture: its error)."""
        return self.values[0] if self.what == "refused" else _ADVICE[self.what]

    def __str__(self) -> str:
        return f"{self.where}: {self.op}: {self.words()}"


_ADVICE = {
    "value": ("a value from the batch, frozen into the graph; read it from a tensor refreshed (copy_) before each "
              "replay"),
    "generator": ("a random generator seeded from the batch while capturing: seeding is host work that no replay "
                  "repeats; seed one generator outside the captured step"),
    "grid": ("a grid sized from the batch; size it from static sizes (the bucket, the request slots) and let the "
             "kernel skip what is not live"),
    "view": ("a view of the same tensor, sized or placed by the batch; use static sizes (the bucket) and let the "
             "work skip what is not live"),
    "address": ("a new tensor per batch, while the graph keeps the one it was captured with; copy_ each batch into "
                "one static tensor"),
    "launches": ("the number or order of launches came from the batch (a loop over its requests?); launch once, "
                 "over static sizes, and let the kernel skip empty request slots"),
    "raised": "an error of the captured code, not a refusal of the capture; no graph was made",
}


@dataclass
class GraphAudit:
    """Captures of one step, each after another batch was loaded, and what differs between them
    (``flags``, a refused capture among them). Prints as text; renders as a table in Jupyter."""

    title: str
    loads: tuple[str, ...]
    captures: list[CaptureRecord]
    flags: list[Flag]

    @property
    def ok(self) -> bool:
        return not self.flags

    @property
    def refused(self) -> str | None:
        """Why the first failed capture failed (a refusal in CUDA's or torch's words, or the step's
        own error with its type, ``"ValueError: ..."``), or ``None``."""
        return next((c.refused for c in self.captures if c.refused), None)

    def nodes(self) -> list[OpRecord]:
        """The records of capture 1 that are work of the graph."""
        return self.captures[0].nodes()

    def flagged(self, op: str | None = None) -> set[str]:
        """The flagged arguments' names (of one op or kernel: its name, or a part of it)."""
        return {f.arg for f in self.flags if op is None or op in f.op}

    def verdict(self) -> str:
        """The audit in one line."""
        if self.flags:
            first = self.flags[0]
            if first.what == "raised":
                return f"NOT OK: the step raised {first.values[0].split(':')[0]} during a capture, at {first.where}"
            return (f"NOT OK: a capture was refused at {first.where}" if first.what == "refused" else
                    f"NOT OK: {len(self.flags)} thing(s) frozen at capture came from the batch")
        records = self.captures[0].flat()
        launches = sum(r.kind == LAUNCH for r in records)
        return (f"clean: nothing frozen came from the batch ({len(self.captures)} captures, each of {len(records)} "
                f"record(s), {launches} Triton launch(es), compared value by value, grid by grid, tensor by tensor)")

    def table(self, *, limit: int | None = 12) -> str:
        """The audit in words: the records of capture 1 that are work (``limit`` of them; ``None``:
        all) or flagged, marked ``<-- FROM THE BATCH``, then the verdict and each flag with its line."""
        check_limit(limit)
        lines = [self.title] + [f"  capture {i + 1}: {load}" for i, load in enumerate(self.loads)]
        marks: dict[int, dict[str, str]] = {}
        for f in self.flags:
            marks.setdefault(f.index, {})[f.arg] = f.difference()
        work = {r.index for r in self.captures[0].nodes()}
        shown = hidden = 0
        for r in self.captures[0].flat():
            if r.index in marks or (r.index in work and (limit is None or shown < limit)):
                shown += r.index not in marks
                lines += record_lines(r, marks.get(r.index, {}))
            elif r.index in work:
                hidden += 1
        if hidden:
            lines.append(f"... {hidden} more records of work, none flagged")
        lines.append(f"verdict: {self.verdict()}")
        labels = {r.index: f"{r.label} " for r in self.captures[0].flat()}
        for (where, code, stack), flags in itertools.groupby(self.flags, key=lambda f: (f.where, f.code, f.stack)):
            lines += [("  " if k == 0 else "    called from ") + (f"{at}: {line}" if line else at)
                      for k, (at, line) in enumerate(stack or ((where, code),))]
            lines += [f"      {labels.get(f.index, '')}{f.op}: {f.words()}" for f in flags]
        return "\n".join(lines)

    __str__ = __repr__ = table

    def _repr_html_(self, *, limit: int | None = 12) -> str:
        """The audit as a table, a row per flagged argument, in capture order: the record (``launch 3``,
        ``op 5``) and the lines that issued it, the argument, its value at each capture, what it
        means; and per record, a row of the values it froze that are the same in every capture.
        Records of work that froze values and have no flag are shown too, ``limit`` of them."""
        check_limit(limit)
        n = max(len(self.captures), max((len(f.values) for f in self.flags), default=0))
        captures = [f"capture {i + 1}" for i in range(n)]
        columns = ["record", "where", "line", "op", "argument", *captures, "what it means"]
        by_record: dict[int, list[Flag]] = {}
        for f in self.flags:
            by_record.setdefault(f.index, []).append(f)
        rows, shown, hidden = [], 0, 0
        for r in self.captures[0].flat() if not self.refused else []:
            flags = by_record.get(r.index, [])
            if not flags and not (r.launches and r.scalars):
                continue
            if not flags and limit is not None and shown >= limit:
                hidden += 1
                continue
            shown += not flags
            rows += _record_rows(r, flags, n)
        for f in by_record.get(-1, []):  # the launches' number or order, a refused capture: no one record
            rows.append(_row(["", _where_html(f.where, f.stack), f.code, f.op, f.arg, *f.values,
                              *[""] * (n - len(f.values)), f.advice()]))
        if hidden:
            rows.append(f'<tr><td colspan="{len(columns)}">... {hidden} more records of work, none flagged</td></tr>')
        loads = "; ".join(f"capture {i + 1}: {load}" for i, load in enumerate(self.loads))
        head = "".join(f"<th>{h}</th>" for h in columns)
        table = f"<table><tr>{head}</tr>{''.join(rows)}</table>" if rows else ""
        return (f"<p><b>{html.escape(self.title)}</b><br>{html.escape(loads)}<br>"
                f"<b>{html.escape(self.verdict())}</b></p>{table}")


def _row(cells: list, spans: dict[int, int] | None = None) -> str:
    """One ``<tr>``: each cell escaped, except one already made HTML (a :class:`_Html`); ``spans``: column spans."""
    spans = spans or {}
    tds = []
    for i, c in enumerate(cells):
        span = f' colspan="{spans[i]}"' if i in spans else ""
        tds.append(f"<td{span}>{c if isinstance(c, _Html) else html.escape(str(c))}</td>")
    return "<tr>" + "".join(tds) + "</tr>"


class _Html(str):
    """Text that is HTML already."""


def _where_html(where: str, stack: tuple) -> _Html:
    """The lines that issued a record, one a line in the cell: the innermost, then each caller."""
    places = [at for at, _ in stack] or [where]
    return _Html("<br>".join([html.escape(places[0]), *(f"called from {html.escape(at)}" for at in places[1:])]))


def _record_rows(r: OpRecord, flags: list[Flag], n: int) -> list[str]:
    """The rows of one record: a row per flagged argument, then one of the values it froze that no flag names."""
    lead = [r.label, _where_html(r.where, r.stack), r.code, r.op]
    rows = [_row([*(lead if k == 0 else [""] * 4), f.arg, *f.values, *[""] * (n - len(f.values)), f.advice()])
            for k, f in enumerate(flags)]
    flagged = {f.arg for f in flags}
    same = ", ".join(f"{name}={value!r}" for name, value in r.scalars if name not in flagged)
    if same:
        rows.append(_row([*(lead if not flags else [""] * 4), "frozen, not flagged", same,
                          "the same in every capture: static sizes, or values the batches happened to share"],
                         spans={5: n}))
    return rows


# ---------------------------------------------------------------------------------------------
# Capturing and comparing


def audit(step: Callable[[], object], loads: Sequence[Callable[[], object]], *,
          labels: dict[str, torch.Tensor] | None = None, backend: str | None = None) -> GraphAudit:
    """Capture ``step()`` once per batch and flag what the captures froze from the batch.

    ``step``: the work to capture, a callable with no arguments, reading static inputs (tensors
    that keep their address). ``loads``: two or more callables, each loading one batch into those
    inputs (as before a replay: by ``copy_``, or however the code under audit does it). Per load:
    ``load()``, one eager call of ``step`` (so lazy set-up, such as Triton's compiling, stays out
    of the capture), then one capture in a new :class:`Graph` (``backend`` as there). ``labels``
    names tensors (``{"starts": starts}``) so that a flag can say which one an argument lies in.
    A refused capture is a finding (a flag with its line), never an exception; an exception of
    ``load`` or of the eager call goes on.
    """
    check_step(step, "step")
    if not isinstance(loads, (list, tuple)) or len(loads) < 2 or not all(callable(load) for load in loads):
        raise ValueError(f"loads = {loads!r}; expected a list of two or more callables, each loading one batch")
    labels = check_labels(labels)
    Graph(backend)  # a bad backend is refused before any batch is loaded
    captures = []
    for load in loads:
        load()
        warmup(step, iters=1)
        captures.append(audit_capture(step, labels, backend=backend))
        if captures[-1].refused:
            break
    after = tuple(f"after {_name(load, f'loads[{i}]')}" for i, load in enumerate(loads))
    return GraphAudit(f"audit of {_name(step, 'the step')}", after, captures, compare_captures(captures))


def audit_capture(fn: Callable[[], object], labels: dict[str, torch.Tensor] | None = None, *,
                  backend: str | None = None) -> CaptureRecord:
    """Capture ``fn()`` once in a new :class:`Graph` (``backend`` as there) and return its record
    (:meth:`Graph.audit`). A refused capture is reported in the record, never raised."""
    check_step(fn, "fn")
    labels, graph = check_labels(labels), Graph(backend)
    try:
        with graph.capture(labels):
            fn()
    except Exception:  # a refused capture: its record says why, and where
        pass
    return graph.audit()


def _name(fn, otherwise: str) -> str:
    """``"batch_1()"``: how a function is called; ``otherwise`` for a lambda or a callable object."""
    name = getattr(fn, "__qualname__", "<lambda>")
    return otherwise if "<lambda>" in name else f"{name}()"


def compare_captures(captures: list[CaptureRecord]) -> list[Flag]:
    """Every frozen thing that differs between the captures (the first refusal, where one was refused)."""
    refused = next((c for c in captures if c.refused), None)
    if refused is not None:
        return [Flag(refused.refused_where, "capture", "", "raised" if refused.raised else "refused",
                     (refused.refused,), refused.refused_code, stack=refused.refused_stack)]
    first = captures[0].flat()
    pairings: list[dict[int, OpRecord]] = []  # per later capture: index of a record in capture 1 -> its match
    extra: dict[tuple, OpRecord] = {}  # ops or kernels that some capture launches more or less often, by line
    for other in (c.flat() for c in captures[1:]):
        pairs = {}
        for a, b in _aligned(first, other):
            if a is not None and b is not None:
                pairs[a.index] = b
            elif (a or b).launches:
                extra.setdefault(_issued(a or b), a or b)
        pairings.append(pairs)
    flags = []
    for a in first:
        records = [a, *(pairs.get(a.index) for pairs in pairings)]
        if None not in records:
            flags += _differences(records, [None, *pairings])
    for issued, r in extra.items():
        counts = tuple(sum(_issued(x) == issued for x in c.flat()) for c in captures)
        flags.append(Flag(r.where, r.op, "launches", "launches", tuple(f"{n} time(s)" for n in counts), r.code,
                          stack=r.stack))
    return flags


def _issued(r: OpRecord) -> tuple[str, str]:
    """What a record launches and the lines that launched it: how records of two captures are matched."""
    return r.op, r.where


def _aligned(first: list[OpRecord], other: list[OpRecord]) -> list[tuple[OpRecord | None, OpRecord | None]]:
    """The records of two captures side by side (``None`` across from a record the other capture
    lacks), matched by runs: consecutive records of one op issued by the same lines. Runs are
    matched in order; two matched runs of one length record by record, in order; runs of
    different lengths (a loop over the requests, or loops in a loop) first where the values they
    froze are the same (the same request), then in order."""
    runs_a, runs_b = _runs(first), _runs(other)
    aligned: list[tuple[OpRecord | None, OpRecord | None]] = []
    blocks = SequenceMatcher(None, [_issued(r[0]) for r in runs_a], [_issued(r[0]) for r in runs_b], autojunk=False)
    for tag, i1, i2, j1, j2 in blocks.get_opcodes():
        if tag == "equal":
            for run_a, run_b in zip(runs_a[i1:i2], runs_b[j1:j2]):
                aligned += _in_order(run_a, run_b) if len(run_a) == len(run_b) else _by_values(run_a, run_b)
        else:
            aligned += _in_order([r for run in runs_a[i1:i2] for r in run], [])
            aligned += _in_order([], [r for run in runs_b[j1:j2] for r in run])
    return aligned


def _runs(records: list[OpRecord]) -> list[list[OpRecord]]:
    """``records`` cut into runs of consecutive records of one op issued by the same lines."""
    return [list(run) for _, run in itertools.groupby(records, key=_issued)]


def _in_order(a: list[OpRecord], b: list[OpRecord]) -> list[tuple[OpRecord | None, OpRecord | None]]:
    """``a`` and ``b`` matched in order; the longer one's last records left over."""
    n = min(len(a), len(b))
    return [*zip(a[:n], b[:n]), *((r, None) for r in a[n:]), *((None, r) for r in b[n:])]


def _by_values(a: list[OpRecord], b: list[OpRecord]) -> list[tuple[OpRecord | None, OpRecord | None]]:
    """Two runs of one op and line: records that froze the same values matched first, the rest in order."""
    frozen = [[repr(r.scalars) for r in run] for run in (a, b)]
    out: list[tuple[OpRecord | None, OpRecord | None]] = []
    for _, i1, i2, j1, j2 in SequenceMatcher(None, *frozen, autojunk=False).get_opcodes():
        out += _in_order(a[i1:i2], b[j1:j2])
    return out


def _differences(records: list[OpRecord], pairings: list[dict[int, OpRecord] | None]) -> list[Flag]:
    """The arguments of one record that differ between the captures (``records``: one per capture;
    ``pairings``: per capture, its match of each record of capture 1, ``None`` for capture 1)."""
    a, flags = records[0], []
    for name, value in a.scalars:
        values = tuple(dict(r.scalars).get(name) for r in records)
        if not all(_same(v, value) for v in values):
            what = ("grid" if name == "grid" and a.kind == LAUNCH else
                    "generator" if any(isinstance(v, GeneratorArg) for v in values) else "value")
            flags.append(Flag(a.where, a.op, name, what, values, a.code, a.index, a.stack))
    for t in a.tensors:
        same = [next((u for u in r.tensors if u.name == t.name), t) for r in records]
        if all(_same_tensor(t, u, pairs) for u, pairs in zip(same, pairings)):
            continue
        if all(u.key[0] == "number" for u in same):
            what, values = "value", tuple(u.key[1] for u in same)
        elif all(_same_tensor(t, u, pairs, whole=False) for u, pairs in zip(same, pairings)):
            what, values = "view", tuple(u.label for u in same)  # the same tensor: another part of it, or shape
        else:
            what, values = "address", tuple(u.label for u in same)
        flags.append(Flag(a.where, a.op, t.name, what, values, a.code, a.index, a.stack))
    return flags


def _same_tensor(t: TensorArg, u: TensorArg, pairs: dict[int, OpRecord] | None, *, whole: bool = True) -> bool:
    """Whether ``u`` (of a later capture) is ``t`` (of capture 1): the same tensor, and with ``whole``
    the same part of it. A temporary is the same where the ops that made them match (``pairs``)."""
    n = 3 if t.key[0] == "made" else 2  # the key's part that names the tensor (a temporary's: op and output)
    if t.key[0] == "made" and u.key[0] == "made" and pairs is not None:
        maker = pairs.get(t.key[1])
        if maker is None or maker.index != u.key[1] or t.key[2] != u.key[2]:
            return False
    elif not _same(t.key[:n], u.key[:n]):
        return False
    return not whole or _same(t.key[n:], u.key[n:])


def _same(a, b) -> bool:
    """``a == b``, NaN equal to NaN, inside lists and tuples too."""
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float) and a != a and b != b:
        return True
    return a == b

