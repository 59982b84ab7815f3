"""Loader for rdma.bpf.o: picks a hook mode per group, loads, attaches, seeds
the mirror with objects that existed before it, and pins the mirror so
`tracehound rdma show` can read it from another process. The pins live under
the agent's instance (PIN_ROOT/<instance>/), so agents of other instances
on the host never touch them, and go when the agent stops.

A host without RDMA, or a kernel that refuses every RDMA hook, leaves the
probe unavailable with a reason; it never stops the agent.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from ..host.procs import proc_cgroups
from ..bpf import features, libbpf
from ..bpf.lifecycle import OptionalProbe, open_loaded
from ..bpf.loader import BpfObject, Map
from .. import defaults, instance
from ..errors import ProbeError, TracehoundError
from ..host import rdma as rdma_host
from . import object_path
from . import rdma_app
from .cgroup_key import set_cgroup_key
# PinnedObjects too: `rdma show` reaches the pinned tables through this module
from .rdma_pins import PIN_FILES, PinnedObjects, make_pin_dir, pin_path, remove_pin_dir  # noqa: F401
from .rdma_maps import (
    APP_VERB_KEY,
    MAPS,
    OBJ_F_SEEDED,
    OBJ_F_USER,
    MirrorObject,
    VERB_KEY,
    RdmaSnapshot,
    decode_object,
    encode_object,
    read_snapshot,
)

log = logging.getLogger(__name__)

MODES = ("fentry", "kprobe")
BPF_NOEXIST = 1

# Kernel function -> (its programs in fentry mode, in kprobe mode). Exit-only
# hooks need no entry program unless the exit needs an argument.
HOOKS = {
    "rdma_restrack_add": ("fx", "kp kr"),
    "rdma_restrack_del": ("fe", "kp"),
    "rdma_restrack_commit_del": ("fe", "kp"),
    "ib_uverbs_cmd_verbs": ("fx", "kp kr"),
    "ib_uverbs_write": ("fx", "kp kr"),
    "ib_dealloc_pd_user": ("fx", "kr"),
    "ib_destroy_cq_user": ("fx", "kr"),
    "ib_destroy_qp_user": ("fx", "kr"),
    "ib_destroy_srq_user": ("fx", "kr"),
    "ib_dereg_mr_user": ("fx", "kr"),
    "ib_modify_qp_with_udata": ("fx", "kp kr"),
    "ib_umem_get": ("fx", "kr"),
    "ib_uverbs_qp_event_handler": ("fe", "kp"),
    "ib_dispatch_event": ("fe", "kp"),
}


def _group(name: str, *functions: str) -> features.HookGroup:
    def hooks(mode: str) -> features.HookMode:
        side = 0 if mode == "fentry" else 1
        programs = tuple(f"{p}_{fn}" for fn in functions for p in HOOKS[fn][side].split())
        return features.HookMode(programs, features.function_checks(mode, functions),
                                 ", ".join(functions))
    return features.HookGroup(name, tuple((mode, hooks(mode)) for mode in MODES))


# uprobe entry and return programs of every libibverbs verb (rdma_app.bpf.h)
APP_PROGRAMS = frozenset(f"{side}_{verb}" for verb in rdma_app.VERBS for side in ("up", "ur"))

# Hooked where the kernel has them, never required: stable kernels that
# split deletion into begin/commit/abort no longer call rdma_restrack_del for
# PD, CQ, QP and SRQ.
OPTIONAL = ("rdma_restrack_commit_del",)


def rdma_groups(present=None) -> tuple[features.HookGroup, ...]:
    """The hook groups for this kernel. ib_core alone serves the tracker
    mirror and device events; everything user verbs do needs ib_uverbs too,
    so a kernel-only RDMA user (NFS over RDMA, iSER) still gets the first two."""
    present = kernel_functions(OPTIONAL) if present is None else present
    optional = tuple(fn for fn in OPTIONAL if fn in present)
    return (
        _group("restrack", "rdma_restrack_add", "rdma_restrack_del", *optional),
        _group("events", "ib_dispatch_event"),
        _group("verbs", "ib_uverbs_cmd_verbs", "ib_uverbs_write", "ib_dealloc_pd_user",
               "ib_destroy_cq_user", "ib_destroy_qp_user", "ib_destroy_srq_user",
               "ib_dereg_mr_user", "ib_modify_qp_with_udata", "ib_umem_get",
               "ib_uverbs_qp_event_handler"),
    )


def kernel_functions(names) -> set[str]:
    """Which of these functions the running kernel (modules included) has."""
    return {name for name in names if features.kernel_has_function(name)}


def subsystem_absent() -> str | None:
    """Why this kernel has no RDMA core to hook, or None."""
    if os.path.isdir("/sys/module/ib_core") or os.path.isdir("/sys/class/infiniband"):
        return None
    return "no RDMA subsystem: ib_core is neither loaded nor built in (modprobe ib_core)"


@dataclass
class RdmaProbeConfig:
    hook_mode: str = defaults.HOOK_MODE
    cgroup_root: str | None = None   # to attribute seeded objects: the counted hierarchy's
    cgroup_key: str = "v2"           # the hierarchy counted by (cgroup_key.py)
    max_objects: int = defaults.RDMA_MAX_OBJECTS
    app_view: bool = True            # uprobes on libibverbs (the application's view)
    instance: str = defaults.INSTANCE  # whose pin directory


class RdmaProbe(OptionalProbe):
    """The RDMA probe; start() never raises for a missing or refusing kernel:
    `available` is then False and `reason` says why."""

    name = "rdma"

    def __init__(self, config: RdmaProbeConfig | None = None):
        self.config = config or RdmaProbeConfig()
        self.obj: BpfObject | None = None
        self.plans: list[features.GroupPlan] = []
        self._maps: dict[str, Map] | None = None
        self._pinned = False
        self.app = rdma_app.Attachments()      # the application's view: libibverbs files
        self.app_reason: str | None = None     # why there is no application view

    # -- lifecycle --------------------------------------------------------
    def _start(self) -> None:
        absent = subsystem_absent()
        if absent:
            raise TracehoundError(absent)
        forced = self.config.hook_mode
        if forced not in ("auto", *MODES):
            raise TracehoundError(f"hook mode {forced} has no RDMA hooks (use auto, fentry or kprobe)")
        self.plans = features.load_with_fallback("rdma", rdma_groups(), forced,
                                                 self._load_and_attach, every_group=False)
        self._seed()
        self._pin()
        if self.config.app_view and not self.app_reason:
            self._attach_app_view()

    def _load_and_attach(self, plans: list[features.GroupPlan]) -> None:
        try:
            self._load_and_attach_once(plans, self.config.app_view and not self.app_reason)
        except ProbeError as exc:
            if not exc.program.startswith(("up_", "ur_")):
                raise
            # a kernel without uprobes keeps the kernel's view
            self.app_reason = f"the kernel refuses uprobe programs: {exc.reason}"
            log.warning("rdma probe: no application view: %s", self.app_reason)
            self._load_and_attach_once(plans, False)

    def _load_and_attach_once(self, plans: list[features.GroupPlan], app: bool) -> None:
        self.close()

        def prepare(obj: BpfObject) -> None:
            obj.map("rdma_objects").set_max_entries(self.config.max_objects)
            obj.map("app_objects").set_max_entries(self.config.max_objects)
            set_cgroup_key(obj, self.config.cgroup_key)
        programs = features.wanted_programs(plans) | (APP_PROGRAMS if app else set())
        self.obj, self._maps = open_loaded(object_path("rdma"), programs=programs,
                                           prepare=prepare, maps=MAPS)

    def close(self) -> None:
        if self._pinned:
            for name in PIN_FILES:
                try:
                    os.unlink(pin_path(name, self.config.instance))
                except OSError:
                    pass
            remove_pin_dir(instance.pin_dir(self.config.instance))
            self._pinned = False
        self._maps = None
        self.app = rdma_app.Attachments()
        if self.obj is not None:
            self.obj.close()
            self.obj = None

    # -- mirror seeding and pinning --------------------------------------
    def _seed(self) -> None:
        """Objects created before the probe attached are only known to the
        kernel's tracker: copy them in, never over what the probe recorded.
        One destroyed between the listing and the copy was missed by the
        probe's delete hook, so a second listing drops seeded leftovers."""
        try:
            existing = rdma_host.objects()
            names = rdma_host.devices()
        except rdma_host.RdmaToolError as exc:
            log.warning("rdma probe: objects that predate the agent are not mirrored: %s", exc)
            return
        devs = self._maps["rdma_devices"]
        for index, name in names.items():
            devs.update(index.to_bytes(4, "little"), name.encode()[:63].ljust(64, b"\0"), BPF_NOEXIST)
        objects = self._maps["rdma_objects"]
        cgroup_of: dict[int, int] = {}   # a process holds many objects
        for k in existing:
            flags = OBJ_F_SEEDED | (OBJ_F_USER if k.pid else 0)
            if k.pid not in cgroup_of:
                cgroup_of[k.pid] = self._cgroup_of(k.pid)
            mirror = MirrorObject(k.device, k.type, k.id, k.pid, cgroup_of[k.pid], 0, flags, k.comm,
                                  k.lkey)
            key, value = encode_object(mirror)
            try:
                objects.update(key, value, BPF_NOEXIST)
            except TracehoundError:
                pass  # the probe saw it first, or the map is full (counted there)
        try:
            still = {(k.device, k.type, k.id) for k in rdma_host.objects()}
        except rdma_host.RdmaToolError:
            return
        for key, value in objects.items():
            o = decode_object(key, value)
            if o.seeded and (o.device, o.type, o.id) not in still:
                objects.delete(key)

    def _cgroup_of(self, pid: int) -> int:
        if not pid or not self.config.cgroup_root:
            return 0
        key = self.config.cgroup_key
        rel = proc_cgroups(pid).get("" if key == "v2" else key)
        if rel is None:
            return 0
        rel = rel if rel != "/" else ""
        try:
            return os.stat(self.config.cgroup_root.rstrip("/") + rel).st_ino
        except OSError:
            return 0

    def _pin(self) -> None:
        """The mirror and the applications' view, for `tracehound rdma show`.
        Pins are not how maps outlive the agent (every start loads fresh
        maps and seeds the mirror from the kernel): ones left by an agent of
        this instance that died are stale, and replaced. The instance lock
        makes sure no live agent owns them."""
        pins = {name: pin_path(name, self.config.instance) for name in PIN_FILES}
        stale = list(pins.values())
        if self.config.instance == defaults.INSTANCE:
            # where agents pinned before there were instances
            stale += [os.path.join(defaults.PIN_ROOT, f) for f in PIN_FILES.values()]
        try:
            make_pin_dir(instance.pin_dir(self.config.instance))
            self._pinned = True      # close() now removes the directory, checked as ours
            for path in stale:
                if os.path.lexists(path):
                    os.unlink(path)
        except OSError as exc:      # no bpffs there, or read-only
            log.info("rdma probe: mirror not pinned (%s): `tracehound rdma show` sees the kernel only", exc)
            return
        except TracehoundError as exc:   # a directory someone else made
            log.warning("rdma probe: mirror not pinned: %s; `tracehound rdma show` sees the "
                        "kernel only", exc)
            return
        for name, path in pins.items():
            ret = libbpf.lib().bpf_obj_pin(self._maps[name].fd, path.encode())
            if ret < 0:
                log.info("rdma probe: cannot pin %s at %s: %s", name, path,
                         libbpf.strerror(libbpf.errno_of(ret)))

    # -- the application's view -------------------------------------------
    def _attach_app_view(self) -> None:
        """The system's libibverbs and every copy a running process maps, on
        the start path: bounded by the scan's budget (rdma_app.SCAN_BUDGET_S);
        copies left over are looked at when their processes show up in the
        kernel's view (detect/rdma.py)."""
        self.attach_libraries(rdma_app.candidates())
        if not self.app.libraries:
            self.app_reason = self.app.why_none()
            log.info("rdma probe: no application view: %s", self.app_reason)

    def attach_libraries(self, found) -> list[str]:
        """Attach the application probe to libibverbs files (rdma_app.Candidate)
        not attached yet; refusals are kept in self.app, never raised."""
        if self.obj is None:
            return []
        added = self.app.attach(self.obj, found)
        if added:
            self.app_reason = None
        return added

    def app_unsettled(self) -> set:
        """Candidates of the last attach_libraries left for a later look."""
        return self.app.unsettled

    def app_libraries(self) -> list[str]:
        return sorted(lib.path for lib in self.app.libraries.values())

    def app_refusals(self) -> int:
        """libibverbs files refused since the probe started (reasons logged)."""
        return self.app.refusals

    @property
    def app_since_ns(self) -> int:
        """CLOCK_MONOTONIC of the application probe's first attach (0: never)."""
        return self.app.since_ns

    def retire_counters(self, cgroup_ids: set[int]) -> None:
        """Delete the verb counters of cgroups that are gone (exported one
        last time by the caller): short jobs must not fill the maps."""
        for name, layout in (("rdma_verbs", VERB_KEY), ("app_verbs", APP_VERB_KEY)):
            counters = self._maps[name]
            for key, _ in counters.items():
                if layout.unpack(key[:layout.size])[2] in cgroup_ids:
                    counters.delete(key)

    def forget_app_objects(self, keys) -> None:
        """Drop records of processes that are gone, or of closed contexts."""
        objects = self._maps["app_objects"]
        for key in keys:
            objects.delete(key)

    # -- reading ------------------------------------------------------------
    def snapshot(self, objects: bool = True) -> RdmaSnapshot:
        return read_snapshot(self._maps, objects)

    def modes(self) -> dict[str, str]:
        """probe name ('rdma.restrack', ...) -> hook mode in use."""
        if not self.available:
            return {}
        modes = {f"rdma.{p.group.name}": p.mode for p in self.plans if p.mode}
        if self.app.libraries:
            modes["rdma.app"] = "uprobe"
        return modes

    def missing(self) -> dict[str, str]:
        """Groups left without a hook while the others run, and why."""
        if not self.available:
            return {}
        missing = {f"rdma.{p.group.name}": p.why_not() for p in self.plans if not p.mode}
        if self.config.app_view and not self.app.libraries:
            missing["rdma.app"] = self.app_reason or "not attached"
        return missing


def doctor_line(hook_mode: str = "auto") -> str:
    """One line for `tracehound doctor`: the mode each RDMA group would use."""
    absent = subsystem_absent()
    if absent:
        return f"rdma         -> not available ({absent})"
    if hook_mode not in ("auto", *MODES):
        return f"rdma         -> not available (hook mode {hook_mode} has no RDMA hooks)"
    if not os.path.exists(object_path("rdma")):
        return f"rdma         -> not available ({object_path('rdma')} is missing: rebuild the probes)"
    plans = features.plan(rdma_groups(), hook_mode)
    chosen = ", ".join(f"{p.group.name} {p.mode or 'NONE'}" for p in plans)
    why = "; ".join(f"{p.group.name}: {p.why_not()}" for p in plans if not p.mode)
    return f"rdma         -> {chosen}" + (f" ({why})" if why else "")
