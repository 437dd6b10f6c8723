"""Hedged takes: the policy and its budget (lance_prefetch.schedule._hedging), the prefetcher racing a late
fetch against its hedge (fake fetches, no Lance), and a loader whose ``take`` stalls for chosen
rows (a real local dataset)."""

from __future__ import annotations

import threading
import time
from collections import Counter

import numpy as np
import pytest
from support.helpers import loop_threads, wait_until
from support.sources import tapped

from lance_prefetch import HedgePolicy, PrefetchLoader, ReadOptions, RetryPolicy
from lance_prefetch.loader._config import LoaderConfig
from lance_prefetch.schedule._blocking import BlockingPrefetcher
from lance_prefetch.schedule._hedging import BURST, Hedger, resolve_hedge
from lance_prefetch.schedule._prefetcher import Prefetcher

#: Hedges as soon as a take runs past 3x the median of the latest ones (after 5 of them).
EAGER = HedgePolicy(percentile=95.0, min_slowdown=3.0, budget=1.0, min_samples=5)


class Stalling:
    """A fetch of ``delay`` seconds returning ``item * 10``, whose first call for each item of
    ``stall`` blocks until :attr:`release` is set (a stuck request); later calls are quick."""

    def __init__(self, stall: set[int], delay: float = 0.01) -> None:
        self.stall, self.delay = stall, delay
        self.calls: Counter[int] = Counter()
        self.release = threading.Event()
        self.stalled = threading.Event()  # set as the first stalled call begins
        self.late: list[int] = []  # stalled calls that returned, after release
        self._lock = threading.Condition()  # notified as a stalled call returns

    def wait_for_late(self, items: list[int], timeout: float = 5.0) -> bool:
        """Whether the stalled calls of exactly ``items`` returned, waiting up to ``timeout`` s."""
        with self._lock:
            return self._lock.wait_for(lambda: sorted(self.late) == items, timeout)

    def __call__(self, item: int) -> int:
        with self._lock:
            self.calls[item] += 1
            first = self.calls[item] == 1
        if first and item in self.stall:
            self.stalled.set()
            self.release.wait(10.0)
            with self._lock:
                self.late.append(item)
                self._lock.notify_all()
        else:
            time.sleep(self.delay)
        return item * 10


def run_prefetcher(fetch, items, *, hedge, retry=None, max_in_flight=2):
    processed: Counter[int] = Counter()

    def process(item, value):
        processed[item] += 1
        return value

    prefetcher = Prefetcher(
        items,
        fetch,
        process=process,
        readahead=4,
        max_in_flight=max_in_flight,
        retry=retry,
        hedge=hedge,
    )
    iterator = BlockingPrefetcher(prefetcher)
    return iterator, prefetcher, processed


def test_a_stalled_fetch_is_hedged_the_hedge_wins_and_the_late_result_is_dropped():
    fetch = Stalling(stall={12, 25})
    iterator, prefetcher, processed = run_prefetcher(fetch, range(30), hedge=EAGER)
    assert list(iterator) == [i * 10 for i in range(30)]  # every item once, in plan order
    statistics = prefetcher.statistics()
    assert statistics.hedges_won >= 2  # the stalled two (a quick one's hedge may win a race too)
    assert 2 <= statistics.hedges <= 30  # a quick fetch may be hedged too; budget=1
    assert fetch.calls[12] == 2 and fetch.calls[25] == 2
    fetch.release.set()  # the stalled takes return now: their results must go nowhere
    assert fetch.wait_for_late([12, 25])
    iterator.close()
    assert processed == Counter(range(30))  # the losers were never converted
    assert not loop_threads()
    assert not [t for t in prefetcher.threads() if t.is_alive()]


def test_no_hedge_before_min_samples_and_none_without_a_policy():
    fetch = Stalling(stall={2})
    iterator, prefetcher, _ = run_prefetcher(fetch, range(4), hedge=EAGER)
    assert next(iterator) == 0 and next(iterator) == 10
    assert fetch.stalled.wait(5)  # item 2 stalls; only 2 durations are known (5 needed)
    time.sleep(0.3)  # 10x the hedge delay EAGER would use: no hedge comes in this window
    assert prefetcher.statistics().hedges == 0 and fetch.calls[2] == 1
    fetch.release.set()
    assert list(iterator) == [20, 30]
    assert prefetcher.statistics().hedges == 0

    fetch = Stalling(stall={20})
    fetch.release.set()
    iterator, prefetcher, _ = run_prefetcher(fetch, range(30), hedge=None)
    assert list(iterator) == [i * 10 for i in range(30)]
    assert (prefetcher.statistics().hedges, max(fetch.calls.values())) == (0, 1)


