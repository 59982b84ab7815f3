"""HTTP basic authentication against bcrypt hashes (web config's
basic_auth_users), as the Prometheus exporter toolkit does it:

* a bcrypt check costs tens of milliseconds on purpose. Prometheus sends
  the same credentials every scrape, so each verified answer is kept in a
  bounded cache keyed by a SHA-256 of (user, hash, password): the password
  itself is never kept, and a scrape pays bcrypt once;
* an unknown user is checked against a stand-in hash, so a wrong user name
  costs what a wrong password does (no telling which users exist);
* at most two bcrypt checks run at once: a flood of made-up passwords takes
  two cores' worth of time at most, never every connection thread's.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import threading
from collections import OrderedDict
from typing import Callable, Optional

import bcrypt

from .messages import Request, Response, text_response

CACHE_SIZE = 1024
_CONCURRENT_CHECKS = 2
_PREFIXES = (b"$2a$", b"$2b$", b"$2y$")
_CHALLENGE = [("WWW-Authenticate", 'Basic realm="tracehound", charset="UTF-8"')]


def check_hash(hashed: str) -> bool:
    """Whether hashed is a well-formed bcrypt hash."""
    raw = hashed.encode("ascii", "replace")
    if not raw.startswith(_PREFIXES) or len(raw) != 60:
        return False
    try:
        bcrypt.checkpw(b"", raw)
    except ValueError:
        return False
    return True


class BasicAuth:
    """Users (name -> bcrypt hash); guard() answers 401 to any request
    without one of their names and passwords."""

    def __init__(self, users: dict):
        self.users = {str(u): str(h).encode("ascii") for u, h in users.items()}
        # a hash of the same cost as the first user's, for unknown names
        cost = next(iter(self.users.values()))[4:6].decode() if self.users else "10"
        self._stand_in = bcrypt.hashpw(b"no such user", bcrypt.gensalt(int(cost)))
        self._cache: OrderedDict = OrderedDict()
        self._lock = threading.Lock()
        self._checks = threading.BoundedSemaphore(_CONCURRENT_CHECKS)
        self.bcrypt_checks = 0

    def verify(self, user: str, password: bytes) -> bool:
        hashed = self.users.get(user)
        known = hashed is not None
        if not known:
            hashed = self._stand_in
        key = hashlib.sha256(b"\0".join((user.encode("utf-8", "surrogatepass"), hashed,
                                          password))).digest()
        with self._lock:
            cached = self._cache.get(key)
            if cached is not None:
                self._cache.move_to_end(key)
                return cached
        with self._checks:
            self.bcrypt_checks += 1
            try:
                ok = bcrypt.checkpw(password, hashed) and known
            except ValueError:          # bcrypt refuses passwords over 72 bytes
                ok = False
        with self._lock:
            self._cache[key] = ok
            while len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
        return ok

    def guard(self, request: Request, app: Callable[[Request], Response]) -> Response:
        credentials = parse(request.headers.get("Authorization"))
        if credentials is None or not self.verify(*credentials):
            return text_response(401, "401 Unauthorized\n", _CHALLENGE)
        return app(request)


def parse(header: Optional[str]) -> Optional[tuple[str, bytes]]:
    """(user, password) of a Basic Authorization header, else None."""
    if not header:
        return None
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != "basic" or len(token) > 4096:
        return None
    try:
        decoded = base64.b64decode(token.strip(), validate=True)
    except (binascii.Error, ValueError):
        return None
    user, sep, password = decoded.partition(b":")
    if not sep:
        return None
    try:
        name = user.decode("utf-8")
    except UnicodeDecodeError:
        return None
    # bcrypt reads 72 bytes at most, and refuses NUL bytes
    if b"\0" in password:
        return None
    return name, password
