"""Where the RDMA probe pins its tables, per instance, and how another
process (`tracehound rdma show`) reads them back.

bpffs is often mounted world-writable (mode 1777): the pin root and an
instance's directory are used only as root's own directories, never through
a symbolic link, and are removed with rmdir only, never recursively.
"""
from __future__ import annotations

import os

from .. import defaults, instance
from ..bpf import libbpf
from ..bpf.loader import Map
from ..errors import TracehoundError
from .rdma_maps import APP_KEY, APP_VALUE, OBJ_KEY, OBJ_VALUE

# map -> the file it is pinned as, in the instance's pin directory
PIN_FILES = {"rdma_objects": "rdma_objects", "app_objects": "rdma_app_objects"}


def pin_path(map_name: str, name: str = defaults.INSTANCE) -> str:
    """Where instance `name` pins `map_name` (rdma_objects or app_objects)."""
    return os.path.join(instance.pin_dir(name), PIN_FILES[map_name])


def make_pin_dir(path: str) -> None:
    """Make the pin root and the instance's directory in it, each checked
    to be root's own directory: bpffs is often mounted world-writable
    (mode 1777), and a directory or symbolic link a user made there first
    would let the user swap the pins, or point the agent's unlink and rmdir
    elsewhere."""
    # another instance stopping removes the pin root once empty, possibly
    # between making it and making our directory in it: make both again
    for attempt in range(3):
        try:
            for d in (os.path.dirname(path), path):
                try:
                    os.mkdir(d, 0o755)
                except FileExistsError:
                    pass
                os.close(instance.open_owned_dir(d, os.geteuid()))
            return
        except FileNotFoundError:
            if attempt == 2:
                raise


def remove_pin_dir(path: str) -> None:
    """rmdir the instance's (emptied) pin directory, then the pin root if no
    other instance has one there: never a recursive delete."""
    for d in (path, os.path.dirname(path)):
        try:
            os.rmdir(d)
        except OSError:
            return


class PinnedObjects:
    """A table pinned by a running agent (the mirror, or with `app` the
    applications' view), read from another process."""

    def __init__(self, path: str | None = None, app: bool = False):
        path = path or pin_path("app_objects" if app else "rdma_objects")
        fd = libbpf.lib().bpf_obj_get(path.encode())
        if fd < 0:
            raise TracehoundError(f"no RDMA table pinned at {path} ({libbpf.strerror(libbpf.errno_of(fd))}):"
                                  " is the agent running with the rdma probe?")
        self.fd = fd
        self.sizes = (APP_KEY.size, APP_VALUE.size) if app else (OBJ_KEY.size, OBJ_VALUE.size)

    def items(self) -> list[tuple[bytes, bytes]]:
        return Map.from_fd("rdma_objects", self.fd, *self.sizes).items()

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
