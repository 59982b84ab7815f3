from tracehound.host.mounts import parse_mountinfo

SAMPLE = """\
22 27 0:21 / /proc rw,nosuid - proc proc rw
27 1 254:0 / / rw,relatime - ext4 /dev/vda rw
60 27 0:50 / /mnt/with\\040space rw shared:5 - tmpfs thfs rw,size=1024k
61 27 254:0 /data /srv/bind rw - ext4 /dev/vda rw
"""


def test_parse_fields_and_escapes():
    ms = parse_mountinfo(SAMPLE)
    assert [m.mnt_id for m in ms] == [22, 27, 60, 61]
    assert ms[2].mountpoint == "/mnt/with space"
    assert ms[2].fstype == "tmpfs" and ms[2].source == "thfs"
    # optional fields (shared:5) before the separator do not shift fstype
    assert ms[1].dev == (254 << 20) | 0


def test_bind_mount_shares_device_first_wins(tmp_path):
    p = tmp_path / "mountinfo"
    p.write_text(SAMPLE)
    from tracehound.host.mounts import MountTable
    t = MountTable(str(p))
    assert t.by_dev[(254 << 20)].mountpoint == "/"
    assert t.by_id[61].mountpoint == "/srv/bind"
    assert not t.refresh()          # unchanged file: no re-parse
    p.write_text(SAMPLE + "62 27 0:51 / /x rw - xfs /dev/sdb rw\n")
    assert t.refresh() and t.by_id[62].fstype == "xfs"


def test_mount_points_with_line_and_space_like_characters_stay_whole():
    # the kernel escapes only space, tab, newline and backslash
    text = ("40 1 0:50 / /mnt/a\rb rw - tmpfs t rw\n"
            "41 1 0:51 / /mnt/c\u2028d\x0be\\040f rw - tmpfs t rw\n")
    assert [m.mountpoint for m in parse_mountinfo(text)] == ["/mnt/a\rb", "/mnt/c\u2028d\x0be f"]
