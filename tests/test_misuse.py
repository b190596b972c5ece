"""Misuse, as a hostile caller tries it: every public entry point of the compressor refuses in its
own words (a ``ValueError`` naming the argument) with nothing changed, or gives the right result.

Each case snapshots, bit for bit, every pool, allocator and layer before and after. Generated
misuse (hypothesis) draws a change to one argument of a path (an output that is expanded, requires
grad, is an inference tensor, a view of a weight, a cache or another pool; a tensor of another
dtype, length or layout; a layer changed after it was made) and holds the call to that rule; the
harmless ones must give what the same path gives on untouched arguments. The allocator is driven
from threads, and interrupted at every line of its changes."""

from __future__ import annotations

import c2graph as c2  # noqa: I001  (first: decides TRITON_INTERPRET before Triton is imported)

import dataclasses
import re
import sys
import threading

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import POISON, ragged_requests

from c2graph.compressor.arguments import device_bytes
from c2graph.compressor.model import check_layers_and_pools, layer_pools, served_layers
from c2graph.compressor.req_to_token import ReqToTokenPool

CFG = c2.Config.tiny()
DEV = c2.DEFAULT_DEVICE
PATHS = [pytest.param(False, id="torch"), pytest.param(True, id="fused")]
CACHE_BYTES = 2 * (CFG.D + CFG.index_dim)  # a c2 slot of both caches
MISUSE = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

# ---------------------------------------------------------------------------------------------
# Snapshots of everything a call may change, bit for bit.


def _bits(t: torch.Tensor) -> tuple:
    with torch.inference_mode(False):
        return (t.requires_grad, t.is_inference(), tuple(t.shape), t.stride(), t.dtype,
                t.detach().cpu().contiguous().view(torch.uint8).clone())


def snapshot(*things) -> dict:
    out: dict = {}
    for i, thing in enumerate(things):
        if isinstance(thing, ReqToTokenPool):
            out[f"{i} free pages"] = list(thing._free)
            out[f"{i} page_table"] = _bits(thing.page_table)
        elif isinstance(thing, c2.Pools):
            out.update({f"{i} pools.{name}": _bits(t) for name, t in thing.tensors().items()})
        elif isinstance(thing, c2.SourceLayer):
            for name in ("wkv", "wgate", "norm_w", "wk", "k_norm_w", "inv_freq"):
                t = getattr(thing, name)
                out[f"{i} layer.{name}"] = _bits(t) if isinstance(t, torch.Tensor) else repr(t)
            out[f"{i} layer.use_fused_gate"] = thing.use_fused_gate
        else:
            raise TypeError(type(thing))
    return out


