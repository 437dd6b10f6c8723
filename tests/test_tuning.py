"""Self-tuning readahead: the tuner's decisions on synthetic measurements (grow while the loop
waits, step back at a plateau, shrink when calm, stay inside the caps), a prefetcher resized
while running, and a loader with readahead="auto" that grows its depth against slow takes and
still delivers exactly the plan."""

from __future__ import annotations

import threading
import time

import pytest
from support.helpers import batch_ids, expected_rank_ids, wait_until
from support.sources import tapped

from lance_prefetch import PrefetchLoader, ReadOptions
from lance_prefetch.loader._config import LoaderConfig
from lance_prefetch.schedule._blocking import THREAD_NAME, BlockingPrefetcher
from lance_prefetch.schedule._prefetcher import Prefetcher
from lance_prefetch.schedule._tuning import (
    CALM_PERIODS,
    JUDGE_PERIODS,
    MAX_LEVEL,
    PROBE_PERIODS,
    SETTLE,
    START_LEVEL,
    Bounds,
    DepthTuner,
)


def make_tuner(**options) -> DepthTuner:
    settings = dict(
        coalesce=1,
        readahead=None,
        max_in_flight=None,
        max_buffer_bytes=1 << 30,
        row_bytes=100.0,
        batch_size=100,
        level=4,
        period_s=1.0,
    )
    settings.update(options)
    return DepthTuner(**settings)


class Feed:
    """Drives a tuner with periods of 1 s: each with a wait fraction and a rows/s. After a
    change, the settling time passes (unmeasured) before the next period."""

    def __init__(self, tuner: DepthTuner) -> None:
        self.tuner, self.now, self.waited, self.rows = tuner, 0.0, 0.0, 0
        self._observe()

    def _observe(self):
        return self.tuner.observe(self.now, self.waited, self.rows, self.rows * 100, self.rows)

    def period(self, wait: float, rate: float):
        self.now += 1.0
        self.waited += wait
        self.rows += int(rate)
        bounds = self._observe()
        if bounds is not None:
            self.now += SETTLE * self.tuner.period_s
            self.waited += 0.5  # settling: whatever happens there is not counted
            assert self._observe() is None
        return bounds


def test_grows_while_waiting_and_steps_back_at_the_plateau():
    """Throughput rises with the level up to 8 takes, then stays: 4 -> 8 -> 16, back to 8, which
    holds; each probe runs JUDGE_PERIODS (2) periods. After the hold a probe down (4: half the
    rows/s) comes back to 8, and the next hold ends in a probe up (16: no faster) that comes back
    to 8 too."""
    assert JUDGE_PERIODS == 2
    tuner = make_tuner()
    feed = Feed(tuner)
    levels = []
    for _ in range(6):
        feed.period(0.5, min(tuner.level, 8) * 1000.0)
        levels.append(tuner.level)
    assert levels == [8, 8, 16, 16, 8, 8]
    assert tuner.bounds().readahead == 9 and tuner.bounds().max_in_flight == 8
    assert tuner.hold_left == PROBE_PERIODS - 1
    levels = []
    for _ in range(2 * PROBE_PERIODS + 6):
        feed.period(0.97, min(tuner.level, 8) * 1000.0)
        levels.append(tuner.level)
    assert levels[PROBE_PERIODS - 2 : PROBE_PERIODS + 1] == [4, 4, 8]  # down, and back
    assert levels[2 * PROBE_PERIODS : 2 * PROBE_PERIODS + 3] == [16, 16, 8]  # up, and back
    assert set(levels) == {4, 8, 16} and levels.count(8) == len(levels) - 4


def test_a_level_grown_on_lucky_periods_comes_back_down():
    """The CPU is the limit (10,000 rows/s at any level), but both periods at 8 read more (15%,
    10%): 8 is kept, 16 is not; after the hold a probe down finds 4 as fast, and 4 stays."""
    tuner = make_tuner()
    feed = Feed(tuner)
    feed.period(0.97, 10_000.0)
    assert tuner.level == 8
    feed.period(0.97, 11_500.0)
    assert tuner.level == 8  # one period does not judge a probe
    feed.period(0.97, 11_000.0)  # lucky twice: "paid"
    assert tuner.level == 16
    feed.period(0.97, 10_000.0)
    feed.period(0.97, 10_000.0)
    assert tuner.level == 8
    levels = []
    for _ in range(PROBE_PERIODS + 3):
        feed.period(0.97, 10_000.0)
        levels.append(tuner.level)
    assert levels[-4:] == [4, 4, 4, 4] and tuner.hold_left > 0


