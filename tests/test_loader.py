"""Tests for lance_prefetch.PrefetchLoader end to end on real Lance datasets (``id`` = position)."""

from __future__ import annotations

import pickle
import re
import threading
import time
from collections import Counter
from contextlib import closing

import lance
import numpy as np
import pytest
import torch
from support.helpers import (
    WORKERS,
    batch_ids,
    collect,
    collect_until,
    expected_rank_ids,
    loop_threads,
    stopping,
    wait_until,
)
from support.sources import TappedSource, tapped
from torch.utils.data import DataLoader

from lance_prefetch import BatchLoadError, Dataset, PrefetchLoader, ReadOptions


def test_batches_are_dicts_of_tensors_in_permutation_order(make_loader, ids_1003):
    """Each batch holds exactly the plan's rows, in permutation order, with matching columns."""
    loader = make_loader(ids_1003, 10, seed=3)
    batches = list(loader)
    assert len(batches) == len(loader) == 100
    first = batches[0]
    assert list(first) == ["id", "vector", "label"]
    assert first["id"].dtype == torch.int64 and first["id"].shape == (10,)
    assert first["vector"].dtype == torch.float32 and first["vector"].shape == (10, 3)
    assert torch.equal(
        first["vector"], first["id"][:, None].float() * torch.tensor([1.0, 2.0, 3.0])
    )
    assert torch.equal(first["label"], first["id"] % 10)
    assert batch_ids(batches) == expected_rank_ids(loader)
    assert [i for b in batch_ids(batches) for i in b] == loader.epoch_plan().permutation[
        :1000
    ].tolist()


def test_drop_last_false_single_process(make_loader, ids_1003):
    loader = make_loader(ids_1003, 10, drop_last=False, columns=["id"])
    batches = collect(loader)
    assert [len(b) for b in batches] == [10] * 100 + [3]
    assert sorted(i for b in batches for i in b) == list(range(1003))


@pytest.mark.system
@pytest.mark.slow
@pytest.mark.parametrize("make_loader", ["coalesced"], indirect=True)  # see READ_MODES
def test_num_workers_give_the_same_sequence(make_loader, ids_1003):
    """Acceptance 2: identical batch sequence for num_workers 0, 1, 3, 7 (spawn)."""
    for drop_last, sizes in ((True, [10] * 100), (False, [10] * 100 + [3])):
        loader = make_loader(ids_1003, 10, columns=["id"], seed=11, drop_last=drop_last)
        reference = collect(loader, 0, epoch=0)
        assert [len(b) for b in reference] == sizes
        assert reference == expected_rank_ids(loader)
        # (drop_last=False with workers: test_ranks_times_workers)
        for num_workers in [1, 3, 7] if drop_last else []:
            assert collect(loader, num_workers, epoch=0) == reference, num_workers


#: The drop_last values test_ranks_times_workers reads in each mode: both in the default mode; one
#: in each of the others (what a mode changes is how rows are read, not which rows are planned).
DROP_LAST_IN = {
    "coalesced": (False, True),
    "per-take": (True,),
    "memory": (False,),
    "disk": (True,),
}


@pytest.mark.slow
@pytest.mark.parametrize(
    "make_loader",
    [
        "coalesced",
        *(pytest.param(m, marks=pytest.mark.system) for m in ("per-take", "memory", "disk")),
    ],
    indirect=True,
)  # see READ_MODES
def test_ranks_times_workers(make_loader, ids_1003):
    """Acceptance 1: 2 ranks x 3 spawn workers; coverage for drop_last False, no repeats for True."""
    for drop_last in DROP_LAST_IN[make_loader.mode]:
        streams = []
        for rank in range(2):
            loader = make_loader(
                ids_1003, 10, columns=["id"], rank=rank, world_size=2, drop_last=drop_last
            )
            stream = collect(loader, num_workers=3)
            assert stream == expected_rank_ids(loader)
            streams.append(stream)
        assert len(streams[0]) == len(streams[1])
        counts = Counter(i for stream in streams for batch in stream for i in batch)
        if drop_last:
            assert [len(streams[0]), len(streams[1])] == [50, 50]
            assert all(len(b) == 10 for stream in streams for b in stream)
            assert max(counts.values()) == 1 and len(counts) == 1000
        else:
            assert [len(streams[0]), len(streams[1])] == [51, 51]
            assert set(counts) == set(range(1003))
            assert sum(counts.values()) == 1004  # one row padded, as DistributedSampler pads


