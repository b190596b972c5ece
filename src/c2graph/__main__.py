"""``python -m c2graph COMMAND``: the package's command line.

- ``bench``: the GPU benchmark (:mod:`c2graph.measure.bench`)
- ``figures FOLDER``: write the figures (:mod:`c2graph.workshop.figures`)
- ``dp --ranks N``: data-parallel ranks as real processes (:mod:`c2graph.dp`)
"""

from __future__ import annotations

import sys

COMMANDS = {
    "bench": "c2graph.measure.bench",
    "figures": "c2graph.workshop.figures",
    "dp": "c2graph.dp",
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in COMMANDS:
        names = ", ".join(COMMANDS)
        print(f"usage: python -m c2graph {{{names}}} [arguments]", file=sys.stderr)
        return 2
    import importlib

    module = importlib.import_module(COMMANDS[argv[0]])
    return module.main(argv[1:]) or 0


if __name__ == "__main__":
    sys.exit(main())
