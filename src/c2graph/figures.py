"""Write the figures a reader needs outside Jupyter: ``python -m c2graph.figures FOLDER``.

The path diagram, a ragged batch (rows -> groups -> c2 slots) and the ring around it, as PNGs
in ``FOLDER`` (created if needed); each path is printed relative to the current directory.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import matplotlib

from .batch import ExtendBatch
from .config import Config
from .draw import draw_batch, draw_path, draw_ring
from .req_to_token import ReqToTokenPool

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
    }
    paths = []
    for name, fig in figures.items():
        fig.savefig(out / name, dpi=dpi)
        paths.append(out / name)
    return paths


def main(argv: list[str] | None = None) -> None:
    """The command line. Uses the Agg backend: no display is needed (or opened)."""
    matplotlib.use("Agg")
    parser = argparse.ArgumentParser(prog="python -m c2graph.figures", description=__doc__.splitlines()[0])
    parser.add_argument("folder", help="where to write the PNGs (created if needed)")
    args = parser.parse_args(argv)
    for path in write_figures(args.folder):
        print(os.path.relpath(path))


if __name__ == "__main__":
    main()
