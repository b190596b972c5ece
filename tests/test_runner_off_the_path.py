"""The prefill graph runner off the happy path: tensors rebound after capture, a batch handed to
``refresh`` that ``run`` would not have built, two threads on one runner, the host reads a step
makes, and the latents of rows that complete no group. Each scenario on both paths and both graph
backends (tests/graph_backends.py), with bitwise snapshots of the runner's buffers, its pools and
its graphs before and after every refusal (tests/test_bad_input.py)."""

from __future__ import annotations

import c2graph as c2  # noqa: I001  (first: decides TRITON_INTERPRET before Triton is imported)

import dataclasses
import threading

import pytest
import torch
from graph_backends import backend  # noqa: F401  (a fixture)
from sync_count import counting_host_reads
from support import POISON
from test_bad_input import CFG, PATHS, _run_still_equals_eager, _runner, assert_refused

from c2graph.measure.compare import compare_pools


def good_alloc():
    """An allocator whose pages all lie inside the runner's pools (tests/test_bad_input.py's ``_runner``)."""
    return c2.ReqToTokenPool(CFG, 4, 48, seed=7)


def _rebind_kv_cache(runner):
    runner.pools.kv_cache = runner.pools.kv_cache.clone()


def _rebind_ring(runner):
    runner.pools.ring = runner.pools.ring.clone()


def _replace_pools(runner):
    runner.layer_pools = (runner.pools.clone(),)


def _rebind_static(runner):
    runner.static.layers[0].latent = runner.static.layers[0].latent.clone()


REBINDS = {  # what is rebound after capture, and the name the refusal gives it
    "pools.kv_cache": (_rebind_kv_cache, r"runner.layer_pools\[0\].kv_cache is not the tensor the graphs captured"),
    "pools.ring": (_rebind_ring, r"runner.layer_pools\[0\].ring is not the tensor the graphs captured"),
    "runner.layer_pools": (_replace_pools, r"runner.layer_pools\[0\].kv_cache is not the tensor the graphs captured"),
    "a static buffer": (_rebind_static, r"runner.static.layers\[0\].latent is not the tensor the graphs captured"),
}


@pytest.mark.parametrize("fused", PATHS)
@pytest.mark.parametrize("rebind", list(REBINDS))
def test_a_replay_into_tensors_rebound_after_capture_is_refused(backend, fused, rebind, monkeypatch):
    """The graph would write the captured memory, not the runner's: refused, and neither the old
    tensors nor the new ones change; with the captured tensors back, the runner runs again."""
    runner, _ = _runner(backend, fused, monkeypatch)
    alloc = good_alloc()
    captured = (runner.layer_pools, runner.pools.tensors(), runner.static.layers[0].latent)
    old = [t.clone() for t in (*captured[1].values(), captured[2])]
    edit, match = REBINDS[rebind]
    edit(runner)
    x = runner.layer.random_hidden(6, seed=1)
    assert_refused(lambda: runner.run([(1, 1, 6)], alloc, x), match + ".*put it back, or build a new PrefillGraphRunner",
                   runner, alloc)
    assert all(torch.equal(a, b) for a, b in zip(old, (*captured[1].values(), captured[2])))
    runner.layer_pools = captured[0]
    for name, t in captured[1].items():
        setattr(runner.pools, name, t)
    runner.static.layers[0].latent = captured[2]
    _run_still_equals_eager(runner, alloc, [(1, 1, 6)])


