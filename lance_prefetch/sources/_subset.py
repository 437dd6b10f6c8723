"""Part of a dataset: the rows a ``filter=`` matches, and a ``split=``'s part of them, as row
offsets; and the source that reads them (:class:`SubsetSource`).

The plan stays pure and unchanged: an epoch permutes positions ``0 .. m-1`` of the ``m`` rows
selected (:mod:`lance_prefetch.plan.sampling` with ``num_rows=m``), and :class:`SubsetSource` maps
each position ``p`` to the pinned version's row offset ``offsets[p]`` at read time, under any
cache. Everything that counts positions (ranks, DataLoader workers, resume, the coverage audit)
counts them among the ``m`` rows.

The offsets are found once, at construction, by :func:`select`: one scan of the pinned version
that reads only the filter's columns (and a ``by`` key column), projecting the filter as a
boolean column (``scanner(columns={"match": filter})``): row ``i`` of the scan is live row
offset ``i``, so the matching offsets are where it is true (``NULL`` counts as false, as in a
``WHERE``). Row ids (``_rowid``, ``_rowaddr``) are not offsets once rows were deleted
(``docs/subsets.md``). They are held as a sorted array of the smallest unsigned dtype that holds
every offset of the version (1, 2, 4 or 8 bytes a selected row: 4 below 2**32 rows) and travel
to DataLoader workers pickled (as that array or, when smaller, a bitmap of the version's rows),
so no worker scans again.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lance_prefetch._errors import lance_message
from lance_prefetch.convert._projection import field_at
from lance_prefetch.plan.permutation import index_dtype
from lance_prefetch.plan.splits import BY_POSITION, Split, key_hashes, key_parts, part_positions
from lance_prefetch.sources._lance import LanceSource, ShortReadError
from lance_prefetch.sources._protocol import RowSource
from lance_prefetch.sources._wrapped import WrappedSource, check_range

__all__ = ["Subset", "SubsetSource", "select", "subset_of"]

#: Rows per record batch of the selection scan (only the filter's columns are read).
SCAN_ROWS = 1 << 16


class Subset:
    """The selected rows of a pinned version: position ``p`` is row offset ``offsets[p]``.

    Args:
        offsets (numpy.ndarray): ascending, unique row offsets in ``[0, total_rows)``.
        total_rows (int): live rows of the version.
        filter (str, optional): the predicate that selected them.
        split (Split, optional): the split whose part they are.

    Pickles as the smaller of the offsets and a bitmap of ``total_rows`` bits.
    """

    def __init__(
        self, offsets: np.ndarray, total_rows: int, filter: str | None, split: Split | None
    ) -> None:
        self.offsets = offsets.astype(index_dtype(total_rows), copy=False)
        self.total_rows, self.filter, self.split = total_rows, filter, split

    @property
    def num_rows(self) -> int:
        """Rows selected, ``m``."""
        return len(self.offsets)

    def describe(self) -> str:
        """``filter=...`` and ``split=...`` as a message names them."""
        words = [] if self.filter is None else [f"filter={self.filter!r}"]
        if self.split is not None:
            words.append(f"split part {self.split.name!r}")
        return " and ".join(words)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        if self.total_rows // 8 < self.offsets.nbytes:
            bits = np.zeros(self.total_rows, dtype=bool)
            bits[self.offsets] = True
            state["offsets"] = None
            state["bits"] = np.packbits(bits)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        bits = state.pop("bits", None)
        self.__dict__.update(state)
        if bits is not None:
            mask = np.unpackbits(bits, count=self.total_rows).view(bool)
            self.offsets = np.flatnonzero(mask).astype(index_dtype(self.total_rows))


class SubsetSource(WrappedSource):
    """A :class:`~lance_prefetch.sources._protocol.RowSource` of the ``m`` rows of ``subset``:
    ``take`` maps positions ``0 .. m-1`` to their row offsets and reads them from ``inner`` (the
    dataset, or a cache of it). Every other member is ``inner``'s.

    Args:
        inner (RowSource): the pinned dataset or its cache.
        subset (Subset): the rows selected.
    """

    def __init__(self, inner: RowSource, subset: Subset) -> None:
        super().__init__(inner)
        self.subset = subset

    @property
    def num_rows(self) -> int:
        """Rows selected, ``m``."""
        return self.subset.num_rows

    def cached_rows(self, indices: np.ndarray) -> int | None:
        """As the inner source's, for the row offsets of positions ``indices``."""
        return self.inner.cached_rows(self.subset.offsets[indices])

    def take(self, indices: np.ndarray) -> pa.Table:
        """The rows at positions ``indices`` (each in ``[0, m)``), in that order: the inner
        source's rows at ``offsets[indices]`` (its errors as they are)."""
        self.check_offsets(indices)
        return self.inner.take(self.subset.offsets[indices])

    def check_offsets(self, indices: np.ndarray) -> None:
        """Refuse positions outside ``[0, m)`` before any read (``IndexError``)."""
        of = f"(the rows of {self.subset.describe()}) for {self.uri!r} version {self.version}"
        check_range(indices, self.num_rows, what="row positions", of=of)

    def scan(self) -> Iterator[pa.RecordBatch]:
        """The selected rows in position order, from one scan of the inner ``LanceSource``
        (what ``cache="memory"`` fills from: it then holds the ``m`` rows only).

        Raises:
            ShortReadError: the scan found another number of selected rows than ``m``.
            Exception: the scan's errors (:meth:`LanceSource.scan`).
        """
        offsets, start, found = self.subset.offsets, 0, 0
        for batch in self.inner.scan():  # type: ignore[attr-defined]
            low, high = np.searchsorted(offsets, [start, start + batch.num_rows])
            start += batch.num_rows
            if high > low:
                found += int(high - low)
                yield batch.take(pa.array(offsets[low:high] - (start - batch.num_rows)))
        if found != self.num_rows:
            raise ShortReadError(
                f"a scan of {self.uri!r} version {self.version} found {found} of the "
                f"{self.num_rows} rows of {self.subset.describe()}"
            )


