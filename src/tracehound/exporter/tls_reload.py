"""The exporter's TLS context, rebuilt when the files it came from change.

Certificates are renewed in place: cert-manager rewrites a Secret, which
the kubelet swaps into the pod's volume; an ACME client rewrites files on a
host. Each TLS handshake first compares the files' identity (modification
time, size, inode: one stat each) with what the context was built from; on
a change the whole context is built again from the web configuration's
settings. A change that does not load (a key written before its
certificate, a broken file) keeps the context in use, says so once, and is
tried again at the files' next change.
"""
from __future__ import annotations

import logging
import os
import ssl
import threading
from typing import Callable

log = logging.getLogger(__name__)


def _identity(paths) -> tuple:
    out = []
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:
            out.append(None)
            continue
        out.append((st.st_mtime_ns, st.st_size, st.st_ino))
    return tuple(out)


class CertificateReloader:
    """current(): the context to hand a new connection."""

    def __init__(self, make: Callable[[], ssl.SSLContext], paths, context: ssl.SSLContext):
        self._make = make
        self._paths = tuple(paths)
        self._context = context
        self._seen = _identity(self._paths)
        self._lock = threading.Lock()
        self.reloads = 0

    def current(self) -> ssl.SSLContext:
        identity = _identity(self._paths)
        if identity == self._seen:
            return self._context
        with self._lock:
            if identity != self._seen:
                self._seen = identity
                try:
                    self._context = self._make()
                    self.reloads += 1
                    log.warning("TLS certificate reloaded from %s", ", ".join(self._paths))
                except (ValueError, OSError) as exc:    # WebConfigError is a ValueError
                    log.warning("TLS files changed but do not load, the previous "
                                "certificate stays in use: %s", exc)
            return self._context
