"""Notebook 02's last exercise: the reader's four pieces assembled into a working compressor kernel.

Two checks, in the order the notebook asks for them:

1. :func:`check_gate_norm`: ``gate_rms_norm(kv0, s0, kv1, s1, norm_w, eps, D, LOG2_D)``, a
   ``@triton.jit`` helper that gates two ``[rows, D]`` fp32 tiles and normalises the result
   (steps 3 and 4 of the math), compared with the torch path's :func:`gate` and :func:`finish`;
2. :func:`check_compressor`: a kernel of one program a block of ``BLOCK`` rows that finds its
   rows' requests from the extend offsets (puzzle 1), gathers each group row's partner (puzzle 2),
   gates and normalises (1, with puzzle 3's row sum), stores the pre-RoPE latent of its group
   rows, and parks the last rows of the requests whose first row is in its block (puzzle 4). No
   RoPE, no caches, no index key: those are what the library's kernel adds. Compared with the
   torch path on the same batch, on the batches of :func:`c2graph.workshop.puzzles.puzzles`:
   hand-made edge cases first, then a seeded random one, so an answer gets the same verdict on
   every run.

Each says pass, or the first row (or ring row) that is wrong, never written or written wrong,
and the usual mistake behind it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._runtime import DEFAULT_DEVICE
from ..compressor.batch import ExtendBatch
from ..compressor.config import Config
from ..compressor.pools import POISON, Pools
from ..compressor.req_to_token import ReqToTokenPool
from ..compressor.source_layer import SourceLayer, project_fused, split_projected
from ..compressor.torch_path import compress_torch, finish, gate
from ..pictures.style import plural
from . import puzzles
from .check import CheckResult, run_check
from .launch import check_on_puzzles, kernel_problem, launch, reported

BLOCK, S_PAD = 8, 8
"""Rows a program, and lanes of request slots (``request_slots`` rounded up to a power of two)."""
TOL = 2**-6
"""The tolerance of the fused path against the torch path (``rtol = atol``)."""
GATE_ROWS = 16


# --- step 1: the gate and RMSNorm -------------------------------------------------------------------


@triton.jit
def _gate_norm_harness(kv0_ptr, s0_ptr, kv1_ptr, s1_ptr, norm_w_ptr, out_ptr, eps, ROWS: tl.constexpr,
                       D: tl.constexpr, LOG2_D: tl.constexpr, GATE_RMS_NORM: tl.constexpr):
    # One program: load four [ROWS, D] fp32 tiles, call the reader's gate_rms_norm, store its tile.
    tile = tl.arange(0, ROWS)[:, None] * D + tl.arange(0, D)[None, :]
    out = GATE_RMS_NORM(tl.load(kv0_ptr + tile), tl.load(s0_ptr + tile), tl.load(kv1_ptr + tile),
                        tl.load(s1_ptr + tile), norm_w_ptr, eps, D, LOG2_D)
    tl.static_assert(len(out.shape) == 2, "gate_rms_norm must return a [rows, D] tile, one latent a row")
    tl.store(out_ptr + tile, out.to(tl.float32))


GATE_NORM = ["kv0", "s0", "kv1", "s1", "norm_w_ptr", "eps", "D", "LOG2_D"]


def _gate_norm_case(seed: int) -> tuple[list[torch.Tensor], torch.Tensor, float]:
    """Four ``[16, D]`` fp32 tiles of the ``tiny`` preset's width, scores spread over a few units
    (so the two weights differ), the layer's ``norm_w`` and ``eps``."""
    cfg = Config.tiny()
    g = torch.Generator().manual_seed(seed)
    tiles = [torch.randn(GATE_ROWS, cfg.D, generator=g) * scale for scale in (1.0, 3.0, 1.0, 3.0)]
    return tiles, SourceLayer(cfg, seed=seed, device="cpu").norm_w, cfg.eps


