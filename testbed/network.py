"""The cluster's network: one bridge on the host, one network namespace per
daemon (the controller and each node), each with a veth into the bridge.

Traffic stays inside: the host holds the bridge's first address, so the
cluster's /24 routes locally, and a blackhole route over the whole test range
(TEST_RANGE) means an address of it with no bridge behind it goes nowhere,
never out through the default route. The namespaces have no default route.

Every resource is written to the journal (a callback) before it is made, so a
teardown after a crash half-way still finds it.
"""
from __future__ import annotations

import ipaddress
import subprocess

TEST_RANGE = "10.213.0.0/16"


def ip(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *argv], check=check, capture_output=True, text=True,
                          timeout=30)


def used_subnets() -> set[str]:
    """/24s of the test range that some route on this host already names."""
    out = ip("-4", "route", "show", "table", "all").stdout
    used = set()
    rng = ipaddress.ip_network(TEST_RANGE)
    for line in out.splitlines():
        word = line.split()[0] if line.split() else ""
        if word in ("blackhole", "local", "broadcast") and len(line.split()) > 1:
            word = line.split()[1]
        try:
            net = ipaddress.ip_network(word, strict=False)
        except ValueError:
            continue
        if net.prefixlen >= 24 and net.subnet_of(rng):
            used.add(str(net.supernet(new_prefix=24)))
    return used


def pick_subnet(token: str) -> str:
    """A free 10.213.B.0/24, B from the token, moving on where one is in use."""
    used = used_subnets()
    start = int(token[:2], 16)
    for i in range(256):
        subnet = f"10.213.{(start + i) % 254 + 1}.0/24"
        if subnet not in used:
            return subnet
    raise RuntimeError(f"no free /24 left in {TEST_RANGE}")


def blackhole_present() -> bool:
    return f"blackhole {TEST_RANGE}" in ip("route", "show", "type", "blackhole").stdout


def add_blackhole(journal) -> None:
    if blackhole_present():
        return
    journal("routes", TEST_RANGE)
    ip("route", "add", "blackhole", TEST_RANGE)


def remove_blackhole_if_unused() -> None:
    """Only once no cluster of the range has its bridge left: another
    cluster's subnet keeps its safety net."""
    if not blackhole_present():
        return
    rng = ipaddress.ip_network(TEST_RANGE)
    for line in ip("-4", "route", "show").stdout.splitlines():
        if line.startswith("blackhole") or not line.split():
            continue
        try:
            if ipaddress.ip_network(line.split()[0], strict=False).subnet_of(rng):
                return
        except ValueError:
            continue
    ip("route", "del", "blackhole", TEST_RANGE, check=False)


def make_bridge(journal, bridge: str, host_addr: str) -> None:
    journal("links", bridge)
    ip("link", "add", bridge, "type", "bridge")
    ip("addr", "add", host_addr, "dev", bridge)
    ip("link", "set", bridge, "up")


def make_namespace(journal, netns: str, bridge: str, veth: str, addr: str) -> None:
    """A namespace with lo and eth0 = addr, its veth peer in the bridge."""
    journal("netns", netns)
    ip("netns", "add", netns)
    journal("links", veth)
    ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", netns)
    ip("link", "set", veth, "master", bridge)
    ip("link", "set", veth, "up")
    ip("-n", netns, "addr", "add", addr, "dev", "eth0")
    ip("-n", netns, "link", "set", "eth0", "up")
    ip("-n", netns, "link", "set", "lo", "up")


def remove(netns: list[str], links: list[str]) -> None:
    # deleting a namespace deletes its end of the veth pair, and so both ends
    for name in netns:
        ip("netns", "del", name, check=False)
    for name in links:
        ip("link", "del", name, check=False)