def same(a, b) -> bool:
    if isinstance(a, tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b


def changed(before: dict, after: dict) -> list[str]:
    return [k for k, v in before.items() if not same(v, after[k])]


def refused_cleanly(call, names: str, *things) -> str:
    """``call()`` raises ``ValueError`` or ``TypeError`` whose message names one of ``names`` (a regex),
    and none of ``things`` changed. Returns the message."""
    before = snapshot(*things)
    with pytest.raises((ValueError, TypeError)) as info:
        call()
    assert re.search(names, str(info.value)), f"refused, but not naming {names}: {info.value}"
    assert changed(before, snapshot(*things)) == [], f"refused ({info.value}), yet changed"
    return str(info.value)


# ---------------------------------------------------------------------------------------------
# One call of a path, its arguments as a dict a misuse may change.


class Call:
    """A layer, an allocator, poisoned pools, a built batch and the projection of its rows."""

    def __init__(self, fused: bool, requests, pad: int = 0, seed: int = 0):
        self.fused = fused
        self.layer = c2.SourceLayer(CFG, seed=seed, use_fused_gate=fused, device=DEV)
        self.alloc = c2.ReqToTokenPool(CFG, 6, 96, seed=seed)
        self.pools = c2.Pools(CFG, 6, self.alloc.kv_slots, device=DEV).poison(POISON)
        live = sum(r[2] for r in requests)
        self.batch = c2.ExtendBatch.build(requests, self.alloc, pad_to=live + pad, device=DEV)
        x = self.layer.random_hidden(live, seed=seed + 1)
        self.projected = c2.project_padded(self.layer, x, self.batch, fused=True)
        self.latent_out = torch.full((self.batch.num_rows, CFG.D), float("nan"), dtype=torch.bfloat16, device=DEV)
        self.validate = True

    @property
    def T(self) -> int:
        return self.batch.num_rows

    def run(self):
        if self.fused:
            return c2.compress_fused(self.layer, self.projected, self.batch, self.pools, latent_out=self.latent_out,
                                     validate=self.validate)
        kv, score = c2.split_projected(self.projected) if isinstance(self.projected, torch.Tensor) else self.projected
        return c2.compress_torch(self.layer, kv, score, self.batch, self.pools, latent_out=self.latent_out,
                                 validate=self.validate)


def _inference_copy(t: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return t.clone()


def _over_wkv(c: Call) -> torch.Tensor:
    """A ``[T, D]`` bf16 view over the layer's ``wkv`` (``[D, hidden]``: room for 64 rows)."""
    return c.layer.wkv.view(-1)[: c.T * CFG.D].view(c.T, CFG.D)


def _over_wk(c: Call) -> torch.Tensor:
    """A ``[T, D]`` bf16 view whose first rows are the layer's ``wk`` (moved into a larger buffer,
    same values)."""
    wk = c.layer.wk
    memory = torch.empty(max(c.T * CFG.D, wk.numel()), dtype=torch.bfloat16)
    memory[: wk.numel()] = wk.flatten()
    c.layer.wk = memory[: wk.numel()].view(wk.shape)
    return memory[: c.T * CFG.D].view(c.T, CFG.D)


# name -> (what it changes, the argument a refusal names; None: a harmless change, the right result)
MISUSES = {
    "latent_out expanded": (lambda c: setattr(c, "latent_out", c.latent_out[:1].expand(c.T, CFG.D)), "latent_out"),
    "latent_out a leaf that requires grad": (lambda c: c.latent_out.requires_grad_(), "latent_out"),
    "latent_out needs grad": (lambda c: setattr(c, "latent_out", c.latent_out.float().requires_grad_().bfloat16()),
                              "latent_out"),
    "latent_out an inference tensor": (lambda c: setattr(c, "latent_out", _inference_copy(c.latent_out)), "latent_out"),
    "latent_out transposed": (lambda c: setattr(c, "latent_out", torch.empty(CFG.D, c.T, dtype=torch.bfloat16).t()),
                              "latent_out"),
    "latent_out fp32": (lambda c: setattr(c, "latent_out", c.latent_out.float()), "latent_out"),
    "latent_out over layer.wkv": (lambda c: setattr(c, "latent_out", _over_wkv(c)), "latent_out.*layer.wkv"),
    "latent_out over layer.wk": (lambda c: setattr(c, "latent_out", _over_wk(c)), "latent_out.*layer.wk"),
    "latent_out over the ring": (lambda c: setattr(c, "latent_out", c.pools.ring.view(torch.bfloat16)[-c.T:, :CFG.D]),
                                 "latent_out|pools.ring"),
    "kv_cache requires grad": (lambda c: c.pools.kv_cache.requires_grad_(), "pools.kv_cache"),
    "ring an inference tensor": (lambda c: setattr(c.pools, "ring", _inference_copy(c.pools.ring)), "pools.ring"),
    "ring expanded": (lambda c: setattr(c.pools, "ring", c.pools.ring[:1].expand_as(c.pools.ring)), "pools.ring"),
    "index_k over kv_cache": (lambda c: setattr(c.pools, "index_k", c.pools.kv_cache.view(-1)[
        : c.pools.kv_slots * CFG.index_dim].view(c.pools.kv_slots, CFG.index_dim)), "pools.kv_cache|pools.index_k"),
    "index_k a column slice": (lambda c: setattr(c.pools, "index_k", c.pools.kv_cache[:, : CFG.index_dim]),
                               "pools.index_k"),
    "kv_cache fp32": (lambda c: setattr(c.pools, "kv_cache", c.pools.kv_cache.float()), "pools.kv_cache"),
    "inv_freq of another length": (lambda c: setattr(c.layer, "inv_freq", c.layer.inv_freq[:-1].clone()),
                                   "layer.inv_freq"),
    "wk fp32": (lambda c: setattr(c.layer, "wk", c.layer.wk.float()), "layer.wk"),
    "norm_w requires grad": (lambda c: c.layer.norm_w.requires_grad_(), "layer.norm_w"),
    "k_norm_w a row longer": (lambda c: setattr(c.layer, "k_norm_w", torch.cat([c.layer.k_norm_w] * 2)),
                              "layer.k_norm_w"),
    "the projection requires grad": (lambda c: c.projected.requires_grad_(), "projected|kv|score"),
    # (a ring of fewer rows than the batch gives a projection of the wrong shape: refused naming it)
    "the projection over the ring": (lambda c: setattr(c, "projected", c.pools.ring[: c.T]), "pools.ring|projected|kv"),
    "the projection fp64": (lambda c: setattr(c, "projected", c.projected.double()), "projected|kv|score"),
    "batch.pos int32": (lambda c: setattr(c, "batch", dataclasses.replace(c.batch, pos=c.batch.pos.int())),
                        "batch.pos"),
    "batch.req float": (lambda c: setattr(c, "batch", dataclasses.replace(c.batch, req=c.batch.req.double())),
                        "batch.req"),
    "extend_offsets int64": (lambda c: setattr(c, "batch", dataclasses.replace(
        c.batch, extend_offsets=c.batch.extend_offsets.long())), "batch.extend_offsets"),
    "requests not three fields": (lambda c: dataclasses.replace(c.batch, requests=[(0, 1)]), "request 0"),
    # harmless: the right result
    "no latent_out": (lambda c: setattr(c, "latent_out", None), None),
    "validate=False": (lambda c: setattr(c, "validate", False), None),
    "a copy of the projection": (lambda c: setattr(c, "projected", c.projected.clone()), None),
    "wkv and wgate written in place": (lambda c: [w.mul_(-1.0) for w in (c.layer.wkv, c.layer.wgate)], None),
}


def check_misuse(fused: bool, name: str, requests, pad: int) -> None:
    change, names = MISUSES[name]
    call, clean = Call(fused, requests, pad), Call(fused, requests, pad)
    if names is None:
        change(call)
        got = call.run()
        clean.run()
        for t in ("kv_cache", "index_k", "ring"):
            assert torch.equal(getattr(call.pools, t), getattr(clean.pools, t)), f"{name}: pools.{t} differs"
        assert torch.equal(got.isnan(), clean.latent_out.isnan())
        assert torch.equal(got.nan_to_num(), clean.latent_out.nan_to_num()), f"{name}: the latents differ"
        return
    things = (call.pools, call.alloc, call.layer)
    before = snapshot(*things)
    try:
        change(call)
    except (ValueError, TypeError) as e:  # refused as it was made (a batch's fields are checked then)
        assert re.search(names, str(e)), str(e)
        assert changed(before, snapshot(*things)) == []
        return
    refused_cleanly(call.run, names, *things)


@pytest.mark.parametrize("fused", PATHS)
@pytest.mark.parametrize("name", sorted(MISUSES))
def test_each_misuse_is_refused_cleanly_or_right(fused, name):
    check_misuse(fused, name, [(0, 1, 5), (2, 0, 4)], pad=2)


@pytest.mark.parametrize("fused", PATHS)
@MISUSE
@given(data=st.data())
def test_generated_misuse_is_refused_cleanly_or_right(fused, data):
    requests = data.draw(ragged_requests(pool_requests=6, max_prefix=30, max_len=7), label="requests")
    name = data.draw(st.sampled_from(sorted(MISUSES)), label="misuse")
    check_misuse(fused, name, requests, pad=data.draw(st.integers(0, 3), label="pad"))


# ---------------------------------------------------------------------------------------------
# A layer changed after it was made.


def test_weights_written_in_place_reach_the_fused_projection():
    layer = c2.SourceLayer(CFG, seed=3)
    x = layer.random_hidden(7, seed=4)
    c2.project_fused(layer, x)  # wkv_gate derived once
    with torch.no_grad():
        layer.wkv.copy_(torch.randn_like(layer.wkv.float()).bfloat16())
        layer.wgate.mul_(2.0)
    kv, score = c2.project(layer, x)
    assert torch.equal(c2.project_fused(layer, x), torch.cat([kv, score], dim=1))
    layer.wgate = layer.wgate.clone() * 0.5  # rebound
    kv, score = c2.project(layer, x)
    assert torch.equal(c2.project_fused(layer, x), torch.cat([kv, score], dim=1))


def test_derived_and_fixed_fields_are_refused_when_set_or_written():
    layer = c2.SourceLayer(CFG, seed=3)
    before = snapshot(layer)
    refused_cleanly(lambda: setattr(layer, "use_fused_gate", False), "layer.use_fused_gate", layer)
    refused_cleanly(lambda: setattr(layer, "wkv_gate", layer.wkv_gate.clone()), "layer.wkv_gate", layer)
    layer.wkv_gate.zero_()
    refused_cleanly(lambda: c2.project_fused(layer, layer.random_hidden(3, seed=1)), "layer.wkv_gate", layer)
    assert changed(before, snapshot(layer)) == [] and layer.use_fused_gate


@pytest.mark.parametrize("what", ["wkv rebound to fp32", "wgate of another shape", "wkv requires grad"])
def test_a_projection_weight_changed_is_refused(what):
    layer = c2.SourceLayer(CFG, seed=3)
    change, names = {
        "wkv rebound to fp32": (lambda: setattr(layer, "wkv", layer.wkv.float()), "layer.wkv"),
        "wgate of another shape": (lambda: setattr(layer, "wgate", layer.wgate[:-1]), "layer.wgate"),
        "wkv requires grad": (lambda: layer.wkv.requires_grad_(), "layer.wkv"),
    }[what]
    change()
    x = layer.random_hidden(3, seed=1)
    for project in (c2.project, c2.project_fused):
        refused_cleanly(lambda: project(layer, x), names, layer)


def test_project_fused_refuses_an_out_over_its_input_or_expanded():
    layer = c2.SourceLayer(CFG, seed=3)
    x = layer.random_hidden(4, seed=1)
    wide = torch.zeros(4, 2 * CFG.D)
    refused_cleanly(lambda: c2.project_fused(layer, x, out=wide[:1].expand(4, 2 * CFG.D)), "out", layer)
    refused_cleanly(lambda: c2.project_fused(layer, x, out=wide.requires_grad_()), "out", layer)
    over_x = x.view(-1).view(torch.float32)[: 2 * 2 * CFG.D].view(2, 2 * CFG.D)
    refused_cleanly(lambda: c2.project_fused(layer, x[:2], out=over_x), "out shares memory with x", layer)


def test_a_layer_and_pools_made_under_inference_mode_work_outside_it():
    with torch.inference_mode():
        layer = c2.SourceLayer(CFG, seed=2, use_fused_gate=False)
        alloc = c2.ReqToTokenPool(CFG, 4, 64)
        pools = c2.Pools(CFG, 4, alloc.kv_slots)
    batch = c2.ExtendBatch.build([(0, 0, 5), (1, 3, 4)], alloc)
    x = layer.random_hidden(batch.live_rows, seed=3)
    c2.compress(layer, x, batch, pools)
    alloc.free(0)
    with torch.inference_mode():  # and the other way round
        c2.ExtendBatch.build([(0, 0, 2)], alloc)
        alloc.free(1)
    c2.ExtendBatch.build([(1, 0, 2)], alloc)
    fused = c2.SourceLayer(CFG, seed=2)
    with torch.inference_mode():  # the paths inside inference mode, on pools made outside it
        batch = c2.ExtendBatch.build([(2, 1, 6)], alloc)
        for layer_ in (layer, fused):
            c2.compress(layer_, layer_.random_hidden(batch.live_rows, seed=5), batch, pools)


# ---------------------------------------------------------------------------------------------
# Pools that share memory, sizes the package cannot serve.


def test_pools_that_alias_through_views_are_refused():
    layers = served_layers(CFG, 2, unfused_every=None)
    first = c2.Pools(CFG, 4, 100)
    views = c2.Pools(CFG, 4, 100)
    for name, t in first.tensors().items():
        setattr(views, name, t[:])
    refused_cleanly(lambda: check_layers_and_pools(layers, [first, views]), r"pools\[[01]\]", first, views)
    views.kv_cache = torch.zeros_like(first.kv_cache)
    views.ring = first.ring.view(-1).view(first.ring.shape)  # another view, of one memory
    refused_cleanly(lambda: check_layers_and_pools(layers, [first, views]), r"pools\[[01]\]\.(ring|index_k)",
                    first, views)
    over_weight = c2.Pools(CFG, 4, 100)
    over_weight.index_k = layers[0].wkv.view(-1)[: 100 * CFG.index_dim].view(100, CFG.index_dim)
    refused_cleanly(lambda: check_layers_and_pools(layers, [first, over_weight]), r"layers\[0\]\.wkv", first)


@pytest.mark.parametrize("call, names", [
    (lambda: c2.Pools(CFG, 4, 2**62), "kv_slots = 4611686018427387904"),
    (lambda: c2.Pools(CFG, 2**60, 64), "pool_requests = 1152921504606846976"),
    (lambda: c2.ReqToTokenPool(CFG, 2**40, 64), "pool_requests = 1099511627776"),
    (lambda: c2.ReqToTokenPool(CFG, 4, 2**60), "max_seq_len = 1152921504606846976"),
    (lambda: c2.SourceLayer(c2.Config.tiny(D=2**40)), "cfg.D = 1099511627776"),
    (lambda: c2.SourceLayer(c2.Config.tiny(hidden=2**40)), "cfg.hidden = 1099511627776"),
    (lambda: c2.Pools(c2.Config.tiny(D=2**40), 4, 64), "kv_slots = 64"),
    (lambda: c2.new_ring(2**60, 2, 32), "pool_requests = 1152921504606846976"),
    (lambda: layer_pools(served_layers(CFG, 2), 4, 2**40), "kv_slots = 1099511627776"),
    # one pools fits, two do not: refused before the first is allocated
    (lambda: layer_pools(served_layers(CFG, 2), 4, int(0.6 * device_bytes(torch.device("cpu")) / CACHE_BYTES)),
     "2 pools: the caches"),
], ids=["kv_slots", "pool_requests", "allocator requests", "max_seq_len", "D", "hidden", "D in pools", "ring",
        "many pools", "two pools"])
def test_sizes_the_package_cannot_serve_are_refused_before_allocating(call, names):
    message = refused_cleanly(call, names)
    assert "needs more memory than this device can allocate" in message


# ---------------------------------------------------------------------------------------------
# The allocator: atomic, and safe under threads.


def owned_pages(alloc: ReqToTokenPool) -> list[int]:
    return [p for p in alloc.page_table.flatten().tolist() if p]


def assert_every_page_once(alloc: ReqToTokenPool) -> None:
    pages = owned_pages(alloc) + list(alloc._free)
    assert sorted(pages) == list(range(1, alloc.num_pages)), "a page lost, or held twice"


def test_threads_building_at_once_never_share_a_page():
    alloc = c2.ReqToTokenPool(CFG, 16, 256, seed=1)
    start, batches = threading.Barrier(8), {}

    def build(i: int) -> None:
        start.wait()
        for k in range(2):
            batches[i, k] = c2.ExtendBatch.build([(2 * i + k, 0, 40)], alloc)

    threads = [threading.Thread(target=build, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    slots = torch.cat([b.raw_out_loc for b in batches.values()])
    assert len(batches) == 16 and slots.unique().numel() == slots.numel(), "two requests share a token slot"
    assert_every_page_once(alloc)


def test_pages_worked_out_before_a_change_are_refused():
    alloc = c2.ReqToTokenPool(CFG, 4, 64)
    a, b = alloc.pages_for([(0, 0, 20)]), alloc.pages_for([(1, 0, 20)])
    alloc.take(a)
    refused_cleanly(lambda: alloc.take(b), "pages were worked out before this allocator last changed", alloc)
    refused_cleanly(lambda: alloc.take(a), "pages were worked out before", alloc)
    assert_every_page_once(alloc)


class Interrupt:
    """A tracer that raises ``KeyboardInterrupt`` at the ``at``-th line run inside the allocator's
    module (as a signal would, between two lines), counting the lines it saw."""

    def __init__(self, at: int):
        self.at, self.seen = at, 0

    def __call__(self, frame, event, arg):
        if frame.f_code.co_filename.endswith("req_to_token.py"):
            if event == "line":
                self.seen += 1
                if self.seen == self.at:
                    raise KeyboardInterrupt
            return self
        return None


def interrupted(call, at: int) -> tuple[bool, int]:
    """Run ``call`` with a ``KeyboardInterrupt`` at its ``at``-th line: (whether it was interrupted,
    lines seen)."""
    tracer = Interrupt(at)
    sys.settrace(tracer)
    try:
        call()
        hit = False
    except KeyboardInterrupt:
        hit = True
    finally:
        sys.settrace(None)
    return hit, tracer.seen


@pytest.mark.parametrize("step", ["build", "free"])
def test_an_interrupt_at_any_line_leaves_the_allocator_as_before_or_as_after(step):
    def fresh():
        alloc = c2.ReqToTokenPool(CFG, 4, 64, seed=2)
        c2.ExtendBatch.build([(0, 0, 20), (1, 5, 9)], alloc)
        return alloc

    def act(alloc):
        if step == "build":
            c2.ExtendBatch.build([(2, 0, 33), (0, 20, 7)], alloc)
        else:
            alloc.free(0)

    done = fresh()
    act(done)
    after = snapshot(done)
    at, hit = 1, True
    while hit:
        alloc = fresh()
        before = snapshot(alloc)
        hit, _ = interrupted(lambda: act(alloc), at)
        now = snapshot(alloc)
        assert changed(before, now) == [] or changed(after, now) == [], f"half done when interrupted at line {at}"
        assert_every_page_once(alloc)
        if hit and changed(before, now) == []:
            act(alloc)  # an interrupted step can be done again
            assert changed(after, snapshot(alloc)) == []
        at += 1
    assert at > 10, "the tracer saw too few lines to have tried the commit"


@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_generated_allocator_sequences_keep_every_page_once(data):
    alloc = c2.ReqToTokenPool(CFG, 4, 48, seed=data.draw(st.integers(0, 9), label="seed"))
    for _ in range(data.draw(st.integers(1, 8), label="steps")):
        op = data.draw(st.sampled_from(["build", "free", "interrupted build", "bad request"]), label="op")
        before = snapshot(alloc)
        if op == "free":
            alloc.free(data.draw(st.integers(0, 3)))
        elif op == "bad request":
            refused_cleanly(lambda: alloc.assign([(data.draw(st.integers(4, 9)), 0, 3)]), "pool_index", alloc)
        else:
            requests = data.draw(ragged_requests(pool_requests=4, max_requests=3, max_prefix=24, max_len=24))
            requests = [r for r in requests if r[1] + r[2] <= 48]
            call = (lambda: c2.ExtendBatch.build(requests, alloc))
            try:
                if op == "build":
                    call()
                else:
                    interrupted(call, data.draw(st.integers(1, 200), label="at"))
            except ValueError as e:  # the pool ran out: nothing given
                assert "free pages" in str(e) and changed(before, snapshot(alloc)) == []
        assert_every_page_once(alloc)


# ---------------------------------------------------------------------------------------------
# ExtendBatch.check: the whole-tensor look at a right batch says what the rules row by row say.


def _verdict(batch, pools) -> str | None:
    try:
        batch.check(pools)
    except ValueError as e:
        return str(e)
    return None


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_the_quick_look_at_a_batch_agrees_with_the_rules_row_by_row(data):
    import c2graph.compressor.batch as batch_module

    alloc = c2.ReqToTokenPool(CFG, 6, 96, seed=1)
    pools = c2.Pools(CFG, 6, alloc.kv_slots)
    requests = data.draw(ragged_requests(pool_requests=6, max_prefix=30), label="requests")
    live = sum(r[2] for r in requests)
    batch = c2.ExtendBatch.build(requests, alloc, pad_to=live + data.draw(st.integers(0, 3)),
                                 request_slots=len(requests) + data.draw(st.integers(0, 2)))
    if data.draw(st.booleans(), label="changed"):
        name = data.draw(st.sampled_from(["pos", "req", "raw_out_loc", "c2_slot"]), label="tensor")
        t = getattr(batch, name).clone()
        t[data.draw(st.integers(0, batch.num_rows - 1), label="row")] = data.draw(st.integers(0, 40), label="value")
        batch = dataclasses.replace(batch, **{name: t})
    quick = _verdict(batch, pools)
    real = batch_module.rows_agree
    try:
        batch_module.rows_agree = lambda *args: False  # every batch through the rules, row by row
        slow = _verdict(batch, pools)
    finally:
        batch_module.rows_agree = real
    assert quick == slow


def test_arguments_of_the_wrong_kind_are_refused_by_name():
    layer, alloc = c2.SourceLayer(CFG), c2.ReqToTokenPool(CFG, 4, 64)
    pools = c2.Pools(CFG, 4, alloc.kv_slots)
    batch = c2.ExtendBatch.build([(0, 1, 5)], alloc)
    refused_cleanly(lambda: c2.ExtendBatch.build([(1, 0, 2)], alloc, pools="pools"), "pools is a str", alloc)
    refused_cleanly(lambda: c2.ExtendBatch.build([(1, 0, 2)], alloc, pools=[pools, None]), r"pools\[1\]: pools is a",
                    alloc, pools)
    refused_cleanly(lambda: batch.check("pools"), "pools is a str")
    refused_cleanly(lambda: c2.compress_fused_op(*[None] * 13, CFG.eps, 2, 6), "projected is a NoneType", pools)
    refused_cleanly(lambda: c2.SourceLayer(CFG, seed=2**64), "seed = 18446744073709551616")
    assert torch.equal(c2.SourceLayer(CFG, seed=-1).wk, c2.SourceLayer(CFG, seed=2**64 - 1).wk)  # torch's own wrap