def test_hedges_never_exceed_the_budget():
    """budget=0.05: with every fetch stalled past the delay, at most 5% of takes get a hedge."""
    policy = HedgePolicy(percentile=50.0, min_slowdown=1.0, budget=0.05, min_samples=2)
    slow = {i for i in range(200) if i % 2}  # every other take 10x slower than the rest

    def sometimes_slow(item):
        time.sleep(0.02 if item in slow else 0.002)
        return item * 10

    iterator, prefetcher, _ = run_prefetcher(
        sometimes_slow, range(200), hedge=policy, max_in_flight=4
    )
    assert list(iterator) == [i * 10 for i in range(200)]
    statistics = prefetcher.statistics()
    assert 1 <= statistics.hedges <= 200 * 0.05
    iterator.close()


def test_the_bucket_holds_hedges_to_budget_times_takes_started():
    hedger = Hedger(HedgePolicy(budget=0.05, min_samples=2))
    rng = np.random.default_rng(0)
    for _ in range(1000):
        hedger.start()
        if rng.random() < 0.5:
            hedger.spend()
        assert hedger.issued <= 0.05 * hedger.started + 1e-9
    assert hedger.issued == 50
    hedger = Hedger(HedgePolicy(budget=1.0))
    for _ in range(10):  # idle takes fill the bucket to BURST tokens, no more
        hedger.start()
    assert [hedger.spend() for _ in range(3)] == [True] * int(BURST) + [False]


def test_the_delay_is_the_percentile_or_the_median_multiple_whichever_is_later():
    hedger = Hedger(HedgePolicy(percentile=90.0, min_slowdown=2.0, min_samples=10))
    for seconds in [0.1] * 9:
        hedger.observe(seconds)
    assert hedger.delay() is None  # 9 of 10 samples
    hedger.observe(0.1)
    assert hedger.delay() == pytest.approx(0.2)  # p90 = 0.1 < 2 x median
    for seconds in [1.0] * 10:
        hedger.observe(seconds)
    assert hedger.delay() == pytest.approx(1.1)  # median 0.55, p90 1.0 -> max(1.0, 1.1)
    for seconds in [0.1] * 10 + [1.0] * 5:
        hedger.observe(seconds)
    # 35 samples: 20 at 0.1, 15 at 1.0; median 0.1, p90 1.0
    assert hedger.delay() == pytest.approx(1.0)


def test_only_the_largest_takes_set_the_delay():
    """An iteration's ramp (takes of 1, 2, 4 batches) and its smaller last take are left out of
    the window: the delay is that of its full takes only."""
    hedger = Hedger(HedgePolicy(percentile=90.0, min_slowdown=2.0, min_samples=3))
    for units, seconds in [(1, 0.01), (2, 0.02), (4, 0.04), (4, 0.05)]:
        hedger.observe(seconds, units)
    assert hedger.delay() is None  # two takes of 4 batches so far
    hedger.observe(0.06, 4)
    hedger.observe(0.001, 3)  # the last, smaller take of the epoch
    assert hedger.delay() == pytest.approx(0.1)  # 2 x the median of 0.04, 0.05, 0.06


def test_a_hedge_that_fails_leaves_the_take_to_finish():
    """The hedge of a stalled take raises; the take's own result is still used."""
    calls: Counter[int] = Counter()
    release = threading.Event()

    def fetch(item):
        calls[item] += 1
        if item == 10:
            if calls[item] == 1:
                release.wait(0.5)  # late, but it returns
                return 100
            raise OSError("503 Slow Down")
        time.sleep(0.005)
        return item * 10

    iterator, prefetcher, _ = run_prefetcher(
        fetch, range(12), hedge=EAGER, retry=RetryPolicy(attempts=1)
    )
    assert list(iterator) == [i * 10 for i in range(12)]
    assert (prefetcher.statistics().hedges_won, calls[10]) == (0, 2)
    assert prefetcher.statistics().hedges >= 1


def test_hedging_with_a_timeout_keeps_the_first_result():
    fetch = Stalling(stall={15})
    retry = RetryPolicy(attempts=2, timeout=5.0, backoff=0.01, max_backoff=0.02)
    iterator, prefetcher, processed = run_prefetcher(fetch, range(20), hedge=EAGER, retry=retry)
    assert list(iterator) == [i * 10 for i in range(20)]
    assert prefetcher.statistics().hedges_won >= 1 and prefetcher.statistics().retries == 0
    fetch.release.set()
    iterator.close()
    assert processed == Counter(range(20))


def test_a_loader_whose_take_stalls_for_chosen_rows_delivers_exact_batches(ids_1003):
    reference = [
        b["id"].tolist()
        for b in PrefetchLoader(
            ids_1003, 10, columns=["id"], read=ReadOptions(hedge=None, coalesce=1)
        )
    ]
    stalled_rows = {reference[30][0], reference[70][0]}  # the first row of batches 30 and 70
    release = threading.Event()
    calls: Counter[int] = Counter()

    def take(read, indices):
        first = int(indices[0])
        calls[first] += 1
        if first in stalled_rows and calls[first] == 1:
            release.wait(10.0)
        return read(indices)

    with tapped(take=take):
        loader = PrefetchLoader(
            ids_1003,
            10,
            columns=["id"],
            readahead=4,
            read=ReadOptions(coalesce=1, max_in_flight=2, hedge=EAGER),
        )
    with iter(loader) as iterator:
        ids = [b["id"].tolist() for b in iterator]
        stats = loader.stats()
        release.set()
    assert ids == reference  # same rows, same order, each batch once
    assert sorted(np.concatenate(ids).tolist()) == sorted(np.concatenate(reference).tolist())
    assert stats.hedges_won >= 2 and stats.hedges >= stats.hedges_won
    assert stats.batches == len(reference) and stats.rows == sum(map(len, reference))
    assert wait_until(lambda: not loop_threads())


