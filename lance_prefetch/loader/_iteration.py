"""One iteration of a loader: read each group of batches with one ``take``, split and convert it,
and hand the batches to the training loop one by one.

:class:`BatchReader` is what the worker threads run for each :class:`~lance_prefetch.plan._coalesce.Group`
(read, then split, convert and ``transform``), and how a failure is named for the training loop
(:class:`~lance_prefetch.BatchLoadError`). :class:`LoaderIterator` is the iterator
``iter(loader)`` returns: it holds and drains a prefetcher of groups
(:class:`~lance_prefetch.schedule._drained.DrainedPrefetcher`: on a background event loop, or in
``next()`` for a filled memory cache), counts each batch it delivers (:class:`~lance_prefetch.plan._positions.DeliveryCounter`), records
telemetry, and with ``readahead="auto"`` applies the tuner's bounds.
"""

from __future__ import annotations

import collections
import functools
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any

from lance_prefetch._errors import BatchLoadError
from lance_prefetch.audit._wiring import EpochAudit
from lance_prefetch.cache._gathered import Gathered, gathered
from lance_prefetch.convert._arrow import to_tensors
from lance_prefetch.convert._device import DeviceFeed, Placement
from lance_prefetch.lifecycle._exit_guard import native_call
from lance_prefetch.loader._config import LoaderConfig, Resolved
from lance_prefetch.loader._telemetry import Telemetry
from lance_prefetch.plan._coalesce import Group, groups, share_size, split
from lance_prefetch.plan._positions import DeliveryCounter
from lance_prefetch.plan.sampling import EpochPlan, PlannedBatch
from lance_prefetch.schedule._blocking import BlockingPrefetcher
from lance_prefetch.schedule._direct import DirectPrefetcher
from lance_prefetch.schedule._drained import DrainedPrefetcher
from lance_prefetch.schedule._prefetcher import FetchError, Prefetcher, PrefetchStatistics
from lance_prefetch.schedule._tuning import DepthTuner
from lance_prefetch.schedule.retry import RetryPolicy
from lance_prefetch.sources._protocol import RowSource
from lance_prefetch.sources._storage import redact_uri

__all__ = ["BatchReader", "LazyIteration", "LoaderIterator", "deliveries", "start_iteration"]

_stats_logger = logging.getLogger("lance_prefetch.stats")


