"""The torch wrapper: :class:`PrefetchLoader`, an ``IterableDataset`` of fully random, prefetched
batches. It wires the rooms together: :mod:`~lance_prefetch.loader._config` checks the options,
:mod:`~lance_prefetch.sources._lance` pins the dataset, :mod:`~lance_prefetch.plan.sampling` plans the epoch,
:mod:`~lance_prefetch.loader._epochs` and :mod:`~lance_prefetch.plan._positions` say where an iteration starts
and how far it got, and :mod:`~lance_prefetch.loader._iteration` reads it."""

from __future__ import annotations

import functools
import multiprocessing.context
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

from torch.utils.data import IterableDataset, get_worker_info

from lance_prefetch._validate import check_bool, check_int
from lance_prefetch.audit._coverage import AuditReport, Share
from lance_prefetch.audit._wiring import AuditMemory, EpochAudit, choose_exchange, open_audit
from lance_prefetch.convert._arrow import fixed_row_bytes
from lance_prefetch.integrations._frameworks import (
    AccelerateDispatcher,
    EpochSetter,
    ReadAhead,
    dispatcher_of,
    find_read_ahead,
    pass_through_prepared,
    reads_every_rank,
    refuse_rebatching,
    refuse_stateful_dispatch,
    save_one_state,
    warn_unset_epochs,
    workers_read_ahead_by,
)
from lance_prefetch.lifecycle._shutdown import close_all
from lance_prefetch.loader._config import LoaderConfig
from lance_prefetch.loader._epochs import MAX_EPOCH, EpochControl
from lance_prefetch.loader._facade import SourceFacade, loader_identity, loader_repr
from lance_prefetch.loader._iteration import LazyIteration, LoaderIterator, start_iteration
from lance_prefetch.loader._open import open_sources
from lance_prefetch.loader._ranks import Ranks
from lance_prefetch.loader._telemetry import LoaderStats, Telemetry
from lance_prefetch.plan._positions import (
    Decision,
    DeliveryCounter,
    consumed_position,
    end_position,
    plan_resume,
    saved_position,
)
from lance_prefetch.plan.sampling import EpochPlan
from lance_prefetch.sources._allocator import release_freed_memory
from lance_prefetch.sources._multi import epoch_view, naming_rows
from lance_prefetch.sources._subset import subset_of
from lance_prefetch.state import check_state, make_state

if TYPE_CHECKING:
    import numpy as np
    import torch

    from lance_prefetch.options import (
        Audit,
        DatasetLike,
        DiskCache,
        MemoryCache,
        Mixture,
        ReadOptions,
        Shuffle,
    )
    from lance_prefetch.plan.splits import Split

__all__ = ["PrefetchLoader"]


def _option(name: str, doc: str) -> Any:
    return property(lambda self: getattr(self.config, name), doc=doc)


