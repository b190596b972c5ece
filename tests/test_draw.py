"""Every picture returns a Figure with the expected artists on a small case, leaks nothing into
pyplot, and the figures command writes its PNGs."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

import c2graph as c2  # noqa: E402
from c2graph.pictures.draw import draw_batch, draw_gate_weights, draw_path, draw_ring  # noqa: E402
from c2graph.workshop.figures import main as figures_main  # noqa: E402
from c2graph.measure.results import newest_results  # noqa: E402

CFG = c2.Config.tiny()


@pytest.fixture
def batches():
    """An earlier batch, then a ragged one (one request starting odd) padded to 16 rows."""
    alloc = c2.ReqToTokenPool(CFG, 4, 32, seed=0)
    earlier = c2.ExtendBatch.build([(1, 0, 5)], alloc, device="cpu")
    ragged = c2.ExtendBatch.build([(0, 0, 4), (1, 5, 5), (3, 2, 3)], alloc, pad_to=16, device="cpu")
    return earlier, ragged


def by_gid(fig: Figure, gid: str) -> list:
    return [a for a in fig.findobj() if getattr(a, "get_gid", lambda: None)() == gid]


def texts(fig: Figure) -> list[str]:
    return [t.get_text() for t in fig.findobj(matplotlib.text.Text)]


def close(fig: Figure) -> None:
    assert plt.get_fignums() == [], "a drawing function registered a pyplot figure"
    plt.close(fig)


def test_draw_batch(batches):
    _, batch = batches
    plan = batch.plan(CFG.ring_size)
    fig = draw_batch(batch, CFG.ring_size)
    assert isinstance(fig, Figure) and len(fig.axes) == 1
    rows = by_gid(fig, "row")
    assert len(rows) == batch.num_rows == 16
    assert sum(r.get_hatch() == "///" for r in rows) == 16 - batch.live_rows
    groups = by_gid(fig, "group")
    assert len(groups) == len(plan.group_rows) == 6
    assert sum(g.get_hatch() == "xx" for g in groups) == len(plan.ring_reads) == 1
    slots = by_gid(fig, "c2slot")
    assert len(slots) == len(plan.stored_slots)
    t = texts(fig)
    assert all(str(s) in t for s in plan.stored_slots)
    assert f"ring\nrow {plan.ring_reads[4]}" in t
    labels = [x.replace("\n", " ") for x in t if x.startswith("request")]  # in one, two or three lines
    assert labels == ["request slot 0 req 0", "request slot 1 req 1", "request slot 2 req 3"]
    assert fig.legends and len(fig.legends[0].get_texts()) == 4
    close(fig)


def test_draw_batch_legend_names_only_what_is_drawn():
    alloc = c2.ReqToTokenPool(CFG, 2, 32, seed=0)
    fig = draw_batch(c2.ExtendBatch.build([(0, 0, 6), (1, 0, 5)], alloc, device="cpu"), CFG.ring_size)
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert labels == ["group: partner is the previous row", "c2 slot the group writes"]
    assert fig.axes[0].get_title() == "2 requests, 11 live rows: 5 groups write 5 c2 slots"
    close(fig)


def test_draw_ring(batches):
    earlier, batch = batches
    plan = batch.plan(CFG.ring_size)
    fig = draw_ring(batch, 4, CFG.ring_size, previous=earlier)
    assert isinstance(fig, Figure) and len(fig.axes) == 1
    assert len(by_gid(fig, "ring")) == 2 * (4 * CFG.ring_size + 1)
    assert len(by_gid(fig, "row")) == batch.num_rows
    assert len(by_gid(fig, "read")) == len(plan.ring_reads) == 1
    assert len(by_gid(fig, "park")) == len(plan.parked) == 6
    t = texts(fig)
    # the earlier batch parked pos 3 and 4 of req 1; this one parks pos 8 and 9
    assert {"pos 3", "pos 4", "pos 8", "pos 9"} <= set(t)
    assert t.count("sentinel") == 2
    close(fig)


def test_an_idle_rank_draws_padding_only():
    """Every row padding (an idle data-parallel rank): rows drawn, no group, no ring traffic."""
    alloc = c2.ReqToTokenPool(CFG, 2, 32, seed=0)
    idle = c2.ExtendBatch.build([], alloc, pad_to=6, device="cpu")
    fig = draw_batch(idle, CFG.ring_size)
    assert len(by_gid(fig, "row")) == 6 and not by_gid(fig, "group") and not by_gid(fig, "c2slot")
    close(fig)
    fig = draw_ring(idle, 2, CFG.ring_size)
    assert not by_gid(fig, "read") and not by_gid(fig, "park")
    close(fig)


def test_draw_ring_checks_pool_requests(batches):
    _, batch = batches
    with pytest.raises(ValueError, match="pool_requests = 0; expected an int >= 4"):
        draw_ring(batch, 0, 2)
    with pytest.raises(ValueError, match=r"pool_requests = 3; .* pool_index 3"):
        draw_ring(batch, 3, 2)


def test_draw_gate_weights():
    w0 = torch.rand(5, CFG.D, generator=torch.Generator().manual_seed(0))
    fig = draw_gate_weights(w0, [0, 2, 4, 6, 8])
    assert isinstance(fig, Figure) and len(fig.axes) == 2  # the heatmap and its colour bar
    (im,) = fig.axes[0].images
    assert im.get_array().shape == (5, CFG.D)
    assert im.get_clim() == (0.0, 1.0)
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == [f"pos {p}, {p + 1}" for p in (0, 2, 4, 6, 8)]
    close(fig)
    with pytest.raises(ValueError, match="w0 has shape"):
        draw_gate_weights(torch.rand(CFG.D))
    with pytest.raises(ValueError, match="group_pos has 2 entries"):
        draw_gate_weights(w0, [0, 2])


def test_draw_path():
    fig = draw_path(CFG)
    assert isinstance(fig, Figure) and len(fig.axes) == 1
    assert len(by_gid(fig, "block")) == 14
    assert len(by_gid(fig, "edge")) == 14  # 12 along the path, the ring's park and read
    t = texts(fig)
    for name in ("source projection", "| kv | score |", "gate", "RMSNorm", "ring", "kv_cache", "index_k", "wk"):
        assert name in t
    assert "D = 24 + 8 rope" in fig.axes[0].get_title()
    close(fig)


def test_figures_command(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    figures_main(["out/figs"])
    printed = capsys.readouterr().out.split()
    cpu = ("path", "ragged_batch", "ring", "extend_offsets", "fused_programs", "frozen_offsets")
    # the benchmark's pictures, drawn from the newest stored GPU results where there are any
    gpu = ("bench_times", "bench_bandwidth", "bench_speedups") if newest_results() is not None else ()
    assert printed == [f"out/figs/{name}.png" for name in cpu + gpu]
    for p in printed:
        assert (tmp_path / p).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