class BatchReader:
    """Reads the groups of one iteration of epoch ``epoch`` from ``source``.

    Args:
        source (RowSource): where the rows come from.
        epoch (int): the epoch read (for error messages).
        transform (Callable, optional): applied to each converted batch.
        retry (RetryPolicy, optional): the policy the reads are retried by (for error messages).
        telemetry (Telemetry): where each take is recorded.
        placement (Placement): pins each batch after ``transform`` (``pin_memory=True``).
    """

    def __init__(
        self,
        source: RowSource,
        *,
        epoch: int,
        transform: Callable[[dict[str, Any]], Any] | None,
        retry: RetryPolicy | None,
        telemetry: Telemetry,
        placement: Placement | None = None,
    ) -> None:
        placement = Placement() if placement is None else placement
        self._source, self._epoch, self._transform = source, epoch, transform
        self._retry, self._telemetry, self._placement = retry, telemetry, placement
        #: whether a cache serves some rows (a take's hits are counted then; without one, never)
        self._cache = source.cached is not None
        self._stopped = threading.Event()  # the iteration closed: convert nothing more

    def stop(self) -> None:
        """The iteration is over: a group being converted stops at its next batch (its
        results are dropped), so a close or an exit does not wait for a group's transforms."""
        self._stopped.set()

    def read(self, group: Group) -> Any:
        """The rows of a group of batches, read with one ``take`` (in a worker thread; retried
        by the prefetcher)."""
        source, indices = self._source, group.indices
        # what a cache serves (before the take); all once it is filled (it stays filled)
        cached = None
        if self._cache:
            cached = len(indices) if source.cached else source.cached_rows(indices)
        started = time.perf_counter()
        table = source.gather(indices)  # rows already as tensors: a filled memory cache
        if table is None:  # Arrow rows
            table = source.take(indices)
        self._telemetry.record_take(
            time.perf_counter() - started, table.nbytes, rows=table.num_rows, cached_rows=cached
        )
        return table

    def convert(self, group: Group, table: Any) -> list[Any]:
        """Split a group read by :meth:`read` into its batches, convert and transform each (same
        thread; not retried): a list of ``(rows, batch)``, or ending with the
        :class:`BatchLoadError` of a batch that failed (the batches before it are delivered)."""
        results: list[Any] = []
        if len(group.batches) > 1 and not isinstance(table, Gathered):
            table = gathered(table) or table  # dense columns: one conversion for the group
        pieces = split(table, group)
        if isinstance(table, Gathered) and self._transform is None and not self._placement.pinned:
            return [
                (batch.indices, piece.values)
                for batch, piece in zip(group.batches, pieces, strict=True)
            ]
        for batch, piece in zip(group.batches, pieces, strict=True):
            if self._stopped.is_set():
                break  # nobody will receive them
            try:
                with native_call(lance=False):  # a transform may run native code (torch)
                    tensors = piece.values if isinstance(piece, Gathered) else to_tensors(piece)
                    converted = tensors if self._transform is None else self._transform(tensors)
                    converted = self._placement.pin(converted)
            except Exception as exc:
                error = self._error(batch, exc, "in conversion or transform")
                error.__cause__ = exc
                results.append(error)
                break
            results.append((batch.indices, converted))
        return results

    def read_error(self, error: FetchError) -> BatchLoadError:
        """The error a batch whose read failed for good reaches the training loop as."""
        cause = error.__cause__
        attempts = error.attempts
        how = f"after {attempts} attempt{'s' if attempts > 1 else ''}"
        if self._retry is not None and attempts < self._retry.attempts:
            how += f" (not retried: {type(cause).__name__} is not transient)"
        return self._error(error.item, cause, how, attempts=attempts)

    def _error(
        self,
        batch: PlannedBatch | Group,
        error: BaseException | None,
        how: str,
        *,
        attempts: int | None = None,
    ) -> BatchLoadError:
        uri = redact_uri(self._source.uri)
        what = f"batch {batch.position}"
        if isinstance(batch, Group) and len(batch) > 1:  # one take read them all
            what = f"batches {batch.position}-{batch.batches[-1].position} (one coalesced take)"
        rows = len(batch.indices)
        return BatchLoadError(
            f"{what} of epoch {self._epoch} ({rows} row{'' if rows == 1 else 's'}) from "
            f"{uri!r} version {self._source.version} failed {how}: {type(error).__name__}: "
            f"{error}",
            epoch=self._epoch,
            position=batch.position,
            num_rows=rows,
            uri=uri,
            attempts=attempts,
        )


