"""The cache tier: serve every epoch's uniform random batches from a copy of the projected columns
that a sequential scan filled once.

Random ``take`` is slow where it reads one row at a time (about one HTTP GET a row on an object
store, a read a row on local disk); a sequential scan of the same columns is one to two orders of
magnitude faster. Both caches below are filled by one scan of the pinned version
(:meth:`~lance_prefetch.sources._lance.LanceSource.scan`, rows in offset order) and then answer
``take(indices)`` with the same rows in the same order as the dataset would, so sampling,
exactness and resuming do not change.

- :class:`~lance_prefetch.cache._memory.MemoryCache` (``cache="memory"``) keeps the rows in this
  process; its fill runs in the background while the first epoch is read by takes, and a filled
  cache gathers batches straight into tensors (see :mod:`~lance_prefetch.cache._memory`).
- :class:`DiskCache` (``cache="disk"``) copies the rows once to a local folder under
  ``cache_dir``, named by the URI, version, commit time and columns: each fixed-width column
  (numbers, bools, fixed-size lists, tensors; no nulls; the first 256) as a raw file of its
  values (:mod:`~lance_prefetch.cache._columns`), every other column in a Lance dataset inside the
  copy (``rows.lance``). Each process maps the raw files (``mmap``, read-only), so a batch of
  them is a ``numpy.take`` from memory the page cache holds once for every process and worker,
  gathered straight into tensors (:meth:`DiskCache.gather`); the Lance part is read by
  ``take``. A copy that is all raw files and fits in half the memory is read in the training
  thread, as a filled memory cache is (:attr:`DiskCache.ready`). The copy is reused across runs
  and shared by processes; concurrent fills are serialised by a file lock and published by an
  atomic rename, so a reader never sees a partial copy. A copy carries the record of its files
  (:mod:`~lance_prefetch.cache._files`), checked at each open: a damaged one, or one in the
  layout of an older version (a Lance dataset of every column), is filled again. A disk that
  fills during the fill is an ``OSError`` naming ``cache_dir`` and the fixes, and nothing of the
  copy is kept.

Every column type the loader reads is cached: a blob column's bytes are read by the scan
(Lance's ``blob_handling="all_binary"``) and held as ``large_binary`` in memory, or stored as a
blob again in the disk copy's Lance part; a nested path (``"image.bytes"``) is copied under its
struct there (or as a raw file, when it is fixed-width).

``iter(loader)`` calls ``prepare()`` in each process before the first read (so a fill is never
a timed, retried ``take``): the disk copy is made (or found) there, and every batch from epoch 0
on is served from it; the memory cache's fill starts there, in the background. A new dataset
version has another key, so a cache never serves rows of another version.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
import tempfile
import threading
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from filelock import FileLock, Timeout

from lance_prefetch._validate import check_folder
from lance_prefetch.cache._columns import ColumnFiles, ColumnWriter, HeldNull, raw_columns
from lance_prefetch.cache._files import (
    CopyReadError,
    check_copy,
    disk_full_message,
    is_disk_full,
    remove_leftovers,
    set_aside,
    write_record,
)
from lance_prefetch.cache._filling import BackgroundFill, FillingCache, FillStopped
from lance_prefetch.cache._gathered import Gathered
from lance_prefetch.cache._memory import MemoryCache
from lance_prefetch.convert._arrow import fixed_row_bytes, to_tensors
from lance_prefetch.sources._lance import LanceSource
from lance_prefetch.sources._options import SourceOptions

__all__ = [
    "CGROUP_LIMITS",
    "DiskCache",
    "LOCK_POLL_S",
    "LocalCopy",
    "MemoryCache",
    "ROWS",
    "default_cache_bytes",
    "default_cache_dir",
    "with_cache",
]

#: The Lance part of a copy (the columns not stored raw), a folder in the copy.
ROWS = "rows.lance"
#: How often a fill waiting for another process's fill checks whether it should stop, seconds.
LOCK_POLL_S = 0.1


#: The memory limit of this process's control group (v2, then v1), where Linux has one.
CGROUP_LIMITS = (
    "/sys/fs/cgroup/memory.max",
    "/sys/fs/cgroup/memory/memory.limit_in_bytes",
)


def default_cache_bytes() -> int:
    """Half of the memory this process may use, in bytes (the default ``cache_bytes``): of this
    machine's physical memory, or of its control group's limit when that is lower (a container
    given less than the machine has)."""
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not POSIX: a conservative 4 GiB
        return 4 << 30
    return min([memory, *_cgroup_limits()]) // 2


def _cgroup_limits() -> list[int]:
    """The limits of :data:`CGROUP_LIMITS` that are set (``max``, a missing file and v1's
    "unlimited", a number near 2**63, are none)."""
    limits = []
    for path in CGROUP_LIMITS:
        try:
            with open(path) as file:
                limits.append(int(file.read().strip()))
        except (OSError, ValueError):  # none here, or "max"
            continue
    return [limit for limit in limits if 0 < limit < 1 << 62]


def default_cache_dir() -> Path:
    """``$LANCE_PREFETCH_CACHE_DIR``, else ``$XDG_CACHE_HOME/lance-prefetch``, else
    ``~/.cache/lance-prefetch`` (the default ``cache_dir``)."""
    explicit = os.environ.get("LANCE_PREFETCH_CACHE_DIR")
    if explicit:
        return Path(check_folder("$LANCE_PREFETCH_CACHE_DIR", os.path.expanduser(explicit)))
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "lance-prefetch"


class DiskCache(FillingCache):
    """A :class:`~lance_prefetch.sources._lance.LanceSource`'s rows copied to a local folder:
    fixed-width columns as raw, memory-mapped files, the others as a Lance dataset.

    Args:
        source (LanceSource): the pinned, projected dataset.
        cache_dir (str | os.PathLike): where copies live; created if missing.

    The copy is the folder ``cache_dir / <name>-v<version>-<key>.lance``, ``key`` a hash of the
    URI, version, commit time and columns: another version or projection gets another copy; an
    existing one is reused (across runs and processes) once
    :func:`~lance_prefetch.cache._files.check_copy` finds it whole (a ``stat`` a file; a damaged
    copy, or one an older version laid out otherwise, is filled again, with a ``RuntimeWarning``
    naming why). It holds ``columns/<i>.raw`` for each column stored raw and ``columns.json``
    saying their dtypes and shapes (:mod:`~lance_prefetch.cache._columns`), ``rows.lance`` (a
    Lance dataset of the other columns) if there are any, and the record. A column chosen to be
    raw that holds a null at any level is found during the fill, which then starts over with
    that column in the Lance part. Copies are never deleted by the loader; remove the directory
    to reclaim the space. ``<copy>.lock`` beside each copy is only the target of the fill's OS
    file lock (:class:`filelock.FileLock`: ``flock`` on POSIX), held by no one once fills end,
    also when their process was killed.

    The raw files are mapped by each process that opens the copy (``mmap``, read-only; advised
    ``MADV_RANDOM`` when they exceed half the memory). Before each read their sizes are checked
    (one ``fstat`` a file): a file truncated since it was mapped is a
    :class:`~lance_prefetch.cache._files.CopyReadError`, not a read past its end (which would end
    the process with ``SIGBUS``); one truncated during a read can still do that.

    Pickles as ``source`` and ``cache_dir`` (never the mappings: each process maps the files).
    """

    def __init__(self, source: LanceSource, cache_dir: str | os.PathLike[str]) -> None:
        super().__init__(source)
        self.cache_dir = Path(cache_dir).expanduser()
        key = json.dumps([source.uri, source.version, source.committed, list(source.columns)])
        digest = hashlib.sha256(key.encode()).hexdigest()[:16]
        name = "".join(c if c.isalnum() or c in "-_." else "_" for c in _stem(source.uri))
        self.path = self.cache_dir / f"{name[:48]}-v{source.version}-{digest}.lance"
        self._reset()

    def _reset(self) -> None:
        """No copy opened in this process yet, and a fill not started (also in a copy)."""
        self._lock = threading.Lock()
        self._local: LocalCopy | None = None
        self._filling = BackgroundFill(self._open_copy, f"cache='disk' of {self._source.uri!r}")

    def prepare(self) -> None:
        """Start making (or finding and opening) the copy in the background, unless this process
        opened it already; until it is open, :meth:`take` reads the dataset itself. A whole copy
        already there (another run's) whose files all keep their recorded stamps is opened here,
        so the first epoch reads only it: finding it costs a ``stat`` a file (a copy with a new
        stamp is checked by the background fill, which reads it). If that open fails, the
        background fill meets the error again, and every read raises it."""
        if self._local is None and self.path.exists():
            if check_copy(self.path, self._about(), read=False) is None:
                with self._lock, contextlib.suppress(Exception):  # the fill meets it again
                    if self._local is None:
                        self._local = self._open_local()
        if self._local is None:
            self._filling.start()

    def fill(self) -> LocalCopy:
        """The local copy, opened in this process: made on the first call if no process made it
        yet, or made again if the one there is damaged or of an older layout (thread- and
        process-safe: one process copies, the others wait for it and reuse it).

        Raises:
            OSError: ``cache_dir`` cannot be written, or its disk is full (``errno`` ``ENOSPC``;
                the message names ``cache_dir``, the rows' size when the columns are fixed-width,
                the bytes free and the fixes; nothing of the copy is kept), or a damaged copy
                cannot be removed.
            ValueError: the copy does not hold ``num_rows`` rows (delete it).
            Exception: the scan's errors.
        """
        if self._local is None:
            self._filling.wait()
        assert self._local is not None
        return self._local

    def _open_copy(self, stopping: threading.Event | None = None) -> None:
        """The fill (in its thread): the copy made if needed (ended early once ``stopping`` is
        set), then opened."""
        with self._lock:
            if self._local is None:
                if not self.path.exists() or check_copy(self.path, self._about()) is not None:
                    self._copy(stopping)
                self._local = self._open_local()

    def _open_local(self) -> LocalCopy:
        """The copy at :attr:`path`, found whole, opened (under ``_lock``).

        Raises:
            ValueError: it does not hold ``num_rows`` rows (delete it).
        """
        try:
            return LocalCopy(self.path, self._source)
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(
                f"the disk cache {str(self.path)!r} does not hold the rows of "
                f"{self._source.uri!r} version {self._source.version} "
                f"({self._source.num_rows} rows): {exc}; delete the copy to rebuild it"
            ) from exc

    def _copy(self, stopping: threading.Event | None) -> None:
        """Under the copy's lock: remove what killed fills left, keep a copy another process
        made meanwhile, else set a damaged one aside, copy and publish."""
        # the OS's file lock (flock on POSIX, LockFileEx on Windows) through filelock: one fill at a
        # time across processes and threads, freed by the OS when a filling process dies
        lock = FileLock(self.path.with_suffix(".lock"))
        try:
            self.cache_dir.mkdir(parents=True, exist_ok=True)
            _acquire(lock, stopping)  # another process may be copying: wait
        except OSError as exc:
            raise self._unwritable(exc) from exc
        try:
            remove_leftovers(self.cache_dir, self.path.name)
            if os.path.lexists(self.path):  # also a link to nothing: set aside, not renamed onto
                problem = check_copy(self.path, self._about())
                if problem is None:  # made (or made again) by another process
                    return
                warnings.warn(
                    f"DiskCache: the copy {str(self.path)!r} of {self._source.uri!r} "
                    f"version {self._source.version} is damaged: {problem}; filling it again",
                    RuntimeWarning,
                    stacklevel=5,
                )
                set_aside(self.path)
            self._publish(stopping)
        finally:
            lock.release()  # closes the lock's file; a dead process's lock is freed by the OS

    def _unwritable(self, exc: OSError) -> OSError:
        """``exc`` (of making the folder, the lock or the private fill folder) as an error of
        the same type naming the folder and the fix."""
        return type(exc)(
            exc.errno,
            f"DiskCache: dir={str(self.cache_dir)!r} cannot hold the copy of "
            f"{self._source.uri!r} ({type(exc).__name__}: {exc.strerror or exc}); pass "
            f"cache=DiskCache(dir=...) with a folder this process can write, or set "
            f"$LANCE_PREFETCH_CACHE_DIR",
        )

    def _publish(self, stopping: threading.Event | None) -> None:
        """Copy into a private folder, record the copy, and rename it into place; on a full
        disk, remove the partial copy and raise the explained error."""
        partial = None
        try:
            try:
                partial = tempfile.mkdtemp(prefix=f".partial-{self.path.name}-", dir=self.cache_dir)
            except OSError as exc:
                if is_disk_full(exc):
                    raise
                raise self._unwritable(exc) from exc
            target = Path(partial, "copy.lance")
            raw = raw_columns(self._source.schema)
            while True:
                try:
                    self._write(target, raw, stopping)
                    break
                except HeldNull as exc:  # that column in the Lance part: start over
                    raw.remove(exc.column)
                    shutil.rmtree(target)
            write_record(target, self._about())
            os.rename(target, self.path)  # atomic: readers see all of it or nothing
        except OSError as exc:
            if not is_disk_full(exc):
                raise
            if partial is not None:  # removed before the free space is measured
                shutil.rmtree(partial, ignore_errors=True)
            raise _disk_full(self.cache_dir, self._source) from exc
        finally:
            if partial is not None:
                shutil.rmtree(partial, ignore_errors=True)

    def _write(self, target: Path, raw: list[str], stopping: threading.Event | None) -> None:
        """One scan of the dataset into the copy at ``target``: the columns ``raw`` as raw
        files, the others as a Lance dataset.

        Raises:
            HeldNull: a column of ``raw`` holds a null (the caller starts over without it).
            FillStopped: ``stopping`` was set.
            OSError, Exception: as :meth:`fill`.
        """
        target.mkdir()
        writer = ColumnWriter(target, self._source.schema, raw)
        rest = [name for name in self._source.columns if name not in raw]
        try:
            self._source.copy_to(
                os.fspath(target / ROWS), stopping=stopping, columns=rest, each=writer.append
            )
        except BaseException as exc:
            writer.close()
            if stopping is not None and stopping.is_set():
                raise FillStopped from None  # stopped (what was made of it is removed)
            if writer.error is not None and writer.error is not exc:
                raise writer.error from exc  # raised inside Lance's write, as Lance's error
            raise
        writer.close()

    def _about(self) -> dict[str, Any]:
        """What the copy holds, as its record says it."""
        source = self._source
        return {
            "uri": source.uri,
            "version": source.version,
            "committed": source.committed,
            "columns": list(source.columns),
            "num_rows": source.num_rows,
        }

    @property
    def cached(self) -> bool:
        """Whether this process has opened the local copy already."""
        return self._local is not None

    def cached_rows(self, indices: np.ndarray) -> int:
        """All of ``indices`` once the local copy is open (:meth:`take` reads only it), else 0."""
        return len(indices) if self._local is not None else 0

    def take(self, indices: np.ndarray) -> pa.Table:
        """The rows at ``indices``, exactly as :meth:`LanceSource.take` returns them: from the
        local copy once it is open, from the dataset while the fill runs (or before it started);
        a read of the dataset that fails after the copy opened meanwhile reads the copy instead.

        Raises:
            IndexError: as :meth:`LanceSource.take`.
            CopyReadError: the copy could not be read (damaged since it was opened); the
                message names it and the fix. Never retried.
            OSError, ValueError, Exception: the fill failed (its error, as :meth:`fill` says;
                every read until the next :meth:`prepare` raises it too).
        """
        self._source.check_offsets(indices)
        local = self._local
        if local is None:
            error = self._filling.error
            if error is not None:
                raise error
            try:
                return self._source.take(indices)
            except Exception:
                local = self._local  # opened while the dataset was read (its files may be gone)
                if local is None:
                    raise
        try:
            return local.take(indices)
        except Exception as exc:
            raise self._unreadable(exc) from exc

    @property
    def ready(self) -> bool:
        """Whether a batch is a gather from memory already, as for a filled memory cache: the
        copy is open in this process, every column is stored raw, and the raw files together fit
        in half of this machine's memory (:func:`default_cache_bytes`), so the page cache holds
        them once read. An iteration without a ``transform`` then gathers in the training thread
        and reads nothing ahead (:class:`~lance_prefetch.schedule._direct.DirectPrefetcher`); a
        larger copy, or one with columns in its Lance part, is read by the readahead threads, so
        that the disk sees several reads at once."""
        local = self._local
        return (
            local is not None and local.rows is None and local.files.nbytes <= default_cache_bytes()
        )

    def gather(self, indices: np.ndarray) -> Gathered | None:
        """The rows at ``indices`` already converted (as
        :func:`~lance_prefetch.convert.to_tensors` would convert :meth:`take`'s table): the raw
        columns gathered from their mapped files straight into tensors, the others taken from the
        copy's Lance part and converted; ``None`` until the copy is open (read by :meth:`take`
        from the dataset then), or if a column of the Lance part does not convert (a null where
        a tensor needs none: read by :meth:`take`, so that the batch's own conversion names it).

        Raises:
            IndexError, CopyReadError: as :meth:`take`.
        """
        local = self._local
        if local is None:
            return None
        self._source.check_offsets(indices)
        try:
            return local.gather(indices)
        except Exception as exc:
            raise self._unreadable(exc) from exc

    def _unreadable(self, exc: Exception) -> CopyReadError:
        return CopyReadError(
            f"the disk cache {str(self.path)!r} (the copy of {self._source.uri!r} version "
            f"{self._source.version}) could not be read: {type(exc).__name__}: {exc}; it may "
            f"be damaged: delete it (the next run fills it again), or use cache='memory' "
            f"or cache=None"
        )

    def __getstate__(self) -> dict[str, Any]:
        return {"_source": self._source, "cache_dir": self.cache_dir, "path": self.path}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reset()


class LocalCopy:
    """A finished copy opened in this process: its raw columns mapped
    (:class:`~lance_prefetch.cache._columns.ColumnFiles`), its Lance part (the other columns, if
    any) opened as a :class:`~lance_prefetch.sources._lance.LanceSource`.

    Raises:
        ValueError, KeyError, TypeError: the copy does not fit ``source`` (rows, columns, types).
        OSError: a file cannot be opened.
    """

    def __init__(self, path: Path, source: LanceSource) -> None:
        self.schema = source.schema
        self.num_rows = source.num_rows
        self.files = ColumnFiles(path, source.schema, source.num_rows)
        if self.files.nbytes > default_cache_bytes():  # more than the page cache will hold
            self.files.read_randomly()
        rest = [name for name in source.columns if name not in self.files.names]
        self.rows: LanceSource | None = None
        if rest:
            options = SourceOptions(io="auto", columns=rest)  # a local copy
            self.rows = LanceSource(os.fspath(path / ROWS), options)
            if self.rows.num_rows != source.num_rows:
                raise ValueError(f"its Lance part holds {self.rows.num_rows} rows")

    def take(self, indices: np.ndarray) -> pa.Table:
        """The rows at ``indices``, as the dataset's ``take`` returns them."""
        arrays = self.files.arrays(indices)
        if self.rows is not None:
            table = self.rows.take(indices)
            arrays.update(zip(table.column_names, table.columns, strict=True))
        return pa.Table.from_arrays(
            [arrays[name] for name in self.schema.names], schema=self.schema
        )

    def gather(self, indices: np.ndarray) -> Gathered | None:
        """The rows at ``indices`` as tensors (see :meth:`DiskCache.gather`)."""
        values: dict[str, Any] = self.files.tensors(indices)
        if self.rows is not None:
            table = self.rows.take(indices)
            try:
                values.update(to_tensors(table))
            except Exception:  # e.g. a null where a tensor needs none: taken as a table, so
                return None  # that the failing batch's own conversion names that batch
            values = {name: values[name] for name in self.schema.names}
        return Gathered(values, len(indices))


def with_cache(
    source: LanceSource,
    cache: str | None,
    *,
    cache_bytes: int | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
) -> LanceSource | MemoryCache | DiskCache:
    """``source`` itself (``cache=None``) or the cache of the kind asked for over it."""
    if cache == "memory":
        return MemoryCache(source, default_cache_bytes() if cache_bytes is None else cache_bytes)
    if cache == "disk":
        return DiskCache(source, default_cache_dir() if cache_dir is None else cache_dir)
    return source


def _acquire(lock: FileLock, stopping: threading.Event | None) -> None:
    """Wait for ``lock`` (held by another process's fill), checking ``stopping`` every
    :data:`LOCK_POLL_S` seconds: a process that ends meanwhile is not held up by the wait.

    Raises:
        FillStopped: ``stopping`` was set first.
        OSError: the lock's file cannot be made.
    """
    while True:
        try:
            lock.acquire(timeout=LOCK_POLL_S)
            return
        except Timeout:
            if stopping is not None and stopping.is_set():
                raise FillStopped from None


def _disk_full(cache_dir: Path, source: LanceSource) -> OSError:
    row_bytes = fixed_row_bytes(source.schema)
    what = (
        f"{source.uri!r} version {source.version} (columns {list(source.columns)}, "
        f"{source.num_rows:,} rows"
    )
    size = None if row_bytes is None else row_bytes * source.num_rows
    error = OSError(disk_full_message(cache_dir, what, size))
    error.errno = errno.ENOSPC
    return error


def _stem(uri: str) -> str:
    return uri.rstrip("/").rsplit("/", 1)[-1].removesuffix(".lance") or "dataset"
