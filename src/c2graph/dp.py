"""Data-parallel ranks as real processes: every rank pads to the row count shared by all ranks.

With DP attention each rank prefills its own batch in its own prefill graph, yet the ranks run
in step: each pads its batch to the largest live row count of all ranks (so every rank replays
the same bucket), and a rank with no requests still replays, with every row padding.

:func:`run_ranks` starts one process per rank over ``torch.distributed`` (gloo on a CPU, NCCL
on GPUs, one GPU a rank; gloo again where there are more ranks than GPUs, which they then share),
on the loopback interface and a free port. Each rank builds the same
small model (:func:`~c2graph.compressor.model.served_layers`: layers with and without the fused
gate), its own request pool and its own :class:`~c2graph.prefill.runner.PrefillGraphRunner`.
Per step it all-reduces (max) its live row count into ``pad_to``, runs its batch through the
graph, runs the same batch eagerly on a copy of its pools, and compares the two bitwise: every
layer's caches and ring, and the latents of the rows that complete a group. Each rank reports
one :class:`RankStep` per step.

Bounded in time: the process group times out after ``init_timeout_s``, the whole run after
``timeout_s``; a rank that raises or dies stops the run with an error naming it.

``python -m c2graph dp --ranks N`` (or ``python -m c2graph.dp``) runs the default schedule.
"""

from __future__ import annotations

import argparse
import os
import pickle
import socket
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch

from .compressor.arguments import as_int
from .compressor.batch import ExtendBatch
from .compressor.compress import compress
from .compressor.config import Config
from .compressor.model import layer_pools, served_layers
from .compressor.req_to_token import ReqToTokenPool
from .prefill.runner import PrefillGraphRunner
from .measure.compare import compare, compare_pools

Requests = list[tuple[int, int, int]]


@dataclass(frozen=True)
class RankStep:
    """What one rank did in one step: its live rows, the shared ``pad_to``, how it ran, the check."""

    rank: int
    step: int
    requests: tuple[tuple[int, int, int], ...]
    live_rows: int
    pad_to: int
    mode: str
    bucket: int | None
    ok: bool
    detail: str

    def __str__(self) -> str:
        ran = f"graph of bucket {self.bucket}" if self.mode == "graph" else "eagerly"
        who = "idle" if not self.requests else f"{len(self.requests)} request(s)"
        return (f"rank {self.rank} step {self.step}: {who:12} {self.live_rows:3} live rows, pad_to {self.pad_to:3}, "
                f"{ran}: {self.detail}")


@dataclass(frozen=True)
class Setup:
    """What every rank builds: the model, its pools and the runner's buckets."""

    n_layers: int = 2
    unfused_every: int = 2
    buckets: tuple[int, ...] = (8, 16)
    request_slots: int = 4
    pool_requests: int = 3
    max_seq_len: int = 64


def default_schedules(ranks: int, steps: int = 3, seed: int = 0) -> list[list[Requests]]:
    """``schedules[rank][step]``: chunked prefills of 4 to 7 rows a chunk. A busy rank continues
    pool request 0 at every step in chunks of odd length (so its chunks start at odd and even
    positions) and, every other step, pool request 1 as well. Rank ``r`` is idle at step ``s`` when ``(r + s) % 3 == 2``: with two ranks or
    more, some step has an idle rank, and no step has every rank idle."""
    ranks, steps = as_int("ranks", ranks, least=1), as_int("steps", steps, least=1)
    g = torch.Generator().manual_seed(seed)
    schedules = []
    for r in range(ranks):
        done, mine = [0, 0], []
        for s in range(steps):
            requests = []
            if ranks == 1 or (r + s) % 3 != 2:
                for p in range(2 if (r + s) % 2 == 0 else 1):
                    n = int(torch.randint(4, 8, (1,), generator=g)) | (1 - p)  # request 0: odd lengths
                    requests.append((p, done[p], n))
                    done[p] += n
            mine.append(requests)
        schedules.append(mine)
    return schedules


def run_ranks(
    schedules: list[list[Requests]],
    *,
    setup: Setup = Setup(),
    timeout_s: float = 300.0,
    init_timeout_s: float = 60.0,
) -> list[RankStep]:
    """Run ``schedules[rank][step]`` on ``len(schedules)`` real processes; every rank's reports, in
    rank then step order. Raises ``RuntimeError`` naming the rank that failed or died,
    ``TimeoutError`` naming the ranks still running after ``timeout_s``."""
    _check_schedules(schedules)
    ranks = len(schedules)
    import torch.multiprocessing as mp

    port = _free_port()
    with tempfile.TemporaryDirectory(prefix="c2graph-dp-") as folder:
        with _stale_main_file_hidden():
            context = mp.start_processes(_rank_main, args=(ranks, port, schedules, setup, init_timeout_s, folder),
                                         nprocs=ranks, join=False, start_method="spawn")
        deadline = time.monotonic() + timeout_s
        try:
            while not context.join(timeout=0.2):
                if time.monotonic() > deadline:
                    alive = [i for i, p in enumerate(context.processes) if p.is_alive()]
                    raise TimeoutError(f"the data-parallel run took longer than timeout_s = {timeout_s} s; "
                                       f"rank(s) {alive} still running")
        except mp.ProcessRaisedException as e:
            raise RuntimeError(f"rank {e.error_index} failed:\n{e}") from None
        except mp.ProcessExitedException as e:
            raise RuntimeError(f"rank {e.error_index} died (exit code {e.exit_code})") from None
        finally:
            for p in context.processes:
                if p.is_alive():
                    p.terminate()
                    p.join()
        return [step for r in range(ranks) for step in pickle.loads(Path(folder, f"rank-{r}.pkl").read_bytes())]