def test_one_lucky_period_does_not_make_a_probe_pay():
    """The CPU is the limit (10,000 rows/s at any level). One period at 8 reads 15% more, the
    next as much as at 4: their mean (+7.5%) is not a gain, so 8 goes back; 2, never measured,
    is tried next and kept (as fast as 4)."""
    tuner = make_tuner()
    feed = Feed(tuner)
    levels = []
    for rate in (10_000.0, 11_500.0, 10_000.0, 10_000.0, 10_000.0, 10_000.0):
        feed.period(0.97, rate)
        levels.append(tuner.level)
    assert levels == [8, 8, 4, 2, 2, 2] and tuner.hold_left == PROBE_PERIODS  # set just now


def test_a_slower_halving_is_not_kept_on_one_lucky_period(caplog):
    """4 takes in flight read 66,000 rows/s, 2 read about 51,000 (22% slower), and one period's
    rows/s varies by 10-25%. A probe to 8 reads no faster: back to 4. The probe down to 2 reads
    61,000 (within 10% of 4's, by luck), then 45,000: the mean (53,000) is not as good, so it
    goes back to 4, which holds."""
    tuner = make_tuner()
    feed = Feed(tuner)
    levels = []
    with caplog.at_level("DEBUG", logger="lance_prefetch.tuning"):
        for rate in (66_000.0, 64_000.0, 66_000.0, 66_000.0, 61_000.0, 45_000.0, 66_000.0):
            feed.period(0.9, rate)
            levels.append(tuner.level)
    assert caplog.messages[-1] == (  # the log gives the mean the probe was judged on
        "readahead='auto': 2 -> 4 takes in flight, readahead 3 -> 5 batches "
        "(the period(s) before waited 90.0%, read 53000 rows/s)"
    )
    assert levels == [8, 8, 4, 2, 2, 4, 4] and tuner.hold_left == PROBE_PERIODS - 1
    assert [rate for _, rate in tuner.history.latest[2]] == [61_000.0, 45_000.0]  # each period
    assert tuner.seen[2] == pytest.approx((0.9, 53_000.0))
    assert tuner.seen[4] == pytest.approx((0.9, 66_000.0))


def test_a_probe_left_unjudged_is_undone_by_the_next_iteration():
    tuner = make_tuner()
    feed = Feed(tuner)
    feed.period(0.9, 1000.0)
    assert tuner.level == 8 and tuner.probe == ("up", 4)
    tuner.restart()
    assert tuner.level == 4 and tuner.probe is None and tuner.bounds().max_in_flight == 4


def test_a_small_wait_is_confirmed_across_short_epochs():
    """Epochs of about one period: a 2% wait (between WAIT_HIGH and WAIT_URGENT) in the last
    period of one and in the first of the next is two periods in a row, at the same level."""
    tuner = make_tuner()
    feed = Feed(tuner)
    feed.period(0.02, 1000.0)
    assert tuner.level == 4
    tuner.restart()
    feed = Feed(tuner)
    feed.period(0.02, 1000.0)
    assert tuner.level == 8 and tuner.probe == ("up", 4)
    tuner.restart()  # the probe is undone: the wait seen at 8 confirms nothing at 4
    assert tuner.level == 4
    feed = Feed(tuner)
    feed.period(0.02, 1000.0)
    assert tuner.level == 4


def test_shrinks_by_one_after_calm_periods_and_regrows_when_waiting():
    """8 calm periods: 8 -> 7. The loop waits at 7: back to 8, which holds as a floor (calm
    periods do not shrink it) for PROBE_PERIODS periods; then calm shrinks it again, and a wait
    past one shrink doubles."""
    tuner = make_tuner(level=8)
    feed = Feed(tuner)
    for _ in range(CALM_PERIODS - 1):
        assert feed.period(0.0, 5000.0) is None
    bounds = feed.period(0.0, 5000.0)
    assert tuner.level == 7 and bounds.max_in_flight == 7 and bounds.readahead == 8
    feed.period(0.0, 5000.0)
    feed.period(0.3, 4000.0)
    assert tuner.level == 8 and tuner.floor == 8
    levels = [tuner.level]
    for _ in range(PROBE_PERIODS):  # calm all along: it shrinks the period the floor ends
        feed.period(0.0, 5000.0)
        levels.append(tuner.level)
    assert levels == [8] * PROBE_PERIODS + [7]
    feed.period(0.05, 4500.0)  # the shrink made it wait: back to 8
    for _ in range(CALM_PERIODS):
        feed.period(0.0, 5000.0)
    assert tuner.level == 8  # the floor again
    tuner.floor = None
    for _ in range(CALM_PERIODS):
        feed.period(0.0, 5000.0)
    assert tuner.level == 7
    for _ in range(CALM_PERIODS + 1):  # not calm, not waiting: the shrink is forgotten
        feed.period(0.005, 5000.0)
    feed.period(0.1, 4500.0)  # a wait long after: it doubles
    assert tuner.level == 14


