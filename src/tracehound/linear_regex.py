"""Regular expressions given on the command line, matched against names any
user makes (cgroup paths), in time linear in the name: RE2's syntax and
guarantee (google-re2). Python's backtracking engine took minutes on one
crafted path against a pattern like `(a|a)*b`, holding the interpreter, so
the agent did not even end on SIGTERM. RE2 has no backreferences and no
lookaround: a pattern that needs them is refused when the flag is read.

A name is matched as the agent's labels show it (utf8.valid_utf8): each
byte that is not UTF-8 (kept as a surrogate when read) as one U+FFFD."""
from __future__ import annotations

from .utf8 import valid_utf8


class LinearPattern:
    def __init__(self, pattern: str):
        # imported when a pattern is given, not with every command: loading
        # the library costs an agent start seconds in an emulated guest
        import re2
        options = re2.Options()
        options.log_errors = False      # the error is raised, with its reason
        self.pattern = pattern
        try:
            self._compiled = re2.compile(pattern, options)
        except re2.error as exc:
            reason = exc.args[0] if exc.args else exc
            if isinstance(reason, bytes):
                reason = reason.decode("utf-8", "replace")
            raise ValueError(f"not a regular expression RE2 accepts: {reason}") from None

    def fullmatch(self, name: str) -> bool:
        return self._compiled.fullmatch(valid_utf8(name)) is not None
