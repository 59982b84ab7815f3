"""What every probe does to come up and go down, once.

`open_loaded` is the one sequence from a .bpf.o to attached programs: open
it, load only the programs wanted, let the probe size its maps and set its
read-only settings, load, hand the probe its maps before anything runs, then
attach. Whatever fails on the way (libbpf, the kernel, the probe's own
callbacks, an interrupt) closes the object before the error goes on, so no
half-loaded object holds kernel memory or links.

`OptionalProbe` is the shape of a probe the agent runs without when the
kernel or the host says no (exits, TCP, RDMA, cgroup names): `start()` never
raises for that refusal; `reason` says why, `available` whether it runs. The
I/O probe is not optional: its start raises.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable

from ..errors import TracehoundError
from .loader import BpfObject, Map


def open_loaded(path: str, *, programs: Iterable[str] | None = None,
                prepare: Callable[[BpfObject], None] | None = None,
                maps: Iterable[str] = (),
                ready: Callable[[BpfObject, dict[str, Map]], None] | None = None
                ) -> tuple[BpfObject, dict[str, Map]]:
    """The object at PATH, loaded and attached, with the MAPS named.

    programs: the programs to load (None: all of them); the rest stay out
    of the kernel. prepare(obj): before load (map sizes, .rodata values).
    ready(obj, maps): after load, before the first program is attached (fill
    configuration maps the programs read from their first event)."""
    obj = BpfObject(path)
    try:
        if programs is not None:
            wanted = set(programs)
            for name, prog in obj.programs.items():
                prog.autoload = name in wanted
        if prepare is not None:
            prepare(obj)
        obj.load()
        # held for the probe's life: a Map remembers whether batch lookups work
        held = {name: obj.map(name) for name in maps}
        if ready is not None:
            ready(obj, held)
        obj.attach_all()
    except BaseException:
        obj.close()
        raise
    return obj, held


class OptionalProbe:
    """start() runs _start(); a TracehoundError or OSError from it closes the
    probe and is kept, first line only, as `reason`. Subclasses set `obj`
    when loaded and define _start() and close()."""

    obj: BpfObject | None = None
    reason: str | None = None

    @property
    def available(self) -> bool:
        return self.obj is not None

    def _start(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def start(self):
        self.reason = None
        try:
            self._start()
        except (TracehoundError, OSError) as exc:
            self.close()
            self.reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return self

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()
