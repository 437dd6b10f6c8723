"""Trace what an epoch plan allocates, in a process of its own (nothing else allocates there),
for tests/test_memory.py:

    python plan_memory.py '{"world_size": 4, "drop_last": false, "num_workers": 2}'

For 100,000 and 10,000,000 rows (after one call that puts first-call allocations out of the
way), builds the ``EpochPlan`` and iterates every batch of rank 1 (the last worker when
``num_workers`` is given) under tracemalloc, and prints one JSON object:
``{num_rows: {"peak", "current", "rows", "worker_rows", "itemsize"}}``.
"""

from __future__ import annotations

import json
import sys
import tracemalloc

from lance_prefetch.plan.sampling import EpochPlan, index_dtype


def allocations(num_rows: int, plan: dict) -> dict[str, int]:
    num_workers = int(plan.get("num_workers", 1))
    options = {key: value for key, value in plan.items() if key != "num_workers"}
    tracemalloc.start()
    try:
        epoch_plan = EpochPlan(num_rows=num_rows, batch_size=1024, seed=1, epoch=2, **options)
        rows = 0
        for batch in epoch_plan.rank_batches(1, worker_id=num_workers - 1, num_workers=num_workers):
            rows += len(batch.indices)
        current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    local = range(num_workers - 1, epoch_plan.batches_per_rank, num_workers)
    last = epoch_plan.batches_per_rank - 1
    expected = sum(
        epoch_plan.last_batch_size if j == last else epoch_plan.batch_size for j in local
    )
    return {
        "peak": peak,
        "current": current,
        "rows": rows,
        "worker_rows": expected,
        "itemsize": index_dtype(num_rows).itemsize,
    }


def main() -> None:
    plan = json.loads(sys.argv[1])
    allocations(100_000, plan)  # first-call allocations (imports, caches) out of the way
    print(json.dumps({n: allocations(n, plan) for n in (100_000, 10_000_000)}))  # noqa: T201


if __name__ == "__main__":
    main()
