"""Bad input: refused with a ValueError naming the argument and the expected value, before anything changes.

Every case asserts the error *and* that nothing changed, bitwise: the pools (``kv_cache``,
``index_k``, ``ring``), the allocator (its free pages in order, its ``req_to_token`` table) and,
where a prefill graph runner is involved, its static buffers, its layers' pools and its graphs.
Cases with a layer run on both paths (``use_fused_gate`` True and False), cases with a graph on
both backends (the CPU emulation; CUDA graphs, skipped without CUDA: tests/graph_backends.py).
The fuzz tests draw random bad inputs with hypothesis."""

from __future__ import annotations

import c2graph as c2  # noqa: I001  (first: decides TRITON_INTERPRET before Triton is imported)

import dataclasses
import functools

import numpy as np
import pytest
import torch
from graph_backends import CUDA, EMULATE, backend, device_of, needs_triton  # noqa: F401  (backend: a fixture)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import POISON, ragged_requests

from c2graph.compressor.model import served_layers
from c2graph.measure.compare import compare_pools

CFG = c2.Config.tiny()
DEV = c2.DEFAULT_DEVICE
PATHS = [pytest.param(False, id="torch"), pytest.param(True, id="fused")]
FUZZ = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

# ---------------------------------------------------------------------------------------------
# Snapshots: everything a refused call must leave as it was, compared bit for bit.


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().cpu().contiguous().view(torch.uint8).clone()


def snapshot(*things) -> dict:
    out: dict = {}
    for i, thing in enumerate(things):
        if isinstance(thing, c2.ReqToTokenPool):
            out[f"{i} free pages"] = list(thing._free)
            out[f"{i} page_table"] = _bits(thing.page_table)
        elif isinstance(thing, c2.Pools):
            out.update({f"{i} {name}": _bits(t) for name, t in thing.tensors().items()})
        elif isinstance(thing, c2.PrefillGraphRunner):
            static = thing.static
            out.update({f"{i} static {name}": _bits(t) for name, t in static.metadata().items()})
            for j, buf in enumerate(static.layers):
                out.update({f"{i} layer {j} {name}": _bits(t) for name, t in buf.tensors().items()})
            for j, p in enumerate(thing.layer_pools):
                out.update({f"{i} pools[{j}] {name}": _bits(t) for name, t in p.tensors().items()})
            out[f"{i} graphs"] = [(bucket, id(g), g.nodes()) for bucket, g in thing.graphs.items()]
        else:
            raise TypeError(type(thing))
    return out


def changed(before: dict, after: dict) -> list[str]:
    return [k for k, v in before.items() if not (torch.equal(v, after[k]) if isinstance(v, torch.Tensor) else v == after[k])]


def assert_refused(call, match: str | None, *things, error=ValueError) -> None:
    """``call()`` raises ``error`` matching ``match`` (any message: ``None``), and none of ``things`` changed."""
    before = snapshot(*things)
    with pytest.raises(error, match=match):
        call()
    assert changed(before, snapshot(*things)) == [], "refused, yet changed"


def make_case(fused: bool, device=DEV, pool_requests=6, max_seq_len=96, seed=0):
    layer = c2.SourceLayer(CFG, seed=seed, use_fused_gate=fused, device=device)
    alloc = c2.ReqToTokenPool(CFG, pool_requests, max_seq_len, seed=seed)
    pools = c2.Pools(CFG, pool_requests, alloc.kv_slots, device=device).poison(POISON)
    return layer, alloc, pools


# ---------------------------------------------------------------------------------------------
# A batch changed by hand: both paths check it before their first write.

HAND_CHANGES = {  # (what the student changes, the words of the refusal)
    "slots past the caches": (lambda b: dict(raw_out_loc=b.raw_out_loc + 10_000, c2_slot=b.c2_slot + 5_000),
                              r"batch.c2_slot holds c2 slot \d+, past the pools; expected < pools.kv_slots"),
    "raw_out_loc alone": (lambda b: dict(raw_out_loc=torch.where(b.raw_out_loc != 0, b.raw_out_loc + 10_000, 0)),
                          r"batch.raw_out_loc holds token slot \d+, past the pools; expected < 2 \* pools.kv_slots"),
    "a negative c2 slot": (lambda b: dict(c2_slot=b.c2_slot - 1), r"batch.c2_slot holds c2 slot -1; expected values >= 0"),
    "req past the ring": (lambda b: dict(req=b.req + 6), r"batch.req holds pool index \d+, past the pools; "
                                                         r"expected < pools.pool_requests \(6\)"),
    "a negative pos": (lambda b: dict(pos=b.pos - 3), "batch.pos holds position -3; expected values >= 0"),
}


