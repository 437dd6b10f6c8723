"""The cache tier: cache="memory" and cache="disk" give exactly the batches of the dataset, from
one sequential scan; sizes are checked; disk copies are keyed by version and columns, reused,
and safe to fill from two processes at once; bad values are refused before any I/O."""

from __future__ import annotations

import os
import pickle
import re
import threading
import time

import lance
import numpy as np
import pyarrow as pa
import pytest
from support.helpers import WORKERS, batch_ids, collect, expected_rank_ids
from support.sources import tapped

from lance_prefetch import (
    BatchLoadError,
    Dataset,
    DiskCache,
    MemoryCache,
    Mixture,
    PrefetchLoader,
    ReadOptions,
    RetryPolicy,
)
from lance_prefetch.cache import _disk
from lance_prefetch.convert._arrow import fixed_row_bytes
from lance_prefetch.options import as_cache
from lance_prefetch.sources._lance import LanceSource
from lance_prefetch.sources._protocol import RowSource

CACHES = ["memory", "disk"]


def epoch_values(loader, epoch):
    loader.set_epoch(epoch)
    return [{name: t.tolist() for name, t in batch.items()} for batch in loader]


def refuse_takes(read, indices):
    """A take hook: a cache that reads the dataset through take is a failure (a disk cache takes
    from its copy, which no tap sees)."""
    raise AssertionError("a cached loader called LanceSource.take on the dataset")


@pytest.mark.parametrize("cache", CACHES)
def test_a_cache_gives_exactly_the_datasets_batches_from_one_scan(fresh_ids, tmp_path, cache):
    """Rows deleted in two places (one a whole fragment) shift the offsets: two epochs of the
    cached loader equal the uncached loader's, ids and vectors, after a single scan."""
    uri = fresh_ids(1003, rows_per_file=100)
    dataset = lance.dataset(uri)
    dataset.delete("id >= 100 and id < 200")  # a whole fragment
    dataset.delete("id % 7 = 3")
    plain = PrefetchLoader(uri, 16, seed=4, drop_last=False)
    expected = [epoch_values(plain, epoch) for epoch in (0, 1)]
    if cache == "disk":
        cache = DiskCache(dir=tmp_path / "cache")
    with tapped() as tap:
        cached = PrefetchLoader(uri, 16, seed=4, drop_last=False, cache=cache)
    cached._source.fill()  # epoch 0 is read by takes while the fill runs: wait for it first
    tap.take, tap.scans = refuse_takes, 0
    assert [epoch_values(cached, epoch) for epoch in (0, 1)] == expected
    assert tap.scans == 0 and tap.takes == [] and cached.cache == as_cache(cache)
    stats = cached.stats()
    assert stats.cache_hit_ratio == 1.0  # epoch 1: every take served by the filled cache


def test_the_first_epoch_is_read_while_the_memory_cache_fills(fresh_ids):
    """The scan lands two record batches, then stalls: the whole first epoch is
    read meanwhile (those rows from memory, the others by takes, put back in order), exactly the
    uncached loader's batches; once the fill ends, the next epoch is gathered from the tensors
    in the training thread (no take, no read thread) and is exact too."""
    uri = fresh_ids(1003, rows_per_file=100)
    lance.dataset(uri).delete("id % 5 = 1")  # offsets no longer equal ids
    plain = PrefetchLoader(uri, 32, seed=2, drop_last=False)
    expected = [epoch_values(plain, epoch) for epoch in (0, 1)]
    stall, stalled = threading.Event(), threading.Event()

    def stalling_scan(read, **options):
        for number, batch in enumerate(read(batch_rows=150, **options)):
            if number == 2:  # the two record batches before have landed
                stalled.set()
                assert stall.wait(30)
            yield batch

    first_two = sum(
        b.num_rows for _, b in zip(range(2), LanceSource(uri).scan(batch_rows=150), strict=False)
    )
    with tapped(scan=stalling_scan) as tap:
        cached = PrefetchLoader(uri, 32, seed=2, drop_last=False, cache="memory")
    cached._source.prepare()  # the fill starts; wait until it stalls after two record batches
    assert stalled.wait(30)
    assert cached._source.landed == first_two
    assert epoch_values(cached, 0) == expected[0]
    assert cached._source.landed == first_two and not cached._source.cached
    taken = sum(map(len, tap.takes))
    assert taken == cached.num_rows - first_two  # the landed rows were not taken again
    assert cached.stats().cache_hit_ratio == first_two / cached.num_rows  # landed rows are hits
    stall.set()
    cached._source.fill()
    tap.takes.clear()
    assert epoch_values(cached, 1) == expected[1]
    assert tap.takes == [] and cached.stats().cache_hit_ratio == 1.0


