"""Checks of notebook 04's exercises: the offsets builder, the in-place refresh, and an audit of your own code.

- :func:`check_offsets_builder` calls the reader's ``build_offsets(extend_lens, request_slots)``
  on fixed cases (a ragged batch, every slot full, a request of 0 rows, an idle rank, ...), and compares the
  ``[2, request_slots]`` int32 tensor with the package's (:func:`~c2graph.build_extend_offsets`).
- :func:`check_refresh` hands the reader's ``refresh_metadata(static, batch)`` the tensors a
  prefill graph of a fused and a torch layer was captured with, checks that each is still itself
  (object, memory, dtype, shape), replays the graph after it, and compares every cache and ring
  with the same batches run eagerly, bitwise; where they differ, it names each captured tensor
  that does not hold the batch's values, never written or written wrong.
- :func:`check_padding_zeroed` audits the reader's ``zero_padding(rows)`` over two batches of
  :class:`RequestRows` (the static inputs of the notebook's own-code audit) and replays a graph of
  it captured after the first batch, after the second and after a third that fills every request slot.

Every case is fixed: the same answer gets the same verdict in every run.

All three return a :class:`~c2graph.workshop.CheckResult`; a wrong or unfinished function is reported,
never raised.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from types import SimpleNamespace

import torch

from .._runtime import DEFAULT_DEVICE
from ..compressor.batch import ExtendBatch
from ..compressor.compress import compress, layer_path
from ..compressor.config import Config
from ..compressor.pools import POISON
from ..compressor.extend_offsets import build_extend_offsets
from ..compressor.model import layer_pools, served_layers
from ..compressor.req_to_token import ReqToTokenPool
from ..graphs.audit import audit
from ..graphs.graph import Graph, warmup
from ..prefill.runner import PrefillGraphRunner
from ..graphs.refusals import UNPINNED_COPY
from ..measure.compare import compare_pools
from .check import CheckResult, run_check

BUILDER_CASES = [
    ("3 requests of 5, 6 and 4 rows in 4 request slots", [5, 6, 4], 4),
    ("a full batch: 4 requests in 4 request slots", [3, 1, 7, 2], 4),
    ("1 request of 9 rows in 8 request slots", [9], 8),
    ("a request of 0 rows between two others", [4, 0, 3], 5),
    ("a request of 0 rows in the last request slot", [3, 5, 0], 3),
    ("an idle rank: no request in 4 request slots", [], 4),
]
REFRESH_BATCHES = [
    ("2 requests from position 0", [(0, 0, 7), (1, 0, 6)]),
    ("3 requests, 2 of them continuing at odd positions", [(0, 7, 5), (1, 6, 3), (2, 1, 6)]),
    ("a smaller batch after a larger one", [(2, 7, 3)]),
    ("every request slot full, the last request ending at row 16", [(3, 0, 4), (0, 12, 5), (1, 9, 3), (2, 10, 4)]),
    ("an idle rank: no request, 16 rows of padding", []),
]


def check_offsets_builder(build_offsets: Callable[[list[int], int], torch.Tensor]) -> CheckResult:
    """Check ``build_offsets(extend_lens, request_slots)``: int32 ``[2, request_slots]``, row 0 each
    request slot's first row, row 1 its row count, slots past the batch count 0 starting at the
    live rows."""
    first_wrong: list[tuple[torch.Tensor, torch.Tensor, str]] = []

    def cases():
        out = []
        for what, lens, slots in BUILDER_CASES:
            want = build_extend_offsets(lens, slots)
            got = build_offsets(list(lens), slots)
            problem = _builder_problem(got, want, sum(lens))
            if problem and not first_wrong and isinstance(got, torch.Tensor) and got.shape == want.shape:
                first_wrong.append((got, want, what))
            out.append((problem is None, what + (f": {problem}" if problem else "")))
        return out

    def figure():
        from ..pictures.draw_offsets import draw_offsets_diff

        if first_wrong:
            got, want, what = first_wrong[0]
            return draw_offsets_diff(got, want, title=what)
        return None

    return run_check("offsets builder", cases, figure)


def _builder_problem(got, want: torch.Tensor, live: int) -> str | None:
    if not isinstance(got, torch.Tensor):
        return f"returned a {type(got).__name__}; expected a torch.Tensor"
    if got.dtype != torch.int32:
        return f"dtype {got.dtype}; expected torch.int32 (the kernel reads 32-bit offsets)"
    if tuple(got.shape) != tuple(want.shape):
        return f"shape {list(got.shape)}; expected {list(want.shape)} (one column per request slot)"
    g, w = got.cpu().tolist(), want.tolist()
    bad = [(k, r) for k in (0, 1) for r in range(len(w[0])) if g[k][r] != w[k][r]]
    if not bad:
        return None
    cells = ", ".join(f"[{k}, {r}] is {g[k][r]}, expected {w[k][r]}" for k, r in bad[:4])
    past = [r for k, r in bad if w[1][r] == 0 and k == 0]
    hint = f" (a slot past the batch starts at the live rows, {live})" if past else ""
    return cells + hint


def check_refresh(refresh_metadata: Callable[[SimpleNamespace, ExtendBatch], None]) -> CheckResult:
    """Check ``refresh_metadata(static, batch)``: it must write the batch's ``pos``, ``req``,
    ``raw_out_loc``, ``c2_slot`` and ``extend_offsets`` into the captured tensors ``static.pos``,
    ..., ``static.low_ratio_extend_offsets`` in place. A prefill graph of two layers sharing that
    metadata (one fused, one torch; bucket 16) is replayed after it, batch after batch, and
    compared with eager. First, each captured tensor must still be itself: the same object, memory,
    dtype and shape. Where the graph differs from eager, the line names each captured tensor that
    does not hold the batch's values, and whether it was never written or written wrong."""
    failed: list[tuple] = []

    def cases():
        runner = _refresh_runner()
        runner.static.load_dummy(16)  # a clean start: every row padding
        refs = [p.poison(POISON).clone() for p in runner.layer_pools]
        alloc = ReqToTokenPool(runner.layers[0].cfg, 4, 64, seed=4)
        out = []
        for i, (what, requests) in enumerate(REFRESH_BATCHES):
            batch = ExtendBatch.build(requests, alloc, request_slots=4, pad_to=16, device=runner.device)
            static = SimpleNamespace(**runner.static.metadata())
            before = {name: (t, t.clone(), t.data_ptr()) for name, t in vars(static).items()}
            refresh_metadata(static, batch)
            changed = _changed_tensors(static, before)
            xs = [layer.random_hidden(batch.live_rows, seed=40 + 2 * i + k) for k, layer in enumerate(runner.layers)]
            runner.project(batch, xs)
            runner.graphs[16].replay()
            wrong = []
            for layer, x, got, ref in zip(runner.layers, xs, runner.layer_pools, refs):
                compress(layer, x, batch, ref)
                bad = [c for c in compare_pools(got, ref, skip_slot0=not layer.use_fused_gate) if not c]
                if bad:
                    wrong.append(f"{layer_path(layer)} layer: " + ", ".join(_where_differs(c) for c in bad))
                if bad and not failed:
                    failed.append((got.clone(), ref.clone(), batch, layer_path(layer)))
            line = what + (": graph == eager, bitwise" if not wrong else ": differs from eager in " + "; ".join(wrong))
            if changed:
                line += ". " + changed
                _refresh_runner.cache_clear()  # its captured tensors are not what its graph reads: build it anew
            elif wrong:
                line += ". " + "; ".join(_stale_tensors(static, before, batch))
            out.append((not wrong and not changed, line))
        return out

    def figure():
        from ..pictures.draw_graph import draw_wrong_slots

        if failed:
            got, want, batch, path = failed[0]
            return draw_wrong_slots(got, want, batch, got.cfg.ring_size, poison=POISON,
                                    title=f"the {path} layer after your refresh, against eager")
        return None

    return run_check("in-place refresh", cases, figure)