@pytest.mark.parametrize("fused", PATHS)
@pytest.mark.parametrize("change", list(HAND_CHANGES))
def test_a_batch_changed_by_hand_is_refused_before_any_write(fused, change):
    layer, alloc, pools = make_case(fused)
    batch = c2.ExtendBatch.build([(0, 1, 5), (2, 0, 4)], alloc, device=DEV)
    edit, match = HAND_CHANGES[change]
    bad = dataclasses.replace(batch, **edit(batch))
    x = layer.random_hidden(batch.num_rows, seed=1)
    assert_refused(lambda: c2.compress(layer, x, bad, pools), match, pools, alloc)
    projected = c2.project_padded(layer, x, bad, fused=False)
    assert_refused(lambda: c2.compress_torch(layer, *projected, bad, pools), match, pools, alloc)


@pytest.mark.parametrize("fused", PATHS)
@FUZZ
@given(data=st.data())
def test_fuzz_random_hand_changes_are_refused(fused, data):
    layer, alloc, pools = _fuzz_case(fused)
    requests = data.draw(ragged_requests(pool_requests=6, max_prefix=30), label="requests")
    batch = c2.ExtendBatch.build(requests, alloc, pad_to=data.draw(st.integers(0, 3)) + sum(r[2] for r in requests),
                                 device=DEV)
    name = data.draw(st.sampled_from(["pos", "req", "raw_out_loc", "c2_slot"]), label="tensor")
    bound = {"pos": None, "req": pools.pool_requests, "raw_out_loc": 2 * pools.kv_slots, "c2_slot": pools.kv_slots}[name]
    value = data.draw(st.integers(-2**40, -1) if bound is None else
                      st.one_of(st.integers(-2**40, -1), st.integers(bound, 2**40)), label="value")
    row = data.draw(st.integers(0, batch.num_rows - 1), label="row")
    tensor = getattr(batch, name).clone()
    tensor[row] = value
    bad = dataclasses.replace(batch, **{name: tensor})
    x = layer.random_hidden(batch.live_rows, seed=2)
    assert_refused(lambda: c2.compress(layer, x, bad, pools), f"batch.{name} holds", pools, alloc)


@functools.lru_cache(maxsize=None)
def _fuzz_case(fused: bool):
    return make_case(fused, max_seq_len=48)


# ---------------------------------------------------------------------------------------------
# ExtendBatch.build: every argument checked, and the pages worked out, before a page is given.


def test_build_keeps_no_page_when_the_pool_runs_out_part_way():
    alloc = make_case(False)[1]
    del alloc._free[3:]  # three free pages left: pages the rest of the engine holds
    requests = [(0, 0, 16), (1, 0, 16), (2, 0, 40)]  # 1 + 1 + 3 pages: the third request runs out
    assert_refused(lambda: c2.ExtendBatch.build(requests, alloc), "the full KV pool has 3 free pages", alloc)
    assert c2.ExtendBatch.build(requests[:2], alloc).live_rows == 32 and alloc.free_pages == 1


