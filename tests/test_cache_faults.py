"""The disk cache under faults: a disk that fills during the fill, a copy damaged between runs or
while it is read, what killed fills leave behind. Never wrong rows: every read is checked
against the plan's exact ids, and each damage is first shown to be one Lance reads silently or
fails on."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import lance
import numpy as np
import pyarrow as pa
import pytest
from support.disks import LANCE_ENOSPC, RAW_ENOSPC, ReadOnlyFolder, SmallDisk
from support.fakes import ids_table
from support.helpers import batch_ids, checkout_env, expected_rank_ids
from support.sources import Tap, tapped

from lance_prefetch import BatchLoadError, DiskCache, PrefetchLoader, ReadOptions
from lance_prefetch.cache import _files as cache_files
from lance_prefetch.cache._columns import LAYOUT
from lance_prefetch.cache._disk import ROWS
from lance_prefetch.cache._files import RECORD, check_copy
from lance_prefetch.cache._filling import THREAD_NAME

FIXES = (
    "nothing of it was kept. Free space there, pass cache=DiskCache(dir=...) with a folder on a "
    "disk with room, or use cache='memory' (rows held in each process) or cache=None (read the "
    "dataset directly)"
)


def lock_is_free(path: Path) -> bool:
    """Nobody holds the flock of ``path`` (and no descriptor of this process has it open)."""
    with open(path, "a") as file:
        try:
            fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        fcntl.flock(file, fcntl.LOCK_UN)
    opened = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the listing's own descriptor, closed by now
            opened.append(os.readlink(f"/proc/self/fd/{fd}"))
    return str(path) not in opened


def read(loader) -> list[list[int]]:
    """One epoch's ids, then the wait for the copy made in the background meanwhile."""
    ids = batch_ids(loader)
    loader._source.fill()
    return ids


def free_bytes(message: str) -> int:
    return int(re.search(r"did not fit in the ([\d,]+) bytes free", message)[1].replace(",", ""))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["tmpfs", "injected"])
def test_a_disk_full_during_the_fill_is_explained_leaves_nothing_and_the_next_run_fills(
    fresh_ids, tmp_path, monkeypatch, kind
):
    """The fill meets a full disk (a real tmpfs where this machine may mount one, else a Lance
    write that fails with ENOSPC after writing part of the copy): the fill, and every read after
    it, raise an OSError (errno ENOSPC) naming cache_dir, the rows' size, the bytes free and the fixes; the partial
    copy is removed, nothing is published, the lock is free; with the space back, the same
    loader and a new one fill again and read exact rows."""
    uri = fresh_ids(3000, rows_per_file=1000)
    text_uri = str(tmp_path / "text.lance")  # variable-width: no size known before the copy
    words = np.random.default_rng(0).integers(0, 2**62, 2000).astype(str)
    lance.write_dataset(pa.table({"id": np.arange(2000), "text": words}), text_uri)
    with SmallDisk(tmp_path / "disk", size=4 << 20, kind=kind, monkeypatch=monkeypatch) as disk:
        assert not (kind == "injected" and disk.mounted)  # "tmpfs" mounts where it may (here)
        cache_dir = disk.path / "cache"
        disk.fill(leave=16 << 10)
        with tapped() as tap:  # counts fills (copy_to calls)
            loader = PrefetchLoader(uri, 100, cache=DiskCache(dir=cache_dir))
            narrow = PrefetchLoader(text_uri, 100, columns=["text"], cache=DiskCache(dir=cache_dir))
        errors = []
        for each in (loader, narrow):
            each._source.prepare()  # what iter() does: the fill starts in the background
            with pytest.raises(OSError) as info:
                each._source.fill()
            errors.append(info.value)
            with pytest.raises(OSError) as again:  # every read raises it, not retried
                each._source.take(np.arange(3))
            assert again.value is info.value and info.value.permanent
        free = shutil.disk_usage(cache_dir).free
        for error, what, raw in zip(
            errors,
            [
                f"{uri!r} version 1 (columns ['id', 'vector', 'label'], 3,000 rows, 84,000 "
                f"bytes uncompressed)",
                f"{text_uri!r} version 1 (columns ['text'], 2,000 rows)",
            ],
            [True, False],  # the first copy's columns are all raw files, the second's Lance
            strict=True,
        ):
            assert error.errno == errno.ENOSPC
            assert str(error) == (
                f"DiskCache: the disk of dir={str(cache_dir)!r} is full: the copy of "
                f"{what} did not fit in the {free_bytes(str(error)):,} bytes free there; {FIXES}"
            )
            if disk.mounted:  # the kernel's own error (through Lance); the space is measured
                cause = str(error.__cause__)
                if raw:  # a raw file's write
                    assert cause == "[Errno 28] No space left on device", cause
                else:
                    assert "No space left on device (os error 28)" in cause, cause
                assert free_bytes(str(error)) == free == 16 << 10  # all of it back
            else:
                assert str(error.__cause__) == (RAW_ENOSPC if raw else LANCE_ENOSPC)
        locks = sorted(p.name for p in cache_dir.iterdir())
        assert locks == sorted(p._source.path.stem + ".lock" for p in (loader, narrow))
        for each in (loader, narrow):
            assert lock_is_free(each._source.path.with_suffix(".lock"))
            assert not each._source.cached
        disk.free()
        tap.copies = 0
        with tap.tapping():
            again = PrefetchLoader(uri, 100, cache=DiskCache(dir=cache_dir), seed=5)
        assert read(again) == expected_rank_ids(again)
        assert read(loader) == expected_rank_ids(loader)  # the failed loader, its next iter
        assert tap.copies == 1  # filled once, then reused
        assert check_copy(again._source.path, again._source._about()) is None
        assert not list(cache_dir.glob(".partial-*"))