def _changed_tensors(static: SimpleNamespace, before: dict) -> str:
    """The captured tensors that are no longer themselves after the refresh, in words ('' if none):
    rebound to new tensors, or given another dtype, shape or memory (``.data =``, ``set_``,
    ``resize_``): the graph reads only the memory it was captured with, as it was captured."""
    rebound = [name for name, (t, _, _) in before.items() if getattr(static, name) is not t]
    if rebound:
        return (f"You rebound static.{', static.'.join(rebound)} to new tensors: the graph still reads the ones "
                "it was captured with; copy_ into them instead")
    changes: dict[str, list[str]] = {}
    for name, (t, old, ptr) in before.items():
        what = [f"dtype {t.dtype} (captured as {old.dtype})"] * (t.dtype != old.dtype)
        what += [f"shape {list(t.shape)} (captured as {list(old.shape)})"] * (t.shape != old.shape)
        what += ["other memory"] * (t.data_ptr() != ptr)
        if what:
            changes.setdefault(", ".join(what), []).append(f"static.{name}")
    return "; ".join(f"{', '.join(names)} now {'have' if len(names) > 1 else 'has'} {what}"
                     for what, names in changes.items()) + (
        ": the graph reads only the memory it was captured with, as it was; copy_ into it instead" if changes else "")