def test_set_epoch_changes_the_order_reproducibly(make_loader, ids_1003):
    """Acceptance 4: seed 7, three epochs: three different orders, reproduced by a second loader."""
    first = make_loader(ids_1003, 10, seed=7, columns=["id"])
    second = make_loader(ids_1003, 10, seed=7, columns=["id"])
    orders = []
    for epoch in range(3):
        first.set_epoch(epoch)
        second.set_epoch(epoch)
        order = collect(first)
        assert collect(second) == order
        orders.append(order)
    assert orders[0] != orders[1] != orders[2] != orders[0]
    # No set_epoch: the next iteration reads the next epoch, never the same one again.
    following = collect(first)
    assert first.epoch == 3 and following == collect(second, epoch=3)
    assert following not in orders


@pytest.mark.parametrize("readahead", [1, 2, 5, 200])
@pytest.mark.parametrize("max_in_flight", [1, 4])
def test_depths(ids_1003, ids_25, readahead, max_in_flight):
    """Acceptance 5: every id once for any readahead x max_in_flight, also beyond the epoch."""
    max_in_flight = min(max_in_flight, readahead)
    loader = PrefetchLoader(
        ids_1003,
        10,
        columns=["id"],
        drop_last=False,
        readahead=readahead,
        read=ReadOptions(max_in_flight=max_in_flight),
    )
    batches = collect(loader)
    assert len(batches) == 101 and sorted(i for b in batches for i in b) == list(range(1003))
    small = PrefetchLoader(
        ids_25,
        4,
        columns=["id"],
        drop_last=False,
        readahead=readahead,
        read=ReadOptions(max_in_flight=max_in_flight),
    )
    assert sorted(i for b in collect(small) for i in b) == list(range(25))


def failing_take_at(tap, loader, position, error):
    """Make the take of global batch ``position`` of ``loader`` (made under ``tap``) raise
    ``error``."""
    target = loader.epoch_plan().batch(position).indices.tolist()

    def take(read, indices):
        if indices.tolist() == target:
            raise error
        return read(indices)

    tap.take = take


def test_a_failing_take_surfaces_quickly_and_leaves_no_thread(ids_1003):
    """Acceptance 6: the 3rd batch's take raises: batches 0 and 1 arrive, then the error."""
    with tapped() as tap:
        loader = PrefetchLoader(ids_1003, 10, columns=["id"], read=ReadOptions(coalesce=1))
    failing_take_at(tap, loader, 2, OSError("disk on fire"))
    iterator = iter(loader)
    start = time.monotonic()
    received = [next(iterator)["id"].tolist() for _ in range(2)]
    with pytest.raises(BatchLoadError) as info:
        next(iterator)
    assert time.monotonic() - start < 1.0
    assert received == expected_rank_ids(loader)[:2]
    assert isinstance(info.value.__cause__, OSError)
    assert (info.value.epoch, info.value.position, info.value.num_rows) == (0, 2, 10)
    assert str(info.value).startswith("batch 2 of epoch 0 (10 rows) from ")
    assert str(info.value).endswith("failed after 3 attempts: OSError: disk on fire")
    assert info.value.attempts == 3  # a plain OSError is transient: the default policy retried
    assert wait_until(lambda: not loop_threads(), timeout=1.0)


