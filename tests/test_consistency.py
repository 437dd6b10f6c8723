"""The pinned dataset version against writers: what a loader reads while the dataset changes.

A loader pins the dataset version at construction. A writer (a thread here, or a separate process)
that appends, deletes, overwrites or compacts while an epoch runs changes nothing in that epoch or
in later epochs: the ids are exactly the plan's. Rows deleted before construction are never
sampled (``take`` addresses live rows by offset). Removing the pinned version's files
(``cleanup_old_versions``) makes the next read fail with ``BatchLoadError``, never return other
rows. Every batch is checked before and after ``take``: offsets outside the version are an
``IndexError`` before any read, and a result with fewer rows than asked is an error.

The mid-epoch writes are deterministic: every ``take`` but the first batch's waits at its start
until the write is committed, so the write lands while the loader holds ``readahead`` batches,
``max_in_flight`` of them as ``take`` calls in flight, and every later read runs after it.
"""

from __future__ import annotations

import datetime
import itertools
import os
import pickle
import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import lance
import numpy as np
import pytest
from support.helpers import (
    WORKERS,
    batch_ids,
    collect,
    expected_rank_ids,
    loop_threads,
    wait_until,
)
from support.sources import Tap, tapped
from support.writers import APPENDED_IDS, OVERWRITTEN_IDS, live_ids, write
from torch.utils.data import DataLoader

from lance_prefetch import BatchLoadError, Dataset, DiskCache, PrefetchLoader, ReadOptions
from lance_prefetch.sources._lance import LanceSource, ShortReadError
from lance_prefetch.sources._options import SourceOptions

WRITERS = Path(__file__).parent / "support" / "writers.py"
#: every ``take`` held by HeldTakes gives up after this long (a test never hangs on a gate)
GATE_TIMEOUT_S = 60.0


class HeldTakes:
    """Hold every take of the datasets ``tap`` sees but the one of the batch ``free`` at its start
    (before Lance reads) until :meth:`release`; ``waiting`` counts the takes held."""

    def __init__(self, tap: Tap, free: list[int]) -> None:
        self.released = threading.Event()
        self._changed = threading.Condition()
        self.waiting = 0

        def take(read, indices: np.ndarray):
            if indices.tolist() != free and not self.released.is_set():
                self._count(1)
                try:
                    if not self.released.wait(GATE_TIMEOUT_S):
                        raise TimeoutError("the test never released the held takes")
                finally:
                    self._count(-1)
            return read(indices)

        tap.take = take

    def _count(self, change: int) -> None:
        with self._changed:
            self.waiting += change
            self._changed.notify_all()

    def wait_for_held(self, count: int, timeout: float = 30.0) -> bool:
        """Whether exactly ``count`` takes are held, waiting up to ``timeout`` seconds for it."""
        with self._changed:
            return self._changed.wait_for(lambda: self.waiting == count, timeout)

    def release(self) -> None:
        self.released.set()


def in_thread(function, *args) -> None:
    """Run ``function(*args)`` in another thread, wait for it (60 s at most) and re-raise its
    error here."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            function(*args)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run, name="test-writer")
    thread.start()
    thread.join(60)
    assert not thread.is_alive(), "the writer thread did not finish within 60 s"
    if errors:
        raise errors[0]


def in_process(uri: str, *operations: str) -> None:
    """Run ``operations`` (see ``writers.write``) in a separate Python process."""
    done = subprocess.run(
        [sys.executable, str(WRITERS), uri, *operations],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr


def check_rows(batches) -> None:
    """Every row's columns belong together: ``label == id % 10`` (no row mixed from versions)."""
    for batch in batches:
        assert batch["label"].tolist() == [i % 10 for i in batch["id"].tolist()]


def latest_ids_after(operations: tuple[str, ...], before: list[int]) -> list[int]:
    """The latest version's ids after ``operations`` on a dataset whose ids were ``before``."""
    ids = list(before)
    for operation in operations:
        if operation == "append":
            ids += list(APPENDED_IDS)
        elif operation == "delete":
            ids = [i for i in ids if i >= 100]
        elif operation == "overwrite":
            ids = list(OVERWRITTEN_IDS)
        elif operation == "compact":
            ids = [i for i in ids if i % 3]
    return ids


