"""Several datasets as one: a list ``source`` read as the concatenation (one local dataset and one
on the test S3 server, each with its own storage options), and a weighted mixture
(``Mixture(..., weights=...)``). Every guarantee of one dataset holds over the whole: every
(dataset, id) once an epoch, ranks, resume and elastic resume, the state naming every dataset and
version.

The local dataset's ids are ``LOCAL + position`` and the S3 dataset's ids its positions, so an id
names its dataset: global position ``p`` is local row ``p`` below ``LOCAL_ROWS``, else S3 row
``p - LOCAL_ROWS``.
"""

from __future__ import annotations

import json
import pickle

import lance
import numpy as np
import pyarrow as pa
import pytest
from support.contracts import check_resume
from support.fakes import ids_table
from support.helpers import WORKERS, batch_ids, collect
from torch.utils.data import ChainDataset, DataLoader

from lance_prefetch import Dataset, DiskCache, Mixture, PrefetchLoader, ReadOptions
from lance_prefetch.plan._mixture import epoch_length, mixture_counts
from lance_prefetch.plan.permutation import make_permutation
from lance_prefetch.sources import _multi

LOCAL, LOCAL_ROWS, S3_ROWS = 10_000, 130, 70  # 200 rows: 20 batches of 10, 10 a rank of 2


def write_shifted(path, num_rows: int, base: int, **kwargs) -> str:
    """:func:`ids_table` rows with ids ``base + position`` (in fragments of 40 rows)."""
    table = ids_table(num_rows)
    table = table.set_column(0, "id", pa.array(np.arange(base, base + num_rows, dtype=np.int64)))
    lance.write_dataset(table, str(path), max_rows_per_file=40, **kwargs)
    return str(path)


@pytest.fixture
def two(tmp_path, s3, fresh_s3_ids):
    """``(sources, storage_options)``: the local dataset, then the S3 one (fragments of 30)."""
    local = write_shifted(tmp_path / "local.lance", LOCAL_ROWS, LOCAL)
    return [local, fresh_s3_ids(S3_ROWS, rows_per_file=30)], [None, s3.storage_options()]


def concat(two, **kwargs) -> PrefetchLoader:
    sources, options = two
    datasets = [Dataset(uri, storage_options=o) for uri, o in zip(sources, options, strict=True)]
    return PrefetchLoader(datasets, 10, columns=["id"], seed=3, **kwargs)


def ids_at(positions) -> list[int]:
    """The ids at global positions of the concatenation."""
    return [LOCAL + p if p < LOCAL_ROWS else p - LOCAL_ROWS for p in np.asarray(positions).tolist()]


def planned(loader: PrefetchLoader, rank: int, epoch: int) -> list[list[int]]:
    plan = loader.epoch_plan(epoch)
    return [ids_at(batch.indices) for batch in plan.rank_batches(rank)]


@pytest.mark.timeout(60)
def test_local_and_s3_concatenated_read_every_row_once_on_1_and_2_ranks(two):
    everything = sorted([LOCAL + i for i in range(LOCAL_ROWS)] + list(range(S3_ROWS)))
    for world_size in (1, 2):
        seen = []
        for rank in range(world_size):
            loader = concat(two, rank=rank, world_size=world_size)
            assert loader.num_rows == 200 and loader.version == (1, 1)
            got = collect(loader, epoch=1)
            assert len(got) == 20 // world_size and all(len(b) == 10 for b in got)
            assert got == planned(loader, rank, 1)
            seen += [i for batch in got for i in batch]
        assert sorted(seen) == everything  # each (dataset, id) once: ids name their dataset
    state = loader.state_dict()
    assert state["format_version"] == 5 and state["weights"] is None
    assert state["datasets"] == [
        {"uri": two[0][0], "version": 1, "num_rows": LOCAL_ROWS},
        {"uri": two[0][1], "version": 1, "num_rows": S3_ROWS},
    ]
    assert (state["uri"], state["version"], state["num_rows"]) == (two[0][0], 1, 200)


