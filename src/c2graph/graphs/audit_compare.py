"""What differs between records of one step: two captures, or a capture and an eager call.

:func:`compare_captures` finds every frozen thing that differs between captures (a :class:`Flag`
each); :func:`explain` says, from the record, why a replay wrote a tensor otherwise than an eager
call did. Both serve :func:`c2graph.audit` (:mod:`.audit`).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from difflib import SequenceMatcher

from .audit_replay import Mismatch, Replayed
from .frozen_values import GeneratorArg
from .op_record import LAUNCH, CaptureRecord, OpRecord, TensorArg


@dataclass(frozen=True)
class Flag:
    """Something that came from the batch. ``what``: ``"value"``, ``"generator"``, ``"kernel"``
    (the Triton kernel's code), ``"grid"``, ``"view"``, ``"address"``, ``"launches"`` (their
    number or order): frozen, and different between the captures; ``"refused"`` (the capture
    refused the step) or ``"raised"`` (the step raised an error of its own); ``"replay"``: a
    tensor the replay wrote otherwise than the eager call, where the captures froze the same
    (``arg``: the tensor; ``values``: its rows, the eager call's value, the replay's; ``note``:
    why, from the record). ``values``: one per capture; ``where``/``code``: the lines that issued
    it, from the launch outward, and the innermost one's source (``stack``: each line's
    ``(where, code)``); ``index``: its record in capture 1."""

    where: str
    op: str
    arg: str
    what: str
    values: tuple
    code: str = ""
    index: int = -1
    stack: tuple[tuple[str, str], ...] = ()
    note: str = ""

    def difference(self) -> str:
        """How the captures differ, in words."""
        if self.what == "address" and len(set(self.values)) == 1:
            return "read at a different address at each capture"
        return ", ".join(f"{v} at capture {i + 1}" for i, v in enumerate(self.values))

    def words(self) -> str:
        """What differs, and what to do about it, in words."""
        if self.what == "refused":
            return f"the capture was refused: {self.values[0]}"
        if self.what == "raised":
            return f"the step raised {self.values[0]} during its capture: {self.advice()}"
        if self.what == "replay":
            rows, eager, replay = self.values
            return f"`{self.arg}` differs in {rows} (eager {eager}, replay {replay}): {self.note}"
        subject = {"launches": "launched", "grid": "grid =", "view": f"`{self.arg}` is",
                   "address": f"`{self.arg}` is", "value": f"`{self.arg}` =", "kernel": "the kernel is",
                   "generator": f"`{self.arg}` is"}[self.what]
        return f"{subject} {self.difference()}: {self.advice()}"

    def advice(self) -> str:
        """What to do about it (a refused capture: its error)."""
        return self.values[0] if self.what == "refused" else self.note if self.what == "replay" else _ADVICE[self.what]

    def __str__(self) -> str:
        return f"{self.where}: {self.op}: {self.words()}"


_ADVICE = {
    "value": ("a value from the batch, frozen into the graph; read it from a tensor refreshed (copy_) before each "
              "replay"),
    "generator": ("a random generator seeded from the batch while capturing: seeding is host work that no replay "
                  "repeats; seed one generator outside the captured step"),
    "kernel": ("a Triton kernel picked on the host per batch, frozen into the graph; launch one kernel and let it "
               "read what differs from a tensor"),
    "grid": ("a grid sized from the batch; size it from static sizes (the bucket, the request slots) and let the "
             "kernel skip what is not live"),
    "view": ("a view of the same tensor, sized or placed by the batch; use static sizes (the bucket) and let the "
             "work skip what is not live"),
    "address": ("a new tensor per batch, while the graph keeps the one it was captured with; copy_ each batch into "
                "one static tensor"),
    "launches": ("the number or order of launches came from the batch (a loop over its requests?); launch once, "
                 "over static sizes, and let the kernel skip empty request slots"),
    "raised": "an error of the captured code, not a refusal of the capture; no graph was made",
}


def compare_captures(captures: list[CaptureRecord]) -> list[Flag]:
    """Every frozen thing that differs between the captures (the first refusal, where one was refused)."""
    refused = next((c for c in captures if c.refused), None)
    if refused is not None:
        return [Flag(refused.refused_where, "capture", "", "raised" if refused.raised else "refused",
                     (refused.refused,), refused.refused_code, stack=refused.refused_stack)]
    first = captures[0].flat()
    pairings: list[dict[int, OpRecord]] = []  # per later capture: index of a record in capture 1 -> its match
    extra: dict[tuple, OpRecord] = {}  # ops or kernels that some capture launches more or less often, by line
    for other in (c.flat() for c in captures[1:]):
        pairs = {}
        for a, b in _aligned(first, other):
            if a is not None and b is not None:
                pairs[a.index] = b
            elif (a or b).launches:
                extra.setdefault(_issued(a or b), a or b)
        pairings.append(pairs)
    flags = []
    for a in first:
        records = [a, *(pairs.get(a.index) for pairs in pairings)]
        if None not in records:
            flags += _differences(records, [None, *pairings])
    for issued, r in extra.items():
        counts = tuple(sum(_issued(x) == issued for x in c.flat()) for c in captures)
        flags.append(Flag(r.where, r.op, "launches", "launches", tuple(f"{n} time(s)" for n in counts), r.code,
                          stack=r.stack))
    return flags


def _issued(r: OpRecord) -> tuple[str, str]:
    """What a record launches and the lines that launched it: how records of two captures are matched."""
    return r.op, r.where


def _aligned(first: list[OpRecord], other: list[OpRecord]) -> list[tuple[OpRecord | None, OpRecord | None]]:
    """The records of two captures side by side (``None`` across from a record the other capture
    lacks), matched by runs: consecutive records of one op issued by the same lines. Runs are
    matched in order; two matched runs of one length record by record, in order; runs of
    different lengths (a loop over the requests, or loops in a loop) first where the values they
    froze are the same (the same request), then in order."""
    runs_a, runs_b = _runs(first), _runs(other)
    aligned: list[tuple[OpRecord | None, OpRecord | None]] = []
    blocks = SequenceMatcher(None, [_issued(r[0]) for r in runs_a], [_issued(r[0]) for r in runs_b], autojunk=False)
    for tag, i1, i2, j1, j2 in blocks.get_opcodes():
        if tag == "equal":
            for run_a, run_b in zip(runs_a[i1:i2], runs_b[j1:j2]):
                aligned += _in_order(run_a, run_b) if len(run_a) == len(run_b) else _by_values(run_a, run_b)
        else:
            aligned += _in_order([r for run in runs_a[i1:i2] for r in run], [])
            aligned += _in_order([], [r for run in runs_b[j1:j2] for r in run])
    return aligned


def _runs(records: list[OpRecord]) -> list[list[OpRecord]]:
    """``records`` cut into runs of consecutive records of one op issued by the same lines."""
    return [list(run) for _, run in itertools.groupby(records, key=_issued)]


def _in_order(a: list[OpRecord], b: list[OpRecord]) -> list[tuple[OpRecord | None, OpRecord | None]]:
    """``a`` and ``b`` matched in order; the longer one's last records left over."""
    n = min(len(a), len(b))
    return [*zip(a[:n], b[:n]), *((r, None) for r in a[n:]), *((None, r) for r in b[n:])]