class LoaderIterator(Iterator[Any]):
    """The iterator ``iter(loader)`` returns: it drains a prefetcher of groups of batches (one
    ``take`` each) and hands the batches on one by one, giving back a readahead token as each is
    received.

    Args:
        start (Callable[..., DrainedPrefetcher]): starts the prefetcher when called with
            ``on_close=`` (a :class:`~lance_prefetch.schedule._blocking.BlockingPrefetcher`
            fetching the groups with ``reader.read`` in worker threads, or a
            :class:`~lance_prefetch.schedule._direct.DirectPrefetcher` reading them in ``next()``),
            each group processed by ``reader.convert``, one readahead unit per batch. This
            iterator holds it and closes it; every close of it (this iterator's, the end of the
            share, an error, garbage collection, the exit hook) ends the telemetry and drops what
            was read and not delivered.
        reader (BatchReader): names a failed read.
        counter (DeliveryCounter): counts the batches delivered.
        telemetry (Telemetry): this iteration's counters.
        log_every_s (float, optional): log the telemetry every this many seconds.
        tuner (DepthTuner, optional): with ``readahead="auto"``, observed at every batch.
        device (torch.device, optional): hand batches out on it, each copy issued one batch
            ahead (:class:`~lance_prefetch.convert._device.DeviceFeed`); a batch counts as delivered
            when handed out.
        audit (EpochAudit, optional): with ``audit=True``, records each batch handed out; at
            the share's end its check runs, and a failed one raises
            :class:`~lance_prefetch.CoverageError` from the last ``next()`` instead of
            ``StopIteration``.

    Cancellation handling: as the prefetcher's (``BlockingPrefetcher``): :meth:`close` cancels
    the reads not started, and waits for those running until ``close_wait_s`` (0.5 s) after it
    began; the batches read and not yet delivered are dropped.
    """

    def __init__(
        self,
        start: Callable[..., DrainedPrefetcher[list[Any]]],
        *,
        reader: BatchReader,
        counter: DeliveryCounter,
        telemetry: Telemetry,
        log_every_s: float | None,
        tuner: DepthTuner | None,
        device: Any = None,
        audit: EpochAudit | None = None,
    ) -> None:
        self._counter = counter
        self._reader = reader
        self._telemetry = telemetry
        self._log_every_s = log_every_s
        self._tuner = tuner
        self._audit = audit
        self._next_log = None if log_every_s is None else telemetry.started + log_every_s
        self._pending: collections.deque[Any] = collections.deque()  # the rest of a group
        # (row offsets, seconds waited) of batches received, not yet counted
        self._received: collections.deque[tuple[Any, float]] = collections.deque()
        self._feed = None if device is None else DeviceFeed(device, self._receive, self._count)
        self._pid = os.getpid()
        # Started last: a Ctrl-C held back during its start is raised at the end of start(), and
        # its close (run by garbage collection) runs on_close, which needs the state above.
        on_close = functools.partial(_closed, telemetry, reader, self._pending, self._feed)
        self._prefetcher = start(on_close=on_close)
        telemetry.attach(_statistics_of(weakref.ref(self)))  # weak: the loader keeps telemetry

    def __iter__(self) -> LoaderIterator:
        return self

    def __next__(self) -> Any:
        try:
            if self._feed is not None:
                return self._feed.next()
            item = self._receive()
        except StopIteration:
            if not self._prefetcher.exhausted:  # closed early: not the share's end
                raise
            self._counter.finished = True  # every batch of the share was handed out
            if self._audit is None:
                raise
        except Exception:
            self.close(wait=False)  # e.g. a device copy that failed: nothing after it
            raise
        else:
            self._count()
            return item
        self._audit.finish()  # the epoch's end: a failed check raises CoverageError (once)
        raise StopIteration

    def _count(self) -> None:
        indices, waited = self._received.popleft()
        self._telemetry.record_batch(len(indices), waited)
        self._counter.delivered += 1
        if self._audit is not None:
            self._audit.add(indices)

    def _receive(self) -> Any:
        """The next batch from the prefetcher (not yet counted as delivered)."""
        started = self._telemetry.begin_wait()
        prefetcher = self._prefetcher
        try:
            try:  # the rest of a group already read (close() from another thread may clear it;
                # in a forked copy, the prefetcher refuses instead)
                result = self._pending.popleft() if os.getpid() == self._pid else None
            except IndexError:
                result = None
            if result is None:
                # the token goes back at the end of this call, so that the next read does not
                # compete with it for the GIL
                results = prefetcher.get(release=False)
                result = results[0]
                self._pending.extend(results[1:])
            if isinstance(result, BatchLoadError):  # the batches before it were delivered
                self.close(wait=False)
                raise result
        except FetchError as error:
            self._telemetry.end()
            raise self._reader.read_error(error) from error.__cause__
        except BaseException:
            self._telemetry.end()
            raise
        indices, item = result
        now = self._telemetry.clock()
        self._received.append((indices, now - started))  # recorded when handed out (_count)
        tuner = self._tuner
        if tuner is not None:
            telemetry = self._telemetry
            bounds = tuner.observe(
                now, telemetry.waited, telemetry.rows, telemetry.bytes, telemetry.rows_read
            )
            if bounds is not None:
                prefetcher.resize(bounds.readahead, bounds.max_in_flight)
        if self._next_log is not None and now >= self._next_log:
            self._next_log = now + self._log_every_s  # type: ignore[operator]
            _stats_logger.info("%s", self._telemetry.snapshot())
        prefetcher.release(1)
        return item

    @property
    def closed(self) -> bool:
        """Whether the prefetcher was closed (by :meth:`close`, the share's end or an error)."""
        return self._prefetcher.closed

    def statistics(self) -> PrefetchStatistics:
        """The prefetcher's :class:`~lance_prefetch.schedule._prefetcher.PrefetchStatistics`."""
        return self._prefetcher.statistics()

    def close(self, *, wait: bool = True) -> None:
        """Close the prefetcher (see
        :meth:`~lance_prefetch.schedule._drained.DrainedPrefetcher.close`): the telemetry ends,
        the batches read and not delivered are dropped. Idempotent, from any thread."""
        self._prefetcher.close(wait=wait)

    def wait_for_reads(self, deadline: float) -> bool:
        """See :meth:`~lance_prefetch.schedule._drained.DrainedPrefetcher.wait_for_reads`."""
        return self._prefetcher.wait_for_reads(deadline)


