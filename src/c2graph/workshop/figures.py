"""Write the figures a reader needs outside Jupyter: ``python -m c2graph figures FOLDER``.

The path diagram, a ragged batch (rows -> groups -> c2 slots) and the ring around it, the
batch's extend offsets and the fused kernel's programs, and the slots a graph with frozen
offsets gets wrong, drawn from code; and, where ``benchmarks/results/`` holds a stored GPU run,
the benchmark's pictures drawn from the newest one. PNGs in ``FOLDER`` (created if needed);
each path is printed relative to the current directory.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import matplotlib

from ..compressor.batch import ExtendBatch
from ..compressor.compress import compress
from ..compressor.config import Config
from ..compressor.pools import Pools
from ..compressor.req_to_token import ReqToTokenPool
from ..compressor.source_layer import SourceLayer
from ..measure.results import newest_results
from ..pictures.bench_plots import write_gpu_figures
from ..pictures.draw import draw_batch, draw_path, draw_ring
from ..pictures.draw_fused import draw_extend_offsets, draw_programs
from ..pictures.draw_graph import draw_wrong_slots
from .broken_offsets import BrokenOffsetsRunner

POOL_REQUESTS = 4
# Requests 1 and 2 were prefilled up to pos 5 and 12 by an earlier batch; request 0 is new.
EARLIER = [(1, 0, 5), (2, 0, 12)]
RAGGED = [(0, 0, 7), (1, 5, 6), (2, 12, 3)]
BUCKET = 24


def example_batches(cfg: Config) -> tuple[ExtendBatch, ExtendBatch]:
    """The example the figures draw: ``(earlier batch, ragged batch padded to a bucket of 24)``."""
    alloc = ReqToTokenPool(cfg, POOL_REQUESTS, 32, seed=0)
    earlier = ExtendBatch.build(EARLIER, alloc, device="cpu")
    ragged = ExtendBatch.build(RAGGED, alloc, pad_to=BUCKET, device="cpu")
    return earlier, ragged


def frozen_offsets_figure(cfg: Config):
    """The ``python_ints`` variant of notebook 03: a graph that replays the dummy batch's offsets.

    A first batch of three fresh requests, then three that continue it (odd, odd, even starts),
    replayed in a bucket of 32 rows next to the eager fused path; the picture marks each wrong slot.
    """
    layer = SourceLayer(cfg, seed=5)  # the default device: the kernel runs compiled on a GPU
    alloc = ReqToTokenPool(cfg, 6, 96, seed=5)
    pools = Pools(cfg, 6, alloc.kv_slots).poison()
    runner = BrokenOffsetsRunner(layer, pools, variant="python_ints", buckets=[32], request_slots=4)
    eager = pools.clone()
    for i, reqs in enumerate(([(0, 0, 5), (1, 0, 3), (2, 0, 8)], [(0, 5, 6), (1, 3, 7), (2, 8, 5)])):
        x = layer.random_hidden(sum(n for *_, n in reqs), seed=10 + i)
        rings_before = (pools.ring.clone(), eager.ring.clone())
        batch = runner.run(reqs, alloc, x).batch
        compress(layer, x, ExtendBatch.build(reqs, alloc, device=layer.device), eager)
    return draw_wrong_slots(pools, eager, batch, cfg.ring_size, frozen_offsets=runner.static.extend_offsets,
                            rings_before=rings_before,
                            title="Offsets frozen at capture (python_ints): the slots a replay gets wrong")


def write_figures(folder: str | os.PathLike, dpi: int = 150) -> list[Path]:
    """Draw the figures into ``folder`` (created if needed) and return their paths."""
    cfg = Config.tiny()
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    earlier, ragged = example_batches(cfg)
    figures = {
        "path.png": draw_path(cfg),
        "ragged_batch.png": draw_batch(ragged, cfg.ring_size),
        "ring.png": draw_ring(ragged, POOL_REQUESTS, cfg.ring_size, previous=earlier),
        "extend_offsets.png": draw_extend_offsets(ragged),
        "fused_programs.png": draw_programs(ragged, cfg.ring_size),
        "frozen_offsets.png": frozen_offsets_figure(cfg),
    }
    paths = []
    for name, fig in figures.items():
        fig.savefig(out / name, dpi=dpi)
        paths.append(out / name)
    stored = newest_results()
    if stored is not None:  # the GPU figures, drawn from the newest stored results
        paths += write_gpu_figures(stored, out, dpi=dpi)
    return paths


def main(argv: list[str] | None = None) -> None:
    """The command line. Uses the Agg backend: no display is needed (or opened)."""
    matplotlib.use("Agg")
    parser = argparse.ArgumentParser(prog="python -m c2graph figures", description=__doc__.splitlines()[0])
    parser.add_argument("folder", help="where to write the PNGs (created if needed)")
    args = parser.parse_args(argv)
    for path in write_figures(args.folder):
        print(os.path.relpath(path))


if __name__ == "__main__":
    main()
