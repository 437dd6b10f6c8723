"""Reads that cost microseconds, done in the consumer's own thread.

A filled memory cache gathers a batch in a few microseconds a row (``torch.index_select`` of
tensors already in memory); handing it over from a worker thread through the event loop would
cost more than the read itself. :class:`DirectPrefetcher` takes a
:class:`~lance_prefetch.schedule._prefetcher.Prefetcher`'s place under
:class:`~lance_prefetch.schedule._blocking.BlockingPrefetcher` for such reads: ``get()`` reads and
processes the next item right there, no thread, no event loop, nothing read ahead (so nothing
held: the readahead bound holds trivially). Its errors are a prefetcher's: a failed ``fetch`` is
a :class:`~lance_prefetch.schedule._prefetcher.FetchError` after one attempt (a read from memory is not
retried).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any, Generic, TypeVar

from lance_prefetch.schedule._prefetcher import FetchError, PrefetchStatistics

__all__ = ["DirectPrefetcher"]

T = TypeVar("T")
R = TypeVar("R")


class DirectPrefetcher(Generic[T, R]):
    """Reads ``items`` one by one, in the thread that calls :meth:`get`.

    Args:
        items (Iterable): what to read, in order.
        fetch (Callable): reads one item.
        process (Callable): ``process(item, fetched)``, the result :meth:`get` returns.
        readahead (int), max_in_flight (int): reported by :meth:`statistics` only.
    """

    #: Tells :class:`~lance_prefetch.schedule._blocking.BlockingPrefetcher` to start no event loop.
    synchronous = True

    def __init__(
        self,
        items: Iterable[T],
        fetch: Callable[[T], Any],
        *,
        process: Callable[[T, Any], R],
        readahead: int,
        max_in_flight: int,
    ) -> None:
        self._items = iter(items)
        self._fetch, self._process = fetch, process
        self._readahead, self._max_in_flight = readahead, max_in_flight
        self._received = 0
        self._closing = False

    def get(self, *, release: bool = True) -> R:
        """The next item's result, read now.

        Raises:
            StopIteration: no item left (or :meth:`stop_fetching` was called).
            FetchError: ``fetch`` failed; its error is ``__cause__``.
        """
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

    def stop_fetching(self) -> None:
        """Read nothing more."""
        self._closing = True

    def threads(self) -> list[threading.Thread]:
        """No thread of its own."""
        return []

    def statistics(self) -> PrefetchStatistics:
        """Nothing held or in flight; ``received`` counts the items read."""
        return PrefetchStatistics(
            held=0,
            in_flight=0,
            received=self._received,
            readahead=self._readahead,
            max_in_flight=self._max_in_flight,
        )