def _closed(
    telemetry: Telemetry,
    reader: BatchReader,
    pending: collections.deque[Any],
    feed: DeviceFeed | None,
) -> None:
    """What every close of an iteration's prefetcher does first: the telemetry ends, a group
    being converted stops, and the batches read and not delivered are dropped (their tokens die
    with the prefetcher)."""
    telemetry.end()
    reader.stop()
    pending.clear()
    if feed is not None:
        feed.clear()


class LazyIteration:
    """What ``iter(loader)`` returns: an iteration that decides its epoch and starts reading at its
    first ``next()``, as a :class:`LoaderIterator` made by ``start()``. An iterator that is never
    advanced (a framework's check that the loader is iterable, a ``len()``, an iterator thrown
    away) reads nothing and uses up no epoch, and a ``set_epoch`` between ``iter()`` and the first
    ``next()`` still applies to it.

    Args:
        start (Callable[[], LoaderIterator]): begins the iteration (called once).
    """

    def __init__(self, start: Callable[[], LoaderIterator]) -> None:
        self._start = start
        self._iterator: LoaderIterator | None = None
        self._closed = False

    def __iter__(self) -> LazyIteration:
        return self

    def __next__(self) -> Any:
        iterator = self._iterator
        if iterator is None:
            if self._closed:
                raise StopIteration
            iterator = self.begin()
        return next(iterator)

    def begin(self) -> LoaderIterator:
        """Begin the iteration now (what the first ``next()`` does); the running iterator."""
        if self._iterator is None:
            self._iterator = self._start()
        return self._iterator

    @property
    def started(self) -> bool:
        """Whether the first ``next()`` has begun the iteration."""
        return self._iterator is not None

    @property
    def closed(self) -> bool:
        """Whether the iteration is over: closed, exhausted or failed (never before it began)."""
        return self._closed or (self._iterator is not None and self._iterator.closed)

    def close(self, *, wait: bool = True) -> None:
        """End the iteration; a running one is closed as :meth:`LoaderIterator.close` does
        (within :data:`~lance_prefetch.lifecycle._shutdown.CLOSE_WAIT_S`, 0.5 s, with ``wait``)."""
        self._closed = True
        if self._iterator is not None:
            self._iterator.close(wait=wait)

    def wait_for_reads(self, deadline: float) -> bool:
        """See :meth:`~lance_prefetch.schedule._drained.DrainedPrefetcher.wait_for_reads`."""
        return self._iterator is None or self._iterator.wait_for_reads(deadline)

    def __enter__(self) -> LazyIteration:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def statistics(self) -> PrefetchStatistics:
        """The running iteration's :class:`~lance_prefetch.schedule._prefetcher.PrefetchStatistics`
        (zeros before it began)."""
        if self._iterator is None:
            return PrefetchStatistics(held=0, in_flight=0, received=0)
        return self._iterator.statistics()


