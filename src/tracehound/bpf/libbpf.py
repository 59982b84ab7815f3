"""ctypes bindings for the subset of libbpf.so.1 tracehound uses.

Only stable libbpf 1.x symbols are bound, so Debian 12's libbpf 1.1 works.
Everything returned to callers is plain Python; pointers stay in this module
and in loader.py.
"""
from __future__ import annotations

import collections
import ctypes
import ctypes.util
import os
import threading

from ..errors import SetupError

LIBBPF_NAME = os.environ.get("TRACEHOUND_LIBBPF", "libbpf.so.1")

_lib = None
_lock = threading.Lock()

# Last lines libbpf printed (verifier logs included), for error messages.
log_tail: collections.deque[str] = collections.deque(maxlen=400)

_PRINT_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)
_libc = ctypes.CDLL(None, use_errno=True)
_libc.vsnprintf.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_void_p]
_libc.vsnprintf.restype = ctypes.c_int


# The size of the va_list state behind the pointer a callback receives (a
# struct on x86-64 and arm64): copied before the first formatting, so a
# message longer than the first buffer can be formatted again (va_copy).
_VA_LIST_SIZE = {"x86_64": 24, "aarch64": 32}.get(os.uname().machine)


def _print(level: int, fmt: bytes, va_list: int) -> int:
    # On x86-64 and arm64 a va_list argument arrives as a pointer, which
    # vsnprintf accepts unchanged. A verifier log is one message that can be
    # far longer than a line, and its end says why a program was refused.
    copy = None
    if _VA_LIST_SIZE:
        copy = ctypes.create_string_buffer(_VA_LIST_SIZE)
        ctypes.memmove(copy, va_list, _VA_LIST_SIZE)
    buf = ctypes.create_string_buffer(4096)
    need = _libc.vsnprintf(buf, len(buf), fmt, va_list)
    if copy is not None and need >= len(buf):
        buf = ctypes.create_string_buffer(min(need + 1, 16 << 20))
        _libc.vsnprintf(buf, len(buf), fmt, ctypes.addressof(copy))
    for line in buf.value.decode(errors="replace").splitlines():
        log_tail.append(line)
    return 0


_print_cb = _PRINT_FN(_print)

c_int, c_uint, c_void_p, c_char_p, c_size_t = (
    ctypes.c_int, ctypes.c_uint, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t)

_SIGNATURES = {
    "libbpf_set_print": (c_void_p, [_PRINT_FN]),
    "bpf_object__open_file": (c_void_p, [c_char_p, c_void_p]),
    "bpf_object__load": (c_int, [c_void_p]),
    "bpf_object__close": (None, [c_void_p]),
    "bpf_object__next_program": (c_void_p, [c_void_p, c_void_p]),
    "bpf_object__find_map_by_name": (c_void_p, [c_void_p, c_char_p]),
    "bpf_program__name": (c_char_p, [c_void_p]),
    "bpf_program__section_name": (c_char_p, [c_void_p]),
    "bpf_program__set_autoload": (c_int, [c_void_p, ctypes.c_bool]),
    "bpf_program__autoload": (ctypes.c_bool, [c_void_p]),
    "bpf_program__set_attach_target": (c_int, [c_void_p, c_int, c_char_p]),
    "bpf_program__attach": (c_void_p, [c_void_p]),
    "bpf_program__attach_uprobe": (c_void_p, [c_void_p, ctypes.c_bool, c_int, c_char_p, c_size_t]),
    "bpf_program__fd": (c_int, [c_void_p]),
    "bpf_link__destroy": (c_int, [c_void_p]),
    "bpf_map__fd": (c_int, [c_void_p]),
    "bpf_map__set_max_entries": (c_int, [c_void_p, ctypes.c_uint32]),
    "bpf_map__set_initial_value": (c_int, [c_void_p, c_void_p, c_size_t]),
    "bpf_map__key_size": (ctypes.c_uint32, [c_void_p]),
    "bpf_map__max_entries": (ctypes.c_uint32, [c_void_p]),
    "bpf_map__value_size": (ctypes.c_uint32, [c_void_p]),
    "bpf_map_lookup_elem": (c_int, [c_int, c_void_p, c_void_p]),
    "bpf_map_update_elem": (c_int, [c_int, c_void_p, c_void_p, ctypes.c_uint64]),
    "bpf_map_delete_elem": (c_int, [c_int, c_void_p]),
    "bpf_map_get_next_key": (c_int, [c_int, c_void_p, c_void_p]),
    "bpf_map_lookup_batch": (c_int, [c_int, c_void_p, c_void_p, c_void_p, c_void_p,
                                     ctypes.POINTER(ctypes.c_uint32), c_void_p]),
    "libbpf_num_possible_cpus": (c_int, []),
    "bpf_obj_pin": (c_int, [c_int, c_char_p]),
    "bpf_obj_get": (c_int, [c_char_p]),
}


def lib() -> ctypes.CDLL:
    """The loaded libbpf, with signatures set; raises SetupError if missing."""
    global _lib
    with _lock:
        if _lib is None:
            try:
                handle = ctypes.CDLL(LIBBPF_NAME, use_errno=True)
            except OSError:
                raise SetupError(
                    f"{LIBBPF_NAME} not found: install libbpf 1.x "
                    "(Debian/Ubuntu: apt-get install libbpf1)") from None
            for name, (restype, argtypes) in _SIGNATURES.items():
                fn = getattr(handle, name, None)
                if fn is None:
                    raise SetupError(f"{LIBBPF_NAME} lacks {name}: libbpf 1.0 or newer is needed")
                fn.restype = restype
                fn.argtypes = argtypes
            handle.libbpf_set_print(_print_cb)
            _lib = handle
        return _lib


def errno_of(ret: int | None = None) -> int:
    """libbpf 1.x returns -errno and also sets errno; prefer the return."""
    if ret is not None and ret < 0:
        return -ret
    return ctypes.get_errno() or 0


def strerror(err: int) -> str:
    return f"{os.strerror(err)} (errno {err})"


def take_log() -> str:
    """Drain and return what libbpf has printed since the last call."""
    lines = list(log_tail)
    log_tail.clear()
    return "\n".join(lines)
