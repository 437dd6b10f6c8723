"""glibc's ``malloc``, told to give the large buffers Lance frees back to the operating system.

On an object store a take fetches its rows with the gaps between them (megabytes a take), in
buffers Lance allocates with the C library's ``malloc`` on many threads. glibc's defaults keep
much of that memory once it is freed: a freed large buffer raises its mmap threshold (up to 32
MiB), so later buffers come from its heaps and stay there, and each new thread may take an arena
of its own (up to 8 per core) that keeps what was freed in it. A process's memory then grows over
a long run although the loader holds at most ``max_buffer_bytes`` of takes
(docs/benchmarks.md, "Memory on an object store"). :func:`release_freed_memory` fixes the mmap
threshold and caps the arenas with ``mallopt``: what setting ``MALLOC_MMAP_THRESHOLD_=131072``
and ``MALLOC_ARENA_MAX=2`` in the environment does, from within the process.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import platform
import threading

__all__ = ["ARENA_MAX", "MMAP_THRESHOLD", "release_freed_memory"]

#: Bytes from which ``malloc`` maps a buffer of its own (returned to the system when freed).
MMAP_THRESHOLD = 128 * 1024
#: glibc arenas at most, for all the process's threads.
ARENA_MAX = 2

# mallopt's parameters (malloc.h)
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8
# what the environment may have set already: those settings are the user's
_ENVIRONMENT = {"MALLOC_MMAP_THRESHOLD_": _M_MMAP_THRESHOLD, "MALLOC_ARENA_MAX": _M_ARENA_MAX}

_logger = logging.getLogger("lance_prefetch")
_lock = threading.Lock()
_done = False


def release_freed_memory() -> bool:
    """Set glibc's mmap threshold to :data:`MMAP_THRESHOLD` and its arenas to at most
    :data:`ARENA_MAX`, once per process; a setting the environment made already
    (``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_ARENA_MAX``) is left as it is. Process-wide: every
    ``malloc`` of the process follows it from then on.

    Returns:
        bool: whether this call changed a setting (``False`` after the first call, with another C
        library than glibc, or when the environment set both).
    """
    global _done
    with _lock:
        if _done:
            return False
        _done = True
        if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
            return False
        name = ctypes.util.find_library("c") or "libc.so.6"
        try:
            mallopt = ctypes.CDLL(name, use_errno=True).mallopt
        except (OSError, AttributeError):
            return False
        mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
        mallopt.restype = ctypes.c_int
        wanted = {_M_MMAP_THRESHOLD: MMAP_THRESHOLD, _M_ARENA_MAX: ARENA_MAX}
        for variable, parameter in _ENVIRONMENT.items():
            if os.environ.get(variable):
                del wanted[parameter]
        changed = [parameter for parameter, value in wanted.items() if mallopt(parameter, value)]
        if changed:
            _logger.info(
                "glibc malloc set to return freed buffers to the system (mmap threshold %d "
                "bytes, at most %d arenas) for Lance's object-store reads; "
                "ReadOptions(release_memory=False) leaves it as it is",
                MMAP_THRESHOLD,
                ARENA_MAX,
            )
        return bool(changed)


def _forget_after_fork() -> None:
    """A forked child keeps its parent's settings: nothing to do again, and no lock held."""
    global _lock
    _lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)
