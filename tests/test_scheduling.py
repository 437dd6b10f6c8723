"""Tests for the producer and the blocking wrapper (lance_prefetch.schedule._prefetcher, _blocking) with fake fetch functions (no Lance, no torch)."""

from __future__ import annotations

import gc
import logging
import threading
import time

import anyio
import anyio.to_thread
import pytest
from support.helpers import child_exit_code, collect_until, loop_threads, wait_until

from lance_prefetch.lifecycle import _shutdown
from lance_prefetch.lifecycle._shutdown import EXIT_WAIT_S
from lance_prefetch.schedule import _slots
from lance_prefetch.schedule._blocking import BlockingPrefetcher
from lance_prefetch.schedule._prefetcher import FetchError, Prefetcher


class FakeFetch:
    """A fetch that records how many items are held (started, not yet received) at each start.

    ``delays`` maps an item to seconds to sleep; ``fail`` is an item whose fetch raises.
    """

    def __init__(self, delays=None, fail=None):
        self.delays = delays or {}
        self.fail = fail
        self.lock = threading.Condition()  # notified as each fetch starts and ends
        self.items = []  # the items whose fetch started, in the order they started
        self.prefetcher = None  # set to read how many items the consumer received
        self.running = 0
        self.max_held = 0
        self.max_running = 0

    def __call__(self, item):
        with self.lock:
            self.items.append(item)
            self.running += 1
            received = 0 if self.prefetcher is None else self.prefetcher.statistics().received
            self.max_held = max(self.max_held, self.started - received)
            self.max_running = max(self.max_running, self.running)
            self.lock.notify_all()
        try:
            time.sleep(self.delays.get(item, 0.0))
            if item == self.fail:
                raise KeyError(f"no item {item}")
            return item * 10
        finally:
            with self.lock:
                self.running -= 1
                self.lock.notify_all()

    @property
    def started(self) -> int:
        """How many fetches started."""
        return len(self.items)

    def wait_for(self, predicate, timeout: float = 5.0) -> bool:
        """Whether ``predicate()`` (read under the lock) holds, waiting up to ``timeout`` s."""
        with self.lock:
            return self.lock.wait_for(predicate, timeout)

    def consume(self, iterator):
        """Drain ``iterator``; held counts use its own received count, taken before a slot frees."""
        self.prefetcher = iterator
        return list(iterator)


def test_results_come_in_plan_order_when_fetches_finish_out_of_order():
    """Item 0 is the slowest, item 5 slower than its neighbours: order still 0, 1, 2, ..."""
    fetch = FakeFetch(delays={i: 0.05 for i in range(12)} | {0: 0.3, 5: 0.15})
    iterator = BlockingPrefetcher(Prefetcher(range(12), fetch, readahead=6, max_in_flight=4))
    assert fetch.consume(iterator) == [i * 10 for i in range(12)]
    assert fetch.max_running == 4


@pytest.mark.parametrize("readahead,max_in_flight", [(1, 1), (2, 1), (5, 4), (200, 4)])
def test_every_item_once_for_any_depth(readahead, max_in_flight):
    fetch = FakeFetch()
    iterator = BlockingPrefetcher(
        Prefetcher(range(101), fetch, readahead=readahead, max_in_flight=max_in_flight)
    )
    assert fetch.consume(iterator) == [i * 10 for i in range(101)]
    assert fetch.started == 101
    assert fetch.max_held <= readahead and fetch.max_running <= max_in_flight


def test_readahead_bounds_held_items_while_one_fetch_stalls():
    """With item 3 stalled for 1 s and readahead 4, never more than 4 items are held."""
    fetch = FakeFetch(delays={3: 1.0})
    iterator = BlockingPrefetcher(Prefetcher(range(20), fetch, readahead=4, max_in_flight=4))
    fetch.prefetcher = iterator
    seen_held = []
    out = []
    for value in iterator:
        seen_held.append(iterator.statistics().held)
        out.append(value)
        time.sleep(0.01)
    assert out == [i * 10 for i in range(20)]
    assert fetch.max_held == 4  # reached, never exceeded
    assert max(seen_held) <= 4


def test_the_error_of_a_fetch_surfaces_in_order_and_stops_the_producer():
    fetch = FakeFetch(fail=2)
    iterator = BlockingPrefetcher(Prefetcher(range(100), fetch, readahead=4, max_in_flight=2))
    assert next(iterator) == 0
    assert next(iterator) == 10
    with pytest.raises(FetchError) as caught:
        next(iterator)
    assert (caught.value.item, caught.value.attempts) == (2, 1)
    assert isinstance(caught.value.__cause__, KeyError)
    assert str(caught.value.__cause__) == "'no item 2'"
    assert iterator.closed
    assert fetch.started <= 2 + 4  # nothing started after the failure was seen
    assert wait_until(lambda: not loop_threads())
    with pytest.raises(StopIteration):
        next(iterator)


