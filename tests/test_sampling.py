"""Tests for lance_prefetch.plan.sampling: pure planning, no I/O."""

from __future__ import annotations

import itertools
from collections import Counter

import numpy as np
import pytest
from support.helpers import epoch_sequence

from lance_prefetch.plan._mixture import dataset_seed
from lance_prefetch.plan.permutation import LazyPermutation, make_permutation
from lance_prefetch.plan.sampling import EpochPlan, epoch_permutation, index_dtype
from lance_prefetch.plan.splits import split_order


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
    # The order is the one numpy's PCG64 stream gives for the epoch's SeedSequence (the module
    # docstring's "Seeds"): reproducible on any machine from the two integers alone.
    reference = np.arange(1000, dtype=np.uint16)
    np.random.Generator(np.random.PCG64(epoch_sequence(7, 0))).shuffle(reference)
    assert np.array_equal(first, reference)


def test_permutation_is_uniform_over_positions():
    """Row 0 lands in each of 10 positions about equally often over 2,000 epochs (chi-square)."""
    counts = Counter(int(np.flatnonzero(epoch_permutation(10, 0, e) == 0)[0]) for e in range(2000))
    chi2 = sum((counts[p] - 200) ** 2 / 200 for p in range(10))
    assert chi2 < 27.9  # p = 0.001 for 9 degrees of freedom


def test_worked_example_from_the_module_docstring(permutation_kind):
    plan = EpochPlan(num_rows=11, batch_size=2, world_size=2, drop_last=False, seed=5)
    assert plan.permutation_kind == permutation_kind
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


def test_drop_last_counts_1003_rows_batch_10(permutation_kind):
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
def test_rank_rules(num_rows, batch_size, world_size, permutation_kind):
    """Equal batch counts on every rank, no empty batch, coverage rules for both drop_last."""
    for drop_last in (True, False):
        if drop_last and num_rows < batch_size * world_size:
            with pytest.raises(ValueError, match=r"^drop_last=True needs at least batch_size"):
                EpochPlan(num_rows=num_rows, batch_size=batch_size, world_size=world_size)
            continue
        plan = EpochPlan(
            num_rows=num_rows, batch_size=batch_size, world_size=world_size, drop_last=drop_last
        )
        assert plan.permutation_kind == permutation_kind
        per_rank = [rank_rows(plan, r) for r in range(world_size)]
        assert [len(batches) for batches in per_rank] == [plan.batches_per_rank] * world_size
        for rank in range(world_size):  # a rank's stream (a few batches at a time when lazy)
            for batch in plan.rank_batches(rank):  # equals the batches one by one
                assert np.array_equal(batch.indices, plan.batch(batch.position).indices)
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
def test_workers_split_a_rank_round_robin(num_workers, permutation_kind):
    """Interleaving the workers' streams round-robin gives back the rank's order exactly."""
    plan = EpochPlan(num_rows=1003, batch_size=10, world_size=2, drop_last=False)
    streams = [
        [b.position for b in plan.rank_batches(1, worker_id=w, num_workers=num_workers)]
        for w in range(num_workers)
    ]
    interleaved = [s[i] for i in range(max(map(len, streams))) for s in streams if i < len(s)]
    assert interleaved == [b.position for b in plan.rank_batches(1)]
    assert interleaved == list(range(1, 2 * 51, 2))


def test_more_workers_than_batches(permutation_kind):
    plan = EpochPlan(num_rows=25, batch_size=10, drop_last=False)
    assert [len(list(plan.rank_batches(0, worker_id=w, num_workers=7))) for w in range(7)] == [
        1,
        1,
        1,
        0,
        0,
        0,
        0,
    ]


def test_single_row_many_ranks_pads_by_wrapping(permutation_kind):
    plan = EpochPlan(num_rows=1, batch_size=4, world_size=7, drop_last=False)
    assert [rank_rows(plan, r) for r in range(7)] == [[[0]]] * 7


