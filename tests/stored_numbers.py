"""What a text states from a GPU run, and what the stored results say: the machinery behind
``test_notebook_facts.py``'s checks of notebook outputs, notebook prose and the README.

A *statement* is a number with a unit of a GPU measurement (µs, us, ms, GB/s, TB/s) anywhere, and,
on a line that holds one (or in the output of a cell that reads stored results), every ratio
(``4.4x``), percentage, compile time (``11.3 s``), byte count (MB, MiB) and count of launches or
nodes; and, wherever it stands, a ratio in words (``2.2 to 4.1 times faster``). A list shares its
unit: ``405 and 1564 µs``, ``18.2 / 19.4 µs``. Each statement is matched
against every quantity a results file holds or directly implies (:func:`quantities`: its times, the
floors, every ratio of two times at one bucket, each time over its own at the smallest bucket, the
many-layer graph's gap to the sum of its layers in percent) at the printed precision; in an
output line, at the row count the line names before the number.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from pathlib import Path

from c2graph.measure import results

NUM = r"\d+(?:\.\d+)?"
_LIST = rf"(?<![\w.*/-])(?P<nums>{NUM}(?:\s*(?:/|,|and|or|to)\s*{NUM})*)"
TIMES = re.compile(_LIST + r"\s?(?P<unit>µs|us|ms|GB/s|TB/s)(?![\w/])")
OTHERS = re.compile(_LIST + r"(?:(?P<tight>%|x\b)|\s(?P<unit>s|MB|MiB|launches|nodes|kernels)\b)")
FASTER = re.compile(_LIST + r"\s(?P<unit>times)\s(?:faster|slower)\b")
"""``2.2 to 4.1 times faster``: a ratio of two measured times in words, checked wherever it stands."""
ROW_ANCHORS = re.compile(r"(?<![\w.])(\d+)(?: rows\b|:)|^\s*\|?\s*(\d+)\b")
FILE_NAME = re.compile(r"\d{4}-\d{2}-\d{2}-[a-z0-9-]+\.json")
ABOUT = re.compile(r"(?:about|some|nearly|almost|~)\s*$")


@dataclass
class Statement:
    """One number a text states: where (``doc``, ``cell``, ``kind``), the line, the number as
    written, its unit, the row count it is about (``None``: not said), and whether it is hedged."""

    doc: str
    cell: int | str
    kind: str
    line: str
    text: str
    unit: str
    rows: int | None
    about: bool

    def said(self, number: str | None = None) -> str:
        """``number`` (default: the stated one) written with the unit, as the text writes it."""
        return f"{number or self.text}{'' if self.unit in ('%', 'x') else ' '}{self.unit}"

    def where(self) -> str:
        where = f"cell {self.cell} (counted from 0)" if isinstance(self.cell, int) else self.cell
        return f"{self.doc}, {where}, {self.kind}"


def statements(doc: str, cell, kind: str, text: str, row_counts: set[int], every_ratio: bool) -> list[Statement]:
    """The statements of ``text``: its lines (markdown prose: its sentences) one at a time."""
    if kind == "markdown":
        pieces = [p for block in re.split(r"\n\s*\n", text) for p in
                  (block.splitlines() if block.lstrip().startswith("|") else re.split(r"(?<=[.;])\s+", " ".join(block.split())))]
    else:
        pieces = text.splitlines()
    found = []
    for line in pieces:
        times = list(TIMES.finditer(line))
        matches = times + (list(OTHERS.finditer(line)) if times or every_ratio else []) + list(FASTER.finditer(line))
        anchors = [(m.start(), int(m.group(1) or m.group(2))) for m in ROW_ANCHORS.finditer(line)
                   if int(m.group(1) or m.group(2)) in row_counts]
        for m in matches:
            unit = m.group("unit") or m.group("tight")
            if unit in ("launches", "nodes", "kernels", "s", "MB", "MiB") and not times:
                continue
            before = [n for at, n in anchors if at < m.start()]
            rows = before[-1] if before and kind != "markdown" or (before and line.lstrip().startswith("|")) else None
            about = bool(ABOUT.search(line[: m.start()]))
            for num in re.findall(NUM, m.group("nums")):
                found.append(Statement(doc, cell, kind, line.strip(), num, unit, rows, about))
    return found


def quantities(data: dict, rows: int | None, torch_bytes_2048: int | None = None) -> dict[str, list[tuple[str, float]]]:
    """``{unit kind: [(name, value)]}``: everything the results ``data`` hold or imply at ``rows``
    (every row count when ``None``), in the units statements use."""
    cases = {c["rows"]: c for c in data["cases"] if rows in (None, c["rows"])}
    copy = data["copy_GBps"] * 1e3  # bytes a µs
    time, ratio, percent, seconds, count, nbytes = [], [], [], [], [], []
    time += [(f"launch floor ({k})", v) for k, v in data["launch_us"].items()]
    for n, c in cases.items():
        recs = [r for r in data["records"] if r["rows"] == n]
        memory = c["floor_bytes"] / copy
        at = [(f"{r['path']} {r['mode']} ({r['variant']}) at {n} rows", r["median_us"]) for r in recs]
        at += [(f"memory floor at {n} rows", memory),
               (f"weights once a program / copy bw at {n} rows", c["bytes_weights_per_program"] / copy)]
        at += [(f"{r['path']} eager per launch at {n} rows", r["median_us"] / r["launches"]) for r in recs if r["launches"]]
        by = {(r["path"], r["mode"]): r["median_us"] for r in recs}
        gaps = []
        for r in recs:
            if r.get("layers") and ("fused", "graph") in by and ("torch", "graph") in by:
                parts = (r["fused_layers"] * by[("fused", "graph")]
                         + (r["layers"] - r["fused_layers"]) * by[("torch", "graph")])
                at.append((f"sum of one-layer replays at {n} rows", parts))
                gaps.append((f"one graph of every layer against the sum of one-layer replays at {n} rows",
                             abs(r["median_us"] / parts - 1) * 100))
        if n == 2048 and torch_bytes_2048 and ("torch", "graph") in by:
            own = torch_bytes_2048 / copy
            node = next(r["nodes"] for r in recs if (r["path"], r["mode"]) == ("torch", "graph"))
            at += [("torch path's own bytes / copy bw at 2048 rows", own),
                   ("torch graph's time beyond its bytes, per node, at 2048 rows", (by[("torch", "graph")] - own) / node)]
        time += at
        fastest = results.fastest_compiled(data).get(n)
        base = [(f"fused graph at {n} rows", by.get(("fused", "graph"))), (f"memory floor at {n} rows", memory),
                (f"the higher floor at {n} rows", max(memory, data["launch_us"]["graph"])),
                (f"the faster compiled graph at {n} rows", fastest["median_us"] if fastest else None)]
        ratio += [(f"{a} / {b}", v / d) for a, v in at for b, d in base if d]
        smallest = min(c["rows"] for c in data["cases"])
        first = {(r["path"], r["mode"], r["variant"]): r["median_us"] for r in data["records"] if r["rows"] == smallest}
        ratio += [(f"{r['path']} {r['mode']} ({r['variant']}) at {n} rows / at {smallest} rows",
                   r["median_us"] / first[(r["path"], r["mode"], r["variant"])])
                  for r in recs if (r["path"], r["mode"], r["variant"]) in first]
        percent += [(f"{f} of the fused {r['mode']} at {n} rows", r[f] * 100) for r in recs for f in results.FRACTIONS
                    if r.get(f)] + gaps
        seconds += [(f"compile time of {r['variant']} at {n} rows", r["compile_s"]) for r in recs if "compile_s" in r]
        count += [(f"{r['path']} {r['mode']} {k} at {n} rows", r[k]) for r in recs for k in ("nodes", "launches", "layers")
                  if r.get(k)]
        nbytes += [(f"{k} at {n} rows", c[k]) for k in ("floor_bytes", "bytes_weights_per_program")]
    return {
        "µs": time, "us": time, "ms": [(name, v / 1e3) for name, v in time], "x": ratio, "times": ratio, "%": percent,
        "s": seconds, "launches": count, "nodes": count, "kernels": count,
        "GB/s": [("copy bandwidth", data["copy_GBps"])], "TB/s": [("copy bandwidth", data["copy_GBps"] / 1e3)],
        "MB": [(name, v / 1e6) for name, v in nbytes], "MiB": [(name, v / 2**20) for name, v in nbytes],
    }


def agrees(s: Statement, value: float) -> bool:
    """The stated number is ``value`` at its printed precision (a markdown number rounded by hand
    within half its last digit; a hedged one, "about 170", within 5%)."""
    decimals = len(s.text.split(".")[1]) if "." in s.text else 0
    if s.kind != "markdown":
        return f"{value:.{decimals}f}" == s.text
    said = float(s.text)
    return abs(value - said) <= 0.5 * 10**-decimals * (1 + 1e-9) or (s.about and abs(value - said) <= 0.05 * said)


def closest(s: Statement, candidates: list[tuple[str, float]]) -> str:
    if not candidates:
        return "nothing in that unit"
    words = s.line.lower()
    named = [(n, v) for n, v in candidates if " " in n and all(w in words for w in n.split()[:2])]
    name, value = min(named or candidates, key=lambda c: abs(c[1] - float(s.text)) / max(abs(c[1]), 1e-12))
    decimals = len(s.text.split(".")[1]) if "." in s.text else 0
    return f"the closest stored value is {name} = {s.said(f'{value:.{decimals}f}')}"


@functools.lru_cache
def notes_numbers(path: Path) -> tuple[float, ...]:
    """Every number ``benchmarks/NOTES.md`` states (the record of the sweeps and other runs)."""
    return tuple(float(n) for n in re.findall(rf"(?<![\w.]){NUM}", path.read_text()))


def load(path: Path) -> dict:
    return results.check_results(json.loads(path.read_text()))
