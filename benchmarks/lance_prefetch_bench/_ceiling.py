"""The ``ceiling`` contender: the plan's raw takes from a thread pool, at several pool sizes."""

from __future__ import annotations

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
    open_dataset,
    plan_batches,
)


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

    def timed_take(indices: np.ndarray) -> tuple[Any, float]:
        began = time.perf_counter()
        table = dataset.take(indices, columns=spec.columns)
        return table, time.perf_counter() - began

    sweep, ids = [], None
    runs = [(c, repeat) for c in spec.concurrency for repeat in range(spec.ceiling_repeats)]
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
        has_ids = spec.id_column is not None and spec.id_column in tables[0].column_names
        per_batch = [
            table.column(spec.id_column).to_numpy() if has_ids else indices
            for table, indices in zip(tables, planned, strict=True)
        ]
        record = ids_record(
            per_batch,
            epoch=THROUGHPUT_EPOCH,
            source="id column" if has_ids else "offsets",
            record=spec.record_ids,
        )
        if ids is not None and record["batches_sha256"] != ids["batches_sha256"]:
            raise RuntimeError(f"ceiling read other rows with {concurrency} threads")
        ids = record
        rows = sum(table.num_rows for table in tables)
        sweep.append(
            {
                "concurrency": concurrency,
                "repeat": repeat,
                "epoch": THROUGHPUT_EPOCH,
                "batches": len(planned),
                "rows": rows,
                "seconds": seconds,
                "rows_per_s": rows / seconds,
                "batches_per_s": len(planned) / seconds,
                "mib_per_s": sum(table.nbytes for table in tables) / MIB / seconds,
                "first_batch_s": first,
                **latency_stats(latencies),
            }
        )
        del tables
    best = max(sweep, key=lambda point: point["rows_per_s"])
    return {
        "setup_s": setup_s,
        "warmup_s": warmup_s,
        "passes": {"throughput": best},
        "sweep": sweep,
        "best_concurrency": best["concurrency"],
        "ids": {str(THROUGHPUT_EPOCH): ids},
        "notes": [
            f"raw takes, all submitted at once to a pool of c threads; the best of "
            f"{spec.ceiling_repeats} run(s) for each c in {list(spec.concurrency)}; no training "
            f"loop, so no step pass"
        ],
    }
