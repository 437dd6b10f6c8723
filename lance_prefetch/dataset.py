"""The torch wrapper: :class:`PrefetchLoader`, an ``IterableDataset`` of fully random, prefetched batches.

It ties the other modules together: :mod:`~lance_prefetch.source` pins the dataset,
:mod:`~lance_prefetch.sampling` plans the epoch's batches, :mod:`~lance_prefetch.scheduling` fetches
them concurrently in the background and :mod:`~lance_prefetch.convert` turns each into tensors.
"""

from __future__ import annotations

import functools
import os
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import lance
import torch
import torch.distributed
from torch.utils.data import IterableDataset, get_worker_info

from ._validate import check_bool, check_int
from .convert import check_schema, to_tensors
from .sampling import EpochPlan, PlannedBatch
from .scheduling import BlockingPrefetcher, check_depths
from .source import LanceSource, redact

__all__ = ["BatchLoadError", "PrefetchLoader"]


class BatchLoadError(RuntimeError):
    """Reading, converting or transforming one batch failed; the original error is ``__cause__``.

    Attributes:
        epoch (int): the epoch being read.
        position (int): the batch's global position in that epoch (see :mod:`lance_prefetch.sampling`).
        num_rows (int): rows in the batch.
        uri (str): the dataset's URI.
        (Each is ``None`` when the error was re-raised by a DataLoader worker, whose message then
        holds them and the worker's traceback.)
    """

    def __init__(
        self,
        message: str,
        *,
        epoch: int | None = None,
        position: int | None = None,
        num_rows: int | None = None,
        uri: str | None = None,
    ) -> None:
        # The keywords are optional so that DataLoader workers can re-raise it from its message
        # alone (torch's ExceptionWrapper calls ``type(exc)(message)``).
        super().__init__(message)
        self.epoch, self.position, self.num_rows, self.uri = epoch, position, num_rows, uri

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            functools.partial(
                BatchLoadError,
                epoch=self.epoch,
                position=self.position,
                num_rows=self.num_rows,
                uri=self.uri,
            ),
            self.args,
        )


