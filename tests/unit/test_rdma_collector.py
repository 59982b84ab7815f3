"""Decoding the RDMA probe's maps, the metric families built from them, the
kernel view's JSON and the per-process table."""
import struct

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tracehound.attribution.owners import Owners
from tracehound.attribution.resolver import WorkloadResolver
from tracehound.collectors.rdma import RdmaCollector
from tracehound.commands.rdma_show import ObjectRow, ProcessView, build_view, format_view, label_workloads
from tracehound.host import rdma as kernel_view
from tracehound.probes import rdma_maps as c


class FakeMap:
    def __init__(self, items=(), array=None):
        self._items = list(items)
        self._array = array or {}

    def items(self):
        return self._items

    def lookup(self, key):
        idx = struct.unpack("=I", key)[0]
        return struct.pack("=Q", self._array[idx]) if idx in self._array else None


def obj(dev, type_idx, oid, tgid, cgid, flags, comm, created=5, lkey=0):
    return (c.OBJ_KEY.pack(dev, type_idx, oid, 0),
            c.OBJ_VALUE.pack(cgid, created, tgid, flags, comm.encode(), lkey, 0))


def app_obj(tgid, type_idx, handle, context, ident, device=b"rxe0", release_err=0):
    flags = c.APP_F_RELEASE_FAILED if release_err else 0
    return (c.APP_KEY.pack(tgid, type_idx, handle),
            c.APP_VALUE.pack(context, 5, 42, 9 if release_err else 0, ident, flags, release_err, 0,
                             b"trainer", device))


def maps():
    types = {t: i for i, t in enumerate(kernel_view.TYPES)}
    return {
        "rdma_objects": FakeMap([
            obj(0, types["qp"], 17, 300, 42, c.OBJ_F_USER, "trainer"),
            obj(0, types["mr"], 0, 300, 42, c.OBJ_F_USER, "trainer", lkey=0x1234),
            obj(0, types["pd"], 0, 0, 0, c.OBJ_F_SEEDED, "ib_core", created=0),
            obj(1, types["cq"], 3, 301, 43, c.OBJ_F_USER | c.OBJ_F_SEEDED, "other"),
        ]),
        "rdma_verbs": FakeMap([
            (c.VERB_KEY.pack(c.OPS.index("reg_mr"), 0, 42), struct.pack("=Q", 4)),
            (c.VERB_KEY.pack(c.OPS.index("reg_mr"), 0, 43), struct.pack("=Q", 1)),
            (c.VERB_KEY.pack(c.OPS.index("reg_mr"), 12, 42), struct.pack("=Q", 2)),     # ENOMEM
            (c.VERB_KEY.pack(c.OPS.index("create_cq"), 11, 43), struct.pack("=Q", 1)),  # EAGAIN
            (c.VERB_KEY.pack(c.OPS.index("destroy_qp"), 16, 42), struct.pack("=Q", 1)),  # EBUSY
        ]),
        "app_objects": FakeMap([
            app_obj(300, types["ctx"], 0x1000, 0x1000, 0),
            app_obj(300, types["qp"], 0x2000, 0x1000, 17),
            app_obj(300, types["cq"], 0x3000, 0x1000, 4, release_err=16),
        ]),
        "app_verbs": FakeMap([
            (c.APP_VERB_KEY.pack(c.OPS.index("create_qp"), 0, 42, b"rxe0"), struct.pack("=Q", 3)),
            (c.APP_VERB_KEY.pack(c.OPS.index("destroy_cq"), 16, 42, b"rxe0"),
             struct.pack("=Q", 1)),
            (c.APP_VERB_KEY.pack(c.OPS.index("reg_mr"), c.APP_ERR_UNKNOWN, 42, b"rxe0"),
             struct.pack("=Q", 2)),
        ]),
        "app_closed": FakeMap([(c.APP_KEY.pack(300, types["ctx"], 0x9000), struct.pack("=Q", 1))]),
        "rdma_events": FakeMap([
            (c.EVENT_KEY.pack(0, 1, c.EVENTS.index("PORT_ERR"), 0, 0), struct.pack("=Q", 2)),
            (c.EVENT_KEY.pack(0, 1, 99, 0, 0), struct.pack("=Q", 1)),   # newer kernel's event
            # a QP event names its QP's owner
            (c.EVENT_KEY.pack(0, 1, c.EVENTS.index("QP_FATAL"), 300, 42), struct.pack("=Q", 3)),
        ]),
        "rdma_qp_states": FakeMap(array={1: 3, 2: 2, 3: 2}),
        "rdma_health": FakeMap(array={1: 4}),
        "rdma_devices": FakeMap([(struct.pack("=I", 0), b"rxe0".ljust(64, b"\0"))]),
    }


