"""Telemetry: what one iteration has delivered, how fast, and how long the training loop waited.

:class:`Telemetry` is fed by the iteration (the training thread records each batch it received and
the time ``next()`` waited for it; the worker threads record each ``take``'s duration and Arrow
bytes) and turns that into a :class:`LoaderStats` snapshot on demand. Recording is a clock read, a
few additions and a deque append under a lock (``benchmarks/telemetry.py`` times it), so it is
always on.
Nothing here does I/O or knows about Lance or torch.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, fields, replace

import numpy as np

from lance_prefetch.schedule._prefetcher import PrefetchStatistics

__all__ = ["LATENCIES", "LoaderStats", "Telemetry", "WINDOW_S"]

#: Seconds of the recent window of :class:`LoaderStats` (``rows_per_s``, ``mib_per_s``,
#: ``wait_fraction``).
WINDOW_S = 10.0

#: How many of the latest takes the latency percentiles cover.
LATENCIES = 1024

_MIB = float(1 << 20)

#: The statistics of an iteration before it runs and after it is gone: nothing held.
_NOTHING_RUNNING = PrefetchStatistics(held=0, in_flight=0, received=0)


@dataclass(frozen=True)
class LoaderStats:
    """A snapshot of one iteration of a :class:`~lance_prefetch.PrefetchLoader` in this process.

    "Recent" figures cover the last ``window_s`` seconds (:data:`WINDOW_S`, 10 s), or the whole
    iteration if it is younger; "total" ones the whole iteration, from ``iter(loader)`` to now (or
    to its end, once it is exhausted or closed).

    Attributes:
        epoch (int | None): the epoch being read; ``None`` before the first iteration in this
            process.
        worker_id (int | None): the DataLoader worker this iteration runs in; ``None`` in the main
            process.
        batches (int): batches delivered to the training loop.
        rows (int): rows in those batches.
        elapsed_s (float): seconds since ``iter(loader)``.
        rows_per_s (float): rows delivered per second, recent.
        rows_per_s_total (float): rows delivered per second, total.
        mib_per_s (float): MiB per second read by ``take`` (Arrow bytes, before conversion),
            recent.
        mib_per_s_total (float): the same, total.
        wait_fraction (float): fraction of wall time the training loop spent inside ``next()``
            waiting for a batch, recent, in ``[0, 1]`` (a wait still going on counts up to now).
        wait_fraction_total (float): the same, total.
        queue_depth (int): batches read and not yet received (ready in the queue).
        in_flight (int): takes running now.
        take_ms_p50 (float): median duration of the latest takes (up to :data:`LATENCIES`), in
            milliseconds; ``nan`` before the first take returned.
        take_ms_p95 (float): their 95th percentile, ms.
        take_ms_p99 (float): their 99th percentile, ms.
        retries (int): take attempts after a failed or timed-out one.
        hedges (int): hedged takes started: a second ``take`` of a late take's rows (``hedge``;
            at most the policy's ``budget`` x takes started).
        hedges_won (int): hedges that finished first, whose rows were used.
        cache_hit_ratio (float | None): fraction of the rows taken that the cache served
            (``cache="memory"``/``"disk"``; a take that waited for the cache's fill is a miss);
            ``None`` without a cache or before the first take.
        readahead (int): the readahead bound now, in batches (it moves with
            ``readahead="auto"``); 0 once the iteration is over.
        max_in_flight (int): the in-flight bound now, in takes (moves with
            ``max_in_flight="auto"``); 0 once the iteration is over.
        window_s (float): the recent window's length, seconds.
    """

    epoch: int | None = None
    worker_id: int | None = None
    batches: int = 0
    rows: int = 0
    elapsed_s: float = 0.0
    rows_per_s: float = 0.0
    rows_per_s_total: float = 0.0
    mib_per_s: float = 0.0
    mib_per_s_total: float = 0.0
    wait_fraction: float = 0.0
    wait_fraction_total: float = 0.0
    queue_depth: int = 0
    in_flight: int = 0
    take_ms_p50: float = math.nan
    take_ms_p95: float = math.nan
    take_ms_p99: float = math.nan
    retries: int = 0
    hedges: int = 0
    hedges_won: int = 0
    cache_hit_ratio: float | None = None
    readahead: int = 0
    max_in_flight: int = 0
    window_s: float = WINDOW_S

    def to_dict(self) -> dict[str, int | float | None]:
        """The snapshot as plain Python numbers, for a metrics logger or ``json.dumps``.

        One key per attribute above, in their order (``epoch``, ``worker_id``, ``batches``,
        ``rows``, ``elapsed_s``, ``rows_per_s``, ``rows_per_s_total``, ``mib_per_s``,
        ``mib_per_s_total``, ``wait_fraction``, ``wait_fraction_total``, ``queue_depth``,
        ``in_flight``, ``take_ms_p50``, ``take_ms_p95``, ``take_ms_p99``, ``retries``, ``hedges``,
        ``hedges_won``, ``cache_hit_ratio``, ``readahead``, ``max_in_flight``, ``window_s``),
        flat; each value an ``int``, a ``float`` or ``None``. A ``nan`` (the take latencies
        before the first take returned) is ``None``, so the dict passes
        ``json.dumps(..., allow_nan=False)``.

        Returns:
            dict[str, int | float | None]: a new dict; changing it changes nothing here.
        """
        return {field.name: _plain(getattr(self, field.name)) for field in fields(self)}

    def __str__(self) -> str:
        if self.epoch is None:
            return "no iteration in this process yet"
        where = "" if self.worker_id is None else f" worker {self.worker_id}"
        takes = (
            "no take returned yet"
            if math.isnan(self.take_ms_p50)
            else f"take p50/p95/p99 {self.take_ms_p50:.1f}/{self.take_ms_p95:.1f}/"
            f"{self.take_ms_p99:.1f} ms"
        )
        hedges = f", hedges {self.hedges} ({self.hedges_won} won)" if self.hedges else ""
        cache = "" if self.cache_hit_ratio is None else f", cache hits {self.cache_hit_ratio:.1%}"
        depths = (
            f", readahead {self.readahead}/in flight max {self.max_in_flight}"
            if self.readahead
            else ""
        )
        return (
            f"epoch {self.epoch}{where}: {self.batches} batches, {self.rows_per_s:,.0f} rows/s "
            f"({self.rows_per_s_total:,.0f} total), {self.mib_per_s:.1f} MiB/s, waited "
            f"{self.wait_fraction:.1%} ({self.wait_fraction_total:.1%} total), queue "
            f"{self.queue_depth}, in flight {self.in_flight}, {takes}, retries "
            f"{self.retries}{hedges}{cache}{depths}"
        )


class Telemetry:
    """The counters of one iteration.

    :meth:`record_batch` is called by the one consumer thread, :meth:`record_take` by worker
    threads (under a lock); :meth:`snapshot` from any thread.

    Args:
        epoch (int): the epoch the iteration reads.
        worker_id (int, optional): the DataLoader worker, or ``None``.
        window_s (float): the recent window, seconds. Default: :data:`WINDOW_S`.
        clock (Callable[[], float]): seconds, monotonic. Default: ``time.perf_counter``.
    """

    def __init__(
        self,
        epoch: int,
        worker_id: int | None = None,
        *,
        window_s: float = WINDOW_S,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.epoch, self.worker_id, self.window_s, self.clock = epoch, worker_id, window_s, clock
        self.started = clock()
        self.ended: float | None = None
        self.batches = self.rows = 0
        self.waited = 0.0
        # Each sample: (time, the totals before it); the recent window's sums are the totals
        # minus those of its first sample. Samples older than the window are dropped as new ones
        # come; both deques are guarded by _lock (snapshot() may run in another thread).
        self._batches: deque[tuple[float, int, float]] = deque()  # (time, rows, waited) before
        self._lock = threading.Lock()
        self.bytes = 0
        self._takes: deque[tuple[float, int]] = deque()  # (time, bytes before)
        self._latencies = np.full(LATENCIES, np.nan)
        self._next_latency = 0
        self._statistics: Callable[[], PrefetchStatistics | None] | None = None
        #: the iteration's last statistics read (its totals outlive it)
        self._last = _NOTHING_RUNNING
        self.rows_read = 0  # rows read by takes
        self.rows_taken = 0  # rows read by takes that said whether the cache served them
        self.rows_cached = 0
        self._waiting_since: float | None = None  # next() is waiting for a batch since then

    def attach(self, statistics: Callable[[], PrefetchStatistics | None]) -> None:
        """Where :meth:`snapshot` gets the iteration's
        :class:`~lance_prefetch.schedule._prefetcher.PrefetchStatistics` from while it runs
        (``ready`` is the queue depth; ``None`` once the iteration is gone: keep no strong
        reference to it here)."""
        self._statistics = statistics

    def begin_wait(self) -> float:
        """``next()`` starts waiting for a batch now (the time is returned): until
        :meth:`record_batch`, :meth:`snapshot` counts this wait as it goes, so a stalled loop shows
        as waiting."""
        now = self.clock()
        self._waiting_since = now
        return now

    def record_batch(self, rows: int, waited_s: float) -> None:
        """A batch of ``rows`` rows was delivered after ``next()`` waited ``waited_s`` seconds."""
        now = self.clock()
        self._waiting_since = None
        with self._lock:
            self._batches.append((now, self.rows, self.waited))
            _expire(self._batches, now - self.window_s)
            self.batches += 1
            self.rows += rows
            self.waited += waited_s

    def record_take(
        self, seconds: float, nbytes: int, *, rows: int = 0, cached_rows: int | None = None
    ) -> None:
        """A take returned ``nbytes`` Arrow bytes (``rows`` rows) after ``seconds`` (from a
        worker thread); ``cached_rows``: how many of them a cache served (``None``: no cache)."""
        now = self.clock()
        with self._lock:
            self.rows_read += rows
            if cached_rows is not None:
                self.rows_taken += rows
                self.rows_cached += cached_rows
            self._takes.append((now, self.bytes))
            _expire(self._takes, now - self.window_s)
            self.bytes += nbytes
            self._latencies[self._next_latency % LATENCIES] = seconds
            self._next_latency += 1

    def end(self) -> None:
        """The iteration is over: elapsed time stops here."""
        if self.ended is None:
            self.ended = self.clock()
            self._waiting_since = None
            self._prefetch_statistics()
            self._statistics = None  # nothing is queued or in flight for the user any more

    def _prefetch_statistics(self) -> PrefetchStatistics:
        """The running iteration's statistics; once it is gone, its totals (retries, hedges)
        with nothing queued or in flight and no bounds."""
        statistics = None if self._statistics is None else self._statistics()
        if statistics is None:
            return replace(self._last, held=0, in_flight=0, ready=0, readahead=0, max_in_flight=0)
        self._last = statistics
        return statistics

    def snapshot(self) -> LoaderStats:
        """The :class:`LoaderStats` now."""
        now = self.clock() if self.ended is None else self.ended
        elapsed = max(now - self.started, 1e-9)
        since = max(now - self.window_s, self.started)
        span = max(now - since, 1e-9)
        with self._lock:
            batches, rows, waited = self.batches, self.rows, self.waited
            first = _first_after(self._batches, since)
            recent_rows, recent_waited = (
                (0, 0.0) if first is None else (rows - first[1], waited - first[2])
            )
            first_take = _first_after(self._takes, since)
            recent_bytes = 0 if first_take is None else self.bytes - first_take[1]
            total_bytes = self.bytes
            latencies = self._latencies[~np.isnan(self._latencies)] * 1000.0
            hits = self.rows_cached / self.rows_taken if self.rows_taken else None
        waiting_since = self._waiting_since
        if waiting_since is not None and self.ended is None:  # a wait still going on
            waited += max(now - waiting_since, 0.0)
            recent_waited += max(now - max(waiting_since, since), 0.0)
        if latencies.size:
            p50, p95, p99 = (float(v) for v in np.percentile(latencies, [50, 95, 99]))
        else:
            p50 = p95 = p99 = math.nan
        prefetch = self._prefetch_statistics()
        return LoaderStats(
            epoch=self.epoch,
            worker_id=self.worker_id,
            batches=batches,
            rows=rows,
            elapsed_s=elapsed,
            rows_per_s=recent_rows / span,
            rows_per_s_total=rows / elapsed,
            mib_per_s=recent_bytes / _MIB / span,
            mib_per_s_total=total_bytes / _MIB / elapsed,
            wait_fraction=min(recent_waited / span, 1.0),
            wait_fraction_total=min(waited / elapsed, 1.0),
            queue_depth=prefetch.ready,
            in_flight=prefetch.in_flight,
            take_ms_p50=p50,
            take_ms_p95=p95,
            take_ms_p99=p99,
            retries=prefetch.retries,
            hedges=prefetch.hedges,
            hedges_won=prefetch.hedges_won,
            cache_hit_ratio=hits,
            readahead=prefetch.readahead,
            max_in_flight=prefetch.max_in_flight,
            window_s=self.window_s,
        )


def _plain(value: int | float | None) -> int | float | None:
    """``value`` as a plain ``int`` or ``float`` (``nan``: ``None``)."""
    if value is None or isinstance(value, int):
        return value
    value = float(value)
    return None if math.isnan(value) else value


def _expire(samples: deque, before: float) -> None:  # type: ignore[type-arg]
    while samples and samples[0][0] <= before:
        samples.popleft()


def _first_after(samples: deque, since: float) -> tuple | None:  # type: ignore[type-arg]
    """The first sample later than ``since`` (the few older ones not yet dropped are skipped)."""
    for sample in samples:
        if sample[0] > since:
            return sample  # type: ignore[no-any-return]
    return None
