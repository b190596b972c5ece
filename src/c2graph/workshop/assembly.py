"""Notebook 02's last exercise: the reader's four pieces assembled into a working compressor kernel.

Two checks, in the order the notebook asks for them:

1. :func:`check_gate_norm`: ``gate_rms_norm(kv0, s0, kv1, s1, norm_w, eps, D, LOG2_D)``, a
   ``@triton.jit`` helper that gates two ``[rows, D]`` fp32 tiles and normalises the result
   (steps 3 and 4 of the math), compared with the torch path's :func:`gate` and :func:`finish`;
2. :func:`check_compressor`: a kernel of one program a run of ``ROWS`` rows that finds its
   rows' requests from the extend offsets (puzzle 1), gathers each group row's partner (puzzle 2),
   gates and normalises (1, with puzzle 3's row sum), stores the pre-RoPE latent of its group
   rows, and parks the last rows of the requests whose first row is among its rows (puzzle 4). No
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
from ..compressor.config import Config
from ..compressor.pools import POISON
from ..compressor.source_layer import SourceLayer
from ..compressor.torch_path import finish, gate
from ..pictures.style import plural
from .assembly_stages import ROWS, Run, load_mistake, park_mistake, static_mistake
from .check import CheckResult, run_check
from .launch import check_on_puzzles, kernel_problem, launch, reported

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
              "num_rows", "request_slots", "eps", "D", "LOG2_D", "RING", "ROWS", "S_PAD"]


def _judge(run: Run, fn) -> str | None:
    """What is wrong with ``fn`` on ``run``'s batch, stage by stage (the rows loaded, the gate and
    RMSNorm, the park, the store), or ``None``."""
    latent, ring = run.launch(fn)
    T, groups = run.batch.num_rows, run.batch.group_rows
    got, want = latent.float(), run.want.float()
    unwritten = [r for r in groups if bool((got[r] == POISON).all())]
    if unwritten:
        r, pos = unwritten[0], int(run.batch.pos[unwritten[0]])
        return (f"row {r} (pos {pos}) completes a group but latent[{r}] was never written (still the poison "
                f"{POISON:g}): a group row is a row of a request (puzzle 1) at an odd pos; row {r} is program "
                f"{r // ROWS}'s")
    wrong = [r for r in groups if not torch.allclose(got[r], want[r], rtol=TOL, atol=TOL)]
    if wrong:
        loads = load_mistake(run, fn, groups)
        if loads:
            return loads
        r = wrong[0]
        return (f"row {r} (pos {int(run.batch.pos[r])}): the rows gate_rms_norm gets are right (kv0, s0, kv1, s1 of "
                f"every group row), but latent[{r}] differs from the torch path by "
                f"{float((got[r] - want[r]).abs().max()):.3g}: store the tile gate_rms_norm returns, as bf16")
    parked = park_mistake(run, fn, ring)
    if parked:
        return f"the latents are right, but {parked}"
    for r in range(T + ROWS):
        if r not in set(groups) and not bool((got[r] == POISON).all()):
            if r >= T:
                return (f"latent[{r}] was written, past the last row ({T} rows): mask the store with the group rows, "
                        "which lie inside the requests")
            plan = run.plan.rows[r]
            why = "a padding row (in no request slot)" if plan.request_slot is None else f"pos {int(run.batch.pos[r])} is even"
            ends = {rows.stop: s for s, rows in enumerate(run.batch.row_ranges())}
            end = (f"; row {r} is request slot {ends[r]}'s start + count, one past its last row: a row lies in slot s "
                   "when start <= row < start + count (<, not <=)") if r in ends else ""
            return (f"row {r} completes no group ({why}) but latent[{r}] was written: mask the store with the group "
                    f"rows (live & odd pos; a padding row's pos and req mean nothing){end}")
    return None


def check_compressor(fn, seed: int = 0) -> CheckResult:
    """Step 2: ``fn`` computes the pre-RoPE latents of a batch's group rows and parks its requests' rows.

    Its source must call the reader's ``gate_rms_norm`` and ``park``, with ``tl.debug_barrier()``
    before the park (refused with the reason otherwise). Launched as ``fn[(cdiv(num_rows, ROWS),)](
    projected, ring, pos, req, offsets, norm_w, latent, num_rows, request_slots, eps, D=32, LOG2_D=5,
    RING=2, ROWS=8, S_PAD=8)`` on every batch of :func:`~c2graph.workshop.puzzles.puzzles` (the
    hand-made edge cases, then a seeded random one), with a real ``tiny`` layer and a ring filled by
    a previous chunk, every input in the middle of poisoned memory. The latents of group rows must
    be within ``2**-6`` of the torch path's, every other row of ``latent`` untouched (poisoned), and
    the ring bitwise the torch path's, each request parked by its first row's program. A wrong
    answer is blamed on its stage (:mod:`c2graph.workshop.assembly_stages`).
    """
    def one(p) -> tuple[bool, str]:
        run = Run(p, seed)
        wrong = _judge(run, fn)
        if wrong:
            return (False, f"{p.what}: {wrong}")
        n = len(run.batch.group_rows)
        return (True, f"{p.what}: the latents of {plural(n, 'group row')} within 2**-6 of the torch path, the other "
                      f"{plural(run.batch.num_rows - n, 'row')} untouched, the ring bitwise the same")

    return check_on_puzzles("my_compressor (assembly, step 2)", fn, COMPRESSOR, seed, one, refuse=static_mistake)
