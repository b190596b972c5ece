"""Pictures of stored benchmark results (a file written by ``python -m c2graph bench``).

They read a results dict (:func:`c2graph.measure.results.load_results`) and run nothing, so they
draw GPU measurements on any machine. Every picture is titled with the run's device, torch and
Triton versions and date; a smoke run says in its title that it measured nothing. Figures are made
without pyplot (Jupyter shows a returned figure; ``fig.savefig(path)`` writes it).
"""

from __future__ import annotations

import os
from pathlib import Path

from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, NullLocator, PercentFormatter

from ..measure.results import computed_floor_us, describe, fastest_compiled, load_results, records

_COLOURS = {"torch": "#1f77b4", "compiled": "#2ca02c", "fused": "#d62728", "model": "#9467bd"}
_NAMES = {"torch": "torch path", "compiled": "torch.compile", "fused": "fused kernel", "model": "model"}
_FLOOR = "#7f7f7f"


def _rows_axis(ax, data: dict) -> None:
    rows = sorted(c["rows"] for c in data["cases"])
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(rows))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticklabels([str(n) for n in rows])
    ax.set_xlabel("rows in the batch (bucket)")


def _title(fig: Figure, data: dict, what: str) -> None:
    fig.suptitle(f"{what}\n{describe(data)}", fontsize=10)


def time_lines(data: dict, paths=("torch", "compiled", "fused")) -> list[tuple[str, str, str, dict[int, float]]]:
    """What :func:`draw_times` draws: ``(label, path, mode, {rows: µs})`` per measured variant.

    The compiled variants are drawn one line each, labelled by variant (which one is faster can
    change from bucket to bucket: the speed-up picture compares with the faster at each).
    """
    lines = []
    for path in paths:
        for mode in ("eager", "graph"):
            variants = sorted({r["variant"] for r in data["records"] if r["path"] == path and r["mode"] == mode})
            for variant in variants:
                found = records(data, path, mode, variant)
                label = f"{_NAMES[path]}, {mode}"
                if path == "compiled":
                    label += f" ({variant})"
                lines.append((label, path, mode, {n: r["median_us"] for n, r in found.items()}))
    return lines


def draw_times(data: dict, paths=("torch", "compiled", "fused")) -> Figure:
    """Time against rows on log axes for every variant of ``paths``, with the two floors.

    Solid lines are graph replays, dashed ones eager calls. The floors: one replay of a graph of
    one node (measured: a launch costs at least that) and the bytes the step must move over the
    measured copy bandwidth (computed: no implementation can be faster).
    """
    fig = Figure(figsize=(8.6, 6.2), layout="constrained")
    ax = fig.add_subplot()
    compiled = sorted({r["variant"] for r in data["records"] if r["path"] == "compiled"})
    for label, path, mode, times in time_lines(data, paths):
        dotted = path == "compiled" and not label.endswith(f"({compiled[0]})")  # the second variant
        style = "--" if mode == "eager" else (":" if dotted else "-")
        ax.plot(list(times), list(times.values()), style, marker="o", color=_COLOURS[path], label=label)
    rows = sorted(c["rows"] for c in data["cases"])
    launch = data["launch_us"]["graph"]
    ax.plot(rows, [launch] * len(rows), "-.", color=_FLOOR, lw=1.5,
            label=f"launch floor: replay of a 1-node graph ({launch:.1f} µs, measured)")
    floor = computed_floor_us(data)
    ax.plot(list(floor), list(floor.values()), color=_FLOOR, lw=3, alpha=0.5,
            label=f"computed floor: the step's bytes / copy bw ({data['copy_GBps']:.0f} GB/s)")
    ax.set_yscale("log")
    ax.set_ylabel(f"time per call, µs ({data['timer']}, median of {data['reps']})")
    _rows_axis(ax, data)
    ax.grid(True, which="both", alpha=0.3)
    fig.legend(fontsize=9, loc="outside lower center", ncols=2)
    _title(fig, data, "The c2 compressor of one source layer: time against rows")
    return fig