def _by_values(a: list[OpRecord], b: list[OpRecord]) -> list[tuple[OpRecord | None, OpRecord | None]]:
    """Two runs of one op and line: records that froze the same values matched first, the rest in order."""
    frozen = [[repr(r.scalars) for r in run] for run in (a, b)]
    out: list[tuple[OpRecord | None, OpRecord | None]] = []
    for _, i1, i2, j1, j2 in SequenceMatcher(None, *frozen, autojunk=False).get_opcodes():
        out += _in_order(a[i1:i2], b[j1:j2])
    return out


def _differences(records: list[OpRecord], pairings: list[dict[int, OpRecord] | None]) -> list[Flag]:
    """The arguments of one record that differ between the captures (``records``: one per capture;
    ``pairings``: per capture, its match of each record of capture 1, ``None`` for capture 1)."""
    a, flags = records[0], []
    if a.kernel is not None and not all(r.kernel == a.kernel for r in records):
        flags.append(Flag(a.where, a.op, "kernel", "kernel", tuple(str(r.kernel) for r in records), a.code, a.index,
                          a.stack))
    for name, value in a.scalars:
        values = tuple(dict(r.scalars).get(name) for r in records)
        if not all(_same(v, value) for v in values):
            what = ("grid" if name == "grid" and a.kind == LAUNCH else
                    "generator" if any(isinstance(v, GeneratorArg) for v in values) else "value")
            flags.append(Flag(a.where, a.op, name, what, values, a.code, a.index, a.stack))
    for t in a.tensors:
        same = [next((u for u in r.tensors if u.name == t.name), t) for r in records]
        if all(_same_tensor(t, u, pairs) for u, pairs in zip(same, pairings)):
            continue
        if all(u.key[0] == "number" for u in same):
            what, values = "value", tuple(u.key[1] for u in same)
        elif all(_same_tensor(t, u, pairs, whole=False) for u, pairs in zip(same, pairings)):
            what, values = "view", tuple(u.label for u in same)  # the same tensor: another part of it, or shape
        else:
            what, values = "address", tuple(u.label for u in same)
        flags.append(Flag(a.where, a.op, t.name, what, values, a.code, a.index, a.stack))
    return flags