def test_a_growth_that_cuts_the_wait_is_kept_though_rows_per_s_barely_change():
    """Behind a training step the rows/s are the step's: 10% waited at level 4, 4% at 8 (rows/s
    +6%) is a gain; at 16 the wait is 3.5%, not cut by a third, and no faster: back to 8."""
    tuner = make_tuner()
    feed = Feed(tuner)
    feed.period(0.10, 9000.0)
    assert tuner.level == 8
    feed.period(0.04, 9540.0)
    feed.period(0.04, 9540.0)
    assert tuner.level == 16
    feed.period(0.035, 9560.0)
    feed.period(0.035, 9560.0)
    assert tuner.level == 8 and tuner.hold_left == PROBE_PERIODS
    feed.period(0.04, 9540.0)  # still waiting, but the level holds
    assert tuner.level == 8


def test_a_wait_cut_with_rows_per_s_lost_does_not_pay():
    """8 -> 16 cut the wait from 22% to 12.6% but rows/s fell from 32,500 to 16,900: back to 8
    (then 4, never measured, is tried; slower, so back to 8, which holds)."""
    tuner = make_tuner(level=8)
    feed = Feed(tuner)
    feed.period(0.221, 32_500.0)
    assert tuner.level == 16
    feed.period(0.126, 16_900.0)
    feed.period(0.126, 16_900.0)
    assert tuner.level == 8 and tuner.probe is None
    feed.period(0.221, 32_500.0)
    assert tuner.level == 4 and tuner.probe == ("down", 8)
    feed.period(0.40, 20_000.0)
    feed.period(0.40, 20_000.0)
    assert tuner.level == 8 and tuner.hold_left == PROBE_PERIODS


def test_a_start_level_above_the_best_is_left_within_seconds():
    """2 cores: 2 takes at once read fastest, 4 (the start) 12% slower, 8 slower still. The
    failed doubling is followed at once by a probe down (level 2 was never measured), which is
    kept; it holds, and is not probed again from below until the hold ends."""
    rates = {1: 20_000.0, 2: 42_000.0, 4: 37_000.0, 8: 33_000.0}
    tuner = make_tuner(level=4)
    feed = Feed(tuner)
    levels = []
    for _ in range(8):
        feed.period(0.9, rates[tuner.level])
        levels.append(tuner.level)
    assert levels == [8, 8, 4, 2, 2, 2, 2, 2]
    assert tuner.hold_left == PROBE_PERIODS - 2  # set by the sixth period, two since


def test_no_decision_within_a_period_and_small_waits_change_nothing():
    tuner = make_tuner()
    tuner.observe(0.0, 0.0, 0, 0, 0)
    assert tuner.observe(0.5, 0.4, 100, 0, 0) is None  # the period is not over
    assert tuner.observe(1.0, 0.4, 200, 0, 0) is not None and tuner.level == 8  # 40% waited
    # settling (half a period): 0.3 s waited there is not counted
    assert tuner.observe(1.4, 0.7, 250, 0, 0) is None
    assert tuner.observe(1.5, 0.7, 260, 0, 0) is None  # the next period starts
    # the probe's first period: 0.9% waited, 240 rows/s; not judged yet
    assert tuner.observe(2.5, 0.709, 500, 0, 0) is None and tuner.probe == ("up", 4)
    # its second: 0.8%, 220 rows/s; their mean against 200 rows/s at level 4: kept
    assert tuner.observe(3.5, 0.717, 720, 0, 0) is None and tuner.level == 8
    assert tuner.probe is None and tuner.seen[8] == pytest.approx((0.0085, 230.0))
    # 2% waited: near the threshold, only the second such period in a row grows
    assert tuner.observe(4.5, 0.737, 960, 0, 0) is None and tuner.level == 8
    assert tuner.observe(5.5, 0.757, 1200, 0, 0) is not None and tuner.level == 16


