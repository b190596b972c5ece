"""Notebook 00's set-up check: is this machine ready for the workshop? One line says ready, or
what is wrong and how to fix it.

:func:`check_setup` checks three things, each a plain function the tests call:

- :func:`version_problems`: Python and every package the notebooks import, against the ranges
  c2graph declares (its installed metadata, or ``pyproject.toml`` in a checkout);
- :func:`triton_problem`: one small Triton kernel runs (compiled on a GPU, in Triton's
  interpreter on a CPU) and returns the right numbers;
- :func:`graph_problem`: one graph is captured and replayed (a real CUDA graph, or the CPU
  emulation) and a replay after a ``copy_`` sees the new input.

In the checkout's own ``.venv`` (the one ``make lab`` installs), :func:`pin_notes` also says when
torch or triton is not the version ``constraints.txt`` pins (the versions the notebooks' stored
outputs were made with), e.g. where the install took torch from pip's own index.
"""

from __future__ import annotations

import sys
import tomllib
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

import torch
import triton
import triton.language as tl
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

from .. import _runtime
from ..graphs.graph import Graph

NEEDED = ("torch", "triton", "matplotlib", "ipywidgets")
"""The packages the notebooks import (JupyterLab is already running the cell that asks)."""
EXTRA = "lab"
"""The extra of c2graph that holds the notebooks' packages beyond torch and Triton."""
FIX_VERSIONS = "run `make lab` in the repository: it installs the versions pinned in constraints.txt"
PINNED = ("torch", "triton")
"""The packages whose exact versions :func:`pin_notes` compares with ``constraints.txt``."""
CHECKOUT = Path(__file__).resolve().parents[3]
"""The repository's root when c2graph runs from a checkout (``pyproject.toml``, ``constraints.txt``)."""


@dataclass
class SetupReport:
    """What :func:`check_setup` found: ``ok``, and each problem with its fix, in words."""

    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def __bool__(self) -> bool:
        return self.ok

    def __str__(self) -> str:
        if self.ok:
            return ("ready: Python and every package as c2graph needs them; one Triton kernel and one graph "
                    "replay gave the right numbers" + "".join(f"; but {note}" for note in self.notes))
        return "not ready: " + "; and ".join(self.problems)

    __repr__ = __str__


def declared_requirements() -> tuple[str, list[Requirement]]:
    """c2graph's ``requires-python`` and the requirements the notebooks run with: the package's own
    and its ``lab`` extra's (:data:`EXTRA`), from its installed metadata, or from ``pyproject.toml``
    when the package runs from a checkout's ``src/`` without being installed."""
    try:
        meta = metadata.metadata("c2graph")
        reqs = [Requirement(r) for r in metadata.requires("c2graph") or []]
        wanted = [r for r in reqs if r.marker is None or r.marker.evaluate({"extra": EXTRA})]
        return meta["Requires-Python"] or "", [Requirement(f"{r.name}{r.specifier}") for r in wanted]
    except metadata.PackageNotFoundError:
        project = tomllib.loads((CHECKOUT / "pyproject.toml").read_text())["project"]
        reqs = project["dependencies"] + project.get("optional-dependencies", {}).get(EXTRA, [])
        return project.get("requires-python", ""), [Requirement(r) for r in reqs]


def version_problems(python: str | None = None, installed: dict[str, str | None] | None = None) -> list[str]:
    """Python and each package of :data:`NEEDED` against the declared ranges. ``python`` and
    ``installed`` (name -> version, ``None`` when missing) default to this machine's."""
    requires_python, reqs = declared_requirements()
    python = python or ".".join(map(str, sys.version_info[:3]))
    problems = []
    if requires_python and python not in SpecifierSet(requires_python):
        problems.append(f"Python {python} runs this notebook, c2graph needs Python {requires_python}: make "
                        "`.venv` with a newer `python3` (`make lab` uses the first `python3` on the PATH)")
    for req in (r for r in reqs if r.name in NEEDED):
        have = installed[req.name] if installed is not None else _installed(req.name)
        if have is None:
            problems.append(f"{req.name} is not installed: {FIX_VERSIONS}")
        elif not req.specifier.contains(have.split("+")[0], prereleases=True):
            lowest_first = ",".join(sorted(map(str, req.specifier), key=lambda spec: not spec.startswith(">")))
            problems.append(f"{req.name} {have} is installed, c2graph needs {req.name}{lowest_first}: {FIX_VERSIONS}")
    return problems


