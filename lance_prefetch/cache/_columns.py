"""The fixed-width columns of a disk-cache copy as raw arrays, memory-mapped to be read.

A column is stored raw when each of its rows is a fixed number of values of one type without
nulls: numbers (int8-64, uint8-64, float16/32/64), bools (one byte each), fixed-size lists of
them (nested to any depth) and Arrow's ``fixed_shape_tensor`` of them. Its file holds the values
of row ``0``, then row ``1``, ... (C order, this machine's byte order, no header), so row ``i`` is
the bytes ``i * row_bytes .. (i + 1) * row_bytes - 1``; ``columns.json`` beside the files says
each one's dtype and row shape. Every other column (strings, binaries, blobs, variable-length
lists, structs requested whole, fixed-size binaries) stays in the copy's Lance dataset, and so
do the fixed-width columns past the first :data:`MAX_FILES` and a raw candidate that turns out
to hold a null at any level (:class:`HeldNull`: the fill starts over with it there).

:class:`ColumnFiles` maps the files of a finished copy (``mmap``, read-only; the page cache holds
each page once for every process) and serves a batch as a gather from the mapping: ``numpy.take``
of the rows, either as the Arrow arrays the dataset's ``take`` returns (:meth:`ColumnFiles.arrays`)
or as the tensors :func:`~lance_prefetch.convert.to_tensors` would make of them
(:meth:`ColumnFiles.tensors`). Pure numpy, pyarrow and torch, no Lance.
"""

from __future__ import annotations

import json
import mmap
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import pyarrow as pa
import torch

from lance_prefetch.convert._arrow import _ZERO_COPY, to_tensors

__all__ = ["ColumnFiles", "ColumnWriter", "HeldNull", "LAYOUT", "MAX_FILES", "raw_columns"]

#: The layout file's name, at the root of a copy.
LAYOUT = "columns.json"
#: At most this many columns are stored raw, the first fixed-width ones in the schema's order;
#: the others stay in the Lance part. Each raw file holds a descriptor in every process that
#: maps it (and in the fill), and a process's soft limit of open files is often 1,024.
MAX_FILES = 256
_FOLDER = "columns"


class HeldNull(Exception):
    """A column chosen to be stored raw holds a null: it must stay in the copy's Lance part."""

    def __init__(self, column: str) -> None:
        super().__init__(f"column {column!r} holds a null")
        self.column = column


@dataclass(frozen=True)
class _Shape:
    """How a column's Arrow type maps to raw values: the leaf dtype, the row's shape as stored
    (the fixed-size lists' sizes), the Arrow types from the column's down to the leaf's, and the
    row's shape as a tensor (a ``fixed_shape_tensor``'s physical shape, else ``shape``)."""

    dtype: np.dtype[Any]
    shape: tuple[int, ...]
    types: tuple[pa.DataType, ...]
    view: tuple[int, ...]


def _shape(arrow_type: pa.DataType) -> _Shape | None:
    """``arrow_type`` as raw values, or ``None`` if it is not stored raw."""
    types, shape, view = [arrow_type], [], None
    if isinstance(arrow_type, pa.FixedShapeTensorType):
        view = tuple(arrow_type.shape)
        arrow_type = arrow_type.storage_type
        types.append(arrow_type)
    elif isinstance(arrow_type, pa.BaseExtensionType):
        return None
    while pa.types.is_fixed_size_list(arrow_type):
        shape.append(arrow_type.list_size)
        arrow_type = arrow_type.value_type
        types.append(arrow_type)
    if isinstance(arrow_type, pa.BaseExtensionType) or 0 in shape:
        return None
    if pa.types.is_boolean(arrow_type):
        dtype = np.dtype(np.bool_)
    elif pa.types.is_integer(arrow_type) or pa.types.is_floating(arrow_type):
        dtype = np.dtype(arrow_type.to_pandas_dtype())
    else:
        return None
    return _Shape(dtype, tuple(shape), tuple(types), tuple(shape) if view is None else view)


def raw_columns(schema: pa.Schema) -> list[str]:
    """The columns of ``schema`` (a source's flat schema) that may be stored raw: the first
    :data:`MAX_FILES` fixed-width ones."""
    return [field.name for field in schema if _shape(field.type) is not None][:MAX_FILES]


