"""``cache="memory"``: the projected columns held in this process, filled by one scan in the
background while the first epoch is read by takes, then gathered straight into tensors.

The fill (:class:`~lance_prefetch.cache._filling.BackgroundFill`) appends the scan's record batches in
offset order, so the rows landed so far are always a prefix ``0 .. landed - 1``. Until the scan
ends, :meth:`MemoryCache.take` serves the rows of a batch that have landed from memory and reads
the others from the dataset with one ``take``, putting them back in the batch's order: the same
rows, in the same order, as the dataset returns. Once it ends, the record batches become one
table (one chunk a column), and each column whose conversion is a view of its buffer (numbers
of a zero-copy dtype, fixed-size lists and tensors of them, no nulls) also a tensor of all rows:
:meth:`MemoryCache.gather` then indexes those tensors directly (``torch.index_select``), the rest
through Arrow's ``take`` and :func:`~lance_prefetch.convert.to_tensors`, which gives the same
values, dtypes and shapes.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from lance_prefetch.cache._filling import BackgroundFill, FillingCache, FillStopped
from lance_prefetch.cache._gathered import Gathered, dense_columns
from lance_prefetch.convert._arrow import fixed_row_bytes, to_tensors
from lance_prefetch.sources._lance import LanceSource

__all__ = ["MemoryCache"]


class MemoryCache(FillingCache):
    """A :class:`~lance_prefetch.sources._lance.LanceSource`'s rows held in memory; the same ``take``.

    Args:
        source (LanceSource): the pinned, projected dataset (or a subset's source, with ``scan``).
        cache_bytes (int): the most bytes the rows may take in memory.

    Raises:
        ValueError: the columns are fixed-width and ``num_rows`` rows need more than
            ``cache_bytes`` (checked here, before any I/O); the message gives the size.

    Pickles as ``source`` and ``cache_bytes``: another process fills its own copy.
    """

    def __init__(self, source: LanceSource, cache_bytes: int) -> None:
        super().__init__(source)
        self.cache_bytes = cache_bytes
        row_bytes = fixed_row_bytes(source.schema)
        if row_bytes is not None and row_bytes * source.num_rows > self.cache_bytes:
            raise ValueError(too_big(source, row_bytes * source.num_rows, self.cache_bytes))
        self._reset()

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._batches: list[pa.RecordBatch] = []
        self._ends = np.zeros(0, dtype=np.int64)  # each landed record batch's end offset
        self._landed = 0
        self._table: pa.Table | None = None
        self._dense: dict[str, torch.Tensor] = {}
        self._filling = BackgroundFill(self._fill, f"cache='memory' of {self._source.uri!r}")

    def fill(self) -> pa.Table:
        """The cached rows, once the fill ended (started here if needed; other callers wait).

        Raises:
            MemoryError: the rows need more than ``cache_bytes`` (found during the scan for
                variable-width columns); nothing is kept.
            Exception: the scan's errors (:meth:`~lance_prefetch.sources._lance.LanceSource.scan`).
        """
        if self._table is None:
            self._filling.wait()
        assert self._table is not None
        return self._table

    def prepare(self) -> None:
        """Start the fill in the background in this process, unless it started or the rows are
        held (returns at once; reads before its end are served as the module says). A failed
        fill starts again, unless it failed on ``cache_bytes`` (``MemoryError``: it would again)."""
        if self._table is None:
            self._filling.start(again=not isinstance(self._filling.error, MemoryError))

    def _fill(self, stopping: threading.Event) -> None:
        with self._lock:  # a fill restarted in a forked copy begins again
            self._batches, self._ends, self._landed = [], self._ends[:0], 0
        size = 0
        for batch in self._source.scan():
            if stopping.is_set():
                raise FillStopped
            size += batch.nbytes
            if size > self.cache_bytes:
                with self._lock:
                    self._batches, self._ends, self._landed = [], self._ends[:0], 0
                raise MemoryError(too_big(self._source, None, self.cache_bytes))
            with self._lock:  # readers see whole record batches only
                self._batches.append(batch)
                self._ends = np.append(self._ends, self._landed + batch.num_rows)
                self._landed += batch.num_rows
        table = pa.Table.from_batches(self._batches, schema=self._source.schema)
        table = table.combine_chunks()  # one chunk a column: takes index it directly
        dense = dense_columns(table)
        with self._lock:
            self._table, self._dense, self._batches = table, dense, []

    @property
    def cached(self) -> bool:
        """Whether this process holds every row (the fill ended)."""
        return self._table is not None

    def cached_rows(self, indices: np.ndarray) -> int:
        """How many of the rows at ``indices`` are held now: all once the fill ended, else those
        of the landed prefix (what :meth:`take` serves from memory)."""
        if self._table is not None:
            return len(indices)
        return int(np.count_nonzero(np.asarray(indices) < self._landed))

    @property
    def ready(self) -> bool:
        """Whether :meth:`gather` serves every column from tensors already (the fill ended and
        every column is one the tensors hold)."""
        return self._table is not None and len(self._dense) == len(self._table.column_names)

    @property
    def landed(self) -> int:
        """Rows held so far (a prefix of the offsets)."""
        return self.num_rows if self._table is not None else self._landed

    @property
    def nbytes(self) -> int:
        """Bytes held now."""
        table = self._table
        if table is not None:
            return table.nbytes
        return sum(batch.nbytes for batch in list(self._batches))

    def take(self, indices: np.ndarray) -> pa.Table:
        """The rows at ``indices``, exactly as :meth:`LanceSource.take` returns them (same
        checks and errors): from memory once the fill ended, else the landed rows from memory
        and the others by one ``take`` of the dataset (if that fails after the fill ended
        meanwhile, from memory).

        Raises:
            MemoryError, Exception: the fill failed (its error; every later read raises it too).
        """
        self._source.check_offsets(indices)
        table = self._table
        if table is not None:
            return table.take(pa.array(indices))
        error = self._filling.error
        if error is not None:
            raise error
        try:
            return self._take_while_filling(np.asarray(indices))
        except Exception:
            table = self._table  # filled while the dataset was read (its files may be gone)
            if table is None:
                raise
            return table.take(pa.array(indices))

    def _take_while_filling(self, indices: np.ndarray) -> pa.Table:
        """:meth:`take` before the fill ended: the landed rows from memory, the others read."""
        with self._lock:
            batches, ends = list(self._batches), self._ends
        landed = int(ends[-1]) if len(ends) else 0
        here = indices < landed
        if not here.any():
            return self._source.take(indices)
        read = self._source.take(indices[~here]) if not here.all() else None
        held = _take_landed(batches, ends, indices[here], self._source.schema)
        if read is None:
            return held
        # the rows back in the batch's order: held ones first, then read ones, reordered
        order = np.empty(len(indices), dtype=np.int64)
        order[np.flatnonzero(here)] = np.arange(held.num_rows)
        order[np.flatnonzero(~here)] = np.arange(held.num_rows, len(indices))
        return pa.concat_tables([held, read.cast(held.schema)]).take(pa.array(order))

    def gather(self, indices: np.ndarray) -> Gathered | None:
        """The rows at ``indices`` already converted (as
        :func:`~lance_prefetch.convert.to_tensors` would convert :meth:`take`'s table), or
        ``None`` before the fill ended or if a column does not convert (read by :meth:`take`
        then, and converted batch by batch)."""
        table = self._table
        if table is None:
            return None
        self._source.check_offsets(indices)
        dense = self._dense
        positions = torch.from_numpy(np.asarray(indices, dtype=np.int64))
        values = {name: torch.index_select(dense[name], 0, positions) for name in dense}
        if len(values) < table.num_columns:
            rest = [name for name in table.column_names if name not in dense]
            try:
                values.update(to_tensors(table.select(rest).take(pa.array(indices))))
            except Exception:  # e.g. a null in a tensor column: taken as a table instead, so
                return None  # that the failing batch's own conversion names that batch
            values = {name: values[name] for name in table.column_names}
        return Gathered(values, len(indices))

    def __getstate__(self) -> dict[str, Any]:
        return {"source": self._source, "cache_bytes": self.cache_bytes}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._source, self.cache_bytes = state["source"], state["cache_bytes"]
        self._reset()


def _take_landed(
    batches: list[pa.RecordBatch], ends: np.ndarray, indices: np.ndarray, schema: pa.Schema
) -> pa.Table:
    """The rows at ``indices`` (all below ``ends[-1]``) of the record batches ``batches`` (ending
    at offsets ``ends``), in ``indices``' order."""
    chunk = np.searchsorted(ends, indices, side="right")
    starts = np.concatenate(([0], ends[:-1]))
    by_chunk = np.argsort(chunk, kind="stable")
    pieces = []
    for number in np.unique(chunk):
        mine = by_chunk[chunk[by_chunk] == number]
        local = indices[mine] - starts[number]
        pieces.append(pa.Table.from_batches([batches[number]]).take(pa.array(local)))
    gathered = pa.concat_tables(pieces).cast(schema) if pieces else schema.empty_table()
    # rows in chunk order; back to the indices' order
    inverse = np.empty(len(indices), dtype=np.int64)
    inverse[by_chunk] = np.arange(len(indices))
    return gathered.take(pa.array(inverse))


def too_big(source: LanceSource, size: int | None, budget: int) -> str:
    """The message of a cache that does not fit its ``budget`` (``MemoryCache.max_bytes``)."""
    need = "more than that" if size is None else f"{size:,} bytes ({size / 2**20:,.1f} MiB)"
    return (
        f"MemoryCache: the columns {list(source.columns)} of {source.uri!r} version "
        f"{source.version} ({source.num_rows} rows) need {need}, above "
        f"max_bytes={budget} ({budget / 2**20:,.1f} MiB); pass "
        f"cache=MemoryCache(max_bytes=...) with more, read fewer columns, or use cache='disk'"
    )