def pinned_versions() -> dict[str, str]:
    """``constraints.txt``'s pins of :data:`PINNED` (name -> version); empty outside a checkout."""
    path = CHECKOUT / "constraints.txt"
    lines = path.read_text().splitlines() if path.is_file() else []
    pins = (line.split("#")[0].strip().split("==") for line in lines)
    return {pin[0].lower(): pin[1] for pin in pins if len(pin) == 2 and pin[0].lower() in PINNED}


def pin_notes(installed: dict[str, str | None] | None = None, pins: dict[str, str] | None = None) -> list[str]:
    """Each package of :data:`PINNED` whose installed version (local label such as ``+cpu`` aside) is
    not ``constraints.txt``'s pin. ``installed`` and ``pins`` default to this machine's."""
    pins = pinned_versions() if pins is None else pins
    notes = []
    for name, pin in pins.items():
        have = installed[name] if installed is not None else _installed(name)
        if have is not None and have.split("+")[0] != pin:
            notes.append(f"{name} {have} is installed where constraints.txt pins {pin} (the version the notebooks' "
                         "stored outputs were made with): the notebooks should run, but a printed number may differ")
    return notes


def in_project_venv() -> bool:
    """Whether this Python is a ``.venv`` that ``make lab`` installed (it leaves ``.installed`` there)."""
    return (Path(sys.prefix) / ".installed").is_file()


def _installed(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


@triton.jit
def _add_one(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    # one program per BLOCK elements; the mask keeps the last program inside the tensors
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) + 1.0, mask=offs < n)


def triton_problem() -> str | None:
    """Run one small Triton kernel on :data:`~c2graph._runtime.DEFAULT_DEVICE`; ``None`` when it adds one."""
    if not _runtime.HAS_CUDA and not _runtime.INTERPRET:
        return ("Triton was imported before c2graph, so it cannot run on this CPU (TRITON_INTERPRET=1 must be set "
                "before Triton is imported): restart the kernel and run `import c2graph` first")
    x = torch.arange(10.0, device=_runtime.DEFAULT_DEVICE)
    out = torch.full_like(x, float("nan"))
    try:
        _add_one[(triton.cdiv(10, 8),)](x, out, 10, BLOCK=8)
    except Exception as e:  # a broken install shows here: say which, and how to fix it
        return f"a Triton kernel failed ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}): {FIX_VERSIONS}"
    if not torch.equal(out, x + 1):
        return f"a Triton kernel returned wrong numbers ({out.tolist()}, expected {(x + 1).tolist()}): {FIX_VERSIONS}"
    return None


def graph_problem() -> str | None:
    """Capture ``y = x * 2`` in a graph, ``copy_`` new values into ``x``, replay; ``None`` when ``y`` follows."""
    x = torch.arange(4.0, device=_runtime.DEFAULT_DEVICE)
    try:
        graph = Graph()
        with graph.capture():
            y = x * 2
        x.copy_(torch.tensor([5.0, 6.0, 7.0, 8.0]))
        graph.replay()
    except Exception as e:
        return f"a graph capture and replay failed ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}): {FIX_VERSIONS}"
    if y.tolist() != [10.0, 12.0, 14.0, 16.0]:
        return f"a graph replay returned {y.tolist()}, expected [10.0, 12.0, 14.0, 16.0]: {FIX_VERSIONS}"
    return None


def check_setup() -> SetupReport:
    """Versions, one Triton kernel, one graph replay: a :class:`SetupReport` whose one line says ready,
    or each problem and its fix; in the project's ``.venv``, a torch or triton other than the pinned
    one is named after "ready"."""
    problems = version_problems()
    problems += [p for p in (triton_problem(), graph_problem()) if p]
    return SetupReport(problems, pin_notes() if in_project_venv() else [])
