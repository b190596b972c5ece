"""A capture audit: what did this graph freeze, and which of it came from the batch seen at capture?

Every silent graph bug of the prefill story is a value frozen at capture that should have been
read at replay. A capture freezes, per node, every argument that is not a tensor (a Python int,
float or bool, a list of sizes) and every tensor by its address. The audit records them while
the work is captured:

- :func:`recording` (entered inside any capture) and :func:`audit_capture` (which captures
  ``fn()`` in a new :class:`~c2graph.graphs.graph.Graph` with it) record with the modes of
  :mod:`c2graph.graphs.op_record`: a ``TorchDispatchMode`` that sees every op the captured code
  issues (it sits above a CUDA graph and above the CPU emulation alike) and records its name, its
  non-tensor arguments by value, and its tensor arguments by address, read or written, labelled
  when they lie in one of the ``labels`` tensors (``"low_ratio_extend_offsets"``,
  ``"pos[:32]"``); and a ``TorchFunctionMode`` that names the call a refused capture died in.
- :func:`audit_twice` captures the same work twice, with two different batches loaded (the same
  static sizes), and compares: a value that differs between the two captures, or a tensor read at
  an address (or of a shape) that differs, was taken from the batch, not from static sizes. A
  value equal in both captures may still come from a batch; two batches that differ everywhere
  the work could look (starts, counts, live rows) make that unlikely.
- :func:`audit_runner` does this for a prefill graph runner's bucket: the dummy batch, then a
  ragged one (:func:`audit_batch`).

Tensors made during the capture (temporaries) are named by the op that made them, so their
addresses, which may differ between two captures, are not mistaken for batch contents.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ..compressor.batch import ExtendBatch, Request
from ..compressor.extend_offsets import build_extend_offsets
from .graph import Graph, warmup
from .op_record import CallWatch, OpRecord, Recorder


@dataclass
class CaptureRecords:
    """Every op of one capture, in order; ``refused`` is the capture's error (first line, and the
    call it died in) when the capture was refused."""

    records: list[OpRecord]
    refused: str | None = None

    def nodes(self) -> list[OpRecord]:
        """The records that launch work (one graph node each, or more on CUDA)."""
        return [r for r in self.records if r.launches]

    def table(self, *, limit: int | None = 12) -> str:
        """Per op that launches work: what it froze, read and wrote (up to ``limit`` ops; ``None``: all)."""
        if self.refused:
            return f"capture refused: {self.refused}"
        nodes = self.nodes()
        lines = [line for r in nodes[:limit] for line in _record_lines(r, [])]
        if limit is not None and len(nodes) > limit:
            lines.append(f"... {len(nodes) - limit} more ops that launch work")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()

    __repr__ = __str__


@dataclass(frozen=True)
class Flag:
    """A frozen argument that differs between the two captures: it came from the batch."""

    index: int
    op: str
    arg: str
    what: str  # "value", "address", "shape" or "op"
    first: object
    second: object

    def difference(self) -> str:
        """How the two captures differ, in words."""
        if self.what == "address" and self.first == self.second:
            return "read at a different address in each capture"
        if self.what == "value":
            return f"{self.first!r} in capture 1, {self.second!r} in capture 2"
        return f"{self.what} {self.first} in capture 1, {self.second} in capture 2"

    def __str__(self) -> str:
        if self.what == "op":
            return f"op {self.index}: the captured work itself changed: {self.first} vs {self.second}"
        return f"op {self.index} {self.op}: {self.arg}: {self.difference()}"


@dataclass
class GraphAudit:
    """Two captures of the same work with two batches loaded, and the arguments that differ.

    ``ok``: the capture was not refused and nothing it froze came from the batch.
    """

    title: str
    batches: tuple[str, str]
    first: CaptureRecords
    second: CaptureRecords | None
    flags: list[Flag] = field(default_factory=list)

    @property
    def refused(self) -> str | None:
        return self.first.refused or (self.second.refused if self.second else None)

    @property
    def ok(self) -> bool:
        return self.refused is None and not self.flags

    def nodes(self) -> list[OpRecord]:
        """The records of the first capture that launch work (one graph node each, or more on CUDA)."""
        return [r for r in self.first.records if r.launches]

    def flagged(self, op: str | None = None) -> set[str]:
        """Names of the flagged arguments (of one op, given its name or a part of it)."""
        return {f.arg for f in self.flags if op is None or op in f.op}

    def table(self, *, limit: int | None = 12) -> str:
        """The audit in words: per op that launches work, what it froze, read and wrote; flags marked ``<-- FROM THE BATCH``.

        Nodes with a flag are always shown; others up to ``limit`` (``None``: all).
        """
        lines = [self.title, f"  captured with (1) {self.batches[0]}", f"           and (2) {self.batches[1]}"]
        if self.refused:
            return "\n".join(lines + [f"capture refused: {self.refused}"])
        flagged = {f.index: [] for f in self.flags}
        for f in self.flags:
            flagged[f.index].append(f)
        shown, hidden = 0, 0
        for r in self.first.records:
            if not (r.launches or r.index in flagged):
                continue
            if r.index not in flagged and limit is not None and shown >= limit:
                hidden += 1
                continue
            shown += 1
            lines += _record_lines(r, flagged.get(r.index, []))
        if hidden:
            lines.append(f"... {hidden} more ops that launch work, none flagged")
        if self.flags:
            lines.append(f"verdict: {len(self.flags)} frozen argument(s) came from the batch seen at capture")
        else:
            lines.append("verdict: nothing frozen came from the batch: the values are static sizes and "
                         "every tensor is read at an address that does not change")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()

    __repr__ = __str__


def _record_lines(r: OpRecord, flags: list[Flag]) -> list[str]:
    by_arg = {f.arg: f for f in flags}
    head = f"op {r.index}  {r.op}" + ("" if r.launches else "  (launches nothing)")
    if flags:
        head += f"   [{r.where}]"
    out = [head]
    if r.scalars:
        out.append("    froze:  " + ", ".join(_mark(f"{n}={v!r}", by_arg.get(n)) for n, v in r.scalars))
    for written, word in ((False, "reads: "), (True, "writes:")):
        tensors = [t for t in r.tensors if t.written == written]
        plain = [str(t) for t in tensors if t.name not in by_arg]
        if plain:
            out.append(f"    {word} " + ", ".join(plain))
        out += [f"    {word} " + _mark(str(t), by_arg[t.name]) for t in tensors if t.name in by_arg]
    return out


def _mark(text: str, flag: Flag | None) -> str:
    if flag is None:
        return text
    return f"{text}  <-- FROM THE BATCH: {flag.difference()}"


# ---------------------------------------------------------------------------------------------
# Capturing and comparing


@contextlib.contextmanager
def recording(labels: dict[str, torch.Tensor]):
    """Record every op issued inside the ``with`` block: enter it inside a capture (any backend).

    Yields a :class:`CaptureRecords` that fills as the block runs; when the block raises (a
    refused capture), ``refused`` says why (its error's first line and the call it died in) and
    the error goes on.
    """
    if not isinstance(labels, dict) or not all(isinstance(t, torch.Tensor) for t in labels.values()):
        raise ValueError("labels must be a dict of name -> tensor")
    recorder, watch = Recorder(labels), CallWatch()
    records = CaptureRecords(recorder.records)
    try:
        with watch, recorder:
            yield records
    except Exception as e:
        at = watch.refused_at or recorder.error_op
        records.refused = f"{str(e).splitlines()[0]} ({f'in {at}' if at else 'at the end of the capture'})"
        raise


def audit_capture(fn: Callable[[], object], labels: dict[str, torch.Tensor], *, backend: str | None = None
                  ) -> CaptureRecords:
    """Capture ``fn()`` in a new :class:`Graph` (``backend`` as there) and record every op it issues
    (:func:`recording`). ``labels``: tensors to name by where an argument lies. A refused capture is
    reported in ``refused``, never raised."""
    records = None
    try:
        with Graph(backend).capture(), recording(labels) as records:
            fn()
    except Exception as e:  # a refused capture is the finding, not a failure of the audit
        if records is None:  # refused before recording began
            raise
        if records.refused is None:  # the capture failed as it ended
            records.refused = f"{str(e).splitlines()[0]} (at the end of the capture)"
    return records


def audit_twice(fn, load_first, load_second, labels, *, title: str, batches: tuple[str, str],
                warmup_iters: int = 1) -> GraphAudit:
    """Capture ``fn()`` after ``load_first()`` and again after ``load_second()``; flag what differs.

    Each capture is preceded by ``warmup_iters`` eager calls (lazy set-up stays out of the capture).
    """
    captures = []
    for load in (load_first, load_second):
        load()
        warmup(fn, iters=warmup_iters)
        captures.append(audit_capture(fn, labels))
        if captures[-1].refused:
            return GraphAudit(title, batches, captures[0], captures[1] if len(captures) > 1 else None)
    return GraphAudit(title, batches, captures[0], captures[1], compare_captures(*captures))


def compare_captures(first: CaptureRecords, second: CaptureRecords) -> list[Flag]:
    """Every argument that differs between two captures of the same work."""
    flags = []
    for a, b in zip(first.records, second.records):
        if a.op != b.op:
            return flags + [Flag(a.index, a.op, "op", "op", a.op, b.op)]
        sb = dict(b.scalars)
        flags += [Flag(a.index, a.op, n, "value", v, sb.get(n)) for n, v in a.scalars if sb.get(n) != v]
        tb = {t.name: t for t in b.tensors}
        for t in a.tensors:
            u = tb.get(t.name)
            if u is None or u.key != t.key:
                same_place = u is not None and u.key[:3] == t.key[:3]
                what = "shape" if same_place else "address"
                flags.append(Flag(a.index, a.op, t.name, what, t.shape if same_place else t.label,
                                  (u.shape if same_place else u.label) if u else None))
    if len(first.records) != len(second.records):
        n = min(len(first.records), len(second.records))
        flags.append(Flag(n, "", "op", "op", f"{len(first.records)} ops", f"{len(second.records)} ops"))
    return flags


# ---------------------------------------------------------------------------------------------
# The prefill graph runner's audit


def audit_batch(runner, bucket: int) -> ExtendBatch:
    """A ragged batch of ``bucket`` rows for the second capture: up to 3 requests starting at
    positions 1, 0 and 3, about a quarter of the rows padding, every ``raw_out_loc`` 0 (so its
    warm-up writes nothing)."""
    n = min(3, runner.request_slots, min(p.pool_requests for p in runner.layer_pools))
    live = bucket - max(1, bucket // 4) if bucket > 1 else bucket
    lengths = [live // n + (1 if i < live % n else 0) for i in range(n)]
    requests = tuple(Request(i, (1, 0, 3)[i], m) for i, m in enumerate(lengths))
    pos, req = torch.zeros(bucket, dtype=torch.int64), torch.zeros(bucket, dtype=torch.int64)
    row = 0
    for r in requests:
        pos[row:row + r.extend_len] = torch.arange(r.prefix_len, r.prefix_len + r.extend_len)
        req[row:row + r.extend_len] = r.pool_index
        row += r.extend_len
    dev, zeros = runner.device, torch.zeros(bucket, dtype=torch.int64, device=runner.device)
    offsets = build_extend_offsets(lengths, runner.request_slots, device=dev)
    return ExtendBatch(requests, pos.to(dev), req.to(dev), zeros, zeros.clone(), offsets, kv_slots_needed=1)


def audit_runner(runner, bucket: int) -> GraphAudit:
    """Audit the graph of ``bucket`` of a prefill graph runner (or a broken variant of one).

    The work is the runner's captured step (``runner._compress(bucket)``); the first capture loads
    the batch its graphs are captured with, the second refreshes the buffers with
    :func:`audit_batch`, the way a replay does.
    """
    if bucket not in runner.buckets:
        raise ValueError(f"bucket = {bucket!r}; expected one of the runner's buckets {runner.buckets}")
    batch = audit_batch(runner, bucket)
    xs = [layer.random_hidden(batch.live_rows, seed=i) for i, layer in enumerate(runner.layers)]
    lengths = ", ".join(str(r.extend_len) for r in batch.requests)
    starts = ", ".join(str(r.prefix_len) for r in batch.requests)
    batches = (f"the dummy batch: one request covering all {bucket} rows",
               f"a ragged batch: {batch.batch_size} requests of {lengths} rows from positions {starts}, "
               f"then {bucket - batch.live_rows} padding rows")
    name = type(runner).__name__ + (f" ({runner.variant})" if hasattr(runner, "variant") else "")
    title = f"audit of {name}, bucket {bucket}, {len(runner.layers)} layer(s): {runner.path} path"
    return audit_twice(lambda: runner._compress(bucket), lambda: runner._load_capture_batch(bucket),
                       lambda: runner.refresh(batch, xs), runner_labels(runner), title=title, batches=batches)


def runner_labels(runner) -> dict[str, torch.Tensor]:
    """Every tensor a runner's captured work touches, by name: the shared metadata, and each
    layer's buffers, pools and weights (``"projected[layer 3]"`` where the runner has several)."""
    out = dict(runner.static.metadata())
    several = len(runner.layers) > 1
    for i, (layer, pools, buf) in enumerate(zip(runner.layers, runner.layer_pools, runner.static.layers)):
        tensors = {**buf.tensors(), **pools.tensors(), "norm_w": layer.norm_w, "wk": layer.wk,
                   "k_norm_w": layer.k_norm_w, "inv_freq": layer.inv_freq}
        out.update({f"{name}[layer {i}]" if several else name: t for name, t in tensors.items()})
    return out