def select(source: LanceSource, filter: str | None, split: Split | None) -> Subset | None:
    """The rows of ``source``'s pinned version that ``filter`` matches, and of those the part
    ``split`` names (``None``: neither given, every row). One scan of the filter's columns and
    the split's key column; none for a split by position without a filter.

    Raises:
        ValueError: Lance refused the filter (its message quoted), the filter is not a
            predicate, it matches no row, the split's key column is missing, of another type or
            null for a selected row, or the part is empty.
    """
    if filter is None and split is None:
        return None
    total = source.num_rows
    key = None if split is None or split.by == BY_POSITION else split.by
    if key is not None:
        _check_key(source, key)
    if filter is None and key is None:
        offsets, matched = np.arange(total, dtype=index_dtype(total)), total
    else:
        offsets, matched = _scan_offsets(source, filter, key, split)
    if not matched:
        raise ValueError(
            f"filter={filter!r} matches no row of {source.uri!r} version {source.version} "
            f"({total} rows); check the predicate's columns and values (strings in single "
            f"quotes), or leave filter out"
        )
    if split is not None and key is None:
        offsets = offsets[part_positions(len(offsets), split)]
    if split is not None and not len(offsets):
        raise ValueError(
            f"split: the part {split.name!r} ({split.fraction:g} of the rows, by {split.by!r}) "
            f"holds no row of {source.uri!r} version {source.version}"
            + (f" matching filter={filter!r}" if filter is not None else "")
            + "; give it a larger fraction, or read more rows"
        )
    return Subset(offsets, total, filter, split)


def subset_of(source: Any) -> Subset | None:
    """The :class:`Subset` a loader's source reads (under or over a cache), or ``None``."""
    while isinstance(source, WrappedSource):  # a subset, or a cache over one
        if isinstance(source, SubsetSource):
            return source.subset
        source = source.inner
    return None


def _check_key(source: LanceSource, key: str) -> None:
    """Refuse a ``by`` that names no column or struct field (``"meta.doc"``: field ``doc`` of
    the struct ``meta``), or one of a type that is no key."""
    schema, where = source.dataset_schema, f"{source.uri!r} version {source.version}"
    if key.split(".")[0] not in schema.names:
        raise ValueError(
            f"split by={key!r}: no such column in {where}; its columns are {schema.names} (or "
            f"by='position' for exact sizes)"
        )
    field = field_at(schema, key, label=f"split by={key!r}", where=where)
    if not any(test(field.type) for test in _KEY_TYPES):
        raise ValueError(
            f"split by={key!r}: the column is {field.type}, but a split key must be an integer, "
            f"string or binary column; add such a column (e.g. a cast or a hash of it with "
            f"add_columns), or split by='position'"
        )


