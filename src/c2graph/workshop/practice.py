"""The workbench every exercise check of notebooks 01 and 03 runs on, and notebook 03's capture.

- :class:`StaticBatch`: metadata tensors at fixed addresses, what a captured function reads;
  :func:`capture_yours` warms the reader's function up and captures one call of it
  (:meth:`~c2graph.graphs.graph.Graph.capture_fn`), and :func:`refusal_words` says in plain
  words why the capture refused it, naming the function and the line (the toolkit's record of
  the refusal, :meth:`~c2graph.graphs.graph.Graph.audit`);
- the practice batches (the hand-made edge cases of :data:`HAND_MADE` first, then seeded random
  ones, so that a check gives the same verdict in every run) and poisoned practice pools;
- the words and the picture a failed check shows: :func:`row_words`, :func:`requests_text`,
  :func:`rows_figure`, and :func:`result_problem`, which checks a returned tensor's type, dtype,
  shape and device before any value is compared.

Notebook 01's own functions and the checks of its exercises are in
:mod:`c2graph.workshop.my_compressor`; notebook 03's checks in :mod:`c2graph.workshop.my_graph`.
"""

from __future__ import annotations

import random
import textwrap
from dataclasses import dataclass

import torch
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from ..compressor.batch import ExtendBatch
from ..compressor.config import Config
from ..compressor.pools import POISON, Pools
from ..compressor.req_to_token import ReqToTokenPool
from ..compressor.rows import plan_rows
from ..graphs.graph import Graph, warmup
from ..graphs.op_record import CaptureRecord
from ..graphs.refusals import NOT_PERMITTED, PREVIOUS_ERROR, UNPINNED_COPY
from ..pictures.draw import PADDING_COLOUR, request_colour


# --- a static batch: what a captured function reads --------------------------------------------


from ..prefill.static_batch import StaticBatch  # noqa: E402  (the shared builder, re-exported)


@dataclass
class Captured:
    """What :func:`capture_yours` got: the graph and what the captured call returned, or, when the
    capture refused the call, the toolkit's ``record`` of why and where
    (:class:`~c2graph.graphs.op_record.CaptureRecord`), read here as ``error``, its first line
    (CUDA's or torch's words; an error the captured code raised, by its type: ``"RuntimeError:
    ..."``, with ``raised`` true), ``where`` (``"cell 12, line 3 in my_store, called from ..."``),
    ``code``, the innermost line's source, and ``stack``, each line's ``(where, code)``, innermost first."""

    graph: Graph | None
    out: object = None
    record: CaptureRecord | None = None

    @property
    def error(self) -> str | None:
        return self.record.refused if self.record else None

    @property
    def raised(self) -> bool:
        return bool(self.record and self.record.raised)

    @property
    def where(self) -> str:
        return self.record.refused_where if self.record else ""

    @property
    def code(self) -> str:
        return self.record.refused_code if self.record else ""

    @property
    def stack(self) -> tuple[tuple[str, str], ...]:
        return self.record.refused_stack if self.record else ()

    @property
    def message(self) -> str:
        """``error`` without the type name an error the captured code raised is prefixed with."""
        return (self.error or "").partition(": ")[2] if self.raised else self.error or ""

    @property
    def function(self) -> str | None:
        """The name of the reader's function the refused line is in (``"my_store"``)."""
        return self.stack[0][0].rpartition(" in ")[2] if self.stack else None

    @property
    def at(self) -> str:
        """The refused line in the reader's words: ``"`my_store` (cell 12, line 3: `mask[row] = True`),
        called from `my_compress`"``. A place in source made by ``exec`` (``"<...>"``: notebook 03's
        copy of the reader's notebook 01) has no line the reader can open, so only its code is shown."""
        if not self.stack:
            return ""
        place, _, name = self.stack[0][0].rpartition(" in ")
        line = f"`{self.code}`" if self.code else "its last line"
        text = f"`{name}` ({place}: {line})" if place and not place.startswith("<") else f"`{name}` ({line})"
        return "".join([text, *(f", called from `{w.rpartition(' in ')[2]}`" for w, _ in self.stack[1:])])


def capture_yours(fn, *, warmup_iters: int = 1) -> Captured:
    """Warm ``fn()`` up eagerly, then capture one call of it in a :class:`~c2graph.graphs.graph.Graph`.

    A capture refused with a ``RuntimeError`` (what CUDA and torch raise) comes back as a
    :class:`Captured` that says why and where; any other error, and any error of the warm-up,
    is raised."""
    warmup(fn, warmup_iters)
    graph = Graph()
    try:
        out = graph.capture_fn(fn, 0)  # warmed up above: an error of the warm-up is not a refusal
    except RuntimeError:
        return Captured(None, None, graph.audit())
    return Captured(graph, out)


