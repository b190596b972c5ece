"""Which machine this is, and how Triton will run on it.

Imported first by ``c2graph/__init__.py``: on a machine without CUDA it sets
``TRITON_INTERPRET=1`` before the package's kernels are decorated, so the same kernels run in
Triton's interpreter (numpy, one program after another) instead of being compiled. Triton
builds its own library (``tl.cumsum`` and the rest) for one mode when it is first imported, so a
program that imported ``triton`` before ``c2graph`` on such a machine stops at ``import c2graph``
with one line that says what to do. ``TRITON_INTERPRET=0``, set before Python imports anything,
keeps Triton compiling on such a machine: for tools that compile the kernels for a GPU target
and launch nothing.
"""

from __future__ import annotations

import os

import torch

HAS_CUDA: bool = torch.cuda.is_available()

# "0" set on purpose keeps Triton compiling (a tool that compiles for a GPU target and launches nothing).
if not HAS_CUDA and os.environ.get("TRITON_INTERPRET") != "0":
    os.environ["TRITON_INTERPRET"] = "1"

INTERPRET: bool = os.environ.get("TRITON_INTERPRET", "0") == "1"

import triton  # noqa: E402  (must come after TRITON_INTERPRET is decided)


def _library_interpreted() -> bool:
    """Whether Triton's own library (``tl.cumsum`` and the rest) was built for its interpreter:
    Triton decorates it once, when ``triton`` is first imported."""
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(triton.language.cumsum, InterpretedFunction)


if INTERPRET and not _library_interpreted():
    raise ImportError(
        "c2graph: Triton was imported before c2graph on a machine without CUDA, so its library is "
        "built for a GPU: import c2graph before triton, or start Python with TRITON_INTERPRET=1 set")

DEFAULT_DEVICE = torch.device("cuda" if HAS_CUDA else "cpu")


def environment() -> dict[str, str]:
    """Versions, the device, and whether Triton runs compiled or interpreted."""
    import platform

    device = torch.cuda.get_device_name(0) if HAS_CUDA else f"CPU ({platform.machine()})"
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "device": device,
        "triton mode": "interpreted (TRITON_INTERPRET=1)" if INTERPRET else "compiled",
        "graphs": "CUDA graphs" if HAS_CUDA else "CPU emulation of CUDA graphs",
    }


def banner() -> str:
    env = environment()
    return f"c2graph: {env['device']}; Triton {env['triton mode']}; {env['graphs']}"