def test_auto_hedges_on_object_stores_only():
    assert resolve_hedge("auto", remote=True) == HedgePolicy()
    assert resolve_hedge("auto", remote=False) is None
    assert resolve_hedge(None, remote=True) is None
    assert resolve_hedge(EAGER, remote=False) is EAGER
    config = LoaderConfig(batch_size=4)
    assert config.resolve(row_bytes=8, num_rows=100, uri="s3://bucket/a.lance").hedge == (
        HedgePolicy()
    )
    assert config.resolve(row_bytes=8, num_rows=100, uri="/data/a.lance").hedge is None
    assert config.resolve(row_bytes=8, num_rows=100, uri="file+uring:///a.lance").hedge is None
    assert config.resolve(row_bytes=8, num_rows=100, uri="/a.lance + gs://b/c.lance").hedge == (
        HedgePolicy()
    )


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        (
            {"percentile": 40},
            ValueError,
            "percentile should be in [50, 100), but got percentile=40",
        ),
        ({"percentile": 100}, ValueError, "percentile should be in [50, 100)"),
        ({"percentile": "95"}, TypeError, "percentile should be a number, but got percentile='95'"),
        (
            {"min_slowdown": 0.5},
            ValueError,
            "min_slowdown should be >= 1, but got min_slowdown=0.5",
        ),
        ({"budget": 0}, ValueError, "budget should be in (0, 1], but got budget=0"),
        ({"budget": 1.5}, ValueError, "budget should be in (0, 1]"),
        ({"budget": float("nan")}, ValueError, "budget should be in (0, 1]"),
        ({"budget": True}, TypeError, "budget should be a number"),
        ({"min_samples": 1}, ValueError, "min_samples"),
    ],
)
def test_policy_errors_name_the_field(options, error, message):
    with pytest.raises(error) as info:
        HedgePolicy(**options)
    assert message in str(info.value)


@pytest.mark.parametrize("hedge", [True, False, "on", 0.05])
def test_a_wrong_hedge_is_refused_before_any_io(hedge):
    with pytest.raises(TypeError) as info:
        ReadOptions(hedge=hedge)
    assert str(info.value) == (
        f"hedge should be 'auto' (hedged takes on object stores), None (never) or a "
        f"lance_prefetch.HedgePolicy, but got hedge={hedge!r}; e.g. hedge=HedgePolicy() to hedge "
        f"on local files too, or hedge=None to turn it off"
    )


def test_close_while_the_hedged_take_is_still_stuck_returns_promptly_and_leaves_no_thread():
    fetch = Stalling(stall={20})
    iterator, prefetcher, processed = run_prefetcher(fetch, range(40), hedge=EAGER)
    assert [next(iterator) for _ in range(25)] == [i * 10 for i in range(25)]  # 20 via its hedge
    assert fetch.calls[20] == 2 and not fetch.late  # the first take of item 20 is still stuck
    started = time.monotonic()
    iterator.close()
    assert time.monotonic() - started < 1.0
    assert not loop_threads()
    fetch.release.set()
    assert wait_until(lambda: not [t for t in prefetcher.threads() if t.is_alive()])
    assert fetch.late == [20] and processed[20] == 1


def test_a_take_that_loses_to_one_still_converting_waits_for_its_result():
    """Item 8's take returns as its hedge starts and converts slowly; the hedge returns meanwhile
    and finds the item claimed: the item still arrives (not a closed slot)."""
    hedge_started, converting = threading.Event(), threading.Event()
    calls: Counter[int] = Counter()

    def fetch(item):
        calls[item] += 1
        if item == 8 and calls[item] == 1:
            hedge_started.wait(5.0)  # late until its hedge starts, then back at once
        elif item == 8:
            hedge_started.set()
            converting.wait(5.0)  # back once the take's rows are converting
        else:
            time.sleep(0.01)
        return item * 10

    def process(item, value):
        if item == 8:
            converting.set()
            time.sleep(0.3)  # a slow conversion: the hedge returns during it
        return value

    prefetcher = Prefetcher(
        range(12), fetch, process=process, readahead=4, max_in_flight=2, hedge=EAGER
    )
    assert list(BlockingPrefetcher(prefetcher)) == [i * 10 for i in range(12)]
    assert calls[8] == 2 and prefetcher.statistics().hedges_won == 0
