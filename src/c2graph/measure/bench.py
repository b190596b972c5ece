"""The benchmark: ``python -m c2graph bench`` (``make bench`` on a CUDA host).

For the ``dsv41`` preset and buckets of 256, 2048, 16384 and 65536 rows (ragged batches of 8 to
16 requests, odd and even prefixes: :mod:`.bench_cases`) it measures, in one run:

- the copy bandwidth (the ceiling of a memory-bound step) and one launch (the floor of a small one);
- the torch path, eager and replayed in a CUDA graph;
- ``torch.compile`` of the torch path, compiled for each row count and replayed in a graph: the
  torch path as taught (float64 reductions) and a plain fp32 port of it (:mod:`.compiled`); the
  table quotes the faster;
- the fused path, eager and replayed in a graph, with its bytes over its time as a fraction of
  the copy bandwidth: the step's bytes (weights once), which is also the memory floor's time over
  the measured one, and the bytes with the weights once per program;
- a model of many source layers (some without the fused gate) replayed in one graph.

Each time is the median of ``--reps`` calls (CUDA events, after warm-up), the calls taking input
sets in turn so that none finds its inputs in the L2 cache. Eager calls are counted in kernel
launches (profiler), graphs in nodes. A time budget keeps the run short: whatever it leaves out is
written down as skipped, with the reason, as is any variant that fails. Results go to
``benchmarks/results/<date>-<device>.json`` (schema: :mod:`.results`), a table to stdout.

``--smoke`` runs the same code with the ``tiny`` preset, two small buckets and a few reps, on
whatever device there is (wall-clock timers on a CPU): it checks the benchmark, it measures
nothing, and its file says so. Name its file with ``--out``; never store it as results.

A GPU run ends with the host-cost table (:mod:`.bench_host`: what the host spends on a call, a
step's total), in a file of its own, ``<folder>/host-cost/<date>-<device>.json``;
``--host-cost`` measures that table alone.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from .. import _runtime
from ..compressor.config import Config
from ..compressor.source_layer import SourceLayer
from ..compressor.torch_path import compress_torch
from . import bench_cases
from .bench_host import host_cost_table, run_host_cost
from .bench_model import measure_model
from .compiled import VARIANTS, compiled
from .opcount import count_cuda_kernels, count_ops
from .results import FRACTIONS, RESULTS_FOLDER, SCHEMA, check_results, results_table
from .timing import copy_GBps, launch_us, median_us, on_cuda, replay_us

ROWS = (256, 2048, 16384, 65536)
SMOKE_ROWS = (16, 48)
PATHS = ("torch", "fused", "compiled", "model")
"""Measured in this order, every row count of one before the next: the paths that matter most first."""
NO_FRACTIONS = dict.fromkeys(FRACTIONS)
"""The bandwidth fields of a record outside the fused path: null."""
TOLERANCE = 2.0**-6
"""How close a compiled torch path must come to the torch path before it is timed: within
``TOLERANCE`` of the row's largest value (see :func:`disagreement`)."""


def count_launches(call: Callable[[], object], device: torch.device) -> int:
    """Kernels one call launches: the profiler's count on CUDA, the dispatcher's ops on a CPU."""
    if on_cuda(device):
        return count_cuda_kernels(call).total
    with count_ops() as ops:
        call()
    return ops.total


def _eager_and_graph(calls, reps: int, device, **fields) -> list[dict]:
    """Time ``calls`` eagerly, then each captured in a graph and replayed: two records."""
    eager = dict(fields, mode="eager", median_us=median_us(calls, reps, device),
                 nodes=None, launches=count_launches(calls[0], device))
    graphs = bench_cases.capture_buckets(calls)
    graph = dict(fields, mode="graph", median_us=replay_us(graphs, reps, device),
                 nodes=graphs[0].num_nodes, launches=None)
    return [eager, graph]


