"""Notebook 01's compressor, built once here so later notebooks import it, and the checks of 01's exercises.

The ``my_*`` functions are the notebook's own cells, character for character (a test keeps the
two equal): the seven steps written out in plain torch, the pair-partner rule, the eager store and
park, and ``my_compress``. Notebook 03 captures ``my_compress`` in a graph and watches it fail.

The checks (``check_previous_is_partner``, ``check_ring_read_rows``, ``check_park_mask``) each
take the reader's function, run it on hand-made batches (request boundaries, odd starts, padding,
an idle rank) and on fresh random ragged batches, and say pass, or which rows differ and why
(:class:`~c2graph.workshop.check.CheckResult`). They never raise because the reader's code does.
"""

from __future__ import annotations

import os
import random
import textwrap
import traceback
from dataclasses import dataclass

import torch
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from .._runtime import DEFAULT_DEVICE
from ..compressor.batch import ExtendBatch, Request
from ..compressor.config import Config
from ..compressor.pools import POISON, Pools
from ..compressor.req_to_token import ReqToTokenPool
from ..compressor.rows import Partner, plan_rows
from ..compressor.torch_path import park_mask, previous_row_is_partner, ring_read_rows
from .. import graphs as graphs_package
from ..graphs.graph import Graph, warmup
from ..pictures.draw import PADDING_COLOUR, request_colour
from .check import CheckResult, run_check

# --- notebook 01, as written there ----------------------------------------------------------


def my_project(x, layer):
    """x: [T, hidden] bf16 -> kv, score: [T, D] fp32 each (float64 sums, rounded once to fp32)."""
    kv = (x.double() @ layer.wkv.double().T).float()
    score = (x.double() @ layer.wgate.double().T).float()
    return kv, score


def my_previous_is_partner(batch):
    """[T] bool: the previous row is this row's partner (both live, same req, pos - 1)."""
    live = batch.raw_out_loc != 0
    partner = torch.zeros_like(live)
    partner[1:] = (live[1:] & live[:-1] & (batch.req[1:] == batch.req[:-1])
                   & (batch.pos[1:] == batch.pos[:-1] + 1))
    return partner


def my_ring_read_rows(batch, prev_is_partner, ring_size, sentinel):
    """[T] int64: the ring row each row reads its partner from; `sentinel` where it needs none."""
    live = batch.raw_out_loc != 0
    needs_ring = live & (batch.pos % 2 == 1) & ~prev_is_partner
    return torch.where(needs_ring, batch.req * ring_size + (batch.pos - 1) % ring_size, sentinel)


def my_pair(kv, score, batch, ring, ring_size):
    """Each row's partner: kv_prev, score_prev [T, D] fp32 each, from the previous row or the ring."""
    in_batch = my_previous_is_partner(batch)
    from_ring = ring[my_ring_read_rows(batch, in_batch, ring_size, ring.shape[0] - 1)]
    D = kv.shape[1]
    kv_prev = torch.where(in_batch[:, None], kv.roll(1, 0), from_ring[:, :D])
    score_prev = torch.where(in_batch[:, None], score.roll(1, 0), from_ring[:, D:])
    return kv_prev, score_prev


def my_gate(kv_prev, score_prev, kv, score):
    """pooled [T, D] fp32, and w0 [T, D]: the partner's weight in each channel."""
    m = torch.maximum(score_prev, score)
    e0, e1 = torch.exp(score_prev - m), torch.exp(score - m)
    w0, w1 = e0 / (e0 + e1), e1 / (e0 + e1)
    return kv_prev * w0 + kv * w1, w0


def my_rms_norm(x, weight, eps):
    """x: [T, N] bf16, weight: [N] bf16 -> [T, N] bf16 (sum of squares in float64)."""
    p = x.float()
    mean_sq = (p.double() ** 2).sum(-1, keepdim=True).div(p.shape[-1]).float()
    return (p * torch.rsqrt(mean_sq + eps) * weight.float()).to(torch.bfloat16)


