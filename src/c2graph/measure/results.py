"""Stored benchmark results: the file's schema, its check, and the readings every user shares.

``python -m c2graph bench`` writes one JSON file per run, ``benchmarks/results/<date>-<device>.json``:

- ``schema`` (``"c2graph-bench/2"``), ``device``, ``torch``, ``triton``, ``date`` (ISO), ``config``
  (the layer preset), ``smoke`` (true for a CPU smoke run, which measures nothing about a GPU),
  ``timer`` (``"CUDA events"`` or ``"wall clock"``), ``reps`` (timed calls per median);
- ``copy_GBps``: the device-to-device copy bandwidth of the same run (bytes read plus written);
- ``launch_us``: ``{"eager": one small eager launch, "graph": one replay of a one-node graph}``, µs;
- ``complete``: false while the run is still writing (a run stopped early keeps what it measured);
- ``cases``: one per row count: ``rows``, ``live_rows``, ``requests``, ``odd_prefixes``,
  ``programs`` (blocks of the fused kernel that hold a group, each reading the weights),
  ``floor_bytes`` (the step's bytes, weights read once: what any implementation must move),
  ``bytes_weights_per_program`` (the same with the weights read once per program, as the fused
  kernel's programs read them, mostly from the L2) and ``copies`` (input sets rotated so that no
  input stays in the L2 cache);
- ``records``: one per measurement: ``rows``, ``path`` (``torch``, ``compiled``, ``fused``, or
  ``model`` for a many-layer model), ``mode`` (``eager`` or ``graph``), ``variant`` (which one of a
  path), ``median_us``, ``nodes`` (graph nodes; ``null`` in eager mode), ``launches`` (kernels one
  eager call launches; ``null`` in graph mode), ``bw_fraction`` (the fused path only: ``floor_bytes``
  over the time, as a fraction of ``copy_GBps``; the same number as the floor ratio, the memory
  floor's time over the measured one) and ``bw_fraction_weights_per_program`` (the fused path
  only: ``bytes_weights_per_program`` over the time, of ``copy_GBps``: it counts the weights'
  re-reads from the L2 as memory traffic, so it flatters, and can pass 1); ``null`` on other
  paths; optional ``compile_s``, ``layers``, ``fused_layers``;
- ``skipped``: what was not measured and why (``rows``, ``path``, ``mode``, ``variant``, ``reason``).

:func:`check_results` is the one check of that schema: the benchmark runs it before writing, the
notebooks and the figures after reading.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

SCHEMA = "c2graph-bench/2"
PATHS = ("torch", "compiled", "fused", "model")
MODES = ("eager", "graph")
RESULTS_FOLDER = Path(__file__).resolve().parents[3] / "benchmarks" / "results"
"""Where stored results live: ``benchmarks/results/`` of the repository this package is in (found
from the package's own files, so a notebook finds it from any working directory)."""

_TOP = {
    "schema": str, "device": str, "torch": str, "triton": str, "date": str, "config": str,
    "smoke": bool, "timer": str, "reps": int, "copy_GBps": float, "launch_us": dict, "complete": bool,
    "cases": list, "records": list, "skipped": list,
}
_CASE = {"rows": int, "live_rows": int, "requests": int, "odd_prefixes": int, "programs": int,
         "floor_bytes": int, "bytes_weights_per_program": int, "copies": int}
_RECORD = {"rows": int, "path": str, "mode": str, "variant": str, "median_us": float}
FRACTIONS = ("bw_fraction", "bw_fraction_weights_per_program")
"""The fused path's bytes over its time, of the copy bandwidth: the headline (weights once), then
the count with the weights once per program."""
_OPTIONAL = {"compile_s": float, "layers": int, "fused_layers": int}
_SKIPPED = {"rows": int, "path": str, "mode": str, "variant": str, "reason": str}


def _is(value, kind) -> bool:
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, kind)


def _require(obj: dict, fields: dict, where: str) -> None:
    if not isinstance(obj, dict):
        raise ValueError(f"{where} is a {type(obj).__name__}; expected an object")
    for name, kind in fields.items():
        if name not in obj:
            raise ValueError(f"{where}.{name} is missing; expected a {kind.__name__}")
        if not _is(obj[name], kind):
            raise ValueError(f"{where}.{name} = {obj[name]!r}; expected a {kind.__name__}")


def _check_record(r: dict, where: str, rows: set[int]) -> None:
    _require(r, _RECORD, where)
    if r["rows"] not in rows:
        raise ValueError(f"{where}.rows = {r['rows']}; expected one of the cases' rows {sorted(rows)}")
    if r["path"] not in PATHS:
        raise ValueError(f"{where}.path = {r['path']!r}; expected one of {PATHS}")
    if r["mode"] not in MODES:
        raise ValueError(f"{where}.mode = {r['mode']!r}; expected one of {MODES}")
    if r["median_us"] <= 0:
        raise ValueError(f"{where}.median_us = {r['median_us']}; expected a time > 0")
    graph = r["mode"] == "graph"
    for name, wanted in (("nodes", graph), ("launches", not graph)):
        value = r.get(name, "missing")
        if wanted and not (_is(value, int) and value > 0):
            raise ValueError(f"{where}.{name} = {value!r}; expected an int > 0 in {r['mode']} mode")
        if not wanted and value is not None:
            raise ValueError(f"{where}.{name} = {value!r}; expected null in {r['mode']} mode")
    for name in FRACTIONS:
        fraction = r.get(name, "missing")
        if r["path"] == "fused" and not (_is(fraction, float) and fraction > 0):
            raise ValueError(f"{where}.{name} = {fraction!r}; expected a number > 0 for the fused path")
        if r["path"] != "fused" and fraction is not None:
            raise ValueError(f"{where}.{name} = {fraction!r}; expected null outside the fused path")
    for name, kind in _OPTIONAL.items():
        if name in r and not _is(r[name], kind):
            raise ValueError(f"{where}.{name} = {r[name]!r}; expected a {kind.__name__}")


