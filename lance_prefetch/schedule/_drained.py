"""What the training loop drains with ``next()``: the interface and the lifecycle that
:class:`~lance_prefetch.schedule._blocking.BlockingPrefetcher` (a producer on a background event
loop) and :class:`~lance_prefetch.schedule._direct.DirectPrefetcher` (reads in the caller's
thread) share, so that their owner holds either the same way.

:class:`DrainedPrefetcher` owns what does not depend on where the reads run: the refusal in a
process copied by ``fork``, the end of the plan (:attr:`~DrainedPrefetcher.exhausted`), the close
on exhaustion, on an error and on garbage collection, its registration with the exit hook
(:mod:`~lance_prefetch.lifecycle._shutdown`), and the ``on_close`` callback every close runs
first. A subclass supplies the reads (``_get``, ``release``, ``resize``, ``statistics``) and how
they stop (``_stop_fetching``, ``_threads``, and the :class:`contextlib.ExitStack` it starts
with: unwinding it stops what it started).
"""

from __future__ import annotations

import abc
import contextlib
import functools
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

from lance_prefetch.lifecycle import _shutdown
from lance_prefetch.lifecycle._interrupts import (
    call_holding_sigint,
    recover_interrupts_in,
    sigint_deferred,
)
from lance_prefetch.lifecycle._shutdown import EXIT_WAIT_S
from lance_prefetch.schedule._prefetcher import PrefetcherClosed, PrefetchStatistics

__all__ = ["CLOSE_THREAD_NAME", "DrainedPrefetcher"]

R = TypeVar("R")

#: Name of the helper thread that closes a prefetcher collected on one of its own threads.
CLOSE_THREAD_NAME = "lance-prefetch-loop-close"

_logger = logging.getLogger("lance_prefetch.scheduling")


class DrainedPrefetcher(Iterator[R]):
    """A prefetcher the caller drains with ``next()`` (or :meth:`get`) and closes.

    Args:
        close_wait_s (float): the most seconds :meth:`close` takes waiting for reads still
            running.
        on_close (Callable[[], None], optional): run first by every :meth:`close`, whatever
            closes it (its owner, the end of the plan, an error, garbage collection, the exit
            hook), from the thread that closes; it must hold no reference to the owner (it
            would keep the owner alive). Default: ``None``.

    A subclass implements the abstract methods and calls :meth:`_started` once its reads can
    begin.
    """

    def __init__(self, *, close_wait_s: float, on_close: Callable[[], None] | None) -> None:
        self._close_wait_s, self._on_close = close_wait_s, on_close
        self._pid = os.getpid()
        #: Whether the plan ran out (every item was handed out), not closed early.
        self.exhausted = False
        self._lock = threading.Lock()
        self._stack: contextlib.ExitStack | None = None

    def _started(self, stack: contextlib.ExitStack) -> None:
        """The reads began: ``stack`` unwinds what started them; the exit hook closes this."""
        self._stack = stack
        _shutdown.register(self)

    def __iter__(self) -> DrainedPrefetcher[R]:
        return self

    def __next__(self) -> R:
        return self.get()

    def get(self, *, release: bool = True) -> R:
        """``next()``; with ``release=False`` the item's first readahead token is given back by
        the caller (:meth:`release`), see
        :meth:`~lance_prefetch.schedule._prefetcher.Prefetcher.get`.

        Raises:
            StopIteration: the plan ran out (:attr:`exhausted`; closed), or it was closed.
            RuntimeError: this object was copied into another process by ``fork``.
            Exception: a failed item's error (closed; see the subclass).
        """
        if self._stack is None:
            raise StopIteration
        if os.getpid() != self._pid:
            raise RuntimeError(
                f"this iterator was started in process {self._pid} and copied into process "
                f"{os.getpid()} by fork; its threads stayed behind. Start a new iterator here"
            )
        try:
            return self._get(release)
        except StopIteration:
            self.exhausted = True
            self.close(wait=False)
            raise
        except PrefetcherClosed:  # closed from another thread while we waited
            raise StopIteration from None
        except BaseException:  # the error (or Ctrl-C) reaches the caller without waiting
            self.close(wait=False)
            raise

    @abc.abstractmethod
    def _get(self, release: bool) -> R:
        """The next item (``StopIteration`` at the end of the plan)."""

    @abc.abstractmethod
    def release(self, units: int) -> None:
        """Give back ``units`` readahead tokens of a received item."""

    @abc.abstractmethod
    def resize(self, readahead: int, max_in_flight: int) -> None:
        """Change the readahead and in-flight bounds."""

    @abc.abstractmethod
    def statistics(self) -> PrefetchStatistics:
        """A :class:`~lance_prefetch.schedule._prefetcher.PrefetchStatistics` snapshot."""

    @abc.abstractmethod
    def _stop_fetching(self) -> None:
        """Start no read from now on."""

    @abc.abstractmethod
    def _threads(self) -> list[threading.Thread]:
        """The threads the reads run in."""

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` has run."""
        return self._stack is None

    def close(self, *, wait: bool = True) -> None:
        """Run ``on_close``, cancel the reads not started and stop what started them; then wait
        a little for the reads still running.

        Args:
            wait (bool, optional): ``True``: wait for the reads still running to return and
                their threads to exit, until ``close_wait_s`` after this call began. ``False``:
                do not wait. Either way the reads still running are left to finish in the
                background (their results dropped) and waited for at interpreter exit, until
                :data:`~lance_prefetch.lifecycle._shutdown.EXIT_WAIT_S` after they were left.
                Default: ``True``. Exhaustion, an error, ``KeyboardInterrupt`` and garbage
                collection close with ``wait=False``.

        Safe to call more than once (a later ``close()`` waits again for what an earlier one
        left running), and from another thread than the consumer's.
        """
        if self._on_close is not None:
            self._on_close()
        deadline = time.monotonic() + self._close_wait_s
        self._stop()
        if wait:
            self.wait_for_reads(deadline)

    def _stop(self) -> None:
        """Stop the reads and what started them; hand the reads still running to the exit
        hook."""
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
            self._stop_fetching()  # no thread starts a fetch from now on
            # The worker threads exit once their call returns; one that ran a Lance take must end
            # normally, not be frozen by interpreter shutdown, or the process aborts at exit. Hand
            # them to the exit hook first, so that an interrupted stop below loses none.
            _shutdown.abandon(self._running_threads(), left + EXIT_WAIT_S)
            with sigint_deferred():  # a Ctrl-C here is raised once the loop thread is joined
                stack.close()  # cancels the producer, joins the event-loop thread
        _shutdown.abandon(self._running_threads(), left + EXIT_WAIT_S)

    def wait_for_reads(self, deadline: float) -> bool:
        """After :meth:`close`: wait until ``deadline`` (a ``time.monotonic()`` time) for the
        reads still running to return and their threads to exit; whether none runs any more.
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
            for thread in self._threads()
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
        if threading.current_thread() in self._threads():
            # Collected (as part of a reference cycle) on one of our own threads, which cannot
            # stop or join itself: close from a helper thread instead.
            with contextlib.suppress(RuntimeError):  # no new thread at interpreter shutdown
                threading.Thread(target=close, name=CLOSE_THREAD_NAME, daemon=True).start()
        else:
            close()


recover_interrupts_in(DrainedPrefetcher.__del__)
