"""Time and memory of the two permutation kinds (pure planning: no Lance, no I/O).

For ``--rows`` rows (10 million by default), each kind produces every batch of one epoch
(``EpochPlan.rank_batches``, one rank, ``--batch-size`` rows); the script prints the time to the
first batch, the whole epoch in nanoseconds a row (best of ``--repeat``), and the peak memory
allocated meanwhile (tracemalloc, in a separate untimed pass). Then, for the lazy kind at
``--big-rows`` (1e9), the peak memory of building plans and reading batches at the start, middle
and end of the epoch, also resumed on another world size (as ``tests/test_permutation.py``
measures it). Run::

    .venv/bin/python benchmarks/permutation.py [--rows 10000000] [--batch-size 256]
"""

from __future__ import annotations

import argparse
import itertools
import time
import tracemalloc

from lance_prefetch.plan.sampling import EpochPlan

MIB = 2**20


def epoch(num_rows: int, batch_size: int, kind: str) -> tuple[float, float]:
    """Seconds to the first batch and to the last one of an epoch."""
    start = time.perf_counter()
    plan = EpochPlan(num_rows=num_rows, batch_size=batch_size, permutation_kind=kind)
    batches = plan.rank_batches(0)
    next(batches)
    first = time.perf_counter() - start
    for _ in batches:
        pass
    return first, time.perf_counter() - start


def peak_mib(work) -> float:
    tracemalloc.start()
    try:
        work()
        return tracemalloc.get_traced_memory()[1] / MIB
    finally:
        tracemalloc.stop()


def start_middle_end(num_rows: int) -> None:
    plan = EpochPlan(num_rows=num_rows, batch_size=1000, world_size=8, drop_last=False)
    for position in (0, plan.num_batches // 2, plan.end - 1):
        plan.batch(position)
    for _ in itertools.islice(plan.rank_batches(3, worker_id=1, num_workers=2, skip=7), 20):
        pass
    resumed = EpochPlan(
        num_rows=num_rows,
        batch_size=1000,
        world_size=3,
        drop_last=False,
        start=plan.num_batches // 2 + 4,
    )
    for _ in itertools.islice(resumed.rank_batches(2), 20):
        pass
    list(resumed.rank_batches(2, skip=resumed.batches_per_rank - 1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--big-rows", type=int, default=10**9)
    args = parser.parse_args()
    print(f"{args.rows:,} rows, batches of {args.batch_size}, best of {args.repeat}")
    print("kind   first batch   epoch    per row   peak memory")
    for kind in ("array", "lazy"):
        runs = [epoch(args.rows, args.batch_size, kind) for _ in range(args.repeat)]
        first = min(r[0] for r in runs)
        whole = min(r[1] for r in runs)
        peak = peak_mib(lambda kind=kind: epoch(args.rows, args.batch_size, kind))
        print(
            f"{kind:<6} {first * 1e3:8.1f} ms {whole:7.2f} s {whole / args.rows * 1e9:6.0f} ns"
            f" {peak:9.1f} MiB"
        )
    start_middle_end(10**6)  # imports and first-call caches, outside the measure
    kind = EpochPlan(num_rows=args.big_rows, batch_size=1).permutation_kind
    start = time.perf_counter()
    peak = peak_mib(lambda: start_middle_end(args.big_rows))
    print(
        f"{args.big_rows:,} rows ({kind}): 2 plans, 44 batches of 1,000 at the start, middle and "
        f"end: peak {peak * 1024:.0f} KiB, {time.perf_counter() - start:.2f} s"
    )


if __name__ == "__main__":
    main()
