"""libvirt/QEMU virtual machines.

libvirt registers every QEMU domain with systemd-machined as machine
``qemu-<domain id>-<name>`` (very old releases: ``qemu-<name>``), so with the
systemd cgroup driver the VM's cgroup is the escaped scope
``machine.slice/machine-qemu\\x2d<id>\\x2d<name>.scope``. Without systemd
(cgroupfs) it is ``machine/qemu-<id>-<name>.libvirt-qemu`` (older:
``machine/<name>.libvirt-qemu``). Below the VM cgroup libvirt keeps
per-thread groups (``libvirt/emulator``, ``libvirt/vcpu0``,
``libvirt/iothread1``; older: ``emulator``, ``vcpu0`` directly); they all
belong to the same VM.

libvirt may shorten or sanitise the name it hands to machined, so ``vm`` is
the name as the cgroup shows it.
"""
from __future__ import annotations

import re
from collections.abc import Sequence

from .systemd import unescape
from .workload import VM, Workload

_MACHINE_SCOPE = re.compile(r"^machine-(qemu-.+)\.scope$")
_CGROUPFS_DIR = re.compile(r"^(.+)\.libvirt-qemu$")
_QEMU_MACHINE = re.compile(r"^qemu-(?:(\d+)-)?(.+)$")


def vm_name_from_machine(machine: str) -> str:
    m = _QEMU_MACHINE.match(machine)
    return m.group(2) if m else machine


def _cgroupfs_name(dirname: str) -> str:
    # libvirt prefixes a partition name with "_" when it could be mistaken
    # for a cgroup control file ("cpu.x", "tasks", a leading "." or "_").
    dirname = dirname.removeprefix("_")
    if dirname.startswith("qemu-"):
        return vm_name_from_machine(dirname)
    return dirname


def match(components: Sequence[str]) -> Workload | None:
    for comp in components:
        if comp.startswith("machine-") and comp.endswith(".scope"):
            m = _MACHINE_SCOPE.match(unescape(comp))
            if m:
                return Workload(kind=VM, vm=vm_name_from_machine(m.group(1)))
        m = _CGROUPFS_DIR.match(comp)
        if m:
            return Workload(kind=VM, vm=_cgroupfs_name(m.group(1)))
    return None