def refusal_words(captured: Captured) -> str:
    """Why the capture refused the reader's function, and at which of its lines, in words that name
    the mistake, not the machine.

    A host copy reads, on a GPU, "Cannot copy between CPU and CUDA tensors ..." (and the CPU
    emulation refuses the same code the same way): on a laptop without CUDA those words mislead,
    so they are never shown; the mistake is named instead.
    """
    at = f" {captured.at}" if captured.stack else ""
    first = captured.message  # compared without a type name: a refusal is CUDA's or torch's text alone
    if first.startswith(UNPINNED_COPY.splitlines()[0]):
        kind = ("a copy between the host and the device: writing a Python value into a tensor element by "
                "element (`mask[row] = True`) sends a host number to the device on a GPU (the CPU emulation "
                "refuses it just as CUDA does), and `.tolist()` or `.cpu()` reads one back")
    elif first.startswith((NOT_PERMITTED, PREVIOUS_ERROR)):
        kind = ("a host sync (CUDA error 900, \"operation not permitted when stream is capturing\"): the host "
                "waited for a value of the batch (`.item()`, `int(t)`, printing a tensor, `nonzero`, or "
                "boolean-mask indexing, whose result's size depends on the values)")
    else:
        kind = first
    head = (f"your function{at} raised {captured.error} during the capture" if captured.raised
            else f"the capture refused your function{at}: {kind}")
    return (f"{head}. A graph replays no Python: a loop over the "
            "batch's requests or rows runs once, at capture, and every replay would repeat the capture's batch. "
            "Compute it with tensor ops of fixed shape (`torch.where` over every row) on the per-row tensors "
            "(`batch.pos`, `batch.req`, `batch.raw_out_loc`)")


# --- the batches every check runs on ------------------------------------------------------------

HAND_MADE = (
    ("one row, fewer rows than the ring", [(1, 0, 1)], None),
    ("pool index 0 from odd pos 1 in row 0, then padding (padding rows have req 0, pos 0)",
     [(0, 1, 3), (2, 0, 2)], 8),
    ("a request continuing at pos 5 right after one ending at pos 4", [(0, 0, 5), (1, 5, 3)], None),
    ("a lone odd row, a short request, padding", [(2, 3, 1), (3, 0, 4)], 8),
    ("a request of 0 rows between two others", [(4, 3, 3), (1, 6, 0), (5, 0, 4)], None),
    ("an idle rank: every row padding", [], 4),
    ("four requests, odd and even starts: every request slot full", [(4, 12, 6), (0, 7, 2), (5, 1, 3), (2, 0, 1)], None),
    ("the last request ending at the batch's end: 16 rows, no padding", [(3, 1, 9), (1, 4, 7)], None),
)
"""The edge cases every check of notebooks 01 and 03 runs first, in this order: ``(what, requests,
pad_to)``. All fit a bucket of 16 rows and 4 request slots (a graph check pads each to it)."""
HAND_MADE_WORDS = ("fewer rows than the ring, an odd start next to padding, a request of 0 rows, an idle rank, "
                   "every request slot full, the last request ending at the bucket's end")
"""What :data:`HAND_MADE` covers, in the words a passing check prints."""


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


CHECK_SEED = 7
"""The seed of every check's random batches and values: the same answer gets the same verdict in every run."""


def check_rng() -> random.Random:
    """The generator a check draws its random batches and values from, seeded with :data:`CHECK_SEED`."""
    return random.Random(CHECK_SEED)


# --- what a failed check says and shows ---------------------------------------------------------


def row_words(plan, row: int) -> str:
    """``row 7 (request slot 1, pos 5)`` or ``row 9 (padding)``."""
    p = plan.rows[row]
    return f"row {row} (padding)" if p.is_padding else f"row {row} (request slot {p.request_slot}, pos {p.pos})"


def requests_text(batch: ExtendBatch) -> str:
    """``(requests [(0, 0, 5), (1, 5, 3)], padded to 16)``: the batch a message is about."""
    pad = f", padded to {batch.num_rows}" if batch.num_rows > batch.live_rows else ""
    return f"(requests {[tuple(r) for r in batch.requests]}{pad})"


def result_problem(got, want: torch.Tensor, what: str, hint: str = "") -> str | None:
    """What is wrong with ``got`` (named ``what``) before any value is compared with ``want``: not a
    tensor, another dtype, another shape, another device. ``None`` when all four agree."""
    if not isinstance(got, torch.Tensor):
        return f"{what} is a {type(got).__name__}; expected a tensor of shape {tuple(want.shape)}, {want.dtype}"
    if got.dtype != want.dtype:
        return f"{what} has dtype {got.dtype}; expected {want.dtype}" + (f" ({hint})" if hint else "")
    if got.shape != want.shape:
        return (f"{what} has shape {tuple(got.shape)}; expected {tuple(want.shape)}: one value per row of the batch, "
                "padding rows included")
    if got.device != want.device:
        return (f"{what} is on {got.device}; the batch's tensors are on {want.device}: make new tensors on "
                "the batch's device (`device=batch.pos.device`, or `torch.zeros_like(batch.pos, ...)`)")
    return None


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


def figure_of(state: dict):
    """The picture of the first batch that differed (``state["fig"]``), drawn only when a check fails."""
    return lambda: rows_figure(*state["fig"]) if "fig" in state else None