@contextmanager
def _stale_main_file_hidden():
    """Hide ``__main__.__file__`` while the ranks start, where it names a file that is not the
    program's: a spawned process runs ``__main__``'s file again before it unpickles its task, and
    in a notebook that name is stale (Triton's interpreter, for one, leaves its own module's
    ``__file__`` in the notebook's globals). A script run as ``python script.py`` keeps its own."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    program = os.path.abspath(sys.argv[0]) if sys.argv and sys.argv[0] else None
    if path is None or getattr(main, "__spec__", None) is not None or os.path.abspath(path) == program:
        yield
        return
    del main.__file__
    try:
        yield
    finally:
        main.__file__ = path


def _rank_main(rank, ranks, port, schedules, setup, init_timeout_s, folder) -> None:
    """One rank: join the group, build the model and runner, run and check every step."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    nccl = _backend(ranks) == "nccl"
    if torch.cuda.is_available():
        torch.cuda.set_device(rank % torch.cuda.device_count())
        os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    dist.init_process_group(_backend(ranks), init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=ranks, timeout=timedelta(seconds=init_timeout_s))
    try:
        reports = _run_rank(rank, schedules[rank], setup, dist, "cuda" if nccl else "cpu")
        Path(folder, f"rank-{rank}.pkl").write_bytes(pickle.dumps(reports))
        # Every rank done before any tears down: a gloo group destroyed while its peer is still
        # closing can abort the process ("terminate called without an active exception").
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _backend(ranks: int) -> str:
    """NCCL where every rank has a GPU of its own; gloo (on host tensors) on a CPU, or where ranks
    share GPUs."""
    return "nccl" if torch.cuda.is_available() and ranks <= torch.cuda.device_count() else "gloo"


def _run_rank(rank: int, schedule: list[Requests], setup: Setup, dist, count_device: str) -> list[RankStep]:
    cfg = Config.tiny()
    layers = served_layers(cfg, setup.n_layers, unfused_every=setup.unfused_every, seed=0)
    alloc = ReqToTokenPool(cfg, setup.pool_requests, setup.max_seq_len, seed=rank)
    pools = [p.poison() for p in layer_pools(layers, setup.pool_requests, alloc.kv_slots)]
    eager = [p.clone() for p in pools]
    runner = PrefillGraphRunner(layers, pools, buckets=list(setup.buckets), request_slots=setup.request_slots)
    reports = []
    for step, requests in enumerate(schedule):
        live = sum(n for *_, n in requests)
        count = torch.tensor([live], device=count_device)
        dist.all_reduce(count, op=dist.ReduceOp.MAX)  # the row count shared by all ranks
        pad_to = int(count.item())
        xs = [layer.random_hidden(live, seed=1000 * rank + 10 * step + i) for i, layer in enumerate(layers)]
        got = runner.run(requests, alloc, xs, pad_to=pad_to)
        batch = ExtendBatch.build(requests, alloc, pad_to=pad_to, device=runner.device)
        want = [compress(layer, x, batch, p) for layer, x, p in zip(layers, xs, eager)]
        groups = batch.group_rows
        failed = [f"layer {i} {c}" for i, layer in enumerate(layers)
                  for c in compare_pools(pools[i], eager[i], skip_slot0=not layer.use_fused_gate) if not c]
        failed += [f"layer {i} {c}" for i, (g, w) in enumerate(zip(got.latents, want))
                   if not (c := compare(g[groups], w[groups], "latent"))]
        detail = "graph == eager, bitwise (caches, ring, latents)" if not failed else "; ".join(failed)
        reports.append(RankStep(rank, step, tuple(map(tuple, requests)), live, pad_to, got.mode, got.bucket,
                                not failed, detail))
    return reports


def _check_schedules(schedules) -> None:
    if not isinstance(schedules, (list, tuple)) or not schedules:
        raise ValueError(f"schedules is {schedules!r}; expected a list per rank of a list per step of requests")
    steps = {len(s) if isinstance(s, (list, tuple)) else -1 for s in schedules}
    if len(steps) != 1 or -1 in steps:
        raise ValueError(f"schedules have {sorted(steps)} steps; expected a list per rank, all of the same length "
                         "(the ranks run in step)")
    for r, mine in enumerate(schedules):
        for s, requests in enumerate(mine):
            for q in requests:
                if not isinstance(q, (list, tuple)) or len(q) != 3:
                    raise ValueError(f"schedules[{r}][{s}] holds {q!r}; expected (pool_index, prefix_len, extend_len)")
                for name, v in zip(("pool_index", "prefix_len", "extend_len"), q):
                    as_int(f"schedules[{r}][{s}] {name}", v, least=0)


def _free_port() -> int:
    """A TCP port free on the loopback interface (the process group's store listens there)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m c2graph dp", description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2, help="processes, one a rank (one a GPU on CUDA)")
    parser.add_argument("--steps", type=int, default=3, help="batches per rank")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds for the whole run")
    args = parser.parse_args(argv)
    if args.ranks <= 0 or args.steps <= 0:
        parser.error(f"--ranks {args.ranks} --steps {args.steps}: expected positive numbers")
    reports = run_ranks(default_schedules(args.ranks, args.steps), timeout_s=args.timeout)
    for report in sorted(reports, key=lambda r: (r.step, r.rank)):
        print(report)
    failed = [r for r in reports if not r.ok]
    print(f"{len(reports) - len(failed)} of {len(reports)} rank steps equal eager bitwise")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