class FakeProbe:
    def __init__(self):
        self.retired = []

    def snapshot(self, objects=True):
        return c.read_snapshot(maps(), objects)

    def retire_counters(self, cgroup_ids):
        self.retired.append(cgroup_ids)

    def app_libraries(self):
        return ["/usr/lib/x86_64-linux-gnu/libibverbs.so.1.14.44.0"]

    def app_refusals(self):
        return 2


class FakeCgroups:
    gone = frozenset()

    def new_scrape(self):
        pass

    def alive(self, cgid):
        return cgid not in self.gone

    def removed(self, cgid):
        return not self.alive(cgid)

    def forget(self, cgid):
        pass

    def path(self, cgid):
        return {42: "/job/a", 43: "/job/b"}.get(cgid, f"unknown:{cgid}")

    def retain(self, in_use):
        return []


def make_owners(cgroups=None) -> Owners:
    return Owners(cgroups or FakeCgroups(),
                  WorkloadResolver(job_id_source=None, pod_source=None))


def scrape(collector) -> dict:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(collector)
    text = generate_latest(reg).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def test_snapshot_decodes_every_map():
    snap = c.read_snapshot(maps())
    assert [(o.type, o.id, o.tgid, o.comm, o.user, o.seeded) for o in snap.objects] == [
        ("qp", 17, 300, "trainer", True, False), ("mr", 0, 300, "trainer", True, False),
        ("pd", 0, 0, "ib_core", False, True), ("cq", 3, 301, "other", True, True)]
    assert snap.calls("reg_mr") == 7
    assert snap.errors() == {("reg_mr", 12, 42): 2, ("create_cq", 11, 43): 1,
                             ("destroy_qp", 16, 42): 1}
    assert snap.objects[1].lkey == 0x1234
    assert [(a.type, a.ident, a.device, a.release_failed) for a in snap.app_objects] == [
        ("ctx", 0, "rxe0", False), ("qp", 17, "rxe0", False), ("cq", 4, "rxe0", True)]
    assert snap.app_objects[2].release_err == 16 and snap.app_objects[2].context == 0x1000
    assert snap.app_verbs[("reg_mr", c.APP_ERR_UNKNOWN, 42, "rxe0")] == 2
    assert snap.app_closed == {(300, 0x9000)}
    assert snap.events == {(0, 1, "PORT_ERR"): 2, (0, 1, "99"): 1}
    assert snap.qp_events == {(0, 1, "QP_FATAL", 300, 42): 3}
    assert snap.qp_states["INIT"] == 3 and snap.qp_states["RESET"] == 0
    assert snap.health == {"objects_full": 0, "unknown_del": 4, "pending_full": 0,
                           "app_full": 0, "counters_full": 0}
    assert snap.object_counts() == {(0, "qp"): 1, (0, "mr"): 1, (0, "pd"): 1, (1, "cq"): 1}
    assert snap.device_name(0) == "rxe0" and snap.device_name(1) == "dev1"
    assert c.read_snapshot(maps(), objects=False).objects == []


def test_encode_object_round_trips():
    o = c.MirrorObject(2, "srq", 9, 77, 1234, 0, c.OBJ_F_USER | c.OBJ_F_SEEDED, "x" * 20)
    back = c.decode_object(*c.encode_object(o))
    assert back == c.MirrorObject(2, "srq", 9, 77, 1234, 0, o.flags, "x" * 15)


