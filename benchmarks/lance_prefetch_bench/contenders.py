"""The contenders, and how one of them is measured (this runs in the contender's own process).

Every contender reads the same dataset version and columns. All but ``lance-torch`` read the same
batches: the first ``batches`` batches of :class:`~lance_prefetch.plan.sampling.EpochPlan` for
``(seed, epoch)`` (one rank, ``drop_last=True``), so each epoch they read the same rows, in the same
batches, in the same order. Each contender:

1. is built (``setup_s``: opening the dataset; nothing read yet);
2. warms up: reads ``warmup_batches`` batches of :data:`WARMUP_EPOCH`, not counted
   (``warmup_s``; for ``map-style`` this starts its worker processes; ``cold_first_batch_s``:
   from the first ``iter()`` to the first batch); a ``lance-prefetch`` setting with a cache
   then waits for its fill, started by that ``iter()`` in the background (``fill_s``: from that
   ``iter()`` to the fill's end), so the timed passes read the filled cache;
3. **throughput pass**: reads ``batches`` batches of :data:`THROUGHPUT_EPOCH` as fast as it can;
4. **step pass**: reads ``batches`` batches of :data:`STEP_EPOCH`, sleeping ``step_ms`` after
   each one, as a training step would (not for ``ceiling``, which has no training loop).

==================  ===================================================================================
contender           what it runs
==================  ===================================================================================
``sequential``      ``dataset.take(indices, columns)`` then the same Arrow-to-torch conversion as the
                    loader (:func:`~lance_prefetch.convert.to_tensors`), one batch after the other
``map-style``       a map-style ``Dataset`` whose ``__getitems__`` calls ``take`` and converts, under
                    ``DataLoader(batch_size=B, num_workers=4, multiprocessing_context="spawn",
                    persistent_workers=True)``; instead of ``shuffle=True`` (a ``RandomSampler``) its
                    sampler yields the plan's permutation, so its batches are the plan's
``lance-torch``     ``lance.torch.data.LanceDataset`` with ``ShardedBatchSampler(randomize=True)``:
                    pseudo-random (contiguous ranges of ``B`` rows in shuffled order, the same order
                    every epoch), so it cannot read the plan's batches
``ceiling``         the raw ``take`` calls of the plan's batches, all submitted at once to a thread pool
                    of each of ``concurrency`` sizes (``ceiling_repeats`` times each, the best
                    run counts); no queue, no conversion, no torch
``coalesced-ceiling`` the loader's defaults' own takes (``coalesce`` batches a take, through its
                    source and reader: io_uring where ``io="auto"`` picks it), ``max_in_flight``
                    at once (each of ``concurrency`` for ``"auto"``); no queue, no conversion
                    (:mod:`~lance_prefetch_bench._ceiling`): the limit of its take path
``scan``            Lance's sequential scan (``dataset.to_batches(batch_size=B, columns,
                    batch_readahead=16)``) then ``to_tensors``: the disk order, not uniform; the
                    scan speed the uniform readers are measured against
``lance-prefetch``  :class:`~lance_prefetch.PrefetchLoader` with ``readahead`` and ``max_in_flight``
``prefetch-workers`` the same loader inside ``DataLoader(batch_size=None, num_workers=W, spawn,
                    persistent_workers=True)``: each worker prefetches its share of the batches
``lance-map``       :class:`~lance_prefetch.LanceMapDataset` (one ``take`` per batch through
                    ``__getitems__``) with :func:`~lance_prefetch.collate`, under the same DataLoader as
                    ``map-style`` (plan sampler, ``num_workers``, spawn, persistent)
``lance-map-rows``  the same dataset read row by row (``__getitem__``: one ``take`` per row) and the
                    default collate: what a map-style dataset costs without ``__getitems__``
``grain``           Grain's global index shuffle, one ``take`` per index batch (a peer loader)
``spdl``            the plan's batches through an SPDL pipeline with a concurrent ``take`` stage
``lancedb-streaming`` LanceDB's ``StreamingDataset`` under a ``DataLoader``; the three peers need
                    the ``peers`` extra (:mod:`~lance_prefetch_bench._peer_contenders`)
==================  ===================================================================================

``prefetch-workers`` to ``lance-map-rows`` are not run unless asked for (``--contenders``; ``peers`` names the last three);
``docs/choosing.md`` uses ``prefetch-workers``, ``lance-map`` and ``lance-map-rows``.
``lance-prefetch`` also runs once with none of its tuning arguments (``defaults``).

What a pass measures (times from :func:`time.perf_counter`):

- ``rows_per_s``, ``batches_per_s``, ``mib_per_s``: rows, batches and bytes delivered (tensor bytes
  of numeric columns; Arrow bytes for ``ceiling``) divided by the time from ``iter()`` to the last
  batch's arrival, so the pipeline's fill is included;
- ``first_batch_s``: from ``iter()`` to the first batch;
- ``take_p50_ms``, ``take_p99_ms``, ``take_mean_ms``: duration of each ``take`` call (``None`` for
  ``lance-torch``, which scans);
- ``wait_fraction`` (step pass): time spent in ``next()`` waiting for batches 2..n divided by the
  wall time from the first batch's arrival to the end of the last step (the first batch's wait is
  ``first_batch_s``, paid once per epoch).
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from lance_prefetch import DiskCache, MemoryCache
from lance_prefetch.convert import to_tensors
from lance_prefetch_bench._map_contenders import LanceMap, LanceMapRows, MapStyle
from lance_prefetch_bench._measure import measure_pass, peak_rss_mib, rss_mib
from lance_prefetch_bench._peer_contenders import Grain, LanceDBStreaming, Spdl
from lance_prefetch_bench._spec import (
    STEP_EPOCH,
    THROUGHPUT_EPOCH,
    WARMUP_EPOCH,
    ContenderSpec,
    build_loader,
    close_iterator,
    open_dataset,
    plan_batches,
)

__all__ = ["run_contender"]

# -- the contenders ------------------------------------------------------------------------------
# Each has setup(), iterate(epoch, count) -> Iterator[(batch dict, offsets or None)], close(),
# and appends the duration of every take call, in seconds, to self.latencies.


class _Sequential:
    notes: tuple[str, ...] = ("one take per batch in a plain loop, then to_tensors",)

    def __init__(self, spec: ContenderSpec) -> None:
        self.spec = spec
        self.latencies: list[float] = []

    def setup(self) -> None:
        self.dataset = open_dataset(self.spec)

    def iterate(self, epoch: int, count: int) -> Iterator[tuple[dict, np.ndarray | None]]:
        for indices in plan_batches(self.spec, epoch, count):
            started = time.perf_counter()
            table = self.dataset.take(indices, columns=self.spec.columns)
            self.latencies.append(time.perf_counter() - started)
            yield to_tensors(table), indices

    def close(self) -> None:
        pass


class _LanceTorch:
    notes = (
        "pseudo-random: ShardedBatchSampler(randomize=True) shuffles contiguous ranges of "
        "batch_size rows; rows inside a batch stay in disk order; the same order every epoch",
        "not the plan's batches, so it is left out of the same-ids check",
    )

    def __init__(self, spec: ContenderSpec) -> None:
        self.spec = spec
        self.latencies: list[float] = []  # stays empty: it scans, there is no take to time

    def setup(self) -> None:
        from lance.sampler import ShardedBatchSampler
        from lance.torch.data import LanceDataset

        self.sampler = ShardedBatchSampler(0, 1, randomize=True, seed=self.spec.seed)
        self.dataset = LanceDataset(
            open_dataset(self.spec),
            batch_size=self.spec.batch_size,
            columns=list(self.spec.columns),
            sampler=self.sampler,
            batch_readahead=self.spec.lance_torch_readahead,
        )

    def iterate(self, epoch: int, count: int) -> Iterator[tuple[dict, np.ndarray | None]]:
        self.sampler.set_epoch(epoch)
        iterator = iter(self.dataset)
        try:
            for _ in range(count):
                batch = next(iterator)
                if not isinstance(batch, dict):  # one column comes back as a bare tensor
                    batch = {self.spec.columns[0]: batch}
                yield batch, None
        finally:
            close_iterator(iterator)

    def close(self) -> None:
        pass


class _Scan:
    notes = (
        "Lance's sequential scan in disk order (not uniform): the scan-speed reference; not the "
        "plan's batches, so it is left out of the same-ids check",
    )

    def __init__(self, spec: ContenderSpec) -> None:
        self.spec = spec
        self.latencies: list[float] = []  # stays empty: it scans, there is no take to time

    def setup(self) -> None:
        self.dataset = open_dataset(self.spec)

    def iterate(self, epoch: int, count: int) -> Iterator[tuple[dict, np.ndarray | None]]:
        import pyarrow as pa

        batches = self.dataset.to_batches(
            columns=list(self.spec.columns),
            batch_size=self.spec.batch_size,
            batch_readahead=self.spec.lance_torch_readahead,
        )
        iterator = iter(batches)
        try:
            for _ in range(count):
                yield to_tensors(pa.Table.from_batches([next(iterator)])), None
        finally:
            close_iterator(iterator)

    def close(self) -> None:
        pass


class _TimedSource:
    """Wraps the loader's ``LanceSource`` to time each ``take`` (thread-safe appends)."""

    def __init__(self, source: Any, latencies: list[float]) -> None:
        self._wrapped = source
        self._latencies = latencies

    def take(self, indices: np.ndarray) -> Any:
        started = time.perf_counter()
        try:
            return self._wrapped.take(indices)
        finally:
            self._latencies.append(time.perf_counter() - started)  # list.append is atomic

    def __getattr__(self, name: str) -> Any:
        return getattr(self._wrapped, name)