class PrefetchLoader(IterableDataset):
    """Fully random batches from a Lance dataset, read concurrently ahead of the training loop.

    Each epoch, the rows of the pinned dataset version are shuffled uniformly from ``(seed, epoch)``,
    cut into batches of ``batch_size`` rows and dealt to ranks (rules, with a worked example, in
    :mod:`lance_prefetch.sampling`). While the training loop works on one batch, up to
    ``max_in_flight`` ``take`` calls read the next ones in background threads, and up to
    ``readahead`` batches wait, in order, for the loop.

    Use it directly::

        loader = PrefetchLoader("data.lance", batch_size=256, columns=["image", "label"])
        for epoch in range(3):
            loader.set_epoch(epoch)
            for batch in loader:            # dict[str, torch.Tensor]
                ...

    or inside a ``DataLoader`` to add worker processes (each runs its own prefetcher over its share
    of the rank's batches; the rank sees the same batch order for any ``num_workers``)::

        DataLoader(loader, batch_size=None, num_workers=4, multiprocessing_context="spawn")

    Args:
        source (str | os.PathLike | lance.LanceDataset): dataset URI or open dataset. An open
            dataset opened with ``storage_options`` needs them passed here too, for workers.
        batch_size (int): rows per batch, ``>= 1``.
        columns (Sequence[str], optional): columns to read. Default: ``None``, all columns.
        seed (int, optional): base seed of every epoch's permutation, ``>= 0``; must be the same on
            every rank. Default: ``0``.
        readahead (int, optional): the most batches held by this iterator at once, counting
            ``take`` calls in flight and batches read but not yet handed to the loop, ``>= 1``.
            Memory is about ``readahead`` batches. Default: ``8``.
        max_in_flight (int, optional): the most ``take`` calls running at once,
            ``1 <= max_in_flight <= readahead``. Default: ``4``.
        drop_last (bool, optional): ``True``: every batch is full and no row repeats, the
            permutation's tail is left out; ``False``: every row is delivered, padded by wrapping
            around, and each rank's last batch may be short. Default: ``True``.
        rank (int, optional): this process's rank in ``[0, world_size)``. Default: ``None``,
            resolved at construction from an initialized ``torch.distributed`` group, else the
            ``RANK`` environment variable (set by ``torchrun``), else ``0``.
        world_size (int, optional): number of ranks, ``>= 1``; give it together with ``rank``.
            Default: ``None``, resolved like ``rank`` (``WORLD_SIZE``, else ``1``).
        storage_options (Mapping[str, str], optional): passed to Lance as they are, e.g. S3
            credentials, ``aws_endpoint``, ``allow_http``; pickled along into worker processes
            (no environment variables needed there), never printed. For ``s3://`` an endpoint set
            here is probed at construction for at most ``connect_timeout`` (default 3 s).
            Default: ``None``.
        version (int | str, optional): dataset version number or tag to read. Default: ``None``,
            the latest at construction; the loader keeps reading that version.
        transform (Callable, optional): applied to each converted batch; its result is what the
            iterator yields. It runs in the loader's worker threads, up to ``max_in_flight`` calls
            at once, so it must be thread-safe. Default: ``None``.

    Batches:
        ``dict[str, torch.Tensor]``: a tensor of shape ``(rows, ...)`` per numeric column (the
        Arrow-to-torch rules, copies and null handling are in :mod:`lance_prefetch.convert`); lists
        for string, binary and variable-length list columns. ``rows`` is ``batch_size`` except for
        the short last batch that ``drop_last=False`` may give.

    Raises:
        TypeError: an argument has the wrong type (e.g. ``batch_size=2.0`` or ``drop_last=1``), or
            a column's Arrow type has no tensor form.
        ValueError: an argument is out of range, ``max_in_flight > readahead``, ``rank`` is outside
            ``[0, world_size)``, a column or ``version`` does not exist, the dataset has no rows,
            ``drop_last=True`` and it has fewer than ``batch_size * world_size`` rows, or an S3
            endpoint in ``storage_options`` is not an ``http(s)://`` URL or is plain ``http``
            without ``allow_http`` (checked before any I/O).
        FileNotFoundError: there is no dataset at ``source``, or its S3 bucket does not exist.
        PermissionError: the object store refused the credentials in ``storage_options``.
        ConnectionError: the endpoint in ``storage_options`` does not answer.

    .. warning::
        Like ``DistributedSampler``, call :meth:`set_epoch` before each epoch; otherwise every
        iteration repeats the same order.
    """

    def __init__(
        self,
        source: str | os.PathLike[str] | lance.LanceDataset,
        batch_size: int,
        *,
        columns: Sequence[str] | None = None,
        seed: int = 0,
        readahead: int = 8,
        max_in_flight: int = 4,
        drop_last: bool = True,
        rank: int | None = None,
        world_size: int | None = None,
        storage_options: Mapping[str, str] | None = None,
        version: int | str | None = None,
        transform: Callable[[dict[str, Any]], Any] | None = None,
    ) -> None:
        super().__init__()
        # Everything that needs no I/O is checked first.
        self.batch_size = check_int("batch_size", batch_size, minimum=1)
        self.seed = check_int("seed", seed, minimum=0)
        self.readahead, self.max_in_flight = check_depths(readahead, max_in_flight)
        self.drop_last = check_bool("drop_last", drop_last)
        self.rank, self.world_size = _resolve_rank(rank, world_size)
        if transform is not None and not callable(transform):
            raise TypeError(f"transform should be callable or None, but got {transform!r}")
        self.transform = transform
        self._epoch = 0
        self._iterators: weakref.WeakSet[BlockingPrefetcher[Any]] = weakref.WeakSet()

        self._source = LanceSource(
            source, columns=columns, version=version, storage_options=storage_options
        )
        check_schema(self._source.schema)
        if self._source.num_rows == 0:
            raise ValueError(
                f"source: the dataset {self._source.uri!r} has no rows at version "
                f"{self._source.version}; write data first or pick another version"
            )
        self.epoch_plan()  # raises for drop_last=True with too few rows

    # -- the dataset ---------------------------------------------------------------------------
    @property
    def uri(self) -> str:
        """The dataset's URI."""
        return self._source.uri

    @property
    def version(self) -> int:
        """The pinned dataset version that every epoch reads."""
        return self._source.version

    @property
    def num_rows(self) -> int:
        """Live rows in the pinned version (the ``N`` that every epoch permutes)."""
        return self._source.num_rows

    @property
    def columns(self) -> tuple[str, ...]:
        """The columns each batch holds, in order."""
        return self._source.columns

    # -- epochs ----------------------------------------------------------------------------------
    @property
    def epoch(self) -> int:
        """The epoch whose permutation the next iteration reads (set by :meth:`set_epoch`)."""
        return self._epoch

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose permutation the next ``iter(loader)`` reads.

        As with ``DistributedSampler.set_epoch``: call it before each epoch, with the same value on
        every rank. A ``DataLoader`` without persistent workers copies the loader into its workers at
        each ``iter()``, so the value set in the main process reaches them.

        Raises:
            TypeError, ValueError: ``epoch`` is not an integer ``>= 0``.
        """
        self._epoch = check_int("epoch", epoch, minimum=0)

    def epoch_plan(self, epoch: int | None = None) -> EpochPlan:
        """The :class:`~lance_prefetch.sampling.EpochPlan` for ``epoch`` (default: :attr:`epoch`)."""
        return EpochPlan(
            num_rows=self.num_rows,
            batch_size=self.batch_size,
            seed=self.seed,
            epoch=self._epoch if epoch is None else epoch,
            world_size=self.world_size,
            drop_last=self.drop_last,
        )

    def __len__(self) -> int:
        """Batches this rank yields per epoch (the same on every rank)."""
        return self.epoch_plan().batches_per_rank

    # -- iteration -------------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Any]:
        """Start reading this epoch's batches for this rank (and DataLoader worker, if any).

        Starts an event-loop thread in the calling process; it stops when the iterator is
        exhausted, fails, is closed (:meth:`close`), or is garbage collected (e.g. after ``break``).

        Raises:
            RuntimeError: this process was forked from the one that built the loader (Lance is
                not fork-safe; use ``multiprocessing_context="spawn"``).

        Raises (from ``next()``):
            BatchLoadError: reading, converting or transforming a batch failed; the iterator is
                then closed.
        """
        self._source.check_process()  # fail at once, not in a thread, in a forked worker
        worker = get_worker_info()
        plan = self.epoch_plan()
        batches = plan.rank_batches(
            self.rank,
            worker_id=worker.id if worker is not None else 0,
            num_workers=worker.num_workers if worker is not None else 1,
        )
        iterator = BlockingPrefetcher(
            batches,
            functools.partial(self._load, plan.epoch),
            readahead=self.readahead,
            max_in_flight=self.max_in_flight,
        )
        self._iterators.add(iterator)
        return iterator

    def _load(self, epoch: int, batch: PlannedBatch) -> Any:
        """Read, convert and transform one batch (runs in a worker thread)."""
        try:
            tensors = to_tensors(self._source.take(batch.indices))
            return tensors if self.transform is None else self.transform(tensors)
        except Exception as exc:
            raise BatchLoadError(
                f"batch {batch.position} of epoch {epoch} ({len(batch.indices)} rows) from "
                f"{self.uri!r} version {self.version} failed: {type(exc).__name__}: {exc}",
                epoch=epoch,
                position=batch.position,
                num_rows=len(batch.indices),
                uri=self.uri,
            ) from exc

    def close(self) -> None:
        """Stop every live iterator of this loader in this process (pending reads are cancelled).

        The loader itself stays usable: a later ``iter(loader)`` starts afresh. Idempotent.
        """
        for iterator in list(self._iterators):
            iterator.close()

    def __enter__(self) -> PrefetchLoader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- pickling and printing -------------------------------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        del state["_iterators"]  # live iterators belong to this process
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._iterators = weakref.WeakSet()

    def __repr__(self) -> str:
        return (
            f"PrefetchLoader({self.uri!r}, batch_size={self.batch_size}, "
            f"columns={list(self.columns)}, version={self.version}, num_rows={self.num_rows}, "
            f"seed={self.seed}, epoch={self.epoch}, readahead={self.readahead}, "
            f"max_in_flight={self.max_in_flight}, drop_last={self.drop_last}, rank={self.rank}, "
            f"world_size={self.world_size}, "
            f"storage_options={redact(self._source._storage_options)})"
        )


def _resolve_rank(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """``(rank, world_size)``: explicit, else the ``torch.distributed`` group, else env, else (0, 1)."""
    if (rank is None) != (world_size is None):
        raise ValueError(
            f"pass rank and world_size together (or neither, to detect them), but got "
            f"rank={rank!r}, world_size={world_size!r}"
        )
    if rank is None:
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            rank, world_size = torch.distributed.get_rank(), torch.distributed.get_world_size()
        elif "RANK" in os.environ or "WORLD_SIZE" in os.environ:
            if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
                raise ValueError(
                    "only one of the RANK and WORLD_SIZE environment variables is set; set both "
                    "(torchrun does), or pass rank= and world_size= explicitly"
                )
            rank, world_size = _env_int("RANK"), _env_int("WORLD_SIZE")
        else:
            rank, world_size = 0, 1
    rank = check_int("rank", rank, minimum=0)
    world_size = check_int("world_size", world_size, minimum=1)
    if rank >= world_size:
        raise ValueError(
            f"Invalid rank {rank}, rank should be in the interval [0, {world_size - 1}] "
            f"for world_size={world_size}"
        )
    return rank, world_size


def _env_int(name: str) -> int:
    try:
        return int(os.environ[name])
    except ValueError:
        raise ValueError(
            f"the environment variable {name}={os.environ[name]!r} is not an integer; "
            f"pass rank= and world_size= explicitly"
        ) from None
