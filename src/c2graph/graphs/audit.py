"""The capture audit: what did a graph freeze from the batch it was captured with?

Every silent graph bug of the prefill story is a value frozen at capture that should have been
read at replay: a per-request Python int in a kernel's arguments, a grid sized from the live
rows, a fresh tensor per batch read at its old address, one launch per request. :func:`audit`
captures a step once per batch loaded and compares the captures' records (:mod:`c2graph.graphs.
op_record`, the records the CPU emulation replays): a scalar argument, a grid, a tensor's address
or shape, or the number and order of launches that differ came from the batch. Each :class:`Flag`
names the line that issued it. A value equal in every capture may still come from a batch:
batches that differ wherever the work could look (starts, counts, live rows) make that unlikely.
:func:`c2graph.prefill.runner_audit.audit_runner` audits a prefill graph runner's bucket.
"""

from __future__ import annotations

import html
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from difflib import SequenceMatcher

import torch

from .graph import Graph, warmup
from .op_record import LAUNCH, CaptureRecord, OpRecord, check_labels, record_lines


@dataclass(frozen=True)
class Flag:
    """Something frozen that differs between the captures: it came from the batch. ``what``:
    ``"value"``, ``"grid"``, ``"view"``, ``"address"``, ``"launches"`` (their number or order) or
    ``"refused"``; ``values``: one per capture; ``where``/``code``: the line that issued it;
    ``index``: its record in capture 1."""

    where: str
    op: str
    arg: str
    what: str
    values: tuple
    code: str = ""
    index: int = -1

    def difference(self) -> str:
        """How the captures differ, in words."""
        if self.what == "address" and len(set(self.values)) == 1:
            return "read at a different address at each capture"
        return ", ".join(f"{v} at capture {i + 1}" for i, v in enumerate(self.values))

    def words(self) -> str:
        """What differs, and what to do about it, in words."""
        if self.what == "refused":
            return f"the capture was refused: {self.values[0]}"
        subject = {"launches": "launched", "grid": "grid =", "view": f"`{self.arg}` is",
                   "address": f"`{self.arg}` is", "value": f"`{self.arg}` ="}[self.what]
        return f"{subject} {self.difference()}: {self.advice()}"

    def advice(self) -> str:
        """What to do about it (a refused capture: its error)."""
        return self.values[0] if self.what == "refused" else _ADVICE[self.what]

    def __str__(self) -> str:
        return f"{self.where}: {self.op}: {self.words()}"


_ADVICE = {
    "value": ("a value from the batch, frozen into the graph; read it from a tensor refreshed (copy_) before each "
              "replay"),
    "grid": ("a grid sized from the batch; size it from static sizes (the bucket, the request slots) and let the "
             "kernel skip what is not live"),
    "view": ("a view of the same tensor, sized or placed by the batch; use static sizes (the bucket) and let the "
             "work skip what is not live"),
    "address": ("a new tensor per batch, while the graph keeps the one it was captured with; copy_ each batch into "
                "one static tensor"),
    "launches": ("the number or order of launches came from the batch (a loop over its requests?); launch once, "
                 "over static sizes, and let the kernel skip empty request slots"),
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
        """The first refused capture's error, or ``None``."""
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
            return (f"NOT OK: a capture was refused at {self.flags[0].where}" if self.refused else
                    f"NOT OK: {len(self.flags)} thing(s) frozen at capture came from the batch")
        records = self.captures[0].flat()
        launches = sum(r.kind == LAUNCH for r in records)
        return (f"clean: nothing frozen came from the batch ({len(self.captures)} captures, each of {len(records)} "
                f"record(s), {launches} Triton launch(es), compared value by value, grid by grid, tensor by tensor)")

    def table(self, *, limit: int | None = 12) -> str:
        """The audit in words: the records of capture 1 that are work (``limit`` of them; ``None``:
        all) or flagged, marked ``<-- FROM THE BATCH``, then the verdict and each flag with its line."""
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
        for (where, code), flags in itertools.groupby(self.flags, key=lambda f: (f.where, f.code)):
            lines += [f"  {where}: {code}"] + [f"      {labels.get(f.index, '')}{f.op}: {f.words()}" for f in flags]
        return "\n".join(lines)

    __str__ = __repr__ = table

    def _repr_html_(self) -> str:
        n = max(len(self.captures), max((len(f.values) for f in self.flags), default=0))
        columns = ["where", "line", "op", "argument", *(f"capture {i + 1}" for i in range(n)), "what it means"]
        head = "".join(f"<th>{h}</th>" for h in columns)
        rows = "".join(  # a line's code is shown once, on its first row
            "<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in (
                f.where, f.code if i == 0 or f.where != self.flags[i - 1].where else "", f.op, f.arg, *f.values,
                *[""] * (n - len(f.values)), f.advice())) + "</tr>" for i, f in enumerate(self.flags))
        loads = "; ".join(f"capture {i + 1}: {load}" for i, load in enumerate(self.loads))
        table = f"<table><tr>{head}</tr>{rows}</table>" if rows else ""
        return (f"<p><b>{html.escape(self.title)}</b><br>{html.escape(loads)}<br>"
                f"<b>{html.escape(self.verdict())}</b></p>{table}")


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
    if not callable(step):
        raise TypeError(f"step is a {type(step).__name__}; expected a callable with no arguments")
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
    return GraphAudit(f"audit of {_name(step, 'the step')}", after, captures, compare(captures))


