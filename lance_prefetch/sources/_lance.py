"""The Lance source: one pinned, projected dataset version that can ``take`` rows by offset.

This is the only module that imports ``lance``. A :class:`LanceSource` opens the dataset once at
construction (to pin the version, count the live rows and check the columns), pickles small (URI,
version, columns, storage options; never the open dataset) and reopens the pinned version lazily,
once per process, when it is first used there (a spawned DataLoader worker). A copy inherited through
``fork`` refuses to read (Lance is not fork-safe) with an error that names the fix. Columns may
be paths into structs (``"image.bytes"``) and blob columns (read with ``read_blobs``); every read
returns one flat table (:mod:`lance_prefetch.convert._projection`).

Storage options go to Lance as given. For ``s3://`` URIs they are checked before any I/O, an
explicit endpoint is probed (seconds at most; Lance alone retries for minutes), and a failed open
becomes an error naming the parameter and the fix, without secrets (``_storage``).
"""

from __future__ import annotations

import logging
import os
import threading
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NoReturn

import lance
import numpy as np
import pyarrow as pa

from lance_prefetch.convert._projection import Projection
from lance_prefetch.lifecycle._exit_guard import native_call
from lance_prefetch.sources._options import SourceOptions
from lance_prefetch.sources._protocol import RowSource as RowSource
from lance_prefetch.sources._storage import (
    check_s3_options,
    explain_open_error,
    explain_read_error,
    is_s3,
    probe_endpoint,
    raise_instead,
    redact_uri,
    scrub,
)
from lance_prefetch.sources._storage import redact as redact
from lance_prefetch.sources._uris import URING, refuse_a_file, scheme, uring_uri
from lance_prefetch.sources._versions import History, checkout, committed, history
from lance_prefetch.sources._wrapped import check_range

__all__ = ["LanceSource", "RowSource", "ShortReadError", "redact"]

_DEFAULTS = SourceOptions()
_logger = logging.getLogger("lance_prefetch.source")


class ShortReadError(OSError):
    """Storage returned fewer (or more) rows than the offsets asked for. Never retried: with
    offsets checked against the pinned version, a retry reads the same files again."""

    permanent = True  # see lance_prefetch.schedule.retry.is_transient


