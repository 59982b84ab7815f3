"""host.memory: freed heap goes back to the kernel when asked."""
import platform

import pytest

from tracehound.host.memory import release_free_memory


def rss_kib() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")
def test_freed_heap_is_returned():
    # below glibc's mmap threshold: these come from the heap, not from mmap
    keep = [bytes(20_000) for _ in range(3000)]
    # every other block freed: holes in the middle of the heap, not only at its top
    keep = keep[1::2]
    before = rss_kib()
    assert release_free_memory()
    after = rss_kib()
    assert before - after > 20_000, (before, after)   # most of the ~30 MB freed
    assert len(keep) == 1500