def my_rope(x, group_pos, inv_freq):
    """x: [T, N] bf16 -> [T, N] bf16, its last 2 * len(inv_freq) dims turned in pairs."""
    b = x.shape[1] - 2 * inv_freq.shape[0]
    tail = x[:, b:].float().unflatten(1, (-1, 2))
    angle = group_pos.float()[:, None] * inv_freq[None, :]
    xe, xo = tail[..., 0], tail[..., 1]
    turned = torch.stack([xe * angle.cos() - xo * angle.sin(), xe * angle.sin() + xo * angle.cos()], dim=-1)
    return torch.cat([x[:, :b], turned.flatten(1).to(torch.bfloat16)], dim=1)


def my_index_key(latent, layer, group_pos):
    """latent: [T, D] bf16 (pre-RoPE) -> [T, I] bf16."""
    k = (latent.double() @ layer.wk.double().T).float().to(torch.bfloat16)
    return my_rope(my_rms_norm(k, layer.k_norm_w, layer.cfg.eps), group_pos, layer.inv_freq)


def my_store(pools, latent, key, batch, layer):
    """Write kv_cache (the latent after RoPE) and index_k at the c2 slot of every group row; nothing else."""
    groups = (batch.pos % 2 == 1) & (batch.raw_out_loc != 0)
    slots = batch.raw_out_loc[groups] // 2
    group_pos = batch.pos[groups] - 1
    pools.kv_cache[slots] = my_rope(latent[groups], group_pos, layer.inv_freq)
    pools.index_k[slots] = key[groups]


def my_park(ring, kv, score, batch, ring_size):
    """Each request's last min(rows, ring_size) rows -> ring[req * ring_size + pos % ring_size]."""
    for r, rows in zip(batch.requests, batch.row_ranges()):
        for row in rows[-ring_size:]:
            pos = r.prefix_len + (row - rows.start)
            ring[r.pool_index * ring_size + pos % ring_size] = torch.cat([kv[row], score[row]])


def my_park_mask(batch, ring_size):
    """[T] bool: the row is one of its request's last ring_size rows. Tensor ops only, no host reads."""
    live = batch.raw_out_loc != 0
    T = batch.num_rows
    ahead = torch.arange(T, device=batch.pos.device) + ring_size   # the row ring_size further on
    inside = ahead < T
    ahead = ahead.clamp(max=max(T - 1, 0))
    continues = (inside & live[ahead] & (batch.req[ahead] == batch.req)
                 & (batch.pos[ahead] == batch.pos + ring_size))
    return live & ~continues


def my_compress(layer, x, batch, pools):
    """The seven steps, then the ring: writes pools.kv_cache, pools.index_k, pools.ring in place."""
    cfg = layer.cfg
    kv, score = my_project(x, layer)
    kv_prev, score_prev = my_pair(kv, score, batch, pools.ring, cfg.ring_size)
    pooled, _ = my_gate(kv_prev, score_prev, kv, score)
    latent = my_rms_norm(pooled.to(torch.bfloat16), layer.norm_w, cfg.eps)
    key = my_index_key(latent, layer, batch.pos - batch.pos % 2)
    my_store(pools, latent, key, batch, layer)
    my_park(pools.ring, kv, score, batch, cfg.ring_size)


# --- a static batch: what a captured function reads --------------------------------------------


from ..compressor.static_batch import StaticBatch  # noqa: E402  (the shared builder, re-exported)


@dataclass
class Captured:
    """What :func:`capture` got: the graph and what the captured call returned, or, when the capture
    refused the call, the first line of the error and ``where`` (``"my_store: <the line>"``)."""

    graph: Graph | None
    out: object = None
    error: str | None = None
    where: str | None = None


