"""The capture audit in words and in HTML: the records, what differs, and the replays against eager.

:class:`~c2graph.graphs.audit.GraphAudit` prints with :func:`replay_lines` after its table and
renders in Jupyter with :func:`audit_html`: the record's table (a row per flagged argument, the
values each record froze), and beside it the replays against eager, a row per load compared.
"""

from __future__ import annotations

import html

from .op_record import OpRecord, check_limit


def replay_lines(found) -> list[str]:
    """Each replay against eager, in words: what was compared, what differed, what was not compared."""
    lines = []
    for r in found.replays:
        lines.append(f"replay of capture {r.replayed + 1} after load {r.load + 1}, against an eager call after "
                     f"load {r.load + 1}:")
        lines.append("    loads differed in: " + (", ".join(r.differed_in) or "nothing the step reads"))
        lines.append("    compared: " + (", ".join(r.compared) or "nothing"))
        lines += [f"    DIFFERS: `{m.tensor}` in {m.rows} (eager {m.eager}, replay {m.replay})" for m in r.mismatches]
        if r.random:
            lines.append("    not compared (random by design): " + ", ".join(r.random))
        if r.elsewhere:
            lines.append("    written by another thread during the eager call: " + ", ".join(r.elsewhere))
    return lines


def audit_html(found, limit: int | None) -> str:
    """The audit as HTML: the verdict, the record's table, and the replays against eager beside it."""
    check_limit(limit)
    n = max(len(found.captures), max((len(f.values) for f in found.flags if f.what != "replay"), default=0))
    captures = [f"capture {i + 1}" for i in range(n)]
    columns = ["record", "where", "line", "op", "argument", *captures, "what it means"]
    by_record: dict[int, list] = {}
    for f in found.flags:
        if f.what != "replay":
            by_record.setdefault(f.index, []).append(f)
    rows, shown, hidden = [], 0, 0
    for r in found.captures[0].flat() if not found.refused else []:
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
    loads = "; ".join(f"capture {i + 1}: {load}" for i, load in enumerate(found.loads))
    head = "".join(f"<th>{h}</th>" for h in columns)
    table = f"<table><tr>{head}</tr>{''.join(rows)}</table>" if rows else ""
    return (f"<p><b>{html.escape(found.title)}</b><br>{html.escape(loads)}<br>"
            f"<b>{html.escape(found.verdict())}</b></p>"
            f'<div style="display:flex;gap:2em;align-items:flex-start"><div>{table}</div>{_replays_html(found)}</div>')


def _replays_html(found) -> str:
    """The replays against eager: per load, what differed between the loads, what was compared, and
    each tensor the replay wrote otherwise (its rows, the first values), with the line the record names."""
    if not found.replays:
        return ""
    where = {f.arg: f for f in found.flags if f.what == "replay"}
    items = []
    for r in found.replays:
        parts = [f"<b>replay of capture {r.replayed + 1} after load {r.load + 1} vs. an eager call</b>",
                 "loads differed in: " + html.escape(", ".join(r.differed_in) or "nothing the step reads"),
                 "compared, bit for bit: " + html.escape(", ".join(r.compared) or "nothing")]
        for m in r.mismatches:
            text = f"DIFFERS: {m.tensor} in {m.rows} (eager {m.eager}, replay {m.replay})"
            f = where.get(m.tensor)
            parts.append(html.escape(text) + (f"<br>&nbsp;&nbsp;at {html.escape(f.where)}: {html.escape(f.note)}"
                                              if f is not None and f.where else ""))
        if r.random:
            parts.append("not compared, random by design: " + html.escape(", ".join(r.random)))
        if r.elsewhere:
            parts.append("written by another thread during the eager call: " + html.escape(", ".join(r.elsewhere)))
        items.append("<p>" + "<br>".join(parts) + "</p>")
    return "<div>" + "".join(items) + "</div>"


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
