"""Pod uid -> namespace, name and container names, from what kubelet exposes.

A PodSource is a callable ``(pod_uid, container_id) -> PodRecord | None``;
`container_id` is "" when the question is about the pod only. It is told the
container so a source can refresh itself when the container is new to it.

Sources:

* ``LogDirPodSource`` (default): kubelet's log directories on the node.
  ``/var/log/pods/<namespace>_<pod>_<uid>/<container>/<n>.log`` names every
  pod on the node (neither a namespace nor a pod name may contain ``_``),
  and each ``/var/log/containers/<pod>_<namespace>_<container>-<id>.log``
  is a symlink into it, which ties a container id to its container name.
  Needs only read access to /var/log; it never lists sandboxes, so its
  records are not complete.
* ``KubeletPodsSource`` (off unless a URL is configured): kubelet's ``/pods``
  endpoint, the PodList of the pods bound to this node, with
  ``status.containerStatuses[].containerID`` (``containerd://<id>``). Its
  records list every container of a pod, so an id still unknown after a
  re-read is the sandbox.
"""
from __future__ import annotations

import http.client
import json
import os
import ssl
import time
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Callable, Optional

from .. import defaults

PodSource = Callable[[str, str], Optional["PodRecord"]]

_STATUS_LISTS = ("containerStatuses", "initContainerStatuses", "ephemeralContainerStatuses")


@dataclass(frozen=True)
class PodRecord:
    uid: str
    namespace: str
    name: str
    containers: Mapping[str, str] = field(default_factory=dict)   # container id -> name
    complete: bool = False   # `containers` has every container of the pod

    def container_name(self, container_id: str) -> str | None:
        name = self.containers.get(container_id)
        if name is not None:
            return name
        # kubelet cuts log symlink names at 255 bytes, which can shorten the id.
        for known, name in self.containers.items():
            if min(len(known), len(container_id)) >= 12 and (
                    container_id.startswith(known) or known.startswith(container_id)):
                return name
        return None


class _Refreshing:
    """Re-reads its source on a miss, at most once per `min_interval`."""

    def __init__(self, min_interval: float, clock: Callable[[], float]):
        self.min_interval = min_interval
        self._clock = clock
        self._read_at: float | None = None
        self.pods: dict[str, PodRecord] = {}

    def load(self) -> dict[str, PodRecord]:
        raise NotImplementedError

    def __call__(self, pod_uid: str, container_id: str = "") -> PodRecord | None:
        record = self.pods.get(pod_uid)
        known = record is not None and (not container_id or record.container_name(container_id) is not None)
        if known:
            return record
        if self._read_at is None or self._clock() - self._read_at >= self.min_interval:
            self._read_at = self._clock()
            try:
                self.pods = self.load()
            except (OSError, ValueError, http.client.HTTPException):
                return self.pods.get(pod_uid)   # what we had; read again after min_interval
            return self.pods.get(pod_uid)
        if record is not None and record.complete and container_id:
            # Read before this container may have started: its absence does
            # not make it the sandbox yet.
            return replace(record, complete=False)
        return record


class LogDirPodSource(_Refreshing):
    def __init__(self, pods_dir: str = defaults.POD_LOGS_DIR,
                 containers_dir: str = defaults.CONTAINER_LOGS_DIR,
                 min_interval: float = 10.0, clock: Callable[[], float] = time.monotonic):
        super().__init__(min_interval, clock)
        self.pods_dir = pods_dir
        self.containers_dir = containers_dir

    def load(self) -> dict[str, PodRecord]:
        names: dict[str, tuple] = {}
        by_name: dict[tuple, str] = {}
        for entry in _listdir(self.pods_dir):
            parts = entry.split("_")
            if len(parts) == 3 and all(parts):
                names[parts[2]] = (parts[0], parts[1])
                by_name[(parts[0], parts[1])] = parts[2]
        containers: dict[str, dict[str, str]] = {uid: {} for uid in names}
        for entry in _listdir(self.containers_dir):
            found = self._container_link(entry, by_name)
            if found and found[0] in containers:
                uid, cid, cname = found
                containers[uid][cid] = cname
        return {uid: PodRecord(uid, ns, pod, containers[uid]) for uid, (ns, pod) in names.items()}

    def _container_link(self, entry: str, by_name: Mapping[tuple, str]):
        """(pod uid, container id, container name) from one log symlink."""
        if not entry.endswith(".log"):
            return None
        stem = entry[:-len(".log")]
        head, sep, cid = stem.rpartition("-")
        if not sep or not cid:
            return None
        try:
            target = os.readlink(os.path.join(self.containers_dir, entry))
        except OSError:
            target = ""
        if target:
            # <pods_dir>/<namespace>_<pod>_<uid>/<container>/<n>.log
            container_dir = os.path.dirname(os.path.normpath(os.path.join(self.containers_dir, target)))
            pod_dir = os.path.basename(os.path.dirname(container_dir))
            parts = pod_dir.split("_")
            if len(parts) == 3:
                return parts[2], cid, os.path.basename(container_dir)
        # No usable link: <pod>_<namespace>_<container>, matched by pod name.
        parts = head.split("_", 2)
        if len(parts) == 3 and (parts[1], parts[0]) in by_name:
            return by_name[(parts[1], parts[0])], cid, parts[2]
        return None