@pytest.mark.parametrize(
    "kwargs,error,message",
    [
        (
            dict(num_rows=10, batch_size=0),
            ValueError,
            "batch_size should be an integer >= 1, but got batch_size=0",
        ),
        (
            dict(num_rows=10, batch_size=2.0),
            TypeError,
            "batch_size should be an integer, but got batch_size=2.0 (float)",
        ),
        (
            dict(num_rows=10, batch_size=True),
            TypeError,
            "batch_size should be an integer, but got batch_size=True (a bool)",
        ),
        (
            dict(num_rows=0, batch_size=1),
            ValueError,
            "num_rows should be an integer >= 1, but got num_rows=0",
        ),
        (
            dict(num_rows=10, batch_size=1, seed=-1),
            ValueError,
            "seed should be an integer >= 0, but got seed=-1",
        ),
        (
            dict(num_rows=10, batch_size=1, world_size=0),
            ValueError,
            "world_size should be an integer >= 1, but got world_size=0",
        ),
        (
            dict(num_rows=10, batch_size=1, drop_last=1),
            TypeError,
            "drop_last should be True or False, but got drop_last=1",
        ),
        (
            dict(num_rows=10, batch_size=4, world_size=3),
            ValueError,
            "drop_last=True needs at least batch_size * world_size = 4 * 3 = 12 rows, but the dataset has 10; use a smaller batch_size or drop_last=False",
        ),
    ],
)
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
    with pytest.raises(
        IndexError, match=r"^position=10 is outside the plan's global batches \[0, 10\)$"
    ):
        plan.batch(10)
    with pytest.raises(
        IndexError, match=r"^position=3 is outside the plan's global batches \[4, 10\)$"
    ):
        EpochPlan(num_rows=100, batch_size=10, world_size=2, start=4).batch(3)


@pytest.mark.parametrize("drop_last", [True, False])
@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_resume_with_the_same_world_size_continues_the_epoch(
    world_size, drop_last, permutation_kind
):
    """A plan started at any round boundary yields exactly the uninterrupted epoch's later batches."""
    full = EpochPlan(
        num_rows=1003, batch_size=10, seed=4, epoch=2, world_size=world_size, drop_last=drop_last
    )
    for rounds_done in (0, 1, 17, full.batches_per_rank - 1, full.batches_per_rank):
        start = rounds_done * world_size
        resumed = EpochPlan(
            num_rows=1003,
            batch_size=10,
            seed=4,
            epoch=2,
            world_size=world_size,
            drop_last=drop_last,
            start=start,
        )
        assert resumed.end == full.end
        for rank in range(world_size):
            expected = [b.indices.tolist() for b in full.rank_batches(rank)][rounds_done:]
            assert rank_rows(resumed, rank) == expected


@pytest.mark.parametrize("drop_last", [True, False])
def test_elastic_resume_delivers_every_row_once(drop_last, permutation_kind):
    """2 ranks consume 34 global batches, then 3 ranks take the rest: no row twice, none lost
    but the documented tail."""
    before = EpochPlan(num_rows=1003, batch_size=10, seed=1, world_size=2, drop_last=drop_last)
    done = []
    for rank in range(2):
        done += [b.indices.tolist() for b in before.rank_batches(rank)][:17]
    after = EpochPlan(
        num_rows=1003, batch_size=10, seed=1, world_size=3, drop_last=drop_last, start=34
    )
    assert after.num_remaining == 1003 - 340
    rest = [rows for rank in range(3) for rows in rank_rows(after, rank)]
    assert len({len(rank_rows(after, rank)) for rank in range(3)}) == 1  # equal steps per rank
    delivered = [row for rows in done + rest for row in rows]
    permutation = before.permutation.tolist()
    if drop_last:
        # 663 rows remain: 22 rounds of 30 rows, the last 3 rows of the permutation are dropped
        assert after.batches_per_rank == 22 and after.num_dropped == 3
        assert sorted(delivered) == sorted(permutation[:1000])
    else:
        # 663 rows: 22 full rounds and a last round of ceil(3 / 3) = 1 row per rank
        assert after.batches_per_rank == 23 and after.last_batch_size == 1
        assert after.num_padded == 0 and sorted(delivered) == list(range(1003))