def capture(fn, *, warmup_iters: int = 1) -> Captured:
    """Warm ``fn()`` up eagerly, then capture one call of it in a :class:`~c2graph.graphs.graph.Graph`."""
    warmup(fn, warmup_iters)
    graph, out, inside = Graph(), None, None
    try:
        with graph.capture():
            try:
                out = fn()
            except RuntimeError as e:  # refused inside; the end of the capture may raise its own error
                inside = e
    except RuntimeError as e:
        inside = inside or e
    if inside is None:
        return Captured(graph, out)
    return Captured(None, None, str(inside).splitlines()[0], _where(inside))


_GRAPHS_DIR = os.path.dirname(os.path.abspath(graphs_package.__file__)) + os.sep


def _where(error: BaseException) -> str | None:
    """The innermost line of the caller's code (not torch's, not the graph emulation's) in the traceback."""
    ours = [f for f in traceback.extract_tb(error.__traceback__)
            if f"{os.sep}torch{os.sep}" not in f.filename and not os.path.abspath(f.filename).startswith(_GRAPHS_DIR)]
    return f"{ours[-1].name}: {ours[-1].line}" if ours else None


# --- the batches every check runs on ------------------------------------------------------------

HAND_MADE = (
    ("a request continuing at pos 5 right after one ending at pos 4", [(0, 0, 5), (1, 5, 3)], None),
    ("a lone odd row, a short request, padding", [(2, 3, 1), (3, 0, 4)], 8),
    ("an idle rank: every row padding", [], 4),
    ("three requests, odd and even starts", [(4, 12, 6), (0, 7, 2), (5, 1, 3)], None),
)


def random_requests(rng: random.Random, max_live: int, pool_requests: int = 6) -> list[tuple[int, int, int]]:
    """1 to 4 requests on distinct pool indices, odd and even prefixes, at most ``max_live`` rows."""
    requests, live = [], 0
    for pool_index in rng.sample(range(pool_requests), rng.randint(1, 4)):
        n = min(rng.randint(1, 9), max_live - live)
        if n > 0:
            requests.append((pool_index, rng.randint(0, 20), n))
            live += n
    return requests


PRACTICE_POOL_REQUESTS, PRACTICE_MAX_SEQ_LEN = 6, 64
"""The pool the practice batches draw from: 6 pool requests of up to 64 tokens."""


def practice_pools(cfg: Config, poison: float = POISON) -> Pools:
    """Poisoned pools that fit every practice batch."""
    kv_slots = ReqToTokenPool(cfg, PRACTICE_POOL_REQUESTS, PRACTICE_MAX_SEQ_LEN).kv_slots
    return Pools(cfg, PRACTICE_POOL_REQUESTS, kv_slots).poison(poison)


def practice_batches(cfg: Config, rng: random.Random, n_random: int = 12, *, bucket: int | None = None,
                     request_slots: int | None = None) -> list[tuple[str, ExtendBatch]]:
    """The hand-made batches, then ``n_random`` random ones; all padded to ``bucket`` when given."""
    alloc = ReqToTokenPool(cfg, PRACTICE_POOL_REQUESTS, PRACTICE_MAX_SEQ_LEN, seed=rng.randrange(2**31))
    cases = list(HAND_MADE)
    cases += [(f"random batch {i + 1}", random_requests(rng, bucket or 24), None) for i in range(n_random)]
    return [(what, ExtendBatch.build(reqs, alloc, request_slots=request_slots or max(len(reqs), 1),
                                     pad_to=bucket or pad)) for what, reqs, pad in cases]


def row_words(plan, row: int) -> str:
    """``row 7 (request slot 1, pos 5)`` or ``row 9 (padding)``."""
    p = plan.rows[row]
    return f"row {row} (padding)" if p.is_padding else f"row {row} (request slot {p.request_slot}, pos {p.pos})"


