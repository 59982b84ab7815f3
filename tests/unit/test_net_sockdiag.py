"""sock_diag: requests, parsing of what the kernel answers (and of what it
never should), per-cgroup sums, the socket cap and the scan cache."""
import socket
import struct

import pytest

from tracehound.host import sockdiag
from tracehound.host.sockdiag import (DIAG_MSG, INET_DIAG_CGROUP_ID, INET_DIAG_INFO, NLMSG,
                                      NLMSG_DONE, NLMSG_ERROR, SOCK_DIAG_BY_FAMILY, CgroupTcp,
                                      Scan, SockDiag, TcpSocket, parse, parse_socket, request)

TCP_INFO_SIZE = 232      # struct tcp_info of a 6.x kernel


def tcp_info(rtt=0, total_retrans=0, acked=0, received=0, backoff=0, size=TCP_INFO_SIZE):
    raw = bytearray(TCP_INFO_SIZE)
    raw[0] = 1                                   # tcpi_state: ESTABLISHED
    raw[4] = backoff
    struct.pack_into("=I", raw, 68, rtt)
    struct.pack_into("=I", raw, 100, total_retrans)
    struct.pack_into("=QQ", raw, 120, acked, received)
    return bytes(raw[:size])


def rta(kind, value):
    raw = struct.pack("=HH", 4 + len(value), kind) + value
    return raw + bytes(-len(raw) % 4)


def diag_msg(cgroup_id=None, info=None, extra=b""):
    body = DIAG_MSG.pack(socket.AF_INET, 1, 0, 0, bytes(48), 0, 0, 0, 0, 12345)
    if info is not None:
        body += rta(INET_DIAG_INFO, info)
    if cgroup_id is not None:
        body += rta(INET_DIAG_CGROUP_ID, struct.pack("=Q", cgroup_id))
    return body + extra


def nlmsg(kind, payload, length=None):
    raw = NLMSG.pack(NLMSG.size + len(payload) if length is None else length, kind, 2, 1, 0)
    raw += payload
    return raw + bytes(-len(raw) % 4)


def sock_msg(cgroup_id, **info):
    return nlmsg(SOCK_DIAG_BY_FAMILY, diag_msg(cgroup_id, tcp_info(**info)))


DONE = nlmsg(NLMSG_DONE, struct.pack("=i", 0))


# --- requests and well-formed answers ----------------------------------------------

def test_request_asks_for_established_tcp_with_tcp_info():
    raw = request(socket.AF_INET6, 7)
    length, kind, flags, seq, _ = NLMSG.unpack_from(raw)
    assert (length, kind, seq) == (len(raw), SOCK_DIAG_BY_FAMILY, 7) and len(raw) == 16 + 56
    assert flags & sockdiag.NLM_F_DUMP == sockdiag.NLM_F_DUMP
    family, proto, ext, _, states = struct.unpack_from("=BBBBI", raw, 16)
    assert (family, proto, states) == (socket.AF_INET6, socket.IPPROTO_TCP, 1 << 1)
    assert ext == 1 << (INET_DIAG_INFO - 1)


def test_a_datagram_of_sockets_and_the_end_of_the_dump():
    batch = parse(sock_msg(42, rtt=1500, acked=10, received=20, total_retrans=3, backoff=2)
                  + sock_msg(43) + DONE)
    assert batch.done and batch.error == 0
    assert batch.sockets == [TcpSocket(42, 1500, 10, 20, 3, 2), TcpSocket(43, 0, 0, 0, 0, 0)]


def test_a_dump_goes_on_until_done():
    batch = parse(sock_msg(1, rtt=5))
    assert not batch.done and len(batch.sockets) == 1


def test_an_error_answer_ends_the_dump_with_its_errno():
    batch = parse(nlmsg(NLMSG_ERROR, struct.pack("=i", -2) + bytes(16)))
    assert batch.done and batch.error == -2
    # error 0 is an acknowledgement, not an end
    assert parse(nlmsg(NLMSG_ERROR, struct.pack("=i", 0) + bytes(16)) + DONE).done


def test_an_older_kernels_shorter_tcp_info_reads_missing_fields_as_zero():
    # before bytes_acked (4.1): the struct ended at tcpi_total_retrans
    s = parse_socket(diag_msg(9, tcp_info(rtt=700, total_retrans=4, acked=99, size=104)))
    assert s == TcpSocket(9, 700, 0, 0, 4, 0)


def test_a_socket_without_attributes_belongs_to_cgroup_zero():
    assert parse_socket(diag_msg()) == TcpSocket(0, 0, 0, 0, 0, 0)


def test_unknown_attributes_and_nested_flags_are_skipped():
    extra = rta(99, b"whatever") + rta(INET_DIAG_CGROUP_ID | 0x8000, struct.pack("=Q", 77))
    s = parse_socket(diag_msg(None, tcp_info(rtt=3), extra))
    assert s.cgroup_id == 77 and s.rtt_us == 3


# --- hostile input: skipped, never raised on ----------------------------------------

@pytest.mark.parametrize("raw", [
    b"", b"\x01", bytes(15),
    NLMSG.pack(4, SOCK_DIAG_BY_FAMILY, 0, 0, 0),          # length below the header
    NLMSG.pack(0, SOCK_DIAG_BY_FAMILY, 0, 0, 0) * 3,      # zero length: no endless loop
    NLMSG.pack(4096, SOCK_DIAG_BY_FAMILY, 0, 0, 0) + bytes(64),   # longer than the datagram
    nlmsg(SOCK_DIAG_BY_FAMILY, bytes(10)),                # shorter than inet_diag_msg
    nlmsg(NLMSG_ERROR, b"\x01"),                          # error without its errno
    nlmsg(0x1234, bytes(100)),                            # a type nobody asked for
])
def test_garbage_yields_no_socket_and_no_exception(raw):
    batch = parse(raw)
    assert batch.sockets == []