def test_a_broken_plan_raises_instead_of_ending_quietly():
    def plan():
        yield 0
        yield 1
        raise ValueError("plan broke")

    iterator = BlockingPrefetcher(Prefetcher(plan(), FakeFetch(), readahead=3, max_in_flight=1))
    assert [next(iterator), next(iterator)] == [0, 10]
    with pytest.raises(ValueError, match="plan broke"):
        next(iterator)


def test_close_waits_for_running_fetches_and_their_threads():
    """After close() no fetch is running and every thread that ran one has exited."""
    fetch = FakeFetch(delays={i: 0.2 for i in range(10)})
    iterator = BlockingPrefetcher(Prefetcher(range(10), fetch, readahead=4, max_in_flight=3))
    assert next(iterator) == 0
    iterator.close()
    assert fetch.running == 0
    assert not any(t.is_alive() for t in iterator._prefetcher.threads())
    assert iterator.closed and not loop_threads()


def test_close_waits_at_most_close_wait_s_for_a_stuck_fetch_then_leaves_it_to_the_exit(caplog):
    """A fetch stuck for 2 s: close() returns after close_wait_s (0.3 s here), logs it at DEBUG
    only (no warning), hands the stuck thread to the exit hook with a deadline EXIT_WAIT_S after
    the close began, and drops the fetch's result unprocessed when it returns."""
    processed = []
    fetch = FakeFetch(delays={1: 2.0})
    prefetcher = Prefetcher(
        range(10),
        fetch,
        process=lambda item, raw: processed.append(item) or raw,
        readahead=4,
        max_in_flight=2,
    )
    iterator = BlockingPrefetcher(prefetcher, close_wait_s=0.3)
    assert next(iterator) == 0
    # Fetches start in any order (item 2's may start before item 1's): wait until item 1's has
    # started and is the only one running.
    assert fetch.wait_for(lambda: 1 in fetch.items and fetch.running == 1)
    caplog.set_level(logging.DEBUG, logger="lance_prefetch.scheduling")
    before = time.monotonic()
    iterator.close()
    elapsed = time.monotonic() - before
    assert 0.29 < elapsed < 0.3 + 0.5, elapsed
    assert iterator.closed and not loop_threads()
    stuck = [t for t in prefetcher.threads() if t.is_alive()]
    assert len(stuck) == 1
    assert before + EXIT_WAIT_S <= _shutdown._finishing[stuck[0]] <= before + elapsed + EXIT_WAIT_S
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        (
            "DEBUG",
            "1 fetch(es) still running at close(); left to finish in the background (their "
            "results are dropped; waited for at exit)",
        )
    ]
    stuck[0].join(5)
    assert not stuck[0].is_alive()
    assert 1 not in processed and fetch.running == 0  # item 1 was read, but not processed
    iterator.close()  # idempotent


def test_garbage_collection_after_break_stops_the_thread():
    def run():
        for value in BlockingPrefetcher(
            Prefetcher(range(1000), FakeFetch(), readahead=8, max_in_flight=2)
        ):
            if value == 30:
                break

    run()
    assert collect_until(lambda: not loop_threads())


def test_close_from_another_thread_ends_a_waiting_consumer():
    """Item 0's fetch takes 5 s; once it has started, another thread closes: the consumer's
    wait ends at once, with nothing received."""
    fetch = FakeFetch(delays={0: 5.0})
    iterator = BlockingPrefetcher(Prefetcher(range(5), fetch, readahead=2, max_in_flight=1))

    def close_once_reading():
        if fetch.wait_for(lambda: fetch.started == 1):
            iterator.close()

    closer = threading.Thread(target=close_once_reading)
    before = time.monotonic()
    closer.start()
    assert list(iterator) == []
    assert time.monotonic() - before < 2.0  # not the 5 s of the fetch
    closer.join(5)


def test_a_close_from_another_thread_is_not_the_end_of_the_plan():
    """The producer cancelled by close() ends a waiting next() with StopIteration, but the
    iterator does not count as exhausted (its plan had 99 items left): a checkpoint must not save
    the share as finished."""
    iterator = BlockingPrefetcher(Prefetcher(range(100), FakeFetch(), readahead=1, max_in_flight=1))
    assert iterator.get(release=False) == 0  # its token held: the producer waits for it
    threading.Timer(0.2, iterator.close).start()
    with pytest.raises(StopIteration):
        next(iterator)
    assert not iterator.exhausted
    finished = BlockingPrefetcher(Prefetcher(range(3), FakeFetch(), readahead=2, max_in_flight=1))
    assert list(finished) == [0, 10, 20] and finished.exhausted


def test_bad_depths():
    with pytest.raises(ValueError, match=r"^max_in_flight should be <= readahead, but got max_in"):
        Prefetcher(range(3), FakeFetch(), readahead=2, max_in_flight=3)
    with pytest.raises(
        ValueError, match=r"^readahead should be an integer >= 1, but got readahead=0$"
    ):
        Prefetcher(range(3), FakeFetch(), readahead=0, max_in_flight=1)


