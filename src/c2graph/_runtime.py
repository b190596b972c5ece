"""Which machine this is, and how Triton runs on it.

Imported first by ``c2graph/__init__.py``. On a machine without CUDA the package's kernels run in
Triton's interpreter (numpy, one program after another) instead of being compiled. Triton chooses
its mode from ``TRITON_INTERPRET`` at two moments: when ``triton`` is first imported (it builds
its own library, ``tl.cumsum`` and the rest, and at a kernel's first launch the part it imports
then, for one mode) and when ``@triton.jit`` decorates a kernel. So :func:`kernels_decorated`
sets ``TRITON_INTERPRET=1`` in ``os.environ`` only while the package imports Triton and decorates
its own kernels, and puts ``os.environ`` back as it was: the package's import changes no
variable of the process, and a child process inherits none from it.

A program's *own* ``@triton.jit`` kernels are decorated by the program: on such a machine they run
in the interpreter where the program says so, with ``TRITON_INTERPRET=1`` set before Python
starts, or with one call of :func:`interpret_triton` before the kernels are defined (the
notebooks' harness, :mod:`c2graph.workshop`, makes that call when it is imported).

A program that imported ``triton`` before ``c2graph`` on such a machine, without the variable,
has Triton's library built for a GPU: ``import c2graph`` stops there with one line that says what
to do. ``TRITON_INTERPRET=0``, set before Python starts, keeps Triton compiling on such a machine:
for tools that compile the kernels for a GPU target and launch nothing.
"""

from __future__ import annotations

import contextlib
import os

import torch

HAS_CUDA: bool = torch.cuda.is_available()

_VARIABLE = "TRITON_INTERPRET"
# "0" set on purpose keeps Triton compiling (a tool that compiles for a GPU target and launches nothing).
INTERPRET: bool = os.environ.get(_VARIABLE) == "1" or (not HAS_CUDA and os.environ.get(_VARIABLE) != "0")


@contextlib.contextmanager
def kernels_decorated():
    """``TRITON_INTERPRET=1`` in ``os.environ`` for the ``with`` block where :data:`INTERPRET`, so
    Triton imported and kernels decorated in it run in the interpreter; ``os.environ`` as it was
    afterwards, on every exit."""
    before = os.environ.get(_VARIABLE)
    if not INTERPRET or before == "1":
        yield
        return
    os.environ[_VARIABLE] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(_VARIABLE, None)
        else:
            os.environ[_VARIABLE] = before


def interpret_triton() -> bool:
    """Run the Triton kernels this program decorates from now on in Triton's interpreter, where the
    package's own run there (a machine without CUDA): sets ``TRITON_INTERPRET=1`` in ``os.environ``
    for the rest of the process, and the processes it starts. Does nothing on a CUDA machine or
    where ``TRITON_INTERPRET=0`` was set. Returns :data:`INTERPRET`: whether they are interpreted."""
    if INTERPRET:
        os.environ[_VARIABLE] = "1"
    return INTERPRET


with kernels_decorated():
    import triton
    if INTERPRET:
        # Imported by Triton at a kernel's first launch, and built for the mode it finds then.
        import triton.experimental.gluon  # noqa: F401


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