def read_with_write_mid_epoch(loader: PrefetchLoader, tap: Tap, write_now) -> list:
    """Read epoch 0 of ``loader`` (``readahead=8``, ``max_in_flight=4``, 4 batches a take; made
    under ``tap``); after
    its first batch, with the next takes in flight and held at their start, call ``write_now()``.
    Returns every batch of the epoch."""
    assert (loader.readahead, loader.read.max_in_flight, loader.coalesce) == (8, 4, 4)
    loader.set_epoch(0)
    # An iteration's takes ramp up to 4 batches: batch 0 alone (let through), batches 1-2, 3-6
    # (both held: 2 + 4 of the 8 readahead slots; the next take of 4 would not fit), 7-10, ...
    gate = HeldTakes(tap, free=expected_rank_ids(loader)[0])
    iterator = iter(loader)
    first = next(iterator)
    assert gate.wait_for_held(2)
    assert wait_until(lambda: iterator.statistics().held == 6, timeout=30)
    write_now()
    gate.release()
    return [first, *iterator]


@pytest.mark.parametrize(
    "operations",
    [("append",), ("delete",), ("overwrite",), ("compact",), ("append", "delete", "overwrite")],
)
def test_a_write_mid_epoch_changes_nothing_in_this_or_later_epochs(fresh_ids, operations):
    uri = fresh_ids(1003, rows_per_file=300)
    with tapped() as tap:
        loader = PrefetchLoader(
            uri, 10, columns=["id", "label"], seed=3, readahead=8, read=ReadOptions(max_in_flight=4)
        )
    expected = expected_rank_ids(loader)

    batches = read_with_write_mid_epoch(
        loader, tap, lambda: in_thread(lambda: [write(uri, op) for op in operations])
    )

    # the writes are committed: the latest version holds other rows than the pinned one
    assert lance.dataset(uri).version > loader.version
    assert live_ids(uri) == latest_ids_after(operations, list(range(1003)))
    assert (loader.version, loader.num_rows) == (1, 1003)
    assert batch_ids(batches) == expected and len(expected) == 100
    check_rows(batches)
    # a later epoch: the same pinned rows, in that epoch's permutation
    loader.set_epoch(1)
    later = list(loader)
    assert batch_ids(later) == expected_rank_ids(loader) != expected
    check_rows(later)


def test_a_writer_process_mid_epoch_changes_nothing(fresh_ids):
    """The writer is a separate process (its own Lance runtime), rank 1 of 2 reads."""
    uri = fresh_ids(1003, rows_per_file=300)
    with tapped() as tap:
        loader = PrefetchLoader(
            uri,
            10,
            columns=["id", "label"],
            seed=4,
            readahead=8,
            rank=1,
            world_size=2,
            read=ReadOptions(max_in_flight=4),
        )
    expected = expected_rank_ids(loader)
    operations = ("append", "delete", "overwrite")

    batches = read_with_write_mid_epoch(loader, tap, lambda: in_process(uri, *operations))

    assert live_ids(uri) == list(OVERWRITTEN_IDS) and lance.dataset(uri).version == 4
    assert batch_ids(batches) == expected and len(expected) == 50
    check_rows(batches)
    loader.set_epoch(1)
    assert collect(loader) == expected_rank_ids(loader) != expected


def test_a_writer_looping_through_the_epoch_changes_nothing(make_loader, fresh_ids):
    """Free-running: a writer thread appends, deletes, overwrites and compacts over and over while
    the loader reads with readahead; every 25 batches the loop waits for one more commit, so
    writes interleave with the reads all through the epoch."""
    uri = fresh_ids(1003, rows_per_file=100)
    loader = make_loader(
        uri,
        4,
        columns=["id", "label"],
        seed=5,
        readahead=8,
        drop_last=False,
        read=ReadOptions(max_in_flight=4),
    )
    expected = expected_rank_ids(loader)
    stop, changed = threading.Event(), threading.Condition()
    committed: list[str] = []
    errors: list[BaseException] = []

    def loop() -> None:
        cycle = ("append", "delete", "overwrite", "compact")
        try:
            while not stop.is_set() and len(committed) < 40:
                operation = cycle[len(committed) % len(cycle)]
                write(uri, operation)
                with changed:
                    committed.append(operation)
                    changed.notify_all()
        except BaseException as exc:
            with changed:
                errors.append(exc)
                changed.notify_all()

    writer = threading.Thread(target=loop, name="test-writer")
    writer.start()
    batches = []
    try:
        for number, batch in enumerate(loader):
            batches.append(batch)
            if number % 25 == 0:
                target = number // 25 + 1
                with changed:
                    assert changed.wait_for(
                        lambda t=target: len(committed) >= t or errors, timeout=30
                    )
    finally:
        stop.set()
        writer.join(60)
    assert not errors and not writer.is_alive()
    assert len(committed) >= len(expected) // 25 + 1
    assert batch_ids(batches) == expected and len(expected) == 251
    check_rows(batches)
    assert sorted(i for b in expected for i in b) == list(range(1003))


