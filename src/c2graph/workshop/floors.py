"""Notebook 05's exercise: which limit sets a graph replay's time, read from a table of the two floors.

The reader writes ``my_replay_limit(floor_bytes, copy_GBps, launch_us, replay_us)``, which says what
sets a replay of ``replay_us`` µs (:func:`replay_limit` is the rule itself):

- ``"launch"``: the launch floor is the higher floor and the replay is within :data:`NEAR` times
  it (only launching less would help);
- ``"memory"``: the memory floor (``floor_bytes`` at ``copy_GBps``, which counts bytes read plus
  written, as ``floor_bytes`` does) is the higher floor and the replay is within :data:`NEAR`
  times it (only moving fewer bytes would help);
- ``"own work"``: the replay is more than :data:`NEAR` times the higher floor: neither floor
  explains it, the implementation's own work does (its extra bytes, its launches, its chain of
  dependent memory waits), and only changing the implementation helps.

:func:`check_replay_limit` runs the reader's function on fixed cases first (one where each verdict is
right, each placed where a usual mistake gives another verdict), then on cases drawn from
:data:`~c2graph.workshop.practice.CHECK_SEED`, none of them near a boundary, so the same
function gets the same verdict on every run. A wrong answer is matched, over every case, to the
usual mistakes (the lower floor taken, the replay not compared at all, the floors added, a power
of ten off in the units, the two names swapped, ...), and named.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from .check import CheckResult, run_check
from .practice import CHECK_SEED

NEAR = 2.0
"""A replay within this many times its higher floor is set by that floor."""
VERDICTS = ("launch", "memory", "own work")


def _rule(memory_us: float, launch_us: float, replay_us: float, near: float = NEAR) -> str:
    higher = max(memory_us, launch_us)
    if replay_us > near * higher:
        return "own work"
    return "memory" if memory_us > launch_us else "launch"


def _higher_only(m, l, r):
    return "memory" if m > l else "launch"


def _lower(m, l, r):
    if r > NEAR * min(m, l):
        return "own work"
    return "memory" if m < l else "launch"


def _swapped(m, l, r):
    return {"memory": "launch", "launch": "memory"}.get(_rule(m, l, r), "own work")


MISTAKES: tuple[tuple[Callable[[float, float, float], str], str], ...] = (
    (_higher_only, "you named the higher floor without comparing the replay with it: a replay more than "
                   f"{NEAR:g} times its higher floor is set by neither floor, but by the implementation's own work"),
    (_lower, f"you compared the replay with the lower floor: the higher floor is the one that binds, and the "
             f"replay is compared with it (within {NEAR:g} times it: that floor; beyond: own work)"),
    (_swapped, "your 'launch' and 'memory' are swapped: 'memory' is where the bytes over the bandwidth take "
               "longer than a launch"),
    (lambda m, l, r: _rule(m, l, r, near=1.0),
     f"you called every replay above its higher floor own work: no replay is below its floor; within {NEAR:g} "
     "times it, the floor sets it"),
    (lambda m, l, r: "own work" if r > NEAR * (m + l) else ("memory" if m > l else "launch"),
     "you added the two floors: they are not paid one after the other, the higher one binds (max)"),
    (lambda m, l, r: _rule(2 * m, l, r), "you doubled the memory floor: the copy bandwidth already counts bytes "
                                         "read plus written, as floor_bytes does"),
    (lambda m, l, r: _rule(m / 2, l, r), "your memory floor is too small, so a replay near it looks far above "
                                         "it: halved (the copy bandwidth already counts bytes read plus written, as "
                                         "floor_bytes does), or a power of ten off (GB/s is 1e3 bytes a µs: "
                                         "floor_bytes / (copy_GBps * 1e3) µs)?"),
) + tuple(
    (lambda m, l, r, k=k: _rule(m * 10.0**k, l, r),
     f"your memory floor is {10.0**k:g} times too large: GB/s is 1e9 bytes a second, so 1e3 bytes a µs "
     "(floor_bytes / (copy_GBps * 1e3) µs)")
    for k in (3, 6, 9)
)
"""The usual wrong rules, each as ``(rule(memory floor, launch floor, replay), what it gets wrong)``."""

FIXED = (
    # (what, floor_bytes, copy_GBps, launch_us, replay_us): one verdict each, where a mistake gives another
    ("a small bucket, the replay near the launch floor", 3 * 2**20 // 2, 3000.0, 3.2, 4.9),
    ("a small bucket, the replay far above both floors", 3 * 2**20 // 2, 3000.0, 3.2, 17.0),
    ("a large bucket, the replay near the memory floor", 340 * 2**20, 3000.0, 3.2, 160.0),
    ("a large bucket, the replay far above the memory floor", 340 * 2**20, 3000.0, 3.2, 640.0),
    ("a middle bucket, the memory floor a little above the launch floor", 11 * 2**20 // 2, 2000.0, 2.4, 4.6),
    ("a middle bucket, the launch floor a little above the memory floor", 11 * 2**20 // 2, 4500.0, 2.0, 3.1),
    ("a middle bucket, the replay over twice the higher floor, under twice both together", 11 * 2**20 // 2, 2000.0,
     2.4, 10.0),
)


def _random_cases(rng: random.Random, n: int = 10) -> list[tuple[str, int, float, float, float]]:
    """``n`` cases, each clear of every boundary: the floors at least 1.5 times apart, the replay at
    most 1.7 times or at least 2.5 times its higher floor (and the mistakes' boundaries likewise)."""
    cases = []
    while len(cases) < n:
        copy, launch = rng.uniform(1500.0, 5000.0), rng.uniform(2.0, 6.0)
        nbytes = rng.randint(1, 600) * 2**20 // 2
        memory = nbytes / (copy * 1e3)
        higher = max(memory, launch)
        replay = higher * (rng.uniform(1.1, 1.7) if rng.random() < 0.5 else rng.uniform(2.5, 12.0))
        clear = max(memory, launch) / min(memory, launch) >= 1.5
        for scale in (1.0, 2.0, 0.5, 1e3, 1e6, 1e9):  # no wrong rule sits near its boundary either
            m = memory * scale
            clear = clear and not (0.9 < m / launch < 1.1) and all(
                not (0.92 < replay / (f * x) < 1.08) for x in (m, launch, m + launch, min(m, launch))
                for f in (1.0, NEAR))
        if clear:
            cases.append((f"case {len(cases) + 1} drawn from the check's seed", nbytes, copy, launch, replay))
    return cases


def _limit_cases(limit: Callable, rng: random.Random) -> list[tuple[bool, str]]:
    cases = list(FIXED) + _random_cases(rng)
    seen = []
    for what, nbytes, copy, launch, replay in cases:
        memory = nbytes / (copy * 1e3)
        seen.append((what, nbytes, copy, launch, replay, memory, limit(nbytes, copy, launch, replay)))
    for what, nbytes, copy, launch, replay, memory, got in seen:
        if not isinstance(got, str) or got not in VERDICTS:
            return [(False, f"{what}: my_replay_limit({nbytes}, {copy:.1f}, {launch:.2f}, {replay:.2f}) returned {got!r}; "
                            f"expected one of {', '.join(repr(v) for v in VERDICTS)}")]
    wrong = [s for s in seen if s[-1] != _rule(s[5], s[3], s[4])]
    if not wrong:
        return [(True, f"{len(FIXED)} fixed cases (each verdict, near and far from each floor)"),
                (True, f"{len(seen) - len(FIXED)} cases drawn from the check's seed")]
    said = next((says for rule, says in MISTAKES if all(got == rule(m, l, r) for *_, l, r, m, got in seen)), None)
    lines = []
    for what, nbytes, copy, launch, replay, memory, got in wrong[:3]:
        want = _rule(memory, launch, replay)
        higher, which = max(memory, launch), "memory" if memory > launch else "launch"
        reason = (f"memory floor {memory:.2f} µs, launch floor {launch:.2f} µs: the {which} floor is higher, and the "
                  f"replay, {replay:.2f} µs, is {replay / higher:.1f} times it")
        lines.append((False, f"{what}: yours says {got!r}, the rule says {want!r} ({reason})"))
    if len(wrong) > 3:
        lines.append((False, f"{len(wrong) - 3} more of the {len(seen)} cases differ too"))
    lines.append((False, said or "no usual mistake gives exactly these answers: compare your steps with the "
                                 "rule, case by case, on the lines above"))
    return lines


def check_replay_limit(limit: Callable, seed: int = CHECK_SEED) -> CheckResult:
    """Check notebook 05's ``my_replay_limit(floor_bytes, copy_GBps, launch_us, replay_us)`` on the fixed cases,
    then on cases drawn from ``seed``: the same function gets the same verdict and words on every run."""
    rng = random.Random(seed)
    return run_check("what sets each replay", lambda: _limit_cases(limit, rng))


def replay_limit(floor_bytes: int, copy_GBps: float, launch_us: float, replay_us: float) -> str:
    """The rule itself: what sets a replay of ``replay_us`` µs (``"launch"``, ``"memory"`` or ``"own work"``)."""
    return _rule(floor_bytes / (copy_GBps * 1e3), launch_us, replay_us)