@pytest.mark.timeout(60)
def test_concatenation_resumes_mid_epoch_and_on_another_world_size(two):
    check_resume(lambda: concat(two), midpoint=7, epoch=2)
    first = concat(two, rank=0, world_size=2)
    first.set_epoch(2)
    iterator = iter(first)
    head = [next(iterator)["id"].tolist() for _ in range(3)]  # global batches 0, 2, 4
    state = json.loads(json.dumps(first.state_dict()))
    first.close()
    assert head == planned(first, 0, 2)[:3] and state["position"] == 6
    alone = concat(two)
    alone.load_state_dict(state)
    plan = alone.epoch_plan(2)
    assert batch_ids(alone) == [ids_at(batch.indices) for batch in plan.rank_batches(0)][6:]


@pytest.mark.timeout(60)
def test_a_batch_across_datasets_is_one_take_per_dataset_in_the_plans_order(two):
    loader = concat(two, readahead=1, read=ReadOptions(coalesce=1, max_in_flight=1))
    takes = []
    for index, inner in enumerate(loader._source.sources):
        read = inner.take
        inner.take = lambda rows, read=read, index=index: (
            takes.append((index, len(rows))) or read(rows)
        )
    first = next(iter(loader))["id"].tolist()
    loader.close()
    assert first == planned(loader, 0, 0)[0]
    local = sum(i >= LOCAL for i in first)
    assert 0 < local < 10  # the batch holds rows of both datasets (seed 3)
    assert takes[:2] == [(0, local), (1, 10 - local)]


@pytest.mark.timeout(60)
def test_a_resume_over_another_list_of_datasets_is_refused_naming_the_difference(two, tmp_path):
    state = concat(two).state_dict()
    other = write_shifted(tmp_path / "other.lance", LOCAL_ROWS, LOCAL)
    sources, options = two
    with pytest.raises(ValueError) as error:
        PrefetchLoader(
            [
                Dataset(other, storage_options=options[0]),
                Dataset(sources[1], storage_options=options[1]),
            ],
            10,
            seed=3,
        ).load_state_dict(state)
    assert str(error.value) == (
        f"state does not match this loader: datasets[0] is {sources[0]!r} version 1 in the state "
        f"but {other!r} version 1 in this loader. Build the loader with the state's values to "
        f"resume, or start without load_state_dict"
    )
    with pytest.raises(ValueError, match=r"the state reads 2 datasets \(.*\) but this loader 1"):
        PrefetchLoader([sources[0]], 10, seed=3).load_state_dict(state)
    single = PrefetchLoader(sources[0], 10, seed=3).state_dict()
    with pytest.raises(ValueError, match=r"^state does not match this loader: datasets is None in"):
        PrefetchLoader([sources[0]], 10, seed=3).load_state_dict(single)


def test_a_column_of_another_type_is_refused_naming_dataset_column_and_both_types(tmp_path):
    first = write_shifted(tmp_path / "a.lance", 20, 0)
    table = ids_table(20)
    lance.write_dataset(
        table.set_column(2, "label", table["label"].cast(pa.int32())), tmp_path / "b"
    )
    second = str(tmp_path / "b")
    with pytest.raises(ValueError) as error:
        PrefetchLoader([first, second], 4)
    assert str(error.value) == (
        f"source[1] ({second!r} version 1): column 'label' is int32 there but int64 in "
        f"source[0] ({first!r}); every dataset must hold the columns read with the same type: "
        f"cast it (e.g. with LanceDataset.alter_columns), or leave it out of columns"
    )
    assert PrefetchLoader([first, second], 4, columns=["id", "vector"]).num_rows == 40
    strict = pa.schema([pa.field("x", pa.float64(), nullable=False)])
    lance.write_dataset(pa.table({"x": [7.0, 8.0]}, schema=strict), tmp_path / "strict")
    lance.write_dataset(pa.table({"x": [9.0, None]}), tmp_path / "nulls")
    loader = PrefetchLoader([str(tmp_path / "strict"), str(tmp_path / "nulls")], 4, shuffle=False)
    (batch,) = list(loader)  # nullability aside: the union is nullable, the null a NaN
    assert batch["x"].tolist()[:3] == [7.0, 8.0, 9.0] and np.isnan(batch["x"][3].item())
    lance.write_dataset(table.select(["id"]), tmp_path / "c")
    with pytest.raises(ValueError, match=r"^source\[1\]: columns \['vector', 'label'\] are not in"):
        PrefetchLoader([first, str(tmp_path / "c")], 4)