def _stale_tensors(static: SimpleNamespace, before: dict, batch: ExtendBatch) -> list[str]:
    """Each captured tensor that does not hold the batch's values, and where: never written (it
    holds what it held before the refresh there) or written wrong."""
    out = []
    for name, (t, old, _) in before.items():
        want = getattr(batch, "extend_offsets" if name == "low_ratio_extend_offsets" else name)
        differs = t != want
        if not differs.any():
            continue
        padding = t.dim() == 1 and bool((differs.nonzero() >= batch.live_rows).all())
        hint = f" (the rows that differ are padding rows, from row {batch.live_rows}: they belong to the batch too)"
        if torch.equal(t, old):
            out.append(f"static.{name} was never written: it still holds the previous batch's values" + hint * padding)
            continue
        unit = "rows" if t.dim() == 1 else "cells"
        parts = [f"{how} at {unit} {_cells(mask)}" for how, mask in (
            ("never written", differs & (t == old)), ("written wrong", differs & (t != old))) if mask.any()]
        out.append(f"static.{name}: " + ", ".join(parts) + hint * padding)
    return out or ["every captured tensor holds this batch's values: the difference is left from an earlier batch"]


def _cells(mask: torch.Tensor) -> str:
    """``[3, 4, 5, ...]`` or ``[(1, 0), ...]``: where ``mask`` is true, the first six."""
    where = [tuple(i) if len(i) > 1 else i[0] for i in mask.nonzero().tolist()]
    return f"{where[:6]}"[:-1] + (", ...]" if len(where) > 6 else "]")


def _where_differs(c) -> str:
    """``kv_cache c2 slots [24, 25, ...]`` from a failed comparison."""
    unit = "rows" if c.name == "ring" else "c2 slots"
    return f"{c.name} {unit} {c.bad[:6]}"[:-1] + (", ...]" if len(c.bad) > 6 else "]")


@functools.lru_cache(maxsize=None)
def _refresh_runner() -> PrefillGraphRunner:
    """A fused and a torch layer in graphs of bucket 16 and 4 request slots, captured once per process."""
    cfg = Config.tiny()
    layers = served_layers(cfg, 2, unfused_every=2, seed=9)
    pools = layer_pools(layers, 4, ReqToTokenPool(cfg, 4, 64).kv_slots)
    return PrefillGraphRunner(layers, pools, buckets=[16], request_slots=4)


class RequestRows:
    """The static inputs of notebook 04's own-code audit: a ragged batch of up to ``SLOTS``
    requests in ``ROWS`` rows, as a graph reads it, refreshed in place by :meth:`load`.

    - ``x``, ``out``: ``[ROWS]`` fp32, one value per row: what the step reads, and writes
    - ``offsets``: ``[2, SLOTS]`` int32, first row and row count of each request slot (the
      layout of ``low_ratio_extend_offsets``); ``scales``: ``[SLOTS]`` fp32, a factor per request
    - ``host_offsets``, ``host_scales``, ``live``: the same on the host, as an eager path keeps them
    """

    SLOTS, ROWS = 4, 16
    BATCHES = (((5, 2.0), (3, 3.0)), ((4, 0.5), (2, 4.0), (6, 1.5)),
               ((3, 1.0), (5, 2.5), (2, 0.5), (6, 3.0)))  # (rows, scale) of each request
    """Batch 1 and 2 (the audits'), and batch 3: every request slot full, the last request ending at row 16."""

    def __init__(self, device=DEFAULT_DEVICE):
        f32 = dict(dtype=torch.float32, device=device)
        self.x, self.out = torch.zeros(self.ROWS, **f32), torch.zeros(self.ROWS, **f32)
        self.scales = torch.zeros(self.SLOTS, **f32)
        self.offsets = torch.zeros(2, self.SLOTS, dtype=torch.int32, device=device)
        self.host_offsets, self.host_scales, self.live = [[], []], [], 0

    def describe(self, k: int) -> str:
        """Batch ``k`` in words."""
        rows = ", ".join(f"{n} rows x {f}" for n, f in self.BATCHES[k])
        return f"batch {k + 1}: {len(self.BATCHES[k])} requests ({rows})"

    def load(self, k: int) -> None:
        """Load batch ``k``: fresh rows, its offsets and scales ``copy_``'d in place, and the host lists."""
        lens = [n for n, _ in self.BATCHES[k]]
        scales = [f for _, f in self.BATCHES[k]] + [0.0] * (self.SLOTS - len(lens))
        offsets = build_extend_offsets(lens, self.SLOTS)
        self.x.copy_(torch.rand(self.ROWS, generator=torch.Generator().manual_seed(k)) + 1.0)
        self.offsets.copy_(offsets)
        self.scales.copy_(torch.tensor(scales))
        self.host_offsets, self.host_scales, self.live = offsets.tolist(), scales, sum(lens)