def _listdir(path: str) -> list:
    try:
        return os.listdir(path)
    except OSError:
        return []


def _dict(value) -> dict:
    return value if isinstance(value, dict) else {}


def _list(value) -> list:
    return value if isinstance(value, list) else []


def _str(value) -> str:
    return value if isinstance(value, str) else ""


def parse_pod_list(doc: Mapping) -> dict[str, PodRecord]:
    """A kubelet/apiserver PodList as pod uid -> complete PodRecord. The
    answer is another process's: a field of the wrong type is skipped, and a
    document that is no PodList at all is a ValueError."""
    if not isinstance(doc, dict) or not isinstance(doc.get("items", []), (list, type(None))):
        raise ValueError("the answer is not a PodList (a JSON object with an items list)")
    pods: dict[str, PodRecord] = {}
    for item in _list(doc.get("items")):
        meta = _dict(_dict(item).get("metadata"))
        uid = _str(meta.get("uid"))
        if not uid:
            continue
        containers: dict[str, str] = {}
        status = _dict(item.get("status"))
        for key in _STATUS_LISTS:
            for cs in map(_dict, _list(status.get(key))):
                cid = _str(cs.get("containerID")).split("://", 1)[-1]
                if cid and _str(cs.get("name")):
                    containers[cid] = cs["name"]
        pods[uid] = PodRecord(uid, _str(meta.get("namespace")), _str(meta.get("name")),
                              containers, complete=True)
    return pods


# A node's PodList (110 pods, the kubelet's default limit) is a few MB; a
# misdirected --kubelet-url must not be read without end.
MAX_POD_LIST_BYTES = 64 << 20


class KubeletPodsSource(_Refreshing):
    """kubelet's ``/pods``: ``https://<node>:10250/pods`` with a service
    account token that may read ``nodes/proxy``, or the read-only port
    ``http://127.0.0.1:10255/pods`` where it is still enabled."""

    def __init__(self, url: str, token_file: str | None = None, ca_file: str | None = None,
                 insecure_skip_verify: bool = False, timeout: float = 2.0,
                 min_interval: float = 10.0, clock: Callable[[], float] = time.monotonic):
        super().__init__(min_interval, clock)
        self.url = url
        self.token_file = token_file
        self.ca_file = ca_file
        self.insecure_skip_verify = insecure_skip_verify
        self.timeout = timeout

    def load(self) -> dict[str, PodRecord]:
        request = urllib.request.Request(self.url, headers={"Accept": "application/json"})
        if self.token_file:
            # Projected service account tokens rotate: read it every time.
            with open(self.token_file) as f:
                request.add_header("Authorization", "Bearer " + f.read().strip())
        context = None
        if self.url.startswith("https:"):
            context = ssl.create_default_context(cafile=self.ca_file)
            if self.insecure_skip_verify:
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE
        with urllib.request.urlopen(request, timeout=self.timeout, context=context) as resp:
            body = resp.read(MAX_POD_LIST_BYTES + 1)
        if len(body) > MAX_POD_LIST_BYTES:
            raise ValueError(f"{self.url}: answer larger than {MAX_POD_LIST_BYTES >> 20} MiB")
        try:
            doc = json.loads(body.decode("utf-8"))
        except RecursionError:
            raise ValueError(f"{self.url}: answer nested too deeply") from None
        return parse_pod_list(doc)


def first_of(*sources: PodSource) -> PodSource:
    """The first record that knows the container (or, asked about the pod
    only, the first record); failing that, the first record found."""
    def ask(pod_uid: str, container_id: str = "") -> PodRecord | None:
        fallback = None
        for source in sources:
            record = source(pod_uid, container_id)
            if record is None:
                continue
            if not container_id or record.complete or record.container_name(container_id):
                return record
            fallback = fallback or record
        return fallback
    return ask


def pod_source(pods_dir: str = defaults.POD_LOGS_DIR, kubelet_url: str | None = None) -> PodSource:
    """The kubelet's pod log directory (and the container log links beside
    it), then kubelet's /pods when a URL is given."""
    containers_dir = os.path.join(os.path.dirname(pods_dir.rstrip("/")), "containers")
    sources: list = [LogDirPodSource(pods_dir, containers_dir)]
    if kubelet_url:
        # in a pod, the service account's token and CA authenticate us
        sa = "/var/run/secrets/kubernetes.io/serviceaccount"
        token, ca = os.path.join(sa, "token"), os.path.join(sa, "ca.crt")
        sources.append(KubeletPodsSource(kubelet_url,
                                         token if os.path.exists(token) else None,
                                         ca if os.path.exists(ca) else None))
    return first_of(*sources)