def test_collector_metric_families():
    m = scrape(RdmaCollector(FakeProbe(), make_owners()))
    where = ("cgroup", "device", "type")
    objs = {(k[0], tuple(kv for kv in k[1] if kv[0] in where)): v
            for k, v in m.items() if k[0] == "tracehound_rdma_objects"}
    assert objs == {
        ("tracehound_rdma_objects", (("cgroup", "/job/a"), ("device", "rxe0"), ("type", "mr"))): 1,
        ("tracehound_rdma_objects", (("cgroup", "/job/a"), ("device", "rxe0"), ("type", "qp"))): 1,
        ("tracehound_rdma_objects", (("cgroup", "kernel"), ("device", "rxe0"), ("type", "pd"))): 1,
        ("tracehound_rdma_objects", (("cgroup", "/job/b"), ("device", "dev1"), ("type", "cq"))): 1,
    }
    def owned(name, **labels):
        return {k: v for k, v in m.items() if k[0] == name
                and labels.items() <= {kv for kv in k[1] if kv[1]}}
    assert list(owned("tracehound_rdma_verb_calls_total", op="reg_mr", cgroup="/job/a").values()) \
        == [6]
    assert list(owned("tracehound_rdma_verb_calls_total", op="reg_mr", cgroup="/job/b").values()) \
        == [1]
    assert not owned("tracehound_rdma_verb_calls_total", op="create_srq")   # never called
    assert list(owned("tracehound_rdma_verb_errors_total", errno="ENOMEM", op="reg_mr",
                      cgroup="/job/a").values()) == [2]
    assert list(owned("tracehound_rdma_verb_errors_total", errno="EAGAIN", op="create_cq",
                      cgroup="/job/b").values()) == [1]
    # the application's view
    assert list(owned("tracehound_rdma_app_objects", type="qp", device="rxe0",
                      cgroup="/job/a").values()) == [1]
    assert list(owned("tracehound_rdma_app_verb_errors_total", op="reg_mr", errno="userspace",
                      device="rxe0").values()) == [2]
    assert list(owned("tracehound_rdma_app_verb_calls_total", op="destroy_cq").values()) == [1]
    assert list(owned("tracehound_rdma_app_libraries").values()) == [1]
    assert list(owned("tracehound_rdma_app_libraries_refused_total").values()) == [2]
    assert list(owned("tracehound_rdma_qp_events_total", event="QP_FATAL",
                      cgroup="/job/a").values()) == [3]
    assert list(owned("tracehound_rdma_async_events_total", event="QP_FATAL").values()) == [3]
    assert m[("tracehound_rdma_async_events_total",
              (("device", "rxe0"), ("event", "PORT_ERR"), ("port", "1")))] == 2
    assert m[("tracehound_rdma_qp_transitions_total", (("to_state", "RTS"),))] == 2
    assert m[("tracehound_rdma_mirror_drops_total", (("reason", "unknown_del"),))] == 4


def test_errno_names_fall_back_to_numbers():
    assert c.errno_name(12) == "ENOMEM" and c.errno_name(11) == "EAGAIN"
    assert c.errno_name(4000) == "4000"


SUMMARY = [{"ifindex": 0, "ifname": "rxe0", "pd": 2, "cq": 2, "qp": 2, "cm_id": 0, "mr": 1,
            "ctx": 1, "srq": 0}]
QPS = [{"ifindex": 0, "ifname": "rxe0", "port": 1, "lqpn": 17, "type": "RC", "state": "RTS",
        "pid": 319, "comm": "python3"},
       {"ifindex": 0, "ifname": "rxe0", "port": 1, "lqpn": 1, "type": "GSI", "state": "RTS",
        "comm": "ib_core"}]


def test_kernel_view_json():
    assert kernel_view.parse_summary(SUMMARY)[(0, "pd")] == 2
    assert kernel_view.parse_summary(SUMMARY)[(0, "srq")] == 0
    qps = kernel_view.parse_objects("qp", QPS)
    # the tracker keys special QPs by number | port << 24
    assert [(q.id, q.pid, q.comm) for q in qps] == [(17, 319, "python3"), (1 | 1 << 24, 0, "ib_core")]
    mrs = kernel_view.parse_objects("mr", [{"ifindex": 0, "ifname": "rxe0", "mrn": 4, "pid": 9}])
    assert mrs[0].id == 4 and mrs[0].type == "mr"


def test_process_view_joins_kernel_and_mirror():
    kernel = kernel_view.parse_objects("qp", QPS)
    mirror = [c.MirrorObject(0, "qp", 17, 319, 42, 1_000_000_000, c.OBJ_F_USER, "python3"),
              c.MirrorObject(0, "mr", 5, 319, 42, 0, c.OBJ_F_USER, "python3")]
    view = build_view(kernel, mirror, {0: "rxe0"}, pid=319, now_ns=3_000_000_000)
    rows = {(r.type, r.id): r for r in view.rows}
    assert set(rows) == {("qp", 17), ("mr", 5)}
    assert rows[("qp", 17)].in_kernel and rows[("qp", 17)].in_mirror
    assert rows[("qp", 17)].age_s == 2.0
    assert not rows[("mr", 5)].in_kernel and rows[("mr", 5)].age_s is None
    assert view.counts() == {"qp": (1, 1), "mr": (0, 1)}
    text = format_view(view)
    assert "objects (kernel/mirror): mr 0/1, qp 1/1" in text
    no_agent = build_view(kernel, None, {}, pid=319)
    assert "no agent with the rdma probe" in format_view(no_agent)
    assert " - " in format_view(no_agent).splitlines()[1]


def test_objects_carry_the_owners_workload():
    cgroups = FakeCgroups()
    cgroups.path = lambda cgid: "/system.slice/slurmstepd.scope/job_5/step_0/user/task_2"
    m = scrape(RdmaCollector(FakeProbe(), make_owners(cgroups)))
    owners = {dict(k[1])["cgroup"]: dict(k[1]) for k in m if k[0] == "tracehound_rdma_objects"}
    job = owners["/system.slice/slurmstepd.scope/job_5/step_0/user/task_2"]
    assert (job["workload"], job["job_id"], job["step"], job["task"]) == ("slurm", "5", "0", "2")
    assert owners["kernel"]["workload"] == "" and owners["kernel"]["job_id"] == ""