class PrefetchLoader(SourceFacade, IterableDataset[Any]):
    """Fully random batches from a Lance dataset, read concurrently ahead of the training loop.

    Each epoch, the rows of the pinned version are shuffled uniformly from ``(seed, epoch)``, cut
    into batches of ``batch_size`` rows and dealt to ranks (:mod:`lance_prefetch.plan.sampling`);
    ``take`` calls read ahead in background threads, up to ``readahead`` batches ahead of the
    loop. Iterate it directly (``loader.set_epoch(epoch)`` before each epoch) or in
    ``DataLoader(loader, batch_size=None, num_workers=4, multiprocessing_context="spawn")``: each
    worker reads its share of the rank's batches, in the same order for any ``num_workers``.

    Args:
        source (str | os.PathLike | lance.LanceDataset | Dataset | Mixture | list): the
            dataset: a URI or path, an open dataset, or a
            :class:`~lance_prefetch.options.Dataset` with its ``version`` and
            ``storage_options`` (pickled into workers, never printed; an ``s3://`` endpoint
            given there is probed for at most 3 s). A list of them: their concatenation, one
            permutation over all rows; a :class:`~lance_prefetch.options.Mixture`: datasets
            read in proportions (``docs/datasets.md``).
        batch_size (int): rows per batch, ``>= 1``.
        columns (Sequence[str], optional): columns (or ``"a.b"`` struct fields), in order.
            Default: ``None``, all top-level columns.
        filter (str, optional): a Lance SQL predicate, as ``scanner(filter=...)`` takes: epochs
            permute only the matching rows (``docs/subsets.md``). Default: ``None``, every row.
        split (Split, optional): one part of a seeded split of the (matching) rows
            (:class:`~lance_prefetch.Split`). Default: ``None``.
        shuffle (bool | Shuffle, optional): ``True``: a new uniform permutation each epoch
            (:class:`~lance_prefetch.options.Shuffle` says how it is held); ``False``: the
            dataset's own order, every epoch (for evaluation): with ``drop_last=False`` every
            row exactly once across ranks and workers, nothing padded, a rank's last batch maybe
            short and a rank maybe one batch short (``len()`` says each rank's). Default:
            ``True``.
        drop_last (bool, optional): ``True``: full batches, the permutation's tail left out;
            ``False``: every row, the last batch maybe short (shuffled: a round padded by
            wrapping around, so every rank gets as many batches). Default: ``None``:
            ``True``, or ``False`` with ``shuffle=False``.
        seed (int, optional): base seed in ``[0, 2**64)``, the same on every rank. Default: ``0``.
        rank (int, optional): this process's rank, ``>= 0`` and ``< world_size``. Default:
            ``None``, from ``torch.distributed``, else ``RANK``, else ``0``.
        world_size (int, optional): the number of ranks, ``>= 1``. Default: ``None``, from
            ``torch.distributed``, else ``WORLD_SIZE``, else ``1``.
        readahead (int | "auto", optional): the most batches held (being read or read, not
            yet handed out), ``>= 1``; ``"auto"``: tuned from the measured wait and rows/s
            within ``read.max_buffer_bytes``. Default: ``"auto"``.
        read (ReadOptions, optional): concurrency, take sizes, memory, reader, retries and
            hedging (:class:`~lance_prefetch.options.ReadOptions`). Default: ``None``, its
            defaults.
        cache ("memory" | "disk" | MemoryCache | DiskCache, optional): keep the rows after the
            first read, in this process's memory or in a local copy shared by processes; same
            rows, same order (:class:`~lance_prefetch.options.MemoryCache`,
            :class:`~lance_prefetch.options.DiskCache`; the words are their defaults).
            Default: ``None``, every epoch reads the dataset.
        transform (Callable, optional): applied to each converted batch in the read threads
            (thread-safe); its result is yielded. Default: ``None``.
        pin_memory (bool, optional): pin each batch's tensors in the read threads (a
            ``UserWarning`` and no pinning without an accelerator). Default: ``False``.
        device (str | int | torch.device, optional): hand batches out on it, each copy issued
            with ``non_blocking=True`` one batch ahead (on a side stream where the device has
            streams); ``"cpu"``: as read. Not in DataLoader workers (use
            ``DataLoader(pin_memory=True)`` there). Default: ``None``.
        audit (bool | Audit, optional): record the rows handed out (1 bit a row); at each
            epoch's end check over all ranks and workers that each came as
            :mod:`~lance_prefetch.plan.sampling` says (a failure: ``CoverageError`` from the last
            ``next()``; a pass: :attr:`audit_report`). An epoch cut short is not audited.
            ``True`` is :class:`~lance_prefetch.options.Audit` ``()``; with DataLoader workers,
            ``Audit(dir=...)``. Default: ``False``.
        log_every_s (float, optional): log :meth:`stats` every this many seconds (INFO, logger
            ``"lance_prefetch.stats"``). Default: ``None``, never.

    Batches are ``dict[str, torch.Tensor]`` of shape ``(rows, ...)`` (lists for strings, binaries
    and variable-length lists; :mod:`lance_prefetch.convert`).

    Raises:
        TypeError, ValueError: a wrong argument (named, with the fix), before any I/O; a column
            without tensor form; a missing column or version; no rows, or fewer than
            ``batch_size * world_size`` with ``drop_last=True``; more rows than
            ``MemoryCache.max_bytes``; a ``filter`` Lance refuses (its message quoted) or that
            matches nothing; an empty ``split`` part.
        FileNotFoundError, PermissionError, ConnectionError: no dataset or bucket, refused
            credentials, an endpoint that does not answer.

    .. warning::
        With DataLoader workers, take :meth:`state_dict` through torchdata's
        ``StatefulDataLoader`` (:func:`~lance_prefetch.state_from_dataloader`).
    """

    def __init__(
        self,
        source: DatasetLike | Mixture | Sequence[DatasetLike],
        batch_size: int,
        *,
        columns: Sequence[str] | None = None,
        filter: str | None = None,
        split: Split | None = None,
        shuffle: bool | Shuffle = True,
        drop_last: bool | None = None,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        readahead: int | Literal["auto"] = "auto",
        read: ReadOptions | None = None,
        cache: Literal["memory", "disk"] | MemoryCache | DiskCache | None = None,
        transform: Callable[[dict[str, Any]], Any] | None = None,
        pin_memory: bool = False,
        device: str | int | torch.device | None = None,
        audit: bool | Audit = False,
        log_every_s: float | None = None,
    ) -> None:
        super().__init__()
        #: The options as given, checked (:class:`~lance_prefetch.loader._config.LoaderConfig`).
        # LoaderConfig's fields are typed as normalised; its __post_init__ takes the wider
        # forms of shuffle, read, cache and audit and normalises them (the ignores below)
        self.config = config = LoaderConfig(
            batch_size=batch_size,
            columns=columns,
            filter=filter,
            split=split,
            shuffle=shuffle,  # type: ignore[arg-type]
            drop_last=drop_last,
            seed=seed,
            rank=rank,
            world_size=world_size,
            readahead=readahead,
            read=read,  # type: ignore[arg-type]
            cache=cache,  # type: ignore[arg-type]
            transform=transform,
            pin_memory=pin_memory,
            device=device,
            audit=audit,  # type: ignore[arg-type]
            log_every_s=log_every_s,
        )
        self._ranks = Ranks(config.rank, config.world_size)
        self._telemetry: Telemetry | None = None  # the latest iteration in this process
        self._counter: DeliveryCounter | None = None  # ... and how far it got
        self._ahead: ReadAhead | None = None  # ... and the wrapper that reads it ahead, if any
        # ... or, in a process of Accelerate's dispatcher that does not read, that dispatcher
        self._follower: AccelerateDispatcher | None = None
        self._audit: EpochAudit | None = None  # ... and its coverage audit
        self._audit_memory = AuditMemory()  # the audit's record of a loaded state (resumes)
        self._control = EpochControl()  # shared with this loader's copies in DataLoader workers
        self._worker_resume: tuple[Decision, int] | None = None  # (decision, skip) in a worker
        self._every_rank = False  # a DataLoader worker of Accelerate's dispatcher reads all
        # in a DataLoader worker: the wrapper that reads its batches ahead of the step, if its
        # held batch is counted in this worker's states (they then carry its name)
        self._read_ahead_by: str | None = None
        self._iterators: weakref.WeakSet[LazyIteration] = weakref.WeakSet()
        self._source = open_sources(source, config)  # pinned, cached, filter/split, mixed
        resolved = config.resolve(
            row_bytes=fixed_row_bytes(self._source.schema),
            num_rows=self.num_rows,
            uri=self._source.uri,
        )
        #: Batches read by one ``take`` (``coalesce`` resolved).
        self.coalesce = resolved.coalesce
        #: ``"array"`` or ``"lazy"``: the ``permutation`` option resolved for :attr:`num_rows`.
        self.permutation = resolved.permutation
        self._resolved = resolved  # with its tuner: one per loader copy
        self._plan(0, 0, self._ranks.value[1])  # raises for drop_last=True with too few rows

    batch_size = _option("batch_size", "Rows per batch.")
    seed = _option("seed", "The base seed of every epoch's permutation.")
    drop_last = _option("drop_last", "Whether the epoch's tail is left out (resolved).")
    shuffle = _option("shuffle", "Whether each epoch is a new uniform permutation.")
    readahead = _option("readahead", "``readahead`` as given (an int, or ``'auto'``).")
    read = _option("read", "The :class:`~lance_prefetch.options.ReadOptions` in use.")
    transform = _option("transform", "Applied to each converted batch, or ``None``.")
    cache = _option("cache", "The ``MemoryCache``, ``DiskCache`` or ``None`` in use.")
    audit = _option("audit", "The :class:`~lance_prefetch.options.Audit` in use, or ``None``.")
    log_every_s = _option("log_every_s", "Seconds between logged :meth:`stats`, or ``None``.")

    @property
    def rank(self) -> int:
        """This process's rank: as given, or detected where the loader is used (see
        :mod:`lance_prefetch.loader._ranks`)."""
        return self._current_ranks()[0]

    @property
    def world_size(self) -> int:
        """The number of ranks, given or detected like :attr:`rank`."""
        return self._current_ranks()[1]

    def _current_ranks(self) -> tuple[int, int]:
        reading = any(it.started and not it.closed for it in self._iterators)
        return self._ranks.current(in_worker=get_worker_info() is not None, reading=reading)

    @property
    def num_rows(self) -> int:
        """The rows every epoch permutes (``N``): the pinned version's live rows, or those the
        ``filter`` matches and the ``split`` part holds."""
        return self._source.num_rows

    @property
    def row_offsets(self) -> np.ndarray | None:
        """With ``filter`` or ``split``: the pinned version's row offsets the loader reads
        (ascending, the smallest unsigned dtype for the version's rows); position ``p`` of
        :meth:`epoch_plan` is row offset ``row_offsets[p]``. ``None``: every row (position =
        offset)."""
        subset = subset_of(self._source)
        return None if subset is None else subset.offsets

    @property
    def epoch(self) -> int:
        """The epoch being read (or last read); once :meth:`set_epoch` or :meth:`load_state_dict`
        selected one, the epoch the next iteration reads. Shared with DataLoader workers."""
        return self._control.epoch

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose permutation the next ``iter(loader)`` reads, as
        ``DistributedSampler.set_epoch``: before each epoch, the same on every rank. It reaches
        DataLoader workers, persistent ones included. Without it each new iteration reads the
        epoch after the previous one (:mod:`lance_prefetch.loader._epochs`). After
        :meth:`load_state_dict`, the state's epoch keeps its position; another starts afresh.

        Raises:
            TypeError, ValueError: ``epoch`` is not an integer in ``[0, 2**62]``.
        """
        epoch = check_int("epoch", epoch, minimum=0)
        if epoch > MAX_EPOCH:
            raise ValueError(f"epoch should be <= 2**62, but got epoch={epoch}")
        self._control.set_epoch(epoch)
        # Accelerate's wrappers call this at each iteration's start, before any DataLoader worker
        # starts: an IterableDatasetShard is made a pass-through here; the frame of a dispatcher's
        # generator tells a process that reads nothing how many steps it took
        if reads_every_rank(self) and get_worker_info() is None and self.rank != 0:
            self._follower = dispatcher_of(self, self._follower)

    @property
    def sampler(self) -> EpochSetter:
        """Not a sampler: an :class:`~lance_prefetch.integrations._frameworks.EpochSetter` whose only method,
        ``set_epoch(epoch)``, calls :meth:`set_epoch`. It exists for PyTorch Lightning, which calls
        ``set_epoch`` on the ``sampler`` of every train iterable as each training epoch starts
        (after loading a checkpoint's state, before the first batch): a loader returned from
        ``train_dataloader`` reads epoch ``k``'s permutation in epoch ``k``, also in a run resumed
        from an end-of-epoch checkpoint. A DataLoader over the loader has its own ``sampler``."""
        return EpochSetter(self)

    #: ``None``, as a ``DataLoader(batch_size=None)``'s: the loader makes its own batches.
    batch_sampler = None

    def epoch_plan(self, epoch: int | None = None, *, start: int = 0) -> EpochPlan:
        """The :class:`~lance_prefetch.plan.sampling.EpochPlan` of ``epoch`` (default: :attr:`epoch`)
        from global position ``start`` (default: the epoch's beginning)."""
        return self._plan(self.epoch if epoch is None else epoch, start, self.world_size)

    def _plan(self, epoch: int, start: int, world_size: int) -> EpochPlan:
        with naming_rows(self._source):  # drop_last=True with too few rows: names the rows read
            return EpochPlan(
                num_rows=self.num_rows,
                batch_size=self.batch_size,
                seed=self.seed,
                epoch=epoch,
                world_size=world_size,
                drop_last=self.drop_last,
                start=start,
                permutation_kind=self.permutation,
                shuffle=self.shuffle,
            )

    def __len__(self) -> int:
        """Batches this rank yields in a whole epoch (the same on every rank, but with
        ``shuffle=False`` and ``drop_last=False``, where a rank may have one fewer)."""
        warn_unset_epochs(self)  # if Lightning trains on it out of reach, no LoaderEpochs
        rank, world_size = self._current_ranks()
        plan = self._plan(self.epoch, 0, world_size)
        if self._every_rank or reads_every_rank(self):
            return plan.num_batches  # the dispatcher deals them out: it counts them all
        return plan.batches_of(rank)

    def state_dict(self) -> dict[str, Any]:
        """Where the training step is: a small JSON-serializable dict (:mod:`lance_prefetch.state`)
        from which :meth:`load_state_dict` continues exactly where the step stopped. Its
        ``position`` counts the epoch's global batches **the training step consumed**: those
        handed out, less those a framework wrapper pulled ahead of the step (Accelerate's
        ``DataLoaderShard`` and ``DataLoaderDispatcher``, Ray Train's ``prepare_data_loader``;
        see ``docs/frameworks.md``). The same on every rank. During an iteration it describes
        that iteration (a :meth:`set_epoch` meanwhile applies to the next one); between
        iterations, what the next one reads: the epoch :meth:`set_epoch` or
        :meth:`load_state_dict` selected, the next epoch after one read to its end or broken off
        (``break``, :meth:`close`), as a new ``iter()`` would.

        For a loop that pulls batches ahead in a way the loader cannot see, save
        :meth:`state_after` with the loop's own count instead.

        Raises:
            RuntimeError: the current iteration runs in DataLoader worker processes (use
                torchdata's ``StatefulDataLoader``, or :meth:`state_after`); or this is a
                process of Accelerate's ``DataLoaderDispatcher`` other than the main one (it
                reads nothing: its state follows the main one's, from its dispatcher's step
                count) and that count cannot be read (an Accelerate it does not know).
        """
        counter, follower = self._counter, self._follower
        if follower is not None and counter is None:  # a process of the dispatcher but the main
            return self._followed(follower)
        live = any(it.started and not it.closed for it in self._iterators)
        ahead = self._ahead
        held = 0 if ahead is None or counter is None else ahead.held(counter.delivered)
        epoch, position, worker = saved_position(
            pending=self._control.pending(),
            counter=counter,
            in_worker=get_worker_info() is not None,
            decided=counter is not None and self._control.decided_by(counter.ident),
            end=self._end(),
            live=live,
            held=held,
        )
        return self._state(epoch, position, worker)

    def _followed(self, dispatcher: AccelerateDispatcher) -> dict[str, Any]:
        """The state in a process of Accelerate's dispatcher that reads nothing, which follows the
        main process's (:meth:`~lance_prefetch.integrations._frameworks.AccelerateDispatcher.followed`)."""
        pending = self._control.pending() or (self.epoch, 0)  # set by set_epoch, or loaded
        return self._state(*dispatcher.followed(pending, self._end()), None)

    def state_after(self, batches: int, *, epoch: int | None = None) -> dict[str, Any]:
        """The state after this rank's training loop consumed its first ``batches`` batches of
        ``epoch``, counted by the loop itself (a step counter within the epoch, from the epoch's
        first batch, also across a resume): the framework-neutral form of :meth:`state_dict`
        for any loop that pulls batches ahead of its step in a way the loader cannot see (a
        prefetching wrapper, DataLoader workers). Under Accelerate's ``DataLoaderDispatcher`` a
        step is one batch on every process, so ``batches`` is the step count there too.

        Args:
            batches (int): batches consumed, ``0 <= batches <= len(loader)``; ``len(loader)``:
                the epoch is over (the state resumes at the next epoch).
            epoch (int, optional): the epoch they belong to. Default: the epoch of the live or
                latest iteration in this process, else :attr:`epoch`.

        Raises:
            TypeError, ValueError: ``batches`` or ``epoch`` out of range.
        """
        if epoch is None:
            epoch = self._counter.decision.epoch if self._counter is not None else self.epoch
        epoch = check_int("epoch", epoch, minimum=0)
        if epoch > MAX_EPOCH:
            raise ValueError(f"epoch should be <= 2**62, but got epoch={epoch}")
        per_rank = len(self)
        if self._every_rank or reads_every_rank(self):  # len() counted every rank's batches
            per_rank = self._plan(epoch, 0, self.world_size).batches_of(0)
        batches = check_int("batches", batches, minimum=0)
        position = consumed_position(batches, per_rank, self.world_size, self._end())
        return self._state(epoch, position, None)

    def _state(self, epoch: int, position: int, worker: dict[str, int] | None) -> dict[str, Any]:
        state = make_state(
            **loader_identity(self),
            world_size=self.world_size,
            epoch=epoch,
            position=position,
            worker=worker,
            read_ahead=None if worker is None else self._read_ahead_by,
        )
        # audit=True: the record of the batches consumed before the position (state.py)
        return self._audit_memory.stamp(state, self._audit) if self.config.audit else state

    def _end(self) -> int:
        return end_position(self.num_rows, self.batch_size, drop_last=self.drop_last)

    def load_state_dict(
        self, state: Mapping[str, Any], *, allow_version_change: bool = False
    ) -> None:
        """Make the next iteration continue exactly where ``state`` stopped (from the next
        undelivered batch, also on another ``world_size`` or ``num_workers``; a finished epoch's
        state continues with the next epoch). It reaches DataLoader workers.

        Args:
            state (Mapping): from :meth:`state_dict` or
                :func:`~lance_prefetch.state_from_dataloader`.
            allow_version_change (bool, optional): accept a state of another dataset version
                (right only if both hold the same rows in the same order). Default: ``False``.

        Raises:
            RuntimeError: an iteration of this loader is reading in this process.
            ValueError, TypeError: the state is malformed or of another dataset, version, seed,
                batch size, ``drop_last`` or order (each mismatch named), or a DataLoader
                worker's share loaded elsewhere (merge with ``state_from_dataloader``).
        """
        allow_version_change = check_bool("allow_version_change", allow_version_change)
        if any(it.started and not it.closed for it in self._iterators):
            raise RuntimeError(
                "load_state_dict() was called while an iterator of this loader is live; exhaust "
                "it or call loader.close() first (the state applies to the next iterator)"
            )
        state = check_state(state, loader_identity(self), allow_version_change=allow_version_change)
        worker = get_worker_info()
        here = None if worker is None else (worker.id, worker.num_workers)
        resume = plan_resume(state, here=here, world_size=self.world_size)
        self._audit_memory.load(state, resume.decision)  # state["audit"]: audit a whole epoch
        if resume.in_worker:
            self._worker_resume = (resume.decision, resume.skip)
        else:
            self._control.load(*resume.decision)

    def __iter__(self) -> Iterator[Any]:
        """An iteration of this rank's (and DataLoader worker's) batches. Its first ``next()`` (in
        a DataLoader worker: ``iter()`` itself) decides the epoch, so an iterator never advanced
        uses none up, and starts reading in an event-loop thread of this process, which stops
        when the iterator is exhausted, fails, is closed (:meth:`close`) or garbage collected
        (after ``break``).

        Raises:
            ValueError: a ``DataLoader`` with a ``batch_size`` other than ``None`` iterates the
                loader (it would collate batches of batches); ``pin_memory`` or ``device`` in a
                DataLoader worker; ``audit=True``
                with several records and no way to meet (from the first ``next()``).
            RuntimeError: this process was forked from the one that built the loader (Lance is
                not fork-safe; use ``multiprocessing_context="spawn"``).
            MemoryError, OSError, Exception: with ``cache=``, the fill (once per process, here):
                ``MemoryError`` above ``cache_bytes``; ``OSError`` (``errno`` ``ENOSPC``) when the
                disk under ``cache_dir`` fills, nothing of the copy kept; the scan's own errors,
                not retried. A damaged disk copy is filled again (a ``RuntimeWarning``).
            BatchLoadError: from ``next()``: reading, converting or transforming a batch failed;
                the iterator is then closed.
            CoverageError: from the epoch's last ``next()``: the coverage audit failed.
        """
        self._source.check_process()  # fail at once, not in a thread, in a forked worker
        refuse_rebatching(self)  # a DataLoader with a batch_size would batch the batches
        worker = get_worker_info()
        self.config.placement.check_worker(worker)  # none in DataLoader workers
        self._source.prepare()  # a cache is filled here, once per process (not in a timed take)
        if self._resolved.release_memory:
            release_freed_memory()  # once per process
        ident = self._control.identify(worker)  # at iter(): the workers' counts stay in step
        every_rank = self._every_rank or reads_every_rank(self)
        # under Accelerate's dispatcher a process other than the main one reads nothing
        dispatcher = None
        if every_rank and worker is None:
            self._check_dispatchable()
            dispatcher = dispatcher_of(self, self._follower)
            if dispatcher is not None:  # what accelerator.save_state writes from every process
                save_one_state(dispatcher.wrapper, self.state_dict)
        follows = dispatcher is not None and self._current_ranks()[0] != 0
        self._follower = dispatcher if follows else None
        iteration = LazyIteration(functools.partial(self._begin, worker, ident, every_rank))
        self._iterators.add(iteration)
        if worker is not None:
            # A DataLoader worker is asked for batches (a StatefulDataLoader's, for its state) as
            # soon as its DataLoader iterator exists: it begins at iter(), as a first next() would.
            iteration.begin()
        return iteration

    def _check_dispatchable(self) -> None:
        """Refuse, on every process of Accelerate's dispatcher at its ``iter()``, an iteration
        with no batches: the dispatcher cannot iterate an empty epoch (it fails in its broadcast,
        and a process left waiting there would hang)."""
        epoch, start = self._control.upcoming(self._end())
        if start >= self._end():
            raise RuntimeError(
                f"Accelerate's DataLoaderDispatcher cannot iterate an empty epoch, and nothing is "
                f"left of epoch {epoch} for this iteration: a state saved after its last step was "
                f"loaded and set_epoch({epoch}) asked for that epoch again. Start the resumed "
                f"loop at epoch {epoch + 1} (the epoch after a state whose position is its "
                f"epoch's end), or iterate without set_epoch({epoch}): the loader then reads "
                f"epoch {epoch + 1}"
            )

    def _begin(self, worker: Any, ident: int, every_rank: bool) -> LoaderIterator:
        """The first ``next()`` of an iteration: decide what it reads, start reading (with
        ``every_rank``, every rank's batches in global order, for Accelerate's dispatcher)."""
        rank, world_size = self._current_ranks()  # before anything is decided
        forced, skip = self._worker_resume or (None, 0)
        self._worker_resume = None
        worker_id, num_workers = (0, 1) if worker is None else (worker.id, worker.num_workers)
        share = Share(-1 if every_rank else rank, worker_id, num_workers, skip)
        audit_options = self.config.audit
        exchange = None
        if audit_options is not None:
            exchange = choose_exchange(
                audit_options.dir, share, world_size, in_worker=worker is not None
            )
        end = end_position(self.num_rows, self.batch_size, drop_last=self.drop_last)
        decision = self._control.begin(ident, forced=forced, end=end)
        # a framework wrapper among the callers of this first next() that reads ahead of the step
        self._ahead = find_read_ahead(self) if worker is None else None
        self._counter = counter = DeliveryCounter(
            ident,
            decision,
            world_size=1 if every_rank else world_size,
            worker_id=worker_id,
            num_workers=num_workers,
            skip=skip,
        )
        self._telemetry = Telemetry(decision.epoch, None if worker is None else worker.id)
        plan = self._plan(decision.epoch, decision.start, world_size)
        self._audit = audit = open_audit(
            exchange,
            plan,
            share,
            None if audit_options is None else audit_options.dir,
            identity=loader_identity(self),
            memory=self._audit_memory,
            ident=ident,
        )
        return start_iteration(
            epoch_view(self._source, decision.epoch),
            plan,
            counter,
            self._telemetry,
            rank=None if every_rank else rank,
            config=self.config,
            resolved=self._resolved,
            audit=audit,
        )

    def stats(self) -> LoaderStats:
        """Telemetry of the latest iteration in this process (:class:`LoaderStats`: rows/s,
        MiB/s, wait fraction, queue depth, take latency, retries, hedges); cheap and safe from any
        thread; ``stats().to_dict()`` as plain numbers for a metrics logger (Lightning:
        :class:`~lance_prefetch.integrations.lightning.LoaderStatsLogger`). DataLoader workers'
        iterations are not seen here (use ``log_every_s``). Before any iteration: zeros with
        ``epoch=None``."""
        telemetry = self._telemetry
        return LoaderStats() if telemetry is None else telemetry.snapshot()

    @property
    def audit_report(self) -> AuditReport | None:
        """The coverage audit's :class:`~lance_prefetch.AuditReport` of the latest iteration in
        this process once checked here; else ``None`` (reading, cut short, checked by another
        rank or worker: see ``audit_dir``'s report file, or ``audit=False``)."""
        return None if self._audit is None else self._audit.report

    def close(self) -> None:
        """Stop every live iterator of this loader in this process within about 0.5 s
        (``CLOSE_WAIT_S``), however stuck the store: reads not started are cancelled; running
        ones finish in the background (rows dropped) and are waited for at exit, up to 5 s after
        they were left. The loader stays usable: a later ``iter(loader)`` starts afresh.
        Idempotent. Leaving ``with loader:`` (or ``with iter(loader) as it:``) does the same."""
        close_all(self._iterators)

    def __enter__(self) -> PrefetchLoader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        if multiprocessing.context.get_spawning_popen() is not None:
            self._current_ranks()  # DataLoader workers read the ranks this process has now
            state["_every_rank"] = self._every_rank or reads_every_rank(self)
            # the workers' states will count what this wrapper (starting them) holds: marked
            state["_read_ahead_by"] = workers_read_ahead_by(self)
            refuse_stateful_dispatch(self)
            pass_through_prepared(self)  # the shard over this loader, pickled after it
        del state["_iterators"], state["_counter"], state["_telemetry"], state["_audit"]
        del state["_ahead"], state["_follower"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._iterators = weakref.WeakSet()
        self._counter = self._telemetry = self._audit = None  # this process's own
        self._ahead = self._follower = None

    def __repr__(self) -> str:
        return loader_repr(self)