@pytest.mark.parametrize("fused", PATHS)
def test_refresh_checks_its_batch_as_run_does(backend, fused, monkeypatch):
    runner, far_alloc = _runner(backend, fused, monkeypatch)
    alloc = good_alloc()
    x6 = runner.layer.random_hidden(6, seed=2)
    unpadded = c2.ExtendBatch.build([(0, 0, 6)], alloc, request_slots=2, device=runner.device)
    assert_refused(lambda: runner.refresh(unpadded, x6), r"batch has 6 rows and 2 request slots; expected one of "
                   r"this runner's buckets \(\[8, 16\]\) and 2 request slots", runner, alloc)
    far_alloc.assign([(p, 0, 96) for p in range(4)])
    far = next((p, 16 * k) for p in range(4) for k in range(6)
               if far_alloc.page_table[p, k].item() * CFG.page_size // 2 >= runner.pools.kv_slots)
    past = c2.ExtendBatch.build([(*far, 6)], far_alloc, request_slots=2, pad_to=8, device=runner.device)
    assert_refused(lambda: runner.refresh(past, x6), r"batch.c2_slot holds c2 slot \d+, past the pools", runner, alloc)
    edited = c2.ExtendBatch.build([(1, 1, 6)], alloc, request_slots=2, pad_to=8, device=runner.device)
    edited.c2_slot[2] += 1  # in place: the extents counted when it was made still fit
    assert_refused(lambda: runner.refresh(edited, x6), r"batch.c2_slot\[2\] = \d+, but raw_out_loc\[2\]", runner, alloc)
    assert_refused(lambda: runner.refresh([(1, 1, 6)], x6), "batch is a list; expected a c2graph.ExtendBatch",
                   runner, alloc)


@pytest.mark.parametrize("fused", PATHS)
def test_graph_and_eager_give_the_same_latents_on_every_row(backend, fused, monkeypatch):
    """Rows that complete no group hold NaN after a replay as after an eager call (not the last
    step's values): bit for bit, NaN included."""
    runner, _ = _runner(backend, fused, monkeypatch)
    alloc = good_alloc()
    ref = runner.pools.clone()
    for step, requests in enumerate(([(0, 0, 7), (1, 3, 6)], [(0, 7, 3), (2, 0, 2)])):
        x = runner.layer.random_hidden(sum(r[2] for r in requests), seed=10 + step)
        got = runner.run(requests, alloc, x)
        assert got.mode == "graph"
        batch = c2.ExtendBatch.build(requests, alloc, request_slots=2, pad_to=got.bucket, device=runner.device)
        want = c2.compress(runner.layer, x, batch, ref)
        assert torch.equal(got.latent.view(torch.int16), want.view(torch.int16))
        assert got.latent.isnan().any() and not got.latent[batch.group_rows].isnan().any()


@pytest.mark.parametrize("fused", PATHS)
def test_a_graph_step_reads_no_tensor_value_on_the_host(backend, fused, monkeypatch):
    """``run`` in graph mode: the requests checked once, the batch built from the requests and the
    pages, copied in, projected, replayed: no value read back (on a GPU, no sync). The eager
    fallback reads its batch once (``validate``)."""
    runner, _ = _runner(backend, fused, monkeypatch)
    alloc = good_alloc()
    x = runner.layer.random_hidden(11, seed=3)
    runner.run([(0, 0, 5), (1, 1, 6)], alloc, x)  # the first replay of each kind happens before counting
    x = runner.layer.random_hidden(7, seed=4)
    with counting_host_reads(monkeypatch) as reads:
        step = runner.run([(0, 5, 3), (1, 7, 4)], alloc, x)
    assert step.mode == "graph" and reads == []
    x = runner.layer.random_hidden(9, seed=5)
    with counting_host_reads(monkeypatch) as reads:
        step = runner.run([(0, 8, 3), (1, 11, 3), (2, 0, 3)], alloc, x)  # 3 requests > 2 slots: eager
    assert step.mode == "eager" and reads


@pytest.mark.parametrize("fused", PATHS)
def test_two_threads_on_one_runner_take_turns(backend, fused, monkeypatch):
    """Two threads, each prefilling its own requests in chunks, on one runner: ``run`` holds the
    runner's lock, so the caches equal the same chunks run eagerly one after the other (the pages
    given before, so that the order of the threads decides no location). A thread that keeps a
    step's latents holds the lock around the step and its copy."""
    runner, _ = _runner(backend, fused, monkeypatch)
    alloc = good_alloc()
    alloc.assign([(p, 0, 48) for p in range(4)])
    ref = runner.pools.clone()
    chunks = {0: [[(0, 0, 5), (1, 0, 3)], [(0, 5, 4), (1, 3, 6)]], 1: [[(2, 0, 7)], [(2, 7, 2), (3, 0, 8)]]}
    latents, errors = {}, []

    def prefill(t: int) -> None:
        try:
            for step, requests in enumerate(chunks[t]):
                x = runner.layer.random_hidden(sum(r[2] for r in requests), seed=100 * t + step)
                if t == 0:
                    with runner.lock:  # the step's latents are the static buffers: copied before the next run
                        latents[t, step] = runner.run(requests, alloc, x).latent.clone()
                else:
                    runner.run(requests, alloc, x)
        except Exception as e:  # noqa: BLE001  (reported below, in the test's thread)
            errors.append(e)

    threads = [threading.Thread(target=prefill, args=(t,)) for t in chunks]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == []
    for t, steps in chunks.items():
        for step, requests in enumerate(steps):
            x = runner.layer.random_hidden(sum(r[2] for r in requests), seed=100 * t + step)
            batch = c2.ExtendBatch.build(requests, alloc, request_slots=2, pad_to=runner.pick_bucket(batch_rows(requests)),
                                         device=runner.device)
            want = c2.compress(runner.layer, x, batch, ref)
            assert t != 0 or torch.equal(latents[t, step].view(torch.int16), want.view(torch.int16))
    assert all(compare_pools(runner.pools, ref, skip_slot0=not fused))


def batch_rows(requests) -> int:
    return sum(r[2] for r in requests)


def test_runner_arguments_are_refused_in_our_words(backend, monkeypatch):
    runner, alloc = _runner(backend, False, monkeypatch)
    assert_refused(lambda: runner.nodes(7), r"bucket = 7; expected one of the buckets this runner captured \[8, 16\]",
                   runner)
    assert_refused(lambda: runner.layer_nodes(7), "bucket = 7; expected one of the buckets", runner)
    for bad in (True, -1, 2.0):
        assert_refused(lambda: c2.PrefillGraphRunner(runner.layer, runner.pools, buckets=[8], request_slots=2,
                                                     warmup_iters=bad), f"warmup_iters = {bad!r}; expected an int >= 0",
                       runner)
    assert_refused(lambda: c2.PrefillGraphRunner(runner.layer, runner.pools, buckets=[2**40], request_slots=2),
                   r"buckets\[0\] = 1099511627776; expected an int < 2\*\*31", runner)
    x = runner.layer.random_hidden(6, seed=1)
    assert_refused(lambda: runner.run([(0, 0, 6)], alloc, x, pad_to=2**40),
                   r"pad_to = 1099511627776; expected an int >= the 6 live rows and < 2\*\*31", runner, alloc)


def test_a_batch_changed_in_place_after_run_is_not_replayed_silently(backend, monkeypatch):
    """``run`` builds its own batch; a step's batch changed afterwards and handed to ``refresh`` is
    read again there (``validate``), as eager reads it."""
    runner, _ = _runner(backend, False, monkeypatch)
    alloc = good_alloc()
    x = runner.layer.random_hidden(6, seed=6)
    step = runner.run([(1, 1, 6)], alloc, x)
    step.batch.pos[0] = -1
    assert_refused(lambda: runner.refresh(step.batch, x), "batch.pos holds position -1", runner, alloc)
    bad = dataclasses.replace(step.batch, pos=step.batch.pos.clone())
    assert bad.extents["pos"][0] == -1
    assert_refused(lambda: runner.refresh(bad, x, validate=False), "batch.pos holds position -1", runner, alloc)


STATIC_EDITS = {  # a static tensor changed in place between replays: what no check sees
    "c2_slot = -1": lambda s: s.c2_slot.fill_(-1),
    "c2_slot past the caches": lambda s: s.c2_slot.add_(10_000),
    "raw_out_loc past the caches": lambda s: s.raw_out_loc.add_(100_000),
    "req = 99": lambda s: s.req.fill_(99),
    "req = -1": lambda s: s.req.fill_(-1),
    "pos = -3": lambda s: s.pos.sub_(3),
    "offsets before row 0": lambda s: s.extend_offsets[0].sub_(2),
    "offsets past the rows": lambda s: s.extend_offsets[1].add_(50),
}


@pytest.mark.parametrize("fused", PATHS)
def test_a_replay_of_any_static_batch_writes_only_inside_the_caches_and_the_ring(backend, fused, monkeypatch):
    """A graph replays whatever the static tensors hold. Changed by hand past every check, they
    still send no write outside the caches and the ring (each one a view inside a larger tensor
    whose guard rows must keep their poison), nor into the last c2 slot through a negative index."""
    runner, _ = _runner(backend, fused, monkeypatch)
    alloc = good_alloc()
    pools = runner.pools
    big = {}
    for name, t in pools.tensors().items():  # a new runner over guarded pools: captured that way
        big[name] = torch.full((t.shape[0] + 4, t.shape[1]), 7.0, dtype=t.dtype, device=t.device)
        big[name][2:-2] = t
        setattr(pools, name, big[name][2:-2])
    runner = c2.PrefillGraphRunner(runner.layer, pools, buckets=[8, 16], request_slots=2)
    last = pools.kv_slots - 1
    for edit in STATIC_EDITS.values():
        x = runner.layer.random_hidden(9, seed=8)
        batch = c2.ExtendBatch.build([(0, 1, 5), (3, 0, 4)], alloc, request_slots=2, pad_to=16, device=runner.device)
        assert last not in batch.stored_slots
        runner.refresh(batch, x)
        edit(runner.static)
        runner.graphs[16].replay()
        for name, t in big.items():
            assert (t[:2].float() == 7).all() and (t[-2:].float() == 7).all(), f"a write outside pools.{name}"
        assert (pools.kv_cache[last].float() == POISON).all() and (pools.index_k[last].float() == POISON).all()


def test_a_step_checks_each_request_once(backend, monkeypatch):
    """``run`` checks the requests once and works the pages out once (building the batch takes the
    checked requests as they are)."""
    runner, _ = _runner(backend, False, monkeypatch)
    alloc = good_alloc()
    calls = {"check_request": 0, "pages_for": 0}
    for name in calls:
        original = getattr(c2.ReqToTokenPool, name)

        def counted(self, *args, _original=original, _name=name, **kwargs):
            calls[_name] += 1
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(c2.ReqToTokenPool, name, counted)
    runner.run([(0, 0, 5), (1, 1, 6)], alloc, runner.layer.random_hidden(11, seed=9))
    assert calls == {"check_request": 2, "pages_for": 1}
