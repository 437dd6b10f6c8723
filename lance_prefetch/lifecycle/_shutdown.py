"""The process-wide shutdown policy: which iterators are live, which read threads were left to
finish, and what happens to both at interpreter exit.

A thread that ran a Lance ``take`` must end before the interpreter finalizes: a daemon thread
frozen by finalization mid-call, or even idle after a take, makes the process abort ("terminate
called without an active exception"). So an iterator that closes hands its still-running read
threads to :func:`abandon` (a ``close()`` waits for them :data:`CLOSE_WAIT_S` at most, the other
ways not at all), and the ``atexit`` hook closes every live iterator, waits for those threads
(each until :data:`EXIT_WAIT_S` after it was left), and ends the process at once if one is still
inside Lance (:func:`~lance_prefetch.lifecycle._exit_guard.exit_if_stuck`).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import threading
import time
import weakref
from collections.abc import Iterable
from typing import Protocol

from lance_prefetch.lifecycle._exit_guard import exit_if_stuck

__all__ = [
    "CLOSE_WAIT_S",
    "EXIT_WAIT_S",
    "abandon",
    "close_all",
    "join",
    "keep_forked",
    "register",
    "unregister",
]

#: Seconds a ``close()`` takes at most, stopping the event-loop thread included, waiting for the
#: reads still running to return; those still running then are left to the exit hook.
CLOSE_WAIT_S = 0.5
#: Seconds after a read was left running that the exit hook still waits for it.
EXIT_WAIT_S = 5.0

_logger = logging.getLogger("lance_prefetch.scheduling")


class _Closeable(Protocol):
    def close(self, *, wait: bool = True) -> None: ...

    def wait_for_reads(self, deadline: float) -> bool: ...


# Invariants: an iterator is in _live from its start until its close() began; a thread is in
# _finishing (weakly: a finished thread drops out) from the moment its iterator stopped waiting
# for it, with the earliest exit deadline it was given.
_live: weakref.WeakSet[_Closeable] = weakref.WeakSet()
_forked_leftovers: list[contextlib.ExitStack] = []
_finishing: weakref.WeakKeyDictionary[threading.Thread, float] = weakref.WeakKeyDictionary()


def register(iterator: _Closeable) -> None:
    """``iterator`` is live: the exit hook closes it (``close(wait=False)``) if it still is."""
    _live.add(iterator)


def unregister(iterator: _Closeable) -> None:
    """``iterator`` is closing: the exit hook leaves it alone."""
    _live.discard(iterator)


def keep_forked(stack: contextlib.ExitStack) -> None:
    """Keep, never unwound, the portal of an iterator copied into this process by ``fork``: its
    threads stayed in the parent, and unwinding it would wait for a loop that does not exist."""
    _forked_leftovers.append(stack)


def abandon(threads: Iterable[threading.Thread], deadline: float) -> None:
    """Leave ``threads`` to finish in the background; at exit, wait for them until ``deadline``
    (a ``time.monotonic()`` time; the earliest one given for a thread counts)."""
    for thread in threads:
        _finishing[thread] = min(deadline, _finishing.get(thread, deadline))


def close_all(iterators: Iterable[_Closeable], timeout: float = CLOSE_WAIT_S) -> None:
    """Close ``iterators`` together: each one stops first (reads not started cancelled, its
    event-loop thread joined), then the reads still running are waited for until ``timeout``
    seconds after this call began, in all; the exit hook waits for what is left then."""
    deadline = time.monotonic() + timeout
    iterators = list(iterators)
    for iterator in iterators:
        iterator.close(wait=False)
    for iterator in iterators:
        iterator.wait_for_reads(deadline)


def join(threads: Iterable[threading.Thread], timeout: float) -> bool:
    """Join ``threads`` for at most ``timeout`` seconds in all; whether they all ended."""
    deadline = time.monotonic() + timeout
    threads = list(threads)
    for thread in threads:
        thread.join(max(deadline - time.monotonic(), 0.0))
    return not any(thread.is_alive() for thread in threads)


@atexit.register
def _close_live_prefetchers() -> None:
    """At exit, close every live iterator and wait for the reads still running, while their
    threads can still end normally: each until :data:`EXIT_WAIT_S` after it was left running (by
    a ``close()``, a ``break``, an error...). If one is still inside a native call
    (a Lance ``take``) after that, or still running after it made one, or a second ``Ctrl-C`` cuts
    the wait short, the process ends at once (:func:`~lance_prefetch.lifecycle._exit_guard.exit_if_stuck`):
    finalizing under it would abort. No read starts after this hook."""
    for iterator in list(_live):
        iterator.close(wait=False)
    try:
        for thread, deadline in list(_finishing.items()):
            thread.join(max(deadline - time.monotonic(), 0.0))
    except KeyboardInterrupt:
        exit_if_stuck(list(_finishing.keys()))
        raise
    # also a read whose close() was cut short, or one that runs in another thread now
    exit_if_stuck(list(_finishing.keys()))
    if any(thread.is_alive() for thread in list(_finishing.keys())):
        _logger.warning(
            "a fetch was still running %.1f s after it was left to finish; it was abandoned",
            EXIT_WAIT_S,
        )