def check_padding_zeroed(zero_padding: Callable[[RequestRows], None]) -> CheckResult:
    """Check the reader's ``zero_padding(rows)``: zero ``rows.out`` past the batch's live rows and
    leave the live rows as they are, in a graph. The audit over batch 1 then batch 2 must be clean
    (else each flag, with its line; a refused capture is named as the host sync or host copy it is),
    and a graph captured after batch 1 and replayed after batch 2, then after batch 3 (every request
    slot full, no padding row; ``out`` filled with a poison first), must zero exactly each batch's
    padding rows."""

    def cases():
        rows = RequestRows()
        found = audit(lambda: zero_padding(rows), [lambda: rows.load(0), lambda: rows.load(1)])
        verdict = f"the audit over batch 1, then batch 2: {found.verdict()}"
        out = [(found.ok, "; ".join([verdict, *map(str, found.flags)]) + _refusal_words(found.refused))]
        if found.refused:
            return out
        rows.load(0)
        warmup(lambda: zero_padding(rows), iters=1)
        graph = Graph()
        with graph.capture():
            zero_padding(rows)
        for k in (1, 2):
            rows.load(k)
            rows.out.fill_(POISON)
            graph.replay()
            out.append(_replay_line(rows, k))
        return out

    return run_check("zero the padding rows", cases)


def _refusal_words(refused: str | None) -> str:
    """Why a capture of the reader's step was refused, in the reader's terms ('' if it was not)."""
    if not refused:
        return ""
    if refused.startswith(UNPINNED_COPY.splitlines()[0]):
        return (". That is a host copy: a value went between the host and the device inside the capture "
                "(`.tolist()`, `.cpu()`, `torch.tensor(...)` of host numbers); keep the live count on the device")
    return (". That is a host sync: the host waited for a value of the batch (`int(t)`, `.item()`, `if t:`, "
            "a slice bound or a grid taken from a tensor), which a capture cannot do. Keep the live row count a "
            "tensor (`rows.offsets[1].sum()`) and compare it with `torch.arange(rows.ROWS)` on the device")


def _replay_line(rows: RequestRows, k: int) -> tuple[bool, str]:
    """The replay after batch ``k``: rows from ``rows.live`` must be 0, the live rows still the poison."""
    want = torch.where(torch.arange(rows.ROWS) < rows.live, POISON, 0.0)
    got = rows.out.cpu()
    bad = (got != want).nonzero().flatten().tolist()
    what = f"a graph captured after batch 1, replayed after batch {k + 1} ({rows.describe(k).split(': ')[1]}, " \
           f"{rows.live} live rows): "
    if not bad:
        padding = f"rows {rows.live} to {rows.ROWS - 1} zeroed" if rows.live < rows.ROWS else "no padding row"
        return True, what + f"{padding}, the live rows untouched"
    zeroed_live = [r for r in bad if r < rows.live]
    starts, counts = rows.host_offsets
    why = f"rows {bad} wrong " + (f"(rows from {rows.live} must be 0, the live rows untouched)" if rows.live < rows.ROWS
                                  else "(no row is padding here: every row is live and must stay untouched)")
    if zeroed_live and zeroed_live[0] == starts[-1] and counts[-1] > 0:
        why += (f": you zeroed from row {starts[-1]}, the last request slot's first row (`offsets[0, -1]`). "
                "It equals the live row count only while the last slot is past the batch; here every slot is "
                f"full and its request holds rows {starts[-1]} to {starts[-1] + counts[-1] - 1}. The live row "
                "count is the sum of the counts, `offsets[1].sum()`")
    elif zeroed_live:
        why += f": live rows {zeroed_live} were zeroed"
    return False, what + why