@pytest.fixture(scope="module")
def mixed_1003(tmp_path_factory) -> str:
    """1,003 rows in 4 fragments: ``id``, ``vector`` and ``label`` (stored raw in a disk copy)
    and ``name`` (a string, ``"row <id>"``: in the copy's Lance part)."""
    table = ids_table(1003)
    table = table.append_column("name", pa.array([f"row {i}" for i in range(1003)]))
    path = tmp_path_factory.mktemp("mixed") / "mixed1003.lance"
    lance.write_dataset(table, path, max_rows_per_file=300)
    return str(path)


def ids_and_names(batches) -> list[list[int]]:
    """Each batch's ids, after checking that each row's name is its id's."""
    for batch in batches:
        assert batch["name"] == [f"row {i}" for i in batch["id"].tolist()]
    return batch_ids(batches)


def data_file(copy: Path) -> Path:
    """The data file of the copy's Lance part."""
    (path,) = (copy / ROWS / "data").iterdir()
    return path


def raw_file(copy: Path) -> Path:
    """The raw file of the copy's ``id`` column (its first)."""
    return copy / "columns" / "0.raw"


def silent_flip(copy: Path, scratch: Path) -> int:
    """A byte offset of the copy's Lance data file that, inverted, makes Lance read other names
    without any error (found on a scratch copy)."""
    shutil.copytree(copy / ROWS, scratch)
    (path,) = (scratch / "data").iterdir()
    raw = path.read_bytes()
    expected = [f"row {i}" for i in range(1003)]
    for offset in range(64, len(raw) // 2):
        flipped = bytearray(raw)
        flipped[offset] ^= 0xFF
        path.write_bytes(flipped)
        try:
            names = lance.dataset(scratch).to_table(columns=["name"])["name"].to_pylist()
        except Exception:
            continue
        if len(names) == 1003 and names != expected:
            return offset
    raise AssertionError("no byte of the data file changes the names silently")


def flip(path: Path, offset: int, *, keep_mtime: bool = False) -> None:
    stat = path.stat()
    raw = bytearray(path.read_bytes())
    raw[offset] ^= 0xFF
    path.write_bytes(raw)
    if keep_mtime:  # only the ctime can tell now
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def truncate_data(copy: Path) -> str:
    path = data_file(copy)
    size = path.stat().st_size
    os.truncate(path, size // 2)
    return f"its file {ROWS}/data/{path.name} has {size // 2:,} bytes, not {size:,}"


def remove_data(copy: Path) -> str:
    path = data_file(copy)
    os.remove(path)
    return f"its file {ROWS}/data/{path.name} is missing"


def empty_manifest(copy: Path) -> str:
    (path,) = (copy / ROWS / "_versions").glob("*.manifest")
    size = path.stat().st_size
    os.truncate(path, 0)
    return f"its file {ROWS}/_versions/{path.name} has 0 bytes, not {size:,}"


def add_file(copy: Path) -> str:
    (copy / ROWS / "data" / "extra.lance").write_bytes(b"x")
    return f"its file {ROWS}/data/extra.lance was not there when the copy was made"


def truncate_raw(copy: Path) -> str:
    os.truncate(raw_file(copy), 8 * 1000)  # 3 ids short
    return "its file columns/0.raw has 8,000 bytes, not 8,024"


def remove_layout(copy: Path) -> str:
    os.remove(copy / LAYOUT)
    return f"its file {LAYOUT} is missing"


def remove_record(copy: Path) -> str:
    os.remove(copy / RECORD)
    return f"it has no {RECORD} (it was damaged, or made by an older lance_prefetch)"


def garble_record(copy: Path) -> str:
    (copy / RECORD).write_text('{"format": 1')
    return (
        f"its {RECORD} cannot be read (JSONDecodeError: Expecting ',' delimiter: line 1 column "
        f"13 (char 12))"
    )


def dangling_link(copy: Path) -> str:
    shutil.rmtree(copy)
    copy.symlink_to(copy.parent / "moved-away")  # a link to a copy moved, then removed
    return f"it has no {RECORD} (it was damaged, or made by an older lance_prefetch)"


def file_in_place(copy: Path) -> str:
    shutil.rmtree(copy)
    copy.write_text("not a copy")
    return (
        f"its {RECORD} cannot be read (NotADirectoryError: [Errno 20] Not a directory: "
        f"'{copy / RECORD}')"
    )


#: Each damage: it damages the copy and returns the reason the warning must give.
DAMAGES = {
    "data file truncated": truncate_data,
    "data file removed": remove_data,
    "version manifest emptied": empty_manifest,
    "file added": add_file,
    "raw file truncated": truncate_raw,
    "layout removed": remove_layout,
    "record removed": remove_record,
    "record garbled": garble_record,
    "copy a dangling link": dangling_link,
    "copy a file": file_in_place,
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "damage",
    [
        *DAMAGES,
        "bytes flipped",
        "bytes flipped, mtime kept",
        "raw bytes flipped",
        "raw bytes flipped, mtime kept",
    ],
)
def test_a_damaged_copy_is_found_at_open_and_filled_again(mixed_1003, tmp_path, damage):
    """A copy damaged between runs (a file of its Lance part or a raw file truncated, removed or
    added, the record gone or garbled, bytes flipped that Lance reads silently as other names or
    that are other ids in a raw file): the next open finds it, warns naming the damage, sets the
    copy aside and fills it again; exact rows, one new fill, nothing of the damaged copy left."""
    cache_dir = tmp_path / "cache"
    first = PrefetchLoader(mixed_1003, 50, cache=DiskCache(dir=cache_dir))
    assert read(first) == expected_rank_ids(first)
    copy = first._source.path
    keep_mtime = damage.endswith("kept")
    if damage.startswith("bytes flipped"):
        offset = silent_flip(copy, tmp_path / "scratch")
        flip(data_file(copy), offset, keep_mtime=keep_mtime)
        wrong = lance.dataset(copy / ROWS).to_table(columns=["name"])["name"].to_pylist()
        assert len(wrong) == 1003 and wrong != [f"row {i}" for i in range(1003)]  # Lance alone
        reason = f"its file {ROWS}/data/{data_file(copy).name} was changed (its CRC-32 differs)"
    elif damage.startswith("raw bytes flipped"):
        flip(raw_file(copy), 8 * 500, keep_mtime=keep_mtime)  # the low byte of id 500
        assert np.fromfile(raw_file(copy), "<i8")[500] == 500 ^ 0xFF
        reason = "its file columns/0.raw was changed (its CRC-32 differs)"
    else:
        reason = DAMAGES[damage](copy)
    with tapped() as tap:  # counts fills (copy_to calls)
        second = PrefetchLoader(mixed_1003, 50, cache=DiskCache(dir=cache_dir), seed=3)
    message = f"the copy {str(copy)!r} of {mixed_1003!r} version 1 is damaged: {reason}; filling"
    with pytest.warns(RuntimeWarning, match=re.escape(message)):
        ids = ids_and_names(list(second))
        second._source.fill()
    assert ids == expected_rank_ids(second)
    assert tap.copies == 1
    assert check_copy(copy, second._source._about()) is None
    assert sorted(p.name for p in cache_dir.iterdir()) == [copy.name, copy.stem + ".lock"]
    assert ids_and_names(list(second)) == expected_rank_ids(second)  # from the copy


def test_a_copy_in_the_layout_of_an_older_version_is_filled_again(mixed_1003, tmp_path):
    """A copy an older lance_prefetch made (a Lance dataset of every column, record format 1) is
    not read: the first open warns that it is of another layout, sets it aside and fills it
    again in this layout; exact rows."""
    cache_dir = tmp_path / "cache"
    loader = PrefetchLoader(mixed_1003, 50, cache=DiskCache(dir=cache_dir), seed=4)
    copy = loader._source.path
    cache_dir.mkdir()
    lance.write_dataset(lance.dataset(mixed_1003).to_table(), copy)  # the old layout
    cache_files.write_record(copy, loader._source._about())
    record = json.loads((copy / RECORD).read_text())
    (copy / RECORD).write_text(json.dumps({**record, "format": 1}))
    reason = (
        f"it is in the layout of another lance_prefetch version (its {RECORD} has format 1, "
        f"this version writes 2)"
    )
    message = f"the copy {str(copy)!r} of {mixed_1003!r} version 1 is damaged: {reason}; filling"
    with pytest.warns(RuntimeWarning, match=re.escape(message)):
        assert ids_and_names(list(loader)) == expected_rank_ids(loader)
        loader._source.fill()
    assert sorted(p.name for p in copy.iterdir()) == [RECORD, "columns", LAYOUT, ROWS]
    assert ids_and_names(list(loader)) == expected_rank_ids(loader)  # from the new copy


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["mount", "injected"])
def test_a_copy_copied_to_a_read_only_folder_is_read_checked_and_opened(
    mixed_1003, tmp_path, monkeypatch, kind
):
    """A copy copied elsewhere (every file with a new stamp) and served from a read-only folder
    (a read-only bind mount where this machine may mount, else injected EROFS): its files are
    read once to check them, the record cannot be restamped there, and the copy is opened
    all the same; no fill, exact rows, the record untouched."""
    made = tmp_path / "made"
    first = PrefetchLoader(mixed_1003, 50, cache=DiskCache(dir=made))
    assert read(first) == expected_rank_ids(first)
    shutil.copytree(made, tmp_path / "shared", copy_function=shutil.copy)  # new stamps
    with ReadOnlyFolder(
        tmp_path / "shared", tmp_path / "read-only", kind=kind, monkeypatch=monkeypatch
    ) as folder:
        assert not (kind == "injected" and folder.mounted)  # "mount" mounts where it may (here)
        copy = folder.path / first._source.path.name
        record = (copy / RECORD).read_bytes()
        with tapped() as tap:
            loader = PrefetchLoader(mixed_1003, 50, cache=DiskCache(dir=folder.path), seed=3)
        assert ids_and_names(list(loader)) == expected_rank_ids(loader)
        loader._source.fill()
        assert loader._source.cached and tap.copies == 0
        assert ids_and_names(list(loader)) == expected_rank_ids(loader)  # from the copy
        assert (copy / RECORD).read_bytes() == record
        assert sorted(p.name for p in folder.path.iterdir()) == sorted(
            p.name for p in made.iterdir()
        )


@pytest.mark.timeout(60)
def test_a_fill_waiting_for_another_processs_fill_stops_at_once_when_asked(mixed_1003, tmp_path):
    """Another process holds the copy's lock (filling it): this one reads the dataset, exact
    rows; its fill waits, and stops within a poll of the lock when asked (as at exit), not
    after the exit wait; nothing is left. Once the lock is free, a new loader's fill makes
    the copy."""
    loader = PrefetchLoader(mixed_1003, 50, cache=DiskCache(dir=tmp_path / "cache"))
    (tmp_path / "cache").mkdir()
    lock = loader._source.path.with_suffix(".lock")
    with open(lock, "a") as other:  # another open file: flock conflicts as another process's
        fcntl.flock(other, fcntl.LOCK_EX)
        assert ids_and_names(list(loader)) == expected_rank_ids(loader)
        filling = loader._source._filling
        assert filling.started and not filling.done  # waiting for the lock
        began = time.monotonic()
        filling.close()  # what the exit hook does
        assert filling.done and time.monotonic() - began < 0.5
        assert filling.error is None and not loader._source.cached
        fcntl.flock(other, fcntl.LOCK_UN)
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == [lock.name]
    again = PrefetchLoader(mixed_1003, 50, cache=DiskCache(dir=tmp_path / "cache"), seed=2)
    again._source.fill()
    assert ids_and_names(list(again)) == expected_rank_ids(again)  # from the copy
    assert lock_is_free(lock)


@pytest.mark.timeout(60)
def test_an_untouched_copy_is_opened_without_reading_it_and_a_touched_one_is_read_once(
    mixed_1003, tmp_path, monkeypatch
):
    """Reuse costs a stat a file: no CRC-32 is computed. A file whose timestamps changed but not
    its bytes is read once, by the background fill (never by ``iter()`` in the training thread),
    kept (no new fill, no warning) and its new stamp recorded."""
    cache_dir = tmp_path / "cache"
    first = PrefetchLoader(mixed_1003, 50, cache=DiskCache(dir=cache_dir))
    assert read(first) == expected_rank_ids(first)
    copy = first._source.path
    summed = []
    original = cache_files.crc32

    def crc32(path):
        assert threading.current_thread().name == THREAD_NAME  # the fill's thread
        summed.append(path)
        return original(path)

    monkeypatch.setattr(cache_files, "crc32", crc32)
    tap = Tap()  # counts fills (copy_to calls)
    for touch in (False, True, False):
        if touch:
            os.utime(data_file(copy))
        with tap.tapping():
            loader = PrefetchLoader(mixed_1003, 50, cache=DiskCache(dir=cache_dir), seed=7)
        assert read(loader) == expected_rank_ids(loader)
        assert summed == ([data_file(copy)] if touch else [])
        summed.clear()
    assert tap.copies == 0
    assert not list(cache_dir.glob(".record-*"))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("part", ["Lance data file", "raw file"])
def test_a_copy_damaged_while_it_is_read_is_an_error_naming_it_never_other_rows(
    mixed_1003, tmp_path, part
):
    """A file of the copy truncated mid-epoch (of its Lance part; or a mapped raw file between
    two batches, whose size is checked before each read: a read past its end would end the
    process): the batches read before are exact, then a BatchLoadError (not retried) names the
    copy and tells to delete it; the next run refills. The raw file's copy is all raw files
    (``ready``: read in ``next()``, nothing ahead), so no read is in flight when it is
    truncated; a truncation during a read of a mapped page may end the process (``SIGBUS``)."""
    cache_dir = tmp_path / "cache"
    columns = ["id", "vector", "label"] if part == "raw file" else None
    loader = PrefetchLoader(
        mixed_1003,
        50,
        columns=columns,
        cache=DiskCache(dir=cache_dir),
        read=ReadOptions(coalesce=1),
    )
    expected = expected_rank_ids(loader)
    loader._source.fill()  # the copy open before the first read, so every take reads it
    assert loader._source.ready == (part == "raw file")
    iterator = iter(loader)
    delivered = batch_ids([next(iterator)])
    copy = loader._source.path
    damaged = raw_file(copy) if part == "raw file" else data_file(copy)
    os.truncate(damaged, 0)
    with pytest.raises(BatchLoadError) as info:
        for batch in iterator:
            delivered.append(batch["id"].tolist())
    assert delivered == expected[: len(delivered)] and len(delivered) < len(expected)
    message = str(info.value)
    assert message.startswith(
        f"batch {len(delivered)} of epoch 0 (50 rows) from {mixed_1003!r} version 1 failed "
        f"after 1 attempt (not retried: CopyReadError is not transient): CopyReadError: the "
        f"disk cache {str(copy)!r} (the copy of {mixed_1003!r} version 1) could not be read: "
        f"OSError: "
    )
    if part == "raw file":
        assert len(delivered) == 1  # the next read found it
        assert ": OSError: its file columns/0.raw has 0 bytes, not 8,024; it may" in message
    assert message.endswith(
        "; it may be damaged: delete it (the next run fills it again), or use cache='memory' "
        "or cache=None"
    )
    again = PrefetchLoader(mixed_1003, 50, columns=columns, cache=DiskCache(dir=cache_dir), seed=1)
    relative = damaged.relative_to(copy).as_posix()
    with pytest.warns(RuntimeWarning, match=rf"is damaged: its file {relative} has 0 bytes, not"):
        assert read(again) == expected_rank_ids(again)


@pytest.mark.timeout(60)
def test_what_killed_fills_left_is_removed_by_the_next_fill_of_that_copy(ids_1003, tmp_path):
    """A fill killed (SIGKILL) leaves its private folder; one killed while setting a damaged copy
    aside leaves that copy; one killed while restamping leaves a record file: the next fill of
    the same copy (holding its lock) removes them; another copy's are left alone."""
    cache_dir = tmp_path / "cache"
    loader = PrefetchLoader(ids_1003, 50, cache=DiskCache(dir=cache_dir))
    name = loader._source.path.name
    cache_dir.mkdir()
    ours = [f".partial-{name}-k1l2", f".damaged-{name}-0a1b2c3d", f".record-{name}-9f8e7d6c"]
    theirs = [".partial-other-v1-0123456789abcdef.lance-x1y2"]
    for entry in ours[:2] + theirs:
        (cache_dir / entry / "data").mkdir(parents=True)
        (cache_dir / entry / "data" / "half.lance").write_bytes(b"\0" * 100)
    (cache_dir / ours[2]).write_text("{}")
    assert read(loader) == expected_rank_ids(loader)
    assert sorted(p.name for p in cache_dir.iterdir()) == sorted(
        [*theirs, name, loader._source.path.stem + ".lock"]
    )


_SLOW_FILL = """
import sys, time
from lance_prefetch import DiskCache, PrefetchLoader
from support.sources import tapped

def slow_scan(read, **options):  # 21 record batches, 0.5 s each: a copy of 10 s
    for batch in read(**{**options, "batch_rows": 50}):
        time.sleep(0.5)
        yield batch

cache = DiskCache(dir=sys.argv[3]) if sys.argv[2] == "disk" else sys.argv[2]
with tapped(scan=slow_scan):  # the fill's scan (of the memory cache, or of the disk copy)
    loader = PrefetchLoader(sys.argv[1], 50, cache=cache)
print(next(iter(loader))["id"].shape[0], flush=True)  # the fill runs behind; the script ends
"""


@pytest.mark.slow
@pytest.mark.timeout(60)
@pytest.mark.parametrize("cache", ["disk", "memory"])
def test_a_process_ending_during_the_fill_stops_it_at_the_next_record_batch(
    ids_1003, tmp_path, cache
):
    """The script ends 0.5 s into a 10 s fill: the fill stops at its next record batch, so the
    process ends with its own status, without the exit guard's "still inside Lance" (which would
    come after 5 s), and nothing of a partial disk copy is left."""
    cache_dir = tmp_path / "cache"
    done = subprocess.run(
        [sys.executable, "-c", _SLOW_FILL, ids_1003, cache, str(cache_dir)],
        capture_output=True,
        text=True,
        env=checkout_env(),
        timeout=45,
    )
    assert (done.returncode, done.stdout) == (0, "50\n"), done.stderr[-2000:]
    assert "still inside Lance" not in done.stderr
    assert not list(cache_dir.glob(".partial-*")) and not list(cache_dir.glob("*.lance"))
