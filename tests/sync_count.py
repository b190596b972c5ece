"""Counting the reads of tensor values on the host: what would be a host sync on a GPU.

:func:`counting_host_reads` patches every ``torch.Tensor`` method that reads values back to Python
(``item``, ``tolist``, ``cpu``, ``numpy``, ``bool()``, ``int()``, ``float()``) to record each call,
except inside the request allocator, whose ``req_to_token`` table lives on the host (reading it is
no sync). On the CPU emulation this shows which code would sync on a GPU.
"""

from __future__ import annotations

import contextlib
import threading
import traceback

import torch

import c2graph as c2

READS = ("item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__")
HOST_SIDE = ("check_request", "assign", "pages_for", "take", "locations", "free")


@contextlib.contextmanager
def counting_host_reads(monkeypatch):
    """Yield a list that gets one ``(method, where)`` per read of a tensor value made in this
    thread, outside the allocator, while the ``with`` block runs."""
    reads: list[tuple[str, str]] = []
    state = threading.local()
    me = threading.get_ident()

    def paused() -> bool:
        return getattr(state, "host_side", 0) > 0 or threading.get_ident() != me

    for name in READS:
        original = getattr(torch.Tensor, name)

        def counted(self, *args, _original=original, _name=name, **kwargs):
            if not paused():
                frame = traceback.extract_stack(limit=3)[0]
                reads.append((_name, f"{frame.filename}:{frame.lineno}"))
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    for name in HOST_SIDE:
        original = getattr(c2.ReqToTokenPool, name)

        def host_side(self, *args, _original=original, **kwargs):
            state.host_side = getattr(state, "host_side", 0) + 1
            try:
                return _original(self, *args, **kwargs)
            finally:
                state.host_side -= 1

        monkeypatch.setattr(c2.ReqToTokenPool, name, host_side)
    try:
        yield reads
    finally:
        monkeypatch.undo()