class _LancePrefetch:
    def __init__(self, spec: ContenderSpec) -> None:
        self.spec = spec
        self.latencies: list[float] = []
        self.notes: tuple[str, ...] = ()
        self.pass_stats: dict[int, Any] = {}  # epoch -> loader.stats() at the pass's end

    def setup(self) -> None:

        spec = self.spec
        cache: MemoryCache | DiskCache | None = None
        if spec.cache == "memory":
            cache = MemoryCache()
        elif spec.cache == "disk":
            self._cache_dir = tempfile.TemporaryDirectory(prefix="lance-bench-cache-")
            cache = DiskCache(dir=self._cache_dir.name)
        self.loader = build_loader(spec, cache)
        if hasattr(self.loader, "_source"):  # the loader's own take calls, timed
            self.loader._source = _TimedSource(self.loader._source, self.latencies)
        else:  # pragma: no cover - the loader's internals moved
            self.notes = ("take latency not measured: PrefetchLoader has no _source",)

    def iterate(self, epoch: int, count: int) -> Iterator[tuple[dict, np.ndarray | None]]:
        self.loader.set_epoch(epoch)
        iterator = iter(self.loader)
        try:
            for indices in plan_batches(self.spec, epoch, count):
                yield next(iterator), indices
        finally:
            self.pass_stats[epoch] = self.loader.stats()
            iterator.close()

    def close(self) -> None:
        self.loader.close()
        cache_dir = getattr(self, "_cache_dir", None)
        if cache_dir is not None:
            cache_dir.cleanup()