def test_readahead_bounds_held_batches_while_a_take_stalls(ids_1003):
    """Acceptance 7: batch 2's take stalls 1 s, readahead 4: never more than 4 batches held.

    Held = takes started - batches handed to the loop (the iterator's own count, taken before it
    gives a readahead slot back, so a late read can only overstate what is held).
    """
    with tapped() as tap:
        loader = PrefetchLoader(
            ids_1003, 10, columns=["id"], readahead=4, read=ReadOptions(max_in_flight=4, coalesce=1)
        )
    slow = loader.epoch_plan().batch(2).indices.tolist()
    lock = threading.Lock()
    started, held_at_start = [0], []
    iterator = None

    def take(read, indices):
        with lock:
            started[0] += 1
            received = 0 if iterator is None else iterator.statistics().received
            held_at_start.append(started[0] - received)
        if indices.tolist() == slow:
            time.sleep(1.0)
        return read(indices)

    tap.take = take
    iterator = iter(loader)
    held = []
    with closing(iterator):
        for batch_number, _ in enumerate(iterator):
            held.append(iterator.statistics().held)
            if batch_number == 30:
                break
    assert max(held_at_start) == 4  # reached while batch 2 stalled, never exceeded
    assert max(held) <= 4


def test_the_test_seam_wraps_the_dataset_beneath_the_layers_and_travels_to_spawn_workers(
    ids_1003,
):
    """``tapped()`` (support.sources) wraps each dataset's LanceSource beneath the filter's
    layer; the wrapper pickles with the loader: spawn workers read the exact batches through
    their own copy (untapped: the tap here records only this process's reads)."""
    with tapped() as tap:
        loader = PrefetchLoader(ids_1003, 25, drop_last=False, filter="id % 2 = 0")
    assert isinstance(loader._source.inner, TappedSource)  # the filter's subset over the tap
    assert tap.scans == 1  # the filter's selection
    for epoch, workers in ((1, 2), (2, 0)):  # the rows kept are the even ids: 2 x offset
        expected = [[2 * o for o in batch] for batch in expected_rank_ids(loader, epoch=epoch)]
        assert collect(loader, num_workers=workers, epoch=epoch) == expected
    read = sorted(i for offsets in tap.takes for i in offsets)
    assert read == sorted(i for batch in expected for i in batch)  # epoch 2's, in this process


def test_transform_runs_on_every_batch(make_loader, ids_25):
    def transform(batch):
        return batch["id"] * 2

    loader = make_loader(ids_25, 5, columns=["id"], transform=transform, drop_last=False)
    out = [t.tolist() for t in loader]
    assert out == [[2 * i for i in b] for b in expected_rank_ids(loader)]


def test_break_close_context_manager_and_gc_stop_the_thread(ids_1003):
    loader = PrefetchLoader(ids_1003, 10, columns=["id"])
    for _ in loader:
        break
    assert collect_until(lambda: not loop_threads())

    iterator = iter(loader)
    next(iterator)
    assert loop_threads()
    loader.close()
    assert iterator.closed and not loop_threads()

    with PrefetchLoader(ids_1003, 10, columns=["id"]) as managed:
        iterator = iter(managed)
        next(iterator)
    assert iterator.closed and not loop_threads()
    # A fresh iteration after a break starts at the beginning, with nothing left over.
    assert collect(loader) == expected_rank_ids(loader)


def test_no_loop_thread_before_iteration_and_pickle_round_trip(ids_1003):
    loader = PrefetchLoader(
        Dataset(ids_1003, storage_options={"aws_secret_access_key": "hunter2"}), 10, columns=["id"]
    )
    assert not loop_threads()
    clone = pickle.loads(pickle.dumps(loader))
    assert collect(clone) == collect(loader)
    assert "hunter2" not in repr(loader)


def test_version_pinned_against_later_writes(make_loader, fresh_ids):
    uri = fresh_ids(30)
    loader = make_loader(uri, 10, columns=["id"])
    lance.write_dataset(lance.dataset(uri).to_table(), uri, mode="append")
    lance.dataset(uri).delete("id < 5")
    assert loader.num_rows == 30 and loader.version == 1
    assert sorted(i for b in collect(loader) for i in b) == list(range(30))


