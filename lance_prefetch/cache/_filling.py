"""What both caches share: the wrapped source's identity and checks (:class:`FillingCache`), and
their fill in a background thread, started once per process and stopped at exit.

:class:`BackgroundFill` runs ``fill(stopping)`` in a daemon thread named :data:`THREAD_NAME`, so
that the first epoch is served by takes while one sequential scan fills the cache behind it
(:mod:`~lance_prefetch.cache._disk`, :mod:`~lance_prefetch.cache._memory`). ``fill`` checks
``stopping`` between the scan's record batches and returns early once it is set. The fill is
registered with :mod:`~lance_prefetch.lifecycle._shutdown` like a live iterator: the exit hook sets
``stopping`` and waits for the thread (it may be inside a Lance read) until
:data:`~lance_prefetch.lifecycle._shutdown.EXIT_WAIT_S`.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any

from lance_prefetch.lifecycle import _shutdown
from lance_prefetch.sources._wrapped import WrappedSource

__all__ = ["BackgroundFill", "FillStopped", "FillingCache", "THREAD_NAME"]

#: The name of a fill's thread.
THREAD_NAME = "lance-prefetch-cache-fill"


class FillStopped(Exception):
    """Raised inside ``fill`` (by its own check of ``stopping``) to end it early."""


class BackgroundFill:
    """One fill of one cache in this process, run in a background thread.

    Args:
        fill (Callable[[threading.Event], None]): does the work; returns when done, or early
            (or raising :class:`FillStopped`) once its argument is set.
        what (str): names the cache in the thread's errors.

    :meth:`start` is idempotent; :meth:`wait` blocks until the fill ended and re-raises its
    error. A copy in another process (``fork``) starts its own fill.
    """

    def __init__(self, fill: Callable[[threading.Event], None], what: str) -> None:
        self._fill, self._what = fill, what
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()
        #: The fill's error, once it failed (``None`` while it runs or after it succeeded).
        self.error: BaseException | None = None

    def start(self, *, again: bool = True) -> None:
        """Start the fill in its thread, unless it started already in this process and did not
        fail; a failed fill starts again if ``again`` (the next ``iter()`` tries once more)."""
        with self._lock:
            if self._thread is not None and self._pid == os.getpid():
                if not (again and self._done.is_set() and self.error is not None):
                    return
            self._pid = os.getpid()
            self._stopping, self._done, self.error = threading.Event(), threading.Event(), None
            self._thread = threading.Thread(target=self._run, name=THREAD_NAME, daemon=True)
            _shutdown.register(self)
            self._thread.start()

    @property
    def started(self) -> bool:
        """Whether this process started the fill."""
        return self._thread is not None and self._pid == os.getpid()

    @property
    def done(self) -> bool:
        """Whether the fill ended (filled, failed or stopped)."""
        return self.started and self._done.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """Start the fill if needed and wait for its end; whether it ended within ``timeout``
        seconds (``None``: no limit).

        Raises:
            Exception: the fill's own error, if it failed.
        """
        self.start()
        ended = self._done.wait(timeout)
        if ended and self.error is not None:
            raise self.error
        return ended

    def _run(self) -> None:
        try:
            self._fill(self._stopping)
        except FillStopped:
            pass
        except BaseException as exc:  # kept for the readers; the thread itself ends quietly
            # reads re-raise it: retrying a take would only raise it again (a marker attribute,
            # read with getattr by schedule.retry)
            exc.permanent = True  # type: ignore[attr-defined]
            self.error = exc
        finally:
            self._done.set()
            _shutdown.unregister(self)

    def close(self, *, wait: bool = True) -> None:
        """Ask the fill to stop at its next record batch (the exit hook's call); with ``wait``,
        wait for it up to :data:`~lance_prefetch.lifecycle._shutdown.CLOSE_WAIT_S`."""
        deadline = time.monotonic() + _shutdown.CLOSE_WAIT_S
        self._stopping.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            _shutdown.abandon([thread], time.monotonic() + _shutdown.EXIT_WAIT_S)
            if wait:
                self.wait_for_reads(deadline)

    def wait_for_reads(self, deadline: float) -> bool:
        """Wait until ``deadline`` (``time.monotonic()``) for the fill's thread to end."""
        thread = self._thread
        if thread is None or thread is threading.current_thread() or self._pid != os.getpid():
            return True
        return _shutdown.join([thread], deadline - time.monotonic())

    def __repr__(self) -> str:
        state = "not started" if not self.started else "done" if self.done else "running"
        return f"BackgroundFill({self._what}, {state})"


class FillingCache(WrappedSource):
    """What both caches share: the wrapped source's identity, its process and offset checks (the
    :class:`~lance_prefetch.sources._protocol.RowSource` members that do not read, as
    :class:`~lance_prefetch.sources._wrapped.WrappedSource` forwards them), and the background
    fill ``_filling`` that :meth:`prepare` starts."""

    _source: Any  # a LanceSource, or a SubsetSource under a memory cache
    _filling: BackgroundFill

    def prepare(self) -> None:
        """Start the fill in the background in this process, unless it started, or start it
        again if it failed (returns at once; reads before its end are served from the dataset,
        see each cache)."""
        self._filling.start()
