"""What ``lance-prefetch info`` reports about a dataset: :func:`describe` computes a
:class:`DatasetInfo`; the command prints it (:mod:`lance_prefetch._cli`).

Every figure comes from the library's own rules, so it is what the loader would do:

- a column's tensor form is what :func:`~lance_prefetch.convert.to_tensors` returns for a sample
  of its rows (its dtype and per-row shape), or, for a column it delivers as a Python list (strings,
  binary, variable-length lists) or refuses (:func:`~lance_prefetch.convert.check_schema`), what
  it delivers instead and why;
- bytes a row: a fixed-width column's width in Arrow buffers
  (:func:`~lance_prefetch.convert.fixed_row_bytes`, exact), any other column's Arrow bytes in the
  sample divided by the sample's rows (an estimate);
- the memory a ``cache="memory"`` copy takes: the memory cache's own size (Arrow bytes of every
  row: exact for fixed-width columns, else bytes a row times rows), against its default limit;
- rows/s: a real :class:`~lance_prefetch.PrefetchLoader` run with its defaults for a few seconds.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from lance_prefetch.cache._disk import default_cache_bytes
from lance_prefetch.convert import check_schema, fixed_row_bytes, to_tensors
from lance_prefetch.convert._projection import Projection
from lance_prefetch.options import Dataset
from lance_prefetch.sources._lance import LanceSource
from lance_prefetch.sources._options import SourceOptions
from lance_prefetch.sources._storage import is_s3, redact_uri

__all__ = ["ArgumentError", "ColumnInfo", "DatasetInfo", "Throughput", "describe", "open_source"]

#: Rows read (evenly spaced over the dataset) to find tensor forms and variable widths.
SAMPLE_ROWS = 1024


class ArgumentError(ValueError):
    """A bad argument of ``lance-prefetch info``, found before any long work.

    Attributes:
        argument (str): the argument at fault, as the command spells it (``"URI"``,
            ``"--columns"``, ``"--version"``, ``"--storage-option"``).
    """

    def __init__(self, argument: str, message: str) -> None:
        super().__init__(f"{argument}: {message}")
        self.argument = argument


@dataclass(frozen=True)
class ColumnInfo:
    """One column as the loader delivers it.

    Attributes:
        name (str): the column (or dotted path into a struct).
        arrow_type (str): its Arrow type.
        tensor (str | None): dtype and per-row shape of the tensor delivered, e.g.
            ``"float32[128]"`` or ``"int64"`` (a scalar per row); ``None`` when none is.
        delivers (str): what a batch holds for it: ``"tensor float32[128]"``, ``"list[str]"``,
            ``"list[bytes]"``, ``"list[float32[n]]"`` (variable-length), ``"dict {a: ...}"`` (a
            struct), or ``"nothing"`` (the loader refuses the column).
        why (str): why it is no tensor, and what to do (``""`` for a tensor).
        row_bytes (float): Arrow bytes a row (exact when ``fixed``).
        fixed (bool): whether the column is fixed-width (its ``row_bytes`` then exact).
    """

    name: str
    arrow_type: str
    tensor: str | None
    delivers: str
    why: str
    row_bytes: float
    fixed: bool


@dataclass(frozen=True)
class Throughput:
    """A timed :class:`~lance_prefetch.PrefetchLoader` run.

    Attributes:
        rows_per_s (float): rows delivered per second of wall time, from the first ``next``.
        rows (int): rows delivered. seconds (float): wall seconds. batch_size (int): its batch size.
        columns (tuple[str, ...]): the columns read (those with a conversion).
    """

    rows_per_s: float
    rows: int
    seconds: float
    batch_size: int
    columns: tuple[str, ...]


@dataclass(frozen=True)
class DatasetInfo:
    """What ``lance-prefetch info`` reports (see the module).

    Attributes:
        uri (str): the dataset. version (int): the version read. rows (int): its live rows.
        fragments (int): its fragments. versions (tuple[tuple[int, str], ...]): every version,
        oldest first, with its commit time (ISO 8601). tags (dict[str, int]): tag to version.
        columns (tuple[ColumnInfo, ...]): the chosen columns, in order.
        sample_rows (int): rows the tensor forms and variable widths were measured on.
        row_bytes (float): Arrow bytes a row of the chosen columns (sum of the columns').
        row_bytes_exact (bool): whether every chosen column is fixed-width.
        cache_bytes (int): bytes a ``cache="memory"`` copy of the chosen columns takes.
        cache_limit (int): the memory cache's default limit (half the physical memory).
        throughput (Throughput | None): the timed run; ``None`` when not asked for, when the
        dataset is empty, or when no chosen column converts.
    """

    uri: str
    version: int
    rows: int
    fragments: int
    versions: tuple[tuple[int, str], ...]
    tags: dict[str, int]
    columns: tuple[ColumnInfo, ...]
    sample_rows: int
    row_bytes: float
    row_bytes_exact: bool
    cache_bytes: int
    cache_limit: int
    throughput: Throughput | None

    def as_dict(self) -> dict[str, Any]:
        """The same facts as plain JSON values (numbers, strings, lists, dicts)."""
        return {
            "uri": self.uri,
            "version": self.version,
            "rows": self.rows,
            "fragments": self.fragments,
            "versions": [{"version": v, "timestamp": t} for v, t in self.versions],
            "tags": dict(self.tags),
            "columns": [vars(column).copy() for column in self.columns],
            "sample_rows": self.sample_rows,
            "row_bytes": self.row_bytes,
            "row_bytes_exact": self.row_bytes_exact,
            "cache_bytes": self.cache_bytes,
            "cache_limit": self.cache_limit,
            "throughput": None if self.throughput is None else vars(self.throughput).copy(),
        }


def open_source(
    uri: str,
    *,
    columns: Sequence[str] | None = None,
    version: int | str | None = None,
    storage_options: Mapping[str, str] | None = None,
) -> LanceSource:
    """The dataset at ``uri``, pinned at ``version`` and projected to ``columns``, each argument
    checked in turn so that an error names the one at fault (manifests only, no rows read).

    Raises:
        ArgumentError: ``storage_options`` are malformed or refused, ``uri`` holds no dataset,
            ``version`` does not exist, or a column is not in it; the message names the argument.
    """
    try:
        SourceOptions(storage_options=storage_options)
    except (TypeError, ValueError) as exc:
        raise ArgumentError("--storage-option", str(exc)) from None
    try:
        SourceOptions(columns=columns)
    except (TypeError, ValueError) as exc:
        raise ArgumentError("--columns", str(exc)) from None
    try:
        source = LanceSource(uri, SourceOptions(storage_options=storage_options))
    except (PermissionError, ConnectionError) as exc:
        raise ArgumentError("--storage-option", str(exc)) from None
    except ValueError as exc:  # storage options of an s3:// URI, or a URI for io_uring
        raise ArgumentError("--storage-option" if is_s3(uri) else "URI", str(exc)) from None
    except OSError as exc:
        raise ArgumentError("URI", str(exc)) from None
    if version is not None:
        try:
            source = LanceSource(
                uri, SourceOptions(version=version, storage_options=storage_options)
            )
        except ValueError as exc:
            raise ArgumentError("--version", str(exc)) from None
    if columns is None:
        return source
    try:
        Projection(source.dataset_schema, columns, where=f"{uri!r} version {source.version}")
    except ValueError as exc:
        raise ArgumentError("--columns", str(exc)) from None
    options = SourceOptions(
        columns=columns, version=source.version, storage_options=storage_options
    )
    return LanceSource(uri, options)


def describe(
    source: LanceSource,
    *,
    batch_size: int = 256,
    seconds: float = 3.0,
    storage_options: Mapping[str, str] | None = None,
) -> DatasetInfo:
    """Describe ``source`` (from :func:`open_source`): see :class:`DatasetInfo`.

    Args:
        source (LanceSource): the pinned, projected dataset.
        batch_size (int, optional): the timed loader's batch size. Default: ``256``.
        seconds (float, optional): how long the loader runs; ``0``: no run. Default: ``3.0``.
        storage_options (Mapping[str, str], optional): for the loader (the source's own).

    Raises:
        Exception: a read's error (:meth:`LanceSource.take`, :class:`PrefetchLoader`).
    """
    history = source.history()
    count = min(source.num_rows, SAMPLE_ROWS)
    offsets = np.unique(np.linspace(0, source.num_rows - 1, count).astype(np.int64))
    sample = source.take(offsets) if count else source.schema.empty_table()
    columns = tuple(
        _column(field, sample.column(i).combine_chunks(), sample.num_rows)
        for i, field in enumerate(source.schema)
    )
    fixed = fixed_row_bytes(source.schema)
    row_bytes = float(fixed) if fixed is not None else sum(c.row_bytes for c in columns)
    # The memory cache's own rule (cache._memory.MemoryCache): fixed-width rows * rows, else the
    # scan's Arrow bytes, estimated here from the sample.
    cache_bytes = (
        fixed * source.num_rows if fixed is not None else round(row_bytes * source.num_rows)
    )
    readable = tuple(c.name for c in columns if c.delivers != "nothing")
    throughput = None
    if seconds > 0 and source.num_rows and readable:
        dataset = Dataset(source.uri, version=source.version, storage_options=storage_options)
        throughput = measure(dataset, readable, batch_size=batch_size, seconds=seconds)
    return DatasetInfo(
        uri=redact_uri(source.uri),
        version=source.version,
        rows=source.num_rows,
        fragments=history.fragments,
        versions=history.versions,
        tags=history.tags,
        columns=columns,
        sample_rows=sample.num_rows,
        row_bytes=row_bytes,
        row_bytes_exact=fixed is not None,
        cache_bytes=cache_bytes,
        cache_limit=default_cache_bytes(),
        throughput=throughput,
    )


def measure(
    dataset: Dataset, columns: Sequence[str], *, batch_size: int, seconds: float
) -> Throughput:
    """Rows/s of a :class:`~lance_prefetch.PrefetchLoader` with its defaults (shuffled, readahead
    and in-flight reads ``"auto"``, no cache; ``drop_last=False`` so that a small dataset counts
    every row) over ``columns``, epoch after epoch, for about ``seconds`` of wall time and at
    least one batch."""
    from lance_prefetch.loader._loader import PrefetchLoader

    loader = PrefetchLoader(dataset, batch_size, columns=list(columns), drop_last=False)
    rows, epoch, start = 0, 0, time.perf_counter()
    try:
        while True:  # at least one batch, however short ``seconds``
            loader.set_epoch(epoch)
            delivered = rows
            for batch in loader:
                rows += len(next(iter(batch.values())))
                if time.perf_counter() - start >= seconds:
                    break
            if rows == delivered or time.perf_counter() - start >= seconds:
                break  # time is up, or nothing to deliver: do not spin
            epoch += 1
        elapsed = time.perf_counter() - start
    finally:
        loader.close()
    return Throughput(rows / elapsed, rows, elapsed, batch_size, tuple(columns))


def _column(field: pa.Field, array: pa.Array, rows: int) -> ColumnInfo:
    fixed = fixed_row_bytes(pa.schema([field]))
    row_bytes = float(fixed) if fixed is not None else (array.nbytes / rows if rows else 0.0)
    try:
        check_schema(pa.schema([field]))
        value = to_tensors(pa.table({field.name: array}))[field.name]
    except TypeError as exc:
        form, why = None, f"the loader refuses this type: {exc}"
        delivers = "nothing"
    except ValueError as exc:  # nulls a tensor cannot hold, in the sample
        form, why = None, f"a batch of the sample fails: {exc}"
        delivers = "nothing"
    else:
        form = _tensor_form(value) if isinstance(value, torch.Tensor) else None
        delivers, why = _delivers(value, field.type)
    return ColumnInfo(
        field.name, str(field.type), form, delivers, why, row_bytes, fixed is not None
    )


def _delivers(value: Any, arrow_type: pa.DataType) -> tuple[str, str]:
    """``(what a batch holds for a column, why it is no tensor or "")`` from its converted
    value (as :func:`~lance_prefetch.convert.to_tensors` returned it)."""
    if isinstance(value, torch.Tensor):
        return f"tensor {_tensor_form(value)}", ""
    if isinstance(value, dict):
        fields = ", ".join(
            f"{name}: {_delivers(item, arrow_type.field(name).type)[0]}"
            for name, item in value.items()
        )
        return "dict {" + fields + "}", "a struct: a dict of its fields, each converted so"
    items = [item for item in value if item is not None]
    if items and isinstance(items[0], torch.Tensor):
        dims = "".join(f", {d}" for d in items[0].shape[1:])
        dtype = str(items[0].dtype).removeprefix("torch.")
        return (
            f"list[{dtype}[n{dims}]]",
            "variable length: one tensor a row; pad or pack in transform",
        )
    if items and isinstance(items[0], str):
        return "list[str]", "strings: one str a row; turn them into tensors in transform"
    if items:
        return "list[bytes]", "binary: one bytes a row; decode them in transform"
    return "list", f"{arrow_type}: a Python list a batch (no value in the sample to tell more)"


def _tensor_form(tensor: torch.Tensor) -> str:
    dtype = str(tensor.dtype).removeprefix("torch.")
    dims = tensor.shape[1:]
    return f"{dtype}[{', '.join(str(d) for d in dims)}]" if dims else dtype
