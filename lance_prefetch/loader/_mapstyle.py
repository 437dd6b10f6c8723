"""The map-style form: :class:`LanceMapDataset` for PyTorch's samplers, and :func:`collate`.

For code that wants PyTorch's default paradigm (a map-style dataset, the standard ``DataLoader``
with ``shuffle=True``, ``RandomSampler``, ``BatchSampler`` or ``DistributedSampler``, worker
processes doing CPU work) rather than :class:`~lance_prefetch.PrefetchLoader`'s own sampling and
readahead. It shares the Lance source (:mod:`~lance_prefetch.sources._lance`) and the Arrow-to-torch
conversion (:mod:`~lance_prefetch.convert`) with the loader::

    dataset = LanceMapDataset("data.lance", columns=["image", "label"])
    data = DataLoader(dataset, batch_size=256, shuffle=True, num_workers=4,
                      multiprocessing_context="spawn", collate_fn=lance_prefetch.collate)
    for batch in data:      # dict[str, Tensor], the same batch PrefetchLoader gives
        ...

With automatic batching, the ``DataLoader`` calls :meth:`LanceMapDataset.__getitems__` once per
batch: one Lance ``take`` for all the batch's rows. It returns a :class:`ColumnBatch`: the batch
already in columns, which :func:`collate` hands over as it is. The default collate also works with
it (it sees a sequence of row dicts and stacks them again), at the price of a copy per batch.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, NoReturn

import numpy as np
import torch
from torch.utils.data import Dataset
from torch.utils.data._utils.collate import default_collate

from lance_prefetch.convert._arrow import check_schema, to_tensors
from lance_prefetch.loader._config import MapDatasetConfig
from lance_prefetch.loader._facade import SourceFacade
from lance_prefetch.loader._open import lance_source
from lance_prefetch.options import DEFAULT_RETRY, as_dataset
from lance_prefetch.schedule.retry import RetryPolicy

if TYPE_CHECKING:
    from lance_prefetch.options import DatasetLike

__all__ = ["ColumnBatch", "LanceMapDataset", "collate"]


class ColumnBatch(Sequence[dict[str, Any]]):
    """One batch from :meth:`LanceMapDataset.__getitems__`, kept in columns.

    :func:`collate` returns :attr:`data` unchanged. For the default collate it is also a sequence
    of ``len(indices)`` row dicts (views into the columns), which it stacks back into a batch.

    Attributes:
        data: the converted batch (``dict[str, Tensor]``, see :mod:`lance_prefetch.convert`), or what
            ``transform`` made of it.
    """

    def __init__(self, data: Any, num_rows: int) -> None:
        self.data, self._num_rows = data, num_rows

    def __len__(self) -> int:
        return self._num_rows

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return (self[i] for i in range(self._num_rows))

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self._num_rows))]
        if not isinstance(self.data, Mapping):
            raise TypeError(
                f"transform returned a {type(self.data).__name__}, which cannot be split into rows "
                f"for the default collate; pass collate_fn=lance_prefetch.collate to the DataLoader"
            )
        return _row(self.data, operator.index(index))

    def __repr__(self) -> str:
        return f"ColumnBatch({self._num_rows} rows)"


def collate(batch: Any) -> Any:
    """``collate_fn`` for a ``DataLoader`` over a :class:`LanceMapDataset`.

    Returns a :class:`ColumnBatch`'s :attr:`~ColumnBatch.data` as it is (no copy): the same
    ``dict[str, Tensor]`` batch that :class:`~lance_prefetch.PrefetchLoader` yields for the same
    indices, or ``transform``'s result. Anything else (say, a list of rows from ``__getitem__``
    without automatic batching) goes to ``torch.utils.data.default_collate``.
    """
    if isinstance(batch, ColumnBatch):
        return batch.data
    return default_collate(batch)


class LanceMapDataset(SourceFacade, Dataset):
    """A map-style ``Dataset`` of the rows of one pinned Lance dataset version.

    Args:
        source (str | os.PathLike | lance.LanceDataset | Dataset): dataset URI or path, open
            dataset, or a :class:`~lance_prefetch.options.Dataset` with its ``version``
            (default: the latest at construction; the dataset keeps reading that version) and
            ``storage_options`` (S3 credentials, endpoint; pickled along into worker processes,
            never printed), as for :class:`~lance_prefetch.PrefetchLoader`.
        columns (Sequence[str], optional): columns to read, or dotted paths into structs
            (``"image.bytes"``; see :mod:`lance_prefetch.convert`). Default: ``None``, all columns.
        transform (Callable, optional): applied to each batch from :meth:`__getitems__` (and to
            each row from :meth:`__getitem__`), in the process that reads it: a DataLoader worker, so
            CPU-heavy preprocessing runs in parallel across workers. Default: ``None``.
        retry (RetryPolicy, optional): how a ``take`` that fails with a transient error is
            retried, in the reading process's own thread (see
            :class:`~lance_prefetch.RetryPolicy`; its ``timeout`` must be ``None`` here).
            ``None``: no retry. Default: ``RetryPolicy()``, 3 attempts.
        io ("auto" | "default" | "uring", optional): Lance's reader, as
            :class:`~lance_prefetch.options.ReadOptions` ``io`` for the loader; :attr:`io` is
            the reader in use. Default: ``"auto"``.

    Indices are offsets among the live rows of the pinned version, ``0 .. len(dataset) - 1``
    (negative ones count from the end, as in Python). The dataset pickles small (URI, version,
    options) and opens Lance once per process, lazily; in a worker that was forked from a process
    that already used it, the first read fails at once, naming
    ``multiprocessing_context="spawn"``.

    A dataset with no rows is accepted (``len(dataset) == 0``, every index out of range), unlike
    :class:`~lance_prefetch.PrefetchLoader`, which refuses it.

    Raises:
        TypeError: an argument has the wrong type, or a column's Arrow type has no tensor form.
        ValueError: a column or ``version`` does not exist, ``retry`` has a ``timeout``, or
            ``io`` is not ``"auto"``/``"default"``/``"uring"`` or is ``"uring"`` for an object
            store.
        FileNotFoundError: there is no dataset at ``source``.
        PermissionError, ConnectionError: as for :class:`~lance_prefetch.PrefetchLoader` on an
            object store (see :class:`~lance_prefetch.sources._lance.LanceSource`).
    """

    def __init__(
        self,
        source: DatasetLike,
        *,
        columns: Sequence[str] | None = None,
        transform: Callable[[Any], Any] | None = None,
        retry: RetryPolicy | None = DEFAULT_RETRY,
        io: Literal["auto", "default", "uring"] = "auto",
    ) -> None:
        self.config = config = MapDatasetConfig(
            columns=columns, transform=transform, retry=retry, io=io
        )
        self.transform, self.retry = config.transform, config.retry
        dataset = as_dataset(source)
        self._source = lance_source(dataset.uri, config.source_options(dataset))
        check_schema(self._source.schema)

    def __len__(self) -> int:
        """Live rows in the pinned version."""
        return self._source.num_rows

    def __getitem__(self, index: int) -> Any:
        """Row ``index`` as ``dict[str, Tensor]``: scalars as 0-d tensors, fixed-size lists and
        tensors as tensors of shape ``(d, ...)``, strings, bytes and blobs as ``str``/``bytes``, a
        struct as a dict of its fields (then ``transform``).

        Raises:
            IndexError: ``index`` is outside ``[-len(dataset), len(dataset))``.
            TypeError: ``index`` is not an integer.
        """
        if not _is_int(index):
            raise TypeError(f"index should be an integer, but got {index!r}")
        batch = to_tensors(self._take([index]))
        row = _row(batch, 0)
        return row if self.transform is None else self.transform(row)

    def __getitems__(self, indices: Sequence[int]) -> ColumnBatch:
        """Rows ``indices`` with ONE Lance ``take``, in the requested order (repeats allowed).

        Returns:
            ColumnBatch: the batch in columns (``dict[str, Tensor]`` of shape ``(len(indices),
            ...)``, then ``transform``); :func:`collate` passes it through.

        Raises:
            IndexError: an index is out of range (the message names the first such).
            TypeError: an index is not an integer.
        """
        batch = to_tensors(self._take(indices))
        data = batch if self.transform is None else self.transform(batch)
        return ColumnBatch(data, len(indices))

    def _take(self, indices: Sequence[int]) -> Any:
        offsets = _offsets(indices, len(self))
        self._source.check_process()
        if self.retry is None:
            return self._source.take(offsets)
        return self.retry.call(self._source.take, offsets)

    def __repr__(self) -> str:
        return (
            f"LanceMapDataset({self.uri!r}, columns={list(self.columns)}, version={self.version}, "
            f"num_rows={len(self)}, io={self.io!r}, "
            f"storage_options={self._source.options_repr()})"
        )


def _offsets(indices: Sequence[int], num_rows: int) -> np.ndarray:
    """``indices`` as int64 offsets in ``[0, num_rows)``, negative ones counted from the end."""
    if isinstance(indices, torch.Tensor):
        indices = indices.tolist()
    array = np.asarray(indices)
    integers = array.ndim == 1 and (array.dtype.kind in "iu" or array.size == 0)
    if integers and not isinstance(indices, np.ndarray):
        # numpy turns [0, True] into integers: refuse bools as __getitem__ does
        integers = not any(isinstance(i, (bool, np.bool_)) for i in indices)
    if not integers:
        bad = next((i for i in indices if not _is_int(i)), None) if array.ndim == 1 else indices
        if bad is None:  # integers too large for numpy (beyond 64 bits)
            _out_of_range(next(i for i in indices if not -num_rows <= i < num_rows), num_rows)
        raise TypeError(f"indices should be integers, but got {bad!r}")
    offsets = array.astype(np.int64, copy=True)
    offsets[offsets < 0] += num_rows
    outside = (offsets < 0) | (offsets >= num_rows)
    if outside.any():
        _out_of_range(array[np.argmax(outside)], num_rows)
    return offsets


def _out_of_range(index: int, num_rows: int) -> NoReturn:
    valid = f"valid: -{num_rows} .. {num_rows - 1}" if num_rows else "it has no rows"
    raise IndexError(
        f"index {int(index)} is out of range for a dataset of {num_rows} rows ({valid})"
    )


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _row(batch: Mapping[str, Any], i: int) -> dict[str, Any]:
    """Row ``i`` of a converted batch: tensors indexed on their first dimension, lists by item,
    a struct's dict field by field."""
    return {
        name: _row(column, i) if isinstance(column, Mapping) else column[i]
        for name, column in batch.items()
    }