def rows_figure(batch: ExtendBatch, bad: list[int], title: str) -> Figure:
    """A strip of the batch's rows, one colour per request slot (padding grey), wrong rows crossed out."""
    plan = plan_rows(batch, 2)
    width = max(5.0, min(0.45 * batch.num_rows + 1.5, 9.0))
    fig = Figure(figsize=(width, 1.9), layout="constrained")
    ax = fig.add_subplot()
    for p in plan.rows:
        colour = PADDING_COLOUR if p.is_padding else request_colour(p.request_slot)
        ax.add_patch(Rectangle((p.row + 0.04, 0.05), 0.92, 0.9, facecolor=colour, edgecolor="#333333"))
        ax.text(p.row + 0.5, 0.5, "pad" if p.is_padding else f"pos\n{p.pos}", ha="center", va="center", fontsize=9)
        if p.row in bad:
            ax.plot([p.row + 0.1, p.row + 0.9], [0.1, 0.9], color="#D00000", lw=2)
            ax.plot([p.row + 0.1, p.row + 0.9], [0.9, 0.1], color="#D00000", lw=2)
    ax.set_xlim(0, max(batch.num_rows, 1))
    ax.set_ylim(0, 1)
    ax.set_yticks([])
    ax.set_xticks([r + 0.5 for r in range(batch.num_rows)], [str(r) for r in range(batch.num_rows)], fontsize=9)
    ax.set_xlabel("batch row (colour: request slot r, grey: padding; crossed: differs)", fontsize=9)
    ax.set_title("\n".join(textwrap.wrap(title, int(width * 11))), fontsize=10)
    return fig


def _compare_rows(name: str, cases, got_of, want_of, why, figure_state: dict) -> list[tuple[bool, str]]:
    """``got_of(batch)`` against ``want_of(batch)`` row by row on every case: one pass line, or one
    line per differing batch (the first three, then a count), each naming up to three rows."""
    failed = []
    for what, batch in cases:
        got, want = got_of(batch), want_of(batch)
        if not isinstance(got, torch.Tensor) or got.shape != want.shape:
            shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
            return [(False, f"{what}: your function returned {shape}; expected a tensor of shape "
                            f"{tuple(want.shape)} ({want.dtype})")]
        bad = (got.cpu().to(want.dtype) != want.cpu()).nonzero().flatten().tolist()
        if bad:
            plan = plan_rows(batch, 2)
            detail = "; ".join(why(plan, row, got.cpu()[row].item(), want.cpu()[row].item()) for row in bad[:3])
            more = f" (and {len(bad) - 3} more)" if len(bad) > 3 else ""
            figure_state.setdefault("fig", (batch, bad, f"{name}: {what}"))
            failed.append(f"{what} {_requests_text(batch)}: {len(bad)} of {batch.num_rows} rows differ: "
                          f"{detail}{more}")
    if not failed:
        return [(True, f"{name} on {len(cases)} batches: {len(HAND_MADE)} hand-made (request boundaries, "
                       f"odd starts, padding, an idle rank) and {len(cases) - len(HAND_MADE)} random")]
    lines = [(False, line) for line in failed[:3]]
    if len(failed) > 3:
        lines.append((False, f"{len(failed) - 3} more of the {len(cases)} batches differ too"))
    return lines


def _requests_text(batch: ExtendBatch) -> str:
    reqs = [tuple(r) for r in batch.requests]
    pad = f", padded to {batch.num_rows}" if batch.num_rows > batch.live_rows else ""
    return f"(requests {reqs}{pad})"


def _figure(state: dict):
    """The picture of the first batch that differed, drawn only when a check fails."""
    return lambda: rows_figure(*state["fig"]) if "fig" in state else None


def fresh_rng() -> random.Random:
    """A generator with a fresh seed: every check draws new random batches."""
    return random.Random(random.SystemRandom().randrange(2**31))


# --- the checks of notebook 01's exercises --------------------------------------------------------