def _gate_norm_mistake(got: torch.Tensor, tiles: list[torch.Tensor], norm_w: torch.Tensor, eps: float) -> str:
    """Which usual mistake ``got`` (``[rows, D]``) is, compared with the torch path's answer."""
    kv0, s0, kv1, s1 = tiles
    w = norm_w.float()

    def near(x: torch.Tensor) -> bool:
        return torch.allclose(got, x.float(), rtol=TOL, atol=TOL)

    pooled = gate(kv0, s0, kv1, s1)
    p = pooled.to(torch.bfloat16).float()
    mean_sq = (p * p).mean(-1, keepdim=True)
    if near(finish(gate(kv1, s1, kv0, s0), norm_w, eps)) or near(finish(gate(kv0, s1, kv1, s0), norm_w, eps)):
        return ("each kv row took the other row's weight: w0 = exp(s0 - m) / (exp(s0 - m) + exp(s1 - m)) weights kv0, "
                "the partner, and w1 weights kv1")
    if near(pooled) or near(p):
        return "that is the gated row, not yet normalised: RMSNorm scales it by rsqrt(mean of squares + eps) * norm_w"
    if near(p * torch.rsqrt(mean_sq + eps)):
        return "normalised but not scaled: multiply by norm_w (load it: D values, bf16, widened to fp32)"
    if near(p * torch.rsqrt(mean_sq * p.shape[1] + eps) * w):
        return "the sum of squares was not divided by D: RMSNorm takes the mean of the squares"
    if near(p * torch.sqrt(mean_sq + eps) * w) or near(p / torch.rsqrt(mean_sq + eps) * w):
        return "multiplied by the root of the mean square: RMSNorm divides by it (tl.rsqrt gives 1 / sqrt)"
    return "neither the gate nor RMSNorm of the usual mistakes: compare your lines with the math above, step by step"


def check_gate_norm(fn, seed: int = 0) -> CheckResult:
    """Step 1: ``fn(kv0, s0, kv1, s1, norm_w_ptr, eps, D, LOG2_D)`` gates and normalises, within ``2**-6``.

    Called from a one-program kernel on four ``[16, 32]`` fp32 tiles (seeded: the same tiles on
    every run), with the ``tiny`` layer's ``norm_w``; compared with the torch path's
    ``finish(gate(kv0, s0, kv1, s1), norm_w, eps)``. A wrong answer is named when it is one of
    the usual ones (weights swapped, not normalised, ``norm_w`` left out, a sum for a mean, the
    root multiplied).
    """
    def cases():
        problem = kernel_problem(fn, GATE_NORM)
        if problem:
            return [(False, problem)]
        tiles, norm_w, eps = _gate_norm_case(seed)
        want = finish(gate(*tiles), norm_w, eps).float()
        out = torch.full((GATE_ROWS, want.shape[1]), POISON, device=DEFAULT_DEVICE)
        D = want.shape[1]
        launch(_gate_norm_harness, (1,), *(t.to(DEFAULT_DEVICE) for t in tiles), norm_w.to(DEFAULT_DEVICE), out, eps,
               ROWS=GATE_ROWS, D=D, LOG2_D=D.bit_length() - 1, GATE_RMS_NORM=fn, reader=fn,
               said="gate_rms_norm must")
        got = out.cpu()
        if torch.allclose(got, want, rtol=TOL, atol=TOL):
            return [(True, f"all {GATE_ROWS} rows of {D} channels within 2**-6 of the torch path's gate and RMSNorm")]
        r = int((~torch.isclose(got, want, rtol=TOL, atol=TOL)).any(dim=1).nonzero()[0])
        return [(False, f"row {r} differs from the torch path (largest difference "
                        f"{float((got[r] - want[r]).abs().max()):.3g}): {_gate_norm_mistake(got, tiles, norm_w, eps)}")]

    return run_check("gate_rms_norm (assembly, step 1)", reported(cases))


# --- step 2: the whole compressor of one batch ------------------------------------------------------

COMPRESSOR = ["projected_ptr", "ring_ptr", "pos_ptr", "req_ptr", "offsets_ptr", "norm_w_ptr", "latent_ptr",
              "num_rows", "request_slots", "eps", "D", "LOG2_D", "RING", "BLOCK", "S_PAD"]