def test_the_first_epoch_is_read_while_the_disk_copy_is_made(ids_1003, tmp_path):
    """The copy is made in the background, not inside a (timed, retried) take: while its scan
    stalls, far longer than the per-take timeout, the whole first epoch is read from the dataset
    (exact, no hit); once the copy is open every take is a hit, from the copy only."""
    stall, scanning = threading.Event(), threading.Event()

    def stalling_scan(read, **options):
        scanning.set()
        assert stall.wait(30)
        yield from read(**options)

    with tapped(scan=stalling_scan) as tap:
        loader = PrefetchLoader(
            ids_1003,
            100,
            cache=DiskCache(dir=tmp_path / "c"),
            read=ReadOptions(coalesce=1, retry=RetryPolicy(timeout=0.2)),
        )
    assert batch_ids(loader) == expected_rank_ids(loader)
    assert not loader._source.cached and loader.stats().cache_hit_ratio == 0.0
    assert scanning.wait(5)  # the fill's scan has begun and stalls
    time.sleep(0.3)  # it stalls on, past the per-take timeout (the stall being simulated)
    stall.set()
    loader._source.fill()
    tap.take = refuse_takes  # from here a take of the dataset fails the test
    tap.takes.clear()
    loader.set_epoch(1)
    assert batch_ids(loader) == expected_rank_ids(loader)
    assert tap.takes == [] and tap.copies == 1
    assert loader.stats().cache_hit_ratio == 1.0
    assert "cache hits 100.0%" in str(loader.stats())
    assert PrefetchLoader(ids_1003, 100).stats().cache_hit_ratio is None


@pytest.mark.parametrize("cache", CACHES)
def test_a_cache_through_spawn_workers_and_two_ranks(ids_1003, tmp_path, cache):
    if cache == "disk":
        cache = DiskCache(dir=tmp_path / "c")
    for rank in (0, 1):
        loader = PrefetchLoader(ids_1003, 25, rank=rank, world_size=2, drop_last=False, cache=cache)
        assert collect(loader, num_workers=2, epoch=3) == expected_rank_ids(loader, epoch=3)


def test_memory_cache_size_is_checked_before_any_read(ids_1003):
    """Fixed-width columns: id (8) + vector (12) + label (8) = 28 bytes a row, 28,084 in all."""
    source = LanceSource(ids_1003)
    assert fixed_row_bytes(source.schema) == 28
    with tapped() as tap:
        with pytest.raises(ValueError) as info:
            PrefetchLoader(ids_1003, 10, cache=MemoryCache(max_bytes=28_000))
        fits = PrefetchLoader(ids_1003, 10, cache=MemoryCache(max_bytes=28_084), columns=None)
        narrow = PrefetchLoader(ids_1003, 10, columns=["label"], cache=MemoryCache(max_bytes=8_024))
    message = str(info.value)
    assert "need 28,084 bytes (0.0 MiB), above max_bytes=28000" in message
    assert message.endswith(
        "pass cache=MemoryCache(max_bytes=...) with more, read fewer columns, or use cache='disk'"
    )
    assert fits._source.cache_bytes == 28_084
    assert narrow._source.cache_bytes == 8_024  # 8 bytes x 1003 rows fit
    assert tap.scans == 0 and tap.takes == []  # no read


