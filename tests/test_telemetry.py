"""loader.stats() and log_every_s: exact counts, rates on a fake clock, waiting measured where it
happens, live queue and in-flight counts, and the logging option."""

from __future__ import annotations

import json
import logging
import math
import threading
import time

import numpy as np
import pytest
from support.helpers import expected_rank_ids

from lance_prefetch import LoaderStats, PrefetchLoader, ReadOptions
from lance_prefetch.loader._telemetry import LATENCIES, Telemetry
from lance_prefetch.schedule._prefetcher import PrefetchStatistics


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_rates_over_the_window_and_in_total_on_a_fake_clock():
    clock = Clock()
    telemetry = Telemetry(3, window_s=10.0, clock=clock)
    running = PrefetchStatistics(
        held=3,
        in_flight=1,
        received=7,
        retries=5,
        ready=2,
        readahead=8,
        max_in_flight=4,
        hedges=3,
        hedges_won=1,
    )
    telemetry.attach(lambda: running)
    # 20 s: one 100-row batch a second, each after waiting 0.25 s; each take 1 MiB in 40 ms
    for _ in range(20):
        clock.now += 1.0
        telemetry.record_take(0.040, 1 << 20)
        telemetry.record_batch(100, 0.25)
    stats = telemetry.snapshot()
    assert (stats.epoch, stats.worker_id, stats.batches, stats.rows) == (3, None, 20, 2000)
    assert stats.elapsed_s == pytest.approx(20.0)
    assert stats.rows_per_s_total == pytest.approx(100.0)
    assert stats.rows_per_s == pytest.approx(100.0)  # 10 batches in the last 10 s
    assert stats.mib_per_s == pytest.approx(1.0) and stats.mib_per_s_total == pytest.approx(1.0)
    assert stats.wait_fraction == pytest.approx(0.25)
    assert stats.wait_fraction_total == pytest.approx(0.25)
    assert (stats.queue_depth, stats.in_flight, stats.retries) == (2, 1, 5)
    assert (stats.readahead, stats.max_in_flight, stats.cache_hit_ratio) == (8, 4, None)
    assert (stats.hedges, stats.hedges_won) == (3, 1)
    assert "hedges 3 (1 won)" in str(stats)
    assert "take p50/p95/p99 40.0/40.0/40.0 ms" in str(stats)
    assert stats.take_ms_p50 == pytest.approx(40.0) and stats.take_ms_p99 == pytest.approx(40.0)

    # 5 quiet seconds: the window holds 5 batches, the total rate drops to 2000 / 25
    clock.now += 5.0
    stats = telemetry.snapshot()
    assert stats.rows_per_s == pytest.approx(50.0)
    assert stats.rows_per_s_total == pytest.approx(80.0)
    assert stats.wait_fraction == pytest.approx(0.125)

    telemetry.end()  # elapsed stops; counters are frozen with the last retries seen
    clock.now += 100.0
    stats = telemetry.snapshot()
    assert stats.elapsed_s == pytest.approx(25.0)
    assert (stats.queue_depth, stats.in_flight, stats.retries) == (0, 0, 5)
    assert (stats.hedges, stats.hedges_won) == (3, 1)  # frozen too


def test_a_wait_still_going_on_counts_up_to_now():
    clock = Clock()
    telemetry = Telemetry(0, window_s=10.0, clock=clock)
    clock.now += 2.0
    telemetry.record_batch(10, 0.0)
    telemetry.begin_wait()  # the loop waits from t=2 on
    clock.now += 6.0
    stats = telemetry.snapshot()
    assert stats.wait_fraction_total == pytest.approx(6.0 / 8.0)
    assert stats.wait_fraction == pytest.approx(6.0 / 8.0)  # the iteration is younger than 10 s
    clock.now += 12.0  # waiting for 18 s: the whole recent window
    stats = telemetry.snapshot()
    assert stats.wait_fraction == pytest.approx(1.0)
    assert stats.wait_fraction_total == pytest.approx(18.0 / 20.0)
    telemetry.record_batch(10, 18.0)
    assert telemetry.snapshot().wait_fraction_total == pytest.approx(18.0 / 20.0)