class LanceSource:
    """A pinned, projected view of one Lance dataset version.

    Args:
        source (str | os.PathLike | lance.LanceDataset): a dataset URI (local path, ``file://``,
            ``s3://``, ...) or an open dataset. An open dataset is used as it is in this process;
            other processes reopen it from its URI, ``version`` and ``storage_options``.
        options (SourceOptions, optional): the columns (names, or dotted paths into structs such
            as ``"image.bytes"``, in order; ``None``: all top-level columns), the
            version (number or tag; ``None``: the latest at construction, or the open dataset's
            own), the ``storage_options`` (passed to Lance as they are, pickled along, never
            printed; for ``s3://`` an endpoint set there is probed once, for at most
            ``connect_timeout``, default 3 s) and ``io`` (``"uring"``: Lance's io_uring reader,
            local datasets only, with a ``RuntimeWarning`` and the default reader if the kernel
            refuses it; ``"auto"``, the default: io_uring for a local dataset, falling back to
            the default reader without a warning, and the default reader on object stores).
            Default: ``SourceOptions()``.

    Attributes:
        uri (str): the dataset's URI. version (int): the pinned version. num_rows (int): live rows
        of that version. columns (tuple[str, ...]): the projection. schema (pyarrow.Schema): the
        projected schema. io (str): the reader in use, ``"default"`` or ``"uring"`` (fallen back).

    Raises:
        TypeError: ``source`` is neither a URI nor a ``lance.LanceDataset``.
        FileNotFoundError: no Lance dataset at the URI (a local file there is refused at once, with
            how to convert it), or its S3 bucket does not exist.
        PermissionError: the object store refused the credentials, or none were found.
        ConnectionError: the object store's endpoint could not be reached (probed within a few
            seconds when ``storage_options`` sets it).
        ValueError: ``version`` does not exist (the message gives the latest version, and the tags
            for a tag), a column is not in the schema (the message lists the schema's columns, or
            a struct's fields for a path), an S3 endpoint in ``storage_options`` is not a URL or
            is plain ``http`` without ``allow_http``, or ``io="uring"`` names a non-local dataset.

    No message, ``repr`` or re-raised Lance error holds a value of a secret-looking storage option.
    """

    def __init__(
        self,
        source: str | os.PathLike[str] | lance.LanceDataset,
        options: SourceOptions = _DEFAULTS,
    ) -> None:
        # Lance's Python API takes a dict
        self._storage_options = (
            None if options.storage_options is None else dict(options.storage_options)
        )
        columns, version = options.columns, options.version
        self.io = options.io or "auto"
        asked = self.io  # "auto" tries io_uring on local files and falls back without a warning
        if isinstance(source, (str, os.PathLike, lance.LanceDataset)):
            given = source.uri if isinstance(source, lance.LanceDataset) else os.fspath(source)
            if scheme(given) == URING:
                if self.io == "default":
                    raise ValueError(
                        f"io='default' contradicts the URI {redact_uri(given)!r}, whose "
                        f"file+uring:// scheme selects Lance's io_uring reader; pass the plain "
                        f"path (or a file:// URI) for the default reader, or leave io unset"
                    )
                self.io = asked = "uring"  # chosen by the URI
            if self.io == "uring":
                uring_uri(given)  # a dataset on an object store is refused before any I/O
            elif self.io == "auto":
                self.io = "uring" if scheme(given) in ("", "file") else "default"
            # Opened with the default reader first (its errors are the explained ones).
            self._read_uri = "file" + given[len(URING) :] if scheme(given) == URING else given
        if isinstance(source, lance.LanceDataset):
            dataset, self.uri = source, source.uri
            if is_s3(self.uri):  # the options serve other processes: check them now
                check_s3_options(self._storage_options)
        elif isinstance(source, (str, os.PathLike)):
            self.uri = os.fspath(source)
            endpoint = check_s3_options(self._storage_options) if is_s3(self.uri) else None
            if endpoint is not None:
                probe_endpoint(*endpoint, self.uri, self._storage_options)
            refuse_a_file(self.uri)  # Lance retries "Not a directory" for seconds
            dataset = self._open(version=None)
        else:
            raise TypeError(
                f"source should be a dataset URI (str or os.PathLike) or a lance.LanceDataset, "
                f"but got {type(source).__name__}"
            )
        if version is not None and version != dataset.version:
            dataset = checkout(dataset, version, self.uri)
        self.version: int = dataset.version
        where = f"the dataset {self.uri!r} (version {self.version})"
        self._projection = Projection(dataset.schema, columns, where=where)
        self.columns: tuple[str, ...] = self._projection.columns
        self.schema: pa.Schema = self._projection.schema
        #: The pinned version's whole schema (for checks of options naming other columns).
        self.dataset_schema: pa.Schema = dataset.schema
        self.num_rows: int = dataset.count_rows()
        #: When the pinned version was committed (ISO 8601; ``""`` if Lance does not say).
        self.committed: str = committed(dataset)
        if self.io == "uring":
            dataset = self._switch_to_uring(dataset, warn=asked == "uring")
        self._lock = threading.Lock()
        self._dataset: lance.LanceDataset | None = dataset
        self._pid = os.getpid()

    def take(self, indices: np.ndarray) -> pa.Table:
        """Read the rows at ``indices`` (offsets among live rows), in that order.

        Blocking; releases the GIL for the whole read, so call it from worker threads to overlap reads.

        Args:
            indices (numpy.ndarray): shape ``(rows,)``, integer dtype, each in ``[0, num_rows)``;
                repeats allowed.

        Returns:
            pyarrow.Table: ``rows`` rows of :attr:`columns`, row ``i`` being live row ``indices[i]``:
            one flat column per name (a path keeps its dotted name), a blob column as its bytes
            (``large_binary``, read with Lance's ``read_blobs`` in the order asked, repeats
            included; see :mod:`lance_prefetch.convert._projection`).

        Raises:
            IndexError: an index is outside ``[0, num_rows)`` (checked before reading, because Lance
                silently drops an out-of-range offset followed by a valid one).
            ShortReadError: storage returned a different number of rows than asked for (an
                ``OSError``).
            PermissionError: the object store refused the credentials for the read (HTTP 403:
                revoked, deactivated or expired since the open); the message names the dataset
                and the options to check. Not retried.
            FileNotFoundError: a file of the pinned version is gone (cleaned up, or deleted).
            Exception: Lance's own error from the read (its message without secret values), or,
            on the first read in a new process, the open errors listed in the class docstring.
        """
        self.check_offsets(indices)
        dataset, projection = self._opened(), self._projection
        try:
            with native_call():  # see _exit_guard: the interpreter must not finalize under it
                columns = projection.read_columns
                table = dataset.take(indices, columns=columns) if columns else None
                blobs = {name: _read_blobs(dataset, name, indices) for name in projection.blobs}
        except Exception as exc:
            self._reraise_read_error(exc)
        counts = [len(rows) for rows in blobs.values()] + ([table.num_rows] if table else [])
        short = [count for count in counts if count != len(indices)]
        if short:
            raise ShortReadError(
                f"Lance returned {short[0]} rows for {len(indices)} offsets from "
                f"{self.uri!r} version {self.version}"
            )
        return projection.assemble(table, blobs)

    def check_offsets(self, indices: np.ndarray) -> None:
        """Refuse offsets outside ``[0, num_rows)`` before any read (Lance silently drops an
        out-of-range offset followed by a valid one).

        Raises:
            IndexError: an offset is out of range (the message gives the range and the extremes).
        """
        check_range(
            indices,
            self.num_rows,
            what="row offsets",
            of=f"for {self.uri!r} version {self.version}",
        )

    @property
    def cached(self) -> None:
        """``None``: no cache (see :class:`RowSource`)."""
        return None

    def cached_rows(self, indices: np.ndarray) -> None:
        """``None``: no cache (see :class:`RowSource`)."""
        return None

    @property
    def ready(self) -> bool:
        """``False``: rows are read by :meth:`take` (see :class:`RowSource`)."""
        return False

    def gather(self, indices: np.ndarray) -> None:
        """``None``: rows are read by :meth:`take` (see :class:`RowSource`)."""
        return None

    def prepare(self) -> None:
        """Nothing to prepare (see :class:`RowSource`)."""

    def history(self) -> History:
        """The pinned version's fragments, and the dataset's versions and tags (reads manifests
        only; :func:`~lance_prefetch.sources._versions.history`).

        Raises:
            Exception: Lance's own error from listing them (without secret values).
        """
        dataset = self._opened()
        try:
            with native_call():
                return history(dataset)
        except Exception as exc:
            self._reraise_read_error(exc)

    def options_repr(self) -> dict[str, str] | None:
        """The storage options with secret values hidden (:func:`redact`)."""
        return redact(self._storage_options)

    def scan(
        self, *, batch_rows: int = 8192, projection: Mapping[str, str] | None = None
    ) -> Iterator[pa.RecordBatch]:
        """Every live row of the pinned version once, in offset order (row ``i`` of the
        concatenation is the row ``take([i])`` reads), projected to :attr:`columns`: a sequential
        scan, a few large reads per file (on object stores far fewer requests than ``take``).

        Args:
            batch_rows (int, optional): rows per record batch. Default: ``8192``.
            projection (Mapping[str, str], optional): instead of :attr:`columns`, Lance SQL
                expressions by output name (Lance reads only the columns they name). Default:
                ``None``.

        Raises:
            ShortReadError: the scan returned another number of rows than :attr:`num_rows`.
            PermissionError, FileNotFoundError: the object store refused the credentials, or a
                file of the pinned version is gone (as for :meth:`take`).
            Exception: Lance's own error from the read (without secret values).
        """
        dataset, own = self._opened(), projection is None
        blobs = own and bool(self._projection.blobs)  # read as bytes, not descriptors
        try:
            with native_call():
                columns = self._projection.scan_columns if projection is None else dict(projection)
                reader = dataset.scanner(
                    columns=columns,
                    batch_size=batch_rows,
                    scan_in_order=True,
                    blob_handling="all_binary" if blobs else None,
                ).to_reader()
            rows = 0
            while True:
                with native_call():
                    try:
                        batch = reader.read_next_batch()
                    except StopIteration:
                        break
                rows += batch.num_rows
                if own:  # one flat column per name, as take returns them
                    yield from self._projection.assemble(batch, {}).to_batches()
                else:
                    yield batch
        except Exception as exc:
            self._reraise_read_error(exc)
        if rows != self.num_rows:
            raise ShortReadError(
                f"a scan of {self.uri!r} version {self.version} returned {rows} rows, not "
                f"{self.num_rows}"
            )

    def copy_to(
        self,
        path: str,
        *,
        stopping: threading.Event | None = None,
        scanned: Iterator[pa.RecordBatch] | None = None,
        columns: Sequence[str] | None = None,
        each: Callable[[pa.RecordBatch], None] | None = None,
    ) -> None:
        """Write :meth:`scan`'s rows to a new local Lance dataset at ``path`` (same offsets);
        once ``stopping`` is set, fail at the next record batch (the caller removes ``path``).
        ``scanned``: the record batches of a :meth:`scan` of this source made by the caller (a
        wrapper's own), instead of a scan of its own. ``columns``: the columns the copy holds
        (some of :attr:`columns`; ``None``: all of them; none: the rows are scanned, and nothing
        is written). ``each``: called with every record batch scanned (all of :attr:`columns`,
        flat), in offset order, before it is written; its error ends the copy.

        Raises:
            OSError: ``path`` exists, or the disk is full.
            Exception: as :meth:`scan`; any error once ``stopping`` is set; ``each``'s errors
                (raised through Lance when the copy holds columns: its own error may be the
                ``__cause__`` of Lance's, or lost; the caller keeps it if it matters).
        """
        projection = self._projection  # paths back in their structs: Lance refuses "a.b" names
        if columns is not None:
            projection = projection.part(columns)

        def batches() -> Iterator[pa.RecordBatch]:
            for batch in self.scan() if scanned is None else scanned:
                if stopping is not None and stopping.is_set():
                    raise InterruptedError(f"the copy to {path!r} was stopped")
                if each is not None:
                    each(batch)
                yield projection.nest(batch)

        if not projection.columns:
            for _ in batches():
                pass
            return
        reader = pa.RecordBatchReader.from_batches(projection.storage_schema, batches())
        with native_call():
            lance.write_dataset(reader, path, mode="create", max_rows_per_file=1 << 24)

    def __repr__(self) -> str:
        return (
            f"LanceSource({self.uri!r}, version={self.version}, columns={list(self.columns)}, "
            f"num_rows={self.num_rows}, storage_options={self.options_repr()}, "
            f"io={self.io!r})"
        )

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        del state["_lock"], state["_dataset"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
        self._dataset = None

    def check_process(self) -> None:
        """Refuse to be used in a process that got this object by ``fork`` (not by pickling).

        Lance is not fork-safe: a forked child that reads through the parent's open dataset (or
        opens another while the parent's runtime threads are copied half-way) crashes or hangs.

        Raises:
            RuntimeError: this object was opened in another process and inherited through fork.
        """
        if self._dataset is not None and self._pid != os.getpid():
            raise RuntimeError(
                f"the Lance dataset {self.uri!r} was opened in process {self._pid} and this "
                f"process ({os.getpid()}) was forked from it; Lance is not fork-safe. Use "
                f"DataLoader(..., multiprocessing_context='spawn') (or 'forkserver')"
            )

    def _opened(self) -> lance.LanceDataset:
        """The pinned dataset, opened once in this process (lazily after unpickling)."""
        dataset = self._dataset
        if dataset is not None and self._pid == os.getpid():
            return dataset
        self.check_process()
        with self._lock:
            if self._dataset is None:
                self._dataset = self._open(version=self.version)
                self._pid = os.getpid()
            return self._dataset

    def _switch_to_uring(self, dataset: lance.LanceDataset, *, warn: bool) -> lance.LanceDataset:
        """The pinned version opened through io_uring and probed with a one-row take; on any
        failure ``dataset`` (the default reader) instead, with a ``RuntimeWarning`` if ``warn``
        (``io="uring"`` asked for; ``"auto"`` logs it at ``DEBUG``)."""
        uri = uring_uri(self.uri)
        try:
            uring = lance.dataset(uri, version=self.version, storage_options=self._storage_options)
            if self.num_rows:
                with native_call():
                    probe = uring.take([0], columns=[self.columns[0]])
                if probe.num_rows != 1:
                    raise OSError(f"a probe take returned {probe.num_rows} rows, not 1")
        except Exception as exc:
            why = f"{type(exc).__name__}: {scrub(str(exc), self._storage_options)}"
            if warn:
                warnings.warn(
                    f"io='uring': Lance's io_uring reader failed on {self.uri!r} ({why}); the "
                    f"kernel may not allow io_uring (containers often block it). Reading with the "
                    f"default reader instead; pass io='default' to silence this",
                    RuntimeWarning,
                    stacklevel=4,
                )
            else:
                _logger.debug(
                    "io='auto': io_uring failed on %r (%s); the default reader", self.uri, why
                )
            self.io = "default"
            return dataset
        self._read_uri = uri
        return uring

    def _open(self, *, version: int | None) -> lance.LanceDataset:
        """``lance.dataset`` with the storage options; its errors explained, secrets scrubbed."""
        try:
            return lance.dataset(
                self._read_uri, version=version, storage_options=self._storage_options
            )
        except (ValueError, OSError) as exc:
            error = explain_open_error(exc, self.uri, self._storage_options, version=version)
            raise_instead(error, exc, self._storage_options)

    def _reraise_read_error(self, exc: Exception) -> NoReturn:
        """Re-raise a read's error: a refusal of the credentials as ``PermissionError``, files of
        the version gone as ``FileNotFoundError`` (:func:`explain_read_error`), anything else as it
        is (secrets scrubbed)."""
        error = explain_read_error(exc, self.uri, self.version, self._storage_options)
        raise_instead(error, exc, self._storage_options)


def _read_blobs(dataset: lance.LanceDataset, name: str, indices: np.ndarray) -> list[bytes | None]:
    """Blob column ``name``'s bytes at the offsets ``indices``, in that order, repeats included
    (``None`` for a null blob), with Lance's planned blob reader."""
    return [data for _, data in dataset.read_blobs(name, indices=indices, preserve_order=True)]
