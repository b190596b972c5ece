"""What every picture shares: one colour per request slot, the words on the labels, and the size
bounds that keep a picture readable in a notebook column.

- :func:`request_colour` gives request slot ``r`` the same colour in every picture (the batch,
  the ring, the extend offsets, the fused kernel's programs, the static buffers, the wrong
  slots); padding rows get one neutral grey. The palette is Okabe-Ito, which stays distinct
  under the common colour-vision deficiencies; colours repeat from request slot 6 on.
- Other categories (op names, paths) use :data:`CATEGORY_COLOURS`, a different palette, so a
  hue in these pictures always means a request slot.
- A picture is at most :data:`MAX_WIDTH` inches wide and writes no text smaller than
  :data:`MIN_FONT` points: at a notebook's 100 dpi it fits a notebook column and is shown at
  100% zoom, not shrunk. Pictures that grow with the rows leave out the per-row labels that
  would overlap (:func:`spaced`) rather than shrink them.
"""

from __future__ import annotations

import math
from functools import lru_cache

from matplotlib.colors import to_rgb
from matplotlib.figure import Figure
from matplotlib.font_manager import FontProperties
from matplotlib.textpath import TextToPath

# Okabe-Ito, without black (kept for edges and text) and yellow (too light on white).
REQUEST_COLOURS = ("#E69F00", "#56B4E9", "#009E73", "#0072B2", "#D55E00", "#CC79A7")
PADDING_COLOUR = "#DDDDDD"
SENTINEL_COLOUR = "#BBBBBB"
EDGE = "#333333"
MUTED = "#555555"
# Paul Tol's "muted" palette, for categories that are not request slots.
CATEGORY_COLOURS = ("#332288", "#88CCEE", "#117733", "#DDCC77", "#882255", "#44AA99", "#999933", "#AA4499")

MAX_WIDTH = 12.0
"""Inches: the widest picture, about a notebook column at 100 dpi."""
MIN_FONT = 9.0
"""Points: the smallest text any picture writes."""
FONT = 9.5
"""Points: ordinary labels."""
TITLE_FONT = 10.5


def request_colour(slot: int | None) -> str:
    """The colour of request slot ``slot`` in every picture; ``None`` (a padding row): grey."""
    if slot is None:
        return PADDING_COLOUR
    return REQUEST_COLOURS[slot % len(REQUEST_COLOURS)]


def request_label(slot: int) -> str:
    """How every picture names request slot ``slot``: ``"request slot 2"``."""
    return f"request slot {slot}"


def plural(count: int, word: str) -> str:
    """``3 rows``, ``1 row``."""
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def figure_width(wanted: float, least: float = 6.0) -> float:
    """A figure width in inches: ``wanted``, at least ``least``, at most :data:`MAX_WIDTH`."""
    return min(MAX_WIDTH, max(least, wanted))


@lru_cache(maxsize=4096)
def text_width(text: str, size: float = FONT) -> float:
    """Width in points of ``text`` (its widest line) at ``size`` points."""
    props = FontProperties(size=size)
    return max(TextToPath().get_text_width_height_descent(line, props, ismath=False)[0]
               for line in text.split("\n"))


def text_colour(face) -> str:
    """Black or white, whichever reads better on a cell of colour ``face``."""
    r, g, b = to_rgb(face)
    luminance = 0.2126 * r**2.2 + 0.7152 * g**2.2 + 0.0722 * b**2.2
    return "black" if luminance > 0.18 else "white"


def legend_below(fig: Figure, handles: list, ncol: int | None = None) -> None:
    """The legend under the axes, in as many columns as fit the figure's width (or ``ncol``)."""
    if ncol is None:
        room = fig.get_figwidth() * 72.0 - 20.0
        widths = [text_width(h.get_label()) + 45.0 for h in handles]  # the handle and the gaps
        ncol = max(1, len(handles))
        while ncol > 1 and _legend_width(widths, ncol) > room:
            ncol -= 1
    fig.legend(handles=handles, loc="outside lower center", ncol=ncol, fontsize=FONT, frameon=False)


def spaced(centres: list[float], texts: list[str], points_per_unit: float, size: float = FONT) -> list[bool]:
    """Which of the labels ``texts``, centred at ``centres`` (data units, increasing), to draw so
    that no two overlap: from the left, a label is kept when it clears the last kept one."""
    keep, right = [], -math.inf
    for x, s in zip(centres, texts):
        half = (text_width(s, size) + 3.0) / 2 / points_per_unit
        ok = bool(s) and x - half >= right
        keep.append(ok)
        if ok:
            right = x + half
    return keep


def _legend_width(widths: list[float], ncol: int) -> float:
    """Points across a legend of entries ``widths`` wide in ``ncol`` columns (filled column by column)."""
    rows = math.ceil(len(widths) / ncol)
    return sum(max(widths[j * rows:(j + 1) * rows], default=0.0) for j in range(ncol))
