"""notebooks/INSTRUCTOR.md's three-hour plan against the notebooks and the guide itself, read at
test time: the room's minutes add up to 180 and each block to the guide's minutes it cites; every
section it names by number (§N) or by title, and every exercise and puzzle it names, exists in that
notebook under that number; the
guide's per-notebook minutes are those of each notebook's own "Minutes"; every notebook's
recorded cells run within the bound the plan states."""

import re
from datetime import datetime
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
GUIDE = (ROOT / "notebooks" / "INSTRUCTOR.md").read_text()
PLAN = GUIDE.split("## The workshop in three hours")[1].split("\n## ")[0]
NOTEBOOKS = {p.name[:2]: p for p in sorted((ROOT / "notebooks").glob("0*.ipynb"))}


def _table(heading: str) -> list[list[str]]:
    block = PLAN.split(heading)[1].split("\n\n")[1]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in block.splitlines() if line.startswith("|")]
    return rows[2:]


def _headings(number: str, level: str = "## ") -> list[str]:
    nb = nbformat.read(NOTEBOOKS[number], as_version=4)
    return [line[len(level):].strip() for cell in nb.cells if cell.cell_type == "markdown"
            for line in cell.source.splitlines() if line.startswith(level)]


def _numbered(number: str) -> dict[int, str]:
    found = (re.match(r"(\d+)\. (.*)", h) for h in _headings(number))
    return {int(m.group(1)): m.group(2) for m in found if m}


def _notebook_of(line: str) -> str | None:
    m = re.search(r"`(0\d)_\w+`", line) or re.search(r"\b(0\d)'s\b", line)
    return m.group(1) if m else None


def _clock(text: str) -> int:
    hours, minutes = text.split(":")
    return int(hours) * 60 + int(minutes)


def test_the_room_adds_to_180_minutes_and_each_block_to_the_guides_minutes_it_cites():
    rows = _table("**In the room**")
    *blocks, total = rows
    minutes = [int(r[3]) for r in blocks]
    assert sum(minutes) == int(total[3].strip("*")) == 180
    for row, before in zip(blocks, [0, *[sum(minutes[:k]) for k in range(1, len(minutes))]]):
        assert _clock(row[0]) == before, row  # each block starts when the one before ends
        cited = [int(n) for part in re.findall(r"\(([\d + ]+)\)", row[2]) for n in part.split("+")]
        if cited:
            assert sum(cited) == int(row[3]), row
        else:
            assert row[1].startswith(("break", "slack", "close")), row


def test_every_section_the_plan_names_is_in_that_notebook_under_that_number():
    named = 0
    for line in PLAN.splitlines():
        notebook = _notebook_of(line)
        for number, title in re.findall(r"§(\d+) \(([^)]+)\)", line):
            assert notebook, f"a section named without its notebook: {line}"
            sections = _numbered(notebook)
            assert sections.get(int(number), "").startswith(title), (
                f"{notebook}'s §{number} is {sections.get(int(number))!r}, the plan says {title!r}; "
                f"{notebook}'s sections now: {sections}")
            named += 1
        for kind, number, title in re.findall(r"\b(exercise|puzzle) (\d) \*([^*]+)\*", line):
            assert notebook, f"an exercise named without its notebook: {line}"
            headings = [h for h in _headings(notebook, level="### ")]
            assert any(h.startswith(f"{kind.capitalize()} {number}: {title}") for h in headings), (
                f"{notebook} has no '### {kind.capitalize()} {number}: {title}': {headings}")
            named += 1
        for title in re.findall(r'"([^"]+)"', line) if notebook else []:
            headings = [re.sub(r"^\d+\. ", "", h) for h in _headings(notebook)]
            assert any(h.startswith(title) for h in headings), f"{notebook} has no section {title!r}: {headings}"
            named += 1
    assert named >= 25


def test_the_guides_minutes_per_notebook_are_each_notebooks_own():
    summary = re.search(r"is about (.*?): five to\s+six hours", PLAN, re.S).group(1)
    pairs = re.findall(r"(\d+(?: to \d+)?)(?:\s+minutes)?\s+for (0\d)", summary)
    assert [n for _, n in pairs] == sorted(NOTEBOOKS)
    for minutes, notebook in pairs:
        block = GUIDE.split(f"<!-- BEGIN NOTEBOOK {notebook} -->")[1].split(f"<!-- END NOTEBOOK {notebook} -->")[0]
        assert re.search(rf"\b{minutes}\s+minutes", block, re.I), (notebook, minutes)
    low = {n: int(m.split(" to ")[0]) for m, n in pairs}
    high = {n: int(m.split(" to ")[-1]) for m, n in pairs}
    core = re.search(r"Notebooks 00 to 04 alone are (\d+) to (\d+) minutes", PLAN).groups()
    assert core == (str(sum(low[n] for n in "00 01 02 03 04".split())), str(sum(high[n] for n in "00 01 02 03 04".split())))


def _recorded_seconds(path: Path) -> float:
    total = 0.0
    for cell in nbformat.read(path, as_version=4).cells:
        times = cell.get("metadata", {}).get("execution", {})
        if "iopub.execute_input" in times and "shell.execute_reply" in times:
            start, end = (datetime.fromisoformat(times[k].replace("Z", "+00:00"))
                          for k in ("iopub.execute_input", "shell.execute_reply"))
            total += (end - start).total_seconds()
    return total


@pytest.mark.parametrize("notebook", sorted(NOTEBOOKS))
def test_every_notebooks_recorded_cells_run_within_the_plans_bound(notebook):
    bound = int(re.search(r"cells run in under (\d+) s on a 2-core CPU", PLAN).group(1))
    seconds = _recorded_seconds(NOTEBOOKS[notebook])
    assert 0 < seconds < bound, f"{notebook}'s cells recorded {seconds:.1f} s; the plan says under {bound} s"
