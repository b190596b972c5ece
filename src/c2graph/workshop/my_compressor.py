"""Notebook 01's compressor, built once here so later notebooks import it, and the checks of 01's exercises.

The ``my_*`` functions are the notebook's own cells, character for character (a test keeps the
two equal): the seven steps written out in plain torch, the pair-partner rule, the eager store and
park, and ``my_compress``. Notebook 03 captures ``my_compress`` in a graph (the reader's own
version where they wrote it: :mod:`c2graph.workshop.yours`).

The checks (``check_previous_is_partner``, ``check_ring_read_rows``, ``check_park_mask``) each
take the reader's function, check what it returns (a tensor, its dtype, shape and device) before
any value, run it on the hand-made edge cases first (fewer rows than the ring, an odd start next
to padding, a request of 0 rows, an idle rank, every request slot full, the last request ending at
the bucket's end) and the dummy batch a graph is captured on (:data:`DUMMY`: the one batch whose
padding rows sit inside a request, at odd and even positions, so a rule that leaves liveness out is
wrong on it; the park mask's check, whose padding rows past the live rows already catch that,
captures on it instead), then on seeded random ragged batches, so the same answer gets the same verdict in
every run, and say pass, or which rows differ and why (:class:`~c2graph.workshop.check.CheckResult`).
They never raise because the reader's code does.
"""

from __future__ import annotations

import torch

from .._runtime import DEFAULT_DEVICE
from ..compressor.config import Config
from ..compressor.rows import Partner, plan_rows
from ..compressor.torch_path import park_mask, previous_row_is_partner, ring_read_rows
from .check import CheckResult, run_check
from .practice import (
    HAND_MADE,
    HAND_MADE_WORDS,
    PRACTICE_POOL_REQUESTS,
    StaticBatch,
    capture_yours,
    check_rng,
    figure_of,
    practice_batches,
    refusal_words,
    requests_text,
    result_problem,
    row_words,
)


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

# --- the checks of notebook 01's exercises --------------------------------------------------------

RING_SIZE = Config.tiny().ring_size
"""The ring size of every check's batches (the ``tiny`` preset's)."""
BOOL_HINT = "comparisons joined with `&` give bool; `torch.zeros(T)`, `.long()` or `.int()` do not"
INDEX_HINT = "ring rows are int64, as `batch.req * ring_size` is"
DUMMY = "the dummy batch a graph is captured on: one request over all 16 rows, every row padding"
"""The case after the hand-made ones. Padding rows past the live rows all sit at pos 0, in no
request, so there a rule that never asks whether a row is live can still come out right; the dummy
batch is the one batch with padding inside a request, at odd and even positions (0 to 15). A graph
is warmed up and captured on it: a pairing that pairs its rows reads the ring for nothing, and a
park that parks them writes padding over the ring rows of pool index 0, a real request's."""
DUMMY_WHY = ("padding (`raw_out_loc == 0`) sits inside a request only in this batch, the one a graph is "
             "warmed up and captured on: a rule that leaves `live` out acts on its rows (a park would write "
             "them over pool index 0's ring rows, a real request's)")


def _batches(cfg: Config, rng) -> list:
    """The hand-made batches, the dummy batch (:data:`DUMMY`), then the seeded random ones."""
    cases = practice_batches(cfg, rng)
    return cases[:len(HAND_MADE)] + [(DUMMY, StaticBatch(16, 4, device=DEFAULT_DEVICE).batch)] + cases[len(HAND_MADE):]


def _compare_rows(name: str, cases, got_of, want_of, why, hint: str, state: dict) -> list[tuple[bool, str]]:
    """``got_of(batch)`` against ``want_of(batch)`` on every case: first what it returned (a tensor of
    the right dtype, shape and device), then row by row. One pass line, or one line per differing
    batch (the first three, then a count), each naming up to three rows."""
    failed = []
    for what, batch in cases:
        got, want = got_of(batch), want_of(batch)
        problem = result_problem(got, want, "your result", hint)
        if (problem and isinstance(got, torch.Tensor) and got.dim() == 1 and got.shape[0] > batch.num_rows
                and batch.num_rows < RING_SIZE):
            problem += (f" (this batch has {batch.num_rows} row, fewer than the ring's {RING_SIZE}: a shift by "
                        "`ring_size` made with `x[ring_size:]` and `ring_size` fill values gives `ring_size` values "
                        "here, not one per row)")
        if problem:
            return [(False, f"{what} {requests_text(batch)}: {problem}")]
        bad = (got != want).nonzero().flatten().tolist()
        if bad:
            plan = plan_rows(batch, 2)
            detail = "; ".join(why(plan, row, got[row].item(), want[row].item()) for row in bad[:3])
            more = f" (and {len(bad) - 3} more)" if len(bad) > 3 else ""
            state.setdefault("fig", (batch, bad, f"{name}: {what}"))
            hint = f" ({DUMMY_WHY})" if what == DUMMY else ""
            failed.append(f"{what} {requests_text(batch)}: {len(bad)} of {batch.num_rows} rows differ: "
                          f"{detail}{more}{hint}")
    if not failed:
        made = len(HAND_MADE) + any(what == DUMMY for what, _ in cases)
        dummy = ", the dummy batch (padding inside a request)" if made > len(HAND_MADE) else ""
        return [(True, f"{name} on {len(cases)} batches: {made} hand-made ({HAND_MADE_WORDS}{dummy}) "
                       f"and {len(cases) - made} random")]
    lines = [(False, line) for line in failed[:3]]
    if len(failed) > 3:
        lines.append((False, f"{len(failed) - 3} more of the {len(cases)} batches differ too"))
    return lines