@pytest.mark.parametrize(
    ("pattern", "mean"),
    [([0.02, 0.005], 4.0), ([0.02, 0.005, 0.005], 4.0), ([0.02, 0.02, 0.005], 6.5)],
)
def test_waits_near_the_threshold_do_not_ratchet_the_level_up(pattern, mean):
    """rows/s are 10,000 at any level and the wait is noise around 1%. A lone 2% period is not
    confirmed: the level stays at 4. Two in a row (the loop waits 1.5% on average) grow it to 8,
    which holds, then a probe down finds 4 as good, and so on: 4 and 8 alternate. A probe from 8
    to 16 now and then (8's two periods waited a third less than 4's: a "gain") fails and goes
    back at once: 16 for at most 2 periods in 80 (one probe per two holds)."""
    tuner = make_tuner()
    feed = Feed(tuner)
    levels = []
    for index in range(1000):
        feed.period(pattern[index % len(pattern)], 10_000.0)
        levels.append(tuner.level)
    assert max(levels) <= 16 and min(levels[100:]) == 4 and sum(levels) / len(levels) <= mean
    assert levels.count(16) <= JUDGE_PERIODS * len(levels) / (2 * PROBE_PERIODS)


def test_a_byte_cap_learnt_from_the_first_reads_is_handed_out_at_once():
    """Variable-width rows: nothing known at the start (4 takes); the first reads say 10 KB a row,
    and 2.5 MB hold 2 batches of 100 rows: the next observe() hands out level 1."""
    tuner = make_tuner(row_bytes=None, max_buffer_bytes=2_500_000)
    assert tuner.restart() == tuner.bounds() and tuner.bounds().max_in_flight == 4
    assert tuner.observe(0.0, 0.0, 0, 0, 0) is None
    bounds = tuner.observe(0.01, 0.0, 100, 1_000_000, 100)
    assert bounds is not None and bounds.max_in_flight == 1 and bounds.readahead == 2
    assert tuner.observe(0.02, 0.0, 200, 2_000_000, 200) is None


def test_a_fixed_max_in_flight_is_kept_while_the_readahead_is_tuned():
    tuner = make_tuner(max_in_flight=3, level=8)
    feed = Feed(tuner)
    assert tuner.bounds() == Bounds(readahead=4, max_in_flight=3)
    for _ in range(3 * CALM_PERIODS):  # calm: the readahead shrinks, in flight as far as it holds
        feed.period(0.0, 1000.0)
    assert tuner.bounds() == Bounds(readahead=2, max_in_flight=2)
    coalesced = make_tuner(max_in_flight=3, coalesce=4)
    assert coalesced.bounds() == Bounds(readahead=16, max_in_flight=3)


def test_period_s_is_checked():
    with pytest.raises(ValueError, match="period_s should be > 0"):
        make_tuner(period_s=0)


def test_caps_bound_the_level():
    """max_buffer_bytes: 1 MiB of 10 KiB batches (100 rows x 100 bytes) holds 104 batches; with
    coalesce=8 that is 13 takes, minus one being consumed: at most 12 in flight."""
    tuner = make_tuner(max_buffer_bytes=1 << 20, coalesce=8)
    feed = Feed(tuner)
    for _ in range(10):  # 4 -> 8 -> 12 (the cap); a probe down to 6 fails: back to 12
        feed.period(0.9, tuner.level * 1000.0)  # always pays: only the caps stop it
    assert tuner.level == 12 and tuner.bounds().readahead == 13 * 8
    fixed = make_tuner(readahead=10, coalesce=2)  # readahead fixed: at most 5 takes
    feed = Feed(fixed)
    for _ in range(10):
        feed.period(0.9, fixed.level * 1000.0)
    assert fixed.bounds().readahead == 10 and fixed.bounds().max_in_flight == 5
    unbounded = make_tuner(max_buffer_bytes=1 << 40)
    feed = Feed(unbounded)
    for _ in range(9):  # 4 -> 8 -> 16 -> 32 -> 64, each probe judged on 2 periods
        feed.period(0.9, unbounded.level * 1000.0)
    assert unbounded.level == MAX_LEVEL
    pinned = make_tuner(max_in_flight=3)  # max_in_flight fixed: the readahead follows it
    assert pinned.bounds().max_in_flight == 3 and pinned.bounds().readahead == 4
    # a fixed max_in_flight does not lift the byte budget: 1 MiB of 10 KiB batches, 8 a take
    budget = make_tuner(max_in_flight=64, coalesce=8, max_buffer_bytes=1 << 20)
    feed = Feed(budget)
    for _ in range(10):
        feed.period(0.9, budget.level * 1000.0)
    bounds = budget.bounds()
    assert bounds.readahead * 100 * 100 <= 1 << 20 and bounds.max_in_flight == 13  # all it holds


