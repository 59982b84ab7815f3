"""Room for jobs in what the I/O collector keeps: the series cap admits a
job's label set in the place of one of no workload, and a nearly full kernel
table is emptied of entries of no job, a user's own mounts first. The
collector over fake maps (test_collector.py's), the probe's own decoding
included."""
from tests.unit.test_collector import collector, scrape, value, written
from tracehound.probes.io import IoProbeConfig
from tracehound.probes.io_maps import KEY


def test_a_job_met_after_the_cap_filled_is_admitted_and_an_unattributed_set_folds(tmp_path):
    """Label sets a user made first fill the cap; a Slurm job's that comes
    later is admitted in the place of the oldest of them, which goes on in
    overflow: no counter goes backwards, the job is never overflow."""
    job = "/system.slice/slurmstepd.scope/job_42/step_0/user/task_1"
    items = [(KEY.pack(cg, 40, 0), value(write_bytes=cg)) for cg in (20, 21)]
    c = collector(items, tmp_path, max_series=2)
    c.cgroups.paths.update({20: "/a", 21: "/b", 30: job, 31: job.replace("42", "43")})
    fams = scrape(c)
    assert written(fams, "/a") == [20] and written(fams, "/b") == [21]
    assert written(fams, "__overflow__") == []
    c.probe.maps["io_stats"]._items += [(KEY.pack(30, 40, 0), value(write_bytes=4096))]
    fams = scrape(c)
    assert written(fams, job) == [4096]
    assert written(fams, "/a") == [] and written(fams, "/b") == [21]
    assert written(fams, "__overflow__") == [20]
    # every admitted set a job's but one: the next job takes the last place...
    c.probe.maps["io_stats"]._items += [(KEY.pack(31, 40, 0), value(write_bytes=1))]
    fams = scrape(c)
    assert written(fams, job.replace("42", "43")) == [1] and written(fams, job) == [4096]
    assert written(fams, "__overflow__") == [41]
    # ...and one more job passes the cap rather than fold
    c.cgroups.paths[32] = job.replace("42", "44")
    c.probe.maps["io_stats"]._items += [(KEY.pack(32, 40, 0), value(write_bytes=2))]
    assert written(scrape(c), job.replace("42", "44")) == [2]


def test_a_nearly_full_table_makes_room_evicting_no_jobs_entries_and_a_users_mounts_first(
        tmp_path):
    """8 slots, 8 entries: over 7/8, so 2 go (down to 3/4): a user's entries
    on mounts of another namespace first, never the job's; what went is
    exported once more, and counted."""
    job = "/system.slice/slurmstepd.scope/job_42/step_0/user/task_1"
    items = [(KEY.pack(30, 40, 0), value(write_bytes=100)), (KEY.pack(30, 27, 0), value()),
             (KEY.pack(20, 27, 0), value(write_bytes=1)),            # the user's, on /
             (KEY.pack(40, 40, 0), value(write_bytes=2))]            # a unit's
    items += [(KEY.pack(20, 900 + i, 0), value(write_bytes=10)) for i in range(4)]
    c = collector(items, tmp_path)
    c.probe.config = IoProbeConfig(max_entries=8)
    c.cgroups.paths.update({20: "/user.slice/user-1000.slice/session-1.scope", 30: job,
                            40: "/system.slice/cron.service"})
    assert c.make_room() == 2
    assert sorted((k.cgroup_id, k.mnt) for k in c.probe.keys()) == \
        [(20, 27), (20, 902), (20, 903), (30, 27), (30, 40), (40, 40)]
    fams = scrape(c)
    over = [s for s in fams["tracehound_io_write_bytes"].samples
            if s.labels["mountpoint"] in ("mnt:900", "mnt:901")]
    assert [s.value for s in over] == [10, 10]                 # exported once more
    assert fams["tracehound_map_evictions"].samples[0].value == 2
    assert c.make_room() == 0                                  # 6 of 8: room enough