def test_latency_percentiles_cover_the_latest_takes():
    telemetry = Telemetry(0, clock=Clock())
    assert math.isnan(telemetry.snapshot().take_ms_p50)
    for ms in range(1, 101):  # 1..100 ms
        telemetry.record_take(ms / 1000, 0)
    stats = telemetry.snapshot()
    expected = np.percentile(np.arange(1, 101, dtype=float), [50, 95, 99])
    assert [stats.take_ms_p50, stats.take_ms_p95, stats.take_ms_p99] == pytest.approx(expected)
    for _ in range(LATENCIES):  # a full ring of 500 ms takes replaces them all
        telemetry.record_take(0.5, 0)
    assert telemetry.snapshot().take_ms_p50 == pytest.approx(500.0)


def test_a_gone_iteration_reports_nothing_queued():
    telemetry = Telemetry(0, clock=Clock())
    running = PrefetchStatistics(
        held=3,
        in_flight=2,
        received=5,
        retries=3,
        ready=1,
        readahead=8,
        max_in_flight=4,
        hedges=2,
        hedges_won=0,
    )
    telemetry.attach(lambda: running)
    stats = telemetry.snapshot()
    assert (stats.queue_depth, stats.in_flight, stats.retries) == (1, 2, 3)
    assert (stats.readahead, stats.max_in_flight, stats.hedges) == (8, 4, 2)
    telemetry.attach(lambda: None)  # the iteration was garbage collected
    stats = telemetry.snapshot()
    assert (stats.queue_depth, stats.in_flight, stats.retries) == (0, 0, 3)
    assert (stats.readahead, stats.max_in_flight) == (0, 0)
    assert (stats.hedges, stats.hedges_won) == (2, 0)


def test_stats_before_any_iteration_are_zeros(ids_1003):
    stats = PrefetchLoader(ids_1003, 100).stats()
    assert stats == LoaderStats()
    assert stats.epoch is None and stats.batches == 0 and math.isnan(stats.take_ms_p50)


def test_stats_after_an_epoch_count_every_batch_and_row(make_loader, ids_1003):
    loader = make_loader(ids_1003, 100, columns=["id", "vector"], drop_last=False, seed=4)
    loader.set_epoch(2)
    batches = [batch["id"].tolist() for batch in loader]
    assert batches == expected_rank_ids(loader)
    stats = loader.stats()
    assert (stats.epoch, stats.batches, stats.rows) == (2, 11, 1003)
    assert (stats.queue_depth, stats.in_flight, stats.retries) == (0, 0, 0)
    assert 0 < stats.take_ms_p50 <= stats.take_ms_p95 <= stats.take_ms_p99
    # Arrow bytes read: 8 (id) + 12 (3 x float32) per row
    assert stats.mib_per_s_total * stats.elapsed_s * (1 << 20) == pytest.approx(1003 * 20)
    assert stats.rows_per_s_total == pytest.approx(1003 / stats.elapsed_s)
    assert 0.0 <= stats.wait_fraction_total <= 1.0
    frozen = loader.stats()  # the iteration is over: nothing moves any more
    time.sleep(0.05)
    assert loader.stats() == frozen


KEYS = [
    "epoch",
    "worker_id",
    "batches",
    "rows",
    "elapsed_s",
    "rows_per_s",
    "rows_per_s_total",
    "mib_per_s",
    "mib_per_s_total",
    "wait_fraction",
    "wait_fraction_total",
    "queue_depth",
    "in_flight",
    "take_ms_p50",
    "take_ms_p95",
    "take_ms_p99",
    "retries",
    "hedges",
    "hedges_won",
    "cache_hit_ratio",
    "readahead",
    "max_in_flight",
    "window_s",
]