class Run:
    """One batch of :func:`~c2graph.workshop.puzzles.puzzles` with a real ``tiny`` layer: the ring
    after a previous chunk, the projected ``| kv | score |`` rows, and the torch path's answer."""

    def __init__(self, p: puzzles.Puzzle, seed: int):
        self.p, cfg = p, Config.tiny()
        self.layer = SourceLayer(cfg, seed=seed, device="cpu")  # the torch path's answer, on the host
        alloc = ReqToTokenPool(cfg, pool_requests=puzzles.POOL_REQUESTS, max_seq_len=96, seed=seed)
        self.pools = Pools(cfg, puzzles.POOL_REQUESTS, alloc.kv_slots, device="cpu")
        requests = [(r.pool_index, r.prefix_len, r.extend_len) for r in p.batch.requests]
        before = [(pool, 0, prefix) for pool, prefix, _ in requests if prefix > 0]
        if before:  # a previous chunk fills the ring rows this batch reads
            previous = ExtendBatch.build(before, alloc, request_slots=len(before), device="cpu")
            x = project_fused(self.layer, self.layer.random_hidden(previous.num_rows, seed=seed + 1))
            compress_torch(self.layer, *split_projected(x), previous, self.pools)
        self.batch = ExtendBatch.build(requests, alloc, request_slots=p.request_slots, pad_to=p.num_rows, device="cpu")
        self.projected = project_fused(self.layer, self.layer.random_hidden(self.batch.num_rows, seed=seed + 2))
        self.want_pools = self.pools.clone()
        self.want = compress_torch(self.layer, *split_projected(self.projected), self.batch, self.want_pools)

    def guard(self) -> torch.Tensor:
        """``[2D]`` fp32: the row placed before the buffer (and ``BLOCK`` of them after it), so that a
        read out of bounds reads the same values on every run, and is named."""
        return 1000.0 + torch.arange(2 * self.layer.cfg.D) / 64

    def launch(self, fn) -> tuple[torch.Tensor, torch.Tensor]:
        """Run ``fn`` on a copy of the ring and a poisoned latent buffer with ``BLOCK`` rows past its
        end: ``(latent [T + BLOCK, D], ring)`` on the host."""
        cfg, T, b = self.layer.cfg, self.batch.num_rows, self.batch
        ring = self.pools.ring.clone().to(DEFAULT_DEVICE)
        projected = torch.cat([self.guard()[None], self.projected, self.guard().expand(BLOCK, -1)]).to(DEFAULT_DEVICE)
        latent = torch.full((T + BLOCK, cfg.D), POISON, dtype=torch.bfloat16, device=DEFAULT_DEVICE)
        launch(fn, (triton.cdiv(T, BLOCK),), projected[1:], ring,
               *(t.to(DEFAULT_DEVICE) for t in (b.pos, b.req, b.extend_offsets, self.layer.norm_w)), latent,
               T, b.request_slots, cfg.eps, D=cfg.D, LOG2_D=cfg.D.bit_length() - 1, RING=cfg.ring_size,
               BLOCK=BLOCK, S_PAD=S_PAD)
        return latent.cpu(), ring.cpu()

    def latent_with_partner(self, row: int, partner: torch.Tensor) -> torch.Tensor:
        """``[D]`` fp32: the torch path's latent of ``row`` had its partner been ``partner`` (``[2D]``)."""
        D = self.layer.cfg.D
        cur = self.projected[row]
        pooled = gate(partner[None, :D], partner[None, D:], cur[None, :D], cur[None, D:])
        return finish(pooled, self.layer.norm_w, self.layer.cfg.eps)[0].float()

    def what_ring_row_holds(self, row: torch.Tensor, k: int) -> str:
        """Which batch row ``row`` (``[2D]``, a ring row after the kernel) is a copy of, in words."""
        for r in range(self.batch.num_rows):
            if torch.equal(row, self.projected[r]):
                return f"batch row {r} (pos {int(self.batch.pos[r])})"
        if torch.equal(row, self.pools.ring[k]):
            return "what it held before the batch (never written)"
        return "values that are no row of the batch"


def _latent_mistake(run: Run, r: int, got: torch.Tensor) -> str:
    """What is wrong with ``latent[r] = got`` (``[D]`` fp32)."""
    plan = run.batch.plan(run.layer.cfg.ring_size).rows[r]
    pos, T = int(run.batch.pos[r]), run.batch.num_rows
    if not plan.completes_group:
        why = ("a padding row (in no request slot)" if plan.request_slot is None else f"pos {pos} is even")
        return f"row {r} completes no group ({why}) but latent[{r}] was written: mask the store with the group rows"
    if bool((got == POISON).all()):
        return (f"row {r} (pos {pos}) completes a group but latent[{r}] was never written (still the poison "
                f"{POISON:g}): a group row is a row of a request (puzzle 1) at an odd pos; row {r} is program "
                f"{r // BLOCK}'s")
    want, ring_row = run.want[r].float(), plan.partner_ring_row
    said = f"row {r} (pos {pos}): latent[{r}] differs from the torch path by {float((got - want).abs().max()):.3g}"

    def gated_with(partner: torch.Tensor) -> bool:
        return torch.allclose(got, run.latent_with_partner(r, partner), rtol=TOL, atol=TOL)

    ring = run.pools.ring
    if ring_row is not None:  # the first row of its request: the partner is in the ring
        if gated_with(run.projected[r - 1] if r > 0 else run.guard()):
            before = f"the previous row of the batch (row {r - 1})" if r > 0 else "the row before the buffer (row -1)"
            return (f"{said}: its partner came from {before}, but row {r} is the first row of its request, so its "
                    f"partner (pos {pos - 1}) is ring row req * RING + (pos - 1) % RING = {ring_row}")
        wrong_ring = next((k for k in range(ring.shape[0] - 1) if k != ring_row and gated_with(ring[k])), None)
        if wrong_ring is not None:
            req = int(run.batch.req[r])
            own = " (req * RING + pos % RING: where this row itself is parked)" if (
                wrong_ring == req * run.layer.cfg.ring_size + pos % run.layer.cfg.ring_size) else ""
            return (f"{said}: its partner came from ring row {wrong_ring}{own}; the partner of pos {pos} is at "
                    f"req * RING + (pos - 1) % RING = {ring_row}")
    else:
        if any(gated_with(ring[k]) for k in range(ring.shape[0] - 1)):
            return (f"{said}: its partner came from the ring, but row {r} is not the first row of its request: its "
                    f"partner is the previous row of the batch, row {r - 1}")
        if gated_with(ring[-1]):
            return f"{said}: it was gated as if it had no partner; its partner is the previous row, row {r - 1}"
    return f"{said}: the partners are right; check the gate and RMSNorm (check_gate_norm above)"


