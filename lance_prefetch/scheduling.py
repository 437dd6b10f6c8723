"""Scheduling: run blocking fetches concurrently in threads and hand results over in plan order.

:class:`Prefetcher` has two sides. Its producer, :meth:`Prefetcher.run`, is an anyio task on an
asyncio event loop: it walks the plan, starts up to ``max_in_flight`` fetches at once in worker
threads and keeps at most ``readahead`` items held (in flight plus finished and not yet received).
Its consumer side, :meth:`Prefetcher.get`, is called from an ordinary thread (the training loop)
and blocks only on thread primitives: a result is handed over by the worker thread that fetched it,
with no trip through the event loop, and only the readahead token goes back to the loop, without
waiting (``call_soon_threadsafe``). Measured by ``benchmarks/handover.py`` on the 2-core
development machine: a blocking portal call per item keeps the training thread ~300 us in
``next()``; this hand-over ~30 us.

:class:`BlockingPrefetcher` runs a :class:`Prefetcher` on an event loop in a background thread of
the calling process and is a plain iterator.

Nothing here knows about Lance or torch: the fetch function is injected, so tests use fakes.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import functools
import logging
import math
import os
import queue
import sys
import threading
import time
import weakref
from collections.abc import Callable, Coroutine, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import anyio
import anyio.from_thread
import anyio.to_thread

from ._exit_guard import exit_if_stuck
from ._interrupts import call_holding_sigint, recover_interrupts_in, sigint_deferred
from ._validate import check_int
from .retry import RetryPolicy

__all__ = [
    "BlockingPrefetcher",
    "FetchError",
    "PrefetchStatistics",
    "Prefetcher",
    "PrefetcherClosed",
    "THREAD_NAME",
    "check_depths",
]

T = TypeVar("T")
R = TypeVar("R")

#: Name of the event-loop thread a :class:`BlockingPrefetcher` starts (one per live iterator).
THREAD_NAME = "lance-prefetch-loop"

#: Seconds :meth:`BlockingPrefetcher.close` waits, by default, for the worker threads that ran
#: fetches to finish and exit. A thread that ran a Lance ``take`` must end before the interpreter
#: finalizes: a daemon thread frozen by finalization mid-call, or even idle after a take, makes the
#: process abort ("terminate called without an active exception").
CLOSE_TIMEOUT_S = 5.0

_logger = logging.getLogger(__name__)


def check_depths(readahead: int, max_in_flight: int) -> tuple[int, int]:
    """Validate ``readahead >= 1`` and ``1 <= max_in_flight <= readahead``; return them as ints.

    Raises:
        TypeError: either is not an integer.
        ValueError: either is out of range.
    """
    readahead = check_int("readahead", readahead, minimum=1)
    max_in_flight = check_int("max_in_flight", max_in_flight, minimum=1)
    if max_in_flight > readahead:
        raise ValueError(
            f"max_in_flight should be <= readahead, but got max_in_flight={max_in_flight} > "
            f"readahead={readahead}; every fetch in flight holds one of the readahead slots"
        )
    return readahead, max_in_flight


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


class _Slot:
    """The result of one fetch, queued for the consumer in plan order before the fetch starts.

    The first of :meth:`finish` calls wins: a fetch abandoned by cancellation may still finish in
    its thread later, and its result is then dropped.

    Built on two C-level locks only (no ``threading.Event``): a ``KeyboardInterrupt`` raised by a
    signal handler while the consumer waits can interrupt Python-level code at any bytecode, and
    inside ``threading.Condition`` it could leave a lock held that :meth:`finish`, in a worker
    thread, then waits for forever. Here :meth:`finish` never waits for a lock a waiter holds.
    """

    __slots__ = ("_guard", "_wakeup", "error", "is_set", "units", "value")

    def __init__(self) -> None:
        self._guard = threading.Lock()  # orders finish() calls
        self._wakeup = threading.Lock()  # held until the result is set
        self._wakeup.acquire()
        self.is_set = False
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

    def wait(self) -> None:
        """Block until the result is set (interruptible by ``Ctrl-C``)."""
        if not self.is_set:
            self._wakeup.acquire()
            self._wakeup.release()  # for the next waiter (the consumer and the loop may both wait)


_END = object()  # queued after the last slot; queued again by every get() that sees it


class _Timer:
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
            :class:`~lance_prefetch.retry.RetryPolicy`). Default: ``None``, one attempt, no
            timeout.
        size (Callable[[T], int], optional): how many readahead units an item holds, each in
            ``[1, readahead]`` (for Lance, a coalesced read of several batches holds one unit per
            batch). Default: ``None``, one unit per item.

    Invariants (``tokens`` is the producer's readahead semaphore, ``held`` counts units):
        ``tokens.value + held + debt == readahead`` and ``in_flight <= max_in_flight``. An item's
        tokens are taken before its fetch starts; :meth:`get` gives one back when the consumer
        receives the item and :meth:`release` the item's other units as the consumer hands them
        on, so retries and backoff happen inside the item's tokens; fetches start in plan order
        (the in-flight limiter is first-in, first-out). A fetch abandoned by its ``timeout``
        leaves the limiter while its thread finishes the call in the background. ``debt`` is
        what :meth:`resize` shrank the readahead by and returned tokens have not yet repaid.

    Errors:
        A ``fetch`` that fails for good (its error is not transient, or the attempts ran out) makes
        the :meth:`get` that reaches that item in plan order raise :class:`FetchError`, with the
        last error as ``__cause__``. An exception raised by ``process`` (or a ``BaseException``
        that is not an ``Exception``, from either) is re-raised unchanged, never retried. The items
        before it are still delivered. After the first such failure no new fetch is started.

    Raises:
        TypeError, ValueError: from :func:`check_depths`.
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
    ) -> None:
        self._readahead, self._max_in_flight = check_depths(readahead, max_in_flight)
        if retry is not None and not isinstance(retry, RetryPolicy):
            raise TypeError(f"retry should be a RetryPolicy or None, but got retry={retry!r}")
        self._size = size
        self._debt = 0  # tokens to swallow after a shrinking resize(); on the loop only
        self._largest = 1  # the most units of an item so far; written by the producer only
        self._owed = 0  # tokens released by the consumer, not yet sent to the loop (consumer's)
        self._items = items
        self._fetch = fetch
        self._process = process
        self._retry = retry
        self._retries = 0  # written by the producer only
        self._ready: queue.SimpleQueue[Any] = queue.SimpleQueue()  # slots in plan order, then _END
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
        self._unstarted: dict[_Slot, Coroutine[Any, Any, None]] = {}

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
        self._tokens = anyio.Semaphore(self._readahead)
        self._limiter = anyio.CapacityLimiter(self._max_in_flight)
        try:
            async with anyio.create_task_group() as task_group:
                items = iter(self._items)
                while True:
                    await self._tokens.acquire()
                    slot = _Slot()
                    try:
                        if self._failed:
                            break
                        item = next(items)
                        units = 1 if self._size is None else self._size(item)
                        if not 1 <= units <= self._readahead:
                            raise ValueError(
                                f"an item of {units} units cannot be read ahead with "
                                f"readahead={self._readahead}"
                            )
                    except StopIteration:
                        break
                    except Exception as exc:  # a broken plan must not look like a finished one
                        self._failed = True
                        slot.finish(error=exc)
                        self._started += 1
                        self._ready.put(slot)
                        break
                    self._largest = max(self._largest, units)
                    for _ in range(units - 1):  # an item of several units: all its tokens first
                        await self._tokens.acquire()
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
            self._ready.put(_END)

    async def _fill(self, item: T, slot: _Slot) -> None:
        del self._unstarted[slot]
        try:
            error = await self._attempt(item, slot)
            if error is not None:
                await self._retry_or_fail(item, slot, error)
        finally:  # cancelled (or the thread call itself failed): the consumer must not wait
            slot.finish(error=PrefetcherClosed("the prefetcher was closed before this item"))

    async def _attempt(self, item: T, slot: _Slot) -> Exception | None:
        """One attempt in a worker thread: ``None`` once the slot is (or will be) finished by the
        thread, else the fetch's error (a ``TimeoutError`` when it ran past ``retry.timeout``)."""
        timeout = None if self._retry is None else self._retry.timeout
        if timeout is None:
            return await anyio.to_thread.run_sync(  # type: ignore[no-any-return]
                self._fetch_into, item, slot, None, limiter=self._limiter, abandon_on_cancel=True
            )
        async with self._limiter:  # type: ignore[union-attr]  # waiting here is not timed
            with anyio.CancelScope(deadline=anyio.current_time() + timeout) as scope:
                timer = _Timer(scope, self._loop)  # type: ignore[arg-type]
                return await anyio.to_thread.run_sync(  # type: ignore[no-any-return]
                    self._fetch_into, item, slot, timer, abandon_on_cancel=True
                )
        if timer.fetched:  # the read just made it; the thread finishes the slot: wait for that
            await anyio.to_thread.run_sync(slot.wait, abandon_on_cancel=True)
            return None
        return TimeoutError(f"the read took longer than timeout={timeout:g} s; it was abandoned")

    async def _retry_or_fail(self, item: T, slot: _Slot, error: Exception) -> None:
        """Retry a failed fetch by the policy; when it still fails, finish the slot with it."""
        attempts = 1
        if self._retry is not None and self._retry.attempts > 1:
            policy = self._retry
            failed: Exception | None = error
            retryable = False

            def judged(_: BaseException) -> bool:
                return retryable

            try:
                async for attempt in policy.retrying(judged):
                    with attempt:
                        attempts = attempt.retry_state.attempt_number
                        if attempts > 1:
                            if slot.is_set:  # an abandoned attempt delivered meanwhile
                                return
                            self._retries += 1
                            failed = await self._attempt(item, slot)
                        if failed is not None:
                            # retry_on is the user's code: run it off the event loop, so that a
                            # slow one stalls neither other batches nor closing. It stays False
                            # if retry_on raises (that error is then the batch's).
                            retryable = False
                            retryable = await anyio.to_thread.run_sync(
                                self._judge, failed, abandon_on_cancel=True
                            )
                            raise failed
                return
            except Exception as exc:  # not retryable, or the attempts ran out
                error = exc
        if not slot.is_set:
            failure = FetchError(item, attempts)
            failure.__cause__ = error
            self._fail(slot, failure)

    def _judge(self, error: Exception) -> bool:
        """Runs in a worker thread (joined by close() like the fetches'): ``retry_on``."""
        with self._lock:
            self._threads.add(threading.current_thread())
        return self._retry.is_retryable(error)  # type: ignore[union-attr]

    def _fetch_into(self, item: T, slot: _Slot, timer: _Timer | None) -> Exception | None:
        """Runs in a worker thread: fetch, then process and hand the result straight to the
        consumer. Returns the fetch's exception (for the loop to retry or report), else ``None``."""
        with self._lock:
            if self._closing:
                return None  # _fill's finally marks the slot closed
            self._threads.add(threading.current_thread())
        try:
            raw = self._fetch(item)
        except Exception as exc:
            return exc
        except BaseException as exc:  # SystemExit or KeyboardInterrupt: re-raised by get()
            self._fail(slot, exc)
            return None
        if timer is not None:
            timer.stop()
        try:
            value = raw if self._process is None else self._process(item, raw)
        except BaseException as exc:  # never retried: re-raised by get(), unchanged
            self._fail(slot, exc)
        else:
            if slot.finish(value=value):
                with self._lock:
                    self._completed += slot.units
        return None

    def _fail(self, slot: _Slot, error: BaseException) -> None:
        # A late duplicate's failure, after the slot was served, is moot.
        if slot.finish(error=error):
            self._failed = True

    def stop_fetching(self) -> None:
        """Start no new fetch from now on (fetches already running carry on)."""
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
            StopIteration: the plan is exhausted (or the producer was cancelled) and every result
                was delivered.
            PrefetcherClosed: the item's fetch was cancelled by closing.
            RuntimeError: the producer itself crashed (a bug); the crash is ``__cause__``.
            FetchError: the item's ``fetch`` failed for good; its last error is ``__cause__``.
            BaseException: whatever ``process`` raised for this item (or a ``fetch`` raised that
                is not an ``Exception``), unchanged.
        """
        try:
            slot = self._ready.get_nowait()
        except queue.Empty:
            self._flush()  # about to wait: the producer must have every token given back
            slot = self._ready.get()
        if slot is _END:
            self._ready.put(_END)
            if self._crash is not None:
                raise RuntimeError("the prefetch producer crashed") from self._crash
            raise StopIteration
        if not slot.is_set:
            self._flush()  # about to wait, as above
            slot.wait()
        if release:
            self.release(1)
        if isinstance(slot.error, PrefetcherClosed):
            if not self._closing:  # nobody closed us: the producer ended; wait for its verdict
                self._finished.wait(CLOSE_TIMEOUT_S)
            if self._crash is not None:
                raise RuntimeError("the prefetch producer crashed") from self._crash
        if slot.error is not None:
            raise slot.error
        return slot.value  # type: ignore[no-any-return]

    def release(self, units: int) -> None:
        """Give back the readahead tokens of ``units`` more units of received items (an item of
        several units gives back one when :meth:`get` returns it, the rest as the consumer hands
        them on). Call it from the consumer thread.

        Tokens reach the producer in bunches as large as its largest item (it cannot start one
        with fewer), and all of them before :meth:`get` waits: each trip wakes the event-loop
        thread, and with it a GIL hand-over that cost the consumer ~0.2 ms per call here.
        """
        self._received += units
        self._owed += units
        if self._owed >= self._largest:
            self._flush()

    def _flush(self) -> None:
        owed, self._owed = self._owed, 0
        if owed:
            self._give_back(owed)

    def _give_back(self, units: int) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody needs the token
            self._loop.call_soon_threadsafe(self._repay, units)  # type: ignore[union-attr]

    def _repay(self, units: int) -> None:
        """On the loop: tokens go back to the producer, first repaying a shrink's debt."""
        paid = min(units, self._debt)
        self._debt -= paid
        for _ in range(units - paid):
            self._tokens.release()

    def resize(self, readahead: int, max_in_flight: int) -> None:
        """Change the readahead and in-flight bounds of a running prefetcher (thread-safe).

        Growing takes effect at once. Shrinking ``readahead`` keeps every item already started:
        the tokens given back are withheld until the new bound holds. ``readahead`` must stay at
        least the largest item ``size``.

        Raises:
            TypeError, ValueError: from :func:`check_depths`.
        """
        readahead, max_in_flight = check_depths(readahead, max_in_flight)
        if readahead < self._largest:
            raise ValueError(
                f"readahead should stay >= the largest item's size ({self._largest} units), but "
                f"got readahead={readahead}"
            )
        loop = self._loop
        if loop is None:  # not running yet: the new bounds apply from the start
            self._readahead, self._max_in_flight = readahead, max_in_flight
            return
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(self._resize, readahead, max_in_flight)

    def _resize(self, readahead: int, max_in_flight: int) -> None:
        if self._limiter is not None:
            self._limiter.total_tokens = max_in_flight
        change, self._readahead = readahead - self._readahead, readahead
        self._max_in_flight = max_in_flight
        if change < 0:
            self._debt -= change
        else:
            self._repay(change)

    def statistics(self) -> PrefetchStatistics:
        """A :class:`PrefetchStatistics` snapshot (safe from any thread)."""
        limiter = self._limiter
        return PrefetchStatistics(
            held=self._started - self._received,
            in_flight=0 if limiter is None else int(limiter.borrowed_tokens),
            received=self._received,
            retries=self._retries,
            ready=max(self._completed - self._received, 0),
            readahead=self._readahead,
            max_in_flight=self._max_in_flight,
        )