@pytest.mark.anyio
async def test_prefetcher_runs_inside_the_callers_task_group():
    """The producer is a plain anyio task; a consumer thread drains it in order."""
    fetch = FakeFetch(delays={0: 0.1})
    prefetcher = Prefetcher(range(10), fetch, readahead=3, max_in_flight=2)

    def drain():
        out = []
        while True:
            try:
                out.append(prefetcher.get())
            except StopIteration:
                return out

    async with anyio.create_task_group() as task_group:
        task_group.start_soon(prefetcher.run)
        out = await anyio.to_thread.run_sync(drain)
    assert out == [i * 10 for i in range(10)]
    assert prefetcher.statistics().received == 10


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.mark.filterwarnings("ignore:lance is not fork-safe")  # lance is imported by other tests
def test_a_forked_child_drops_its_inherited_copy_without_hanging():
    """A child forked while an iterator is live can drop (and close) its copy at once."""
    import os

    iterator = BlockingPrefetcher(Prefetcher(range(100), FakeFetch(), readahead=2, max_in_flight=1))
    next(iterator)
    pid = os.fork()
    if pid == 0:  # child: the event-loop thread does not exist here
        try:
            iterator.close()
            os._exit(0 if iterator.closed else 3)
        except BaseException:
            os._exit(4)
    assert child_exit_code(pid) == 0, "the forked child hung or failed closing its copy"
    assert next(iterator) == 10  # the parent's iterator is untouched
    iterator.close()


@pytest.mark.parametrize("error", [SystemExit(3), KeyboardInterrupt()])
def test_base_exceptions_in_fetch_surface_in_order(error):
    """A SystemExit or KeyboardInterrupt raised by a fetch is raised by next(), after the items
    before it; it never ends the stream quietly."""

    def fetch(item):
        if item == 10:
            raise error
        return item

    iterator = BlockingPrefetcher(Prefetcher(range(100), fetch, readahead=4, max_in_flight=2))
    received = []
    with pytest.raises(type(error)):
        for item in iterator:
            received.append(item)
    assert received == list(range(10))
    assert wait_until(lambda: not loop_threads())


@pytest.mark.filterwarnings("ignore:lance is not fork-safe")  # lance is imported by other tests
def test_a_forked_child_cannot_use_an_inherited_iterator():
    import os

    iterator = BlockingPrefetcher(Prefetcher(range(100), FakeFetch(), readahead=2, max_in_flight=1))
    next(iterator)
    pid = os.fork()
    if pid == 0:
        try:
            next(iterator)
            os._exit(3)
        except RuntimeError as exc:
            os._exit(0 if "copied into process" in str(exc) else 4)
        except BaseException:
            os._exit(5)
    assert child_exit_code(pid) == 0, "the forked child hung in next() or got another error"
    iterator.close()


def test_a_producer_cancelled_while_handing_out_an_item_finishes_every_slot():
    """The plan's iterator cancels the producer as it hands out item 3, whose fetch task is then
    created in a cancelled task group. Every queued slot is finished (get() would wait forever
    for an unfinished one): item 3's with PrefetcherClosed, and no fetch coroutine is left
    unawaited (a fetch task that never started is closed by the producer)."""
    import asyncio
    import warnings

    from lance_prefetch.schedule._prefetcher import PrefetcherClosed

    def plan():
        for item in range(10):
            if item == 3:
                asyncio.current_task().cancel()
            yield item

    prefetcher = Prefetcher(plan(), lambda item: item * 10, readahead=8, max_in_flight=2)

    async def main():
        with pytest.raises(asyncio.CancelledError):
            await prefetcher.run()

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        asyncio.run(main())
        gc.collect()
    assert [str(w.message) for w in caught if "never awaited" in str(w.message)] == []
    slots = []
    while (slot := prefetcher._ready.get_nowait()) is not _slots.END:
        slots.append(slot)
    assert len(slots) == 4 and all(slot.is_set for slot in slots)
    assert isinstance(slots[3].error, PrefetcherClosed)


def test_more_fetches_in_flight_than_anyios_default_thread_limit():
    """max_in_flight=64 runs 64 fetches at once: the prefetcher's limiter bounds them, not
    anyio's default limiter of 40 worker threads: each fetch waits until 64 are running (a
    limit below 64 breaks the barrier)."""
    active, peak, lock = [0], [0], threading.Lock()
    all_running = threading.Barrier(64)

    def fetch(item):
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        all_running.wait(timeout=10)
        with lock:
            active[0] -= 1
        return item

    iterator = BlockingPrefetcher(Prefetcher(range(128), fetch, readahead=64, max_in_flight=64))
    assert list(iterator) == list(range(128))
    assert peak[0] == 64