def test_weights_take_numpy_numbers_and_arrays(ids_25):
    # np.int64 is a number (numbers.Integral); a 1-D array is a list of them
    for weights in ([np.int64(3), 1], np.array([3, 1]), np.array([0.75, 0.25])):
        loader = PrefetchLoader(Mixture([ids_25, ids_25], weights=weights), 4)
        assert loader.state_dict()["weights"] == [0.75, 0.25]
    with pytest.raises(TypeError, match=r"^weights\[0\] should be a number, but got True"):
        PrefetchLoader(Mixture([ids_25, ids_25], weights=[True, 1]), 4)
    with pytest.raises(TypeError, match=r"^weights should be a list of numbers, one per dataset"):
        Mixture([ids_25, ids_25], weights=0.5)


def test_huge_and_tiny_weights_normalise_without_overflow(ids_25):
    """Weights near the float limits are proportions like any others: [1e308, 1e308] and
    [1e-320, 1e-320] are [0.5, 0.5] (was: OverflowError from the sum, from floor(25 / 1e-320))."""
    for weights in ([1e308, 1e308], [1e-320, 1e-320], [5e-324, 5e-324]):
        loader = PrefetchLoader(Mixture([ids_25, ids_25], weights=weights), 5)
        assert loader.state_dict()["weights"] == [0.5, 0.5] and len(loader) == 10
    assert epoch_length([1.0, 1e-320], [25, 25]) == 25  # 25 / 1e-320 overflows: no bound


@pytest.mark.parametrize(
    ("weights", "share", "rows"),
    [
        ([1, 1e-12], "1e-12", "2.5e-11"),
        ([1, 1e-320], "1e-320", "2.5e-319"),
        ([1e308, 1e-300], "0", "0"),
        ([1, 0.02], "0.0196", "0.49"),
    ],
)
def test_a_weight_that_leaves_a_dataset_no_row_is_refused(ids_25, weights, share, rows):
    """Was: [1, 1e-12] read dataset 1 zero rows every epoch, silently; [1, 1e-320] raised a bare
    OverflowError."""
    with pytest.raises(ValueError) as info:
        PrefetchLoader(Mixture([ids_25, ids_25], weights=weights), 5)
    assert str(info.value) == (
        f"weights: source[1] ({ids_25!r}) would give no row to any epoch: weights[1] is {share} "
        f"of the weights' sum, and an epoch of the mixture holds 25 rows (25 * {share} = {rows} "
        f"rows, rounded to 0); raise weights[1] to at least 1/25 of the weights' sum, or leave "
        f"source[1] out"
    )
    assert len(PrefetchLoader(Mixture([ids_25, ids_25], weights=[24, 1]), 5)) == 5  # 1/25: one row


def test_a_mixture_checks_its_datasets_and_weights_before_any_io(ids_25):
    with pytest.raises(ValueError) as error:
        Mixture([ids_25, ids_25], weights=[1, 1, 1])
    assert str(error.value) == (
        "Mixture: weights lists 3 values, but datasets lists 2; give one weight per dataset, "
        "in the order of datasets"
    )
    with pytest.raises(ValueError) as error:
        Mixture([ids_25], weights=[1, 2])
    assert str(error.value) == (
        "Mixture: datasets should list at least two datasets, but got 1; pass one dataset as "
        "source directly"
    )
    with pytest.raises(TypeError, match=r"^Mixture: datasets should be a list of datasets, but"):
        Mixture(ids_25, weights=[1, 2])
    with pytest.raises(TypeError, match=r"^datasets\[1\] should be a dataset URI \(str or os"):
        Mixture([ids_25, 3], weights=[1, 2])
    with pytest.raises(ValueError, match=r"^weights\[1\] should be a finite number > 0, but got 0"):
        Mixture([ids_25, ids_25], weights=[1, 0])
    with pytest.raises(ValueError, match=r"^source is an empty list"):
        PrefetchLoader([], 4)
    with pytest.raises(TypeError, match=r"^source\[1\] should be a dataset URI \(str or os"):
        PrefetchLoader([ids_25, 3], 4)