def test_memory_cache_of_variable_width_columns_stops_at_the_budget(tmp_path):
    table = pa.table({"id": np.arange(2000), "text": [f"row {i} " * 20 for i in range(2000)]})
    uri = str(tmp_path / "text.lance")
    lance.write_dataset(table, uri, max_rows_per_file=500)
    assert fixed_row_bytes(LanceSource(uri).schema) is None
    loader = PrefetchLoader(uri, 10, columns=["id"], cache="memory")
    assert batch_ids(loader) == expected_rank_ids(loader)
    small = PrefetchLoader(uri, 10, columns=["text"], cache=MemoryCache(max_bytes=50_000))
    with pytest.raises(MemoryError, match="need more than that, above max_bytes=50000"):
        small._source.fill()  # the background fill, waited for
    assert small._source.nbytes == 0  # nothing kept
    with pytest.raises(BatchLoadError, match="not transient.*MemoryError") as info:
        next(iter(small))  # every read after a failed fill names its error
    assert isinstance(info.value.__cause__, MemoryError)


def test_memory_cache_pickles_without_its_rows(ids_1003):
    loader = PrefetchLoader(ids_1003, 10, cache="memory")
    list(loader)
    assert loader._source.cached and loader._source.nbytes == 1003 * 28
    clone = pickle.loads(pickle.dumps(loader))
    assert len(pickle.dumps(loader)) < 10_000
    assert not clone._source.cached
    assert batch_ids(clone) == expected_rank_ids(clone)


def test_disk_cache_is_keyed_by_version_and_columns_and_reused(fresh_ids, tmp_path):
    uri = fresh_ids(300, rows_per_file=100)
    cache_dir = tmp_path / "cache"
    first = PrefetchLoader(uri, 10, cache=DiskCache(dir=cache_dir))
    assert batch_ids(first) == expected_rank_ids(first)
    first._source.fill()  # the copy, made in the background meanwhile
    copies = sorted(p.name for p in cache_dir.glob("*.lance"))
    assert len(copies) == 1 and copies[0].startswith("data-v1-")
    # another loader (another run) reuses the copy: no scan
    with tapped() as tap:
        again = PrefetchLoader(uri, 10, cache=DiskCache(dir=cache_dir), seed=9)
    assert batch_ids(again) == expected_rank_ids(again)
    assert again.stats().cache_hit_ratio == 1.0  # found whole: the first epoch reads only it
    assert (tap.scans, tap.copies) == (0, 0)  # not scanned again
    # another projection and another version each get their own copy, with their own rows
    narrow = PrefetchLoader(uri, 10, columns=["id"], cache=DiskCache(dir=cache_dir))
    assert batch_ids(narrow) == expected_rank_ids(narrow)
    narrow._source.fill()
    dataset = lance.dataset(uri)
    dataset.delete("id < 50")
    newer = PrefetchLoader(uri, 10, cache=DiskCache(dir=cache_dir), drop_last=False)
    assert newer.version == 2 and newer.num_rows == 250
    live = list(range(50, 300))
    assert batch_ids(newer) == [[live[o] for o in b] for b in expected_rank_ids(newer)]
    newer._source.fill()
    names = sorted(p.name for p in cache_dir.glob("*.lance"))
    assert len(names) == 3 and sum(name.startswith("data-v2-") for name in names) == 1
    assert not list(cache_dir.glob(".partial-*"))  # no leftovers


def _fill_and_read(uri: str, cache_dir: str, seed: int) -> list[list[int]]:
    loader = PrefetchLoader(uri, 10, cache=DiskCache(dir=cache_dir), seed=seed)
    ids = batch_ids(loader)
    loader._source.fill()  # the copy, made (or waited for) in the background meanwhile
    return ids


def test_two_processes_filling_one_disk_cache_at_once(fresh_ids, tmp_path):
    uri = fresh_ids(3000, rows_per_file=500)
    cache_dir = str(tmp_path / "cache")
    context = WORKERS  # processes that never opened the dataset
    with context.Pool(2) as pool:
        results = pool.starmap(_fill_and_read, [(uri, cache_dir, 1), (uri, cache_dir, 2)])
    for seed, ids in zip((1, 2), results, strict=True):
        assert ids == expected_rank_ids(PrefetchLoader(uri, 10, seed=seed))
    entries = sorted(os.listdir(cache_dir))
    assert len([e for e in entries if e.endswith(".lance")]) == 1
    assert not [e for e in entries if e.startswith(".partial-")]
    copy = os.path.join(cache_dir, next(e for e in entries if e.endswith(".lance")))
    # the id column (int64, the first) stored raw: the ids in offset order, nothing else
    ids = np.fromfile(os.path.join(copy, "columns", "0.raw"), dtype="<i8")
    assert ids.tolist() == list(range(3000))


