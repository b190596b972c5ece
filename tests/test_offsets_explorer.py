"""The offsets explorer's logic (a plain function) and the offsets pictures."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

import c2graph as c2  # noqa: E402
from c2graph.pictures.draw_offsets import draw_offsets, draw_offsets_diff  # noqa: E402
from c2graph.pictures.offsets_explorer import offsets_explorer_widget, replay_offsets  # noqa: E402


def gids(fig, gid):
    return [a for a in fig.findobj() if getattr(a, "get_gid", lambda: None)() == gid]


def test_a_padded_batch_replays_and_equals_eager():
    r = replay_offsets([(0, 0, 5), (1, 3, 6)], pad_to=16)
    assert (r.mode, r.bucket, r.ok) == ("graph", 16, True), r.summary()
    assert r.batch.extend_offsets.tolist() == [[0, 5, 11, 11], [5, 6, 0, 0]]
    assert r.padding_rows == range(11, 16)
    assert "replayed in the graph of bucket 16" in r.summary() and "padding rows: 11..15" in r.summary()
    assert [name for name, _ in r.comparisons] == ["layer 0 (fused path)", "layer 1 (torch path)"]


def test_an_idle_rank_and_an_eager_batch():
    idle = replay_offsets([], pad_to=12)
    assert (idle.mode, idle.bucket, idle.batch.live_rows, idle.ok) == ("graph", 16, 0, True)
    assert idle.batch.extend_offsets.tolist() == [[0, 0, 0, 0], [0, 0, 0, 0]]
    small = replay_offsets([(2, 1, 3)])
    assert small.mode == "eager" and small.ok and "more than double" in small.why
    with pytest.raises(ValueError, match="pad_to = 2"):
        replay_offsets([(0, 0, 5)], pad_to=2)
    with pytest.raises(ValueError, match="pool_index = 7"):
        replay_offsets([(7, 0, 5)])


def test_offsets_pictures():
    alloc = c2.ReqToTokenPool(c2.Config.tiny(), 4, 64)
    batches = {"ragged": c2.ExtendBatch.build([(0, 0, 5), (1, 3, 6)], alloc, request_slots=4),
               "idle": c2.ExtendBatch.build([], alloc, request_slots=4, pad_to=8)}
    fig = draw_offsets(batches)
    assert len(gids(fig, "offset")) == 2 * 2 * 4 and len(gids(fig, "live")) == 2 and len(gids(fig, "padding")) == 1
    assert plt.get_fignums() == []
    want = c2.build_extend_offsets([5, 6], 4)
    got = want.clone()
    got[0, 3] = 0
    diff = draw_offsets_diff(got, want)
    assert [a.get_linewidth() for a in gids(diff, "offset")].count(2.5) == 1
    with pytest.raises(ValueError, match="batches"):
        draw_offsets({})


def test_the_widget_builds():
    widget = offsets_explorer_widget()
    assert len(widget.children) == 5