def test_rows_name_their_workload_and_filter_by_job(tmp_path):
    cgroups = {10: "/system.slice/slurmstepd.scope/job_77/step_1/user/task_0",
               11: "/kubepods/besteffort/pod1234/abcd", 12: "/system.slice/sshd.service"}
    for pid, path in cgroups.items():
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "cgroup").write_text(f"0::{path}\n")
    rows = [ObjectRow("rxe0", "qp", i, pid, "app", True, True) for i, pid in enumerate(cgroups)]
    rows.append(ObjectRow("rxe0", "mr", 9, 99, "gone", False, True))    # exited: no /proc entry
    resolver = WorkloadResolver(job_id_source=None, pod_source=None)
    view = label_workloads(ProcessView(list(rows), []), resolver, proc_root=str(tmp_path))
    assert [r.workload for r in view.rows] == ["job 77.1", "1234", "sshd.service", ""]
    assert "job 77.1" in format_view(view)
    only = label_workloads(ProcessView(list(rows), []), resolver, "77", proc_root=str(tmp_path))
    assert [r.pid for r in only.rows] == [10]


def test_counters_of_a_removed_cgroup_leave_on_the_schedule_and_are_exported_once_more():
    cgroups = FakeCgroups()
    cgroups.gone = {43}
    probe = FakeProbe()
    collector = RdmaCollector(probe, make_owners(cgroups))

    def job_b_errors(m):
        return [v for k, v in m.items() if k[0] == "tracehound_rdma_verb_errors_total"
                and dict(k[1]).get("cgroup") == "/job/b"]
    assert job_b_errors(scrape(collector)) == []      # removed: left for its retirement
    assert probe.retired == []                        # a scrape changes nothing
    assert collector.retire_removed() == 1
    assert probe.retired == [{43}]
    assert job_b_errors(scrape(collector))            # its last values, named, once more
    assert job_b_errors(scrape(collector)) == []


def test_process_view_adds_the_applications_view_as_a_third_column():
    kernel = kernel_view.parse_objects("qp", QPS) + [
        kernel_view.KernelObject(0, "rxe0", "mr", 5, 319, "python3", lkey=0x77),
        kernel_view.KernelObject(0, "rxe0", "cq", 2, 319, "python3")]

    def app(kind, handle, ident, release_err=0):
        return c.AppObject(319, kind, handle, 0x10, "rxe0", ident, 42, 1, "python3", release_err)
    apps = [app("qp", 0x20, 17), app("mr", 0x30, 0x77), app("cq", 0x40, 9, release_err=16),
            app("qp", 0x50, 18)]                 # a QP the kernel does not have
    view = build_view(kernel, [], {0: "rxe0"}, pid=319, app_objects=apps)
    rows = {(r.type, r.id): r for r in view.rows}
    assert rows[("qp", 17)].in_app == "yes" and rows[("mr", 5)].in_app == "yes"
    assert rows[("cq", 2)].in_app == "released"
    assert rows[("qp", 18)].in_app == "yes" and not rows[("qp", 18)].in_kernel
    assert view.counts()["qp"] == (1, 0, 2)
    text = format_view(view)
    assert "objects (kernel/mirror/app): cq 1/0/0, mr 1/0/1, qp 1/0/2" in text
    assert " released " in text
    # without an application view the column says it does not know
    assert "objects (kernel/mirror): " in format_view(build_view(kernel, [], {0: "rxe0"}, pid=319))


def test_a_missing_application_view_is_a_note_not_an_unknown_kernel(monkeypatch):
    from tracehound.commands import rdma_show
    from tracehound.errors import TracehoundError
    from tracehound.probes import rdma as probe_mod

    class Pinned:
        def __init__(self, path, app=False):
            if app:
                raise TracehoundError("no applications' table pinned")

        def items(self):
            return [obj(0, kernel_view.TYPES.index("qp"), 17, 319, 42, c.OBJ_F_USER, "python3")]

        def close(self):
            pass
    monkeypatch.setattr(kernel_view, "objects", lambda: kernel_view.parse_objects("qp", QPS))
    monkeypatch.setattr(kernel_view, "devices", lambda: {0: "rxe0"})
    monkeypatch.setattr(probe_mod, "PinnedObjects", Pinned)
    view = rdma_show.process_view(319)
    assert view.kernel_known and view.mirror_known and not view.app_known
    assert view.notes == ["app: the agent has no application view (see its log)"]
    assert [(r.type, r.id, r.in_kernel, r.in_mirror) for r in view.rows] == [("qp", 17, True, True)]