@dataclass(frozen=True)
class WaitForFlag:
    """A transform for spawn DataLoader workers: every batch but those in ``free`` waits until the
    file ``flag`` exists (at most 60 s), so the main process can write while the workers are
    mid-epoch. (A coalesced take's batches are handed on together, once all are transformed, so
    ``free`` holds every batch of the take that reads the first one.)"""

    flag: str
    free: frozenset[tuple[int, ...]]

    def __call__(self, batch):
        if tuple(batch["id"].tolist()) not in self.free:
            deadline = time.monotonic() + GATE_TIMEOUT_S
            while not os.path.exists(self.flag):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{self.flag} never appeared")
                time.sleep(0.01)
        return batch


@pytest.mark.system
@pytest.mark.slow
@pytest.mark.parametrize("make_loader", ["coalesced", "disk"], indirect=True)  # see READ_MODES
def test_a_writer_process_mid_epoch_through_spawn_workers(make_loader, fresh_ids, tmp_path):
    """Two spawn DataLoader workers read epoch 0; after the first batch a writer process appends,
    deletes and overwrites. Epoch 0 and epoch 1 (new workers, which reopen the pinned version
    after the writes) are exactly the plan's."""
    uri = fresh_ids(1003, rows_per_file=300)
    plan_loader = make_loader(uri, 10, seed=6, readahead=4)
    worker_0 = plan_loader.epoch_plan(0).rank_batches(0, worker_id=0, num_workers=2)
    first_take = itertools.islice(worker_0, plan_loader.coalesce)
    free = frozenset(tuple(batch.indices.tolist()) for batch in first_take)
    flag = tmp_path / "written"
    loader = make_loader(
        uri,
        10,
        columns=["id", "label"],
        seed=6,
        readahead=4,
        transform=WaitForFlag(str(flag), free),
        read=ReadOptions(max_in_flight=2),
    )
    loader.set_epoch(0)
    expected = expected_rank_ids(loader)
    data = DataLoader(loader, batch_size=None, num_workers=2, multiprocessing_context=WORKERS)
    iterator = iter(data)
    batches = [next(iterator)]
    in_process(uri, "append", "delete", "overwrite")
    flag.touch()
    batches += list(iterator)
    assert live_ids(uri) == list(OVERWRITTEN_IDS)
    assert batch_ids(batches) == expected and len(expected) == 100
    check_rows(batches)
    loader.set_epoch(1)
    later = list(data)
    assert batch_ids(later) == expected_rank_ids(loader) != expected
    check_rows(later)


def test_rows_deleted_before_construction_are_never_sampled(make_loader, fresh_ids):
    """Deleted in two commits, a whole fragment among them: num_rows counts live rows, and with
    drop_last=False every live id comes exactly once, in the plan's order, on one or two ranks."""
    uri = fresh_ids(1003, rows_per_file=100)
    lance.dataset(uri).delete("id % 7 = 3")
    lance.dataset(uri).delete("id >= 300 AND id < 400")  # all of fragment 3
    deleted = {i for i in range(1003) if i % 7 == 3 or 300 <= i < 400}
    live = [i for i in range(1003) if i not in deleted]
    assert live_ids(uri) == live and len(live) == 774

    loader = make_loader(uri, 16, columns=["id", "label"], drop_last=False, seed=7)
    assert loader.num_rows == 774 and loader.version == 3
    batches = list(loader)
    ids = batch_ids(batches)
    assert ids == [[live[o] for o in b] for b in expected_rank_ids(loader)]
    assert sorted(i for b in ids for i in b) == live  # each live id once, no deleted id
    check_rows(batches)

    ranks = [
        make_loader(uri, 16, columns=["id"], drop_last=False, seed=7, rank=r, world_size=2)
        for r in (0, 1)
    ]
    seen = [i for r in ranks for b in collect(r, epoch=2) for i in b]
    assert len(seen) == 774 and sorted(seen) == live  # an even count: no padding


