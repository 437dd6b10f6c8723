"""The hand-over of one fetch's result from the worker thread that read it to the consumer
(:class:`Slot`, queued in plan order before the fetch starts), and the deadline of a timed fetch
(:class:`Timer`). Thread primitives only."""

from __future__ import annotations

import asyncio
import contextlib
import math
import threading
from typing import Any

import anyio

__all__ = ["END", "Slot", "Timer"]


class Slot:
    """The result of one fetch, queued for the consumer in plan order before the fetch starts.

    The first of :meth:`finish` calls wins: a fetch abandoned by cancellation may still finish in
    its thread later, and its result is then dropped.

    Built on two C-level locks only (no ``threading.Event``): a ``KeyboardInterrupt`` raised by a
    signal handler while the consumer waits can interrupt Python-level code at any bytecode, and
    inside ``threading.Condition`` it could leave a lock held that :meth:`finish`, in a worker
    thread, then waits for forever. Here :meth:`finish` never waits for a lock a waiter holds.
    """

    __slots__ = ("_claimed", "_guard", "_wakeup", "error", "is_set", "units", "value")

    def __init__(self) -> None:
        self._guard = threading.Lock()  # orders finish() calls
        self._wakeup = threading.Lock()  # held until the result is set
        self._wakeup.acquire()
        self.is_set = self._claimed = False
        self.units = 1  # readahead units the item holds
        self.value: Any = None
        self.error: BaseException | None = None

    def finish(self, value: Any = None, error: BaseException | None = None) -> bool:
        """Set the result unless one is set already; whether this call set it."""
        with self._guard:
            if self.is_set:
                return False
            self.value, self.error = value, error
            self.is_set = True
        self._wakeup.release()
        return True

    def claim(self) -> bool:
        """Whether the caller, holding a fetched result, is the first to (it then finishes the
        slot): of two fetches of one item (a hedge, or an attempt abandoned by its timeout),
        only the first to return processes its result."""
        with self._guard:
            if self.is_set or self._claimed:
                return False
            self._claimed = True
            return True

    def wait(self) -> None:
        """Block until the result is set (interruptible by ``Ctrl-C``)."""
        if not self.is_set:
            self._wakeup.acquire()
            self._wakeup.release()  # for the next waiter (the consumer and the loop may both wait)


#: Queued after the last slot; queued again by every ``get()`` that sees it.
END = object()


class Timer:
    """The deadline of one timed fetch; the worker thread stops it once the read returned, so
    that ``process`` (conversion, ``transform``) is never timed."""

    __slots__ = ("_loop", "_scope", "fetched")

    def __init__(self, scope: anyio.CancelScope, loop: asyncio.AbstractEventLoop) -> None:
        self._scope, self._loop = scope, loop
        self.fetched = False

    def stop(self) -> None:
        """Called from the worker thread."""
        self.fetched = True
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
            self._loop.call_soon_threadsafe(self._disarm)

    def _disarm(self) -> None:
        self._scope.deadline = math.inf