class BlockingPrefetcher(Iterator[R]):
    """A :class:`Prefetcher` on a background event loop, drained synchronously with ``next()``.

    The event loop runs in a daemon thread named :data:`THREAD_NAME`, started by this constructor in
    the calling process (so never inherited through ``fork``) and stopped by :meth:`close`.

    Args:
        items, fetch, process, readahead, max_in_flight, retry, size: as for
            :class:`Prefetcher`.
        close_timeout_s (float, optional): how long :meth:`close` waits for the threads that ran
            fetches to return and exit, in seconds. Default: :data:`CLOSE_TIMEOUT_S` (5 s).

    Errors:
        ``next()`` raises what :meth:`Prefetcher.get` raises for a failed item (a
        :class:`FetchError`, or ``process``'s own error) and closes the iterator. ``KeyboardInterrupt``
        (or any exception) raised while ``next()`` waits closes the iterator too.

    Cancellation handling:
        :meth:`close` (also run when the iterator is exhausted, fails, is garbage collected, or the
        interpreter exits) cancels the producer and every fetch not yet started and joins the
        event-loop thread. A fetch already running cannot be interrupted (a Lance ``take``); its
        result is dropped. An explicit ``close()`` then waits up to ``close_timeout_s`` for such
        fetches to return and their threads to exit, and abandons the rest with a logged warning;
        the other ways leave them to finish in the background, so an error or ``Ctrl-C`` reaches
        the caller at once. Whatever is still running at interpreter exit is waited for there, at
        most :data:`CLOSE_TIMEOUT_S` in all (a thread frozen inside a Lance call by finalization
        aborts the process). Idempotent.
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
        close_timeout_s: float = CLOSE_TIMEOUT_S,
    ) -> None:
        self._prefetcher: Prefetcher[T, R] = Prefetcher(
            items,
            fetch,
            process=process,
            readahead=readahead,
            max_in_flight=max_in_flight,
            retry=retry,
            size=size,
        )
        self._close_timeout_s = close_timeout_s
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._stack: contextlib.ExitStack | None = None
        # A Ctrl-C while the portal starts would leave its loop thread running unowned: deliver it
        # once this iterator is whole and registered (then garbage collection closes it).
        with sigint_deferred(), contextlib.ExitStack() as stack:
            portal = stack.enter_context(
                anyio.from_thread.start_blocking_portal("asyncio", name=THREAD_NAME)
            )
            producer = portal.start_task_soon(self._prefetcher.run)
            stack.callback(producer.cancel)  # runs before the portal stops
            self._stack = stack.pop_all()
            _live.add(self)

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
        """Cancel pending fetches and stop the event-loop thread; then wait for running fetches.

        Args:
            wait (bool, optional): ``True``: wait up to ``close_timeout_s`` for the fetches still
                running in worker threads to return and their threads to exit. ``False``: leave
                them to finish in the background; they are waited for at interpreter exit (at
                most :data:`CLOSE_TIMEOUT_S`). Default: ``True``. Exhaustion, an error,
                ``KeyboardInterrupt`` and garbage collection close with ``wait=False``, so none of
                them blocks on a stuck read.

        Safe to call more than once (a later ``close()`` still waits for what an earlier
        ``close(wait=False)`` left running), and from another thread than the consumer's.
        """
        with self._lock:
            stack, self._stack = self._stack, None
        if stack is not None:
            _live.discard(self)
            if os.getpid() != self._pid:
                # A forked copy: its threads stayed in the parent. Unwinding the portal's context
                # manager here would wait for a loop that does not exist, so keep it, never
                # unwound.
                _forked_leftovers.append(stack)
                return
            self._prefetcher.stop_fetching()  # no thread starts a fetch from now on
            # The worker threads exit once their call returns; one that ran a Lance take must end
            # normally, not be frozen by interpreter shutdown, or the process aborts at exit. Hand
            # them to the exit hook first, so that an interrupted wait below loses none.
            _abandon(self._running_threads(), time.monotonic() + self._close_timeout_s)
            with sigint_deferred():  # a Ctrl-C here is raised once the loop thread is joined
                stack.close()  # cancels the producer, joins the event-loop thread
        elif os.getpid() != self._pid:
            return
        others = self._running_threads()
        if not wait:
            _abandon(others, time.monotonic() + self._close_timeout_s)
            return
        if not _join(others, self._close_timeout_s):
            _abandon(others, time.monotonic())  # waited for already: not again at exit
            _logger.warning(
                "a fetch was still running %.1f s after close(); it was abandoned and finishes "
                "in the background",
                self._close_timeout_s,
            )

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


def _join(threads: Iterable[threading.Thread], timeout: float) -> bool:
    """Join ``threads`` for at most ``timeout`` seconds in all; whether they all ended."""
    deadline = time.monotonic() + timeout
    threads = list(threads)
    for thread in threads:
        thread.join(max(deadline - time.monotonic(), 0.0))
    return not any(thread.is_alive() for thread in threads)


_live: weakref.WeakSet[BlockingPrefetcher[Any]] = weakref.WeakSet()
_forked_leftovers: list[contextlib.ExitStack] = []
# Worker threads still running a fetch when their iterator closed without waiting (weak: a
# finished thread drops out). Joined at exit.
_finishing: weakref.WeakKeyDictionary[threading.Thread, float] = weakref.WeakKeyDictionary()


def _abandon(threads: Iterable[threading.Thread], deadline: float) -> None:
    """Leave ``threads`` to finish in the background; at exit, wait for them until ``deadline``
    (a ``time.monotonic()`` time; the earliest one given for a thread counts)."""
    for thread in threads:
        _finishing[thread] = min(deadline, _finishing.get(thread, deadline))


@atexit.register
def _close_live_prefetchers() -> None:
    """At exit, close every live iterator and wait for the fetches still running, while their
    threads can still end normally: each until :data:`CLOSE_TIMEOUT_S` after it was left running
    (not again for one that ``close()`` already waited for). If one is still inside a native call
    (a Lance ``take``) after that, or still running after it made one, or a second ``Ctrl-C`` cuts
    the wait short, the process ends at once (:func:`~lance_prefetch._exit_guard.exit_if_stuck`):
    finalizing under it would abort. No read starts after this hook."""
    for prefetcher in list(_live):
        prefetcher.close(wait=False)
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
            CLOSE_TIMEOUT_S,
        )
