"""The benchmark's host-cost table: ``python -m c2graph bench --host-cost`` (and after every GPU run).

What the host spends on one call: the time from the call to its return on the CPU, the GPU's work
excluded (the GPU is idle when each call starts: a synchronize stands before each one, outside
the timed span), the median of many calls. For the rows of a step it also gives the step's total
time, from the call until the GPU is done. Measured, for the ``dsv41`` preset:

- one eager ``compress_fused`` (one layer, bucket 2048, 16 requests of 128 rows) with
  ``validate=False`` and with ``validate=True``, and the launch of its Triton kernel directly (the
  floor: no check, the arguments worked out once beforehand);
- ``ExtendBatch.build`` of that batch (the allocator's pages and the batch's checks: part of a step);
- ``runner.run`` on the served preset (``model_preset("dsv41")``: 18 layers, every third without the
  fused gate) at bucket 2048, with each source projection (``"exact"``, float64; ``"engine"``, a
  bf16 GEMM with fp32 output), host time and the step's total; and the same step on a batch built
  beforehand (``runner.refresh`` then the replay), as an engine's scheduler builds the next
  batch while the GPU runs the step before;
- the seconds to build a one-layer runner with 4096 request slots (its capture compiles the
  kernel for them).

Written to ``benchmarks/results/host-cost/<date>-<device>.json``, apart from the main results file
that the notebooks quote. ``smoke=True`` runs the same code with the ``tiny`` preset on whatever
device there is: it checks the code, and its file says it measured nothing.
"""

from __future__ import annotations

import datetime
import statistics
import time
from collections.abc import Callable

import torch

from .. import _runtime
from ..compressor.batch import ExtendBatch
from ..compressor.config import Config
from ..compressor.fused import compress_fused, kernel_arguments
from ..compressor.fused_kernel import compress_fused_kernel
from ..compressor.model import layer_pools, model_preset
from ..compressor.pools import Pools
from ..compressor.req_to_token import ReqToTokenPool
from ..compressor.source_layer import PROJECTIONS, SourceLayer
from ..prefill.runner import PrefillGraphRunner

SCHEMA = "c2graph-host-cost/2"
"""Version 2 added, after each ``runner.run``, the same step on a batch built beforehand (version 1 had none)."""
BUCKET, REQUESTS, ROWS_EACH = 2048, 16, 128
"""The served step: bucket 2048, 16 requests of 128 rows (no padding)."""
SMOKE = (16, 4, 4)
MANY_SLOTS = 4096


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def host_us(call: Callable[[], object], reps: int, device: torch.device, *, between: Callable[[], object] = lambda: None,
            warmup: int = 3) -> tuple[float, float]:
    """``(host, total)``: medians, in µs, of the time from ``call()`` to its return, and to the end
    of its GPU work, over ``reps`` calls after ``warmup``. ``between()`` runs after each call,
    untimed (giving back what the call took)."""
    host, total = [], []
    for i in range(warmup + reps):
        _sync(device)
        start = time.perf_counter()
        call()
        returned = time.perf_counter()
        _sync(device)
        done = time.perf_counter()
        between()
        if i >= warmup:
            host.append((returned - start) * 1e6)
            total.append((done - start) * 1e6)
    return statistics.median(host), statistics.median(total)


def _requests(requests: int, rows_each: int) -> list[tuple[int, int, int]]:
    return [(i, 0, rows_each) for i in range(requests)]


def _fused_rows(cfg: Config, bucket: int, requests: int, rows_each: int, reps: int, device) -> list[dict]:
    """One eager ``compress_fused`` (``validate`` off and on), its kernel launched directly, and the
    batch's build."""
    layer = SourceLayer(cfg, seed=0, device=device)
    alloc = ReqToTokenPool(cfg, requests, rows_each, seed=0)
    pools = Pools(cfg, requests, alloc.kv_slots, device=device)
    reqs = _requests(requests, rows_each)
    batch = ExtendBatch.build(reqs, alloc, request_slots=requests, pad_to=bucket, device=device)
    projected = torch.randn(bucket, 2 * cfg.D, device=device)
    latent = torch.empty(bucket, cfg.D, dtype=torch.bfloat16, device=device)
    blocks, args, constants = kernel_arguments(
        projected, pools.ring, batch.pos, batch.req, batch.raw_out_loc, batch.extend_offsets, layer.norm_w,
        layer.wk, layer.k_norm_w, layer.inv_freq, pools.kv_cache, pools.index_k, latent, cfg.eps, cfg.ring_size,
        bucket)
    calls = {
        "compress_fused, validate=False": lambda: compress_fused(layer, projected, batch, pools, latent_out=latent,
                                                                 validate=False),
        "compress_fused, validate=True": lambda: compress_fused(layer, projected, batch, pools, latent_out=latent),
        "the fused kernel launched directly": lambda: compress_fused_kernel[(blocks,)](*args, **constants),
    }
    out = [dict(what=what, host_us=host_us(call, reps, device)[0], total_us=None) for what, call in calls.items()]
    for i in range(requests):
        alloc.free(i)
    free = lambda: [alloc.free(i) for i in range(requests)]  # noqa: E731  (each build takes the pages again)
    build = lambda: ExtendBatch.build(reqs, alloc, request_slots=requests, pad_to=bucket, device=device)  # noqa: E731
    out.append(dict(what="ExtendBatch.build (pages and checks)", host_us=host_us(build, reps, device, between=free)[0],
                    total_us=None))
    return out


