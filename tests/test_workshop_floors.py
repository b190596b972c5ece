"""Notebook 05's exercise check: the right answers pass, each usual mistake is named."""

from __future__ import annotations

import pytest

from c2graph.measure import results
from c2graph.workshop.floors import check_replay_floor


def right_floor(floor_bytes, copy_GBps, launch_us):
    return max(floor_bytes / (copy_GBps * 1e3), launch_us)


def right_read(data, rows):
    return results.records(data, "fused", "graph")[rows]["median_us"]


def test_the_right_answers_pass():
    result = check_replay_floor(right_floor, right_read)
    assert result.ok and len(result.lines) == 4, str(result)


@pytest.mark.parametrize("floor, says", [
    (lambda b, c, l: b / (c * 1e3) + l, "you added the two floors"),
    (lambda b, c, l: min(b / (c * 1e3), l), "you took the lower floor"),
    (lambda b, c, l: b / (c * 1e3), "you returned the memory floor alone"),
    (lambda b, c, l: l, "you returned the launch floor even where"),
    (lambda b, c, l: max(b / (c * 1e9), l), "or are its units off"),
    (lambda b, c, l: max(b / c, l), "1000 times too large"),
    (lambda b, c, l: max(2 * b / (c * 1e3), l), "you doubled the memory floor"),
    (lambda b, c, l: str(l), "returned a str"),
])
def test_a_wrong_floor_is_named(floor, says):
    result = check_replay_floor(floor, right_read, seed=1)
    assert not result.ok and says in str(result), str(result)


@pytest.mark.parametrize("read, says", [
    (lambda d, n: results.records(d, "fused", "graph")[n], "returned a record (a dict)"),
    (lambda d, n: results.records(d, "fused", "eager")[n]["median_us"], "the replay is mode 'graph'"),
    (lambda d, n: results.records(d, "torch", "graph")[n]["median_us"], "the fused path's (path 'fused'"),
    (lambda d, n: results.records(d, "fused", "graph")[256 if n != 256 else 2048]["median_us"],
     "the bucket asked for is"),
    (lambda d, n: 1.0, "is no record of the results"),
])
def test_a_wrong_reading_is_named(read, says):
    result = check_replay_floor(right_floor, read, seed=2)
    assert not result.ok and says in str(result), str(result)


def test_an_unwritten_stub_says_so():
    def stub(*args):
        raise NotImplementedError("exercise: write this function (see the task above)")

    assert "not written yet" in str(check_replay_floor(stub, stub))


@pytest.mark.parametrize("floor, read", [
    (right_floor, right_read),
    (lambda b, c, l: b / (c * 1e3) + l, right_read),
    (right_floor, lambda d, n: results.records(d, "fused", "eager")[n]["median_us"]),
])
def test_the_check_gives_the_same_verdict_and_words_in_every_run(floor, read):
    texts = [str(check_replay_floor(floor, read)) for _ in range(3)]
    assert texts == [texts[0]] * 3, texts