def check_results(data: dict) -> dict:
    """Raise ``ValueError`` naming the first field that breaks the schema; return ``data``."""
    _require(data, _TOP, "results")
    if data["schema"] != SCHEMA:
        raise ValueError(f"results.schema = {data['schema']!r}; expected {SCHEMA!r}")
    if data["copy_GBps"] <= 0:
        raise ValueError(f"results.copy_GBps = {data['copy_GBps']}; expected a bandwidth > 0")
    _require(data["launch_us"], {"eager": float, "graph": float}, "results.launch_us")
    for i, case in enumerate(data["cases"]):
        _require(case, _CASE, f"results.cases[{i}]")
    rows = {case["rows"] for case in data["cases"]}
    if len(rows) != len(data["cases"]):
        raise ValueError("results.cases name a row count twice; expected one case per row count")
    for i, record in enumerate(data["records"]):
        _check_record(record, f"results.records[{i}]", rows)
    for i, skipped in enumerate(data["skipped"]):
        _require(skipped, _SKIPPED, f"results.skipped[{i}]")
    return data


def load_results(path: str | os.PathLike) -> dict:
    """Read one results file and check it (:func:`check_results`)."""
    with open(path) as f:
        data = json.load(f)
    return check_results(data)


def newest_results(folder: str | os.PathLike = RESULTS_FOLDER) -> Path | None:
    """The newest stored GPU results in ``folder`` (by date, then name); ``None`` when there are none.

    Smoke runs are never stored results: a file with ``"smoke": true`` is passed over.
    """
    found = []
    for path in Path(folder).glob("*.json"):
        data = load_results(path)
        if not data["smoke"]:
            found.append((data["date"], path.name, path))
    return max(found)[2] if found else None


def records(data: dict, path: str, mode: str, variant: str | None = None) -> dict[int, dict]:
    """``{rows: record}`` of one path and mode (and variant, where given), in row order."""
    found = [r for r in data["records"]
             if r["path"] == path and r["mode"] == mode and (variant is None or r["variant"] == variant)]
    return {r["rows"]: r for r in sorted(found, key=lambda r: r["rows"])}


def fastest_compiled(data: dict) -> dict[int, dict]:
    """``{rows: record}``: at each row count, the faster of the compiled variants (its ``variant`` says which)."""
    best: dict[int, dict] = {}
    for r in data["records"]:
        if r["path"] == "compiled" and r["mode"] == "graph":
            if r["rows"] not in best or r["median_us"] < best[r["rows"]]["median_us"]:
                best[r["rows"]] = r
    return dict(sorted(best.items()))


def computed_floor_us(data: dict) -> dict[int, float]:
    """``{rows: µs}``: each case's ``floor_bytes`` over the measured copy bandwidth (computed, not
    measured): no implementation of the step that moves those bytes can take less time."""
    return {c["rows"]: c["floor_bytes"] / (data["copy_GBps"] * 1e3) for c in sorted(data["cases"], key=lambda c: c["rows"])}


def describe(data: dict) -> str:
    """One line: device, versions, date; and, for a smoke run, that it measures nothing about a GPU."""
    line = f"{data['device']} · torch {data['torch']} · triton {data['triton']} · {data['date']}"
    if data["smoke"]:
        line += " · CPU smoke run: not a GPU measurement"
    return line


def results_table(data: dict) -> str:
    """The run as a text table: one line per row count, times in µs, the memory floor, the fused
    replay's share of the copy bandwidth (weights once: the floor ratio, floor / fused) and the
    ratios that matter."""
    cols = [("torch eager", records(data, "torch", "eager")), ("torch graph", records(data, "torch", "graph")),
            ("compiled graph", fastest_compiled(data)), ("fused eager", records(data, "fused", "eager")),
            ("fused graph", records(data, "fused", "graph")), ("model graph", records(data, "model", "graph"))]
    cols = [(name, recs) for name, recs in cols if recs]
    head = ["rows"] + [name for name, _ in cols] + ["memory floor", "floor/fused", "torch/fused", "compiled/fused"]
    lines = [" | ".join(f"{h:>14}" for h in head)]
    fused, floors = records(data, "fused", "graph"), computed_floor_us(data)
    for case in sorted(data["cases"], key=lambda c: c["rows"]):
        n = case["rows"]
        cells = [str(n)] + [f"{recs[n]['median_us']:.1f}" if n in recs else "-" for _, recs in cols]
        f = fused.get(n)
        ratio = {name: recs[n]["median_us"] / f["median_us"] if f and n in recs else None for name, recs in cols}
        cells += [f"{floors[n]:.2f}", f"{f['bw_fraction']:.0%}" if f else "-"]
        for name in ("torch graph", "compiled graph"):
            cells.append(f"{ratio[name]:.1f}x" if ratio.get(name) else "-")
        lines.append(" | ".join(f"{c:>14}" for c in cells))
    notes = [f"{describe(data)}; times in µs ({data['timer']}, median of {data['reps']}); "
             f"copy bandwidth {data['copy_GBps']:.0f} GB/s; memory floor: the step's bytes (weights once) "
             "over it; floor/fused: the fused replay's share of the copy bandwidth"]
    for n, r in fastest_compiled(data).items():
        notes.append(f"compiled graph at {n} rows: the faster variant is {r['variant']}")
    notes += [f"skipped: {s['path']} {s['mode']} ({s['variant']}) at {s['rows']} rows: {s['reason']}"
              for s in data["skipped"]]
    return "\n".join(lines + notes)