def test_each_dataset_has_its_own_filter_and_cache(tmp_path):
    first, second = (
        write_shifted(tmp_path / "a.lance", 50, LOCAL),
        write_shifted(tmp_path / "b.lance", 30, 0),
    )
    loader = PrefetchLoader([first, second], 4, filter="label < 3", cache="memory", drop_last=False)
    assert loader.num_rows == 15 + 9  # labels are position % 10 in each
    ids = sorted(i for batch in batch_ids(loader) for i in batch)
    assert ids == sorted(
        [LOCAL + i for i in range(50) if i % 10 < 3] + [i for i in range(30) if i % 10 < 3]
    )
    assert [inner.cached for inner in loader._source.sources] == [True, True]
    assert len(pickle.dumps(loader)) < 8_000  # small: URIs, versions, the offsets; never a dataset


def test_the_rows_a_cache_holds_are_counted_per_dataset_of_a_concatenation_and_a_mixture(tmp_path):
    """Only the first dataset's cache is filled: of any positions, exactly those of its rows
    count as held, for the concatenation and each mixture epoch; and a filter over a disk copy."""
    first, second = (
        write_shifted(tmp_path / "a.lance", 50, LOCAL),
        write_shifted(tmp_path / "b.lance", 30, 0),
    )
    options = {"filter": "label < 3", "cache": "memory", "drop_last": False}
    concat = PrefetchLoader([first, second], 4, **options)
    concat._source.sources[0].fill()  # 15 rows held; the second cache never started
    positions = np.arange(concat.num_rows)
    assert concat._source.cached_rows(positions) == 15
    assert concat._source.cached_rows(positions[10:20]) == 5  # positions 10 .. 14 are the first's
    plain = PrefetchLoader([first, second], 4, filter="label < 3", drop_last=False)
    assert plain._source.cached_rows(positions) is None
    mixed = PrefetchLoader(Mixture([first, second], weights=[1, 1]), 4, **options)
    mixed._source.sources[0].fill()
    for epoch in (0, 1):
        view = _multi.epoch_view(mixed._source, epoch)
        rows = view.mixture.rows_of(view._samples, np.arange(mixed.num_rows))
        assert view.cached_rows(np.arange(mixed.num_rows)) == int(np.sum(rows < 15))
    with pytest.raises(RuntimeError, match="for_epoch"):
        mixed._source.cached_rows(positions)
    # a filter over a disk copy: none held before the copy is open, every selected row after
    disk = PrefetchLoader(first, 4, filter="label < 3", cache=DiskCache(dir=tmp_path / "c"))
    assert disk._source.cached_rows(np.arange(15)) == 0
    disk._source.inner.fill()
    assert disk._source.cached_rows(np.arange(15)) == 15


def test_a_mixture_epoch_is_a_row_source_of_its_own_positions(tmp_path):
    """A mixture bound to an epoch forwards the RowSource members to the mixture (its identity,
    its L positions, their bounds check) and nothing else: no attribute falls through."""
    first = write_shifted(tmp_path / "a.lance", 50, LOCAL)
    second = write_shifted(tmp_path / "b.lance", 30, 0)
    mixture = PrefetchLoader(Mixture([first, second], weights=[1, 3]), 4)._source
    view = _multi.epoch_view(mixture, 2)
    assert (view.uri, view.version, view.columns) == (mixture.uri, mixture.version, mixture.columns)
    assert (view.schema, view.io, view.cached) == (mixture.schema, mixture.io, None)
    assert view.num_rows == mixture.length == 40  # min(50 / 0.25, 30 / 0.75)
    assert view.options_repr() == [None, None]
    assert view.cached_rows(np.arange(4)) is None
    with pytest.raises(
        IndexError, match=r"^row positions must be in \[0, 40\) .* got min 0, max 40$"
    ):
        view.take(np.array([0, 40]))
    assert not hasattr(view, "weights") and not hasattr(view, "datasets")


