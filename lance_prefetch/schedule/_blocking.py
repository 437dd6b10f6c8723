"""The blocking wrapper: a :class:`~lance_prefetch.schedule._prefetcher.Prefetcher` run on an event loop in
a background thread of this process, drained with ``next()`` like a plain iterator."""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any, TypeVar

import anyio
import anyio.from_thread

from lance_prefetch.lifecycle import _shutdown
from lance_prefetch.lifecycle._interrupts import (
    call_holding_sigint,
    recover_interrupts_in,
    sigint_deferred,
)
from lance_prefetch.lifecycle._shutdown import CLOSE_WAIT_S, EXIT_WAIT_S
from lance_prefetch.schedule._prefetcher import Prefetcher, PrefetcherClosed, PrefetchStatistics

__all__ = ["BlockingPrefetcher", "THREAD_NAME"]

R = TypeVar("R")

#: Name of the event-loop thread a :class:`BlockingPrefetcher` starts (one per live iterator).
THREAD_NAME = "lance-prefetch-loop"

_logger = logging.getLogger("lance_prefetch.scheduling")


class BlockingPrefetcher(Iterator[R]):
    """A :class:`~lance_prefetch.schedule._prefetcher.Prefetcher` on a background event loop, drained
    synchronously with ``next()``.

    The event loop runs in a daemon thread named :data:`THREAD_NAME`, started by this constructor in
    the calling process (so never inherited through ``fork``) and stopped by :meth:`close`.

    Args:
        prefetcher (Prefetcher): the producer to run; not started yet, run by this iterator only.
            A :class:`~lance_prefetch.schedule._direct.DirectPrefetcher` (``synchronous``) starts no
            event loop: ``next()`` reads in the caller's thread.
        close_wait_s (float, optional): the most seconds :meth:`close` takes, stopping the
            event-loop thread included, waiting for fetches still running to return.
            Default: :data:`CLOSE_WAIT_S` (0.5 s).

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
        interpreter exit until :data:`EXIT_WAIT_S` after it was left (a thread frozen inside a
        Lance call by finalization aborts the process; one still inside then ends the process
        at once instead, see :mod:`~lance_prefetch.lifecycle._shutdown`). Idempotent.
    """

    def __init__(
        self, prefetcher: Prefetcher[Any, R], *, close_wait_s: float = CLOSE_WAIT_S
    ) -> None:
        self._prefetcher = prefetcher
        self._close_wait_s = close_wait_s
        self._pid = os.getpid()
        #: Whether the prefetcher's plan ran out (every item was handed out), not closed early.
        self.exhausted = False
        self._lock = threading.Lock()
        self._stack: contextlib.ExitStack | None = None
        if getattr(prefetcher, "synchronous", False):  # a DirectPrefetcher: reads in next()
            self._stack = contextlib.ExitStack()
            _shutdown.register(self)
            return
        # A Ctrl-C while the portal starts would leave its loop thread running unowned: deliver it
        # once this iterator is whole and registered (then garbage collection closes it).
        with sigint_deferred(), contextlib.ExitStack() as stack:
            portal = stack.enter_context(
                anyio.from_thread.start_blocking_portal("asyncio", name=THREAD_NAME)
            )
            producer = portal.start_task_soon(self._prefetcher.run)
            stack.callback(producer.cancel)  # runs before the portal stops
            self._stack = stack.pop_all()
            _shutdown.register(self)

    def __iter__(self) -> BlockingPrefetcher[R]:
        return self

    def __next__(self) -> R:
        return self._next()

    def _next(self, *, release: bool = True) -> R:
        """``next()``; with ``release=False`` the item's first token is given back by the caller
        (:meth:`release`), see :meth:`Prefetcher.get`."""
        if self._stack is None:
            raise StopIteration
        if os.getpid() != self._pid:
            raise RuntimeError(
                f"this iterator was started in process {self._pid} and copied into process "
                f"{os.getpid()} by fork; its threads stayed behind. Start a new iterator here"
            )
        try:
            return self._prefetcher.get(release=release)
        except StopIteration:
            self.exhausted = True
            self.close(wait=False)
            raise
        except PrefetcherClosed:  # closed from another thread while we waited
            raise StopIteration from None
        except BaseException:  # the error (or Ctrl-C) reaches the caller without waiting
            self.close(wait=False)
            raise

    def release(self, units: int) -> None:
        """See :meth:`Prefetcher.release`."""
        self._prefetcher.release(units)

    def resize(self, readahead: int, max_in_flight: int) -> None:
        """See :meth:`Prefetcher.resize`."""
        self._prefetcher.resize(readahead, max_in_flight)

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` has run (the event-loop thread is gone)."""
        return self._stack is None

    def statistics(self) -> PrefetchStatistics:
        """A :class:`PrefetchStatistics` snapshot."""
        return self._prefetcher.statistics()

    def close(self, *, wait: bool = True) -> None:
        """Cancel pending fetches and stop the event-loop thread; then wait a little for running
        fetches.

        Args:
            wait (bool, optional): ``True``: wait for the fetches still running in worker threads
                to return and their threads to exit, until ``close_wait_s`` after this call began
                (0.5 s by default), stopping the loop included. ``False``: do not wait. Either way
                the fetches still running are left to finish in the background (their results
                dropped) and waited for at interpreter exit, until :data:`EXIT_WAIT_S` after they
                were left. Default: ``True``. Exhaustion, an error, ``KeyboardInterrupt`` and
                garbage collection close with ``wait=False``.

        Safe to call more than once (a later ``close()`` waits again for what an earlier one left
        running), and from another thread than the consumer's.
        """
        deadline = time.monotonic() + self._close_wait_s
        self._stop()
        if wait:
            self.wait_for_reads(deadline)

    def _stop(self) -> None:
        """Stop the producer and the event-loop thread; hand the fetches still running to the
        exit hook."""
        left = time.monotonic()
        with self._lock:
            stack, self._stack = self._stack, None
        if os.getpid() != self._pid:
            if stack is not None:
                # A forked copy: its threads stayed in the parent. Unwinding the portal's context
                # manager here would wait for a loop that does not exist, so keep it, never
                # unwound.
                _shutdown.unregister(self)
                _shutdown.keep_forked(stack)
            return
        if stack is not None:
            _shutdown.unregister(self)
            self._prefetcher.stop_fetching()  # no thread starts a fetch from now on
            # The worker threads exit once their call returns; one that ran a Lance take must end
            # normally, not be frozen by interpreter shutdown, or the process aborts at exit. Hand
            # them to the exit hook first, so that an interrupted stop below loses none.
            _shutdown.abandon(self._running_threads(), left + EXIT_WAIT_S)
            with sigint_deferred():  # a Ctrl-C here is raised once the loop thread is joined
                stack.close()  # cancels the producer, joins the event-loop thread
        _shutdown.abandon(self._running_threads(), left + EXIT_WAIT_S)

    def wait_for_reads(self, deadline: float) -> bool:
        """After :meth:`close`: wait until ``deadline`` (a ``time.monotonic()`` time) for the
        fetches still running to return and their threads to exit; whether none runs any more.
        Those still running are logged (at ``DEBUG``: a slow store at every ``break`` is no
        fault) and stay the exit hook's."""
        if os.getpid() != self._pid:
            return True  # a forked copy: the threads are the parent's
        running = self._running_threads()
        if _shutdown.join(running, deadline - time.monotonic()):
            return True
        _logger.debug(
            "%d fetch(es) still running at close(); left to finish in the background (their "
            "results are dropped; waited for at exit)",
            sum(thread.is_alive() for thread in running),
        )
        return False

    def _running_threads(self) -> list[threading.Thread]:
        return [
            thread
            for thread in self._prefetcher.threads()
            if thread is not threading.current_thread() and thread.is_alive()
        ]

    def __del__(self) -> None:
        # Garbage collection runs this wherever the main thread happens to be; a Ctrl-C raised in
        # here would be printed as "Exception ignored in __del__" and lost, so SIGINT is held back
        # first thing (call_holding_sigint) and sent again once this has returned.
        if getattr(self, "_stack", None) is not None:
            call_holding_sigint(self._close_collected)

    def _close_collected(self) -> None:
        # During interpreter shutdown the event-loop thread may already be frozen: joining it
        # would hang. The atexit hook has closed every live iterator before that point.
        if sys.is_finalizing():
            return
        close = functools.partial(self.close, wait=False)
        if threading.current_thread() in self._prefetcher.threads():
            # Collected (as part of a reference cycle) on one of our own threads, which cannot
            # stop or join itself: close from a helper thread instead.
            with contextlib.suppress(RuntimeError):  # no new thread at interpreter shutdown
                threading.Thread(target=close, name=f"{THREAD_NAME}-close", daemon=True).start()
        else:
            close()


recover_interrupts_in(BlockingPrefetcher.__del__)