def audit_capture(fn: Callable[[], object], labels: dict[str, torch.Tensor] | None = None, *,
                  backend: str | None = None) -> CaptureRecord:
    """Capture ``fn()`` once in a new :class:`Graph` (``backend`` as there) and return its record
    (:meth:`Graph.audit`). A refused capture is reported in the record, never raised."""
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


def compare(captures: list[CaptureRecord]) -> list[Flag]:
    """Every frozen thing that differs between the captures (the first refusal, where one was refused)."""
    refused = next((c for c in captures if c.refused), None)
    if refused is not None:
        return [Flag(refused.refused_where, "capture", "", "refused", (refused.refused,), refused.refused_code)]
    first = captures[0].flat()
    matched = {r.index: [r] for r in first}  # each record of capture 1, and its match in every capture
    extra: dict[str, OpRecord] = {}  # ops or kernels that some capture launches more or less often
    for other in (c.flat() for c in captures[1:]):
        pairs = {}
        blocks = SequenceMatcher(None, [r.op for r in first], [r.op for r in other], autojunk=False)
        for tag, i1, i2, j1, j2 in blocks.get_opcodes():
            if tag == "equal":
                pairs.update((a.index, b) for a, b in zip(first[i1:i2], other[j1:j2]))
                continue
            for r in (*first[i1:i2], *other[j1:j2]):
                if r.launches:
                    extra.setdefault(r.op, r)
        for a in first:
            matched[a.index].append(pairs.get(a.index))
    flags = [f for records in matched.values() if None not in records for f in _differences(records)]
    for op, r in extra.items():
        counts = tuple(sum(x.op == op for x in c.flat()) for c in captures)
        flags.append(Flag(r.where, op, "launches", "launches", tuple(f"{n} time(s)" for n in counts), r.code))
    return flags


def _differences(records: list[OpRecord]) -> list[Flag]:
    """The arguments of one record that differ between the captures (``records``: one per capture)."""
    a, flags = records[0], []
    for name, value in a.scalars:
        values = tuple(dict(r.scalars).get(name) for r in records)
        if any(v != value for v in values):
            what = "grid" if name == "grid" and a.kind == LAUNCH else "value"
            flags.append(Flag(a.where, a.op, name, what, values, a.code, a.index))
    for t in a.tensors:
        same = [next((u for u in r.tensors if u.name == t.name), t) for r in records]
        if all(u.key == t.key for u in same):
            continue
        if all(u.key[0] == "number" for u in same):
            what, values = "value", tuple(u.key[1] for u in same)
        elif all(u.key[:2] == t.key[:2] for u in same):  # the same tensor: another part of it, or another shape
            what, values = "view", tuple(u.label for u in same)
        else:
            what, values = "address", tuple(u.label for u in same)
        flags.append(Flag(a.where, a.op, t.name, what, values, a.code, a.index))
    return flags