def _ring_mistake(run: Run, got: torch.Tensor) -> str | None:
    """What is wrong with the ring ``got`` after the kernel, or ``None``."""
    want, parked = run.want_pools.ring, run.batch.plan(run.layer.cfg.ring_size).parked
    for k in range(want.shape[0]):
        if torch.equal(got[k], want[k]):
            continue
        holds = run.what_ring_row_holds(got[k], k)
        if k == want.shape[0] - 1:
            return f"the ring's last row (the sentinel) was written: it holds {holds}"
        if k not in parked:
            return f"ring row {k} should not be written (no request parks a row there) but holds {holds}"
        r = parked[k]
        slot = run.batch.plan(run.layer.cfg.ring_size).rows[r].request_slot
        rows = run.batch.row_ranges()[slot]
        said = (f"ring row {k} should hold batch row {r} (pos {int(run.batch.pos[r])}), one of the last "
                f"{run.layer.cfg.ring_size} rows of request slot {slot} (rows {rows.start} to {rows.stop - 1})")
        if holds.startswith("values that are no row"):
            holds += (": the park copies whole | kv | score | rows, 2 * D values each (pass 2 * D as park's D), "
                      "and masks its store with j < n_park")
        return f"{said}, but holds {holds}"
    return None


def check_compressor(fn, seed: int = 0) -> CheckResult:
    """Step 2: ``fn`` computes the pre-RoPE latents of a batch's group rows and parks its requests' rows.

    Launched as ``fn[(cdiv(num_rows, BLOCK),)](projected, ring, pos, req, offsets, norm_w, latent,
    num_rows, request_slots, eps, D=32, LOG2_D=5, RING=2, BLOCK=8, S_PAD=8)`` on every batch of
    :func:`~c2graph.workshop.puzzles.puzzles` (the hand-made edge cases, then a seeded random
    one), with a real ``tiny`` layer and a ring filled by a previous chunk. The latents of group
    rows must be within ``2**-6`` of the torch path's, every other row of ``latent`` untouched
    (poisoned), and the ring bitwise the torch path's.
    """
    def one(p) -> tuple[bool, str]:
        run = Run(p, seed)
        latent, ring = run.launch(fn)
        T, groups = run.batch.num_rows, set(run.batch.group_rows)
        got, want = latent.float(), run.want.float()
        wrong = [r for r in range(T) if (r in groups and not torch.allclose(got[r], want[r], rtol=TOL, atol=TOL))
                 or (r not in groups and not bool((got[r] == POISON).all()))]
        past = [r for r in range(T, T + BLOCK) if not bool((got[r] == POISON).all())]
        ring_wrong = _ring_mistake(run, ring)
        if wrong:
            return (False, f"{p.what}: {len(wrong)} of {T} rows wrong; first: "
                           f"{_latent_mistake(run, wrong[0], got[wrong[0]])}")
        elif past:
            return (False, f"{p.what}: latent[{past[0]}] was written, past the last row ({T} rows): "
                           "mask the store with the group rows, which lie inside the requests")
        elif ring_wrong:
            return (False, f"{p.what}: the latents are right, but {ring_wrong}")
        else:
            return (True, f"{p.what}: the latents of {plural(len(groups), 'group row')} within 2**-6 "
                          f"of the torch path, the other {plural(T - len(groups), 'row')} untouched, the "
                          "ring bitwise the same")

    return check_on_puzzles("my_compressor (assembly, step 2)", fn, COMPRESSOR, seed, one)
