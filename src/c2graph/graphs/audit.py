"""The capture audit: does a graph captured on one batch do, on another, what the step does?

Every silent graph bug of the prefill story is a value frozen at capture that should have been
read at replay: a per-request Python int in a kernel's arguments, a grid sized from the live
rows, a fresh tensor per batch read at its old address, one launch per request, work a capture
leaves out. :func:`audit` judges a step by what it does (:mod:`c2graph.graphs.audit_replay`): per
load after the first, the graph captured on the load before is replayed and every tensor the step
writes is compared with an eager call of the step after the same load, from the same state. A
replay that writes otherwise is a bug, named by the tensor and its rows, whatever the record shows.

The record explains where (:mod:`c2graph.graphs.op_record`, the records the CPU emulation
replays): a scalar argument (a number, a string, a dtype, a device, a generator), a grid, a
Triton kernel's code, a tensor's address or shape, or the number and order of launches that
differ between the captures came from the batch; one that differs between the capture and the
eager call (work the capture left out, a value that changes from call to call) says why the replay
differs. Values are compared as values (NaN equals NaN); a temporary (a tensor made inside the
step) by the place, in each capture, of the op that made it. Each :class:`Flag` names the lines
that issued it, from the launch outward. Loads that hold the same values wherever the step reads
prove nothing, and the verdict says so.
:func:`c2graph.prefill.runner_audit.audit_runner` audits a prefill graph runner's bucket.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch.utils._pytree import tree_leaves

from .audit_compare import Flag, compare_captures, explain
from .audit_replay import Replayed, judge
from .audit_report import audit_html, replay_lines
from .graph import Graph, check_step
from .op_record import LAUNCH, CaptureRecord, OpRecord, check_labels, check_limit, record_lines

__all__ = ["Flag", "GraphAudit", "audit", "audit_capture"]


@dataclass
class GraphAudit:
    """Captures of one step, each after another batch was loaded, what differs between them
    (``flags``, a refused capture among them), and per load after the first, a replay of the
    graph of the load before compared with an eager call (``replays``). ``eager``: the record of
    the first eager call after each load. Prints as text; renders as a table in Jupyter."""

    title: str
    loads: tuple[str, ...]
    captures: list[CaptureRecord]
    flags: list[Flag]
    replays: list[Replayed] = ()
    eager: list[CaptureRecord] = ()
    unordered: str = ""
    """The rows not compared, in words (``audit``'s ``unordered``), or ``""``."""

    @property
    def ok(self) -> bool:
        """No flag: the replays matched eager and nothing frozen differs (the verdict may still
        say that nothing could be compared)."""
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
            if first.what == "refused":
                return f"NOT OK: a capture was refused at {first.where}"
            if first.what == "replay":
                return f"NOT OK: {self.replay_words()}; at {first.where}: {first.note}"
            return f"NOT OK: {len(self.flags)} thing(s) frozen at capture came from the batch; {self.replay_words()}"
        records = self.captures[0].flat()
        launches = sum(r.kind == LAUNCH for r in records)
        frozen = (f"nothing frozen came from the batch ({len(self.captures)} captures, each of {len(records)} "
                  f"record(s), {launches} Triton launch(es), compared value by value, grid by grid, tensor by tensor)")
        differed = [r for r in self.replays if r.differed_in]
        if not differed:
            return (f"inconclusive: the loads did not differ in anything the step reads, so neither the replay nor "
                    f"the {len(self.captures)} captures (alike, each of {len(records)} record(s), {launches} Triton "
                    "launch(es)) can show what would come from a batch; load batches that differ (values, counts, "
                    "live rows)")
        if not any(r.compared for r in differed) and any(r.random for r in differed):
            return f"could not compare: {self.replay_words()}; {frozen}"
        return f"clean: {self.replay_words()}; {frozen}"

    def replay_words(self) -> str:
        """What the replays were compared with, and what they found, in words."""
        if not self.replays:
            return "no replay was compared (the step's capture failed)"
        bad = [r for r in self.replays if r.mismatches]
        if bad:
            r, m = bad[0], bad[0].mismatches[0]
            return (f"the graph captured {self.loads[r.replayed]}, replayed {self.loads[r.load]}, wrote `{m.tensor}` "
                    f"otherwise than an eager call did, in {m.rows} (eager {m.eager}, replay {m.replay})")
        differed = [r for r in self.replays if r.differed_in]
        what = sorted({name for r in differed for name in r.differed_in})
        compared = sorted({name for r in differed for name in r.compared})
        words = (f"replay matched eager on {len(differed)} load(s) that differed in {', '.join(what)} "
                 f"({', '.join(compared) or 'no tensor'} compared, bit for bit)" if differed else
                 "replay matched eager, but on loads that did not differ in what the step reads")
        if self.unordered:
            words += f"; not compared: {self.unordered}"
        random = sorted({name for r in self.replays for name in r.random})
        if random:
            words += (f"; could not compare {', '.join(random)}: random by design (two eager calls from the same "
                      "state, "
                      "freezing the same values, wrote it differently)")
        return words

    def table(self, *, limit: int | None = 12) -> str:
        """The audit in words: the records of capture 1 that are work (``limit`` of them; ``None``:
        all) or flagged, marked ``<-- FROM THE BATCH``, then the verdict and each flag with its
        line, then each replay against eager."""
        check_limit(limit)
        lines = [self.title] + [f"  capture {i + 1}: {load}" for i, load in enumerate(self.loads)]
        marks: dict[int, dict[str, str]] = {}
        for f in self.flags:
            if f.what != "replay":
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
            lines += [f"      {labels.get(f.index, '') if f.what != 'replay' else ''}{f.op}: {f.words()}"
                      for f in flags]
        return "\n".join(lines + replay_lines(self))

    __str__ = __repr__ = table

    def _repr_html_(self, *, limit: int | None = 12) -> str:
        """The audit as a table, a row per flagged argument, in capture order: the record (``launch 3``,
        ``op 5``) and the lines that issued it, the argument, its value at each capture, what it
        means; and per record, a row of the values it froze that are the same in every capture.
        Records of work that froze values and have no flag are shown too, ``limit`` of them.
        Beside it, the replays against eager: per load, what was compared and what differed."""
        return audit_html(self, limit)


# ---------------------------------------------------------------------------------------------
# Capturing and comparing


def audit(step: Callable[[], object], loads: Sequence[Callable[[], object]], *,
          labels: dict[str, torch.Tensor] | None = None, backend: str | None = None,
          unordered: tuple[dict[str, Sequence[int]], str] | None = None) -> GraphAudit:
    """Capture ``step()`` once per batch and flag what the captures froze from the batch.

    ``step``: the work to capture, a callable with no arguments, reading static inputs (tensors
    that keep their address). ``loads``: two or more callables, each loading one batch into those
    inputs (as before a replay: by ``copy_``, or however the code under audit does it). Per load:
    ``load()``, an eager call of ``step`` (so lazy set-up, such as Triton's compiling, stays out
    of the capture; its record is kept, to explain), then one capture in a new :class:`Graph`
    (``backend`` as there); and for each load after the first, a second eager call (a tensor two
    eager calls write differently, freezing the same values, is random by design: not compared),
    and a replay of the graph of the load before, compared with the first eager call
    (:mod:`c2graph.graphs.audit_replay`). Every tensor the step writes is given back, after each
    run, the bytes the load left it: the caller finds the state the last load made.
    ``torch.compile``'d functions run their Python eagerly during the audit (the record sees
    inside them; nothing is compiled). ``labels`` names tensors (``{"starts": starts}``) so that
    a flag can say which one an argument lies in; labelled tensors are compared too. A refused
    capture is a finding (a flag with its line), never an exception; an exception of ``load`` or
    of the eager call goes on. ``unordered``: ``({label: rows}, why)``, rows of labelled tensors
    that hold no defined value, which the step may write in any order (several stores to one row
    in one launch, whose order CUDA does not fix): not compared, and the verdict says so, and why.
    """
    check_step(step, "step")
    if not isinstance(loads, (list, tuple)) or len(loads) < 2 or not all(callable(load) for load in loads):
        raise ValueError(f"loads = {loads!r}; expected a list of two or more callables, each loading one batch")
    labels = check_labels(labels)
    Graph(backend)  # a bad backend is refused before any batch is loaded

    def capture():
        graph, returned = Graph(backend), None
        try:
            with graph.capture(labels):
                returned = step()
        except Exception:  # a refused capture: its record says why, and where
            pass
        return graph, graph.audit(), [t for t in tree_leaves(returned) if isinstance(t, torch.Tensor)]

    skipped, why = unordered or ({}, "")
    unknown = [name for name in skipped if name not in labels]
    if unknown:
        raise ValueError(f"unordered names {unknown}; expected labels of the audit (labels=)")
    rows = {labels[name].untyped_storage().data_ptr(): set(r) for name, r in skipped.items()}
    captures, eager, replays = judge(step, loads, labels, capture, rows)
    flags = compare_captures(captures)
    if not flags:
        named = {}  # one flag per tensor, at the first load where it differs
        for r in replays:
            for m in r.mismatches:
                named.setdefault(m.tensor, explain(m, r, captures[r.replayed]))
        flags = list(named.values())
    after = tuple(f"after {_name(load, f'loads[{i}]')}" for i, load in enumerate(loads))
    words = f"{_rows_words(skipped)} ({why})" if skipped else ""
    return GraphAudit(f"audit of {_name(step, 'the step')}", after, captures, flags, replays, eager, words)


def _rows_words(skipped: dict[str, Sequence[int]]) -> str:
    """``"row 0 of kv_cache[layer 1], index_k[layer 1]"``: the rows not compared, grouped by rows."""
    by_rows: dict[tuple, list[str]] = {}
    for name, rows in skipped.items():
        by_rows.setdefault(tuple(sorted(rows)), []).append(name)
    return "; ".join(f"row{'s' if len(rows) > 1 else ''} {', '.join(map(str, rows))} of {', '.join(names)}"
                     for rows, names in by_rows.items())


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