def _runner_rows(preset: str, bucket: int, requests: int, rows_each: int, reps: int, device) -> list[dict]:
    """``runner.run`` on a model preset, for each source projection: host time and the step's total."""
    layers = model_preset(preset, device=device)
    cfg = layers[0].cfg
    alloc = ReqToTokenPool(cfg, requests, rows_each, seed=0)
    reqs = _requests(requests, rows_each)
    x = layers[0].random_hidden(requests * rows_each, seed=1)
    xs = [x] * len(layers)
    out = []
    for projection in PROJECTIONS:
        pools = layer_pools(layers, requests, alloc.kv_slots, device=device)
        runner = PrefillGraphRunner(layers, pools, buckets=[bucket], request_slots=requests, projection=projection)
        free = lambda: [alloc.free(i) for i in range(requests)]  # noqa: E731
        step = runner.run(reqs, alloc, xs)
        free()
        if step.mode != "graph":
            raise RuntimeError(f"the runner ran {bucket} rows eagerly; expected a replay")
        host, total = host_us(lambda: runner.run(reqs, alloc, xs), reps, device, between=free)
        out.append(dict(what=f"runner.run, {len(layers)} layers, projection={projection!r}", host_us=host,
                        total_us=total))
        # the step without the build: an engine's scheduler builds the next batch while the GPU runs this one
        batch = ExtendBatch.build(reqs, alloc, request_slots=requests, pad_to=bucket, device=device)
        graph = runner.graphs[bucket]
        host, total = host_us(lambda: (runner.refresh(batch, xs, validate=False), graph.replay()), reps, device)
        out.append(dict(what="  of which refresh + replay, the batch built before", host_us=host, total_us=total))
        free()
        del runner, pools
    return out


def _many_slots_s(cfg: Config, bucket: int, device) -> float:
    """Seconds to build a one-layer runner with :data:`MANY_SLOTS` request slots (warm-up and capture)."""
    layer = SourceLayer(cfg, seed=0, device=device)
    pools = Pools(cfg, 4, 64, device=device)
    start = time.perf_counter()
    PrefillGraphRunner(layer, pools, buckets=[bucket], request_slots=MANY_SLOTS)
    _sync(device)
    return time.perf_counter() - start


def run_host_cost(*, reps: int = 200, smoke: bool = False) -> dict:
    """The host-cost table on the default device, as a dict (see the module docstring)."""
    device = _runtime.DEFAULT_DEVICE
    env = _runtime.environment()
    cfg, preset = (Config.tiny(), "tiny") if smoke else (Config.dsv41(), "dsv41")
    bucket, requests, rows_each = SMOKE if smoke else (BUCKET, REQUESTS, ROWS_EACH)
    records = _fused_rows(cfg, bucket, requests, rows_each, reps, device)
    records += _runner_rows(preset, bucket, requests, rows_each, reps, device)
    return {
        "schema": SCHEMA, "device": env["device"], "torch": env["torch"], "triton": env["triton"],
        "date": datetime.date.today().isoformat(), "config": preset, "smoke": smoke, "reps": reps,
        "timer": "time.perf_counter, the GPU idle at each call", "bucket": bucket, "requests": requests,
        "rows_each": rows_each, "records": records,
        "build_s_request_slots_4096": _many_slots_s(cfg, bucket, device),
    }


def host_cost_table(data: dict) -> str:
    """The records as a plain-text table."""
    lines = [f"host cost on {data['device']} ({data['config']}, bucket {data['bucket']}, {data['requests']} requests "
             f"of {data['rows_each']} rows; medians of {data['reps']} calls)",
             f"{'call':58} {'host µs':>9} {'until the GPU is done, µs':>26}"]
    for r in data["records"]:
        total = f"{r['total_us']:26.1f}" if r["total_us"] is not None else f"{'':26}"
        lines.append(f"{r['what']:58} {r['host_us']:9.1f} {total}")
    lines.append(f"build a runner with {MANY_SLOTS} request slots: {data['build_s_request_slots_4096']:.1f} s")
    host = {r["what"]: r["host_us"] for r in data["records"]}
    launch = host.get("the fused kernel launched directly")
    for what in ("compress_fused, validate=False", "compress_fused, validate=True"):
        if launch and what in host:
            lines.append(f"{what}: {host[what] / launch:.1f}x the host time of its kernel launched directly")
    for r in data["records"]:
        if r["what"].startswith("runner.run") and r["total_us"]:
            lines.append(f"{r['what']}: the host busy {100 * r['host_us'] / r['total_us']:.0f}% of the step")
    return "\n".join(lines)