def test_max_level_caps_auto_but_not_a_fixed_max_in_flight():
    """max_level (lower on an object store): "auto" probes up to it and no further, even while
    every probe pays; a fixed max_in_flight is kept as given above it."""
    remote = make_tuner(max_buffer_bytes=1 << 40, max_level=4, level=1)
    feed = Feed(remote)
    levels = []
    for _ in range(12):
        feed.period(0.9, remote.level * 1000.0)  # always pays: only the cap stops it
        levels.append(remote.level)
    assert max(levels) == 4 and remote.level == 4
    assert remote.bounds() == Bounds(readahead=5, max_in_flight=4)
    assert make_tuner(max_level=4, level=9).level == 4  # a start above the cap is clamped
    fixed = make_tuner(max_level=4, max_in_flight=16, max_buffer_bytes=1 << 40)
    assert fixed._max_level() == 16
    assert make_tuner(max_level=200, max_buffer_bytes=1 << 40, level=100).level == MAX_LEVEL
    with pytest.raises(ValueError, match=r"max_level should be >= 1, but got max_level=0"):
        make_tuner(max_level=0)


def test_the_bytes_a_take_holds_while_read_count_against_max_buffer_bytes():
    """take_bytes (what Lance fetches for a take in flight) counts per take in flight: 1 MiB,
    takes of 8 batches of 10 KB (80 KB of rows) holding 160 KB more while read: (1,048,576 -
    80,000) // (80,000 + 160,000) = 4 in flight; one take even when one alone is over budget;
    with a fixed readahead, 1 MiB // 400 KB = 2."""
    tuner = make_tuner(max_buffer_bytes=1 << 20, coalesce=8, take_bytes=160_000.0)
    feed = Feed(tuner)
    for _ in range(10):
        feed.period(0.9, tuner.level * 1000.0)  # always pays: only the caps stop it
    assert tuner.level == 4 and tuner.bounds() == Bounds(readahead=5 * 8, max_in_flight=4)
    assert make_tuner(coalesce=8, take_bytes=float(1 << 40)).bounds().max_in_flight == 1
    fixed = make_tuner(readahead=80, coalesce=8, max_buffer_bytes=1 << 20, take_bytes=400_000.0)
    assert fixed.bounds().max_in_flight == 2


def test_resize_refuses_a_readahead_below_an_item():
    gate, fetching = threading.Event(), threading.Event()

    def fetch(item):
        fetching.set()  # an item of size 3 is held from here
        return gate.wait(5)

    iterator = BlockingPrefetcher(
        Prefetcher(iter(range(10)), fetch, readahead=6, max_in_flight=2, size=lambda i: 3)
    )
    try:
        assert fetching.wait(5)
        with pytest.raises(ValueError, match="readahead should stay >= the largest item's size"):
            iterator.resize(2, 1)
    finally:
        gate.set()
        iterator.close()


def test_row_bytes_are_learnt_from_the_reads():
    tuner = make_tuner(row_bytes=None, max_buffer_bytes=50_000)
    assert tuner.level == 4  # nothing known yet: no byte cap
    tuner.observe(0.0, 0.0, 0, 10_000, 100)  # 100 bytes a row, 10 KB a batch: 5 batches fit
    assert tuner.row_bytes == 100.0 and tuner.bounds().max_in_flight == 4
    Feed(tuner).period(0.9, 1000.0)
    assert tuner.bounds().readahead <= 5


@pytest.mark.parametrize(
    ("value", "error"), [("max", TypeError), (0, ValueError), (2.5, TypeError), (None, TypeError)]
)
def test_bad_depths(value, error):
    match = "readahead should be an integer or 'auto'" if error is TypeError else ">= 1"
    with pytest.raises(error, match=match):
        LoaderConfig(batch_size=4, readahead=value)  # the one check, before any I/O
    with pytest.raises(error, match=match):
        PrefetchLoader("/nonexistent.lance", 4, readahead=value)


def test_max_buffer_bytes_is_checked():
    with pytest.raises(ValueError, match="max_buffer_bytes should be an integer >= 1"):
        PrefetchLoader("/nonexistent.lance", 4, read=ReadOptions(max_buffer_bytes=0))