def test_disk_cache_default_dir_comes_from_the_environment(ids_1003, tmp_path, monkeypatch):
    monkeypatch.setenv("LANCE_PREFETCH_CACHE_DIR", str(tmp_path / "env"))
    loader = PrefetchLoader(ids_1003, 10, cache="disk")
    assert isinstance(loader._source, _disk.DiskCache)
    assert loader._source.path.parent == tmp_path / "env"
    assert not (tmp_path / "env").exists()  # nothing written before the first read
    next(iter(loader))
    loader._source.fill()
    assert loader._source.path.is_dir()


def test_caches_read_s3_datasets_by_scan(s3, s3_ids_503, tmp_path):
    options = s3.storage_options()
    plain = PrefetchLoader(
        Dataset(s3_ids_503, storage_options=options), 10, seed=2, drop_last=False
    )
    expected = epoch_values(plain, 0)
    for cache in (MemoryCache(), DiskCache(dir=tmp_path / "c")):
        loader = PrefetchLoader(
            Dataset(s3_ids_503, storage_options=options), 10, seed=2, drop_last=False, cache=cache
        )
        assert epoch_values(loader, 0) == expected
    assert isinstance(loader._source, _disk.DiskCache)


@pytest.mark.parametrize(
    ("make", "error", "match"),
    [
        (lambda: as_cache("ram"), ValueError, r"^cache should be None, 'memory', 'disk', a Memory"),
        (lambda: as_cache(1), TypeError, r"^cache should be None, 'memory', 'disk', a MemoryCa"),
        (lambda: MemoryCache(max_bytes=0), ValueError, r"^max_bytes should be an integer >= 1"),
        (lambda: MemoryCache(max_bytes=1.5), TypeError, r"^max_bytes should be an integer"),
        (lambda: DiskCache(dir=3), TypeError, r"^DiskCache: dir should be a path"),
        (lambda: DiskCache(dir=""), ValueError, r"^DiskCache: dir should be a folder"),
        (
            lambda: DiskCache(dir=__file__),
            ValueError,
            rf"^DiskCache: dir should be a folder \(created if missing\), but got dir="
            rf"'{re.escape(__file__)}', which is not a folder; pass a folder this process can write$",
        ),
        (
            lambda: DiskCache(dir=__file__ + "/below/cache"),
            ValueError,
            rf"^DiskCache: dir should be a folder .*, below '{re.escape(__file__)}', which is not "
            rf"a folder; pass a folder this process can write$",
        ),
        (lambda: DiskCache(dir="/dev/null"), ValueError, r"'/dev/null', which is not a"),
    ],
)
def test_bad_cache_options_are_refused_before_any_io(make, error, match):
    with pytest.raises(error, match=match):
        make()


@pytest.mark.parametrize("cache", ["ram", 1, True])
def test_the_loader_refuses_a_bad_cache_before_any_io(cache):
    error = ValueError if isinstance(cache, str) else TypeError
    with pytest.raises(
        error, match=r"^cache should be None, 'memory', 'disk', a MemoryCache or a "
    ):
        PrefetchLoader("/nonexistent/data.lance", 10, cache=cache)


def test_the_cache_dir_refuses_a_nul_and_is_kept_absolute(ids_25, monkeypatch, tmp_path):
    """``~`` is the home in the check too (``test_options.py``); a NUL is refused; a relative
    folder is made absolute, so a later ``chdir`` (as Hydra's) does not move the copy."""
    with pytest.raises(ValueError, match=r"^DiskCache: dir should be a folder .* got dir='c\\x00'"):
        DiskCache(dir="c\x00")
    monkeypatch.chdir(tmp_path)
    loader = PrefetchLoader(ids_25, 5, cache=DiskCache(dir="relative"))
    assert loader.config.cache == DiskCache(dir=str(tmp_path / "relative"))
    monkeypatch.chdir(tmp_path / "..")
    loader._source.fill()
    assert loader._source.path.parent == tmp_path / "relative"
    assert batch_ids(loader) == expected_rank_ids(loader)