def test_build_checks_the_batch_against_the_pools_before_allocating():
    _, alloc, pools = make_case(True, pool_requests=6)
    small = c2.Pools(CFG, 4, alloc.kv_slots // 4)
    assert_refused(lambda: c2.ExtendBatch.build([(1, 0, 4), (5, 0, 4)], alloc, pools=[pools, small]),
                   r"pools\[1\]: batch request pool_index = 5; expected an int >= 0 and < pools.pool_requests \(4\)",
                   alloc)
    far = max(alloc.assign([(p, 0, 96)], commit=False)[0].max().item() // 2 for p in range(4))
    assert far >= small.kv_slots, "a precondition: some page lies past the small pools"
    assert_refused(lambda: c2.ExtendBatch.build([(p, 0, 96) for p in range(4)], alloc, pools=small),
                   r"batch.c2_slot holds c2 slot \d+, past the pools; expected < pools.kv_slots", alloc)


def test_build_on_a_device_this_machine_lacks_is_refused_before_allocating():
    _, alloc, _ = make_case(False)
    missing = f"cuda:{torch.cuda.device_count()}" if torch.cuda.is_available() else "cuda"
    expected = "expected a CUDA index" if torch.cuda.is_available() else "this machine has no CUDA device"
    assert_refused(lambda: c2.ExtendBatch.build([(0, 0, 4)], alloc, device=missing), f"device = '{missing}'.*{expected}",
                   alloc)
    assert_refused(lambda: c2.ExtendBatch.build([(0, 0, 4)], alloc, device="gpu"), "device = 'gpu'; expected", alloc)
    for make in (lambda: c2.Pools(CFG, 4, 64, device=missing), lambda: c2.SourceLayer(CFG, device=missing)):
        pytest.raises(ValueError, make).match(f"device = '{missing}'.*{expected}")


BUILD_REFUSALS = [  # (requests, keyword arguments, our words)
    ([(0, 0, 4)], dict(pad_to=True), r"pad_to = True; expected an int >= the 4 live rows and < 2\*\*31 .*\(a bool is not"),
    ([(0, 0, 4)], dict(pad_to=6.0), "pad_to = 6.0; expected an int"),
    ([(0, 0, 4)], dict(request_slots=True), r"request_slots = True; expected an int >= 0 \(a bool"),
    ([(0, 0, 4)], dict(request_slots=2.0), "request_slots = 2.0; expected an int >= 0"),
    ((0, 0, 4), {}, r"requests = \(0, 0, 4\) is one request; expected a list of .* such as \[\(0, 0, 4\)\]"),
    ([(0, 0)], {}, r"request 0 = \(0, 0\); expected three fields \(pool_index, prefix_len, extend_len\)"),
    ([(0, 0, 4), 7], {}, "request 1 = 7; expected three fields"),
    ("abc", {}, "requests = 'abc'; expected a list"),
    ([(0, 0, 4.5)], {}, "request 0: extend_len = 4.5; expected an int >= 0"),
    ([(True, 0, 4)], {}, r"request 0: pool_index = True; expected an int >= 0 and < pool_requests \(6\)"),
    ([(-1, 0, 4)], {}, r"request 0: pool_index = -1; expected an int >= 0 and < pool_requests \(6\)"),
]


@pytest.mark.parametrize("requests, kwargs, match", BUILD_REFUSALS)
def test_build_refuses_in_our_words(requests, kwargs, match):
    _, alloc, _ = make_case(False)
    assert_refused(lambda: c2.ExtendBatch.build(requests, alloc, **kwargs), match, alloc)


def _bad_int(least: int | None = 0, below: int | None = None, *, none_is_bad: bool = True):
    """Values an int argument must refuse: below ``least``, at or past ``below``, bools, floats, text
    (and ``None``, unless it means the default)."""
    options = [st.booleans(), st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=3),
               st.just(2.0), st.just(np.float32(3.0))] + [st.none()] * none_is_bad
    if least is not None:
        options.append(st.integers(-2**40, least - 1))
    if below is not None:
        options.append(st.integers(below, 2**40))
    return st.one_of(options)


def _corrupt(data, requests, pool_requests: int, max_seq_len: int, places=("field", "pad_to", "request_slots", "shape")):
    """One random bad argument put into a good batch: ``(requests, kwargs)``."""
    where = data.draw(st.sampled_from(places), label="where")
    requests, live = [list(r) for r in requests], sum(r[2] for r in requests)
    if where == "field":
        i, j = data.draw(st.integers(0, len(requests) - 1)), data.draw(st.integers(0, 2))
        below = (pool_requests, None, max_seq_len + 1)[j]
        requests[i][j] = data.draw(_bad_int(0, below), label="field value")
        return requests, {}
    if where == "pad_to":
        return requests, dict(pad_to=data.draw(_bad_int(live, none_is_bad=False), label="pad_to"))
    if where == "request_slots":
        return requests, dict(request_slots=data.draw(_bad_int(len(requests), none_is_bad=False), label="slots"))
    i = data.draw(st.integers(0, len(requests) - 1))
    requests[i] = (requests[i] + [0, 0])[: data.draw(st.sampled_from([0, 1, 2, 4]), label="fields")]
    return requests, {}


@FUZZ
@given(requests=ragged_requests(pool_requests=6, max_prefix=30), data=st.data())
def test_fuzz_random_bad_build_arguments_are_refused(requests, data):
    _, alloc, _ = _fuzz_case(False)
    bad, kwargs = _corrupt(data, requests, 6, alloc.max_seq_len)
    assert_refused(lambda: c2.ExtendBatch.build(bad, alloc, **kwargs), None, alloc)


# ---------------------------------------------------------------------------------------------
# The prefill graph runner: the batch checked against every layer's pools before it is built.


def _runner(backend: str, fused: bool, monkeypatch):
    """A one-layer runner (buckets 8 and 16, 2 request slots) over pools of 4 pool requests and the
    c2 slots of 4 requests of 48 tokens; its allocator has 6 of 96 tokens, so it can hand out
    what the pools cannot hold."""
    if backend == EMULATE:
        needs_triton(backend) if fused else None
        monkeypatch.setattr("c2graph.graphs.graph.default_backend", lambda: "emulate")
    dev = device_of(backend)
    layer = c2.SourceLayer(CFG, seed=3, use_fused_gate=fused, device=dev)
    pools = c2.Pools(CFG, 4, c2.ReqToTokenPool(CFG, 4, 48).kv_slots, device=dev).poison(POISON)
    runner = c2.PrefillGraphRunner(layer, pools, buckets=[8, 16], request_slots=2)
    return runner, c2.ReqToTokenPool(CFG, 6, 96, seed=3)


def _run_still_equals_eager(runner, alloc, requests, seed=0):
    """After refusals, a good batch still runs and equals eager, bitwise (``alloc``: one whose pages
    all lie inside the runner's pools)."""
    layer, pools = runner.layer, runner.pools
    ref = pools.clone()
    x = layer.random_hidden(sum(r[2] for r in requests), seed=seed)
    runner.run(requests, alloc, x)
    c2.compress(layer, x, c2.ExtendBatch.build(requests, alloc, device=runner.device), ref)
    assert all(compare_pools(pools, ref, skip_slot0=not layer.use_fused_gate))


@pytest.mark.parametrize("fused", PATHS)
@pytest.mark.parametrize("mode", ["graph", "eager"])
def test_the_runner_checks_the_batch_against_the_pools_before_allocating(backend, fused, mode, monkeypatch):
    runner, alloc = _runner(backend, fused, monkeypatch)
    kv_slots = runner.pools.kv_slots
    alloc.assign([(p, 0, 96) for p in range(4)])  # every page of pool requests 0..3, known from here on

    def chunk() -> tuple[int, int]:
        """A pool index and a page-aligned start whose 14 tokens lie past the pools' c2 slots."""
        return next((p, 16 * k) for p in range(4) for k in range(6)
                    if alloc.page_table[p, k].item() * CFG.page_size // 2 >= kv_slots)

    far = chunk()
    extra = [(p, 0, 3) for p in range(4) if p != far[0]][:2] if mode == "eager" else []  # 3 requests > 2 slots
    refusals = (([(5, 0, 6)] + extra, r"pool_index = 5; expected an int >= 0 and < pools.pool_requests \(4\)"),
                ([(*far, 14)] + extra, r"batch.c2_slot holds c2 slot \d+, past the pools; expected < pools.kv_slots"))
    for requests, match in refusals:
        x = runner.layer.random_hidden(sum(r[2] for r in requests), seed=1)
        assert_refused(lambda: runner.run(requests, alloc, x), match, runner, alloc)
    _run_still_equals_eager(runner, c2.ReqToTokenPool(CFG, 4, 48, seed=7), [(far[0], 3, 5)] + extra)


@pytest.mark.parametrize("fused", PATHS)
def test_the_runner_keeps_no_page_when_the_pool_runs_out(backend, fused, monkeypatch):
    runner, alloc = _runner(backend, fused, monkeypatch)
    del alloc._free[1:]
    x = runner.layer.random_hidden(12, seed=2)
    assert_refused(lambda: runner.run([(0, 0, 6), (1, 0, 6)], alloc, x), "the full KV pool has 1 free pages",
                   runner, alloc)


RUN_REFUSALS = [  # (requests, xs rows, keyword arguments, our words)
    ([(0, 0, 6)], 6, dict(pad_to=True), r"pad_to = True; expected an int >= the batch's 6 live rows \(a bool"),
    ([(0, 0, 6)], 6, dict(pad_to=12.0), "pad_to = 12.0; expected an int >= the batch's 6 live rows"),
    ([(0, 0, 6)], 6, dict(pad_to=4), "pad_to = 4; expected an int >= the batch's 6 live rows"),
    ((0, 0, 6), 6, {}, r"requests = \(0, 0, 6\) is one request"),
    ([(0, 6)], 6, {}, r"request 0 = \(0, 6\); expected three fields"),
    ([(0, 0, 6)], 5, {}, "x has 5 rows; expected the batch's 6 live rows"),
]


@pytest.mark.parametrize("fused", PATHS)
def test_the_runner_refuses_in_our_words(backend, fused, monkeypatch):
    runner, alloc = _runner(backend, fused, monkeypatch)
    for requests, rows, kwargs, match in RUN_REFUSALS:
        x = runner.layer.random_hidden(rows, seed=4)
        assert_refused(lambda: runner.run(requests, alloc, x, **kwargs), match, runner, alloc)


_RUNNERS: dict = {}


@pytest.mark.parametrize("fused", PATHS)
@FUZZ
@given(requests=ragged_requests(pool_requests=4, max_requests=2, max_prefix=30, max_len=7), data=st.data())
def test_fuzz_random_bad_runs_are_refused(backend, fused, monkeypatch, requests, data):
    if (backend, fused) not in _RUNNERS:  # one runner per backend and path for every example: captured once
        _RUNNERS[backend, fused] = _runner(backend, fused, monkeypatch)
    runner, alloc = _RUNNERS[backend, fused]
    bad, kwargs = _corrupt(data, requests, 4, alloc.max_seq_len, places=("field", "pad_to", "shape"))
    live = sum(r[2] for r in requests)
    x = runner.layer.random_hidden(live, seed=5)
    assert_refused(lambda: runner.run(bad, alloc, x, **kwargs), None, runner, alloc)


@pytest.mark.parametrize("fused", PATHS)
def test_one_pools_given_to_two_layers_is_refused(backend, fused, monkeypatch):
    if backend == EMULATE:
        monkeypatch.setattr("c2graph.graphs.graph.default_backend", lambda: "emulate")
    dev = device_of(backend)
    layers = served_layers(CFG, 2, unfused_every=None if fused else 1, device=dev)
    pools = c2.Pools(CFG, 4, 200, device=dev).poison(POISON)
    assert_refused(lambda: c2.PrefillGraphRunner(layers, [pools, pools], buckets=[8], request_slots=2),
                   r"pools\[1\].kv_cache is pools\[0\].kv_cache; expected one Pools per layer", pools)
    other = c2.Pools(CFG, 4, 200, device=dev).poison(POISON)
    other.ring = pools.ring  # two Pools sharing one ring
    assert_refused(lambda: c2.PrefillGraphRunner(layers, [pools, other], buckets=[8], request_slots=2),
                   r"pools\[1\].ring is pools\[0\].ring", pools, other)


# ---------------------------------------------------------------------------------------------
# The small pieces: the allocator, the offsets, the Config, and numpy integers everywhere.


@pytest.mark.parametrize("bad", [-1, 6, True, 1.0, "0", None])
def test_free_refuses_a_pool_index_outside_the_pool(bad):
    _, alloc, _ = make_case(False)
    c2.ExtendBatch.build([(5, 0, 20), (0, 0, 3)], alloc)
    assert_refused(lambda: alloc.free(bad), rf"pool_index = {bad!r}; expected an int >= 0 and < pool_requests \(6\)",
                   alloc)


@pytest.mark.parametrize("counts, slots, match", [
    ([-3, 5], 4, r"counts\[0\] = -3; expected an int >= 0"),
    ([2.5, 3], 4, r"counts\[0\] = 2.5; expected an int >= 0"),
    ([2, True], 4, r"counts\[1\] = True; expected an int >= 0"),
    ([2, 3], 1.0, "request_slots = 1.0; expected an int >= 0"),
    ([2, 3], 1, "the batch has 2 requests but request_slots = 1"),
    (5, 4, "counts = 5; expected a sequence of row counts"),
])
def test_build_extend_offsets_refuses_negative_and_fractional_counts(counts, slots, match):
    with pytest.raises(ValueError, match=match):
        c2.build_extend_offsets(counts, slots)


EPS_WORDS = r"expected a finite number >= 1.18e-38 and <= 3.4e\+38 \(float32 holds it\)"
THETA_WORDS = r"expected a finite number >= 1 and <= 3.4e\+38 \(float32 holds it\) \(RoPE's base"


@pytest.mark.parametrize("kw, match", [
    (dict(eps=float("nan")), f"Config.eps = nan; {EPS_WORDS}"),
    (dict(eps=-1.0), f"Config.eps = -1.0; {EPS_WORDS}"),
    (dict(eps=0.0), f"Config.eps = 0.0; {EPS_WORDS}"),
    (dict(eps=True), f"Config.eps = True; {EPS_WORDS}"),
    (dict(eps=1e-300), f"Config.eps = 1e-300; {EPS_WORDS}"),  # 0 in float32: an all-zero row normalises to NaN
    (dict(eps=1e300), f"Config.eps = 1e\\+300; {EPS_WORDS}"),
    (dict(rope_theta=0), f"Config.rope_theta = 0; {THETA_WORDS}"),
    (dict(rope_theta=float("inf")), f"Config.rope_theta = inf; {THETA_WORDS}"),
    (dict(rope_theta=1e-300), f"Config.rope_theta = 1e-300; {THETA_WORDS}"),  # 0 in float32: inf frequencies
    (dict(rope_theta=0.5), f"Config.rope_theta = 0.5; {THETA_WORDS}"),  # frequencies that grow past float32
    (dict(hidden=True), r"Config.hidden = True; expected an int >= 1 \(a bool"),
    (dict(hidden=64.0), "Config.hidden = 64.0; expected an int >= 1"),
    (dict(ring_size=1), r"Config.ring_size = 1; expected an int >= 2 and < 1025"),
    (dict(ring_size=2**40), r"Config.ring_size = 1099511627776; expected an int >= 2 and < 1025"),
])
def test_config_refuses_values_that_give_nan_caches(kw, match):
    with pytest.raises(ValueError, match=match):
        c2.Config.tiny(**kw)


def test_numpy_integers_are_ints_everywhere(monkeypatch):
    """What ``operator.index`` accepts is an int: the same results as with Python ints."""
    i = np.int64
    cfg = c2.Config(hidden=i(64), D=i(32), rope_dim=np.int32(8), index_dim=i(16), page_size=i(16), eps=np.float32(1e-6))
    assert cfg == c2.Config.tiny(eps=float(np.float32(1e-6))) and type(cfg.hidden) is int
    plain, numpy = c2.ReqToTokenPool(CFG, 4, 64, seed=1), c2.ReqToTokenPool(CFG, i(4), i(64), seed=i(1))
    a = c2.ExtendBatch.build([(0, 1, 5), (2, 0, 4)], plain, request_slots=3, pad_to=12)
    b = c2.ExtendBatch.build([(i(0), i(1), i(5)), np.array([2, 0, 4])], numpy, request_slots=i(3), pad_to=i(12))
    assert a.requests == b.requests and all(type(v) is int for r in b.requests for v in r)
    assert all(torch.equal(getattr(a, n), getattr(b, n)) for n in ("pos", "req", "raw_out_loc", "c2_slot", "extend_offsets"))
    assert torch.equal(c2.build_extend_offsets([i(3), i(4)], i(3)), c2.build_extend_offsets([3, 4], 3))
    assert b.plan(i(2)).stored_slots == a.plan(2).stored_slots
    numpy.free(i(2))
    assert numpy.page_table[2].eq(0).all()
    pools = c2.Pools(CFG, i(4), i(numpy.kv_slots))
    monkeypatch.setattr("c2graph.graphs.graph.default_backend", lambda: "emulate")
    layer = c2.SourceLayer(CFG, use_fused_gate=False, device="cpu")
    runner = c2.PrefillGraphRunner(layer, c2.Pools(CFG, 4, numpy.kv_slots, device="cpu"), buckets=[i(8)],
                                   request_slots=i(2))
    step = runner.run([(i(1), i(0), i(5))], numpy, layer.random_hidden(5, seed=0), pad_to=i(8))
    assert (step.mode, step.bucket) == ("graph", 8) and pools.kv_slots == numpy.kv_slots
    assert len(served_layers(CFG, i(2), unfused_every=i(2))) == 2


# ---------------------------------------------------------------------------------------------
# A batch changed in place, and offsets that are well formed but wrong: random, on both paths.


@pytest.mark.parametrize("fused", PATHS)
@FUZZ
@given(data=st.data())
def test_fuzz_batches_changed_in_place_are_refused_or_stay_inside(fused, data):
    """A built batch, one value of one tensor changed in place (its extents, counted when it was
    made, are stale): ``validate=True`` refuses it and nothing changes; ``validate=False`` (a
    capture's call, reading no value) writes only inside the caches and the ring."""
    layer, alloc, pools = _fuzz_case(fused)
    requests = data.draw(ragged_requests(pool_requests=6, max_prefix=30), label="requests")
    batch = c2.ExtendBatch.build(requests, alloc, pad_to=data.draw(st.integers(0, 3)) + sum(r[2] for r in requests),
                                 request_slots=len(requests) + data.draw(st.integers(0, 2)), device=DEV)
    name = data.draw(st.sampled_from(["pos", "req", "raw_out_loc", "c2_slot", "extend_offsets"]), label="tensor")
    tensor = getattr(batch, name)
    index = (data.draw(st.integers(0, 1)), data.draw(st.integers(0, batch.request_slots - 1))) \
        if name == "extend_offsets" else data.draw(st.integers(0, batch.num_rows - 1))
    value = data.draw(st.integers(-2**31, 2**31 - 1) if name == "extend_offsets" else
                      st.one_of(st.integers(-2**40, 2**40), st.integers(-3, 2 * pools.kv_slots)), label="value")
    if tensor[index].item() == value:
        return
    tensor[index] = value
    x = layer.random_hidden(batch.live_rows, seed=3)
    projected = c2.project_padded(layer, x, batch, fused=True)
    def run(target, validate):
        if fused:
            return c2.compress_fused(layer, projected, batch, target, validate=validate)
        return c2.compress_torch(layer, *c2.split_projected(projected), batch, target, validate=validate)

    try:
        batch.check(pools)
    except ValueError:
        assert_refused(lambda: run(pools, True), None, pools, alloc)
    else:  # still a batch that says one thing (a request made all padding, as the dummy batch is)
        latent = run(pools.clone(), True)
        assert [r for r in range(batch.num_rows) if not latent[r].isnan().all()] == batch.plan(2).group_rows
    scratch = pools.clone()
    kept = {n: t.clone() for n, t in scratch.tensors().items()}
    big = {n: torch.cat([t[:1] * 0 + 7, t, t[:1] * 0 + 7]) for n, t in kept.items()}  # a guard row each side
    for n, t in big.items():
        setattr(scratch, n, t[1:-1])
    run(scratch, False)
    for n, t in big.items():
        assert (t[0] == 7).all() and (t[-1] == 7).all(), f"a write landed outside pools.{n}"


@pytest.mark.parametrize("fused", PATHS)
@FUZZ
@given(requests=ragged_requests(pool_requests=6, max_prefix=30), data=st.data())
def test_fuzz_well_formed_offsets_that_contradict_the_rows_are_refused(fused, requests, data):
    """Offsets of another split of the same rows (disjoint, ordered, inside the buffer) are refused
    with ``validate=True``, before anything changes: they would send the fused path to the wrong
    slots."""
    layer, alloc, pools = _fuzz_case(fused)
    batch = c2.ExtendBatch.build(requests, alloc, request_slots=len(requests) + 1, device=DEV)
    counts = data.draw(st.lists(st.integers(0, batch.num_rows), min_size=1, max_size=batch.request_slots)
                       .filter(lambda c: sum(c) <= batch.num_rows), label="counts")
    other = c2.build_extend_offsets(counts, batch.request_slots, device=DEV)
    if torch.equal(other, batch.extend_offsets):
        return
    bad = dataclasses.replace(batch, extend_offsets=other)
    x = layer.random_hidden(batch.live_rows, seed=4)
    assert_refused(lambda: c2.compress(layer, x, bad, pools), r"batch.extend_offsets\[:, \d+\] = ", pools, alloc)
