"""Names that become paths or tool arguments are names: a network namespace
(`/run/netns/<name>`), an interface, a device-mapper device, an RDMA device,
each part of a cgroup path. A path in their place is refused by validate,
with the field named, and never reaches a dry run's plan."""
import pytest

from tests.unit.test_chaos_validate import fault, method
from tracehound import cli
from tracehound.chaos.faults import FaultError
from tracehound.chaos.faults.targets import netns_prefix

LONG = "x" * 16
CASES = [
    # (fault, arguments, field, message fragment)
    ("net.loss", "{interface: eth0, netns: ../../proc/self/ns/net, percent: 5}", "netns",
     "is a name, not a path"),
    ("net.loss", "{interface: eth0, netns: '..', percent: 5}", "netns", "must not be '..'"),
    ("net.loss", "{interface: eth0, netns: '.', percent: 5}", "netns", "must not be '.'"),
    ("net.loss", "{interface: eth0, netns: '', percent: 5}", "netns", "must not be empty"),
    ("net.loss", "{interface: eth0, netns: " + "n" * 256 + ", percent: 5}", "netns",
     "more than the 255"),
    ("net.delay", "{interface: ../eth0, netns: n, delay_ms: 5}", "interface",
     "is a name, not a path"),
    ("net.corrupt", "{interface: " + LONG + ", netns: n, percent: 5}", "interface",
     "is 16 bytes, more than the 15"),
    ("net.loss", "{interface: 'eth 0', netns: n, percent: 5}", "interface",
     "must not contain ':' or whitespace"),
    ("rdma.link_down", "{interface: '..', netns: n}", "interface", "must not be '..'"),
    ("rdma.link_down", "{interface: veth0, netns: a/b}", "netns", "is a name, not a path"),
    ("io.errors", "{dm_name: ../../dev/sda}", "dm_name", "is a name, not a path"),
    ("io.errors", "{dm_name: --help}", "dm_name", "must not start with '-'"),
    ("rdma.cgroup", "{cgroup: /j, device: 'rxe0 hca_handle=max'}", "device",
     "must not contain whitespace"),
    ("proc.kill", "{cgroup: /.}", "cgroup", "must not contain '..' or '.'"),
    ("proc.stress", "{cgroup: /a/./b}", "cgroup", "must not contain '..' or '.'"),
    ("io.throttle", "{cgroup: /x/.., device: /dev/vda, wbps: 1}", "cgroup",
     "must not contain '..' or '.'"),
    ("net.loss", "{interface: eth0, netns: n, percent: 5, cgroup: /.}", "cgroup",
     "must not contain '..' or '.'"),
    ("rdma.cgroup", "{cgroup: /./, device: rxe0}", "cgroup", "must not contain '..' or '.'"),
]


@pytest.mark.parametrize("name,args,field,fragment", CASES,
                         ids=[f"{c[0]}-{c[2]}-{i}" for i, c in enumerate(CASES)])
def test_a_path_in_place_of_a_name_is_refused(name, args, field, fragment, tmp_path, capsys,
                                              no_faults_touched):
    path = tmp_path / "e.yaml"
    path.write_text(method(fault(name, args)))
    assert cli.main(["chaos", "validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"method[0].provider.arguments.{field}: " in err and fragment in err, err
    assert cli.main(["chaos", "run", str(path), "--dry-run"]) == 2
    out, err = capsys.readouterr()
    assert "would affect" not in out and "nothing was run" in err
    assert no_faults_touched == []


def test_a_journal_cannot_smuggle_a_path_into_nsenter():
    """Rollback reads its namespace from the journal: checked there too."""
    assert netns_prefix("lab") == ["nsenter", "--net=/run/netns/lab", "--"]
    with pytest.raises(FaultError, match="is a name, not a path"):
        netns_prefix("../../proc/1/ns/net")