def draw_bandwidth(data: dict) -> Figure:
    """The fused path's bytes over its time, as a fraction of the copy bandwidth, per row count.

    Three bars a bucket, from the records: eager and graph with the weights counted once
    (``bw_fraction``, the headline: the step's bytes, so the graph bar is also the floor ratio,
    the memory floor's time over the replay's), and the graph with the weights counted once per
    program (``bw_fraction_weights_per_program``: the re-reads come mostly from the L2 cache, so
    this count flatters, and can pass 100%).
    """
    fig = Figure(figsize=(8.0, 4.6), layout="constrained")
    ax = fig.add_subplot()
    rows = sorted(c["rows"] for c in data["cases"])
    width = 0.27
    graph = records(data, "fused", "graph")
    bars_of = (
        ("eager, weights once", records(data, "fused", "eager"), "bw_fraction", 0.45, None),
        ("graph, weights once = memory floor / replay", graph, "bw_fraction", 1.0, None),
        ("graph, weights once a program (L2 re-reads: flatters)", graph,
         "bw_fraction_weights_per_program", 1.0, "//"),
    )
    top = 1.15
    for k, (label, found, field, alpha, hatch) in enumerate(bars_of):
        xs = [i + (k - 1) * width for i, n in enumerate(rows) if n in found]
        ys = [found[n][field] for n in rows if n in found]
        bars = ax.bar(xs, ys, width, color="white" if hatch else _COLOURS["fused"], alpha=alpha, hatch=hatch,
                      edgecolor=_COLOURS["fused"], label=f"fused, {label}")
        ax.bar_label(bars, [f"{y:.0%}" for y in ys], fontsize=8)
        top = max([top] + [y * 1.12 for y in ys])
    ax.axhline(1.0, color=_FLOOR, lw=1.5, label=f"measured copy bandwidth ({data['copy_GBps']:.0f} GB/s)")
    ax.set_xticks(range(len(rows)), [str(n) for n in rows])
    ax.set_xlabel("rows in the batch (bucket)")
    ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    ax.set_ylim(0, top)
    ax.set_ylabel("bytes / time, of copy bandwidth (measured)")
    fig.legend(fontsize=8, loc="outside lower center", ncols=2)
    _title(fig, data, "How close the fused kernel comes to the copy bandwidth")
    return fig


def speedups(data: dict) -> dict[str, dict[int, float]]:
    """``{what: {rows: factor}}``: how many times faster the fused path's graph replay is than the
    torch path's replay and than the faster compiled variant's replay."""
    fused = records(data, "fused", "graph")
    peers = {"torch path, graph": records(data, "torch", "graph"), "torch.compile, graph": fastest_compiled(data)}
    return {name: {n: r["median_us"] / fused[n]["median_us"] for n, r in found.items() if n in fused}
            for name, found in peers.items() if found}


def draw_speedups(data: dict) -> Figure:
    """Bars: the fused path's graph replay against the torch path's and ``torch.compile``'s replays."""
    fig = Figure(figsize=(8.0, 3.8), layout="constrained")
    ax = fig.add_subplot()
    rows = sorted(c["rows"] for c in data["cases"])
    found = speedups(data)
    width = 0.8 / max(1, len(found))
    for k, (name, factors) in enumerate(found.items()):
        path = "torch" if name.startswith("torch path") else "compiled"
        xs = [i + (k - (len(found) - 1) / 2) * width for i, n in enumerate(rows) if n in factors]
        ys = [factors[n] for n in rows if n in factors]
        bars = ax.bar(xs, ys, width, color=_COLOURS[path], label=f"fused replay vs {name} (measured)")
        ax.bar_label(bars, [f"{y:.1f}x" for y in ys], fontsize=9)
    ax.axhline(1.0, color=_FLOOR, lw=1)
    ax.set_xticks(range(len(rows)), [str(n) for n in rows])
    ax.set_xlabel("rows in the batch (bucket)")
    ax.set_ylabel("times faster (replay / replay)")
    ax.legend(fontsize=9, loc="upper left")
    _title(fig, data, "The fused kernel's graph replay against its peers' replays")
    return fig


def write_gpu_figures(results_file: str | os.PathLike, folder: str | os.PathLike, dpi: int = 150) -> list[Path]:
    """Draw the pictures of one stored results file into ``folder`` (created if needed); their paths."""
    data = load_results(results_file)
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    figures = {"bench_times.png": draw_times(data), "bench_bandwidth.png": draw_bandwidth(data),
               "bench_speedups.png": draw_speedups(data)}
    for name, fig in figures.items():
        fig.savefig(out / name, dpi=dpi)
    return [out / name for name in figures]