def test_to_dict_before_any_iteration_is_plain_and_json_safe(ids_1003):
    """Every key, in order; the latencies' nan are None, so strict JSON takes the dict."""
    plain = PrefetchLoader(ids_1003, 100).stats().to_dict()
    assert list(plain) == KEYS
    assert plain == {
        **dict.fromkeys(KEYS, 0),
        "epoch": None,
        "worker_id": None,
        "take_ms_p50": None,
        "take_ms_p95": None,
        "take_ms_p99": None,
        "cache_hit_ratio": None,
        "window_s": 10.0,
    }
    assert json.loads(json.dumps(plain, allow_nan=False)) == plain


def test_to_dict_after_an_epoch_holds_the_snapshot_as_plain_numbers(ids_1003):
    loader = PrefetchLoader(ids_1003, 100, columns=["id"], drop_last=False)
    assert sum(len(batch["id"]) for batch in loader) == 1003
    stats = loader.stats()
    plain = stats.to_dict()
    assert list(plain) == KEYS
    assert plain == {key: getattr(stats, key) for key in KEYS}
    assert (plain["epoch"], plain["batches"], plain["rows"]) == (0, 11, 1003)
    floats = {key for key in KEYS if key.endswith(("_s", "_total", "_fraction")) or "_ms_" in key}
    assert floats == {
        "elapsed_s",
        "rows_per_s",
        "rows_per_s_total",
        "mib_per_s",
        "mib_per_s_total",
        "wait_fraction",
        "wait_fraction_total",
        "take_ms_p50",
        "take_ms_p95",
        "take_ms_p99",
        "window_s",
    }
    nones = {"worker_id", "cache_hit_ratio"}  # main process, no cache
    assert {key: type(value) for key, value in plain.items()} == {
        key: float if key in floats else type(None) if key in nones else int for key in KEYS
    }
    assert plain["take_ms_p50"] > 0
    assert json.loads(json.dumps(plain, allow_nan=False)) == plain
    plain["batches"] = -1  # a copy
    assert loader.stats().batches == 11


def slow_takes(loader, seconds):
    take = loader._source.take

    def slow(indices):
        time.sleep(seconds)
        return take(indices)

    loader._source.take = slow


def test_waiting_is_measured_in_next(ids_1003):
    """Takes of 60 ms one at a time and no training step: the loop waits nearly all the time,
    and each take lasts at least 60 ms. With a 60 ms step and reads kept ahead, it hardly waits."""
    starved = PrefetchLoader(
        ids_1003, 100, columns=["id"], readahead=1, read=ReadOptions(max_in_flight=1)
    )
    slow_takes(starved, 0.06)
    assert len(list(starved)) == 10
    stats = starved.stats()
    assert stats.wait_fraction_total > 0.8
    assert stats.take_ms_p50 >= 60.0

    fed = PrefetchLoader(
        ids_1003, 100, columns=["id"], readahead=4, read=ReadOptions(max_in_flight=4)
    )
    slow_takes(fed, 0.02)
    for _ in fed:
        time.sleep(0.06)
    stats = fed.stats()
    assert stats.batches == 10 and stats.wait_fraction_total < 0.3


def test_a_stalled_loop_shows_as_waiting_while_it_waits(ids_1003):
    """A transform of 0.6 s: asked from another thread during the first next() (after the
    transform's work, before it returns), stats() says the loop has been waiting all along
    (not 0% until the batch arrives)."""
    worked, sampled = threading.Event(), threading.Event()

    def slow(batch):
        time.sleep(0.6)  # the transform's work
        worked.set()
        assert sampled.wait(10)  # the batch is not handed over before stats() is asked
        return batch

    loader = PrefetchLoader(
        ids_1003, 100, columns=["id"], transform=slow, read=ReadOptions(max_in_flight=1)
    )
    seen = []

    def sample():
        if worked.wait(10):
            seen.append(loader.stats())
        sampled.set()

    sampler = threading.Thread(target=sample)
    iterator = iter(loader)
    sampler.start()
    next(iterator)
    sampler.join(10)
    iterator.close()
    (stats,) = seen
    assert stats.batches == 0 and stats.wait_fraction_total > 0.8 and stats.wait_fraction > 0.8


