"""Which part of a cgroup path root made: the only part that may name a
job, pod or VM.

Anyone with a delegated subtree (systemd's user@UID.service, a rootless
container) can name directories below it like a Slurm job's or a pod's. The
directories of a path are looked at in its hierarchy: every one above the
first that root does not own is root's, so that one was made by root too
(and handed on: a delegated subtree, or Slurm's step directory owned by the
job's user); what lies below it its owner made. A job, pod or VM named
below it is not taken: the path says only what its root-made part says.
The agent's resolver and chaos's `job_id:` targets read paths through this.
"""
from __future__ import annotations

import os
from collections.abc import Sequence

from . import kubernetes, libvirt, slurm
from .workload import KUBERNETES, SLURM


def made_by_root(hierarchy_root: str, components: Sequence[str]) -> int:
    """How many leading components of the path root made. A directory
    already removed is passed over: the ones left above decide (a user
    cannot remove the subtree delegated to them)."""
    directory = hierarchy_root.rstrip("/")
    for i, comp in enumerate(components):
        directory += "/" + comp
        try:
            owner = os.lstat(directory).st_uid
        except OSError:
            continue
        if owner != 0:
            return i + 1
    return len(components)


def identity(components: Sequence[str]) -> tuple | None:
    """Which job, pod or VM the path names (None: none), from the names alone."""
    job = slurm.parse(list(components))
    if job is not None:
        return SLURM, job.job_dir
    kube = kubernetes.parse(list(components))
    if kube is not None:
        return KUBERNETES, kube.pod_uid
    vm = libvirt.match(list(components))
    return None if vm is None else (vm.kind, vm.vm)


def root_made_part(hierarchy_root: str, components: Sequence[str]) -> list[str]:
    """The components as far as they may name a workload: the whole path,
    unless a job, pod or VM is named by someone other than root; then the
    root-made part alone."""
    made = made_by_root(hierarchy_root, components)
    if made < len(components) and identity(components) != identity(components[:made]):
        return list(components[:made])
    return list(components)
