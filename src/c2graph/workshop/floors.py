"""Notebook 05's exercise: a bucket's replay time predicted from its two floors, then read off the
stored results.

The reader writes ``replay_floor_us(floor_bytes, copy_GBps, launch_us)``, the least time one graph
replay of the step can take (the higher of the memory floor and the launch floor), and
``measured_replay_us(data, rows)``, the fused path's measured replay at a bucket, read from a
results dict. :func:`check_replay_floor` tries both on seeded random values (the same verdict in
every run) and, when an answer is
wrong, says which mistake it looks like (floors added, the lower one taken, a unit off by a power
of ten, the eager call's time read instead of the replay's, ...).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable

from .check import CheckResult, run_check
from .practice import CHECK_SEED

ROWS = (256, 2048, 16384, 65536)
_PEERS = (("torch", "eager", "float64 reductions"), ("torch", "graph", "float64 reductions"),
          ("compiled", "graph", "fp32 reductions"), ("fused", "eager", "Triton kernel"),
          ("fused", "graph", "Triton kernel"))


def _number(value) -> float | None:
    """``value`` as a float when it is a plain number (a 0-dim tensor too), else ``None``."""
    if isinstance(value, bool):
        return None
    if hasattr(value, "item") and getattr(value, "numel", lambda: 0)() == 1:
        value = value.item()
    return float(value) if isinstance(value, (int, float)) else None


_GUESSES = (
    (lambda m, l: m + l, "you added the two floors: they are not paid one after the other, the higher one binds (max)"),
    (min, "you took the lower floor: the higher one binds (max)"),
    (lambda m, l: m, "you returned the memory floor alone: in a small bucket the launch floor is higher, and binds"),
    (lambda m, l: l, "you returned the launch floor even where the memory floor is higher: is the memory floor "
                     "left out, or are its units off? GB/s is 1e3 bytes a µs (floor_bytes / (copy_GBps * 1e3))"),
    (lambda m, l: max(m / 2, l), "you halved the memory floor: the copy bandwidth already counts bytes read plus "
                                 "written, as floor_bytes does"),
    (lambda m, l: max(2 * m, l), "you doubled the memory floor: the copy bandwidth already counts bytes read plus "
                                 "written, as floor_bytes does"),
) + tuple(
    (lambda m, l, k=k: max(m * 10.0**k, l),
     f"your memory floor is {10.0**k:g} times too {'large' if k > 0 else 'small'}: GB/s is 1e9 bytes a second, "
     "so 1e3 bytes a µs (floor_bytes / (copy_GBps * 1e3) µs)")
    for k in (3, 6, 9, -3)
)


def _floor_cases(replay_floor_us: Callable, rng: random.Random) -> list[tuple[bool, str]]:
    """Two buckets, one where each floor binds; a wrong answer is matched, over both, to a mistake."""
    copy, seen, out = rng.uniform(2000.0, 5000.0), [], []
    for what, nbytes in (("a large bucket (the memory floor binds)", rng.randint(50, 400) * 2**20),
                         ("a small bucket (the launch floor binds)", rng.randint(1, 8) * 2**20 // 4)):
        launch = rng.uniform(2.5, 4.0)
        got = replay_floor_us(nbytes, copy, launch)
        seen.append((what, f"replay_floor_us({nbytes}, {copy:.1f}, {launch:.2f})", got, _number(got),
                     nbytes / (copy * 1e3), launch))
    said = None
    if all(v is not None for *_, v, _, _ in seen):
        said = next((says for guess, says in _GUESSES
                     if all(math.isclose(v, guess(m, l), rel_tol=1e-6) for *_, v, m, l in seen)), None)
    for what, call, got, value, memory, launch in seen:
        head = f"{what}: {call}"
        want = max(memory, launch)
        if value is None:
            out.append((False, f"{head}: returned a {type(got).__name__}; expected a number of µs"))
        elif math.isclose(value, want, rel_tol=1e-6):
            out.append((True, f"{what}: the higher floor"))  # no random value printed: the same text every run
        else:
            why = said or (f"expected max(memory floor {memory:.3f} µs, launch floor {launch:.3f} µs) = {want:.3f} µs")
            out.append((False, f"{head}: {value:.4g} µs; {why}"))
    return out


def random_results(rng: random.Random) -> dict:
    """A results dict (only ``cases`` and ``records``) with random times: every path and mode of the
    stored results at every bucket, so that a reading of the wrong record gives another number."""
    records = []
    for n in ROWS:
        for path, mode, variant in _PEERS:
            scale = {"torch": 300.0, "compiled": 40.0, "fused": 15.0}[path] * (1 + n / 4096)
            scale *= 10 if mode == "eager" and path != "torch" else (6 if mode == "eager" else 1)
            records.append(dict(rows=n, path=path, mode=mode, variant=variant,
                                median_us=round(rng.uniform(1.0, 1.5) * scale, 3),
                                nodes=None if mode == "eager" else 1, launches=1 if mode == "eager" else None))
    return {"cases": [{"rows": n} for n in ROWS], "records": records}


def _measured_cases(measured_replay_us: Callable, rng: random.Random) -> list[tuple[bool, str]]:
    data = random_results(rng)
    out = []
    for k, n in enumerate(rng.sample(ROWS, 2)):
        want = next(r for r in data["records"] if (r["rows"], r["path"], r["mode"]) == (n, "fused", "graph"))
        got = measured_replay_us(data, n)
        head = f"measured_replay_us(results, {n})"
        value = _number(got)
        if isinstance(got, dict):
            out.append((False, f"{head}: returned a record (a dict); the time is its 'median_us'"))
        elif value is None:
            out.append((False, f"{head}: returned a {type(got).__name__}; expected a number of µs"))
        elif value == want["median_us"]:
            out.append((True, f"the fused path's graph replay, bucket {k + 1} of 2"))
        else:
            same = [r for r in data["records"] if r["median_us"] == value]
            if same:
                r = same[0]
                which = f"the {r['path']} path's {r['mode']} time at {r['rows']} rows"
                if r["path"] == "fused" and r["mode"] == "graph":
                    hint = f"the bucket asked for is {n} rows"
                elif r["path"] == "fused":
                    hint = "an eager call is timed at the host's pace; the replay is mode 'graph'"
                else:
                    hint = "the replay asked for is the fused path's (path 'fused', mode 'graph')"
                out.append((False, f"{head}: {value} µs is {which}: {hint}"))
            else:
                out.append((False, f"{head}: {value} µs is no record of the results; expected the fused "
                                   f"path's graph replay at {n} rows, {want['median_us']} µs"))
    return out


def check_replay_floor(replay_floor_us: Callable, measured_replay_us: Callable, seed: int = CHECK_SEED) -> CheckResult:
    """Check the two functions of notebook 05's exercise on seeded random values: the same answer gets the
    same verdict in every run (``seed`` draws other values, as the tests do)."""
    rng = random.Random(seed)
    return run_check("replay floor and measured replay",
                     lambda: _floor_cases(replay_floor_us, rng) + _measured_cases(measured_replay_us, rng))