def test_a_bad_message_after_good_ones_keeps_the_good_ones():
    good = sock_msg(5, rtt=10)
    bad = NLMSG.pack(3, SOCK_DIAG_BY_FAMILY, 0, 0, 0)
    assert [s.cgroup_id for s in parse(good + bad + sock_msg(6)).sockets] == [5]


@pytest.mark.parametrize("attrs", [
    struct.pack("=HH", 2, INET_DIAG_INFO),                # attribute length below its header
    struct.pack("=HH", 500, INET_DIAG_INFO) + bytes(8),   # attribute longer than the message
    struct.pack("=HH", 6, INET_DIAG_CGROUP_ID) + b"\1\2", # cgroup id of 2 bytes
    struct.pack("=HH", 5, INET_DIAG_INFO) + b"\7",        # tcp_info of one byte
    b"\xff\xff",                                          # a stray half header
])
def test_odd_attributes_are_left_out(attrs):
    s = parse_socket(diag_msg(extra=attrs))
    assert s is not None and s.rtt_us == 0 and s.cgroup_id == 0


def test_random_bytes_never_raise():
    import random
    rnd = random.Random(1234)
    for _ in range(2000):
        n = rnd.randrange(0, 400)
        raw = bytes(rnd.randrange(256) for _ in range(n))
        if rnd.random() < 0.5 and n >= 16:   # a plausible header over random content
            raw = NLMSG.pack(n, SOCK_DIAG_BY_FAMILY, 2, 1, 0) + raw[16:]
        parse(raw)


# --- aggregation, progress, the cap ---------------------------------------------------

def test_sums_per_cgroup_with_mean_and_max_rtt_over_sockets_that_have_one():
    scan = Scan()
    for s in (TcpSocket(1, 1000, 100, 5, 1, 0), TcpSocket(1, 3000, 50, 0, 0, 1),
              TcpSocket(1, 0, 0, 7, 0, 0), TcpSocket(2, 200, 0, 0, 0, 0)):
        scan.add(s)
    one = scan.cgroups[1]
    assert (one.sockets, one.rtt_sockets, one.rtt_max_us, one.rtt_mean_us) == (3, 2, 3000, 2000)
    assert (one.bytes_acked, one.bytes_received, one.total_retrans, one.backing_off) == \
        (150, 12, 1, 1)
    assert scan.sockets == 4
    assert sockdiag.progress(scan) == {1: 162, 2: 0}
    assert CgroupTcp().rtt_mean_us == 0.0


class FakeNetlink:
    """Answers each dump request with canned datagrams."""

    def __init__(self, per_family):
        self.per_family = per_family
        self.pending = []
        self.requests = []

    def sendto(self, raw, addr):
        family = raw[16]
        self.requests.append(family)
        self.pending = list(self.per_family[family])

    def recv_into(self, buf):
        raw = self.pending.pop(0)
        buf[:len(raw)] = raw
        return len(raw)


def test_dump_reads_both_families_until_done():
    fake = FakeNetlink({socket.AF_INET: [sock_msg(1) + sock_msg(1), sock_msg(2) + DONE],
                        socket.AF_INET6: [sock_msg(3) + DONE]})
    scan = Scan()
    sockdiag.dump(fake, scan, 100)
    assert fake.requests == [socket.AF_INET, socket.AF_INET6]
    assert {k: c.sockets for k, c in scan.cgroups.items()} == {1: 2, 2: 1, 3: 1}
    assert not scan.truncated


def test_dump_stops_at_the_cap_and_says_so():
    fake = FakeNetlink({socket.AF_INET: [sock_msg(1) * 5 + DONE],
                        socket.AF_INET6: [sock_msg(3) + DONE]})
    scan = Scan()
    sockdiag.dump(fake, scan, 3)
    assert scan.sockets == 3 and scan.truncated
    assert fake.requests == [socket.AF_INET]


def test_dump_raises_the_kernels_error_as_oserror():
    fake = FakeNetlink({socket.AF_INET: [nlmsg(NLMSG_ERROR, struct.pack("=i", -22))]})
    with pytest.raises(OSError):
        sockdiag.dump(fake, Scan(), 10)


def test_scans_close_together_are_shared_and_truncations_counted():
    calls = []

    def scanner(cap, all_netns):
        calls.append((cap, all_netns))
        return Scan(truncated=True)
    diag = SockDiag(50, all_netns=False, reuse_s=60, scanner=scanner)
    first = diag.scan()
    assert diag.scan() is first and calls == [(50, False)]
    assert diag.truncated_scans == 1
    diag.reuse_s = 0
    diag.scan()
    assert len(calls) == 2 and diag.truncated_scans == 2


def test_namespaces_lists_other_namespaces_once(tmp_path):
    proc = tmp_path / "proc"
    for pid, target in (("self", "own"), ("1", "own"), ("20", "other"), ("21", "other"),
                        ("30", "third")):
        (proc / pid / "ns").mkdir(parents=True)
        (tmp_path / target).touch()
        (proc / pid / "ns" / "net").symlink_to(tmp_path / target)
    (proc / "40").mkdir()                # a process that is gone: no ns/net
    found = sockdiag.namespaces(str(proc))
    assert sorted(p.split("/")[-3] for p in found) in (["20", "30"], ["21", "30"])
