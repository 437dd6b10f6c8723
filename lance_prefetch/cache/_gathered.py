"""Rows already converted to tensors, sliced and split as an Arrow table is (:class:`Gathered`),
and the whole-table conversion behind it: :func:`dense_columns` (the columns whose conversion is
a view of their buffers, as tensors of all rows) and :func:`gathered` (a coalesced take converted
once, when every column is such a view). Used by a filled memory cache and by
:meth:`~lance_prefetch.loader._iteration.BatchReader.convert`. Pure code over Arrow and torch."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import torch

from lance_prefetch.convert._arrow import _ZERO_COPY, to_tensors

__all__ = ["Gathered", "dense_columns", "gathered"]


class Gathered:
    """Rows already converted (``{column: value}``, as :func:`~lance_prefetch.convert.to_tensors`
    returns them), sliceable as a table is: tensors by their first dimension, lists as lists,
    structs' dicts field by field."""

    __slots__ = ("num_rows", "values")

    def __init__(self, values: dict[str, Any], num_rows: int) -> None:
        self.values, self.num_rows = values, num_rows

    def slice(self, offset: int, length: int) -> Gathered:
        """Rows ``offset .. offset + length - 1`` (tensors as views)."""
        return Gathered(_slice(self.values, offset, length), length)

    def split(self, lengths: list[int]) -> list[Gathered]:
        """Consecutive pieces of ``lengths`` rows each (summing to ``num_rows``), in order;
        tensors as views (one ``torch.split`` a tensor)."""
        if len(lengths) == 1:
            return [self]
        columns = {name: _split(value, lengths) for name, value in self.values.items()}
        return [
            Gathered({name: pieces[i] for name, pieces in columns.items()}, length)
            for i, length in enumerate(lengths)
        ]

    @property
    def nbytes(self) -> int:
        """Bytes of the tensors held (lists of values not counted)."""
        return _nbytes(self.values)


def _slice(value: Any, offset: int, length: int) -> Any:
    if isinstance(value, dict):
        return {key: _slice(item, offset, length) for key, item in value.items()}
    return value[offset : offset + length]


def _split(value: Any, lengths: list[int]) -> list[Any]:
    if isinstance(value, torch.Tensor):
        return list(value.split(lengths))
    if isinstance(value, dict):
        fields = {key: _split(item, lengths) for key, item in value.items()}
        return [{key: pieces[i] for key, pieces in fields.items()} for i in range(len(lengths))]
    ends = np.cumsum(lengths).tolist()
    return [value[end - length : end] for end, length in zip(ends, lengths, strict=True)]


def _nbytes(value: Any) -> int:
    if isinstance(value, dict):
        return sum(_nbytes(item) for item in value.values())
    return value.nbytes if isinstance(value, torch.Tensor) else 0


def dense_columns(table: pa.Table) -> dict[str, torch.Tensor]:
    """The columns of ``table`` whose whole-column conversion is a view of their buffers, as
    tensors of all rows: numbers of a zero-copy dtype, fixed-size lists of them and tensors with
    their physical layout, holding no null at any level."""
    return {name: _tensor(name, array) for name, array in _arrays(table) if _viewable(array)}


def gathered(table: pa.Table) -> Gathered | None:
    """All rows of ``table`` converted at once, to be split into batches (one conversion for a
    coalesced take instead of one a batch), when every column's conversion is a view (as in
    :func:`dense_columns`: no nulls, so no batch of it can fail); else ``None``, converting
    nothing."""
    arrays = _arrays(table)
    if not arrays or not all(_viewable(array) for _, array in arrays):
        return None
    return Gathered({name: _tensor(name, array) for name, array in arrays}, table.num_rows)


def _arrays(table: pa.Table) -> list[tuple[str, pa.Array]]:
    """``(name, one array)`` a column (chunks combined where there are several)."""
    return [
        (name, column.combine_chunks() if column.num_chunks != 1 else column.chunk(0))
        for name, column in zip(table.column_names, table.columns, strict=True)
    ]


def _tensor(name: str, array: pa.Array) -> torch.Tensor:
    return to_tensors(pa.table({name: array}))[name]  # type: ignore[no-any-return]


def _viewable(array: pa.Array) -> bool:
    arrow_type = array.type
    if array.null_count:
        return False
    if isinstance(arrow_type, pa.FixedShapeTensorType):
        permutation = arrow_type.permutation
        if permutation is not None and list(permutation) != sorted(permutation):
            return False
        return _viewable(array.storage)
    if pa.types.is_fixed_size_list(arrow_type):
        return _viewable(array.flatten())
    return arrow_type in _ZERO_COPY