def test_queue_depth_and_in_flight_while_reads_are_held(ids_1003):
    """readahead=4, max_in_flight=2; takes of batches 3 and up block: after 2 batches are
    received, batch 2 is ready in the queue and 2 takes are in flight."""
    loader = PrefetchLoader(
        ids_1003, 100, columns=["id"], readahead=4, read=ReadOptions(max_in_flight=2, coalesce=1)
    )
    release = threading.Event()
    take = loader._source.take
    blocked = {int(batch.indices[0]) for batch in list(loader.epoch_plan().rank_batches(0))[3:]}

    def held(indices):
        if int(indices[0]) in blocked:
            release.wait(10.0)
        return take(indices)

    loader._source.take = held
    iterator = iter(loader)
    try:
        next(iterator), next(iterator)
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:
            stats = loader.stats()
            if (stats.queue_depth, stats.in_flight) == (1, 2):
                break
            time.sleep(0.01)
        assert (stats.batches, stats.queue_depth, stats.in_flight) == (2, 1, 2)
    finally:
        release.set()
    assert len(list(iterator)) == 8
    assert loader.stats().batches == 10


def test_log_every_s_logs_a_line_of_stats(ids_1003, caplog):
    caplog.set_level(logging.INFO, logger="lance_prefetch.stats")
    loader = PrefetchLoader(ids_1003, 100, columns=["id"], log_every_s=0.05)
    for _ in loader:
        time.sleep(0.02)
    lines = [r.getMessage() for r in caplog.records if r.name == "lance_prefetch.stats"]
    assert 2 <= len(lines) <= 5  # 10 batches in ~0.2 s, one line per 0.05 s at most
    assert all(line.startswith("epoch 0: ") and " rows/s " in line for line in lines)
    quiet = PrefetchLoader(ids_1003, 100, columns=["id"])
    caplog.clear()
    list(quiet)
    assert not [r for r in caplog.records if r.name == "lance_prefetch.stats"]


@pytest.mark.parametrize(
    "value,error,message",
    [
        (0, ValueError, r"log_every_s should be a finite number of seconds > 0"),
        (-1.0, ValueError, r"log_every_s should be a finite number of seconds > 0"),
        (math.inf, ValueError, r"but got log_every_s=inf"),
        ("10", TypeError, r"log_every_s should be a number of seconds or None, but got '10'"),
        (True, TypeError, r"log_every_s should be a number of seconds or None, but got True"),
    ],
)
def test_bad_log_every_s_is_refused_before_any_io(value, error, message):
    with pytest.raises(error, match=message):
        PrefetchLoader("/nonexistent/never/opened.lance", 4, log_every_s=value)


def test_snapshots_from_another_thread_are_consistent(ids_1003):
    """rows == 16 * batches in every snapshot taken while batches of 16 are delivered."""
    loader = PrefetchLoader(ids_1003, 16, columns=["id"])
    snapshots, done = [], threading.Event()

    def poll():
        while not done.is_set():
            snapshots.append(loader.stats())

    poller = threading.Thread(target=poll)
    iterator = iter(loader)
    poller.start()
    try:
        assert sum(1 for _ in iterator) == 62
    finally:
        done.set()
        poller.join()
    assert len(snapshots) > 100
    assert [(s.batches, s.rows) for s in snapshots if s.rows != 16 * s.batches] == []


def test_a_snapshot_before_any_take_or_iteration_says_so_in_words():
    """``str()`` of the stats before a take returned names that, not ``nan``; before any
    iteration it says there is none."""
    assert str(LoaderStats()) == "no iteration in this process yet"
    waiting = str(LoaderStats(epoch=0))
    assert "no take returned yet" in waiting and "nan" not in waiting