def test_a_running_prefetcher_grows_and_shrinks():
    """Items block until released: with readahead 2 two are held; resized to 6, six; resized to
    3, no new item starts until fewer than 3 are held."""
    gate, changed = threading.Event(), threading.Condition()
    started = []

    def fetch(item):
        with changed:
            started.append(item)
            changed.notify_all()
        gate.wait(10)
        return item

    iterator = BlockingPrefetcher(Prefetcher(iter(range(100)), fetch, readahead=2, max_in_flight=2))
    try:
        with changed:  # both slots taken: the producer waits
            assert changed.wait_for(lambda: len(started) == 2, timeout=5)
        assert iterator.statistics().held == 2
        iterator.resize(6, 6)
        assert wait_until(
            lambda: (iterator.statistics().held, iterator.statistics().in_flight) == (6, 6)
        )
        statistics = iterator.statistics()
        assert (statistics.held, statistics.in_flight, statistics.readahead) == (6, 6, 6)
        iterator.resize(3, 1)
        gate.set()
        values = [next(iterator) for _ in range(4)]  # 4 received: 2 owed to the shrink repaid
        assert values == [0, 1, 2, 3]
        time.sleep(0.2)
        assert iterator.statistics().held <= 3
        assert list(iterator) == list(range(4, 100))
    finally:
        gate.set()
        iterator.close()


def test_auto_readahead_grows_against_slow_takes_and_reads_exactly(ids_1003):
    """Every take sleeps 30 ms (I/O-like: the GIL is free) and the loop does nothing: the loader
    starts at 4 takes in flight and grows; the batches are the plan's."""

    def take(read, indices):
        time.sleep(0.03)
        return read(indices)

    with tapped(take=take):
        loader = PrefetchLoader(
            ids_1003,
            2,
            readahead="auto",
            drop_last=False,
            read=ReadOptions(max_in_flight="auto", coalesce=1),
        )
    loader._resolved.tuner.period_s = 0.25  # ~30 batches a period at the start: a steady rows/s
    seen = []
    batches = []
    for batch in loader:
        batches.append(batch)
        seen.append(loader.stats().max_in_flight)
    assert batch_ids(batches) == expected_rank_ids(loader)
    assert seen[0] == 4 and max(seen) >= 8
    assert loader._resolved.tuner.level >= 8
    # the next iteration starts where this one ended (a probe not judged yet undone); no
    # period ends during its first batch, so the level cannot move before it is read
    level = (
        loader._resolved.tuner.probe[1]
        if loader._resolved.tuner.probe
        else loader._resolved.tuner.level
    )
    loader._resolved.tuner.period_s = 3600.0
    loader.set_epoch(1)
    iterator = iter(loader)
    next(iterator)
    assert loader.stats().max_in_flight == level
    iterator.close()
    assert repr(loader).count("readahead='auto'") == 1


def test_auto_starts_at_four_in_flight_and_a_filled_memory_cache_reads_in_next(ids_1003):
    """ "auto" starts at 4 takes in flight, with the memory cache too (its first epoch reads the
    dataset while the fill runs); once filled, a batch is gathered in next() itself: no loop
    thread, no tuner. The batches are the plan's either way."""
    memory = PrefetchLoader(ids_1003, 4, cache="memory")
    files = PrefetchLoader(ids_1003, 4)
    for loader in (memory, files):
        loader._resolved.tuner.period_s = 3600.0  # no decision during the test
        iterator = iter(loader)
        first = next(iterator)
        stats = loader.stats()
        assert (stats.max_in_flight, stats.readahead) == (4, 5 * loader.coalesce)
        batches = [first, *iterator]
        assert batch_ids(batches) == expected_rank_ids(loader)
    assert START_LEVEL == 4
    memory._source.fill()
    memory.set_epoch(1)
    iterator = iter(memory)
    first = next(iterator)
    names = [thread.name for thread in threading.enumerate()]
    assert THREAD_NAME not in names and iterator._iterator._tuner is None
    assert batch_ids([first, *iterator]) == expected_rank_ids(memory)


def test_decisions_match_the_recorded_trace():
    """The same inputs give the same decisions, change by change, as the tuner recorded in
    tests/data/tuner_trace.json (simulated iterations in 11 scenarios, and 4 x 4,000 fuzzed
    periods that reach every branch of the policy)."""
    import json

    from support.tuner_trace import TRACE, record

    recorded = json.loads(TRACE.read_text())
    replayed = json.loads(json.dumps(record(DepthTuner)))
    assert replayed.keys() == recorded.keys()
    for name in recorded:
        assert replayed[name] == recorded[name], name