def test_the_default_cache_bytes_is_half_the_memory_or_of_a_lower_cgroup_limit(
    tmp_path, monkeypatch
):
    """Half of the physical memory, or of the control group's memory limit where it is lower
    (a container); v2's ``max``, v1's "unlimited" and a missing file are no limit."""
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    v2, v1 = tmp_path / "memory.max", tmp_path / "memory.limit_in_bytes"
    monkeypatch.setattr(_disk, "CGROUP_LIMITS", (str(v2), str(v1)))
    assert _disk.default_cache_bytes() == physical // 2  # neither file
    v2.write_text("max\n")
    v1.write_text("9223372036854771712\n")
    assert _disk.default_cache_bytes() == physical // 2
    v1.write_text(f"{3 << 30}\n")
    assert _disk.default_cache_bytes() == 3 << 29
    v2.write_text(f"{1 << 30}\n")
    assert _disk.default_cache_bytes() == 1 << 29
    v2.write_text(f"{physical * 4}\n")  # a limit above the machine's memory
    v1.unlink()
    assert _disk.default_cache_bytes() == physical // 2


def test_memory_source_takes_check_offsets(ids_1003):
    source = _disk.MemoryCache(LanceSource(ids_1003), 1 << 20)
    with pytest.raises(IndexError, match=r"row offsets must be in \[0, 1003\)"):
        source.take(np.array([0, 1003]))
    assert not source.cached  # refused before the fill
    assert source.take(np.array([5, 1, 5]))["id"].to_pylist() == [5, 1, 5]


def test_a_cache_dir_that_cannot_be_made_is_the_reads_error_naming_cache_dir(ids_1003):
    """``/proc`` is a folder, so the path passes the check at construction, but nothing can be
    made in it: every read raises the fill's error, which names the folder and the fix."""
    loader = PrefetchLoader(ids_1003, 50, cache=DiskCache(dir="/proc/lance-prefetch-cache"))
    with pytest.raises(BatchLoadError) as info:
        next(iter(loader))
    message = str(info.value)
    assert (
        "DiskCache: dir='/proc/lance-prefetch-cache' cannot hold the copy of "
        f"{ids_1003!r} (" in message
    )
    assert message.endswith(
        "); pass cache=DiskCache(dir=...) with a folder this process can write, or set "
        "$LANCE_PREFETCH_CACHE_DIR"
    )
    assert isinstance(info.value.__cause__, OSError)


def test_a_null_in_a_filled_memory_cache_fails_its_own_batch_as_without_a_cache(tmp_path):
    """``label`` (int32) has nulls at 4 rows; ``text`` keeps the cache from holding tensors only.
    Epoch 1, read from the filled cache, stops where the uncached loader does: at the first
    batch holding a null, naming that batch, the batches before it delivered."""
    nulls = {5, 1002, 1999, 2996}
    table = pa.table(
        {
            "id": np.arange(3000),
            "label": pa.array([None if i in nulls else i % 10 for i in range(3000)], pa.int32()),
            "text": [f"row {i}" for i in range(3000)],
        }
    )
    uri = str(tmp_path / "nulls.lance")
    lance.write_dataset(table, uri, max_rows_per_file=1000)

    def epoch_1(**options):
        loader = PrefetchLoader(uri, 37, columns=["id", "label", "text"], seed=0, **options)
        loader.set_epoch(1)
        delivered = []
        with pytest.raises(BatchLoadError) as info:
            for batch in loader:
                delivered.append(batch["id"].tolist())
        return loader, delivered, str(info.value)

    plain, expected, message = epoch_1()
    cached = PrefetchLoader(uri, 37, columns=["id", "label", "text"], seed=0, cache="memory")
    cached._source.fill()
    assert cached._source.cached and not cached._source.ready  # text: not a tensor column
    delivered = []
    cached.set_epoch(1)
    with pytest.raises(BatchLoadError) as info:
        for batch in cached:
            delivered.append(batch["id"].tolist())
    first_null = next(n for n, ids in enumerate(expected_rank_ids(plain)) if nulls & set(ids))
    assert delivered == expected == expected_rank_ids(plain)[:first_null]
    assert str(info.value) == message
    assert message.startswith(
        f"batch {first_null} of epoch 1 (37 rows) from {uri!r} version 1 "
        "failed in conversion or transform: "
    )