def start_iteration(
    source: RowSource,
    plan: EpochPlan,
    counter: DeliveryCounter,
    telemetry: Telemetry,
    *,
    rank: int | None,
    config: LoaderConfig,
    resolved: Resolved,
    audit: EpochAudit | None = None,
) -> LoaderIterator:
    """Start reading ``plan`` for ``rank`` (``None``: every rank's batches, in global order) and
    the worker share ``counter`` describes, in groups ramping up to ``resolved.coalesce`` batches
    (:func:`~lance_prefetch.plan._coalesce.groups`; fewer for a small share): with the
    ``readahead`` and ``max_in_flight`` of ``config``, or (``"auto"``) the bounds its tuner
    reached so far; batches placed as ``config.placement`` says, recorded by ``audit``."""
    readahead, max_in_flight, tuner = config.readahead, config.max_in_flight, resolved.tuner
    if tuner is not None:
        bounds = tuner.restart()
        readahead, max_in_flight = bounds.readahead, bounds.max_in_flight
    worker_id, num_workers, skip = counter.worker_id, counter.num_workers, counter.skip
    if rank is None:
        batches = plan.all_batches(worker_id=worker_id, num_workers=num_workers, skip=skip)
    else:
        batches = plan.rank_batches(rank, worker_id=worker_id, num_workers=num_workers, skip=skip)
    batches = deliveries(batches, plan)
    reader = BatchReader(
        source,
        epoch=plan.epoch,
        transform=config.transform,
        retry=config.read.retry,
        telemetry=telemetry,
        placement=config.placement,
    )
    start: Callable[..., DrainedPrefetcher[list[Any]]]
    if config.transform is None and source.ready:  # a filled memory cache
        tuner = None  # nothing is read ahead: no depth to tune
        start = functools.partial(
            DirectPrefetcher,
            groups(batches, resolved.coalesce),
            reader.read,
            process=reader.convert,
            readahead=int(readahead),
            max_in_flight=int(max_in_flight),
        )
    else:
        share = (plan.num_batches if rank is None else plan.batches_of(rank)) // num_workers
        size = share_size(resolved.coalesce, share, int(max_in_flight))
        prefetcher = Prefetcher(
            groups(batches, size, ramp=True),
            reader.read,
            process=reader.convert,
            readahead=int(readahead),
            max_in_flight=int(max_in_flight),
            retry=config.read.retry,
            size=len,
            hedge=resolved.hedge,
        )
        start = functools.partial(BlockingPrefetcher, prefetcher)
    return LoaderIterator(
        start,
        reader=reader,
        counter=counter,
        telemetry=telemetry,
        log_every_s=config.log_every_s,
        tuner=tuner,
        device=config.placement.device,
        audit=audit,
    )


def deliveries(batches: Iterator[PlannedBatch], plan: EpochPlan) -> Iterator[PlannedBatch]:
    """The planned batches an iteration reads and hands out, in order: ``batches`` as they are.

    A test seam (private): tests replace it (``monkeypatch.setattr(_iteration, "deliveries",
    ...)``, or in a DataLoader worker from ``worker_init_fn``) to hand a batch out twice or not
    at all, which the coverage audit must catch; the library never changes it.
    """
    return batches


def _statistics_of(
    iteration: weakref.ref[LoaderIterator],
) -> Callable[[], PrefetchStatistics | None]:
    """The statistics of a live iteration (``None`` once it is gone), for its telemetry."""

    def statistics() -> PrefetchStatistics | None:
        live = iteration()
        return None if live is None else live.statistics()

    return statistics
