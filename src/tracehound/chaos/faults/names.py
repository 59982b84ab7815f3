"""Names that become paths or tool arguments: checked against the grammar of
what they name, so that a name can never walk out of its directory
(`/run/netns/<netns>`, `/sys/class/net/<interface>`) or turn into an option
or a second key of a control file line.

Each checker returns None for a good name, else why it is not one.
"""
from __future__ import annotations

NAME_MAX = 255          # a file name (ip netns keeps namespaces as files)
IFNAMSIZ = 16           # the kernel's interface names, NUL included
DM_NAME_LEN = 128       # device-mapper names, NUL included
IB_DEVICE_NAME_MAX = 64 # RDMA device names, NUL included
PATH_MAX = 4096
_ASCII_SPACE = " \t\n\v\f\r"


def _common(value: str, what: str, limit: int) -> str | None:
    size = len(value.encode("utf-8", "surrogateescape"))
    if not value:
        return f"{what} must not be empty"
    if size > limit:
        return f"{what} {value!r} is {size} bytes, more than the {limit} the kernel allows"
    if "/" in value:
        return f"{what} {value!r} is a name, not a path: it must not contain '/'"
    if value in (".", ".."):
        return f"{what} must not be '{value}'"
    if "\0" in value:
        return f"{what} {value!r} must not contain a NUL byte"
    return None


def netns_name(value: str) -> str | None:
    """What `ip netns` accepts: a file name under /run/netns."""
    return _common(value, "a network namespace name", NAME_MAX)


def interface_name(value: str) -> str | None:
    """What the kernel accepts (dev_valid_name): at most 15 bytes, no '/',
    ':' or whitespace, not '.' or '..'."""
    why = _common(value, "an interface name", IFNAMSIZ - 1)
    if why:
        return why
    if ":" in value or any(c in _ASCII_SPACE for c in value):
        return f"an interface name {value!r} must not contain ':' or whitespace"
    return None


def _plain_word(value: str, what: str, limit: int) -> str | None:
    """A name that is one argument of a tool and one word of a control-file
    line: also no whitespace or control characters, no leading '-'."""
    why = _common(value, what, limit)
    if why:
        return why
    if value.startswith("-"):
        return f"{what} {value!r} must not start with '-' (it would read as an option)"
    if any(c in _ASCII_SPACE or not c.isprintable() for c in value):
        return f"{what} {value!r} must not contain whitespace or control characters"
    return None


def dm_name(value: str) -> str | None:
    return _plain_word(value, "a device-mapper name", DM_NAME_LEN - 1)


def rdma_device(value: str) -> str | None:
    return _plain_word(value, "an RDMA device name", IB_DEVICE_NAME_MAX - 1)


def cgroup_path(path: str) -> str | None:
    """A path below the cgroup v2 root: every part a name ('/.' would be the
    root cgroup itself, '..' a way out), within the kernel's limits."""
    if not path.startswith("/"):
        return f"cgroup '{path}' must be a path from the cgroup v2 root, starting with /"
    parts = [p for p in path.split("/") if p]
    if ".." in parts or "." in parts:
        return f"cgroup '{path}' must not contain '..' or '.': each part is a name"
    if "\0" in path:
        return f"cgroup {path!r} must not contain a NUL byte"
    if len(path.encode("utf-8", "surrogateescape")) >= PATH_MAX or any(
            len(p.encode("utf-8", "surrogateescape")) > NAME_MAX for p in parts):
        return f"cgroup '{path[:64]}...' is longer than a path or a name may be"
    if not parts:
        return "the root cgroup holds every process on the host: name a child cgroup"
    return None


def slurm_job_id(value: str) -> str | None:
    """A Slurm job id: digits only (an array task is addressed by its own id)."""
    if not isinstance(value, str) or not value.isascii() or not value.isdigit() or len(value) > 12:
        return f"job_id {value!r} is not a Slurm job id (digits only, at most 12)"
    return None