@pytest.mark.timeout(60)
def test_two_dataloader_workers_read_the_concatenation_and_a_mixture_as_planned(tmp_path):
    """One DataLoader (2 forkserver workers) over the concatenation, then a mixture of the same
    two datasets (0.5 / 0.5 of 50 and 30 rows: 60 a epoch, 7 batches of 8): each worker's loader
    arrives pickled, reads its share, and the DataLoader hands them out in the plans' order."""
    paths = [
        write_shifted(tmp_path / "a.lance", 50, LOCAL),
        write_shifted(tmp_path / "b.lance", 30, 0),
    ]
    both = PrefetchLoader(paths, 8, columns=["id"], seed=1)
    mixed = PrefetchLoader(Mixture(paths, weights=[1, 1]), 8, columns=["id"], seed=1)
    mixed.set_epoch(2)
    expected = [
        [LOCAL + p if p < 50 else p - 50 for p in b.indices.tolist()]
        for b in both.epoch_plan(0).rank_batches(0)
    ]
    expected_mixed = batch_ids(mixed)  # read in this process: the reference
    assert len(expected) == 10 and len(expected_mixed) == 7
    mixed.set_epoch(2)  # again: the workers read epoch 2 too
    loader = DataLoader(
        ChainDataset([both, mixed]), batch_size=None, num_workers=2, multiprocessing_context=WORKERS
    )
    assert batch_ids(loader) == expected + expected_mixed


def test_the_mixture_rule_sets_the_epoch_length_and_counts():
    assert epoch_length([0.7, 0.3], [70, 60]) == 100  # the first dataset binds
    assert mixture_counts([0.7, 0.3], 100).tolist() == [70, 30]
    assert epoch_length([0.7, 0.3], [100, 60]) == 142
    assert mixture_counts([0.7, 0.3], 142).tolist() == [99, 43]  # 99.4, 42.6: largest remainder
    assert epoch_length([0.5, 0.5], [10, 1000]) == 20
    weights = [1 / 3] * 3
    assert mixture_counts(weights, epoch_length(weights, [7, 7, 9])).tolist() == [7, 7, 7]
    # weights 5:7 and 2:9 are not exact in floats (147 / (7 / 12) is 251.99..., 77 * (9 / 11)
    # is 63.00...01): the binding dataset is still read whole, L = min floor(N_i / w_i) exactly
    assert epoch_length([5 / 12, 7 / 12], [247, 147]) == 252
    assert mixture_counts([5 / 12, 7 / 12], 252).tolist() == [105, 147]
    assert epoch_length([2 / 11, 9 / 11], [275, 63]) == 77
    assert mixture_counts([2 / 11, 9 / 11], 77).tolist() == [14, 63]
    # a tie of remainders (79.5, 53, 238.5) goes to the lower index, whatever the float noise
    assert mixture_counts([3 / 14, 2 / 14, 9 / 14], 371).tolist() == [80, 53, 238]
    assert mixture_counts([10 / 24, 4 / 24, 10 / 24], 244).tolist() == [102, 41, 101]


def mixture(paths, **kwargs) -> PrefetchLoader:
    return PrefetchLoader(Mixture(paths, weights=[0.7, 0.3]), 10, columns=["id"], seed=5, **kwargs)


@pytest.fixture
def mixed(tmp_path):
    """70 rows (ids 10,000+) and 60 rows (ids 0+), read 0.7 / 0.3: 100 a epoch, 70 and 30."""
    return [
        write_shifted(tmp_path / "a.lance", 70, LOCAL),
        write_shifted(tmp_path / "b.lance", 60, 0),
    ]