def _values(array: pa.Array, column: str) -> np.ndarray:
    """The leaf values of ``array`` (a raw column's record batch), flat.

    Raises:
        HeldNull: it holds a null at any level.
    """
    while True:
        if array.null_count:
            raise HeldNull(column)
        if isinstance(array, pa.ExtensionArray):
            array = array.storage
        elif pa.types.is_fixed_size_list(array.type):
            array = array.flatten()  # this slice's values only
        else:
            break
    values = array.to_numpy(zero_copy_only=not pa.types.is_boolean(array.type))
    return np.ascontiguousarray(values)


def _write(file: BinaryIO, values: np.ndarray) -> None:
    """Append ``values``' bytes to ``file`` (the one place raw bytes are written)."""
    file.write(values.data.cast("B"))


class ColumnWriter:
    """Writes the raw columns ``names`` of ``schema`` into the copy at ``copy``, record batch by
    record batch (:meth:`append`, in offset order), then their layout (:meth:`close`).

    Raises (from :meth:`append`):
        HeldNull: a column holds a null (nothing more is written; the caller starts over).
        OSError: a file cannot be written (a full disk among others).
    """

    def __init__(self, copy: Path, schema: pa.Schema, names: list[str]) -> None:
        self._copy = copy
        self._columns = [(name, _shape(schema.field(name).type)) for name in names]
        self._files: list[BinaryIO] = []
        self.rows = 0
        #: The error :meth:`append` raised, if any (kept: an error raised inside a Lance write
        #: may reach the caller only as Lance's own).
        self.error: BaseException | None = None
        if names:
            (copy / _FOLDER).mkdir(parents=True)
            self._files = [open(self._path(i), "wb") for i in range(len(names))]  # noqa: SIM115

    def _path(self, index: int) -> Path:
        return self._copy / _FOLDER / f"{index}.raw"

    def append(self, batch: pa.RecordBatch) -> None:
        """Append the rows of ``batch`` (a record batch of the source's flat schema)."""
        try:
            values = [_values(batch.column(name), name) for name, _ in self._columns]
            for file, each in zip(self._files, values, strict=True):
                _write(file, each)
            self.rows += batch.num_rows
        except BaseException as exc:
            self.error = exc
            raise

    def close(self) -> None:
        """Close the files; with no error, write the layout (raises ``OSError`` as
        :meth:`append`)."""
        files, self._files = self._files, []
        failure = None
        for file in files:  # each closed, also when another's buffered bytes do not fit
            try:
                file.close()
            except OSError as exc:
                failure = failure or exc
        if self.error is not None:
            return
        if failure is not None:
            raise failure
        layout = [
            {
                "name": name,
                "file": self._path(i).relative_to(self._copy).as_posix(),
                "dtype": shape.dtype.str,
                "shape": list(shape.shape),
            }
            for i, (name, shape) in enumerate(self._columns)
            if shape is not None
        ]
        (self._copy / LAYOUT).write_text(json.dumps({"columns": layout, "rows": self.rows}))