def test_a_plan_started_at_or_past_its_end_is_empty(permutation_kind):
    plan = EpochPlan(num_rows=11, batch_size=2, world_size=2, drop_last=False, start=6)
    assert plan.num_remaining == 0 and plan.batches_per_rank == 0 and plan.end == 6
    assert rank_rows(plan, 0) == [] and plan.num_delivered == 0 and plan.last_batch_size == 0
    # drop_last=True: fewer rows left than one round is an empty plan, not an error
    assert EpochPlan(num_rows=1003, batch_size=10, world_size=3, start=99).batches_per_rank == 0


@pytest.mark.parametrize("num_workers", [1, 2, 3])
def test_skip_resumes_each_worker_at_its_own_next_batch(num_workers, permutation_kind):
    """Worker w of K resuming after the rank delivered ``skip`` batches takes the batches
    j >= skip with j = w (mod K): together, in round-robin order, the rest of the rank's batches."""
    plan = EpochPlan(num_rows=1003, batch_size=10, world_size=2)
    positions = [b.position for b in plan.rank_batches(1)]
    for skip in (0, 1, 5, 49, 50):
        per_worker = [
            [
                b.position
                for b in plan.rank_batches(1, worker_id=w, num_workers=num_workers, skip=skip)
            ]
            for w in range(num_workers)
        ]
        assert sorted(p for ps in per_worker for p in ps) == positions[skip:]
        for w, ps in enumerate(per_worker):
            assert all((p - 1) // 2 % num_workers == w and (p - 1) // 2 >= skip for p in ps)


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_shuffle_false_without_drop_last_reads_every_row_once_in_order(world_size):
    """23 rows in batches of 4: 6 global batches (the last of 3 rows) dealt round-robin, nothing
    padded; ranks past the last batch's rank have one batch fewer; every epoch the same."""
    plans = [
        EpochPlan(
            num_rows=23,
            batch_size=4,
            epoch=epoch,
            world_size=world_size,
            drop_last=False,
            shuffle=False,
            seed=9,
        )
        for epoch in (0, 3)
    ]
    for plan in plans:
        assert plan.permutation_kind == "identity" and plan.num_batches == 6 and plan.end == 6
        assert (plan.num_padded, plan.num_dropped, plan.last_batch_size) == (0, 0, 3)
        per_rank = [[b.indices.tolist() for b in plan.rank_batches(r)] for r in range(world_size)]
        assert [len(batches) for batches in per_rank] == [
            plan.batches_of(r) for r in range(world_size)
        ]
        assert [plan.batches_of(r) for r in range(world_size)] == [
            len(range(r, 6, world_size)) for r in range(world_size)
        ]
        merged = [per_rank[g % world_size][g // world_size] for g in range(6)]
        assert sum(merged, []) == list(range(23))  # dataset order, every row once
        workers = [
            b.indices.tolist()
            for w in range(2)
            for b in plan.rank_batches(0, worker_id=w, num_workers=2)
        ]
        assert sorted(map(tuple, workers)) == sorted(map(tuple, per_rank[0]))


def test_shuffle_false_with_drop_last_keeps_full_equal_rounds():
    plan = EpochPlan(num_rows=23, batch_size=4, world_size=2, shuffle=False)
    assert plan.batches_per_rank == 2 and plan.num_dropped == 7
    assert [b.indices.tolist() for b in plan.rank_batches(1)] == [[4, 5, 6, 7], [12, 13, 14, 15]]


def test_shuffle_false_resumes_from_a_position_on_other_ranks():
    """Stopped after 3 global batches of the 6: the rest (rows 12-22) on 2 ranks, once each."""
    rest = EpochPlan(
        num_rows=23, batch_size=4, world_size=2, drop_last=False, shuffle=False, start=3
    )
    ids = [i for r in range(2) for b in rest.rank_batches(r) for i in b.indices.tolist()]
    assert (
        sorted(ids) == list(range(12, 23)) and rest.batches_of(0) == 2 and rest.batches_of(1) == 1
    )


# -- seeds: every (seed, epoch) its own order --------------------------------------------------
#: Pairs that ``SeedSequence([seed, epoch])`` (the rule before "Seeds") gave one entropy: it drops
#: each integer's high zero words and pads short entropies with zeros, so ``2**32 + 7, 0`` and
#: ``7, 1`` were both the words ``[7, 1]``.
COLLIDED = [
    ((2**32 + 7, 0), (7, 1)),
    ((2**32, 5), (0, 5 * 2**32 + 1)),
    ((2**63, 0), (0, 2**31)),
    ((7 * 2**32 + 2**32 - 1, 0), (2**32 - 1, 7)),
]


@pytest.mark.parametrize("kind", ["array", "lazy"])
@pytest.mark.parametrize(("first", "second"), COLLIDED)
def test_pairs_whose_words_collided_give_different_orders(kind, first, second):
    orders = [
        np.asarray(make_permutation(kind, 1000, seed, epoch)) for seed, epoch in (first, second)
    ]
    assert not np.array_equal(*orders)
    assert np.array_equal(np.sort(orders[0]), np.arange(1000))


@pytest.mark.parametrize("kind", ["array", "lazy"])
def test_every_seed_and_epoch_of_small_words_gives_its_own_order(kind):
    """Seeds and epochs of two 32-bit words, each in 0..3 (zero words included): 256 pairs, 256
    distinct orders of 1,000 rows (the rule before "Seeds" gave 208: 48 pairs had another's
    order)."""
    small = [low + 2**32 * high for low in range(4) for high in range(4)]
    orders = {
        tuple(np.asarray(make_permutation(kind, 1000, seed, epoch)).tolist())
        for seed in small
        for epoch in small
    }
    assert len(orders) == len(small) ** 2


def test_a_seed_or_epoch_beyond_64_bits_is_refused():
    for call in (
        lambda: EpochPlan(num_rows=10, batch_size=2, seed=2**64),
        lambda: epoch_permutation(10, 2**64, 0),
        lambda: LazyPermutation(10, 2**64, 0),
    ):
        with pytest.raises(ValueError) as info:
            call()
        assert str(info.value) == (
            "seed should be an integer in [0, 2**64), but got seed=18446744073709551616; pass a "
            "value below 2**64 (e.g. seed % 2**64)"
        )
    with pytest.raises(ValueError, match=r"^epoch should be an integer in \[0, 2\*\*64\), but"):
        EpochPlan(num_rows=10, batch_size=2, epoch=2**64)
    assert EpochPlan(num_rows=10, batch_size=2, seed=2**64 - 1).permutation.shape == (10,)


def test_the_mixture_and_split_streams_follow_the_rule():
    """A mixture's dataset seed and a split's order, from the words "Seeds" states (the split's
    are those of SeedSequence(seed, spawn_key=(SPLIT_STREAM,)), so splits keep their parts)."""
    seed = 2**32 + 9
    words = np.array([9, 1, 0, 0, 0x4D495854, 3, 0], dtype=np.uint32)
    expected = np.random.SeedSequence(words).generate_state(1, np.uint64)[0]
    assert dataset_seed(seed, 3) == int(expected)
    assert dataset_seed(seed, 3) != dataset_seed(9, 3) != dataset_seed(seed, 4)
    reference = np.arange(500, dtype=np.uint16)
    sequence = np.random.SeedSequence(seed, spawn_key=(0x53504C54,))
    np.random.Generator(np.random.PCG64(sequence)).shuffle(reference)
    assert np.array_equal(split_order(500, seed), reference)
