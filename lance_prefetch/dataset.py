"""The torch wrapper: :class:`PrefetchLoader`, an ``IterableDataset`` of fully random, prefetched batches.

It ties the other modules together: :mod:`~lance_prefetch.source` pins the dataset,
:mod:`~lance_prefetch.sampling` plans the epoch's batches, :mod:`~lance_prefetch.scheduling` fetches
them concurrently in the background and :mod:`~lance_prefetch.convert` turns each into tensors.
"""

from __future__ import annotations

import collections
import functools
import logging
import math
import multiprocessing.context
import os
import time
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import lance
from torch.utils.data import IterableDataset, get_worker_info

from ._errors import BatchLoadError
from ._exit_guard import native_call
from ._ranks import resolve_rank
from ._storage import redact_uri
from ._validate import check_bool, check_int
from .cache import check_cache, fixed_row_bytes, open_cache
from .coalesce import TARGET_ROWS, Group, check_coalesce, coalesce_size, groups, split
from .convert import check_schema, to_tensors
from .epochs import MAX_EPOCH, Decision, EpochControl, Progress, iteration_ident
from .permutation import resolve_kind
from .retry import RetryPolicy, check_retry
from .sampling import EpochPlan, PlannedBatch
from .scheduling import BlockingPrefetcher, FetchError, check_depths
from .source import LanceSource, redact
from .state import check_state, end_position, make_state
from .telemetry import LoaderStats, Telemetry
from .tuning import (
    DEFAULT_MAX_BUFFER_BYTES,
    START_LEVEL,
    START_LEVEL_MEMORY,
    DepthTuner,
    check_depth,
)