@pytest.mark.parametrize(
    "make_loader", ["coalesced", "memory", "disk"], indirect=True
)  # see READ_MODES
def test_a_loader_on_an_older_version_reads_that_version(make_loader, fresh_ids):
    """Versions 1 (500 rows), 2 (+ 500 appended), 3 (100 deleted), 4 (overwritten by 300 rows of
    other ids), 5 (every third deleted), then compacted (Lance commits twice): a loader built with
    version=v (a number or a tag) reads exactly v's live rows, in every epoch and in a copy."""
    uri = fresh_ids(500, rows_per_file=100)
    for operation in ("append", "delete", "overwrite", "compact"):
        write(uri, operation)
    lance.dataset(uri).tags.create("before-overwrite", 3)
    assert lance.dataset(uri).version == 7 and len(live_ids(uri)) == 200
    cases = [(1, 500), (2, 1000), (3, 900), (4, 300), (5, 200), ("before-overwrite", 900)]
    for version, num_rows in cases:
        loader = make_loader(
            Dataset(uri, version=version), 8, columns=["id", "label"], drop_last=False
        )
        live = live_ids(uri, loader.version)
        assert loader.num_rows == num_rows == len(live)
        assert loader.version == (3 if version == "before-overwrite" else version)
        for epoch in (0, 1):
            batches = collect(loader, epoch=epoch)
            assert batches == [[live[o] for o in b] for b in expected_rank_ids(loader)]
            assert sorted(i for b in batches for i in b) == sorted(live)
        clone = pickle.loads(pickle.dumps(loader))  # reopens the pinned version lazily
        assert collect(clone, epoch=0) == [[live[o] for o in b] for b in expected_rank_ids(clone)]


def test_removing_the_pinned_version_mid_epoch_is_an_error_not_other_rows(fresh_ids):
    """Compaction rewrites every data file; cleanup_old_versions(older_than=0) then deletes the
    pinned version's files. The batches already read arrive intact, the next read fails with
    BatchLoadError (Lance: not found), and so do later epochs and fresh copies of the loader."""
    uri = fresh_ids(1003, rows_per_file=300)
    with tapped() as tap:
        loader = PrefetchLoader(
            uri,
            10,
            columns=["id", "label"],
            seed=9,
            readahead=8,
            read=ReadOptions(max_in_flight=4, coalesce=1),
        )  # one take per batch: the batch after the first fails alone (coalesced: test_coalesce.py)
    # (the seed matters: Lance can still serve some rows of the removed files from what it read
    # for batch 0, e.g. seed 8's batch 1 since the seed derivation changed; seed 9's batch 1
    # needs the files)
    expected = expected_rank_ids(loader)
    loader.set_epoch(0)
    gate = HeldTakes(tap, free=expected[0])
    iterator = iter(loader)
    first = next(iterator)
    assert gate.wait_for_held(4)
    in_thread(lambda: [write(uri, op) for op in ("compact", "cleanup")])
    latest = lance.dataset(uri).version
    assert [v["version"] for v in lance.dataset(uri).versions()] == [latest]  # only the latest
    gate.release()

    assert first["id"].tolist() == expected[0]
    with pytest.raises(BatchLoadError) as info:
        next(iterator)
    assert (info.value.epoch, info.value.position, info.value.num_rows) == (0, 1, 10)
    prefix = (
        f"batch 1 of epoch 0 (10 rows) from {uri!r} version 1 failed after 1 attempt (not "
        f"retried: FileNotFoundError is not transient): FileNotFoundError: "
    )
    assert str(info.value).startswith(prefix) and info.value.attempts == 1
    assert re.fullmatch(gone_message(uri, 1), str(info.value)[len(prefix) :])
    assert isinstance(info.value.__cause__, FileNotFoundError)
    assert iterator.closed

    loader.set_epoch(1)
    delivered = []  # io_uring may still read a removed file it holds open: version 1's own rows
    with pytest.raises(
        BatchLoadError, match=r"^batch \d+ of epoch 1 \(10 rows\).*are gone"
    ) as info:
        delivered.extend(batch["id"].tolist() for batch in loader)
    assert (
        info.value.position == len(delivered)
        and delivered == expected_rank_ids(loader)[: len(delivered)]
    )
    # a copy (as in a spawned DataLoader worker) cannot reopen version 1 at all
    clone = pickle.loads(pickle.dumps(loader))
    with pytest.raises(BatchLoadError) as info:
        list(clone)
    assert isinstance(info.value.__cause__, FileNotFoundError)
    # and a new loader on that version is refused at construction
    with pytest.raises(
        ValueError, match=rf"version=1 does not exist .* latest version is {latest}$"
    ):
        PrefetchLoader(Dataset(uri, version=1), 10)


