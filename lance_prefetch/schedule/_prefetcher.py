"""The producer: run blocking fetches concurrently in threads and hand the results over in plan
order.

:class:`Prefetcher` has two sides. Its producer, :meth:`Prefetcher.run`, is an anyio task on an
asyncio event loop: it walks the plan, starts up to ``max_in_flight`` fetches at once in worker
threads and keeps at most ``readahead`` units held (in flight plus finished and not yet received;
:class:`~lance_prefetch.schedule._budget.ReadaheadBudget`). Its consumer side, :meth:`Prefetcher.get`, is
called from an ordinary thread (the training loop) and blocks only on thread primitives: a result
is handed over by the worker thread that fetched it, with no trip through the event loop, and only
the readahead tokens go back to the loop, without waiting (``benchmarks/handover.py`` compares
this with a blocking portal call per item).

Nothing here knows about Lance or torch: the fetch function is injected, so tests use fakes.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
import queue
import threading
import time
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import anyio
import anyio.to_thread

from lance_prefetch._validate import check_depths
from lance_prefetch.schedule._budget import ReadaheadBudget
from lance_prefetch.schedule._hedging import HedgePolicy, Hedger, race
from lance_prefetch.schedule._slots import END, Slot, Timer
from lance_prefetch.schedule.retry import RetryPolicy, run_with_retries

__all__ = ["FetchError", "PrefetchStatistics", "Prefetcher", "PrefetcherClosed"]

T = TypeVar("T")
R = TypeVar("R")

#: Seconds :meth:`Prefetcher.get` waits for the producer's verdict (did it crash?) on an item
#: closed by the producer's own end.
_VERDICT_WAIT_S = 5.0


@dataclass(frozen=True)
class PrefetchStatistics:
    """A snapshot of a :class:`Prefetcher`, taken from any thread (counts may be a moment old).

    Attributes:
        held (int): items in flight plus finished and not yet received; never above ``readahead``.
        in_flight (int): fetches running in worker threads; never above ``max_in_flight``.
        received (int): items handed to the consumer so far.
        retries (int): fetch attempts after a failed or timed-out one, so far.
        ready (int): items fetched and processed, waiting to be received.
        readahead (int): the readahead bound now (changed by :meth:`Prefetcher.resize`).
        max_in_flight (int): the in-flight bound now.
        hedges, hedges_won (int): hedges started (:class:`~lance_prefetch.HedgePolicy`), and won.

    Items count in readahead units (see ``size`` of :class:`Prefetcher`); an item of several units
    counts as received unit by unit (:meth:`Prefetcher.release`).
    """

    held: int
    in_flight: int
    received: int
    retries: int = 0
    ready: int = 0
    readahead: int = 0
    max_in_flight: int = 0
    hedges: int = 0
    hedges_won: int = 0


class FetchError(Exception):
    """Raised by :meth:`Prefetcher.get` for an item whose fetch failed for good.

    The last attempt's exception is ``__cause__``.

    Attributes:
        item: the plan's item.
        attempts (int): attempts made, the first included.
    """

    def __init__(self, item: Any, attempts: int) -> None:
        super().__init__(f"fetching {item!r} failed after {attempts} attempt(s)")
        self.item, self.attempts = item, attempts


class PrefetcherClosed(Exception):
    """Raised by :meth:`Prefetcher.get` for an item whose fetch was cancelled by closing."""


def _given(coroutine: Coroutine[Any, Any, None]) -> Coroutine[Any, Any, None]:
    """For ``start_soon``, which takes a function: the coroutine, already created."""
    return coroutine


class Prefetcher(Generic[T, R]):
    """Fetch the items of a plan concurrently in threads; receive the results in plan order.

    Args:
        items (Iterable[T]): the plan; iterated lazily, once, on the event loop.
        fetch (Callable[[T], Any]): a blocking read run in a worker thread for each item (for
            Lance, a ``take`` that releases the GIL); retried and timed by ``retry``.
        process (Callable[[T, Any], R], optional): run in the same worker thread on each item and
            the result of its successful ``fetch`` (for Lance, conversion and ``transform``);
            never retried nor timed. Default: ``None``, the item's result is ``fetch``'s.
        readahead (int): the most items held at once: in flight plus finished and not yet
            received, ``>= 1``.
        max_in_flight (int): the most fetches running at once, ``1 <= max_in_flight <= readahead``.
        retry (RetryPolicy, optional): how a failing or stuck ``fetch`` is retried (see
            :class:`~lance_prefetch.schedule.retry.RetryPolicy`). Default: ``None``, one attempt, no
            timeout.
        size (Callable[[T], int], optional): how many readahead units an item holds, each in
            ``[1, readahead]`` (for Lance, a coalesced read of several batches holds one unit per
            batch). Default: ``None``, one unit per item.
        hedge (HedgePolicy, optional): when a late ``fetch`` gets a second one beside it (the
            first to return is used; :mod:`~lance_prefetch.schedule._hedging`). Default: ``None``, never.

    Invariants:
        The :class:`~lance_prefetch.schedule._budget.ReadaheadBudget`'s (``tokens.value + held + debt ==
        readahead``) and ``in_flight <= max_in_flight``. An item's tokens are taken before its
        fetch starts; :meth:`get` gives one back when the consumer receives the item and
        :meth:`release` the item's other units as the consumer hands them on, so retries and
        backoff happen inside the item's tokens; fetches start in plan order (the in-flight
        limiter is first-in, first-out). A fetch abandoned by its ``timeout`` leaves the limiter
        while its thread finishes the call in the background.

    Errors:
        A ``fetch`` that fails for good (its error is not transient, or the attempts ran out) makes
        the :meth:`get` that reaches that item in plan order raise :class:`FetchError`, with the
        last error as ``__cause__``. An exception raised by ``process`` (or a ``BaseException``
        that is not an ``Exception``, from either) is re-raised unchanged, never retried. The items
        before it are still delivered. After the first such failure no new fetch is started.

    Raises:
        TypeError, ValueError: a bound is out of range (see
            :func:`~lance_prefetch._validate.check_depths`), or ``retry`` is not a
            :class:`~lance_prefetch.RetryPolicy`.
    """

    def __init__(
        self,
        items: Iterable[T],
        fetch: Callable[[T], Any],
        *,
        process: Callable[[T, Any], R] | None = None,
        readahead: int,
        max_in_flight: int,
        retry: RetryPolicy | None = None,
        size: Callable[[T], int] | None = None,
        hedge: HedgePolicy | None = None,
    ) -> None:
        readahead, self._max_in_flight = check_depths(readahead, max_in_flight)
        if retry is not None and not isinstance(retry, RetryPolicy):
            raise TypeError(f"retry should be a RetryPolicy or None, but got retry={retry!r}")
        self._size = size or (lambda item: 1)  # units of readahead an item holds
        self._budget = ReadaheadBudget(readahead)
        self._items = items
        self._fetch, self._process, self._retry = fetch, process, retry
        self._hedger = None if hedge is None else Hedger(hedge)
        self._retries = 0  # written by the producer only
        self._ready: queue.SimpleQueue[Any] = queue.SimpleQueue()  # slots in plan order, then END
        self._started = 0  # units; written by the producer only
        self._received = 0  # units; written by the consumer only
        self._completed = 0  # units of slots finished with a value; written under _lock
        self._failed = False
        self._crash: BaseException | None = None
        self._finished = threading.Event()  # run() has returned (after recording any crash)
        # No fetch starts once _closing is set; _threads holds the loop's thread and every
        # thread that ran a fetch (close() joins them). Both are guarded by _lock.
        self._lock = threading.Lock()
        self._closing = False
        self._threads: set[threading.Thread] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._limiter: anyio.CapacityLimiter | None = None
        # fetch coroutines handed to the task group that have not started running yet
        self._unstarted: dict[Slot, Coroutine[Any, Any, None]] = {}

    async def run(self) -> None:
        """Produce until the plan is exhausted, a fetch fails, or the task is cancelled.

        Run it once, on the asyncio backend (the consumer returns readahead tokens with
        ``loop.call_soon_threadsafe``).

        Cancellation handling:
            Cancelling this task cancels every pending fetch. A fetch already running in a thread
            cannot be interrupted (a Lance ``take`` keeps going): it is abandoned, its thread
            finishes the call in the background and the result is dropped, so cancelling never
            waits for slow I/O. Every item not yet delivered then makes :meth:`get` raise
            :class:`PrefetcherClosed`, and the stream ends.
        """
        self._loop = asyncio.get_running_loop()
        with self._lock:
            self._threads.add(threading.current_thread())  # the event-loop thread
        self._budget.open()
        self._limiter = anyio.CapacityLimiter(self._max_in_flight)
        try:
            async with anyio.create_task_group() as task_group:
                items = iter(self._items)
                while True:
                    await self._budget.acquire()
                    slot = Slot()
                    try:
                        if self._failed:
                            break
                        item = next(items)
                        units = self._size(item)
                        if not 1 <= units <= self._budget.readahead:
                            raise ValueError(
                                f"an item of {units} units cannot be read ahead with "
                                f"readahead={self._budget.readahead}"
                            )
                    except StopIteration:
                        break
                    except Exception as exc:  # a broken plan must not look like a finished one
                        self._failed = True
                        slot.finish(error=exc)
                        self._started += 1
                        self._ready.put(slot)
                        break
                    self._budget.note(units)
                    await self._budget.acquire(units - 1)  # an item's tokens: all of them first
                    slot.units = units
                    self._started += units
                    self._ready.put(slot)
                    fill = self._unstarted[slot] = self._fill(item, slot)
                    task_group.start_soon(_given, fill, name=f"fill {self._started}")
        except BaseException as exc:
            if not isinstance(exc, anyio.get_cancelled_exc_class()):
                self._crash = exc  # get() raises it instead of ending quietly
            raise
        finally:
            # A task cancelled before its first step never runs its coroutine (anyio >= 4.14
            # wraps it in one of its own): close it, and finish its slot as its finally would.
            for slot, fill in self._unstarted.items():
                fill.close()
                slot.finish(error=PrefetcherClosed("the prefetcher was closed before this item"))
            self._unstarted.clear()
            self._finished.set()
            self._ready.put(END)

    async def _fill(self, item: T, slot: Slot) -> None:
        del self._unstarted[slot]
        try:
            error = await self._attempt(item, slot)
            if error is not None:
                error, attempts = await run_with_retries(
                    self._retry,
                    error,
                    functools.partial(self._retry_attempt, item, slot),
                    self._judge,
                    done=lambda: slot.is_set,  # an abandoned attempt delivered meanwhile
                )
                if error is not None and not slot.is_set:
                    failure = FetchError(item, attempts)
                    failure.__cause__ = error
                    self._fail(slot, failure)
        finally:  # cancelled (or the thread call itself failed): the consumer must not wait
            slot.finish(error=PrefetcherClosed("the prefetcher was closed before this item"))

    async def _attempt(self, item: T, slot: Slot) -> Exception | None:
        """One attempt, hedged (:func:`~lance_prefetch.schedule._hedging.race`), in worker threads:
        ``None`` once the slot is (or will be) finished by a thread, else the fetch's error (a
        ``TimeoutError`` when it ran past ``retry.timeout``)."""
        timeout = None if self._retry is None else self._retry.timeout
        async with self._limiter:  # type: ignore[union-attr]  # waiting here is not timed
            deadline = math.inf if timeout is None else anyio.current_time() + timeout
            with anyio.CancelScope(deadline=deadline) as scope:
                timer = None if timeout is None else Timer(scope, self._loop)  # type: ignore
                run = functools.partial(  # run(hedge): one take in a worker thread, bounded by
                    anyio.to_thread.run_sync,
                    self._fetch_into,
                    item,
                    slot,
                    timer,  # the limiter
                    abandon_on_cancel=True,
                    limiter=anyio.CapacityLimiter(math.inf),  # above only
                )
                return await race(run, self._hedger, lambda: slot.is_set)
        if timer is not None and timer.fetched:  # the read just made it; the thread finishes it
            await anyio.to_thread.run_sync(slot.wait, abandon_on_cancel=True)
            return None
        return TimeoutError(f"the read took longer than timeout={timeout:g} s; it was abandoned")

    async def _retry_attempt(self, item: T, slot: Slot) -> Exception | None:
        self._retries += 1
        return await self._attempt(item, slot)

    async def _judge(self, error: Exception) -> bool:
        """``retry_on`` is the user's code: it runs off the event loop, so that a slow one stalls
        neither other items nor closing."""
        return await anyio.to_thread.run_sync(self._judge_here, error, abandon_on_cancel=True)

    def _judge_here(self, error: Exception) -> bool:
        """Runs in a worker thread (joined by close() like the fetches'): ``retry_on``."""
        with self._lock:
            self._threads.add(threading.current_thread())
        return self._retry.is_retryable(error)  # type: ignore[union-attr]

    def _fetch_into(
        self, item: T, slot: Slot, timer: Timer | None, hedge: bool = False
    ) -> Exception | None:
        """Runs in a worker thread: fetch, then process and hand the result straight to the
        consumer, unless another fetch of the item (its hedge, the take it hedged, an abandoned
        attempt) returned first. Returns the fetch's exception (to retry or report), else None."""
        with self._lock:
            if self._closing:
                return None  # _fill's finally marks the slot closed
            self._threads.add(threading.current_thread())
        started = time.perf_counter()
        try:
            raw = self._fetch(item)
        except Exception as exc:
            return exc
        except BaseException as exc:  # SystemExit or KeyboardInterrupt: re-raised by get()
            self._fail(slot, exc)
            return None
        if timer is not None:
            timer.stop()
        if self._hedger is not None:
            self._hedger.observe(time.perf_counter() - started, self._size(item))
        if self._closing:  # closed while it read: the result is dropped, nothing processes it
            return None
        if not slot.claim():  # another fetch of the item returned first: it finishes the slot
            slot.wait()  # (this result is dropped); "done" only once it did
            return None
        try:
            value = raw if self._process is None else self._process(item, raw)
        except BaseException as exc:  # never retried: re-raised by get(), unchanged
            self._fail(slot, exc)
        else:
            if slot.finish(value=value):
                with self._lock:
                    self._completed += slot.units
                if hedge:
                    self._hedger.record_win()  # type: ignore[union-attr]
        return None

    def _fail(self, slot: Slot, error: BaseException) -> None:
        # A late duplicate's failure, after the slot was served, is moot.
        if slot.finish(error=error):
            self._failed = True

    def stop_fetching(self) -> None:
        """Start no new fetch from now on (fetches already running carry on; their results are
        dropped, never processed)."""
        with self._lock:
            self._closing = True

    def threads(self) -> list[threading.Thread]:
        """The event-loop thread and the worker threads that have run a fetch (alive or not)."""
        with self._lock:
            return list(self._threads)

    def get(self, *, release: bool = True) -> R:
        """The next result in plan order; blocks the calling thread until it is there.

        Call it from one consumer thread (not the event loop's). ``KeyboardInterrupt`` interrupts
        the wait; the item is then lost, so close the prefetcher.

        Args:
            release (bool, optional): give the item's first readahead token back now. ``False``:
                the caller gives it back with :meth:`release` once it is done with the item (so
                that the producer's next read does not compete with the caller for the GIL while
                it still works on this one). Default: ``True``.

        Raises:
            StopIteration: the plan is exhausted and every result was delivered.
            PrefetcherClosed: closing cancelled the item's fetch, or the producer.
            RuntimeError: the producer itself crashed (a bug); the crash is ``__cause__``.
            FetchError: the item's ``fetch`` failed for good; its last error is ``__cause__``.
            BaseException: whatever ``process`` raised for this item (or a ``fetch`` raised that
                is not an ``Exception``), unchanged.
        """
        try:
            slot = self._ready.get_nowait()
        except queue.Empty:
            self._budget.flush()  # about to wait: the producer must have every token given back
            slot = self._ready.get()
        if slot is END:
            self._ready.put(END)
            if self._crash is not None:
                raise RuntimeError("the prefetch producer crashed") from self._crash
            if self._closing:  # the producer was cancelled: not the plan's end
                raise PrefetcherClosed("the prefetcher was closed")
            raise StopIteration
        if not slot.is_set:
            self._budget.flush()  # about to wait, as above
            slot.wait()
        if release:
            self.release(1)
        if isinstance(slot.error, PrefetcherClosed):
            if not self._closing:  # nobody closed us: the producer ended; wait for its verdict
                self._finished.wait(_VERDICT_WAIT_S)
            if self._crash is not None:
                raise RuntimeError("the prefetch producer crashed") from self._crash
        if slot.error is not None:
            raise slot.error
        return slot.value  # type: ignore[no-any-return]

    def release(self, units: int) -> None:
        """Give back the readahead tokens of ``units`` more units of received items (an item of
        several units gives back one when :meth:`get` returns it, the rest as the consumer hands
        them on). Call it from the consumer thread."""
        self._received += units
        self._budget.release(units)

    def resize(self, readahead: int, max_in_flight: int) -> None:
        """Change the readahead and in-flight bounds of a running prefetcher (thread-safe).

        Growing takes effect at once. Shrinking ``readahead`` keeps every item already started:
        the tokens given back are withheld until the new bound holds. ``readahead`` must stay at
        least the largest item ``size``.

        Raises:
            TypeError, ValueError: from :func:`check_depths`.
        """
        readahead, max_in_flight = check_depths(readahead, max_in_flight)
        if readahead < self._budget.largest:
            raise ValueError(
                f"readahead should stay >= the largest item's size ({self._budget.largest} "
                f"units), but got readahead={readahead}"
            )
        loop = self._loop
        if loop is None:  # not running yet: the new bounds apply from the start
            self._budget.readahead, self._max_in_flight = readahead, max_in_flight
            return
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(self._resize, readahead, max_in_flight)

    def _resize(self, readahead: int, max_in_flight: int) -> None:
        if self._limiter is not None:
            self._limiter.total_tokens = max_in_flight
        self._max_in_flight = max_in_flight
        self._budget.resize(readahead)

    def statistics(self) -> PrefetchStatistics:
        """A :class:`PrefetchStatistics` snapshot (safe from any thread)."""
        limiter = self._limiter
        hedges, won = (0, 0) if self._hedger is None else self._hedger.counts()
        return PrefetchStatistics(
            held=self._started - self._received,
            in_flight=0 if limiter is None else int(limiter.borrowed_tokens),
            received=self._received,
            retries=self._retries,
            ready=max(self._completed - self._received, 0),
            readahead=self._budget.readahead,
            max_in_flight=self._max_in_flight,
            hedges=hedges,
            hedges_won=won,
        )
