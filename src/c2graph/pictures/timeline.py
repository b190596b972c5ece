"""Where one launch of the fused kernel spends its time: each program as a bar, split into its steps.

``make bench`` measures it at 256 and 2048 rows, on the benchmark's own batches, with a stamped
copy of the kernel (``benchmarks/timeline.py --results FOLDER``), stores the stamps in
``<results folder>/timelines/<date>-<device>.json`` (:func:`timeline_file`) and draws them beside
it as a PNG. :func:`draw_timeline` reads such a file and runs nothing, so it draws the GPU's
measurement on any machine (notebook 05: ``draw_timeline(newest_timeline())``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator

from .style import CATEGORY_COLOURS, FONT, MAX_WIDTH, MUTED, TITLE_FONT

TIMELINES = "timelines"
"""The subfolder of the results folder that holds the timelines (its ``*.json`` are not results files)."""


def draw_timeline(data: dict | str | os.PathLike) -> Figure:
    """One panel per bucket: each program a horizontal bar from its start to its end, coloured by
    step (rows and flags, pass A, pass B, the index key, the park), programs sorted by start. The
    dashed line is the launch's span (first start to last end). Every program of the grid is drawn;
    the grid is sized for any batch of the bucket, so a few of its programs find no group and end after
    their first step: where ``data`` (or the results file it was measured beside) holds the blocks
    that hold a group (``programs``, as the results' cases count them), the title says how many
    programs those are. Where ``data`` holds the same
    run's graph replay of the fused path (``replay_us``) and of a one-node graph
    (``launch_us``), the title says how much of the replay lies outside the programs.
    ``data``: what ``benchmarks/timeline.py`` measures, or a file holding it."""
    if not isinstance(data, dict):
        data = _with_group_counts(json.loads(Path(data).read_text()), results_file_of(data))
    panels = sorted(data["timelines"].items(), key=lambda kv: int(kv[0]))
    fig = Figure(figsize=(min(MAX_WIDTH, 10.0), 2.6 * len(panels) + 1.0), layout="constrained")
    axes = fig.subplots(len(panels), 1, squeeze=False)[:, 0]
    colours = CATEGORY_COLOURS[: len(data["steps"])]
    for ax, (rows, panel) in zip(axes, panels):
        programs = sorted(panel["stamps_us"], key=lambda p: p[0])
        for y, p in enumerate(programs):
            spans = [(p[i], p[i + 1] - p[i]) for i in range(len(p) - 1)]
            ax.broken_barh(spans, (y - 0.4, 0.8), facecolors=colours, linewidth=0)
        span = max(p[-1] for p in programs)
        ends = sorted(p[-1] - p[0] for p in programs)
        ax.axvline(span, color=MUTED, linewidth=1, linestyle="--")
        busy = f", {panel['programs']} of them with a group" if "programs" in panel else ""
        title = (f"{rows} rows, {len(programs)} programs launched ({panel['blocks']}){busy}: median program "
                 f"{ends[len(ends) // 2]:.1f} µs, launch span {span:.1f} µs")
        if "replay_us" in panel:
            title += (f"\ngraph replay {panel['replay_us']:.1f} µs: {panel['replay_us'] - span:.1f} µs of it "
                      f"outside the programs (a one-node graph replays in {data['launch_us']:.1f} µs)")
        ax.set_title(title, fontsize=FONT, loc="left")
        ax.set_ylim(-1, len(programs))
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel("program (by start)", fontsize=FONT)
        ax.tick_params(labelsize=FONT)
    axes[-1].set_xlabel("µs from the first program's start", fontsize=FONT)
    fig.legend(handles=[Patch(color=c, label=s) for c, s in zip(colours, data["steps"])], loc="outside lower center",
               ncols=len(colours), fontsize=FONT)
    fig.suptitle(f"Where one launch of the fused kernel spends its time\n{data['device']}, {data['date']}",
                 fontsize=TITLE_FONT)
    return fig


def _with_group_counts(data: dict, results_file: Path) -> dict:
    """``data`` with each panel's ``programs`` (the blocks that hold a group) taken from the results
    file it was measured beside, where that file has the bucket and the panel does not say it."""
    if results_file.exists():
        cases = {str(c["rows"]): c["programs"] for c in json.loads(results_file.read_text()).get("cases", [])}
        for rows, panel in data["timelines"].items():
            if rows in cases:
                panel.setdefault("programs", cases[rows])
    return data


def results_file_of(timeline: str | os.PathLike) -> Path:
    """The results file a timeline ``<folder>/timelines/<name>.json`` was measured beside: ``<folder>/<name>.json``."""
    path = Path(timeline)
    return path.parent.parent / path.name


def timeline_file(results_file: str | os.PathLike) -> Path:
    """Where the timeline of a results file ``<folder>/<name>.json`` goes: ``<folder>/timelines/<name>.json``."""
    path = Path(results_file)
    return path.parent / TIMELINES / path.name


def newest_timeline(folder: str | os.PathLike | None = None) -> Path | None:
    """The newest stored timeline (by name: ``<date>-<device>.json``) under ``folder`` (default: the
    stored results' folder), or ``None`` where there is none."""
    from ..measure.results import RESULTS_FOLDER

    found = sorted((Path(folder or RESULTS_FOLDER) / TIMELINES).glob("*.json"))
    return found[-1] if found else None