def gone_message(uri: str, version: int) -> str:
    """The explanation a read of version ``version`` of ``uri`` whose files are gone raises
    (``FileNotFoundError``), as a pattern; group 1 is the file Lance did not find (``data/...``,
    relative to the dataset's root)."""
    return (
        rf"the files of version {version} of {re.escape(repr(uri))} are gone \(its (\S+) was "
        rf"not found\): were old versions cleaned up \(cleanup_old_versions\) after a newer version "
        rf"was written, or the files deleted, while the loader read version {version}\? Rows of "
        rf"another version are never read instead\. Tag the version you train on "
        rf"\(dataset\.tags\.create\(name, version\)\) and pass Dataset\(uri, version=name\), so "
        rf"that cleanup keeps it, or build the loader again on the latest version"
    )


def remove_files(uri: str, how: str, storage_options=None) -> None:
    """``cleanup``: a newer version rewrites every data file (compaction), then
    ``cleanup_old_versions(older_than=0)`` removes the older versions and their files;
    ``deleted``: every data file of the dataset is deleted (on local disk)."""
    if how == "cleanup":
        write(uri, "compact", storage_options=storage_options)
        write(uri, "cleanup", storage_options=storage_options)
        latest = lance.dataset(uri, storage_options=storage_options)
        assert [v["version"] for v in latest.versions()] == [latest.version]
    else:
        for path in Path(uri, "data").iterdir():
            path.unlink()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", ["cleanup", "deleted", "cleanup-s3"])
def test_the_pinned_versions_files_removed_mid_epoch_end_it_with_an_error_naming_the_version(
    fresh_ids, request, how
):
    """Batches 1-4 are read ahead (readahead=4) when the pinned version's data files go (old
    versions cleaned up, locally and on the S3 server, or the files deleted). The epoch delivers
    exactly batches 0-4 of its plan, with their own rows, then batch 5 raises BatchLoadError
    within seconds after one attempt (not a retry storm): its cause a FileNotFoundError that
    names the version, the file, the likely cause and the fix, chained to Lance's own "Not
    found". The iterator is closed; the next epoch fails the same way at once."""
    options = None
    if how.endswith("-s3"):
        s3 = request.getfixturevalue("s3")
        uri = request.getfixturevalue("fresh_s3_ids")(203, rows_per_file=60)
        options = s3.storage_options()
        prefix = uri.removeprefix("s3://training/") + "/data/"
        listing = s3.client().list_objects_v2(Bucket="training", Prefix=prefix)["Contents"]
        files = {"data/" + item["Key"].rsplit("/", 1)[1] for item in listing}
    else:
        uri = fresh_ids(203, rows_per_file=60)
        files = {f"data/{path.name}" for path in Path(uri, "data").iterdir()}
    assert len(files) == 4
    loader = PrefetchLoader(
        Dataset(uri, storage_options=options),
        10,
        columns=["id", "label"],
        seed=4,
        readahead=4,
        read=ReadOptions(max_in_flight=2, coalesce=1),
    )
    plan = expected_rank_ids(loader, epoch=0)
    iterator = iter(loader)
    batches = [next(iterator)]
    assert wait_until(lambda: iterator.statistics().ready == 4, timeout=30)  # 1-4, no more
    remove_files(uri, how.removesuffix("-s3"), storage_options=options)
    started = time.monotonic()
    with pytest.raises(BatchLoadError) as info:
        batches.extend(iterator)
    elapsed = time.monotonic() - started
    assert batch_ids(batches) == plan[:5]
    check_rows(batches)
    error = info.value
    assert (error.epoch, error.position, error.num_rows, error.attempts) == (0, 5, 10, 1)
    prefix = (
        f"batch 5 of epoch 0 (10 rows) from {uri!r} version 1 failed after 1 attempt (not "
        f"retried: FileNotFoundError is not transient): FileNotFoundError: "
    )
    assert str(error).startswith(prefix)
    found = re.fullmatch(gone_message(uri, 1), str(error)[len(prefix) :])
    assert found is not None, str(error)
    assert found.group(1) in files
    assert isinstance(error.__cause__, FileNotFoundError)
    assert str(error.__cause__) == str(error)[len(prefix) :]
    lance_error = error.__cause__.__cause__
    assert type(lance_error) is OSError and f"/{found.group(1)}, " in str(lance_error), lance_error
    assert "Not found: " in str(lance_error)
    assert elapsed < 5.0, elapsed
    assert iterator.closed and wait_until(lambda: not loop_threads(), timeout=2.0)

    started = time.monotonic()
    with pytest.raises(BatchLoadError, match=r"^batch 0 of epoch 1 \(10 rows\) .* version 1 "):
        list(loader)
    assert time.monotonic() - started < 5.0


