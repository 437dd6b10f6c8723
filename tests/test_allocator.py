"""glibc's allocator told to return freed buffers (``ReadOptions(release_memory=...)``): what it
changes in a process, and when the loader asks for it."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import textwrap

import pytest

from lance_prefetch import ReadOptions
from lance_prefetch.loader._config import LoaderConfig

# In a fresh process: (optionally) release_freed_memory() twice, then free 32 of 64 interleaved
# 1 MiB buffers after an 8 MiB one (which raises glibc's dynamic mmap threshold above 1 MiB):
# the MiB given back to the system. From glibc's heap nothing can be (the holes are between
# buffers still held); buffers mapped on their own go back at once.
PROBE = textwrap.dedent(
    """
    import ctypes, os, sys
    if sys.argv[1] == "release":
        from lance_prefetch.sources._allocator import release_freed_memory
        print(release_freed_memory(), release_freed_memory())
    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, (ctypes.c_size_t,)
    libc.free.argtypes = (ctypes.c_void_p,)
    libc.memset.argtypes = (ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t)
    def rss():
        return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    big = libc.malloc(8 << 20)
    libc.memset(big, 1, 8 << 20)
    libc.free(big)
    blocks = [libc.malloc(1 << 20) for _ in range(64)]
    for block in blocks:
        libc.memset(block, 1, 1 << 20)
    before = rss()
    for block in blocks[::2]:
        libc.free(block)
    print(round((before - rss()) / (1 << 20)))
    """
)


def probe(mode: str, **env: str) -> list[str]:
    assert platform.system() == "Linux" and platform.libc_ver()[0] == "glibc", (
        "these tests measure glibc's malloc (Linux with glibc)"
    )
    environment = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    out = subprocess.run(
        [sys.executable, "-c", PROBE, mode],
        env={**environment, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return out.stdout.split()


def test_freed_buffers_go_back_to_the_system_once_released():
    assert probe("keep") == ["0"]  # glibc's defaults keep all 32 MiB
    assert probe("release") == ["True", "False", "32"]  # set once, then every buffer returned


def test_a_threshold_set_in_the_environment_is_kept():
    # the environment's threshold (64 MiB) stays: the arenas are capped, the buffers kept
    assert probe("release", MALLOC_MMAP_THRESHOLD_=str(64 << 20)) == ["True", "False", "0"]
    both = {"MALLOC_MMAP_THRESHOLD_": str(64 << 20), "MALLOC_ARENA_MAX": "4"}
    assert probe("release", **both) == ["False", "False", "0"]


@pytest.mark.parametrize(
    "uri,release,expected",
    [
        ("s3://bucket/a.lance", True, True),
        ("/a.lance + gs://b/c.lance", True, True),
        ("s3://bucket/a.lance", False, False),
        ("/data/a.lance", True, False),
        ("file+uring:///data/a.lance", True, False),
    ],
)
def test_the_loader_releases_memory_on_object_stores_unless_told_not_to(uri, release, expected):
    config = LoaderConfig(batch_size=4, read=ReadOptions(release_memory=release))
    assert config.resolve(row_bytes=8, num_rows=100, uri=uri).release_memory is expected