def test_a_mixture_reads_exact_proportions_each_epoch_without_repeats(mixed, monkeypatch):
    built = []
    monkeypatch.setattr(
        _multi, "make_permutation", lambda *a: built.append(a) or make_permutation(*a)
    )
    samples = []
    for epoch in (0, 1):
        seen = []
        for rank in (0, 1):
            loader = mixture(mixed, rank=rank, world_size=2)
            assert loader.num_rows == 100
            got = collect(loader, epoch=epoch)
            assert len(got) == 5 and all(len(b) == 10 for b in got)
            seen += [i for batch in got for i in batch]
        assert len(set(seen)) == 100  # no row twice in an epoch
        assert sorted(i for i in seen if i >= LOCAL) == list(range(LOCAL, LOCAL + 70))  # all
        small = sorted(i for i in seen if i < LOCAL)
        assert len(small) == 30 and set(small) <= set(range(60))
        samples.append(small)
    assert samples[0] != samples[1]  # another 30 of the 60 each epoch
    assert [(kind, size, epoch) for kind, size, _, epoch in built] == [
        ("auto", size, epoch) for epoch in (0, 1) for _rank in (0, 1) for size in (70, 60)
    ]  # each dataset's sample built once an iteration, not once a take
    state = loader.state_dict()
    assert state["weights"] == [0.7, 0.3] and [d["num_rows"] for d in state["datasets"]] == [70, 60]


def test_a_mixture_resumes_exactly_and_refuses_other_weights(mixed):
    check_resume(lambda: mixture(mixed), midpoint=4, epoch=1)
    first = mixture(mixed, rank=1, world_size=2)  # elastic: 2 ranks, then 1
    first.set_epoch(1)
    iterator = iter(first)
    head = [next(iterator)["id"].tolist() for _ in range(2)]
    elastic = json.loads(json.dumps(first.state_dict()))
    first.close()
    alone = mixture(mixed)
    alone.load_state_dict(elastic)
    whole = mixture(mixed)
    whole.set_epoch(1)
    reference = batch_ids(whole)
    assert head == reference[1:4:2] and batch_ids(alone) == reference[4:]
    state = mixture(mixed).state_dict()
    with pytest.raises(ValueError, match=r"weights is \[0\.7, 0\.3\] in the state but \[0\.6"):
        PrefetchLoader(
            Mixture(mixed, weights=[0.6, 0.4]), 10, columns=["id"], seed=5
        ).load_state_dict(state)


def test_each_dataset_is_pinned_to_its_own_version_at_construction(tmp_path):
    first = write_shifted(tmp_path / "a.lance", 20, LOCAL)
    lance.write_dataset(ids_table(5), first, mode="append")  # version 2: 25 rows
    second = write_shifted(tmp_path / "b.lance", 10, 0)
    loader = PrefetchLoader(
        [Dataset(first, version=1), Dataset(second, version=None)], 6, columns=["id"], shuffle=False
    )
    lance.write_dataset(ids_table(3), second, mode="append")  # after construction: not read
    assert (loader.num_rows, loader.version) == (30, (1, 1))
    ids = [i for batch in batch_ids(loader) for i in batch]
    assert ids == [LOCAL + i for i in range(20)] + list(range(10))
    state = loader.state_dict()
    assert [(d["version"], d["num_rows"]) for d in state["datasets"]] == [(1, 20), (1, 10)]
    latest = PrefetchLoader(
        [Dataset(first, version=2), Dataset(second, version=1)], 6, columns=["id"], shuffle=False
    )
    with pytest.raises(
        ValueError, match=r"datasets\[0\] is .* version 1 in the state but .* version 2"
    ):
        latest.load_state_dict(state)


def test_an_unshuffled_mixture_reads_each_datasets_first_rows_in_order(tmp_path):
    """shuffle=False: each dataset's share is its first rows, dataset after dataset, the same
    every epoch (weights [3, 1] over 25 and 25 rows: an epoch of 33, 25 then 8)."""
    first = write_shifted(tmp_path / "a.lance", 25, 100)
    second = write_shifted(tmp_path / "b.lance", 25, 200)
    loader = PrefetchLoader(
        Mixture([first, second], weights=[3, 1]), 5, columns=["id"], shuffle=False
    )
    expected = list(range(100, 125)) + list(range(200, 208))
    for epoch in (0, 1):
        loader.set_epoch(epoch)
        assert sum(batch_ids(loader), []) == expected
    assert loader.state_dict()["weights"] == [0.75, 0.25]
