"""The ceilings: takes submitted at once to a thread pool, timed until the last returns (no queue,
conversion or torch), at several pool sizes; the best run is the reported pass.

- ``ceiling``: one ``take`` a batch (the plan's batches), through ``dataset.take``.
- ``coalesced-ceiling``: the takes the loader's defaults issue, through the loader's own source
  (its reader: io_uring where ``io="auto"`` picks it): ``coalesce`` consecutive batches of the
  plan a take, their offsets laid end to end, ``max_in_flight`` at once (each value of
  ``concurrency`` when it is ``"auto"``): the limit of the loader's take path.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Any

import numpy as np

from lance_prefetch_bench._measure import MIB, ids_record, latency_stats
from lance_prefetch_bench._spec import (
    THROUGHPUT_EPOCH,
    WARMUP_EPOCH,
    ContenderSpec,
    build_loader,
    open_dataset,
    plan_batches,
)

__all__ = ["coalesced_takes", "run_ceiling", "run_coalesced_ceiling"]


def run_ceiling(spec: ContenderSpec, tick: Callable[[], None]) -> dict[str, Any]:
    """For each pool size in ``spec.concurrency``, ``spec.ceiling_repeats`` times, submit every
    ``take`` of the throughput pass's batches at once to a pool of that many threads and time them
    until the last one returns (no queue, conversion or torch). The pass reported is the run with
    the most rows/s: an upper bound.

    Raises:
        RuntimeError: two pool sizes read different rows (the bookkeeping is broken).
    """
    started = time.perf_counter()
    dataset = open_dataset(spec)
    setup_s = time.perf_counter() - started
    started = time.perf_counter()
    for indices in plan_batches(spec, WARMUP_EPOCH, spec.warmup_batches):
        dataset.take(indices, columns=spec.columns)
    warmup_s = time.perf_counter() - started
    planned = plan_batches(spec, THROUGHPUT_EPOCH, spec.batches)

    def take(indices: np.ndarray) -> Any:
        return dataset.take(indices, columns=spec.columns)

    result = _sweep(spec, take, planned, list(spec.concurrency), tick, batch_rows=spec.batch_size)
    result["notes"] = [
        f"raw takes, one a batch, all submitted at once to a pool of c threads; the best of "
        f"{spec.ceiling_repeats} run(s) for each c in {list(spec.concurrency)}; no training "
        f"loop, so no step pass"
    ]
    return {"setup_s": setup_s, "warmup_s": warmup_s, **result}


def coalesced_takes(
    batches: list[np.ndarray], coalesce: int, concurrency: int, keep: int
) -> list[np.ndarray]:
    """The offsets of each take of the coalesced ceiling: ``batches`` (one epoch's, in plan order)
    in groups of ``coalesce`` consecutive ones laid end to end (the last group may be smaller),
    as many groups as cover the first ``keep`` batches and at least two for each of
    ``concurrency`` threads, within the epoch."""
    wanted = max(math.ceil(keep / coalesce), 2 * concurrency)
    starts = range(0, len(batches), coalesce)[:wanted]
    return [np.concatenate(batches[start : start + coalesce]) for start in starts]


def run_coalesced_ceiling(spec: ContenderSpec, tick: Callable[[], None]) -> dict[str, Any]:
    """The takes of a ``PrefetchLoader`` built as the spec says (its defaults with
    ``spec.defaults``), of the size it resolves (``loader.coalesce`` batches, fewer for a small
    epoch as the loader does), read through its own source, ``max_in_flight`` at a time (each
    of ``spec.concurrency`` when ``"auto"``), ``spec.ceiling_repeats`` times; the best run counts.
    The ids recorded are those of the first ``spec.batches`` batches (the plan's).

    Raises:
        RuntimeError: two runs read different rows.
    """
    from lance_prefetch.plan._coalesce import share_size

    started = time.perf_counter()
    loader = build_loader(spec)
    source, tuner = loader._source, loader._resolved.tuner
    max_in_flight = loader.read.max_in_flight
    start_level = tuner.bounds().max_in_flight if tuner is not None else int(max_in_flight)
    epoch_batches = spec.num_rows // spec.batch_size
    coalesce = share_size(loader.coalesce, epoch_batches, int(start_level))
    pools = list(spec.concurrency) if max_in_flight == "auto" else [int(max_in_flight)]
    setup_s = time.perf_counter() - started
    started = time.perf_counter()
    for indices in plan_batches(spec, WARMUP_EPOCH, spec.warmup_batches):
        source.take(indices)
    warmup_s = time.perf_counter() - started
    batches = plan_batches(spec, THROUGHPUT_EPOCH, epoch_batches)
    takes = coalesced_takes(batches, coalesce, max(pools), spec.batches)
    result = _sweep(
        spec, source.take, takes, pools, tick, batch_rows=spec.batch_size, keep=spec.batches
    )
    rows = coalesce * spec.batch_size
    result["io"] = source.io
    result["coalesce"] = coalesce
    result["notes"] = [
        f"the loader's takes ({'its defaults' if spec.defaults else 'the setting'}): "
        f"{coalesce} batches ({rows:,} rows) a take through its own source ({source.io} reader), "
        f"{len(takes)} takes all submitted at once to a pool of c threads; the best of "
        f"{spec.ceiling_repeats} run(s) for each c in {pools}"
        + (" (max_in_flight='auto' moves within them)" if len(pools) > 1 else "")
        + "; no conversion, no training loop, so no step pass"
    ]
    loader.close()
    return {"setup_s": setup_s, "warmup_s": warmup_s, **result}


def _sweep(
    spec: ContenderSpec,
    take: Callable[[np.ndarray], Any],
    planned: list[np.ndarray],
    pools: list[int],
    tick: Callable[[], None],
    *,
    batch_rows: int,
    keep: int | None = None,
) -> dict[str, Any]:
    """Time ``take`` of every offsets array of ``planned``, all submitted at once to a pool of
    each size in ``pools``, ``spec.ceiling_repeats`` times; the run with the most rows/s is the
    throughput pass. The ids of the first ``keep`` batches of ``batch_rows`` rows are recorded
    (``None``: every take's rows as one batch each)."""

    def timed_take(indices: np.ndarray) -> tuple[Any, float]:
        began = time.perf_counter()
        table = take(indices)
        return table, time.perf_counter() - began

    sweep, ids = [], None
    runs = [(c, repeat) for c in pools for repeat in range(spec.ceiling_repeats)]
    for concurrency, repeat in runs:
        tables: list[Any] = [None] * len(planned)
        latencies = []
        first = None
        began = time.perf_counter()
        with ThreadPoolExecutor(concurrency, thread_name_prefix="ceiling") as pool:
            futures = {pool.submit(timed_take, indices): i for i, indices in enumerate(planned)}
            for future in as_completed(futures):
                tables[futures[future]], took = future.result()
                latencies.append(took)
                first = first if first is not None else time.perf_counter() - began
                tick()
            seconds = time.perf_counter() - began
        record = _ids(spec, tables, planned, batch_rows=batch_rows, keep=keep)
        if ids is not None and record["batches_sha256"] != ids["batches_sha256"]:
            raise RuntimeError(f"the ceiling read other rows with {concurrency} threads")
        ids = record
        rows = sum(table.num_rows for table in tables)
        sweep.append(
            {
                "concurrency": concurrency,
                "repeat": repeat,
                "epoch": THROUGHPUT_EPOCH,
                "batches": rows // batch_rows,
                "rows": rows,
                "seconds": seconds,
                "rows_per_s": rows / seconds,
                "batches_per_s": rows / batch_rows / seconds,
                "mib_per_s": sum(table.nbytes for table in tables) / MIB / seconds,
                "first_batch_s": first,
                **latency_stats(latencies),
            }
        )
        del tables
    best = max(sweep, key=lambda point: point["rows_per_s"])
    return {
        "passes": {"throughput": best},
        "sweep": sweep,
        "best_concurrency": best["concurrency"],
        "ids": {str(THROUGHPUT_EPOCH): ids},
    }


def _ids(
    spec: ContenderSpec,
    tables: list[Any],
    planned: list[np.ndarray],
    *,
    batch_rows: int,
    keep: int | None,
) -> dict[str, Any]:
    """The ids record of the takes' rows, cut into batches of ``batch_rows`` (the first ``keep``
    of them; ``None``: one batch a take)."""
    has_ids = spec.id_column is not None and spec.id_column in tables[0].column_names
    per_take = [
        table.column(spec.id_column).to_numpy() if has_ids else indices
        for table, indices in zip(tables, planned, strict=True)
    ]
    if keep is not None:
        rows = np.concatenate(per_take)[: keep * batch_rows]
        per_take = [rows[i : i + batch_rows] for i in range(0, rows.size, batch_rows)]
    return ids_record(
        per_take,
        epoch=THROUGHPUT_EPOCH,
        source="id column" if has_ids else "offsets",
        record=spec.record_ids,
    )
