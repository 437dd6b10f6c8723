"""The blocking wrapper: a :class:`~lance_prefetch.schedule._prefetcher.Prefetcher` run on an event loop in
a background thread of this process, drained with ``next()`` like a plain iterator."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import anyio
import anyio.from_thread

from lance_prefetch.lifecycle._interrupts import sigint_deferred
from lance_prefetch.lifecycle._shutdown import CLOSE_WAIT_S
from lance_prefetch.schedule._drained import DrainedPrefetcher
from lance_prefetch.schedule._prefetcher import Prefetcher, PrefetchStatistics

__all__ = ["BlockingPrefetcher", "THREAD_NAME"]

R = TypeVar("R")

#: Name of the event-loop thread a :class:`BlockingPrefetcher` starts (one per live iterator).
THREAD_NAME = "lance-prefetch-loop"


class BlockingPrefetcher(DrainedPrefetcher[R]):
    """A :class:`~lance_prefetch.schedule._prefetcher.Prefetcher` on a background event loop, drained
    synchronously with ``next()``.

    The event loop runs in a daemon thread named :data:`THREAD_NAME`, started by this constructor in
    the calling process (so never inherited through ``fork``) and stopped by :meth:`close`.

    Args:
        prefetcher (Prefetcher): the producer to run; not started yet, run by this iterator only.
        close_wait_s (float, optional): the most seconds :meth:`close` takes, stopping the
            event-loop thread included, waiting for fetches still running to return.
            Default: :data:`CLOSE_WAIT_S` (0.5 s).
        on_close (Callable[[], None], optional): run first by every :meth:`close` (see
            :class:`~lance_prefetch.schedule._drained.DrainedPrefetcher`). Default: ``None``.

    Errors:
        ``next()`` raises what :meth:`Prefetcher.get` raises for a failed item (a
        :class:`FetchError`, or ``process``'s own error) and closes the iterator. ``KeyboardInterrupt``
        (or any exception) raised while ``next()`` waits closes the iterator too.

    Cancellation handling:
        :meth:`close` (also run when the iterator is exhausted, fails, is garbage collected, or the
        interpreter exits) cancels the producer and every fetch not yet started and joins the
        event-loop thread. A fetch already running cannot be interrupted (a Lance ``take``); its
        result is dropped unprocessed (no ``process``, so no ``transform``, starts after the
        close). An explicit ``close()`` then waits for such fetches until ``close_wait_s`` after
        it began; the other ways do not wait, so an error or ``Ctrl-C`` reaches the caller at
        once. Either way what still runs is left to finish in the background, and waited for at
        interpreter exit until :data:`~lance_prefetch.lifecycle._shutdown.EXIT_WAIT_S` after it was left (a thread frozen inside a
        Lance call by finalization aborts the process; one still inside then ends the process
        at once instead, see :mod:`~lance_prefetch.lifecycle._shutdown`). Idempotent.
    """

    def __init__(
        self,
        prefetcher: Prefetcher[Any, R],
        *,
        close_wait_s: float = CLOSE_WAIT_S,
        on_close: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(close_wait_s=close_wait_s, on_close=on_close)
        self._prefetcher = prefetcher
        # A Ctrl-C while the portal starts would leave its loop thread running unowned: deliver it
        # once this iterator is whole and registered (then garbage collection closes it).
        with sigint_deferred(), contextlib.ExitStack() as stack:
            portal = stack.enter_context(
                anyio.from_thread.start_blocking_portal("asyncio", name=THREAD_NAME)
            )
            producer = portal.start_task_soon(self._prefetcher.run)
            stack.callback(producer.cancel)  # runs before the portal stops
            self._started(stack.pop_all())

    def _get(self, release: bool) -> R:
        return self._prefetcher.get(release=release)

    def release(self, units: int) -> None:
        """See :meth:`Prefetcher.release`."""
        self._prefetcher.release(units)

    def resize(self, readahead: int, max_in_flight: int) -> None:
        """See :meth:`Prefetcher.resize`."""
        self._prefetcher.resize(readahead, max_in_flight)

    def statistics(self) -> PrefetchStatistics:
        """A :class:`PrefetchStatistics` snapshot."""
        return self._prefetcher.statistics()

    def _stop_fetching(self) -> None:
        self._prefetcher.stop_fetching()

    def _threads(self) -> list[threading.Thread]:
        return self._prefetcher.threads()
