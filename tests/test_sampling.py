"""Tests for lance_prefetch.sampling: pure planning, no I/O."""

from __future__ import annotations

import itertools
from collections import Counter

import numpy as np
import pytest

from lance_prefetch.sampling import EpochPlan, epoch_permutation, index_dtype


def rank_rows(plan: EpochPlan, rank: int) -> list[list[int]]:
    return [batch.indices.tolist() for batch in plan.rank_batches(rank)]


def test_permutation_is_a_permutation_of_the_smallest_dtype():
    for num_rows, dtype in [(1, np.uint8), (256, np.uint8), (257, np.uint16), (70_000, np.uint32)]:
        permutation = epoch_permutation(num_rows, seed=3, epoch=1)
        assert permutation.dtype == dtype
        assert permutation.shape == (num_rows,)
        assert np.array_equal(np.sort(permutation), np.arange(num_rows))
    assert index_dtype(2**32) == np.uint32
    assert index_dtype(2**32 + 1) == np.uint64


def test_permutation_depends_on_seed_and_epoch_only():
    """Same (seed, epoch) -> same order, whatever the global RNG state; other epochs differ."""
    np.random.seed(123)
    first = epoch_permutation(1000, seed=7, epoch=0)
    np.random.seed(456)
    assert np.array_equal(first, epoch_permutation(1000, seed=7, epoch=0))
    orders = {tuple(epoch_permutation(1000, seed=7, epoch=e)) for e in range(3)}
    orders.add(tuple(epoch_permutation(1000, seed=8, epoch=0)))
    assert len(orders) == 4
    # The order is the one numpy's PCG64 stream gives for SeedSequence([seed, epoch]):
    # reproducible on any machine from the two integers alone.
    reference = np.arange(1000, dtype=np.uint16)
    np.random.Generator(np.random.PCG64(np.random.SeedSequence([7, 0]))).shuffle(reference)
    assert np.array_equal(first, reference)


def test_permutation_is_uniform_over_positions():
    """Row 0 lands in each of 10 positions about equally often over 2,000 epochs (chi-square)."""
    counts = Counter(int(np.flatnonzero(epoch_permutation(10, 0, e) == 0)[0]) for e in range(2000))
    chi2 = sum((counts[p] - 200) ** 2 / 200 for p in range(10))
    assert chi2 < 27.9  # p = 0.001 for 9 degrees of freedom


def test_worked_example_from_the_module_docstring():
    plan = EpochPlan(num_rows=11, batch_size=2, world_size=2, drop_last=False, seed=5)
    p = plan.permutation.tolist()
    assert plan.batches_per_rank == 3 and plan.last_batch_size == 2 and plan.num_padded == 1
    assert rank_rows(plan, 0) == [[p[0], p[1]], [p[4], p[5]], [p[8], p[9]]]
    assert rank_rows(plan, 1) == [[p[2], p[3]], [p[6], p[7]], [p[10], p[0]]]
    workers = [
        [b.position for b in plan.rank_batches(0, worker_id=w, num_workers=2)] for w in (0, 1)
    ]
    assert workers == [[0, 4], [2]]

    plan = EpochPlan(num_rows=11, batch_size=2, world_size=2, drop_last=True, seed=5)
    assert plan.batches_per_rank == 2 and plan.num_dropped == 3
    assert rank_rows(plan, 0) == [[p[0], p[1]], [p[4], p[5]]]
    assert rank_rows(plan, 1) == [[p[2], p[3]], [p[6], p[7]]]


def test_drop_last_counts_1003_rows_batch_10():
    plan = EpochPlan(num_rows=1003, batch_size=10)
    batches = rank_rows(plan, 0)
    assert len(batches) == 100 and all(len(b) == 10 for b in batches)
    delivered = [i for b in batches for i in b]
    assert delivered == plan.permutation[:1000].tolist()  # the tail of the permutation is left out
    assert plan.num_dropped == 3

    plan = EpochPlan(num_rows=1003, batch_size=10, drop_last=False)
    batches = rank_rows(plan, 0)
    assert [len(b) for b in batches] == [10] * 100 + [3]
    assert [i for b in batches for i in b] == plan.permutation.tolist()


