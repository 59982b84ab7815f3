"""The BPF objects a process holds, read from its fdinfo."""
import os

from tracehound.bpf.held import held_ids


def test_programs_links_and_maps_by_their_holder(tmp_path):
    fdinfo = tmp_path / "42" / "fdinfo"
    fdinfo.mkdir(parents=True)
    (fdinfo / "3").write_text("pos:\t0\nflags:\t02000002\nmap_type:\t1\nmap_id:\t17\n")
    (fdinfo / "4").write_text("prog_type:\t26\nprog_tag:\tab\nprog_id:\t90\n")
    (fdinfo / "5").write_text("link_type:\ttracing\nlink_id:\t7\nprog_tag:\tab\nprog_id:\t91\n")
    (fdinfo / "6").write_text("pos:\t0\nflags:\t0100000\nmnt_id:\t25\nino:\t4\n")   # a file
    assert held_ids(42, str(tmp_path)) == {"prog": {90, 91}, "map": {17}}


def test_this_process_holds_nothing_before_it_loads_bpf():
    assert held_ids(os.getpid()) == {"prog": set(), "map": set()}
