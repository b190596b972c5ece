"""Where one program of the fused kernel spends its time: a timestamp at each step, per program.

The stamped copy of the kernel is :func:`fused_timeline.timed_kernel` (``benchmarks/fused_timeline.py``: the
kernel's stages, in the kernel's order, with the GPU's ``%globaltimer`` stored after each step of
every program). On a CUDA machine, from the repository root::

    PYTHONPATH=src python3 benchmarks/timeline.py --rows 2048,16384 --variants default,g16.c64.k64.w4.st3.a3

prints, per row count and variant, the median and the largest time of each step over the programs,
and when the last program started (a second wave of programs starts late), on the sweep's batches
(``benchmarks/sweep.py``). Variants are spelled as in the sweep. ``--compile-only`` compiles the
timed kernel for sm_90 on any machine (no GPU), as a check. The measured tables are in
``benchmarks/NOTES.md``.

``--results FOLDER`` (``make bench``, after the benchmark) measures the stamps at 256 and 2048 rows
on the benchmark's own batches (:func:`measure_timeline`) and stores them beside the newest results
file of ``FOLDER``, drawn as a PNG by :func:`c2graph.pictures.timeline.draw_timeline`
(:func:`write_timeline`); notebook 05 draws the stored file.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from pathlib import Path

if __name__ == "__main__":  # run as a tool: compiled for a target, not interpreted (a CPU machine too)
    os.environ["TRITON_INTERPRET"] = "0"
import triton  # noqa: E402, F401

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from c2graph import _runtime  # noqa: E402
from c2graph.compressor import fused  # noqa: E402
from c2graph.compressor.config import Config  # noqa: E402
from c2graph.compressor.source_layer import SourceLayer  # noqa: E402
from c2graph.measure import bench_cases  # noqa: E402
from c2graph.measure.results import newest_results  # noqa: E402
from fused_timeline import STEPS, program_stamps, summary, timed_kernel  # noqa: E402
from variants import Variant, parse_variant  # noqa: E402


def compile_for_sm90(variant: Variant, cfg: Config):
    """The timed kernel compiled for sm_90 without a GPU, as ``registers.py`` compiles the real one."""
    import registers

    return registers.compile_for_sm90(variant, cfg, kernel=timed_kernel, extra={"ts_ptr": "*i64"})


def timeline(rows: int, spec: str, runs: int = 6):
    """``[programs, 6]`` int64 stamps of the last of ``runs`` launches (each on other inputs) of the
    variant ``spec`` at ``rows`` rows."""
    from sweep import Case

    case = Case(rows)
    for i in range(runs):
        pools, latent = case.fresh()
        ts = program_stamps(case.layer, case.buffers[i % len(case.buffers)], case.batch, pools, latent,
                            parse_variant(spec))
    return ts


BENCH_ROWS = (256, 2048)
"""The buckets ``--results`` measures: the small ones, where a replay is one program's chain of steps."""


def measure_timeline(rows=BENCH_ROWS, runs: int = 6) -> dict:
    """Stamps of the fused kernel's programs at each of ``rows`` (a CUDA device, the ``dsv41`` layer,
    the benchmark's batches): the last of ``runs`` launches, each on its own input set, in µs from
    the first program's start. Returns ``{"device", "date", "steps", "timelines": {rows: {"blocks",
    "stamps_us"}}}``; ``stamps_us``: per program ``[start, end of each step]``."""
    import torch

    device, cfg = _runtime.DEFAULT_DEVICE, Config.dsv41()
    cache = torch.cuda.get_device_properties(device).L2_cache_size
    layer = SourceLayer(cfg, seed=0, device=device)
    found = {}
    for n in rows:
        case = bench_cases.make_case(cfg, n, device, cache_bytes=cache, copies=(1, 128))
        sets = bench_cases.input_sets(cfg, case, max(runs, 1))
        for s in sets[:runs]:
            ts = program_stamps(layer, s.projected, s.batch, s.pools, s.latent)
        us = (ts - ts[:, 0].min()).double() / 1e3
        found[str(n)] = {"blocks": fused.kernel_blocks(cfg.D, n).name,
                         "stamps_us": [[round(v, 3) for v in p] for p in us.tolist()]}
    return {"device": _runtime.environment()["device"], "date": datetime.date.today().isoformat(),
            "steps": list(STEPS), "timelines": found}


def write_timeline(results_file: str | os.PathLike, rows=BENCH_ROWS, dpi: int = 150) -> list[Path]:
    """Measure the timelines (:func:`measure_timeline`, a CUDA device), with the fused path's graph
    replay, the one-node graph's and the blocks that hold a group from ``results_file`` where it has
    them, store them beside it (:func:`~c2graph.pictures.timeline.timeline_file`) and draw them there
    as a PNG; returns both paths."""
    from c2graph.pictures.timeline import draw_timeline, timeline_file

    data = measure_timeline(rows)
    results = json.loads(Path(results_file).read_text()) if Path(results_file).exists() else {}
    for c in results.get("cases", []):
        if str(c["rows"]) in data["timelines"]:
            data["timelines"][str(c["rows"])]["programs"] = c["programs"]
    for r in results.get("records", []):
        if r["path"] == "fused" and r["mode"] == "graph" and str(r["rows"]) in data["timelines"]:
            data["timelines"][str(r["rows"])]["replay_us"] = r["median_us"]
            data["launch_us"] = results["launch_us"]["graph"]
    out = timeline_file(results_file)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=1) + "\n")
    picture = out.with_suffix(".png")
    draw_timeline(data).savefig(picture, dpi=dpi)
    return [out, picture]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="2048,16384")
    parser.add_argument("--variants", default="default")
    parser.add_argument("--out", help="a JSON file for the summaries")
    parser.add_argument("--compile-only", action="store_true", help="compile for sm_90 and stop (no GPU needed)")
    parser.add_argument("--results", metavar="FOLDER",
                        help="measure at 256 and 2048 rows and store beside FOLDER's newest results file")
    args = parser.parse_args(argv)
    specs = args.variants.split(",")
    if args.compile_only:
        for spec in specs:
            compile_for_sm90(parse_variant(spec) or Variant.default(Config.dsv41().D, 65536), Config.dsv41())
            print(f"compiled {spec} for sm_90")
        return 0
    import torch

    if not torch.cuda.is_available():
        print("timeline.py reads the GPU's timer; this machine has no GPU (try --compile-only).", file=sys.stderr)
        return 2
    if args.results:
        results_file = newest_results(args.results)
        if results_file is None:
            print(f"no results file in {args.results}: run `python -m c2graph bench` first", file=sys.stderr)
            return 2
        print("wrote " + ", ".join(map(str, write_timeline(results_file))))
        return 0
    found = {}
    for rows in map(int, args.rows.split(",")):
        for spec in specs:
            s = found[f"{rows}:{spec}"] = summary(timeline(rows, spec))
            steps = " | ".join(f"{name} {s[name][0]:.2f}/{s[name][1]:.2f}" for name in (*STEPS, "one program"))
            print(f"{rows:>6} {spec:<28} span {s['span_us']:.2f} µs, last start {s['last_start_us']:.2f} | "
                  f"median/max µs: {steps}", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(found, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