class _PrefetchWorkers(_LancePrefetch):
    def setup(self) -> None:
        from torch.utils.data import DataLoader

        super().setup()
        self.notes = (
            f"{self.spec.num_workers} spawn workers, each prefetching its share; take latency "
            "not measured (the takes run in the workers)",
        )
        self.loader._source = self.loader._source._wrapped  # workers can't report timings back
        self.dataloader = DataLoader(
            self.loader,
            batch_size=None,
            num_workers=self.spec.num_workers,
            multiprocessing_context="spawn",
            persistent_workers=True,
        )

    def iterate(self, epoch: int, count: int) -> Iterator[tuple[dict, np.ndarray | None]]:
        self.loader.set_epoch(epoch)
        planned = plan_batches(self.spec, epoch, count)
        yield from zip(self.dataloader, planned, strict=False)

    def close(self) -> None:
        iterator = getattr(self.dataloader, "_iterator", None)
        if iterator is not None:
            iterator._shutdown_workers()


_CONTENDERS: dict[str, Callable[[ContenderSpec], Any]] = {
    "sequential": _Sequential,
    "map-style": MapStyle,
    "lance-torch": _LanceTorch,
    "scan": _Scan,
    "lance-prefetch": _LancePrefetch,
    "prefetch-workers": _PrefetchWorkers,
    "lance-map": LanceMap,
    "lance-map-rows": LanceMapRows,
    "grain": Grain,
    "spdl": Spdl,
    "lancedb-streaming": LanceDBStreaming,
}


_WORKER_KINDS = ("map-style", "prefetch-workers", "lance-map", "lance-map-rows")


