"""Time variants of the fused kernel in a CUDA graph, against the copy bandwidth and the torch path.

On a CUDA machine, from the repository root::

    PYTHONPATH=src python3 benchmarks/sweep.py --variants default,g16.c64.k64.w4.st2.r96.a3 --out sweep.json

For each row count (``--rows``) it builds a ``dsv41`` ragged batch of 8 to 16 requests with odd and
even prefixes (every row live), a ring of random rows, and random ``| kv | score |`` buffers,
enough of them that one pass over all of them is three times the L2 (replays rotate among them,
so the inputs come from memory, not from the L2). Then, for each variant:

1. one eager launch, checked against the torch path (latents, both caches within
   ``rtol = atol = 2**-6``, every untouched slot still poisoned, the ring bitwise);
2. a CUDA graph of the launch per buffer, replayed once and checked bitwise against the eager run;
3. the median of ``--reps`` replays, timed with CUDA events while the GPU works through a queue
   the host filled ahead of it.

The torch path is timed the same way, in a CUDA graph, once per row count. A variant is
``default`` (what ``compress_fused`` launches) or a :class:`variants.Variant`, ``g<groups_per_block>.c<chunk>.k<block_k>.w<num_warps>``
with optional ``.st<num_stages>``, ``.p<programs_per_sm>`` (a persistent grid),
``.r<max_registers>`` and ``.a<gate_stages>`` (pass A's pipeline). Variants are compiled first, in parallel processes (``--jobs``). Prints a
table (registers and spills as Triton reads them from each binary); writes every number to
``--out``. ``benchmarks/NOTES.md`` keeps what was measured.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context

import torch

import c2graph as c2
from c2graph.compressor.pools import POISON
from c2graph.measure.traffic import minimum_bytes
from variants import Variant, launch_variant, parse_variant

TOL = 2**-6
L2_BYTES = 60 * 2**20


def ragged_batch(cfg, rows: int, seed: int, device: str):
    """A batch of 8 to 16 requests filling ``rows`` rows, prefixes odd and even; its allocator."""
    g = torch.Generator().manual_seed(seed)
    n = int(torch.randint(8, 17, (1,), generator=g))
    cuts = sorted(torch.randperm(rows - 1, generator=g)[: n - 1].add(1).tolist())
    lengths = [b - a for a, b in zip([0, *cuts], [*cuts, rows])]
    prefixes = [int(p) * 2 + k % 2 for k, p in enumerate(torch.randint(0, 512, (n,), generator=g))]
    alloc = c2.ReqToTokenPool(cfg, n, 1024 + rows)
    requests = [(i, p, m) for i, (p, m) in enumerate(zip(prefixes, lengths))]
    return c2.ExtendBatch.build(requests, alloc, request_slots=16, pad_to=rows, device=device), alloc


class Case:
    """One row count: the layer, the batch, poisoned pools with a random ring, the input buffers."""

    def __init__(self, rows: int, seed: int = 0, cfg=None, device: str = "cuda"):
        self.cfg = cfg = cfg or c2.Config.dsv41()
        self.rows, self.device = rows, device
        self.layer = c2.SourceLayer(cfg, seed=seed, device=device)
        self.batch, alloc = ragged_batch(cfg, rows, seed, device)
        self.pools = c2.Pools(cfg, len(self.batch.requests), alloc.kv_slots, device=device).poison(POISON)
        g = torch.Generator(device=device).manual_seed(seed)
        self.pools.ring[:-1] = torch.randn(self.pools.ring[:-1].shape, generator=g, device=device)
        per_buffer = rows * 2 * cfg.D * 4
        scale = torch.cat([torch.ones(cfg.D), torch.full((cfg.D,), 3.0)]).to(device)
        self.buffers = [torch.randn(rows, 2 * cfg.D, generator=g, device=device) * scale
                        for _ in range(max(2, math.ceil(3 * L2_BYTES / per_buffer)))]
        self.nbytes = sum(minimum_bytes(cfg, self.batch).values())

    def fresh(self):
        latent = torch.full((self.rows, self.cfg.D), POISON, dtype=torch.bfloat16, device=self.device)
        return self.pools.clone(), latent

    def fused(self, variant: Variant | None, projected, pools, latent):
        """One launch of the fused path as ``variant`` (``None``: the library's path, its own choice)."""
        if variant is None:
            c2.compress_fused(self.layer, projected, self.batch, pools, latent_out=latent, validate=False)
            return None
        b, layer, cfg = self.batch, self.layer, self.cfg
        return launch_variant(projected, pools.ring, b.pos, b.req, b.raw_out_loc, b.extend_offsets,
                              layer.norm_w, layer.wk, layer.k_norm_w, layer.inv_freq, pools.kv_cache,
                              pools.index_k, latent, cfg.eps, cfg.ring_size, self.rows, variant=variant)

    def torch_path(self, projected, pools, latent):
        c2.compress_torch(self.layer, *c2.split_projected(projected), self.batch, pools, latent_out=latent)


def cuda_graph(fn) -> torch.cuda.CUDAGraph:
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()  # warm-up outside the graph (compiles, allocates)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    torch.cuda.synchronize()
    return graph


def time_replays(graphs, reps: int) -> list[float]:
    """µs of each of ``reps`` replays (rotating through ``graphs``), the host queueing ahead of the GPU."""
    for k in range(10):
        graphs[k % len(graphs)].replay()
    torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    torch.cuda._sleep(50_000_000)  # ~25 ms: the host fills the queue meanwhile
    for k, (start, end) in enumerate(events):
        start.record()
        graphs[k % len(graphs)].replay()
        end.record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) * 1e3 for s, e in events]