@pytest.mark.timeout(60)
@pytest.mark.parametrize("cache", ["memory", "disk"])
def test_a_cache_filled_before_the_files_went_keeps_serving_the_pinned_version(
    fresh_ids, tmp_path, cache
):
    """A cache holds the pinned version's rows: filled (from the first iter()) before the data files
    are deleted, it serves that version exactly, whole epochs, never another version's rows. A
    cache filled after they went fails its fill, naming the version and the cause."""
    uri = fresh_ids(203, rows_per_file=60)
    loader = PrefetchLoader(uri, 10, columns=["id", "label"], seed=4, cache=cache)
    iterator = iter(loader)
    batches = [next(iterator)]
    loader._source.fill()  # the cache is filled (in the background, while batch 0 was read)
    remove_files(uri, "deleted")
    batches.extend(iterator)
    assert batch_ids(batches) == expected_rank_ids(loader, epoch=0)
    check_rows(batches)
    assert collect(loader, epoch=1) == expected_rank_ids(loader, epoch=1)

    if cache == "disk":
        cache = DiskCache(dir=tmp_path / "late")
    late = PrefetchLoader(uri, 10, columns=["id"], cache=cache)
    late._source.prepare()  # what iter() does
    with pytest.raises(OSError) as info:
        late._source.fill()
    # the scan's own error (the disk copy of "id" is a raw file: no Lance writer wraps it)
    assert type(info.value) is FileNotFoundError
    assert re.fullmatch(gone_message(uri, 1), str(info.value))


def test_a_copy_reopening_a_removed_version_names_the_version(fresh_ids):
    uri = fresh_ids(100, rows_per_file=10)
    loader = PrefetchLoader(uri, 10, columns=["id"])
    for operation in ("compact", "cleanup"):
        write(uri, operation)
    with pytest.raises(BatchLoadError) as info:
        list(pickle.loads(pickle.dumps(loader)))
    cause = info.value.__cause__
    assert isinstance(cause, FileNotFoundError)
    assert str(cause).startswith(f"source: version 1 of {uri!r} is gone (its manifest was removed")
    assert "dataset.tags.create(name, version)" in str(cause)
    assert info.value.attempts == 1  # not transient: not retried


