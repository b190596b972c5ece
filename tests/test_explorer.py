"""The explorer: its plain function builds a batch and returns its row plan; the widget builds
without a browser."""

from __future__ import annotations

import pytest
import torch
from matplotlib.figure import Figure

import c2graph as c2
from c2graph.compressor.rows import BatchPlan, Partner
from c2graph.pictures import explorer
from c2graph.pictures.explorer import explain_batch, explorer_widget

CFG = c2.Config.tiny()


def test_explain_batch_returns_the_plan():
    plan = explain_batch([(0, 0, 3), (1, 5, 3)], CFG, pad_to=8)
    assert isinstance(plan, BatchPlan) and plan.ring_size == CFG.ring_size
    assert plan.batch.num_rows == 8 and plan.batch.live_rows == 6
    assert plan == plan.batch.plan(CFG.ring_size)
    assert plan.ring_reads == {3: 2} and plan.rows[3].partner is Partner.RING
    assert explain_batch([(0, 1, 2)], CFG, ring_size=3).ring_reads == {0: 0}


def test_same_arguments_same_slots():
    """Without an allocator a fresh seeded one is used, so the plan is reproducible."""
    a = explain_batch([(2, 3, 5), (0, 0, 4)], CFG)
    b = explain_batch([(2, 3, 5), (0, 0, 4)], CFG)
    assert a.rows == b.rows


def test_printing_the_plan_shows_its_table():
    plan = explain_batch([(0, 1, 4)], CFG, pad_to=6)
    assert str(plan) == plan.table()
    assert "ring row 0" in str(plan).splitlines()[1]  # row 0 is pos 1: its partner pos 0 is in ring row 0


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(requests=[(0, 0, 4)], cfg=CFG, ring_size=1), "ring_size = 1"),
        (dict(requests=[(0, 0, 4)], cfg=CFG, ring_size=2.0), "ring_size = 2.0"),
        (dict(requests="abc", cfg=CFG), "requests is a str"),
        (dict(requests=[(0, 4)], cfg=CFG), r"requests\[0\] = \(0, 4\)"),
        (dict(requests=[(0, 0, 2), (1, -1, 3)], cfg=CFG), r"requests\[1\].prefix_len = -1"),
        (dict(requests=[(0, 0, True)], cfg=CFG), r"requests\[0\].extend_len = True"),
        (dict(requests=[(0, 0, 4)], cfg="tiny"), "cfg is a str"),
        (dict(requests=[(0, 0, 4)], cfg=CFG, allocator=object()), "allocator is a object"),
        (dict(requests=[(0, 0, 4), (0, 4, 2)], cfg=CFG), "pool_index = 0 appears twice"),
        (dict(requests=[(0, 0, 4)], cfg=CFG, pad_to=3), "pad_to = 3"),
    ],
)
def test_bad_input_names_the_argument(kwargs, match):
    with pytest.raises(ValueError, match=match):
        explain_batch(**kwargs)


def test_widget_builds_without_a_browser(capsys):
    """Outside a kernel its first drawing goes to stdout: both pictures, then the plan's table."""
    ui = explorer_widget()
    assert len(ui.children) == 5  # three rows of sliders, the bucket, the output
    sliders = [s for box in ui.children[:3] for s in box.children]
    assert [s.description for s in sliders][:2] == ["req 0 prefix", "req 0 extend"]
    shown = capsys.readouterr().out
    assert shown.count("IPython.core.display.Image object") == 2
    assert explain_batch([(0, 0, 7), (1, 5, 6), (2, 12, 3)], CFG).table() in shown  # notebook 01's ragged batch, unpadded


def test_the_widget_shows_the_notebooks_own_c2_slots_and_leaves_its_pool_alone(monkeypatch):
    pytest.importorskip("ipywidgets")  # a dependency: installed by `make test`, carried to the GPU host (.whl)
    alloc = c2.ReqToTokenPool(CFG, pool_requests=4, max_seq_len=64, seed=0)
    c2.ExtendBatch.build([(1, 0, 5), (2, 0, 12)], alloc)  # notebook 01's earlier batch, then its ragged one
    ragged = c2.ExtendBatch.build([(0, 0, 7), (1, 5, 6), (2, 12, 3)], alloc)
    table, free = alloc.page_table.clone(), alloc.free_pages
    plans = []

    def recorded(*args, **kwargs):
        plans.append(explain_batch(*args, **kwargs))
        return plans[-1]

    monkeypatch.setattr(explorer, "explain_batch", recorded)
    monkeypatch.setattr(explorer, "draw_ring", lambda *a: Figure())
    monkeypatch.setattr(explorer, "draw_batch", lambda *a: Figure())
    explorer_widget(CFG, allocator=alloc)
    assert plans, "the widget draws its first batch when it is made"
    assert torch.equal(plans[0].batch.raw_out_loc.cpu(), ragged.raw_out_loc.cpu()), "the same c2 slots as the notebook's batch"
    assert torch.equal(alloc.page_table, table) and alloc.free_pages == free, "the notebook's pool gave no page"