def _same_tensor(t: TensorArg, u: TensorArg, pairs: dict[int, OpRecord] | None, *, whole: bool = True) -> bool:
    """Whether ``u`` (of a later capture) is ``t`` (of capture 1): the same tensor, and with ``whole``
    the same part of it. A temporary is the same where the ops that made them match (``pairs``)."""
    n = 3 if t.key[0] == "made" else 2  # the key's part that names the tensor (a temporary's: op and output)
    if t.key[0] == "made" and u.key[0] == "made" and pairs is not None:
        maker = pairs.get(t.key[1])
        if maker is None or maker.index != u.key[1] or t.key[2] != u.key[2]:
            return False
    elif not _same(t.key[:n], u.key[:n]):
        return False
    return not whole or _same(t.key[n:], u.key[n:])


def _same(a, b) -> bool:
    """``a == b``, NaN equal to NaN, inside lists and tuples too."""
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float) and a != a and b != b:
        return True
    return a == b



def explain(m: Mismatch, replayed: Replayed, capture: CaptureRecord) -> Flag:
    """Why the replay of ``capture`` wrote ``m`` otherwise than the eager call of ``replayed``, from
    the records: a value, a kernel, a grid or launches that differ between the capture and the eager
    call (work the capture left out, a value that changes from call to call), a tensor another
    thread wrote, a generator seeded inside the step; else the capture's last write of the tensor."""
    eager = replayed.eager
    found = [f for f in compare_captures([capture, eager]) if f.what not in ("refused", "raised")]
    records = {r.index: r for r in capture.flat()}
    touching = [f for f in found if _touches(records.get(f.index), m.key)]
    for f in touching + [f for f in found if f not in touching]:
        if f.what == "launches":
            note = (f"{f.op} was launched {f.values[0]} in the capture and {f.values[1]} in the eager call: work the "
                    "capture left out or added (a branch on torch.cuda.is_current_stream_capturing(), or on the "
                    "batch?); a graph does only what its capture recorded")
        else:
            note = (f"`{f.arg}` of {f.op} was {f.values[0]} in the capture and {f.values[1]} in the eager call: "
                    "a value that changes from call to call (a call counter?) or comes from the batch, frozen "
                    "into the graph")
        return _replay_flag(m, f.where, f.op, f.code, f.index, f.stack, note)
    if m.tensor in replayed.elsewhere:
        where, code = replayed.threads[0] if replayed.threads else ("", "")
        return _replay_flag(m, where, "another thread", code, -1, ((where, code),) if where else (),
                            "another thread wrote it during the eager call; a capture records the work of its own "
                            "thread only, so the graph does none of it: do the work in the captured thread")
    for r in capture.flat():
        if any(isinstance(v, GeneratorArg) and v.fresh for _, v in r.scalars):
            return _replay_flag(m, r.where, r.op, r.code, r.index, r.stack,
                                "a generator seeded inside the step: each eager call draws the same numbers again, "
                                "while a replay repeats no seeding and draws on; seed one generator outside the step")
    writers = [r for r in capture.flat() if r.launches and _touches(r, m.key, written=True)]
    if writers:
        r = writers[-1]
        return _replay_flag(m, r.where, r.op, r.code, r.index, r.stack,
                            "the record shows nothing frozen that differs; the replay of this write gave another "
                            "result (work the record cannot see: a kernel launched through raw pointers?)")
    return _replay_flag(m, "", "the step", "", -1, (),
                        "no op the capture recorded writes it: the eager call wrote it by work the graph does not do")


def _replay_flag(m: Mismatch, where, op, code, index, stack, note) -> Flag:
    return Flag(where, op, m.tensor, "replay", (m.rows, m.eager, m.replay), code, index, stack, note)


def _touches(r: OpRecord | None, key: int, *, written: bool = False) -> bool:
    """Whether record ``r`` names a tensor of the storage at ``key`` (with ``written``: one it may write)."""
    if r is None or not key:
        return False
    return any(t.key[0] != "made" and t.storage == key and (not written or t.written is not False) for t in r.tensors)
