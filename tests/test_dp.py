"""Data-parallel ranks as real processes (gloo on the CPU, NCCL on GPUs): every rank's graph equals
eager bitwise, an idle rank replays with every row padding, and a rank that fails is named."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from c2graph.dp import RankStep, Setup, _check_schedules, default_schedules, main, run_ranks

def test_default_schedules_have_an_idle_rank_odd_starts_and_never_all_idle():
    schedules = default_schedules(2, steps=3)
    assert [[len(step) for step in rank] for rank in schedules] == [[2, 1, 0], [1, 0, 1]]
    starts = [p for rank in schedules for step in rank for _, p, _ in step]
    assert any(p % 2 for p in starts) and 0 in starts
    assert all(4 <= n <= 7 for rank in schedules for step in rank for *_, n in step)
    assert all(any(rank[s] for rank in schedules) for s in range(3))
    with pytest.raises(ValueError, match="ranks = 0"):
        default_schedules(0)


def test_two_ranks_agree_on_pad_to_and_an_idle_rank_replays():
    reports = run_ranks(default_schedules(2, steps=2), timeout_s=240)
    assert [(r.rank, r.step) for r in reports] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert all(isinstance(r, RankStep) and r.ok for r in reports), [str(r) for r in reports]
    for step in range(2):
        mine = [r for r in reports if r.step == step]
        assert len({r.pad_to for r in mine}) == 1 and mine[0].pad_to == max(r.live_rows for r in mine)
        assert len({(r.mode, r.bucket) for r in mine}) == 1 and mine[0].mode == "graph", "one bucket for all ranks"
    assert [r.bucket for r in reports if r.rank == 0] == [16, 8]
    idle = [r for r in reports if not r.requests]
    assert [(r.rank, r.step, r.live_rows) for r in idle] == [(1, 1, 0)]


def test_a_rank_that_fails_is_named():
    schedules = [[[(0, 0, 5)]], [[(0, 0, 500)]]]  # rank 1's request is longer than its request pool
    small = Setup(n_layers=1, unfused_every=1, buckets=(8,))  # one torch layer: quick to capture
    with pytest.raises(RuntimeError, match=r"(?s)rank 1 failed.*max_seq_len"):
        run_ranks(schedules, setup=small, timeout_s=240)


def test_a_stale_main_file_is_not_run_by_the_ranks(tmp_path, monkeypatch):
    """In a notebook, ``__main__.__file__`` can name a module that is not the program (Triton's
    interpreter leaves its own there): the spawned ranks must not run it."""
    stale = tmp_path / "stale_main.py"
    stale.write_text("raise SystemExit('a rank ran the stale __main__ file')\n")
    main_module = sys.modules["__main__"]
    monkeypatch.setattr(main_module, "__file__", str(stale), raising=False)
    monkeypatch.setattr(main_module, "__spec__", None, raising=False)
    small = Setup(n_layers=1, unfused_every=1, buckets=(8,))
    reports = run_ranks([[[(0, 0, 5)]], [[(0, 1, 4)]]], setup=small, timeout_s=240)
    assert all(r.ok for r in reports), [str(r) for r in reports]
    assert main_module.__file__ == str(stale), "restored once the ranks have started"


def test_a_run_past_its_time_names_the_ranks_still_running():
    with pytest.raises(TimeoutError, match=r"timeout_s = 0.5 s; rank\(s\) \[0, 1\] still running"):
        run_ranks(default_schedules(2, steps=1), timeout_s=0.5)


def test_bad_schedules_are_refused_before_any_process_starts():
    with pytest.raises(ValueError, match="all of the same length"):
        run_ranks([[[]], [[], []]])
    with pytest.raises(ValueError, match=r"schedules\[0\]\[0\] holds \(0, 1\)"):
        run_ranks([[[(0, 1)]]])
    with pytest.raises(ValueError, match=r"schedules\[0\]\[0\] prefix_len = 1.5; expected an int >= 0"):
        run_ranks([[[(0, 1.5, 3)]]])
    with pytest.raises(ValueError, match="steps = 0; expected an int >= 1"):
        default_schedules(2, steps=0)
    _check_schedules([[[(np.int64(0), np.int64(1), 4)]]])  # numpy integers are ints
    with pytest.raises(SystemExit):
        main(["--ranks", "0"])


def test_every_rank_imports_c2graph_without_a_plotting_library():
    """Each rank is a fresh process that imports c2graph: the pictures load only when used."""
    code = ("import sys, c2graph, c2graph.dp; "
            "print([m for m in sys.modules if m.split('.')[0] in ('matplotlib', 'ipywidgets')])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