def _bandwidth(record: dict, case: bench_cases.Case, copy: float) -> dict:
    """``record`` with the fused path's two shares of the copy bandwidth (see :mod:`.results`)."""
    per_us = record["median_us"] * 1e3 * copy  # bytes the copy moves in the record's time
    return dict(record, bw_fraction=case.floor_bytes / per_us,
                bw_fraction_weights_per_program=case.bytes_weights_per_program / per_us)


def close_in_row(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Bool, ``a``'s shape: each value of ``a`` within ``TOLERANCE`` of ``b``'s, measured against the
    largest value of ``b``'s row (the last dim): ``|a - b| <= TOLERANCE * (1 + max |b| of the row)``.
    NaN matches NaN."""
    a, b = a.float(), b.float()
    scale = 1 + b.abs().nan_to_num().amax(dim=-1, keepdim=True)
    return ((a - b).abs() <= TOLERANCE * scale) | (a.isnan() & b.isnan())


def disagreement(fn: Callable, layer: SourceLayer, s: bench_cases.InputSet) -> str | None:
    """``None`` when one call of ``fn`` (a torch path) writes what the torch path writes, else what
    differs. Runs on copies of ``s``.

    The ring must be bitwise the same. Latents and caches (c2 slot 0 skipped) must be within
    ``TOLERANCE`` of the row's largest value (:func:`close_in_row`), not of each value: RoPE turns each pair of dims, so a latent rounded one bf16 step the other
    way (an fp32 port's RMSNorm does that to a few values) moves a small cached value by as much as
    a large one. Measured on an H200: the fp32 port's worst values were within ``2**-6`` of the
    row's scale, and 2 to 20 of them were not within ``2**-6`` of their own.
    """
    mine, ref = s.pools.clone(), s.pools.clone()
    got, want = torch.full_like(s.latent, float("nan")), torch.full_like(s.latent, float("nan"))
    fn(layer, s.kv, s.score, bench_cases.graph_view(s.batch), mine, latent_out=got)
    compress_torch(layer, s.kv, s.score, s.batch, ref, latent_out=want)
    pairs = (("latent", got, want), ("kv_cache", mine.kv_cache[1:], ref.kv_cache[1:]),
             ("index_k", mine.index_k[1:], ref.index_k[1:]))
    for name, a, b in pairs:
        close = close_in_row(a, b)
        if not bool(close.all()):
            return (f"{name} differs from the torch path's in {int((~close).sum())} values "
                    "(tolerance 2**-6 of the row's largest value)")
    if not torch.equal(mine.ring, ref.ring):
        return "the ring differs from the torch path's"
    return None


def measure(path: str, variant: str, cfg: Config, case: bench_cases.Case, reps: int, copy: float,
            compiled_fns: dict, smoke: bool) -> list[dict]:
    """The records of one path (and variant) at one row count."""
    device = case.batch.device
    if path == "model":
        return [measure_model(cfg, case, reps)]
    sets = bench_cases.input_sets(cfg, case, case.copies)
    fields = dict(rows=case.rows, path=path, variant=variant)
    if path == "torch":
        layer = SourceLayer(cfg, seed=0, use_fused_gate=False, device=device)
        return _eager_and_graph(bench_cases.torch_calls(layer, sets), reps, device, **fields, **NO_FRACTIONS)
    if path == "fused":
        layer = SourceLayer(cfg, seed=0, device=device)
        found = _eager_and_graph(bench_cases.fused_calls(layer, sets), reps, device, **fields)
        return [_bandwidth(r, case, copy) for r in found]
    layer = SourceLayer(cfg, seed=0, use_fused_gate=False, device=device)
    # One compiled function per variant; compiled for static shapes, it compiles anew at each row count.
    fn = compiled_fns.setdefault(variant, compiled(variant, backend="eager" if smoke else "inductor"))
    start = time.perf_counter()
    wrong = disagreement(fn, layer, sets[0])  # its first call at a new row count compiles
    compile_s = time.perf_counter() - start
    if wrong:
        raise RuntimeError(f"not timed: {wrong}")
    graphs = bench_cases.capture_buckets(bench_cases.compiled_calls(fn, layer, sets))
    return [dict(fields, mode="graph", median_us=replay_us(graphs, reps, device),
                 nodes=graphs[0].num_nodes, launches=None, **NO_FRACTIONS, compile_s=compile_s)]


def units(paths) -> list[tuple[str, str, str]]:
    """``(path, variant, modes)`` in the order they are measured (see ``PATHS``)."""
    every = [("torch", "float64 reductions", "eager, graph"), ("fused", "Triton kernel", "eager, graph")]
    every += [("compiled", variant, "graph") for variant in VARIANTS]
    every += [("model", "many layers", "graph")]
    return [u for p in PATHS for u in every if u[0] == p and p in paths]


class _Lines:
    """A progress bar of plain lines, where tqdm is not installed."""

    def __init__(self, total: int):
        self.total, self.n = total, 0

    def set_description(self, text: str) -> None:
        print(f"[{self.n + 1}/{self.total}] {text}", file=sys.stderr, flush=True)

    def update(self, n: int = 1) -> None:
        self.n += n

    def close(self) -> None:
        pass


def _progress(total: int):
    try:
        from tqdm import tqdm
    except ImportError:  # tqdm is optional: the same steps, one line each
        return _Lines(total)
    return tqdm(total=total, unit="case", file=sys.stderr)


def device_slug(name: str) -> str:
    """``"NVIDIA H200"`` -> ``"nvidia-h200"``: the device part of a results file's name."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def run_bench(*, rows=ROWS, paths=PATHS, reps: int = 100, smoke: bool = False, time_budget_s: float = 360.0,
              out: Path | None = None) -> dict:
    """Run the benchmark on the default device and return its results (checked against the schema).

    ``rows``: the buckets; ``paths``: which of ``PATHS`` to measure; ``reps``: timed calls per
    median (at least 50 unless ``smoke``); ``time_budget_s``: no new measurement starts after it.
    ``out``: a file the results are written to after every measurement (``"complete": false``
    until the last), so a run that is stopped keeps what it measured.
    """
    if not smoke and not (isinstance(reps, int) and reps >= 50):
        raise ValueError(f"reps = {reps!r}; expected an int >= 50 (medians of at least 50 calls)")
    unknown = [p for p in paths if p not in PATHS]
    if unknown:
        raise ValueError(f"paths = {list(paths)!r}; expected names from {PATHS}")
    if not rows or any(not isinstance(n, int) or n < 2 for n in rows):
        raise ValueError(f"rows = {list(rows)!r}; expected ints >= 2")
    started = time.monotonic()
    device = _runtime.DEFAULT_DEVICE
    cfg = Config.tiny() if smoke else Config.dsv41()
    env = _runtime.environment()
    cuda = on_cuda(device)
    cache = torch.cuda.get_device_properties(device).L2_cache_size if cuda else 0
    data = {
        "schema": SCHEMA, "device": env["device"], "torch": env["torch"], "triton": env["triton"],
        "date": datetime.date.today().isoformat(), "config": "tiny" if smoke else "dsv41", "smoke": smoke,
        "timer": "CUDA events" if cuda else "wall clock", "reps": reps,
        "copy_GBps": copy_GBps(device, nbytes=(1 << 30) if cuda and not smoke else (1 << 24)),
        "launch_us": launch_us(device, reps),
        "complete": False, "cases": [], "records": [], "skipped": [],
    }
    cases = [bench_cases.make_case(cfg, n, device, cache_bytes=cache, copies=(2, 2) if smoke else (1, 128))
             for n in sorted(rows)]
    data["cases"] = [c.info() for c in cases]
    compiled_fns: dict = {}
    todo = [(u, case) for u in units(paths) for case in cases]
    bar = _progress(len(todo))
    for (path, variant, modes), case in todo:
        bar.set_description(f"{path} ({variant}) at {case.rows} rows")
        skip = dict(rows=case.rows, path=path, mode=modes, variant=variant)
        if time.monotonic() - started > time_budget_s:
            data["skipped"].append(dict(skip, reason=f"the time budget of {time_budget_s:.0f} s was spent"))
        else:
            try:
                data["records"] += measure(path, variant, cfg, case, reps, data["copy_GBps"], compiled_fns, smoke)
            except Exception as e:  # written down and reported, never silent: the run goes on
                first = str(e).splitlines()[0] if str(e) else ""
                data["skipped"].append(dict(skip, reason=f"failed: {type(e).__name__}: {first}"))
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
        bar.update(1)
        if out is not None:
            write_results(data, out)
    bar.close()
    data["complete"] = True
    if out is not None:
        write_results(data, out)
    return check_results(data)


def write_results(data: dict, path: Path) -> None:
    """Write ``data`` as JSON to ``path`` (its folder made if needed), whole or not at all."""
    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_name(path.name + ".part")
    part.write_text(json.dumps(data, indent=1) + "\n")
    part.replace(path)


def default_file(device: str, date: str, folder: str | Path = RESULTS_FOLDER) -> Path:
    """``<folder>/<date>-<device>.json``, the device's name as :func:`device_slug` writes it."""
    return Path(folder) / f"{date}-{device_slug(device)}.json"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m c2graph bench", description=__doc__.splitlines()[0])
    parser.add_argument("--folder", default=str(RESULTS_FOLDER), help="where the results file goes (default: %(default)s)")
    parser.add_argument("--out", help="the results file itself (overrides --folder); required with --smoke")
    parser.add_argument("--rows", help=f"buckets, comma-separated (default {','.join(map(str, ROWS))})")
    parser.add_argument("--paths", default=",".join(PATHS), help="which paths (default: %(default)s)")
    parser.add_argument("--reps", type=int, help="timed calls per median (default 100; --smoke: 3)")
    parser.add_argument("--time-budget-s", type=float, default=360.0,
                        help="start no new measurement after this many seconds (default: %(default)s)")
    parser.add_argument("--smoke", action="store_true", help="a quick check of the benchmark (tiny preset); measures nothing")
    parser.add_argument("--host-cost", action="store_true",
                        help="only the host-cost table (written to FOLDER/host-cost/, or to --out)")
    args = parser.parse_args(argv)
    if args.smoke and not args.out:
        parser.error("--smoke measures nothing worth storing: name its file with --out")
    if not args.smoke and not _runtime.HAS_CUDA:
        print("python -m c2graph bench measures on a CUDA GPU, and this machine has none "
              "(--smoke --out FILE checks the benchmark on a CPU).", file=sys.stderr)
        return 2
    today = datetime.date.today().isoformat()
    host_file = default_file(_runtime.environment()["device"], today, Path(args.folder) / "host-cost")
    if args.host_cost:
        return _host_cost(Path(args.out) if args.out else host_file, args.smoke, args.reps)
    rows = tuple(int(n) for n in args.rows.split(",")) if args.rows else (SMOKE_ROWS if args.smoke else ROWS)
    reps = args.reps if args.reps is not None else (3 if args.smoke else 100)
    out = Path(args.out) if args.out else default_file(_runtime.environment()["device"], today, args.folder)
    data = run_bench(rows=rows, paths=tuple(args.paths.split(",")), reps=reps, smoke=args.smoke,
                     time_budget_s=args.time_budget_s, out=out)
    print(results_table(data))
    print(f"wrote {out}")
    failed = [s for s in data["skipped"] if s["reason"].startswith("failed")]
    host = 0 if args.smoke else _host_cost(host_file, False, None)
    return 1 if failed or host else 0


def _host_cost(out: Path, smoke: bool, reps: int | None) -> int:
    """Measure the host-cost table, write it to ``out`` and print it."""
    data = run_host_cost(reps=reps if reps is not None else (3 if smoke else 200), smoke=smoke)
    write_results(data, out)
    print(host_cost_table(data))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