def test_deleted_rows_are_never_sampled(make_loader, fresh_ids):
    uri = fresh_ids(40, rows_per_file=10)
    lance.dataset(uri).delete("id % 4 = 0")
    loader = make_loader(uri, 5, columns=["id"], drop_last=False)
    assert loader.num_rows == 30
    assert sorted(i for b in collect(loader) for i in b) == [i for i in range(40) if i % 4]


def test_rank_from_environment(ids_1003, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "3")
    loader = PrefetchLoader(ids_1003, 10, columns=["id"])
    assert (loader.rank, loader.world_size, len(loader)) == (1, 3, 33)
    explicit = PrefetchLoader(ids_1003, 10, columns=["id"], rank=0, world_size=1)
    assert (explicit.rank, explicit.world_size) == (0, 1)


@pytest.mark.parametrize(
    "kwargs,error,message",
    [
        (
            dict(batch_size=0),
            ValueError,
            "batch_size should be an integer >= 1, but got batch_size=0",
        ),
        (
            dict(batch_size=1.5),
            TypeError,
            "batch_size should be an integer, but got batch_size=1.5 (float)",
        ),
        (
            dict(batch_size=10, readahead=0),
            ValueError,
            "readahead should be an integer >= 1, but got readahead=0",
        ),
        (
            dict(batch_size=10, rank=2, world_size=2),
            ValueError,
            "Invalid rank 2, rank should be in the interval [0, 1] for world_size=2",
        ),
        (
            dict(batch_size=10, rank=1),
            ValueError,
            "rank should be < world_size, but rank=1 and world_size=1 (rank given, world_size detected from the process group or RANK/WORLD_SIZE); pass both rank= and world_size=, or neither",
        ),
        (
            dict(batch_size=10, drop_last="yes"),
            TypeError,
            "drop_last should be True or False, but got drop_last='yes'",
        ),
        (
            dict(batch_size=10, transform=3),
            TypeError,
            "transform should be callable or None, but got 3",
        ),
        (
            dict(batch_size=10, seed=-3),
            ValueError,
            "seed should be an integer >= 0, but got seed=-3",
        ),
        (
            dict(batch_size=10, seed=2**64),
            ValueError,
            "seed should be an integer in [0, 2**64), but got seed=18446744073709551616; pass a value below 2**64 (e.g. seed % 2**64)",
        ),
    ],
)
def test_bad_arguments_are_refused_before_any_io(tmp_path, kwargs, error, message):
    """The source does not exist: these errors come first, so no I/O was attempted."""
    with pytest.raises(error) as info:
        PrefetchLoader(tmp_path / "missing.lance", **kwargs)
    assert str(info.value) == message


def test_errors_that_need_the_dataset(ids_25, fresh_ids, tmp_path):
    with pytest.raises(FileNotFoundError, match=r"^source: no Lance dataset at"):
        PrefetchLoader(tmp_path / "missing.lance", 10)
    with pytest.raises(ValueError, match=r"^columns \['nope'\] are not in the dataset"):
        PrefetchLoader(ids_25, 10, columns=["nope"])
    with pytest.raises(ValueError, match=r"^version=3 does not exist in"):
        PrefetchLoader(Dataset(ids_25, version=3), 10)
    with pytest.raises(
        ValueError,
        match=r"^drop_last=True needs at least batch_size \* world_size = 10 \* 3 = 30 rows, but the dataset has 25",
    ):
        PrefetchLoader(ids_25, 10, rank=0, world_size=3)
    empty = fresh_ids(5, name="empty.lance")
    lance.dataset(empty).delete("true")
    with pytest.raises(ValueError, match=r"^source: the dataset .* has no rows at version 2"):
        PrefetchLoader(empty, 1)


def test_unsupported_column_type_is_refused_at_construction(tmp_path):
    import pyarrow as pa

    uri = str(tmp_path / "ts.lance")
    lance.write_dataset(pa.table({"id": [1, 2], "when": pa.array([1, 2], pa.timestamp("us"))}), uri)
    with pytest.raises(TypeError, match=r"^column 'when' has Arrow type timestamp\[us\]"):
        PrefetchLoader(uri, 1)
    (only,) = PrefetchLoader(uri, 2, columns=["id"])  # the other columns still work
    assert sorted(only["id"].tolist()) == [1, 2]