def check_previous_is_partner(fn) -> CheckResult:
    """Check ``fn(batch) -> [T] bool``: the previous row is the partner (same request, ``pos - 1``, both live)."""
    cases, state = _batches(Config.tiny(), check_rng()), {}

    def why(plan, row, got, want):
        p, prev = plan.rows[row], plan.rows[row - 1] if row else None
        if want:
            return f"{row_words(plan, row)}: yours says {got}, but row {row - 1} is its partner (pos {p.pos - 1})"
        reason = ((f"it is the first row of the batch: there is no previous row (`roll(1)` brings the last row, "
                   f"row {len(plan.rows) - 1}{', padding,' if plan.rows[-1].is_padding else ''} round to row 0: "
                   "check that the previous row is live too, or leave row 0 False)") if prev is None
                  else "it is padding (`raw_out_loc == 0`): a padding row has no partner" if p.is_padding
                  else f"row {row - 1} is padding" if prev.is_padding
                  else f"row {row - 1} belongs to request slot {prev.request_slot} (compare `req`)" if prev.req != p.req
                  else f"row {row - 1} is at pos {prev.pos}, not {p.pos - 1}")
        return f"{row_words(plan, row)}: yours says {got}, the rule says False: {reason}"

    return run_check("previous row is the partner", lambda: _compare_rows(
        "the previous-row rule", cases, fn, previous_row_is_partner, why, BOOL_HINT, state), figure_of(state))


def check_ring_read_rows(fn) -> CheckResult:
    """Check ``fn(batch, prev_is_partner, ring_size, sentinel) -> [T] int64``: the ring row each row reads."""
    cfg = Config.tiny()
    cases, state, R = _batches(cfg, check_rng()), {}, cfg.ring_size
    sentinel = PRACTICE_POOL_REQUESTS * R

    def why(plan, row, got, want):
        p = plan.rows[row]
        if p.partner is Partner.RING:
            rule = f"ring row {want} = req {p.req} * {R} + (pos {p.pos} - 1) % {R}"
            if got == p.req * R + p.pos % R:
                rule += ": yours is the ring row of the row's own pos, not its partner's pos - 1"
        elif p.is_padding:
            rule = f"the sentinel ({sentinel}): it is padding (`raw_out_loc == 0`), which reads no partner"
        else:
            rule = f"the sentinel ({sentinel}): its partner is {p.partner_text()}"
        return f"{row_words(plan, row)}: yours reads {got}, the rule says {rule}"

    return run_check("ring read rows", lambda: _compare_rows(
        "the ring-row rule", cases, lambda b: fn(b, previous_row_is_partner(b), R, sentinel),
        lambda b: ring_read_rows(b, R, sentinel), why, INDEX_HINT, state), figure_of(state))


def check_park_mask(fn) -> CheckResult:
    """Check ``fn(batch, ring_size) -> [T] bool``: each request's last ``ring_size`` rows, computed with
    tensor ops only, so that a graph captured on one batch gives the right mask for every other."""
    cfg, rng, state = Config.tiny(), check_rng(), {}
    R, bucket, slots = cfg.ring_size, 16, 4

    def why(plan, row, got, want):
        padding = ": it is padding (`raw_out_loc == 0`), never parked" if plan.rows[row].is_padding else ""
        return f"{row_words(plan, row)}: yours says {bool(got)}, the rule says {bool(want)}{padding}"

    def cases():
        # no dummy batch here: padding past the live rows already catches a park of padding rows
        # (pos 0, nothing of its request ring_size rows on), and the capture below runs on the dummy
        results = _compare_rows("the park rule, run eagerly", practice_batches(cfg, rng), lambda b: fn(b, R),
                                lambda b: park_mask(b, R), why, BOOL_HINT, state)
        if not all(ok for ok, _ in results):
            return results
        static = StaticBatch(bucket, slots, device=DEFAULT_DEVICE)
        got = capture_yours(lambda: fn(static.batch, R))
        if got.error:
            return results + [(False, refusal_words(got))]
        replays = practice_batches(cfg, rng, 8, bucket=bucket, request_slots=slots)
        for what, batch in replays:
            static.load(batch)
            got.graph.replay()
            want = park_mask(batch, R)
            problem = result_problem(got.out, want, "the mask your captured function returned", BOOL_HINT)
            if problem:
                return results + [(False, f"replayed on {what} {requests_text(batch)}: {problem}")]
            bad = (got.out != want).nonzero().flatten().tolist()
            if bad:
                state.setdefault("fig", (batch, bad, f"park mask, graph replay: {what}"))
                plan = plan_rows(batch, R)
                return results + [(False, f"captured on a dummy batch (one request of all {bucket} rows), "
                                          f"replayed on {what} {requests_text(batch)}: the mask differs at "
                                          f"{', '.join(row_words(plan, r) for r in bad[:3])}: it still holds the "
                                          "dummy's mask, because your function decided on the host (a loop over "
                                          "`batch.requests` or `row_ranges()`, a Python int), and the capture "
                                          "froze that decision. Use tensor ops on `batch.pos`, `batch.req`, "
                                          "`batch.raw_out_loc`")]
        return results + [(True, f"captured once, replayed on {len(replays)} batches of {bucket} rows: "
                                 "the mask follows each batch")]

    return run_check("park mask", cases, figure_of(state))
