"""Who holds a listening TCP port: the uids of its sockets in this network
namespace, from /proc/net/tcp and /proc/net/tcp6.

Any user can make sockets, so the tables are read this far and no further
(a line each socket), and a line that does not parse is skipped.
"""
from __future__ import annotations

MAX_LINES = 200_000
LISTEN = "0A"
TABLES = ("/proc/net/tcp", "/proc/net/tcp6")


def listener_uids(port: int, tables=TABLES) -> set[int]:
    """The uids owning sockets that listen on `port` (any address)."""
    uids: set[int] = set()
    for table in tables:
        try:
            with open(table, "rb") as f:
                for n, line in enumerate(f):
                    if n > MAX_LINES:
                        break
                    fields = line.split()
                    if len(fields) < 8 or fields[3] != LISTEN.encode():
                        continue
                    _, _, hexport = fields[1].partition(b":")
                    try:
                        if int(hexport, 16) == port:
                            uids.add(int(fields[7]))
                    except ValueError:
                        continue
        except OSError:
            continue
    return uids
