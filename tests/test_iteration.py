"""One loader iteration without Lance (lance_prefetch.loader._iteration over a FakeSource): groups read
with one take each and handed out batch by batch in plan order, delivered batches counted, and
failures named for the training loop."""

from __future__ import annotations

import functools
import weakref

import numpy as np
import pytest
from support.fakes import FakeSource

from lance_prefetch import BatchLoadError
from lance_prefetch.lifecycle import _shutdown
from lance_prefetch.loader._iteration import BatchReader, LoaderIterator
from lance_prefetch.loader._telemetry import Telemetry
from lance_prefetch.plan._coalesce import groups
from lance_prefetch.plan._positions import Decision, DeliveryCounter
from lance_prefetch.plan.sampling import EpochPlan
from lance_prefetch.schedule._blocking import BlockingPrefetcher
from lance_prefetch.schedule._direct import DirectPrefetcher
from lance_prefetch.schedule._prefetcher import Prefetcher
from lance_prefetch.schedule.retry import RetryPolicy


def iterate(source, plan, *, coalesce=3, transform=None, retry=None, rank=0, direct=False):
    """An iteration of ``plan`` for ``rank``, as ``PrefetchLoader.__iter__`` wires it (``direct``:
    read in ``next()``, as for a filled memory cache)."""
    telemetry = Telemetry(plan.epoch)
    counter = DeliveryCounter(1, Decision(plan.epoch, plan.start), world_size=plan.world_size)
    reader = BatchReader(
        source, epoch=plan.epoch, transform=transform, retry=retry, telemetry=telemetry
    )
    items = groups(plan.rank_batches(rank), coalesce)
    if direct:
        start = functools.partial(
            DirectPrefetcher,
            items,
            reader.read,
            process=reader.convert,
            readahead=6,
            max_in_flight=2,
        )
    else:
        prefetcher = Prefetcher(
            items,
            reader.read,
            process=reader.convert,
            readahead=6,
            max_in_flight=2,
            retry=retry,
            size=len,
        )
        start = functools.partial(BlockingPrefetcher, prefetcher)
    iterator = LoaderIterator(
        start,
        reader=reader,
        counter=counter,
        telemetry=telemetry,
        log_every_s=None,
        tuner=None,
    )
    return iterator, counter, telemetry


def test_groups_are_read_by_one_take_and_delivered_batch_by_batch_in_plan_order():
    plan = EpochPlan(num_rows=103, batch_size=10, seed=1, epoch=2, drop_last=False)
    source = FakeSource(103)
    iterator, counter, telemetry = iterate(source, plan)
    expected = [batch.indices.tolist() for batch in plan.rank_batches(0)]
    batches = list(iterator)
    assert [b["id"].tolist() for b in batches] == expected  # 11 batches, the last of 3 rows
    assert [b["vector"][:, 1].tolist() for b in batches] == [
        [2.0 * i for i in ids] for ids in expected
    ]
    # one take per group of 3 consecutive batches: 4 takes, the offsets laid end to end (two run
    # at once, so they may start in either order)
    assert sorted(source.takes) == sorted(sum(expected[i : i + 3], []) for i in range(0, 11, 3))
    assert counter.delivered == 11 and counter.position == plan.end == 11
    stats = telemetry.snapshot()
    assert (stats.batches, stats.rows) == (11, 103)