def _run_iterating(spec: ContenderSpec, tick: Callable[[], None]) -> dict[str, Any]:
    contender = _CONTENDERS[spec.kind](spec)
    started = time.perf_counter()
    contender.setup()
    setup_s = time.perf_counter() - started
    cold_first_batch_s = fill_s = None
    try:
        started = time.perf_counter()
        if spec.warmup_batches:
            count = spec.warmup_batches
            if spec.kind in _WORKER_KINDS:  # one batch per worker, so every worker has started
                count = max(count, spec.num_workers)
            for _ in contender.iterate(WARMUP_EPOCH, count):
                if cold_first_batch_s is None:
                    cold_first_batch_s = time.perf_counter() - started
        if spec.cache != "none" and hasattr(contender, "loader"):  # timed passes: filled
            contender.loader._source.fill()
            fill_s = time.perf_counter() - started
        warmup_s = time.perf_counter() - started
        common = {
            "kind": spec.kind,
            "batches": spec.batches,
            "id_column": spec.id_column,
            "record_ids": spec.record_ids,
            "tick": tick,
        }
        throughput, ids_0 = measure_pass(contender, epoch=THROUGHPUT_EPOCH, step_s=0.0, **common)
        step, ids_1 = measure_pass(
            contender, epoch=STEP_EPOCH, step_s=spec.step_ms / 1000, **common
        )
    finally:
        contender.close()
    notes = list(contender.notes)
    # lance-prefetch's own telemetry (in this process; DataLoader workers keep theirs)
    stats = getattr(contender, "pass_stats", {}).get(STEP_EPOCH)
    if stats is not None and stats.epoch is not None:
        notes.append(f"loader.stats() at the end of the step pass: {stats}")
    coalesce = getattr(getattr(contender, "loader", None), "coalesce", None)
    return {
        "io": _reader_io(spec, contender),
        **({"coalesce": coalesce} if isinstance(coalesce, int) else {}),
        "setup_s": setup_s,
        "warmup_s": warmup_s,
        "cold_first_batch_s": cold_first_batch_s,
        "fill_s": fill_s,
        "passes": {"throughput": throughput, "step": step},
        "ids": {str(THROUGHPUT_EPOCH): ids_0, str(STEP_EPOCH): ids_1},
        "notes": notes,
    }


def _reader_io(spec: ContenderSpec, contender: Any) -> str:
    """The reader the contender's takes went through: ``"uring"`` (Lance's io_uring reader) or
    ``"default"``; the library's own readers say which they use (``io="auto"`` picks io_uring
    on local files where the kernel allows it)."""
    loader = getattr(contender, "loader", None)
    for owner in (getattr(loader, "_source", None), getattr(contender, "map_dataset", None)):
        io = getattr(owner, "io", None)
        if io in ("uring", "default"):
            return io
    return "uring" if spec.uri.startswith("file+uring://") else "default"


def run_contender(spec: ContenderSpec, tick: Callable[[], None] | None = None) -> dict[str, Any]:
    """Run one contender in this process and return its measurements (a JSON-able dict).

    Args:
        spec (ContenderSpec): what to run.
        tick (Callable[[], None], optional): called after each timed batch. Default: ``None``.

    Returns:
        dict: ``setup_s``, ``warmup_s``, ``passes`` (``throughput`` and, except for
        the ceilings, ``step``: the metrics listed in this module's docstring), ``ids`` (per
        epoch, see :func:`~lance_prefetch_bench._measure.ids_record`), ``io`` (the reader its
        takes went through: ``"uring"`` or ``"default"``), ``notes``, ``peak_rss_self_mib``
        (this process's peak resident memory) and ``rss_before_mib`` (its resident memory before
        the contender was built); the ceilings add ``sweep`` and ``best_concurrency``,
        ``coalesced-ceiling`` also ``coalesce`` (batches a take).
    """
    tick = tick or (lambda: None)
    rss_before = rss_mib()
    if spec.kind == "ceiling":
        from lance_prefetch_bench._ceiling import run_ceiling

        result = run_ceiling(spec, tick)
        result["io"] = _reader_io(spec, None)
    elif spec.kind == "coalesced-ceiling":
        from lance_prefetch_bench._ceiling import run_coalesced_ceiling

        result = run_coalesced_ceiling(spec, tick)
    else:
        result = _run_iterating(spec, tick)
    result["rss_before_mib"] = rss_before
    result["peak_rss_self_mib"] = peak_rss_mib()
    return result
