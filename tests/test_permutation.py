"""Tests for lance_prefetch.plan.permutation: the lazy kind is an exact, uniform, constant-memory
permutation; plans and loaders keep every guarantee with it. (The exactness tests of
tests/test_sampling.py also run with the lazy kind, through its ``kind`` fixture.)"""

from __future__ import annotations

import gc
import itertools
import json
import pickle
import tracemalloc
from collections import Counter

import numpy as np
import pytest
from scipy import stats
from support.helpers import batch_ids, collect, epoch_sequence

from lance_prefetch import PrefetchLoader, Shuffle
from lance_prefetch.plan import permutation
from lance_prefetch.plan.permutation import (
    ArrayPermutation,
    LazyPermutation,
    index_dtype,
    make_permutation,
    resolve_kind,
)
from lance_prefetch.plan.sampling import EpochPlan

P_MIN = 1e-3  # chi-square tests: fail below this p-value (every input is seeded: deterministic)


def lazy(num_rows: int, seed: int = 0, epoch: int = 0) -> np.ndarray:
    return np.asarray(LazyPermutation(num_rows, seed, epoch))


# -- exactness and determinism -------------------------------------------------------------------
RANDOM_SIZES = np.random.default_rng(11).integers(4, 70_000, size=6).tolist()


@pytest.mark.parametrize(
    "num_rows", [1, 2, 3, 127, 128, 129, 2**16, 2**16 + 1, 1_000_003, *RANDOM_SIZES]
)
def test_lazy_is_a_permutation(num_rows):
    """Every offset exactly once, in the dtype of the array kind, for sizes around the
    domain's edges (powers of two, the 128-value small domain) and random ones."""
    order = lazy(num_rows, seed=3, epoch=1)
    assert order.dtype == index_dtype(num_rows) and order.shape == (num_rows,)
    assert np.array_equal(np.sort(order), np.arange(num_rows))
    if num_rows > 3:
        assert not np.array_equal(order, np.arange(num_rows))  # it does move rows


def test_take_slice_and_indexing_agree():
    perm = LazyPermutation(1_000, seed=5, epoch=2)
    whole = np.asarray(perm)
    positions = np.array([[999, 0], [17, 17]])
    assert np.array_equal(perm.take(positions), whole[positions])
    assert np.array_equal(perm.slice(100, 700), whole[100:700])
    assert np.array_equal(perm[::-3], whole[::-3]) and perm[-1] == whole[-1] == perm[999]
    assert len(perm) == 1_000 and perm[5:5].shape == (0,)
    with pytest.raises(
        IndexError, match=r"^positions should be in \[0, 1000\), but got \[0, 1000\]"
    ):
        perm.take(np.array([0, 1000]))
    with pytest.raises(TypeError, match="positions should be integers"):
        perm.take(np.array([0.5]))


def test_lazy_passes_are_the_same_as_one(monkeypatch):
    """Computed in passes of CHUNK_ROWS values or all at once, or (up to 2**14 rows) tabulated
    once: the same values."""
    whole, small = lazy(50_000, seed=1), lazy(1000, seed=1)
    monkeypatch.setattr(permutation, "CHUNK_ROWS", 999)
    assert np.array_equal(lazy(50_000, seed=1), whole)
    positions = np.arange(49_999, -1, -7)
    assert np.array_equal(LazyPermutation(50_000, 1, 0).take(positions), whole[positions])
    monkeypatch.setattr(permutation, "_TABLE_BITS", 0)
    assert np.array_equal(lazy(1000, seed=1), small)


def test_lazy_depends_on_seed_and_epoch_only():
    """Same (seed, epoch): same order, whatever the global RNG; other epochs and seeds differ; and
    the order is pinned (a change would break the resume of saved lazy states)."""
    np.random.seed(1)
    first = lazy(1000, seed=7, epoch=0)
    np.random.seed(2)
    assert np.array_equal(first, lazy(1000, seed=7, epoch=0))
    orders = {tuple(lazy(1000, seed=7, epoch=e)) for e in range(3)} | {tuple(lazy(1000, 8, 0))}
    assert len(orders) == 4
    assert first[:8].tolist() == GOLDEN_1000_7_0
    assert LazyPermutation(10**9, 1, 2).take(np.array([0, 1, 999_999_999])).tolist() == GOLDEN_1E9


GOLDEN_1000_7_0 = [119, 975, 66, 370, 67, 997, 2, 853]
GOLDEN_1E9 = [498026410, 891597744, 761818984]