def test_the_cache_dir_variable_is_checked_as_cache_dir_is_and_expands_the_home(
    ids_25, monkeypatch, tmp_path
):
    monkeypatch.setenv("LANCE_PREFETCH_CACHE_DIR", "/dev/null")
    with pytest.raises(ValueError) as info:
        PrefetchLoader(ids_25, 5, cache="disk")
    assert str(info.value) == (
        "$LANCE_PREFETCH_CACHE_DIR should be a folder (created if missing), but got "
        "$LANCE_PREFETCH_CACHE_DIR='/dev/null', which is not a folder; pass a folder this "
        "process can write"
    )
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("LANCE_PREFETCH_CACHE_DIR", "~/variable")
    assert PrefetchLoader(ids_25, 5, cache="disk")._source.cache_dir == tmp_path / "variable"
    given = PrefetchLoader(ids_25, 5, cache=DiskCache(dir="~/given"))
    assert given._source.cache_dir == tmp_path / "given"


@pytest.mark.parametrize("cache", ["memory", "disk"])
def test_a_dataset_read_failing_after_the_cache_filled_meanwhile_is_served_by_the_cache(
    ids_1003, tmp_path, cache
):
    """A take that began before the fill ended reads the dataset; the fill ends while it reads,
    then the dataset's files are gone (its take fails): the rows come from the cache."""
    if cache == "disk":
        cache = DiskCache(dir=tmp_path / "c")

    def take(read, indices):  # of the dataset (the disk copy is not tapped)
        source.fill()
        raise FileNotFoundError("the dataset's files are gone")

    with tapped(take=take):
        source = PrefetchLoader(ids_1003, 10, cache=cache)._source
        uncached = PrefetchLoader(ids_1003, 10)._source
    assert source.take(np.array([5, 1, 900]))["id"].to_pylist() == [5, 1, 900]
    with pytest.raises(FileNotFoundError, match="files are gone"):
        uncached.take(np.array([5]))  # no cache: the error as it is


def test_every_source_implements_the_row_source_protocol_and_only_a_filled_cache_gathers(
    ids_1003, tmp_path
):
    """Each source a loader builds (plain, filtered, cached, filtered and cached, a list, a
    mixture's epoch) has every RowSource member; ``ready``/``gather`` say "read by take" for
    all but a memory cache whose fill ended and a disk cache whose copy is open, which gather
    exactly the rows ``take`` reads."""
    members = [name for name in vars(RowSource) if not name.startswith("_")]
    assert {"ready", "gather", "take", "cached_rows", "uri"} <= set(members)
    disk = {"cache": DiskCache(dir=tmp_path / "c")}
    loaders = [
        PrefetchLoader(ids_1003, 10),
        PrefetchLoader(ids_1003, 10, filter="label < 3"),
        PrefetchLoader(ids_1003, 10, **disk),
        PrefetchLoader(ids_1003, 10, filter="label < 3", **disk),
        PrefetchLoader(ids_1003, 10, filter="label < 3", cache="memory"),
        PrefetchLoader([ids_1003, ids_1003], 10),
    ]
    sources = [loader._source for loader in loaders]
    sources.append(
        PrefetchLoader(Mixture([ids_1003, ids_1003], weights=[1, 1]), 10)._source.for_epoch(0)
    )
    indices = np.array([4, 0, 4])
    for source in sources:
        assert [name for name in members if not hasattr(source, name)] == [], source
        assert (source.ready, source.gather(indices)) == (False, None), source
    memory = loaders[-2]._source
    memory.fill()
    gathered = memory.gather(indices)
    assert memory.ready and gathered.num_rows == 3
    assert (
        gathered.values["id"].tolist() == memory.take(indices)["id"].to_pylist() == [11, 0, 11]
    )  # positions of label < 3
    disk = loaders[2]._source
    disk.fill()
    gathered = disk.gather(indices)
    assert disk.ready and gathered.num_rows == 3  # every column raw, a small copy
    assert gathered.values["id"].tolist() == disk.take(indices)["id"].to_pylist() == [4, 0, 4]
    filtered = loaders[3]._source  # over the same copy: rows read by take
    assert (filtered.ready, filtered.gather(indices)) == (False, None)
