"""The README's table of students sharing one card is the stored `make gpu-room` run, row for row."""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STORED = sorted((ROOT / "benchmarks" / "results" / "gpu-room").glob("*.json"))


def _span(numbers: dict) -> str:
    low, high = numbers["min"], numbers["max"]
    return f"{low} s" if low == high else f"{low} to {high} s"


def test_the_readme_quotes_the_stored_gpu_room_run():
    assert STORED, "no stored gpu-room run"
    data = json.loads(STORED[-1].read_text())
    readme = (ROOT / "README.md").read_text()
    table = readme.split("**Students' kernels sharing one card.**")[1].split("\n\n", 2)[1]
    rows = [line for line in table.splitlines() if re.match(r"\| \d+ \|", line)]
    assert len(rows) == len(data["rooms"])
    for line, room in zip(rows, data["rooms"]):
        cells = [c.strip() for c in line.strip("|").split("|")]
        nb03, nb04 = (room["per_notebook_s"][name] for name in data["notebooks"])
        assert cells == [str(room["students"]), f"{room['wall_s']} s", _span(nb03), _span(nb04),
                         f"{room['card']['memory_used_mib_max']:.0f} MiB",
                         f"{room['card']['utilization_pct_mean']}%"], line
        assert room["errors"] == []
    assert f"one {data['device'].removeprefix('NVIDIA ')}" in readme