def test_a_tagged_version_survives_compaction_and_cleanup_mid_epoch(fresh_ids):
    """The way to keep a long run safe from cleanup: tag the version and pass the tag. Lance's
    cleanup refuses a tagged version (OSError) or, told to skip tags, keeps its files."""
    uri = fresh_ids(1003, rows_per_file=300)
    lance.dataset(uri).tags.create("training", 1)
    with tapped() as tap:
        loader = PrefetchLoader(
            Dataset(uri, version="training"),
            10,
            columns=["id", "label"],
            seed=9,
            readahead=8,
            read=ReadOptions(max_in_flight=4),
        )
    expected = expected_rank_ids(loader)

    def compact_and_clean_up() -> None:
        write(uri, "compact")
        with pytest.raises(OSError, match="tagged version"):
            write(uri, "cleanup")
        lance.dataset(uri).cleanup_old_versions(
            older_than=datetime.timedelta(0), error_if_tagged_old_versions=False
        )

    batches = read_with_write_mid_epoch(loader, tap, lambda: in_thread(compact_and_clean_up))
    assert batch_ids(batches) == expected
    check_rows(batches)
    loader.set_epoch(1)
    assert collect(loader) == expected_rank_ids(loader)
    clone = pickle.loads(pickle.dumps(loader))  # reopens the tagged version lazily
    assert collect(clone, epoch=2) == expected_rank_ids(clone)


# -- every batch is validated around take -----------------------------------------------------


def test_a_short_result_from_lance_is_an_error_naming_the_counts(fresh_ids, monkeypatch):
    """The opened dataset's take drops the last row of batch 2: batches 0 and 1 arrive, then
    BatchLoadError naming 9 rows for 10 offsets; never a 9-row batch."""
    uri = fresh_ids(100, rows_per_file=30)
    loader = PrefetchLoader(
        uri, 10, columns=["id"], readahead=4, read=ReadOptions(max_in_flight=2, coalesce=1)
    )
    expected = expected_rank_ids(loader)
    dataset = loader._source._opened()
    original = dataset.take

    def take(indices, columns=None):
        if indices.tolist() == expected[2]:
            indices = indices[:-1]
        return original(indices, columns=columns)

    monkeypatch.setattr(dataset, "take", take)
    iterator = iter(loader)
    assert [next(iterator)["id"].tolist() for _ in range(2)] == expected[:2]
    with pytest.raises(BatchLoadError) as info:
        next(iterator)
    assert (info.value.position, info.value.num_rows) == (2, 10)
    assert str(info.value).endswith(
        "failed after 1 attempt (not retried: ShortReadError is not transient): ShortReadError: "
        f"Lance returned 9 rows for 10 offsets from {uri!r} version 1"
    )
    assert isinstance(info.value.__cause__, ShortReadError)  # an OSError, never retried
    assert iterator.closed


@pytest.mark.parametrize(
    "indices",
    [
        np.array([0, 100]),
        np.array([5, 99, 100, 101]),
        np.array([100, 0, 1]),
        np.array([1000]),
        np.array([-1, 0]),
        np.array([0, 2**40], dtype=np.uint64),
    ],
    ids=["one-past", "last", "not-last", "far", "negative", "huge-uint64"],
)
def test_out_of_range_offsets_raise_index_error_before_any_read(fresh_ids, monkeypatch, indices):
    uri = fresh_ids(100, rows_per_file=30)
    source = LanceSource(uri, SourceOptions(columns=["id"]))
    dataset = source._opened()
    calls = []
    monkeypatch.setattr(dataset, "take", lambda *args, **kwargs: calls.append(args))
    with pytest.raises(IndexError) as info:
        source.take(indices)
    assert str(info.value) == (
        f"row offsets must be in [0, 100) for {uri!r} version 1, but got min "
        f"{int(indices.min())}, max {int(indices.max())}"
    )
    assert calls == []


def test_lance_itself_drops_an_out_of_range_offset_unless_it_is_last(fresh_ids):
    """Why the range check matters (pylance 14.0.2): an out-of-range offset followed by a valid one
    is silently dropped, a shorter table comes back; only when the last offset is out of range
    does Lance raise (an OSError about row address 2**64 - 1). If this fails, Lance changed: check
    LanceSource.take's docstring and docs/design.md."""
    uri = fresh_ids(100, rows_per_file=30)
    dataset = lance.dataset(uri)
    assert dataset.take(np.array([5, 100, 7]), columns=["id"])["id"].to_pylist() == [5, 7]
    assert dataset.take(np.array([100, 0]), columns=["id"])["id"].to_pylist() == [0]
    with pytest.raises(OSError, match="18446744073709551615"):
        dataset.take(np.array([0, 100]), columns=["id"])