def copy_bandwidth(nbytes: int = 2 << 30, reps: int = 20) -> float:
    """Device-to-device copy bandwidth in bytes/s, counting bytes read plus bytes written (the
    median of ``reps`` eager copies of ``nbytes``, each timed with CUDA events)."""
    src = torch.randn(nbytes // 4, device="cuda")
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return 2 * nbytes / statistics.median(times)


def check(case: Case, got, want, name: str) -> list[str]:
    """Where the fused result ``got`` differs from the torch path's ``want`` (empty: none)."""
    (gp, gl), (wp, wl) = got, want
    groups = torch.tensor(case.batch.group_rows, device=case.device)
    bad = []
    for what, g, w in (("latent", gl[groups], wl[groups]), ("kv_cache", gp.kv_cache[1:], wp.kv_cache[1:]),
                       ("index_k", gp.index_k[1:], wp.index_k[1:])):
        g, w = g.float(), w.float()
        if not ((g - w).abs() <= TOL + TOL * w.abs()).all():
            bad.append(f"{name}: {what} differs from the torch path by {float((g - w).abs().max()):.3g}")
    if not torch.equal(gp.ring.view(torch.int32), wp.ring.view(torch.int32)):
        bad.append(f"{name}: ring differs from the torch path")
    if not (gp.kv_cache[0].float() == POISON).all() or not (gp.index_k[0].float() == POISON).all():
        bad.append(f"{name}: c2 slot 0 was written")
    others = torch.ones(case.rows, dtype=torch.bool, device=case.device)
    others[groups] = False
    if not (gl[others].float() == POISON).all():
        bad.append(f"{name}: a latent row that completes no group was written")
    return bad


def registers(compiled) -> tuple:
    """``(n_regs, n_spills)`` of a compiled kernel, as Triton reads them from the binary."""
    return getattr(compiled, "n_regs", None), getattr(compiled, "n_spills", None)


def measure_variant(case: Case, spec: str, want, reps: int) -> dict:
    variant = parse_variant(spec)
    got = case.fresh()
    compiled = case.fused(variant, case.buffers[0], *got)
    torch.cuda.synchronize()
    problems = check(case, got, want, spec)
    pools, latent = case.fresh()
    graphs = [cuda_graph(lambda p=p: case.fused(variant, p, pools, latent)) for p in case.buffers]
    for name, t in pools.tensors().items():  # the capture's warm-up ran once: start again
        t.copy_(case.pools.tensors()[name])
    latent.fill_(POISON)
    graphs[0].replay()
    torch.cuda.synchronize()
    for name, a, b in (("kv_cache", pools.kv_cache, got[0].kv_cache), ("index_k", pools.index_k, got[0].index_k),
                       ("ring", pools.ring, got[0].ring), ("latent", latent, got[1])):
        if not torch.equal(a, b):
            problems.append(f"{spec}: graph replay differs from eager in {name}")
    us = time_replays(graphs, reps) if not problems else [float("nan")]
    if compiled is None:  # default: the same blocks, launched directly, to read the binary's registers
        compiled = case.fused(Variant.default(case.cfg.D, case.rows), case.buffers[0], *case.fresh())
    regs, spills = registers(compiled)
    del graphs
    return {"variant": spec, "rows": case.rows, "median_us": statistics.median(us), "p10_us": _pct(us, 10),
            "p90_us": _pct(us, 90), "n_regs": regs, "n_spills": spills, "problems": problems}


def _pct(xs, q):
    return sorted(xs)[min(len(xs) - 1, len(xs) * q // 100)]


def _compile(spec: str) -> str:
    """In a fresh process: compile one variant on a small case (Triton caches the binary on disk).
    Returns ``""``, or why it failed."""
    try:
        case = Case(2048)
        case.fused(parse_variant(spec), case.buffers[0], *case.fresh())
        torch.cuda.synchronize()
        return ""
    except Exception as e:  # reported, and the variant left out: one bad variant must not end the sweep
        return f"{type(e).__name__}: {e}"[:2000]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="2048,16384,65536")
    parser.add_argument("--variants", default="default")
    parser.add_argument("--reps", type=int, default=100)
    parser.add_argument("--jobs", type=int, default=8, help="processes compiling variants in parallel")
    parser.add_argument("--out", default="sweep.json")
    parser.add_argument("--torch-reps", type=int, default=30,
                        help="replays of the torch path's graph per row count (0: not timed, only checked against)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("sweep.py times kernels on a CUDA GPU; this machine has none.", file=sys.stderr)
        return 2
    specs, failed = args.variants.split(","), {}
    t0 = time.time()
    with ProcessPoolExecutor(min(args.jobs, len(specs)), mp_context=get_context("spawn")) as pool:
        for spec, error in zip(specs, pool.map(_compile, specs)):
            print(f"compiled {spec} ({time.time() - t0:.0f} s) {error}", flush=True)
            if error:
                failed[spec] = error
    specs = [s for s in specs if s not in failed]
    env = c2.environment()
    bandwidth = copy_bandwidth()
    report = {"environment": env, "copy_GBps": bandwidth / 1e9, "failed": failed, "records": []}
    print(f"{env['device']}: copy {bandwidth / 1e9:.0f} GB/s", flush=True)
    for rows in map(int, args.rows.split(",")):
        case = Case(rows)
        want = case.fresh()
        case.torch_path(case.buffers[0], *want)
        torch_us = float("nan")
        if args.torch_reps > 0:
            pools, latent = case.fresh()
            torch_graphs = [cuda_graph(lambda p=p: case.torch_path(p, pools, latent)) for p in case.buffers]
            torch_us = statistics.median(time_replays(torch_graphs, args.torch_reps))
            del torch_graphs, pools, latent
        for spec in specs:
            try:
                r = measure_variant(case, spec, want, args.reps)
            except Exception as e:  # reported: one bad variant must not end the sweep
                print(f"{rows:>6} {spec:<22} failed: {type(e).__name__}: {e}"[:2000], flush=True)
                continue
            r.update(torch_graph_us=torch_us, bytes=case.nbytes, requests=len(case.batch.requests),
                     bw_fraction=case.nbytes / (r["median_us"] / 1e6) / bandwidth,
                     speedup_over_torch=torch_us / r["median_us"])
            report["records"].append(r)
            print(f"{rows:>6} {spec:<22} {r['median_us']:8.1f} us  {r['bw_fraction']:5.0%} of copy  "
                  f"{r['speedup_over_torch']:6.1f}x torch ({torch_us:.0f} us)  regs {r['n_regs']} "
                  f"spills {r['n_spills']}  {'; '.join(r['problems']) or 'checks pass'}", flush=True)
        del case
        torch.cuda.empty_cache()
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
