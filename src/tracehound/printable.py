"""Names from the node, made safe to print.

Any user on a node names cgroups, mounts, processes and files, and those
names reach a terminal through `top`, `explain` and `chaos`: each character
that would not print (controls, format characters, line and paragraph
separators, surrogates) is written as its Python escape ("\\r", "\\x1b",
"\\u202e"), so a name can neither move the cursor, clear the screen nor send
the terminal an escape sequence, and still says what it was.
"""
from __future__ import annotations


def escaped(text: str) -> str:
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii")
                   for c in text)
