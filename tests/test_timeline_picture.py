"""The picture of where one launch of the fused kernel spends its time: drawn from stored stamps on
any machine (each program a bar, one segment a step), and measured on a CUDA device."""

from __future__ import annotations

import json
import random

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402
import torch  # noqa: E402
from matplotlib.collections import PolyCollection  # noqa: E402
from matplotlib.text import Text  # noqa: E402

from c2graph.pictures.style import MAX_WIDTH, MIN_FONT  # noqa: E402
from c2graph.pictures.timeline import draw_timeline, newest_timeline, timeline_file  # noqa: E402
from fused_timeline import STEPS  # noqa: E402
from timeline import write_timeline  # noqa: E402


def stamps(programs: int, seed: int) -> list[list[float]]:
    """Random stamps of ``programs`` programs: a start, then the end of each step, increasing."""
    rng = random.Random(seed)
    out = []
    for _ in range(programs):
        t = [rng.uniform(0, 2)]
        for _ in STEPS:
            t.append(t[-1] + rng.uniform(0, 5))
        out.append(t)
    return out


def timeline_data(seed: int = 0) -> dict:
    return {"device": "a GPU", "date": "a date", "steps": list(STEPS),
            "timelines": {"256": {"blocks": "g8", "stamps_us": stamps(18, seed)},
                          "2048": {"blocks": "g8", "stamps_us": stamps(130, seed + 1)}}}


def test_each_program_is_a_bar_of_its_steps():
    data = timeline_data(seed=random.randrange(2**16))
    fig = draw_timeline(data)
    for ax, rows in zip(fig.axes, ("256", "2048")):
        programs = sorted(data["timelines"][rows]["stamps_us"], key=lambda p: p[0])
        bars = [c for c in ax.collections if isinstance(c, PolyCollection)]
        assert len(bars) == len(programs)
        for bar, p in zip(bars, programs):  # segment i runs from stamp i to stamp i + 1
            xs = [x for path in bar.get_paths() for x in (path.vertices[:, 0].min(), path.vertices[:, 0].max())]
            assert xs == pytest.approx([p[i + e] for i in range(len(STEPS)) for e in (0, 1)])
        assert f"{len(programs)} programs" in ax.get_title(loc="left")


def test_the_title_says_what_of_the_replay_lies_outside_the_programs():
    data = timeline_data(seed=3)
    data["launch_us"] = 3.0
    span = max(p[-1] for p in data["timelines"]["256"]["stamps_us"])
    data["timelines"]["256"]["replay_us"] = span + 4.5
    title = draw_timeline(data).axes[0].get_title(loc="left")
    assert f"graph replay {span + 4.5:.1f} µs: 4.5 µs of it outside the programs" in title
    assert "one-node graph replays in 3.0 µs" in title


def test_bounds_and_files(tmp_path):
    fig = draw_timeline(timeline_data())
    fig.draw_without_rendering()
    assert fig.get_figwidth() <= MAX_WIDTH and fig.get_tightbbox().width <= MAX_WIDTH
    assert min(t.get_fontsize() for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()) >= MIN_FONT
    results = tmp_path / "2026-01-02-a-gpu.json"
    path = timeline_file(results)
    assert path == tmp_path / "timelines" / results.name
    assert newest_timeline(tmp_path) is None
    path.parent.mkdir()
    path.write_text(json.dumps(timeline_data()))
    assert newest_timeline(tmp_path) == path
    draw_timeline(path)  # a stored file draws as the dict does


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="the stamps are the GPU's timer")
def test_write_timeline_measures_every_program(tmp_path):
    from c2graph.compressor.fused import grid_blocks, kernel_blocks
    from c2graph.measure.bench_cases import REQUESTS

    data_file, picture = write_timeline(tmp_path / "2026-01-02-a-gpu.json", rows=(256,))
    data = json.loads(data_file.read_text())
    programs = data["timelines"]["256"]["stamps_us"]
    assert len(programs) == grid_blocks(256, REQUESTS[1], kernel_blocks(512, 256).groups_per_block)
    for p in programs:
        assert len(p) == len(STEPS) + 1 and all(a <= b for a, b in zip(p, p[1:]))
    assert min(p[0] for p in programs) == 0.0 and picture.stat().st_size > 0