@pytest.mark.parametrize(
    "num_rows,batch_size,world_size",
    list(itertools.product([5, 145, 1003], [2, 10, 16], [2, 3, 7])),
)
def test_rank_rules(num_rows, batch_size, world_size):
    """Equal batch counts on every rank, no empty batch, coverage rules for both drop_last."""
    for drop_last in (True, False):
        if drop_last and num_rows < batch_size * world_size:
            with pytest.raises(ValueError, match=r"^drop_last=True needs at least batch_size"):
                EpochPlan(num_rows=num_rows, batch_size=batch_size, world_size=world_size)
            continue
        plan = EpochPlan(
            num_rows=num_rows, batch_size=batch_size, world_size=world_size, drop_last=drop_last
        )
        per_rank = [rank_rows(plan, r) for r in range(world_size)]
        assert [len(batches) for batches in per_rank] == [plan.batches_per_rank] * world_size
        sizes = [len(b) for batches in per_rank for b in batches]
        assert min(sizes) >= 1
        for batches in per_rank:  # only the last batch of a rank may be short, same on all ranks
            assert all(len(b) == batch_size for b in batches[:-1])
            assert len(batches[-1]) == plan.last_batch_size
        counts = Counter(i for batches in per_rank for b in batches for i in b)
        if drop_last:
            assert all(size == batch_size for size in sizes)
            assert max(counts.values()) == 1  # no repeats across ranks
            assert set(counts) == set(plan.permutation[: plan.num_delivered].tolist())
            assert num_rows - len(counts) < batch_size * world_size
        else:
            assert set(counts) == set(range(num_rows))  # every row at least once
            assert sum(counts.values()) - num_rows == plan.num_padded < world_size


def test_counts_match_distributed_sampler_and_batch_sampler():
    """The per-rank batch count and last size equal DistributedSampler + BatchSampler's."""
    from torch.utils.data import BatchSampler, DistributedSampler

    for num_rows, batch_size, world_size, drop_last in itertools.product(
        [5, 145, 1003], [2, 10, 16], [1, 2, 3, 7], [True, False]
    ):
        if drop_last and num_rows < batch_size * world_size:
            continue
        plan = EpochPlan(
            num_rows=num_rows, batch_size=batch_size, world_size=world_size, drop_last=drop_last
        )
        sampler = DistributedSampler(
            range(num_rows), num_replicas=world_size, rank=0, drop_last=drop_last
        )
        torch_batches = list(BatchSampler(sampler, batch_size, drop_last=drop_last))
        assert plan.batches_per_rank == len(torch_batches)
        assert plan.last_batch_size == len(torch_batches[-1])


@pytest.mark.parametrize("num_workers", [1, 2, 3, 7])
def test_workers_split_a_rank_round_robin(num_workers):
    """Interleaving the workers' streams round-robin gives back the rank's order exactly."""
    plan = EpochPlan(num_rows=1003, batch_size=10, world_size=2, drop_last=False)
    streams = [
        [b.position for b in plan.rank_batches(1, worker_id=w, num_workers=num_workers)]
        for w in range(num_workers)
    ]
    interleaved = [s[i] for i in range(max(map(len, streams))) for s in streams if i < len(s)]
    assert interleaved == [b.position for b in plan.rank_batches(1)]
    assert interleaved == list(range(1, 2 * 51, 2))


def test_more_workers_than_batches():
    plan = EpochPlan(num_rows=25, batch_size=10, drop_last=False)
    assert [len(list(plan.rank_batches(0, worker_id=w, num_workers=7))) for w in range(7)] == [
        1, 1, 1, 0, 0, 0, 0,
    ]  # fmt: skip


def test_single_row_many_ranks_pads_by_wrapping():
    plan = EpochPlan(num_rows=1, batch_size=4, world_size=7, drop_last=False)
    assert [rank_rows(plan, r) for r in range(7)] == [[[0]]] * 7


@pytest.mark.parametrize(
    "kwargs,error,message",
    [
        (dict(num_rows=10, batch_size=0), ValueError, "batch_size should be an integer >= 1, but got batch_size=0"),
        (dict(num_rows=10, batch_size=2.0), TypeError, "batch_size should be an integer, but got batch_size=2.0 (float)"),
        (dict(num_rows=10, batch_size=True), TypeError, "batch_size should be an integer, but got batch_size=True (a bool)"),
        (dict(num_rows=0, batch_size=1), ValueError, "num_rows should be an integer >= 1, but got num_rows=0"),
        (dict(num_rows=10, batch_size=1, seed=-1), ValueError, "seed should be an integer >= 0, but got seed=-1"),
        (dict(num_rows=10, batch_size=1, world_size=0), ValueError, "world_size should be an integer >= 1, but got world_size=0"),
        (dict(num_rows=10, batch_size=1, drop_last=1), TypeError, "drop_last should be True or False, but got drop_last=1"),
        (dict(num_rows=10, batch_size=4, world_size=3), ValueError, "drop_last=True needs at least batch_size * world_size = 4 * 3 = 12 rows, but the dataset has 10; use a smaller batch_size or drop_last=False"),
    ],
)  # fmt: skip
def test_bad_arguments(kwargs, error, message):
    with pytest.raises(error) as info:
        EpochPlan(**kwargs)
    assert str(info.value) == message


def test_bad_rank_and_position():
    plan = EpochPlan(num_rows=100, batch_size=10, world_size=2)
    with pytest.raises(
        ValueError, match=r"^Invalid rank 2, rank should be in the interval \[0, 1\]$"
    ):
        next(plan.rank_batches(2))
    with pytest.raises(IndexError, match=r"^position=10 is outside the epoch's 10 global batches$"):
        plan.batch(10)