class ColumnFiles:
    """The raw columns of the finished copy at ``copy``, mapped in this process.

    Args:
        copy (Path): the copy (its :data:`LAYOUT` read here).
        schema (pyarrow.Schema): the source's flat schema (each column's Arrow type).
        num_rows (int): rows the copy holds.

    Attributes:
        names (list[str]): the raw columns, in the copy's order.

    Raises:
        OSError: a file cannot be opened or mapped.
        ValueError: the layout does not fit ``schema`` and ``num_rows`` (a damaged copy).

    Not picklable (the mappings are this process's): a cache pickles without it and maps the
    files again in each process.
    """

    def __init__(self, copy: Path, schema: pa.Schema, num_rows: int) -> None:
        layout = json.loads((copy / LAYOUT).read_text())
        if layout["rows"] != num_rows:
            raise ValueError(f"its {LAYOUT} says {layout['rows']} rows, not {num_rows}")
        self.names: list[str] = [entry["name"] for entry in layout["columns"]]
        self._shapes: dict[str, _Shape] = {}
        self._arrays: dict[str, np.ndarray] = {}
        self._sizes: list[tuple[mmap.mmap, int, str]] = []  # (mapping, bytes, file) of each
        for entry in layout["columns"]:
            name = entry["name"]
            shape = _shape(schema.field(name).type)
            if shape is None or [shape.dtype.str, list(shape.shape)] != [
                entry["dtype"],
                entry["shape"],
            ]:
                raise ValueError(f"its {LAYOUT} does not fit the column {name!r}")
            self._shapes[name] = shape
            self._arrays[name] = self._map(copy / entry["file"], shape, num_rows, entry["file"])

    def _map(self, path: Path, shape: _Shape, num_rows: int, file: str) -> np.ndarray:
        size = num_rows * int(np.prod(shape.shape, dtype=np.int64)) * shape.dtype.itemsize
        descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_BINARY", 0))
        try:
            if os.fstat(descriptor).st_size != size:
                raise ValueError(f"its file {file} does not hold {size:,} bytes")
            mapping = mmap.mmap(descriptor, size, access=mmap.ACCESS_READ)
        finally:  # the mapping holds its own descriptor (a dup): one a file, not two
            os.close(descriptor)
        self._sizes.append((mapping, size, file))
        values = np.frombuffer(mapping, dtype=shape.dtype)
        return values.reshape((num_rows, *shape.shape))

    @property
    def nbytes(self) -> int:
        """Bytes of the mapped files together."""
        return sum(size for _, size, _ in self._sizes)

    def read_randomly(self) -> None:
        """Tell the kernel that rows are read in random order (``MADV_RANDOM``, where the OS
        has it): a page fault then reads its page only, not the pages around it, which suits
        files larger than the page cache (for smaller ones the default read-around fills the
        page cache sooner)."""
        advice = getattr(mmap, "MADV_RANDOM", None)
        if advice is not None:
            for mapping, _, _ in self._sizes:
                mapping.madvise(advice)

    def check(self) -> None:
        """Refuse to read a file that changed size since it was mapped (a read past its end
        would end the process with ``SIGBUS``): one ``fstat`` a file (of its mapping's
        descriptor).

        Raises:
            OSError: a file's size changed (the message names it).
        """
        for mapping, size, file in self._sizes:
            now = mapping.size()
            if now != size:
                raise OSError(f"its file {file} has {now:,} bytes, not {size:,}")

    def arrays(self, indices: np.ndarray) -> dict[str, pa.Array]:
        """The rows at ``indices`` of each raw column, as the Arrow arrays of its type (the
        values of the dataset's ``take``)."""
        self.check()
        return {name: self._arrow(name, self._take(name, indices)) for name in self.names}

    def tensors(self, indices: np.ndarray) -> dict[str, torch.Tensor]:
        """The rows at ``indices`` of each raw column as :func:`~lance_prefetch.convert.to_tensors`
        converts them: the gathered values as a tensor ``(rows, *shape)``, without Arrow where
        the dtype is one torch has and the layout is the physical one; through Arrow otherwise
        (unsigned 16-64-bit integers widen, a permuted tensor is a strided view)."""
        self.check()
        tensors = {}
        for name in self.names:
            values, shape = self._take(name, indices), self._shapes[name]
            if _direct(shape):
                tensors[name] = torch.from_numpy(values).reshape(len(values), *shape.view)
            else:
                table = pa.table({name: self._arrow(name, values)})
                tensors[name] = to_tensors(table)[name]
        return tensors

    def _take(self, name: str, indices: np.ndarray) -> np.ndarray:
        return np.take(self._arrays[name], indices, axis=0)  # a new array, in indices' order

    def _arrow(self, name: str, values: np.ndarray) -> pa.Array:
        """``values`` (gathered rows) as an Arrow array of the column's type."""
        shape = self._shapes[name]
        array = pa.array(values.reshape(-1), type=shape.types[-1])
        for arrow_type in reversed(shape.types[:-1]):
            if isinstance(arrow_type, pa.FixedShapeTensorType):
                array = pa.ExtensionArray.from_storage(arrow_type, array)
            else:
                array = pa.FixedSizeListArray.from_arrays(array, type=arrow_type)
        return array


def _direct(shape: _Shape) -> bool:
    """Whether numpy's gathered values are already the tensor's (dtype and layout)."""
    leaf, outer = shape.types[-1], shape.types[0]
    if isinstance(outer, pa.FixedShapeTensorType):
        permutation = outer.permutation
        if permutation is not None and list(permutation) != sorted(permutation):
            return False
    return leaf in _ZERO_COPY or pa.types.is_boolean(leaf)