__all__ = ["BatchLoadError", "PrefetchLoader"]


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
        readahead (int | str, optional): the most batches held by this iterator at once,
            counting those of ``take`` calls in flight and batches read but not yet handed to the
            loop, ``>= 1``. Memory is about ``readahead`` batches. ``"auto"``: chosen while
            reading from the measured wait and rows/s, within ``max_buffer_bytes``, starting at
            4 takes in flight (1 with ``cache="memory"``; :mod:`lance_prefetch.tuning`).
            Default: ``8``.
        max_in_flight (int | str, optional): the most ``take`` calls running at once,
            ``1 <= max_in_flight``, and ``<= readahead`` when both are numbers. ``"auto"``: tuned
            like ``readahead``. Default: ``4``.
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
        retry (RetryPolicy, optional): how a ``take`` that fails with a transient error (an
            object store's 5xx or "slow down", a dropped connection, an I/O error) or runs past
            ``retry.timeout`` is retried: attempts, exponential backoff with jitter, a per-take
            timeout (see :class:`~lance_prefetch.RetryPolicy`). Only the read is retried, never
            conversion or ``transform``. ``None``: no retry, no timeout. Default:
            ``RetryPolicy()``, 3 attempts, waits of at most 0.1 s then 0.2 s, no timeout.
        permutation (str, optional): how each epoch's permutation is held: ``"array"``, numpy's
            shuffle, materialised in every process (4 bytes a row below 2**32 rows); ``"lazy"``, a
            keyed bijection computed batch by batch in constant memory (another order, the same
            guarantees); ``"auto"``, ``"lazy"`` above 2**27 rows (512 MiB as an array), else
            ``"array"`` (see :mod:`lance_prefetch.permutation`). The resolved kind is
            :attr:`permutation` and part of the checkpoint state. Default: ``"auto"``.
        log_every (float, optional): every this many seconds, log :meth:`stats` (one line, INFO,
            logger ``"lance_prefetch.stats"``) from ``next()``; in DataLoader workers each worker
            logs its own. Default: ``None``, no logging (:meth:`stats` still works).
        coalesce (int | str, optional): batches read by one ``take``: that many consecutive
            batches of this worker's plan are read together and split back into batches, each
            with exactly its rows in its order (a take's fixed cost, ~3 ms on the development
            machine, is paid once for them). ``"auto"``: ``ceil(1024 / batch_size)``, at most
            ``readahead // 2``, at least 1 (:mod:`lance_prefetch.coalesce`). ``1``: one take per
            batch. An int must be ``<= readahead``: the batches of a take all count against
            ``readahead``, and ``max_in_flight`` counts takes. The resolved value is
            :attr:`coalesce`. Default: ``"auto"``.
        cache (str, optional): ``"memory"``: read the projected columns of the pinned version
            once with a sequential scan (in the first ``iter()`` of each process) and serve every
            batch from memory (Arrow ``take``), one copy per process; ``"disk"``: copy them once
            to a local Lance dataset under ``cache_dir`` (reused across runs and shared by
            processes) and take from it. Same rows, same order as without a cache
            (:mod:`lance_prefetch.cache`). Default: ``None``, no cache.
        cache_bytes (int, optional): with ``cache="memory"``, the most bytes the rows may take
            (checked before any read for fixed-width columns, during the scan otherwise).
            Default: ``None``, half of the machine's physical memory.
        cache_dir (str | os.PathLike, optional): with ``cache="disk"``, the folder of the copies.
            Default: ``None``, ``$LANCE_PREFETCH_CACHE_DIR``, else ``$XDG_CACHE_HOME`` or
            ``~/.cache``, then ``lance-prefetch``.
        max_buffer_bytes (int, optional): with ``readahead="auto"``, the most bytes of batches
            read ahead (Arrow bytes, learnt from the reads when the columns are not fixed-width).
            Default: 256 MiB.
        io (str, optional): how local files are read: ``"default"``, Lance's reader, or
            ``"uring"``, its io_uring reader (2-3x faster random takes on the development
            machine, identical rows; local datasets only). If the kernel refuses io_uring, a
            ``RuntimeWarning`` says so at construction and the default reader is used;
            :attr:`io` is the reader in use. Default: ``None``, by the URI: ``"uring"`` for a
            ``file+uring://`` URI (``io="default"`` with one is a ``ValueError``), else
            ``"default"``.

    Batches:
        ``dict[str, torch.Tensor]``: a tensor of shape ``(rows, ...)`` per numeric column (the
        Arrow-to-torch rules, copies and null handling are in :mod:`lance_prefetch.convert`); lists
        for string, binary and variable-length list columns. ``rows`` is ``batch_size`` except for
        the short last batch that ``drop_last=False`` may give.

    Raises:
        TypeError: an argument has the wrong type (e.g. ``batch_size=2.0`` or ``drop_last=1``), or
            a column's Arrow type has no tensor form.
        ValueError: an argument is out of range, ``max_in_flight > readahead``, ``coalesce >
            readahead``, ``cache`` is not ``"memory"``/``"disk"``, ``cache_bytes`` or
            ``cache_dir`` without their cache, the projected fixed-width columns need more than
            ``cache_bytes`` with ``cache="memory"``, ``rank`` is outside
            ``[0, world_size)``, a column or ``version`` does not exist, the dataset has no rows,
            ``drop_last=True`` and it has fewer than ``batch_size * world_size`` rows, or an S3
            endpoint in ``storage_options`` is not an ``http(s)://`` URL or is plain ``http``
            without ``allow_http``, or ``io`` is not ``"default"``/``"uring"`` or is ``"uring"``
            for a dataset on an object store (checked before any I/O).
        FileNotFoundError: there is no dataset at ``source``, or its S3 bucket does not exist.
        PermissionError: the object store refused the credentials in ``storage_options``.
        ConnectionError: the endpoint in ``storage_options`` does not answer.

    Epochs and checkpoints:
        :meth:`set_epoch` selects the next iteration's epoch (it reaches DataLoader workers,
        persistent ones included); without it each new iteration reads the next epoch.
        :meth:`state_dict` / :meth:`load_state_dict` save and restore the position within an epoch,
        counted in batches delivered to the training loop (rules in :mod:`lance_prefetch.epochs`
        and :mod:`lance_prefetch.state`).

    .. warning::
        With DataLoader worker processes, call :meth:`state_dict` through torchdata's
        ``StatefulDataLoader`` (see :func:`~lance_prefetch.state_from_dataloader`): the main
        process's loader cannot see which batches the workers' output has delivered.
    """

    def __init__(
        self,
        source: str | os.PathLike[str] | lance.LanceDataset,
        batch_size: int,
        *,
        columns: Sequence[str] | None = None,
        seed: int = 0,
        readahead: int | str = 8,
        max_in_flight: int | str = 4,
        drop_last: bool = True,
        rank: int | None = None,
        world_size: int | None = None,
        storage_options: Mapping[str, str] | None = None,
        version: int | str | None = None,
        transform: Callable[[dict[str, Any]], Any] | None = None,
        retry: RetryPolicy | None = RetryPolicy(),  # noqa: B008  (frozen, shared safely)
        permutation: str = "auto",
        io: str | None = None,
        log_every: float | None = None,
        coalesce: int | str = "auto",
        cache: str | None = None,
        cache_bytes: int | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        max_buffer_bytes: int = DEFAULT_MAX_BUFFER_BYTES,
    ) -> None:
        super().__init__()
        # Everything that needs no I/O is checked first.
        self.batch_size = check_int("batch_size", batch_size, minimum=1)
        self.seed = check_int("seed", seed, minimum=0)
        readahead = check_depth("readahead", readahead)
        max_in_flight = check_depth("max_in_flight", max_in_flight)
        if isinstance(readahead, int) and isinstance(max_in_flight, int):
            check_depths(readahead, max_in_flight)
        #: ``readahead`` and ``max_in_flight`` as given (an int, or ``"auto"``).
        self.readahead, self.max_in_flight = readahead, max_in_flight
        self.max_buffer_bytes = check_int("max_buffer_bytes", max_buffer_bytes, minimum=1)
        cache = check_cache(cache)
        if cache_bytes is not None:
            cache_bytes = check_int("cache_bytes", cache_bytes, minimum=1)
        if cache_dir is not None and not isinstance(cache_dir, (str, os.PathLike)):
            raise TypeError(f"cache_dir should be a path (str or os.PathLike), got {cache_dir!r}")
        if cache != "memory" and cache_bytes is not None:
            raise ValueError(
                f"cache_bytes={cache_bytes} applies to cache='memory' only, but cache={cache!r}; "
                f"pass cache='memory' or leave cache_bytes out"
            )
        if cache != "disk" and cache_dir is not None:
            raise ValueError(
                f"cache_dir applies to cache='disk' only, but cache={cache!r}; pass "
                f"cache='disk' or leave cache_dir out"
            )
        self.drop_last = check_bool("drop_last", drop_last)
        self.rank, self.world_size = resolve_rank(rank, world_size)
        if transform is not None and not callable(transform):
            raise TypeError(f"transform should be callable or None, but got {transform!r}")
        self.transform = transform
        retry = check_retry(retry)
        self.retry = retry
        resolve_kind(permutation, 1)  # checked before any I/O; resolved once num_rows is known
        self.log_every = _check_log_every(log_every)
        coalesce = check_coalesce(coalesce)
        if isinstance(self.readahead, int):
            coalesce_size(coalesce, self.batch_size, self.readahead)  # raises before any I/O
        if cache_dir is not None and (os.fspath(cache_dir) == "" or os.path.isfile(cache_dir)):
            raise ValueError(
                f"cache_dir should be a folder (created if missing), but got "
                f"cache_dir={os.fspath(cache_dir)!r}"
                + (", which is a file" if os.fspath(cache_dir) else "")
            )
        self._telemetry: Telemetry | None = None  # the latest iteration in this process
        self._control = EpochControl()  # shared with this loader's copies in DataLoader workers
        self._iterations = 0  # iterations started by this copy (identifies a worker's iteration)
        self._spawned = 0  # times this loader was pickled for a new process (see epochs.py)
        self._worker_resume: tuple[Decision, int] | None = None  # (decision, skip) in a worker
        self._progress: Progress | None = None  # the latest iteration in this process
        self._iterators: weakref.WeakSet[BlockingPrefetcher[Any]] = weakref.WeakSet()

        lance_source = LanceSource(
            source, columns=columns, version=version, storage_options=storage_options, io=io
        )
        check_schema(lance_source.schema)
        #: ``"memory"``, ``"disk"`` or ``None``: where batches are served from (see
        #: :mod:`lance_prefetch.cache`).
        self.cache = cache
        self._source = open_cache(lance_source, cache, cache_bytes=cache_bytes, cache_dir=cache_dir)
        row_bytes = fixed_row_bytes(lance_source.schema)
        if isinstance(self.readahead, int):
            limit = self.readahead
        elif coalesce != "auto":  # readahead="auto" makes room for the takes asked for
            limit = coalesce  # type: ignore[assignment]
        elif row_bytes:  # "auto": at least two takes within max_buffer_bytes
            limit = max(self.max_buffer_bytes // max(row_bytes * self.batch_size, 1), 1)
        else:  # bytes unknown until the first read: the rule alone
            limit = 2 * TARGET_ROWS
        #: Batches read by one ``take`` (``coalesce`` resolved; see :mod:`lance_prefetch.coalesce`).
        self.coalesce = coalesce_size(coalesce, self.batch_size, limit)
        self._tuner: DepthTuner | None = None
        if "auto" in (self.readahead, self.max_in_flight):
            self._tuner = DepthTuner(
                coalesce=self.coalesce,
                readahead=None if self.readahead == "auto" else self.readahead,  # type: ignore[arg-type]
                max_in_flight=None if self.max_in_flight == "auto" else self.max_in_flight,  # type: ignore[arg-type]
                max_buffer_bytes=self.max_buffer_bytes,
                row_bytes=row_bytes,
                batch_size=self.batch_size,
                level=START_LEVEL_MEMORY if cache == "memory" else START_LEVEL,
            )
        if self._source.num_rows == 0:
            raise ValueError(
                f"source: the dataset {self._source.uri!r} has no rows at version "
                f"{self._source.version}; write data first or pick another version"
            )
        #: ``"array"`` or ``"lazy"``: the ``permutation`` option resolved for :attr:`num_rows`.
        self.permutation = resolve_kind(permutation, self._source.num_rows)
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
    def io(self) -> str:
        """The reader in use: ``"default"`` or ``"uring"`` (``"default"`` after a fallback)."""
        return self._source.io

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
        """The epoch being read (or last read); once :meth:`set_epoch` or :meth:`load_state_dict`
        selected one, the epoch the next iteration reads. Shared with DataLoader workers."""
        return self._control.epoch

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose permutation the next ``iter(loader)`` reads.

        As with ``DistributedSampler.set_epoch``: call it before each epoch, with the same value on
        every rank. It reaches the loader's copies in DataLoader worker processes, persistent ones
        included (they share its epoch state through shared memory). Without it, each new
        iteration reads the epoch after the previous one (see :mod:`lance_prefetch.epochs`). After
        :meth:`load_state_dict`, ``set_epoch`` with the state's epoch keeps its position; another
        epoch starts from its beginning.

        Raises:
            TypeError, ValueError: ``epoch`` is not an integer ``>= 0``.
        """
        epoch = check_int("epoch", epoch, minimum=0)
        if epoch > MAX_EPOCH:
            raise ValueError(f"epoch should be <= 2**62, but got epoch={epoch}")
        self._control.set_epoch(epoch)

    def epoch_plan(self, epoch: int | None = None, *, start: int = 0) -> EpochPlan:
        """The :class:`~lance_prefetch.sampling.EpochPlan` for ``epoch`` (default: :attr:`epoch`),
        from global position ``start`` (default: the epoch's beginning)."""
        return EpochPlan(
            num_rows=self.num_rows,
            batch_size=self.batch_size,
            seed=self.seed,
            epoch=self.epoch if epoch is None else epoch,
            world_size=self.world_size,
            drop_last=self.drop_last,
            start=start,
            permutation_kind=self.permutation,
        )

    def __len__(self) -> int:
        """Batches this rank yields in a whole epoch (the same on every rank). An iteration resumed
        mid-epoch yields fewer."""
        return self.epoch_plan().batches_per_rank

    # -- checkpoints -----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Where the training loop is: a small, JSON-serializable dict to checkpoint.

        It holds the dataset (URI, pinned version, rows), the sampling parameters (seed,
        batch_size, drop_last, world_size), the epoch, and ``position``: the global batches of the
        epoch (over all ranks) **delivered to the training loop** so far; batches read ahead but not
        yet handed out do not count. Layout in :mod:`lance_prefetch.state`. After
        :meth:`set_epoch` or :meth:`load_state_dict` it describes what the next iteration reads.

        Every rank holds the same state (ranks step together), so saving rank 0's is enough.

        With DataLoader worker processes, only the DataLoader sees which batches reached the loop:
        use torchdata's ``StatefulDataLoader`` (it asks each worker for this method's result and
        keeps the states of delivered batches), or save between epochs, after :meth:`set_epoch`.

        Raises:
            RuntimeError: the current iteration runs in DataLoader worker processes, so this process
                cannot know the position (see above).
        """
        progress = self._progress
        in_worker = get_worker_info() is not None
        pending = None if in_worker else self._control.pending()
        if pending is not None:
            epoch, position, worker = pending.epoch, pending.start, None
        elif progress is not None and (in_worker or self._control.decided_by(progress.ident)):
            epoch, position = progress.decision.epoch, progress.position
            worker = None
            if in_worker:
                worker = {
                    "id": progress.worker_id,
                    "num_workers": progress.num_workers,
                    "start": progress.decision.start,
                }
        else:
            raise RuntimeError(
                "this loader's batches are being delivered by DataLoader worker processes, so "
                "this process cannot tell how many reached the training loop; use torchdata's "
                "StatefulDataLoader and its state_dict(), or call state_dict() between epochs "
                "after set_epoch()"
            )
        if worker is None:  # a finished epoch is saved at the one end that fits every world size
            end = end_position(self.num_rows, self.batch_size, drop_last=self.drop_last)
            position = min(position, end)
        return make_state(
            uri=self.uri,
            version=self.version,
            num_rows=self.num_rows,
            seed=self.seed,
            batch_size=self.batch_size,
            drop_last=self.drop_last,
            world_size=self.world_size,
            epoch=epoch,
            position=position,
            worker=worker,
            permutation=self.permutation,
        )

    def load_state_dict(
        self, state: Mapping[str, Any], *, allow_version_change: bool = False
    ) -> None:
        """Make the next iteration continue exactly where ``state`` stopped.

        The same epoch's permutation, from the next undelivered batch: nothing is re-read or
        replayed. The state may come from a job with another ``world_size`` or ``num_workers``:
        the rest of the epoch is then re-split over this job's ranks (rules in
        :mod:`lance_prefetch.sampling`), and every row is still delivered once. A state saved after
        an epoch's last batch leaves an empty rest of that epoch; the iteration after reads the
        next. It reaches DataLoader workers like :meth:`set_epoch` does.

        Args:
            state (Mapping): a dict from :meth:`state_dict` (or
                :func:`~lance_prefetch.state_from_dataloader`).
            allow_version_change (bool, optional): accept a state saved on another dataset
                version. Rows are still addressed by offset among the live rows, so this is right
                only if the versions hold the same rows in the same order (say, a new index or
                metadata only). Default: ``False``.

        Raises:
            RuntimeError: an iterator of this loader is live in this process (exhaust or
                :meth:`close` it first; the state applies to the next iterator).
            ValueError: a DataLoader worker's share (from ``StatefulDataLoader``) loaded outside
                that worker or with another ``world_size``.
            ValueError: the state is malformed, or belongs to another dataset, version, seed,
                batch size or ``drop_last`` (the message names each mismatch), or it is a DataLoader
                worker's share loaded outside that worker (merge with
                :func:`~lance_prefetch.state_from_dataloader`).
            TypeError: ``state`` is not a mapping or a field has the wrong type.
        """
        allow_version_change = check_bool("allow_version_change", allow_version_change)
        if any(not iterator.closed for iterator in self._iterators):
            raise RuntimeError(
                "load_state_dict() was called while an iterator of this loader is live; exhaust "
                "it or call loader.close() first (the state applies to the next iterator)"
            )
        expected = {
            "uri": self.uri,
            "version": self.version,
            "num_rows": self.num_rows,
            "seed": self.seed,
            "batch_size": self.batch_size,
            "drop_last": self.drop_last,
            "permutation": self.permutation,
        }
        state = check_state(state, expected, allow_version_change=allow_version_change)
        epoch, position = state["epoch"], state["position"]
        worker = get_worker_info()
        saved_by = state.get("worker")
        if saved_by is not None:
            here = None if worker is None else (worker.id, worker.num_workers)
            if here != (saved_by["id"], saved_by["num_workers"]):
                raise ValueError(
                    f"state holds only the share of DataLoader worker {saved_by['id']} of "
                    f"{saved_by['num_workers']}, but it is loaded "
                    + (
                        "outside DataLoader workers"
                        if here is None
                        else f"in worker {here[0]} of {here[1]}"
                    )
                    + "; merge the workers' states with lance_prefetch.state_from_dataloader() "
                    "and load that into the loader before the DataLoader starts"
                )
            if state["world_size"] != self.world_size:
                raise ValueError(
                    f"state holds a DataLoader worker's share saved with "
                    f"world_size={state['world_size']}, but this loader has "
                    f"world_size={self.world_size}; to resume on another number of ranks, merge "
                    f"the workers' states with lance_prefetch.state_from_dataloader() and load "
                    f"that into the loader before the DataLoader starts"
                )
            start = saved_by["start"]
            skip = (position - start) // self.world_size
            self._worker_resume = (Decision(epoch, start), skip)
        elif worker is not None:  # a whole state loaded inside one worker: for this copy only
            self._worker_resume = (Decision(epoch, position), 0)
        else:
            self._control.load(epoch, position)

    # -- iteration -------------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Any]:
        """Start reading this epoch's batches for this rank (and DataLoader worker, if any).

        Starts an event-loop thread in the calling process; it stops when the iterator is
        exhausted, fails, is closed (:meth:`close`), or is garbage collected (e.g. after ``break``).

        Raises:
            RuntimeError: this process was forked from the one that built the loader (Lance is
                not fork-safe; use ``multiprocessing_context="spawn"``).
            MemoryError, OSError, Exception: with ``cache=``, the cache is filled here, on the first
                iteration in a process (a scan of the pinned version, or the copy to
                ``cache_dir``): its errors come from ``iter()`` (``MemoryError`` above
                ``cache_bytes``; the scan's errors as ``LanceSource.scan`` raises them, not
                retried by ``retry``; Lance's own request retries apply)

        Raises (from ``next()``):
            BatchLoadError: reading, converting or transforming a batch failed; the iterator is
                then closed.
        """
        self._source.check_process()  # fail at once, not in a thread, in a forked worker
        fill = getattr(self._source, "fill", None)
        if fill is not None:  # a cache: filled here, once per process (not inside a timed take)
            fill()
        worker = get_worker_info()
        self._iterations += 1
        if worker is None:
            ident, worker_id, num_workers = iteration_ident(), 0, 1
        else:
            # equal for the workers of one DataLoader start (they are pickled in worker order)
            token = (self._spawned or worker.seed) - worker.id
            ident = iteration_ident(token, self._iterations, worker.num_workers)
            worker_id, num_workers = worker.id, worker.num_workers
        resume, self._worker_resume = self._worker_resume, None
        if resume is not None:
            decision, skip = resume
            self._control.begin(ident, forced=decision)
        else:
            decision, skip = self._control.begin(ident), 0
        plan = self.epoch_plan(decision.epoch, start=decision.start)
        batches = plan.rank_batches(
            self.rank, worker_id=worker_id, num_workers=num_workers, skip=skip
        )
        progress = Progress(
            ident,
            decision,
            world_size=self.world_size,
            worker_id=worker_id,
            num_workers=num_workers,
            skip=skip,
        )
        self._progress = progress
        telemetry = Telemetry(plan.epoch, None if worker is None else worker_id)
        self._telemetry = telemetry
        if self._tuner is None:
            readahead, max_in_flight = self.readahead, self.max_in_flight
        else:  # from the level the previous iteration in this process ended at
            bounds = self._tuner.restart()
            readahead, max_in_flight = bounds.readahead, bounds.max_in_flight
        iterator = _Iteration(
            groups(batches, self.coalesce),
            functools.partial(self._read, telemetry),
            functools.partial(self._convert, plan.epoch),
            progress,
            functools.partial(self._read_error, plan.epoch),
            telemetry,
            self.log_every,
            self._tuner,
            readahead=readahead,
            max_in_flight=max_in_flight,
            retry=self.retry,
            size=len,
        )
        self._iterators.add(iterator)
        return iterator

    def stats(self) -> LoaderStats:
        """Telemetry of the latest iteration in this process: rows/s and MiB/s (last 10 s and
        total), the fraction of time the training loop waited in ``next()``, queue depth, takes
        in flight, take latency percentiles (ms) and retries (see :class:`LoaderStats`).

        Cheap and safe from any thread. With DataLoader workers the iterations run in the worker
        processes, so the main process's loader has none: there, pass ``log_every`` to have each
        worker log its own figures. Before any iteration: a :class:`LoaderStats` of zeros with
        ``epoch=None``.
        """
        telemetry = self._telemetry
        return LoaderStats() if telemetry is None else telemetry.snapshot()

    def _read(self, telemetry: Telemetry, group: Group) -> Any:
        """Read the rows of a group of batches with one ``take`` (runs in a worker thread;
        retried by :attr:`retry`)."""
        cached = getattr(self._source, "filled", None)  # a cache: whether it is filled already
        started = time.perf_counter()
        table = self._source.take(group.indices)
        telemetry.record_take(
            time.perf_counter() - started, table.nbytes, rows=table.num_rows, cached=cached
        )
        return table

    def _convert(self, epoch: int, group: Group, table: Any) -> list[Any]:
        """Split a group read by :meth:`_read` into its batches, convert and transform each (same
        thread; not retried): a list of ``(rows, batch)``, or of the :class:`BatchLoadError` of a
        batch that failed (its batches before it are still delivered)."""
        results: list[Any] = []
        for batch, piece in zip(group.batches, split(table, group), strict=True):
            try:
                with native_call(lance=False):  # a transform may run native code (torch)
                    tensors = to_tensors(piece)
                    converted = tensors if self.transform is None else self.transform(tensors)
            except Exception as exc:
                error = self._batch_error(epoch, batch, exc, "in conversion or transform")
                error.__cause__ = exc
                results.append(error)
                break
            results.append((piece.num_rows, converted))
        return results

    def _read_error(self, epoch: int, error: FetchError) -> BatchLoadError:
        """The error a batch whose read failed for good reaches the training loop as."""
        cause = error.__cause__
        attempts = error.attempts
        how = f"after {attempts} attempt{'s' if attempts > 1 else ''}"
        if self.retry is not None and attempts < self.retry.attempts:
            how += f" (not retried: {type(cause).__name__} is not transient)"
        return self._batch_error(epoch, error.item, cause, how, attempts=attempts)

    def _batch_error(
        self,
        epoch: int,
        batch: PlannedBatch | Group,
        error: BaseException | None,
        how: str,
        *,
        attempts: int | None = None,
    ) -> BatchLoadError:
        uri = redact_uri(self.uri)
        what = f"batch {batch.position}"
        if isinstance(batch, Group) and len(batch) > 1:  # one take read them all
            what = f"batches {batch.position}-{batch.batches[-1].position} (one coalesced take)"
        return BatchLoadError(
            f"{what} of epoch {epoch} ({_rows(len(batch.indices))}) from "
            f"{uri!r} version {self.version} failed {how}: {type(error).__name__}: {error}",
            epoch=epoch,
            position=batch.position,
            num_rows=len(batch.indices),
            uri=uri,
            attempts=attempts,
        )

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
        del state["_iterators"], state["_progress"], state["_telemetry"]  # this process's
        if multiprocessing.context.get_spawning_popen() is not None:  # for a new process
            self._spawned += 1
            state["_spawned"], state["_iterations"] = self._spawned, 0
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._iterators = weakref.WeakSet()
        self._progress = None
        self._telemetry = None

    def __repr__(self) -> str:
        return (
            f"PrefetchLoader({self.uri!r}, batch_size={self.batch_size}, "
            f"columns={list(self.columns)}, version={self.version}, num_rows={self.num_rows}, "
            f"seed={self.seed}, epoch={self.epoch}, readahead={self.readahead!r}, "
            f"max_in_flight={self.max_in_flight!r}, coalesce={self.coalesce}, "
            f"cache={self.cache!r}, drop_last={self.drop_last}, rank={self.rank}, "
            f"world_size={self.world_size}, retry={self.retry!r}, io={self.io!r}, "
            f"storage_options={redact(self._source._storage_options)})"
        )


_stats_logger = logging.getLogger("lance_prefetch.stats")


def _check_log_every(log_every: object) -> float | None:
    if log_every is None:
        return None
    if isinstance(log_every, bool) or not isinstance(log_every, (int, float)):
        raise TypeError(f"log_every should be a number of seconds or None, but got {log_every!r}")
    if not (log_every > 0 and math.isfinite(log_every)):
        raise ValueError(
            f"log_every should be a finite number of seconds > 0, or None for no logging, but "
            f"got log_every={log_every}"
        )
    return float(log_every)


def _rows(count: int) -> str:
    return f"{count} row" if count == 1 else f"{count} rows"


class _Iteration(BlockingPrefetcher[Any]):
    """The iterator ``iter(loader)`` returns: a prefetcher of groups of batches (one ``take``
    each) that hands the batches on one by one, giving back a readahead token as each is
    received, counts the batches it delivers, reports a failed read as :class:`BatchLoadError`
    and, with ``readahead="auto"``, applies the tuner's bounds."""

    def __init__(
        self,
        items: Any,
        fetch: Any,
        process: Any,
        progress: Progress,
        read_error: Callable[[FetchError], BatchLoadError],
        telemetry: Telemetry,
        log_every: float | None,
        tuner: DepthTuner | None,
        **options: Any,
    ) -> None:
        # Set before the prefetcher starts: a Ctrl-C held back during its start is raised at the
        # end of super().__init__(), and close() (run by garbage collection) needs them.
        self._progress = progress
        self._read_error = read_error
        self._telemetry = telemetry
        self._log_every = log_every
        self._tuner = tuner
        self._next_log = None if log_every is None else telemetry.started + log_every
        self._pending: collections.deque[Any] = collections.deque()  # the rest of a group
        super().__init__(items, fetch, process=process, **options)
        telemetry.attach(_counters_of(weakref.ref(self)))  # weak: the loader keeps telemetry

    def __next__(self) -> Any:
        started = self._telemetry.begin_wait()
        try:
            try:  # the rest of a group already read (close() from another thread may clear it;
                # in a forked copy, self._next() refuses instead)
                result = self._pending.popleft() if os.getpid() == self._pid else None
            except IndexError:
                result = None
            if result is None:
                # the token goes back at the end of this call, so that the next read does not
                # compete with it for the GIL
                results = self._next(release=False)
                result = results[0]
                self._pending.extend(results[1:])
            if isinstance(result, BatchLoadError):  # the batches before it were delivered
                self.close(wait=False)
                raise result
        except FetchError as error:
            self._telemetry.end()
            raise self._read_error(error) from error.__cause__
        except BaseException:
            self._telemetry.end()
            raise
        rows, item = result
        now = self._telemetry.clock()
        self._telemetry.record_batch(rows, now - started)
        self._progress.delivered += 1
        tuner = self._tuner
        if tuner is not None:
            telemetry = self._telemetry
            bounds = tuner.observe(
                now, telemetry.waited, telemetry.rows, telemetry.bytes, telemetry.rows_read
            )
            if bounds is not None:
                self.resize(bounds.readahead, bounds.max_in_flight)
        if self._next_log is not None and now >= self._next_log:
            self._next_log = now + self._log_every  # type: ignore[operator]
            _stats_logger.info("%s", self._telemetry.snapshot())
        self.release(1)
        return item

    def close(self, *, wait: bool = True) -> None:
        self._telemetry.end()
        self._pending.clear()  # batches read but never delivered (their tokens die with the loop)
        super().close(wait=wait)


def _counters_of(
    iteration: weakref.ref[_Iteration],
) -> Callable[[], tuple[int, ...] | None]:
    """(queue depth, takes in flight, retries, readahead, max_in_flight) of a live iteration,
    for its telemetry."""

    def counters() -> tuple[int, ...] | None:
        live = iteration()
        if live is None:
            return None
        statistics = live.statistics()
        return (
            statistics.ready,
            statistics.in_flight,
            statistics.retries,
            statistics.readahead,
            statistics.max_in_flight,
        )

    return counters