def test_open_lance_dataset_as_source(ids_1003):
    dataset = lance.dataset(ids_1003)
    loader = PrefetchLoader(dataset, 100, columns=["id"])
    assert loader.uri == dataset.uri and loader.version == dataset.version
    delivered = np.concatenate(collect(loader))
    assert np.array_equal(delivered, loader.epoch_plan().permutation[:1000])


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:lance is not fork-safe")
def test_forked_dataloader_workers_fail_at_once_naming_spawn(ids_1003):
    """The Linux default start method (fork) gives a clear error, never a crash or a hang."""

    loader = PrefetchLoader(ids_1003, 10, columns=["id"])
    collect(loader)  # the parent has read (and opened Lance) before forking
    data = DataLoader(loader, batch_size=None, num_workers=2, multiprocessing_context="fork")
    start = time.monotonic()
    with stopping(data) as iterator:
        with pytest.raises(RuntimeError, match=r"multiprocessing_context='spawn'"):
            list(iterator)
    assert time.monotonic() - start < 30


@pytest.mark.slow
def test_batch_load_error_crosses_dataloader_workers(ids_1003, tmp_path):
    """A failure in a spawn worker is re-raised in the main process as a BatchLoadError."""

    loader = PrefetchLoader(ids_1003, 10, columns=["id"], transform=failing_transform)
    data = DataLoader(loader, batch_size=None, num_workers=1, multiprocessing_context=WORKERS)
    with stopping(data) as iterator:
        with pytest.raises(BatchLoadError, match=r"batch 0 of epoch 0 \(10 rows\)"):
            list(iterator)


def failing_transform(batch):
    raise ValueError("bad pixels")


def test_batch_load_error_pickles_with_its_context():
    error = BatchLoadError("batch 3 failed", epoch=1, position=3, num_rows=10, uri="x.lance")
    clone = pickle.loads(pickle.dumps(error))
    assert (clone.args, clone.epoch, clone.position, clone.num_rows, clone.uri) == (
        ("batch 3 failed",),
        1,
        3,
        10,
        "x.lance",
    )
    assert BatchLoadError("from a worker").position is None


@pytest.mark.parametrize(
    "version,error,message",
    [
        (
            1.0,
            TypeError,
            "version should be an int (version number) or a str (tag), but got version=1.0",
        ),
        (
            True,
            TypeError,
            "version should be an int (version number) or a str (tag), but got version=True",
        ),
        (0, ValueError, "version should be an integer >= 1, but got version=0"),
        (-1, ValueError, "version should be an integer >= 1, but got version=-1"),
    ],
)
def test_bad_version_types_are_refused_before_io(tmp_path, version, error, message):
    with pytest.raises(error) as info:
        PrefetchLoader(Dataset(tmp_path / "missing.lance", version=version), 10)
    assert str(info.value) == message


def test_numpy_version_and_iterable_columns(ids_25):
    loader = PrefetchLoader(
        Dataset(ids_25, version=np.int64(1)), 5, columns=(c for c in ["label", "id"])
    )
    assert loader.version == 1 and loader.columns == ("label", "id")
    with pytest.raises(
        TypeError, match=r"^columns should be a list of column names, but got columns=5$"
    ):
        PrefetchLoader(ids_25, 5, columns=5)


def test_a_file_is_not_a_dataset(tmp_path):
    path = tmp_path / "table.csv"
    path.write_text("a,b\n1,2\n")
    with pytest.raises(FileNotFoundError, match=r"^source: no Lance dataset at"):
        PrefetchLoader(path, 1)