def check_previous_is_partner(fn) -> CheckResult:
    """Check ``fn(batch) -> [T] bool``: the previous row is the partner (same request, ``pos - 1``, both live)."""
    cases, state = practice_batches(Config.tiny(), fresh_rng()), {}

    def why(plan, row, got, want):
        p, prev = plan.rows[row], plan.rows[row - 1] if row else None
        if want:
            return f"{row_words(plan, row)}: yours says {got}, but row {row - 1} is its partner (pos {p.pos - 1})"
        reason = ("it is the first row" if prev is None else "it is padding" if p.is_padding
                  else f"row {row - 1} is padding" if prev.is_padding
                  else f"row {row - 1} belongs to request slot {prev.request_slot}" if prev.req != p.req
                  else f"row {row - 1} is at pos {prev.pos}, not {p.pos - 1}")
        return f"{row_words(plan, row)}: yours says {got}, the rule says False: {reason}"

    return run_check("previous row is the partner", lambda: _compare_rows(
        "the previous-row rule", cases, fn, previous_row_is_partner, why, state), _figure(state))


def check_ring_read_rows(fn) -> CheckResult:
    """Check ``fn(batch, prev_is_partner, ring_size, sentinel) -> [T] int64``: the ring row each row reads."""
    cfg = Config.tiny()
    cases, state, R = practice_batches(cfg, fresh_rng()), {}, cfg.ring_size
    sentinel = PRACTICE_POOL_REQUESTS * R

    def why(plan, row, got, want):
        p = plan.rows[row]
        if p.partner is Partner.RING:
            rule = f"ring row {want} = req {p.req} * {R} + (pos {p.pos} - 1) % {R}"
        else:
            rule = f"the sentinel ({sentinel}): its partner is {p.partner_text()}"
        return f"{row_words(plan, row)}: yours reads {got}, the rule says {rule}"

    return run_check("ring read rows", lambda: _compare_rows(
        "the ring-row rule", cases, lambda b: fn(b, previous_row_is_partner(b), R, sentinel),
        lambda b: ring_read_rows(b, R, sentinel), why, state), _figure(state))


def check_park_mask(fn) -> CheckResult:
    """Check ``fn(batch, ring_size) -> [T] bool``: each request's last ``ring_size`` rows, computed with
    tensor ops only, so that a graph captured on one batch gives the right mask for every other."""
    cfg, rng, state = Config.tiny(), fresh_rng(), {}
    R, bucket, slots = cfg.ring_size, 16, 4

    def why(plan, row, got, want):
        return f"{row_words(plan, row)}: yours says {bool(got)}, the rule says {bool(want)}"

    def cases():
        results = _compare_rows("the park rule, run eagerly", practice_batches(cfg, rng), lambda b: fn(b, R),
                                lambda b: park_mask(b, R), why, state)
        if not all(ok for ok, _ in results):
            return results
        static = StaticBatch(bucket, slots, device=DEFAULT_DEVICE)
        got = capture(lambda: fn(static.batch, R))
        if got.error:
            return results + [(False, f"the capture refused your function ({got.where}): {got.error}")]
        replays = practice_batches(cfg, rng, 8, bucket=bucket, request_slots=slots)
        for what, batch in replays:
            static.load(batch)
            got.graph.replay()
            want = park_mask(batch, R)
            bad = (got.out.cpu() != want.cpu()).nonzero().flatten().tolist()
            if bad:
                state.setdefault("fig", (batch, bad, f"park mask, graph replay: {what}"))
                plan = plan_rows(batch, R)
                return results + [(False, f"captured on a dummy batch (one request of all {bucket} rows), "
                                          f"replayed on {what} {_requests_text(batch)}: "
                                          f"{', '.join(row_words(plan, r) for r in bad[:3])} differ: a value "
                                          "read on the host during capture was frozen")]
        return results + [(True, f"captured once, replayed on {len(replays)} batches of {bucket} rows: "
                                 "the mask follows each batch")]

    return run_check("park mask", cases, _figure(state))
