"""The nodes of a captured CUDA graph, read from the graph itself: nothing is launched.

``torch.cuda.CUDAGraph(keep_graph=True)`` keeps the ``cudaGraph_t`` it captured, and
``raw_cuda_graph()`` hands it out. The CUDA driver lists its nodes (``cuGraphGetNodes``, in the
order the capture created them), says each node's type, and for a kernel node gives the kernel
(``cuGraphKernelNodeGetParams``) and its name (``cuFuncGetName``, or ``cuKernelGetName`` for a
kernel the runtime loaded lazily). Kernel names come back mangled (``_ZN2at6native29vectorized_
elementwise_kernelILi4E...``); :func:`readable` keeps the qualified name before the template
arguments (``at::native::vectorized_elementwise_kernel``). Triton kernels keep their Python name.

Only the nodes that do work are listed: kernels, copies (``"Memcpy"``), fills (``"Memset"``)
and host callbacks (``"Host function"``); the empty, event and memory-allocation nodes that
order or feed them are not.
"""

from __future__ import annotations

import ctypes
import functools

_KERNEL, _MEMCPY, _MEMSET, _HOST = 0, 1, 2, 3  # CUgraphNodeType values
_WORK_NAMES = {_MEMCPY: "Memcpy", _MEMSET: "Memset", _HOST: "Host function"}


class _KernelNodeParams(ctypes.Structure):
    """``CUDA_KERNEL_NODE_PARAMS_v2``: the kernel (``func``, or ``kern`` when lazily loaded) and its launch."""

    _fields_ = [
        ("func", ctypes.c_void_p),
        ("grid", ctypes.c_uint * 3),
        ("block", ctypes.c_uint * 3),
        ("shared_mem_bytes", ctypes.c_uint),
        ("kernel_params", ctypes.c_void_p),
        ("extra", ctypes.c_void_p),
        ("kern", ctypes.c_void_p),
        ("ctx", ctypes.c_void_p),
    ]


@functools.cache
def _driver() -> ctypes.CDLL:
    return ctypes.CDLL("libcuda.so.1")


def _check(result: int, call: str) -> None:
    if result != 0:
        raise RuntimeError(f"{call} failed with CUDA driver error {result} while listing a graph's nodes")


def graph_nodes(raw_graph: int) -> list[str]:
    """One readable name per working node of the ``cudaGraph_t`` ``raw_graph``, in capture order."""
    cuda = _driver()
    count = ctypes.c_size_t(0)
    _check(cuda.cuGraphGetNodes(ctypes.c_void_p(raw_graph), None, ctypes.byref(count)), "cuGraphGetNodes")
    handles = (ctypes.c_void_p * count.value)()
    _check(cuda.cuGraphGetNodes(ctypes.c_void_p(raw_graph), handles, ctypes.byref(count)), "cuGraphGetNodes")
    names = []
    for handle in handles[: count.value]:
        kind = ctypes.c_int(-1)
        _check(cuda.cuGraphNodeGetType(ctypes.c_void_p(handle), ctypes.byref(kind)), "cuGraphNodeGetType")
        if kind.value == _KERNEL:
            names.append(readable(_kernel_name(cuda, handle)))
        elif kind.value in _WORK_NAMES:
            names.append(_WORK_NAMES[kind.value])
    return names


def _kernel_name(cuda: ctypes.CDLL, handle) -> str:
    params = _KernelNodeParams()
    _check(cuda.cuGraphKernelNodeGetParams_v2(ctypes.c_void_p(handle), ctypes.byref(params)),
           "cuGraphKernelNodeGetParams_v2")
    name = ctypes.c_char_p()
    if params.func:
        _check(cuda.cuFuncGetName(ctypes.byref(name), ctypes.c_void_p(params.func)), "cuFuncGetName")
    else:
        _check(cuda.cuKernelGetName(ctypes.byref(name), ctypes.c_void_p(params.kern)), "cuKernelGetName")
    return name.value.decode()


def readable(name: str) -> str:
    """The qualified name of an Itanium-mangled C++ function, before its template and argument lists.

    ``"_ZN2at6native29vectorized_elementwise_kernelILi4E..."`` -> ``"at::native::vectorized_elementwise_kernel"``;
    an anonymous namespace reads ``(anonymous namespace)``; a name that is not mangled is returned as it is.
    """
    if not name.startswith("_Z"):
        return name
    rest = name[2:].lstrip("L")
    nested = rest.startswith("N")
    i = 1 if nested else 0
    parts: list[str] = []
    while i < len(rest):
        if rest.startswith("St", i):
            parts.append("std")
            i += 2
            continue
        j = i
        while j < len(rest) and rest[j].isdigit():
            j += 1
        if j == i:
            break  # a template argument list, the end of the nested name, or a form not read here
        ident = rest[j : j + int(rest[i:j])]
        parts.append("(anonymous namespace)" if ident.startswith("_GLOBAL__N") else ident)
        i = j + len(ident)
        if not nested:
            break
    return "::".join(parts) or name
