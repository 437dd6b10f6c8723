"""Reads that cost microseconds, done in the consumer's own thread.

A filled memory cache gathers a batch in a few microseconds a row (``torch.index_select`` of
tensors already in memory); handing it over from a worker thread through the event loop would
cost more than the read itself. :class:`DirectPrefetcher` takes a
:class:`~lance_prefetch.schedule._blocking.BlockingPrefetcher`'s place for such reads, with the
same interface (:class:`~lance_prefetch.schedule._drained.DrainedPrefetcher`): ``next()`` reads
and processes the next item right there, no thread, no event loop, nothing read ahead (so nothing
held: the readahead bound holds trivially). Its errors are a prefetcher's: a failed ``fetch`` is
a :class:`~lance_prefetch.schedule._prefetcher.FetchError` after one attempt (a read from memory
is not retried).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from lance_prefetch.lifecycle._shutdown import CLOSE_WAIT_S
from lance_prefetch.schedule._drained import DrainedPrefetcher
from lance_prefetch.schedule._prefetcher import FetchError, PrefetchStatistics

__all__ = ["DirectPrefetcher"]

T = TypeVar("T")
R = TypeVar("R")


class DirectPrefetcher(DrainedPrefetcher[R]):
    """Reads ``items`` one by one, in the thread that calls ``next()`` (or :meth:`get`).

    Args:
        items (Iterable): what to read, in order.
        fetch (Callable): reads one item.
        process (Callable): ``process(item, fetched)``, the result ``next()`` returns.
        readahead (int), max_in_flight (int): reported by :meth:`statistics` only.
        close_wait_s (float, optional): as for
            :class:`~lance_prefetch.schedule._blocking.BlockingPrefetcher` (nothing runs in the
            background, so :meth:`close` does not wait). Default: :data:`CLOSE_WAIT_S`.
        on_close (Callable[[], None], optional): run first by every :meth:`close` (see
            :class:`~lance_prefetch.schedule._drained.DrainedPrefetcher`). Default: ``None``.

    Errors:
        ``next()`` raises :class:`~lance_prefetch.schedule._prefetcher.FetchError` for a failed
        ``fetch`` (its error is ``__cause__``), or ``process``'s own error, and closes.
    """

    def __init__(
        self,
        items: Iterable[T],
        fetch: Callable[[T], Any],
        *,
        process: Callable[[T, Any], R],
        readahead: int,
        max_in_flight: int,
        close_wait_s: float = CLOSE_WAIT_S,
        on_close: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(close_wait_s=close_wait_s, on_close=on_close)
        self._items = iter(items)
        self._fetch, self._process = fetch, process
        self._readahead, self._max_in_flight = readahead, max_in_flight
        self._received = 0
        self._closing = False
        self._started(contextlib.ExitStack())  # nothing to stop: no thread, no loop

    def _get(self, release: bool) -> R:
        if self._closing:
            raise StopIteration
        item = next(self._items)
        try:
            fetched = self._fetch(item)
        except Exception as exc:
            raise FetchError(item, attempts=1) from exc
        self._received += 1
        return self._process(item, fetched)

    def release(self, units: int) -> None:
        """Nothing to give back: nothing is read ahead."""

    def resize(self, readahead: int, max_in_flight: int) -> None:
        """Record the bounds (reported by :meth:`statistics`; nothing is read ahead)."""
        self._readahead, self._max_in_flight = readahead, max_in_flight

    def _stop_fetching(self) -> None:
        self._closing = True

    def _threads(self) -> list[threading.Thread]:
        return []  # no thread of its own

    def statistics(self) -> PrefetchStatistics:
        """Nothing held or in flight; ``received`` counts the items read."""
        return PrefetchStatistics(
            held=0,
            in_flight=0,
            received=self._received,
            readahead=self._readahead,
            max_in_flight=self._max_in_flight,
        )
