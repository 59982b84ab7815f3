"""Giving freed heap memory back to the kernel.

glibc keeps what a process frees for its next allocations. After a burst
(libbpf parsing the kernel's BTF while the probes load, a scrape of tens of
thousands of series) the agent's RSS would otherwise stay at that peak for
good, and an agent is judged by what it holds on a busy node.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools


@functools.lru_cache(maxsize=1)
def _malloc_trim():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):    # not glibc (musl has no malloc_trim)
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


def release_free_memory() -> bool:
    """Return the C heap's free pages to the kernel; False where the C
    library cannot."""
    trim = _malloc_trim()
    return bool(trim is not None and trim(0) >= 0)
