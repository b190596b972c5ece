"""Timers for the benchmark: CUDA events on a GPU, the wall clock on a CPU (smoke runs only).

Every timed call is one of several equivalent calls on different input sets, taken in turn, so a
call never finds its inputs in the cache that the previous call left warm (an H200's L2 holds
60 MB: a small batch would otherwise be timed from cache). Also measured here, in the same run:
the copy bandwidth (the ceiling for a memory-bound step) and the cost of one launch (the floor
for a small one).

Graph replays are timed *host ahead*: the GPU first runs a sleep kernel long enough for the host
to queue every timed replay behind it, so the events measure the GPU's work and never a gap in
which the GPU waited for Python to call the next replay. That is how a replay runs in a serving
engine, where the compressor is a few nodes of a forward pass's graph and no host code runs
between them. Eager calls are timed as the host issues them: their launch cost is the point.
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable, Sequence

import torch

from ..graphs.graph import Graph


def on_cuda(device: torch.device) -> bool:
    return torch.device(device).type == "cuda"


def median_us(calls: Sequence[Callable[[], object]], reps: int, device: torch.device, *, warmup: int = 2,
              host_ahead: bool = False) -> float:
    """Median time of one call, in µs, over ``reps`` calls taking ``calls`` in turn.

    Each call in ``calls`` runs ``warmup`` times first (compiles, caches, allocator). On CUDA each
    timed call sits between two ``torch.cuda.Event``s, every call queued before one final
    synchronize, so the times are the GPU's (for an eager call that waits on the host, the host's
    pace shows as the GPU waiting). ``host_ahead`` (graph replays): a sleep kernel first holds the
    GPU while the host queues every timed call, so no call waits for the host. On a CPU:
    ``time.perf_counter`` around each call.
    """
    if not calls:
        raise ValueError("calls is empty; expected at least one callable")
    if not isinstance(reps, int) or reps < 1:
        raise ValueError(f"reps = {reps!r}; expected an int >= 1")
    host_start = time.perf_counter()
    for call in calls:
        for _ in range(warmup):
            call()
    host_us = (time.perf_counter() - host_start) * 1e6 / max(1, warmup * len(calls))  # the host's time a call
    if not on_cuda(device):
        times = []
        for i in range(reps):
            start = time.perf_counter()
            calls[i % len(calls)]()
            times.append((time.perf_counter() - start) * 1e6)
        return statistics.median(times)
    torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    if host_ahead:  # twice the host's time for every call, and a millisecond more (at most 0.2 s)
        sleep_us = min(2 * reps * host_us + 1000, 200_000)
        torch.cuda._sleep(int(sleep_us * gpu_cycles_per_us(torch.device(device))))
    for i, (start, end) in enumerate(events):
        start.record()
        calls[i % len(calls)]()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(start.elapsed_time(end) * 1e3 for start, end in events)


def replay_us(graphs: Sequence[Graph], reps: int, device: torch.device) -> float:
    """Median time of one replay, in µs, taking ``graphs`` in turn, timed with the host ahead."""
    return median_us([g.replay for g in graphs], reps, device, host_ahead=True)


@functools.cache
def gpu_cycles_per_us(device: torch.device) -> float:
    """Clock cycles a microsecond of ``torch.cuda._sleep`` (a kernel that spins for a number of
    cycles), measured once with CUDA events."""
    with torch.cuda.device(device):
        torch.cuda._sleep(1_000_000)  # warm-up
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(10_000_000)
        end.record()
        end.synchronize()
        return 10_000_000 / (start.elapsed_time(end) * 1e3)


def copy_GBps(device: torch.device, nbytes: int = 1 << 30, reps: int = 20) -> float:
    """Copy bandwidth in GB/s, counting bytes read plus bytes written, of one ``nbytes`` copy.

    On CUDA a device-to-device ``copy_`` timed with CUDA events; on a CPU a memory copy timed
    with the wall clock (a smoke run's number, nothing to do with a GPU).
    """
    src = torch.rand(nbytes // 4, device=device)
    dst = torch.empty_like(src)
    seconds = median_us([lambda: dst.copy_(src)], reps, device) / 1e6
    return 2 * nbytes / seconds / 1e9


def launch_us(device: torch.device, reps: int) -> dict[str, float]:
    """The launch floor: ``{"eager": one small eager op, "graph": one replay of a graph of one node}``, µs.

    Both add one to a single float, so what is timed is the launch, not the work.
    """
    x = torch.zeros(1, device=device)
    graph = Graph()
    graph.capture_fn(lambda: x.add_(1.0))
    return {
        "eager": median_us([lambda: x.add_(1.0)], reps, device),
        "graph": replay_us([graph], reps, device),
    }