def reference(num_rows: int, seed: int, epoch: int, position: int) -> int:
    """The lazy permutation as the module docstring states it, one position, in Python integers."""
    bits = max((num_rows - 1).bit_length(), 1)
    rounds = 24 if bits <= 7 else 8
    keys = epoch_sequence(seed, epoch).generate_state(rounds, np.uint64).tolist()
    full = 2**64 - 1

    def finaliser(z: int) -> int:  # splitmix64's
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & full
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & full
        return z ^ (z >> 31)

    value = position
    while True:
        high, low = bits // 2, bits - bits // 2
        a, b = value >> low, value & ((1 << low) - 1)
        for key in keys:
            a, b = b, a ^ (finaliser(b ^ key) & ((1 << high) - 1))
            high, low = low, high
        value = (a << low) | b
        if value < num_rows:
            return value


@pytest.mark.parametrize("num_rows", [1, 2, 5, 128, 129, 1000, 70_001, 2**32 + 5, 10**9])
def test_lazy_follows_its_specification(num_rows):
    positions = sorted({0, 1 % num_rows, num_rows // 2, num_rows - 1})
    perm = LazyPermutation(num_rows, seed=12, epoch=3)
    got = perm.take(np.array(positions)).tolist()
    assert got == [reference(num_rows, 12, 3, p) for p in positions]


def test_kinds_and_auto_threshold():
    assert resolve_kind("auto", 2**27) == "array" and resolve_kind("auto", 2**27 + 1) == "lazy"
    assert resolve_kind("array", 10**12) == "array" and resolve_kind("lazy", 1) == "lazy"
    assert isinstance(make_permutation("auto", 10, 0, 0), ArrayPermutation)
    assert isinstance(make_permutation("auto", 10**9, 0, 0), LazyPermutation)
    with pytest.raises(ValueError) as info:
        EpochPlan(num_rows=10, batch_size=2, permutation_kind="shuffled")
    assert str(info.value) == (
        "permutation should be one of 'auto', 'array', 'lazy', but got permutation='shuffled'"
    )
    with pytest.raises(TypeError, match=r"^permutation should be a string, but got permutation=1$"):
        EpochPlan(num_rows=10, batch_size=2, permutation_kind=1)
    plan = EpochPlan(num_rows=10, batch_size=2)
    assert plan.permutation_kind == "array"
    assert plan.permutation is plan.order.array  # the array kind is kept as it always was


# -- uniformity ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "num_rows,per_order", [(3, 100), (4, 60), pytest.param(5, 40, marks=pytest.mark.system)]
)
def test_small_lazy_permutations_are_all_equally_likely(num_rows, per_order):
    """Over ``per_order * N!`` seeds every one of the N! orders appears about equally often."""
    orders = list(itertools.permutations(range(num_rows)))
    counts = Counter(
        tuple(lazy(num_rows, seed).tolist()) for seed in range(per_order * len(orders))
    )
    assert set(counts) == set(orders)
    assert stats.chisquare([counts[order] for order in orders]).pvalue > P_MIN


@pytest.mark.parametrize("num_rows", [37, 1500])
def test_lazy_positions_are_uniform(num_rows):
    """Over 2,000 epochs: the row at position 0 and the position of row 0 are uniform (37 cells,
    or 15 bins of 100), and so is the pair of rows at positions 0 and 1 (in 10 x 10 bins)."""
    epochs = 2000
    bins = 15 if num_rows % 15 == 0 else num_rows
    firsts, where_zero, pairs = [], [], np.zeros((10, 10))
    for epoch in range(epochs):
        order = lazy(num_rows, seed=4, epoch=epoch).astype(np.int64)
        firsts.append(order[0])
        where_zero.append(np.flatnonzero(order == 0)[0])
        pairs[order[0] * 10 // num_rows, order[1] * 10 // num_rows] += 1
    for values in (firsts, where_zero):
        counts = np.bincount(np.array(values) * bins // num_rows, minlength=bins)
        assert stats.chisquare(counts).pvalue > P_MIN
    sizes = np.bincount(np.arange(num_rows) * 10 // num_rows)  # rows per bin
    expected = np.outer(sizes, sizes) - np.diag(sizes)  # ordered pairs of distinct rows per cell
    expected = expected * epochs / expected.sum()
    assert stats.chisquare(pairs.ravel(), expected.ravel()).pvalue > P_MIN


def test_ordered_pairs_of_a_small_permutation_are_uniform():
    """The rows at positions 0 and 1 of 8 rows: each ordered pair of distinct rows equally likely
    (a 3-bit domain: its unequal halves need more rounds than 6 for this)."""
    num_rows = 8
    count = num_rows * (num_rows - 1) * 30
    counts = Counter(tuple(lazy(num_rows, seed, 3)[:2].tolist()) for seed in range(count))
    cells = [(a, b) for a in range(num_rows) for b in range(num_rows) if a != b]
    assert stats.chisquare([counts[cell] for cell in cells]).pvalue > P_MIN


def test_a_large_lazy_permutation_has_no_order_left():
    """One permutation of 1,000,003 rows: no correlation of row and position, of neighbours, or
    with the next epoch; ascents are half the steps (all within about 5 standard deviations)."""
    num_rows = 1_000_003
    order = lazy(num_rows, seed=9).astype(np.float64)
    limit = 5 / np.sqrt(num_rows)
    assert abs(stats.pearsonr(order, np.arange(num_rows)).statistic) < limit
    assert abs(stats.pearsonr(order[:-1], order[1:]).statistic) < limit
    assert abs(stats.pearsonr(order, lazy(num_rows, seed=9, epoch=1)).statistic) < limit
    ascents = np.count_nonzero(order[1:] > order[:-1])
    assert abs(ascents - (num_rows - 1) / 2) < 5 * np.sqrt((num_rows + 1) / 12)


# -- memory --------------------------------------------------------------------------------------
def peak_bytes(work) -> int:
    """Peak bytes allocated (tracemalloc; numpy reports its arrays to it) while ``work()`` runs."""
    gc.collect()
    tracemalloc.start()
    try:
        work()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def read_start_middle_end(num_rows: int, kind: str) -> None:
    """Build plans over ``num_rows`` rows and read batches at their start, middle and end: one
    rank's and a worker's batches, a plan resumed mid-epoch on another world size, the padded end."""
    plan = EpochPlan(
        num_rows=num_rows,
        batch_size=1000,
        seed=1,
        world_size=8,
        drop_last=False,
        permutation_kind=kind,
    )
    assert plan.permutation_kind == resolve_kind(kind, num_rows)
    for position in (0, 1, plan.num_batches // 2, plan.end - 1):
        assert plan.batch(position).indices.max() < num_rows
    for batch in itertools.islice(plan.rank_batches(3, worker_id=1, num_workers=2, skip=7), 20):
        assert len(batch.indices) == 1000
    resumed = EpochPlan(
        num_rows=num_rows,
        batch_size=1000,
        seed=1,
        world_size=3,
        drop_last=False,
        start=plan.num_batches // 2 + 4,
        permutation_kind=kind,
    )
    for batch in itertools.islice(resumed.rank_batches(2), 20):
        assert len(batch.indices) == 1000
    last = list(resumed.rank_batches(2, skip=resumed.batches_per_rank - 1))
    assert len(last) == 1 and len(last[0].indices) == resumed.last_batch_size


def test_a_lazy_plan_of_a_billion_rows_stays_in_constant_memory():
    """Acceptance: N = 1e9 (4 GB as an array): under 1 MiB at peak, batches included."""
    read_start_middle_end(10**6, "lazy")  # imports and first-call caches, outside the measure
    assert peak_bytes(lambda: read_start_middle_end(10**9, "auto")) < 2**20
    assert EpochPlan(num_rows=10**9, batch_size=1).permutation_kind == "lazy"


def test_the_memory_measure_sees_a_materialised_permutation():
    """The same measure on the array kind: the whole permutation (4 bytes a row) shows."""
    num_rows = 2**20
    assert peak_bytes(lambda: read_start_middle_end(num_rows, "array")) > 4 * num_rows
    assert peak_bytes(lambda: read_start_middle_end(num_rows, "lazy")) < 2**20


# -- the loader ----------------------------------------------------------------------------------
def test_a_lazy_loader_delivers_every_row_once_per_epoch_on_two_ranks(make_loader, ids_1003):
    """2 ranks, drop_last=False: every id once per epoch but the one padded row, batches as the
    lazy plan says; epochs differ, and differ from the array kind's order."""
    loaders = [
        make_loader(
            ids_1003,
            10,
            columns=["id"],
            rank=r,
            world_size=2,
            drop_last=False,
            shuffle=Shuffle(permutation="lazy"),
        )
        for r in range(2)
    ]
    assert loaders[0].permutation == "lazy" and len(loaders[0]) == 51
    epochs = []
    for epoch in range(2):
        per_rank = [collect(loader, epoch=epoch) for loader in loaders]
        plan = loaders[0].epoch_plan(epoch)
        assert plan.permutation_kind == "lazy"
        for rank in range(2):
            assert per_rank[rank] == [b.indices.tolist() for b in plan.rank_batches(rank)]
        counts = Counter(i for batches in per_rank for batch in batches for i in batch)
        assert set(counts) == set(range(1003))
        assert sorted(counts.values()) == [1] * 1002 + [2]  # 1003 = 50 rounds of 20 + 3: 1 pad
        assert counts[plan.order[0]] == 2  # the padded row wraps around to the start
        epochs.append(per_rank)
    assert epochs[0] != epochs[1]
    array = make_loader(ids_1003, 10, columns=["id"], rank=0, world_size=2, drop_last=False)
    assert array.permutation == "array" and collect(array, epoch=0) != epochs[0][0]


def test_a_lazy_loader_resumes_mid_epoch_exactly(make_loader, ids_1003):
    """Stop after 17 batches on each of 2 ranks, save, resume with 2 ranks (and with 3): the
    rest is exactly the uninterrupted epoch (every row once across the old and new ranks)."""

    def loader(rank, world_size, **kwargs):
        return make_loader(
            ids_1003,
            10,
            columns=["id"],
            rank=rank,
            world_size=world_size,
            shuffle=Shuffle(permutation="lazy"),
            seed=2,
            **kwargs,
        )

    uninterrupted = [collect(loader(r, 2), epoch=1) for r in range(2)]
    head, states = [], []
    for rank in range(2):
        first = loader(rank, 2)
        first.set_epoch(1)
        iterator = iter(first)
        head.append(batch_ids(itertools.islice(iterator, 17)))
        states.append(json.loads(json.dumps(first.state_dict())))
        iterator.close()
    state = states[0]
    assert states[1] == state and state["position"] == 34
    assert state["format_version"] == 5 and state["permutation"] == "lazy"
    for rank in range(2):
        resumed = loader(rank, 2)
        resumed.load_state_dict(state)
        assert head[rank] + collect(resumed) == uninterrupted[rank]
    rest = []
    for rank in range(3):  # elastic: 3 ranks take the remaining 663 rows
        resumed = loader(rank, 3)
        resumed.load_state_dict(state)
        rest += collect(resumed)
    delivered = [i for batches in head + [rest] for batch in batches for i in batch]
    order = loader(0, 1).epoch_plan(1).order
    assert len(delivered) == len(set(delivered)) == 1000  # 22 rounds of 30: 3 rows dropped
    assert set(delivered) == set(order[:1000].tolist())


def test_the_permutation_kind_is_checked_on_load(ids_1003):
    """A lazy state loads only into a lazy loader and vice versa (named like other mismatches);
    a state without the field is refused."""
    lazy_state = PrefetchLoader(
        ids_1003, 10, columns=["id"], shuffle=Shuffle(permutation="lazy")
    ).state_dict()
    array_loader = PrefetchLoader(ids_1003, 10, columns=["id"])
    array_state = array_loader.state_dict()
    assert array_state["format_version"] == 5 and array_state["permutation"] == "array"
    with pytest.raises(ValueError) as info:
        array_loader.load_state_dict(lazy_state)
    assert str(info.value).startswith(
        "state does not match this loader: permutation is 'lazy' in the state but 'array' in "
        "this loader. Build the loader with the state's values to resume (PrefetchLoader(..., "
        "shuffle=Shuffle(permutation='lazy')))"
    )
    lazy_loader = PrefetchLoader(ids_1003, 10, columns=["id"], shuffle=Shuffle(permutation="lazy"))
    with pytest.raises(ValueError, match="permutation is 'array' in the state but 'lazy' in"):
        lazy_loader.load_state_dict(array_state)
    lazy_loader.load_state_dict(lazy_state | {"position": 3})
    assert lazy_loader.state_dict() == lazy_state | {"position": 3}
    with pytest.raises(ValueError, match=r"^state\['format_version'\] is 5, but state\['perm"):
        lazy_loader.load_state_dict({k: v for k, v in lazy_state.items() if k != "permutation"})
    with pytest.raises(ValueError, match=r"^state\['permutation'\] should be one of 'array', 'la"):
        lazy_loader.load_state_dict(lazy_state | {"permutation": "auto"})


def test_auto_resolves_at_construction_and_pickles_along(ids_1003, monkeypatch):
    """auto: lazy above LAZY_THRESHOLD rows; the resolved kind travels with the loader (into
    DataLoader workers, which unpickle it), whatever the threshold there."""
    monkeypatch.setattr(permutation, "LAZY_THRESHOLD", 1003)
    assert PrefetchLoader(ids_1003, 10, columns=["id"]).permutation == "array"
    monkeypatch.setattr(permutation, "LAZY_THRESHOLD", 1002)
    loader = PrefetchLoader(ids_1003, 10, columns=["id"])
    assert loader.permutation == "lazy"
    monkeypatch.setattr(permutation, "LAZY_THRESHOLD", 2**27)
    copy = pickle.loads(pickle.dumps(loader))
    assert copy.permutation == "lazy" and copy.epoch_plan(0).permutation_kind == "lazy"
    assert collect(copy, epoch=0) == collect(loader, epoch=0)
    with pytest.raises(ValueError, match=r"^permutation should be one of 'auto', 'array', 'lazy'"):
        PrefetchLoader(ids_1003, 10, columns=["id"], shuffle=Shuffle(permutation="Lazy"))
