"""Kubernetes pods and containers from kubelet's cgroup layout.

kubelet puts pods under a QoS level: Guaranteed pods directly under the
kubepods root, Burstable and BestEffort pods one level lower. With the
systemd cgroup driver every level is a slice and a pod uid's dashes become
underscores (``-`` separates slice levels)::

    kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<u_i_d>.slice/<container>.scope
    kubepods.slice/kubepods-pod<u_i_d>.slice/<container>.scope             (Guaranteed)

where the container scope is ``cri-containerd-<id>.scope`` (containerd),
``crio-<id>.scope`` (CRI-O; its monitor is ``crio-conmon-<id>.scope``) or
``docker-<id>.scope`` (cri-dockerd). Some installs prefix the slices
(``kubelet-kubepods-...slice``). With the cgroupfs driver::

    kubepods/burstable/pod<u-i-d>/<id>       kubepods/pod<u-i-d>/<id>      (Guaranteed)

CRI-O with cgroupfs names the container directory ``crio-<id>``.

Every pod also has a sandbox ("pause") container, which kubelet never lists
among the pod's containers. A container id that a complete pod record (the
kubelet API) does not know is reported as container ``POD``, the name
kubelet and cAdvisor have always used for it; with a source that does not
list every container (the log directories), a container whose processes are
all ``pause`` is taken for the sandbox. Without a name for the pod, the
pod label is its uid and the namespace is empty; without a name for the
container, the container label is its short (12 character) id.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .kubelet import PodSource
from .workload import KUBERNETES, Workload

SANDBOX_CONTAINER = "POD"

_SYSTEMD_ROOT = re.compile(r"^(?:[A-Za-z0-9]+-)*kubepods(?:-(?:besteffort|burstable))?\.slice$")
_SYSTEMD_POD = re.compile(r"^(?:[A-Za-z0-9]+-)*kubepods(?:-(besteffort|burstable))?-pod([0-9A-Za-z_]+)\.slice$")
_SYSTEMD_CONTAINER = re.compile(r"^(crio-conmon|cri-containerd|crio|docker|containerd)-([0-9a-f]{12,64})\.scope$")
_CGROUPFS_QOS = ("burstable", "besteffort")
_CGROUPFS_POD = re.compile(r"^pod([0-9A-Za-z-]+)$")
_CGROUPFS_CONTAINER = re.compile(r"^(?:(crio-conmon|crio|cri-containerd|docker)-)?([0-9a-f]{12,64})$")


@dataclass(frozen=True)
class KubePath:
    qos: str = ""            # guaranteed | burstable | besteffort, "" above pod level
    pod_uid: str = ""
    container_id: str = ""
    monitor: bool = False    # CRI-O's conmon, which watches the container from outside


def _container(comp: str, pattern: re.Pattern) -> tuple[str, bool]:
    m = pattern.match(comp)
    if not m:
        return "", False
    return m.group(2), m.group(1) == "crio-conmon"


def _parse_systemd(components: Sequence[str]) -> KubePath | None:
    for i, comp in enumerate(components):
        m = _SYSTEMD_POD.match(comp)
        if m:
            cid, monitor = _container(components[i + 1], _SYSTEMD_CONTAINER) if i + 1 < len(components) else ("", False)
            return KubePath(qos=m.group(1) or "guaranteed", pod_uid=m.group(2).replace("_", "-"),
                            container_id=cid, monitor=monitor)
    if any(_SYSTEMD_ROOT.match(comp) for comp in components):
        return KubePath()
    return None


def _parse_cgroupfs(components: Sequence[str]) -> KubePath | None:
    if "kubepods" not in components:
        return None
    rest = components[components.index("kubepods") + 1:]
    qos = "guaranteed"
    if rest and rest[0] in _CGROUPFS_QOS:
        qos, rest = rest[0], rest[1:]
    m = _CGROUPFS_POD.match(rest[0]) if rest else None
    if not m:
        return KubePath()
    cid, monitor = _container(rest[1], _CGROUPFS_CONTAINER) if len(rest) > 1 else ("", False)
    return KubePath(qos=qos, pod_uid=m.group(1), container_id=cid, monitor=monitor)


def parse(components: Sequence[str]) -> KubePath | None:
    return _parse_systemd(components) or _parse_cgroupfs(components)


def resolve(path: KubePath, pods: PodSource | None,
            runs_pause: Callable[[], bool] | None = None) -> tuple[Workload, bool]:
    """The workload, and whether it is final (every name was found, so the
    answer will not improve by asking again later).

    `runs_pause` tells whether the container's processes are all the pause
    binary; it is asked only when the pod source cannot rule on the sandbox.
    """
    if not path.pod_uid:
        return Workload(kind=KUBERNETES), True
    # conmon belongs to the pod, not to the container's own workload.
    container_id = "" if path.monitor else path.container_id
    try:
        record = pods(path.pod_uid, container_id) if pods else None
    except Exception:  # noqa: BLE001 - a broken source must not take the scrape down
        record = None
    container, final = "", True
    if container_id:
        name = record.container_name(container_id) if record else None
        if name:
            container = name
        elif (record is not None and record.complete) or (runs_pause is not None and runs_pause()):
            container = SANDBOX_CONTAINER
        else:
            container, final = container_id[:12], False
    if record is None:
        return Workload(kind=KUBERNETES, pod=path.pod_uid, container=container), False
    return Workload(kind=KUBERNETES, namespace=record.namespace, pod=record.name,
                    container=container), final