@pytest.mark.parametrize("variable", ["RANK", "WORLD_SIZE"])
def test_half_of_the_rank_environment_is_known_only_where_the_loader_is_used(
    ids_1003, monkeypatch, variable
):
    """Lightning's ddp children start with WORLD_SIZE (and LOCAL_RANK) but no RANK: building
    the loader there works; using it before a process group exists names where to build it."""
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.setenv(variable, "1")
    loader = PrefetchLoader(ids_1003, 10)
    message = "^" + re.escape(
        f"this process's rank is not known: only part of the environment is set ({variable}=1) "
        f"and no torch.distributed process group is initialized yet (Lightning's ddp starts its "
        f"processes like this). Use the loader where the ranks exist: build it in "
        f"LightningDataModule.setup() or train_dataloader(), or in the training loop, after the "
        f"process group is initialized"
    )
    for use in (len, lambda loader: next(iter(loader)), lambda loader: loader.state_dict()):
        with pytest.raises(ValueError, match=message):
            use(loader)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")  # now known: adopted
    assert (loader.rank, loader.world_size) == (1, 2)
    assert collect(loader) == expected_rank_ids(loader, rank=1)


@pytest.mark.system
@pytest.mark.slow
def test_the_sequential_mode_reads_every_row_once_across_ranks_and_workers(ids_1003):
    """shuffle=False (drop_last then defaults to False): 3 ranks x 2 workers over 1,003 rows in
    batches of 10: 101 global batches, ranks 0 and 1 get 34, rank 2 gets 33 (len() says so);
    merged by position the rows come in dataset order, every row once, nothing padded; the
    next epoch is the same."""
    streams = []
    for rank in range(3):
        loader = PrefetchLoader(
            ids_1003, 10, columns=["id"], shuffle=False, rank=rank, world_size=3
        )
        assert loader.drop_last is False and len(loader) == (33 if rank == 2 else 34)
        data = DataLoader(
            loader,
            batch_size=None,
            num_workers=2,
            multiprocessing_context=WORKERS,
            persistent_workers=True,
        )
        stream = batch_ids(data)
        assert stream == expected_rank_ids(loader) and len(stream) == len(loader)
        assert batch_ids(data) == stream  # epoch 1: the same order
        del data
        streams.append(stream)
    merged = [streams[g % 3][g // 3] for g in range(101)]
    assert sum(merged, []) == list(range(1003))
    assert [len(b) for b in merged] == [10] * 100 + [3]
    loader.set_epoch(2)
    state = loader.state_dict()
    assert state["permutation"] == "identity" and state["format_version"] == 5
    shuffled = PrefetchLoader(ids_1003, 10, columns=["id"], drop_last=False, rank=2, world_size=3)
    with pytest.raises(ValueError, match=r"permutation is 'identity' in the state but 'array'"):
        shuffled.load_state_dict(state)


def test_a_rank_with_one_batch_fewer_saves_a_finished_epoch(ids_25):
    """shuffle=False, 25 rows, batch 5, 3 ranks: rank 2 has 1 batch, ranks 0 and 1 have 2. Each
    rank that read its whole share saves the epoch's end (the same state on every rank), so a
    resume reads the next epoch; a live share saves where it is."""
    states = []
    for rank in range(3):
        loader = PrefetchLoader(ids_25, 5, columns=["id"], shuffle=False, rank=rank, world_size=3)
        assert len(batch_ids(loader)) == (1 if rank == 2 else 2)
        states.append(loader.state_dict())
    assert [(s["epoch"], s["position"]) for s in states] == [(0, 5)] * 3
    resumed = PrefetchLoader(ids_25, 5, columns=["id"], shuffle=False, rank=0, world_size=3)
    resumed.load_state_dict(states[2])
    assert batch_ids(resumed) == [[0, 1, 2, 3, 4], [15, 16, 17, 18, 19]] and resumed.epoch == 1
    early = PrefetchLoader(ids_25, 5, columns=["id"], shuffle=False, rank=0, world_size=3)
    iterator = iter(early)
    next(iterator)
    assert early.state_dict()["position"] == 3  # after global batch 0 (rank 0's first)
    iterator.close()
    with pytest.raises(StopIteration):
        next(iterator)