def test_a_failed_read_names_its_group_after_the_batches_before_it():
    """The second take (batches 3-5) fails for good: batches 0-2 are delivered, then the error
    names the group, the epoch, its rows and the attempts; the iterator is closed."""

    plan = EpochPlan(num_rows=100, batch_size=10, seed=3, epoch=1)
    second = [i for position in (3, 4, 5) for i in plan.batch(position).indices.tolist()]

    class Failing(FakeSource):
        def take(self, indices):
            if indices.tolist() == second:
                raise OSError("Not found: data/1.lance")
            return super().take(indices)

    iterator, counter, _ = iterate(Failing(100), plan, coalesce=3, retry=RetryPolicy(attempts=3))
    expected = [batch.indices.tolist() for batch in plan.rank_batches(0)]
    assert [next(iterator)["id"].tolist() for _ in range(3)] == expected[:3]
    with pytest.raises(BatchLoadError) as caught:
        next(iterator)
    error = caught.value
    assert str(error) == (
        "batches 3-5 (one coalesced take) of epoch 1 (30 rows) from 'memory://fake.lance' "
        "version 1 failed after 1 attempt (not retried: OSError is not transient): OSError: "
        "Not found: data/1.lance"
    )
    assert (error.epoch, error.position, error.num_rows, error.attempts) == (1, 3, 30, 1)
    assert isinstance(error.__cause__, OSError)
    assert counter.position == 3 and iterator.closed


def test_a_failed_transform_keeps_the_batches_of_its_group_before_it():
    """The transform fails on batch 4 (the middle of the second group): batches 0-3 arrive,
    then the error names batch 4 alone, with no attempts (the read succeeded)."""
    plan = EpochPlan(num_rows=90, batch_size=10, seed=5)
    failing = plan.batch(4).indices.tolist()

    def transform(batch):
        if batch["id"].tolist() == failing:
            raise ValueError("bad batch")
        return batch["id"]

    iterator, counter, _ = iterate(FakeSource(90, columns=("id",)), plan, transform=transform)
    expected = [batch.indices.tolist() for batch in plan.rank_batches(0)]
    assert [next(iterator).tolist() for _ in range(4)] == expected[:4]
    with pytest.raises(
        BatchLoadError,
        match=r"^batch 4 of epoch 0 \(10 rows\) from "
        r"'memory://fake.lance' version 1 failed in conversion or transform: "
        r"ValueError: bad batch$",
    ) as caught:
        next(iterator)
    assert caught.value.attempts is None and caught.value.position == 4
    assert counter.position == 4 and iterator.closed


def test_a_rank_reads_only_its_own_batches():
    """Rank 1 of 3: global batches 1, 4, 7, ..., and the counter's position moves by rounds."""
    plan = EpochPlan(num_rows=95, batch_size=5, seed=2, world_size=3)
    source = FakeSource(95)
    iterator, counter, _ = iterate(source, plan, rank=1, coalesce=2)
    ids = [b["id"].tolist() for b in iterator]
    assert ids == [plan.batch(p).indices.tolist() for p in range(1, 18, 3)]
    assert sorted(np.concatenate(source.takes).tolist()) == sorted(sum(ids, []))
    assert counter.position == 18  # after global batch 16, rank 1's last: the round 15-17 ends


@pytest.mark.parametrize("direct", [False, True], ids=["blocking", "direct"])
def test_an_iteration_dropped_mid_share_is_closed_as_close_closes_it(direct):
    """Garbage collection of an iteration closes the prefetcher it holds, and that close does what
    LoaderIterator.close() does: the telemetry ends (elapsed time stops), nothing stays live for
    the exit hook. The end of the share closes it the same way."""
    plan = EpochPlan(num_rows=100, batch_size=10, seed=3)
    iterator, counter, telemetry = iterate(FakeSource(100), plan, direct=direct)
    assert next(iterator)["id"].tolist() == plan.batch(0).indices.tolist()
    prefetcher = weakref.ref(iterator._prefetcher)
    assert prefetcher() in set(_shutdown._live) and telemetry.ended is None
    del iterator
    assert prefetcher() is None and telemetry.ended is not None
    assert telemetry.snapshot().batches == 1 and counter.delivered == 1

    iterator, counter, telemetry = iterate(FakeSource(100), plan, direct=direct)
    assert len(list(iterator)) == 10 and iterator.closed and counter.finished
    assert telemetry.ended is not None and iterator._prefetcher not in set(_shutdown._live)
    # the event loop's counts readahead units (batches), the direct one the groups it read
    assert iterator.statistics().received == (4 if direct else 10)