_KEY_TYPES = (
    pa.types.is_integer,
    pa.types.is_string,
    pa.types.is_large_string,
    pa.types.is_binary,
    pa.types.is_large_binary,
)


def _scan_offsets(
    source: LanceSource, filter: str | None, key: str | None, split: Split | None
) -> tuple[np.ndarray, int]:
    """The offsets that match ``filter`` (all, without one) and, with a ``key``, fall in the
    split's part by their key's hash, and how many matched ``filter``: one scan (two when Lance
    refuses the first of a filter alone: a constant filter, ``"true"`` or ``"1 = 1"``, which
    Lance folds to a literal naming no column, is a scan of no column, which it refuses; the
    second also reads the narrowest column, :func:`_narrowest`).

    Raises:
        ValueError: Lance refused the filter (its message quoted without Rust source paths),
            the filter is not a predicate, or a selected row's key is null.
    """
    projection = {} if filter is None else {"match": filter}
    if key is not None:  # each part quoted: "`meta`.`doc`" is field doc of the struct meta
        projection["key"] = ".".join(f"`{part}`" for part in key.split("."))
    try:
        try:
            return _scan(source, projection, filter, key, split)
        except ValueError as exc:  # Lance's "Invalid user input": the filter (key was checked)
            if filter is None:
                raise
            refusal = exc
        if key is None:
            with contextlib.suppress(ValueError):  # refused again: the first refusal stands
                column = _narrowest(source.dataset_schema)
                return _scan(source, projection | {"column": f"`{column}`"}, filter, key, split)
    except _Refusal as exc:
        raise ValueError(str(exc)) from None
    message = lance_message(str(refusal)).rstrip(".")
    raise ValueError(
        f"filter={filter!r} was refused by Lance: {message}. It must be a Lance SQL "
        f"predicate over the dataset's columns {source.dataset_schema.names}, as "
        f"LanceDataset.scanner(filter=...) takes"
    ) from refusal


def _scan(
    source: LanceSource,
    projection: dict[str, str],
    filter: str | None,
    key: str | None,
    split: Split | None,
) -> tuple[np.ndarray, int]:
    """:func:`_scan_offsets`'s scan with ``projection``; Lance's errors as they are."""
    dtype, found, start, matched = index_dtype(source.num_rows), [], 0, 0
    for batch in source.scan(batch_rows=SCAN_ROWS, projection=projection):
        rows = np.arange(start, start + batch.num_rows, dtype=np.int64)
        start += batch.num_rows
        if filter is not None:
            mask = _matches(batch.column("match"), filter)
            rows = rows[mask]
        matched += len(rows)
        if key is not None and split is not None:  # a split by key (key is split.by)
            keys = batch.column("key")
            keys = keys if filter is None else keys.filter(mask)
            if keys.null_count:
                raise _Refusal(
                    f"split by={key!r}: {keys.null_count} selected rows have a null {key}; "
                    f"leave them out with filter='{key} IS NOT NULL'"
                )
            rows = rows[key_parts(key_hashes(keys, split.seed), split)]
        found.append(rows.astype(dtype))
    return (np.concatenate(found) if found else np.zeros(0, dtype=dtype)), matched


def _narrowest(schema: pa.Schema) -> str:
    """The top-level column of fewest bits a row (a fixed-width one), else the first."""

    def bits(field: pa.Field) -> float:
        try:
            return field.type.bit_width
        except ValueError:  # not fixed-width: strings, lists, structs
            return math.inf

    return min(schema, key=bits).name


class _Refusal(Exception):
    """A filter or key refused during the scan (raised as a ``ValueError`` once outside the
    handlers of Lance's own ``ValueError``)."""


def _matches(column: pa.Array, filter: str) -> np.ndarray:
    """The rows where the projected filter is true (``NULL``: false), as a bool mask."""
    if not pa.types.is_boolean(column.type):
        raise _Refusal(
            f"filter={filter!r} is not a predicate: Lance evaluates it to {column.type} values, "
            f'not booleans; write a condition such as "label = 3" or "score > 0.5"'
        )
    if column.null_count:
        column = pc.fill_null(column, False)
    return column.to_numpy(zero_copy_only=False)
