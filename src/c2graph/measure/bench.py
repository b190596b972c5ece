"""Benchmark on a CUDA GPU: the torch path against the fused path, eager and as graph replays.

``python -m c2graph.bench --out bench.json`` (or ``make bench``). For the ``dsv41`` preset and
a few buckets it measures, side by side in one run:

- the device-to-device copy bandwidth (bytes read plus bytes written), the ceiling for a
  memory-bound kernel;
- the compressor of one ragged batch padded to the bucket: torch path eager, fused path eager,
  torch path graph replay, fused path graph replay (median of many runs, CUDA events, L2
  flushed between runs by ``triton.testing.do_bench``);
- the kernels each path launches (profiler), and the fused kernel's bytes over its time as a
  fraction of the copy bandwidth.

Prints a table; writes every number to the JSON file. Timings only: correctness is the tests'.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import torch

from .. import _runtime
from ..compressor.batch import ExtendBatch
from ..compressor.config import Config
from ..compressor.fused import compress_fused
from .traffic import minimum_bytes
from .opcount import count_cuda_kernels
from ..compressor.pools import Pools
from ..graphs.prefill_graph import PrefillGraphRunner
from ..compressor.req_to_token import ReqToTokenPool
from ..compressor.compress import project_padded
from ..compressor.source_layer import SourceLayer, split_projected
from ..compressor.torch_path import compress_torch

DEVICE = "cuda"


def _ms(fn, rep_ms: int) -> float:
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=25, rep=rep_ms, return_mode="median"))


def copy_bandwidth(nbytes: int = 2 << 30, reps: int = 20) -> float:
    """Device-to-device copy bandwidth in bytes/s, counting bytes read plus bytes written."""
    src = torch.randn(nbytes // 4, device=DEVICE)
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


def ragged_requests(bucket: int, n_requests: int, seed: int) -> list[tuple[int, int, int]]:
    """``n_requests`` requests filling about 90% of ``bucket`` rows, odd and even prefixes."""
    g = torch.Generator().manual_seed(seed)
    live = int(bucket * 0.9)
    cuts = sorted(torch.randperm(live - 1, generator=g)[: n_requests - 1].add(1).tolist())
    lengths = [b - a for a, b in zip([0, *cuts], [*cuts, live])]
    prefixes = torch.randint(0, 512, (n_requests,), generator=g).tolist()
    return [(i, p, n) for i, (p, n) in enumerate(zip(prefixes, lengths))]


def bench_bucket(cfg: Config, bucket: int, n_requests: int, rep_ms: int, bandwidth: float) -> dict:
    requests = ragged_requests(bucket, n_requests, seed=bucket)
    alloc = ReqToTokenPool(cfg, n_requests, 512 + bucket)
    results = {"bucket": bucket, "requests": n_requests}
    for fused in (False, True):
        layer = SourceLayer(cfg, seed=0, use_fused_gate=fused)
        pools = Pools(cfg, n_requests, alloc.kv_slots)
        batch = ExtendBatch.build(requests, alloc, request_slots=n_requests, pad_to=bucket)
        x = layer.random_hidden(batch.live_rows, seed=1)
        name = "fused" if fused else "torch"
        projected = project_padded(layer, x, batch)
        kv, score = split_projected(projected) if fused else projected
        latent = torch.empty(bucket, cfg.D, dtype=torch.bfloat16, device=DEVICE)

        def eager(projected=projected, kv=kv, score=score, batch=batch, latent=latent, layer=layer, pools=pools):
            if layer.use_fused_gate:
                compress_fused(layer, projected, batch, pools, latent_out=latent, validate=False)
            else:
                compress_torch(layer, kv, score, batch, pools, latent_out=latent)

        runner = PrefillGraphRunner(layer, pools, buckets=[bucket], request_slots=n_requests)
        runner.refresh(batch, x)
        graph = runner.graphs[bucket]
        results[f"{name} kernels"] = count_cuda_kernels(eager).total
        results[f"{name} graph nodes"] = len(runner.nodes(bucket))
        runner.refresh(batch, x)  # nodes() loaded the dummy batch
        results[f"{name} eager ms"] = _ms(eager, rep_ms)
        results[f"{name} graph ms"] = _ms(graph.replay, rep_ms)
        if fused:
            nbytes = sum(minimum_bytes(cfg, batch).values())
            results["fused bytes"] = nbytes
            results["fused GB/s"] = nbytes / (results["fused graph ms"] / 1e3) / 1e9
            results["fused / copy bandwidth"] = nbytes / (results["fused graph ms"] / 1e3) / bandwidth
        del runner, pools, layer
        torch.cuda.empty_cache()
    results["graph speed-up (torch / fused replay)"] = results["torch graph ms"] / results["fused graph ms"]
    results["eager speed-up (torch / fused)"] = results["torch eager ms"] / results["fused eager ms"]
    return results


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench.json", help="JSON file for every number")
    parser.add_argument("--buckets", default="1024,4096,16384")
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--rep-ms", type=int, default=200, help="time spent timing each case")
    args = parser.parse_args(argv)
    if not _runtime.HAS_CUDA:
        print("c2graph.bench measures on a CUDA GPU; this machine has none.", file=sys.stderr)
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False
    cfg = Config.dsv41()
    bandwidth = copy_bandwidth()
    env = _runtime.environment()
    report = {"environment": env, "config": "dsv41", "copy GB/s": bandwidth / 1e9, "buckets": []}
    print(f"{env['device']}  torch {env['torch']}  triton {env['triton']}")
    print(f"device-to-device copy: {bandwidth / 1e9:.0f} GB/s (read + write)")
    header = ("bucket", "torch kern", "torch eager", "fused eager", "torch graph", "fused graph",
              "graph x", "fused GB/s", "of copy")
    print(" | ".join(f"{h:>11}" for h in header))
    for bucket in map(int, args.buckets.split(",")):
        r = bench_bucket(cfg, bucket, args.requests, args.rep_ms, bandwidth)
        report["buckets"].append(r)
        row = (bucket, r["torch kernels"], f"{r['torch eager ms'] * 1e3:.1f} us", f"{r['fused eager ms'] * 1e3:.1f} us",
               f"{r['torch graph ms'] * 1e3:.1f} us", f"{r['fused graph ms'] * 1e3:.1f} us",
               f"{r['graph speed-up (torch / fused replay)']:.1f}", f"{r['fused GB/s']:.0f}",
               f"{r['fused / copy bandwidth']:.0%}")
        print(" | ".join(f"{str(c):>11}" for c in row), flush=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
