"""Per-take cost of a uniform random ``take`` against rows per take: the measurement behind the
coalescing rule (``lance_prefetch.plan._coalesce``).

Writes (once) a synthetic dataset (``--rows`` rows of id + 128 x float32 vector + label, in
fragments of ``--rows-per-file``), then, for each number of rows per take, runs ``--threads``
threads each taking uniformly random offsets for ``--seconds`` and prints rows/s, the time of one
take and the fixed cost per take fitted by least squares (``time = fixed + per_row * rows``). With
``--sorted`` it also times takes of sorted offsets with the order restored afterwards. Run::

    .venv/bin/python benchmarks/coalesce.py [--rows 1000000] [--threads 1,4] [--sorted]
"""

from __future__ import annotations

import argparse
import os
import threading
import time

import lance
import numpy as np

from lance_prefetch_bench.data import write_synthetic


def measure(dataset, rows: int, threads: int, seconds: float, sort: bool) -> float:
    """Rows/s of ``threads`` threads taking ``rows`` random offsets each time."""
    count = dataset.count_rows()
    done = [0] * threads
    stop = time.perf_counter() + seconds

    def work(slot: int) -> None:
        rng = np.random.default_rng(slot)
        while time.perf_counter() < stop:
            indices = rng.choice(count, rows, replace=False)
            if sort:
                order = np.argsort(indices)
                table = dataset.take(indices[order], columns=["vector", "label"])
                table = table.take(np.argsort(order))
            else:
                table = dataset.take(indices, columns=["vector", "label"])
            done[slot] += table.num_rows

    started = time.perf_counter()
    workers = [threading.Thread(target=work, args=(slot,)) for slot in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return sum(done) / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--uri", default="/tmp/lance-prefetch-coalesce.lance")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--rows-per-file", type=int, default=100_000)
    parser.add_argument("--sizes", default="64,128,256,512,1024,2048,4096")
    parser.add_argument("--threads", default="1,4")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--sorted", action="store_true", help="also time sorted takes")
    args = parser.parse_args()
    if not os.path.exists(args.uri):
        write_synthetic(args.uri, args.rows, rows_per_file=args.rows_per_file)
    dataset = lance.dataset(args.uri)
    sizes = [int(size) for size in args.sizes.split(",")]
    for threads in (int(value) for value in args.threads.split(",")):
        for sort in (False, True) if args.sorted else (False,):
            times = []
            for rows in sizes:
                rate = measure(dataset, rows, threads, args.seconds, sort)
                times.append(rows * threads / rate)  # seconds per take per thread
                print(  # noqa: T201
                    f"threads={threads} sorted={sort} rows/take={rows:5d}: {rate:9,.0f} rows/s, "
                    f"{1e3 * times[-1]:7.2f} ms a take"
                )
            per_row, fixed = np.polyfit(sizes, times, 1)
            print(  # noqa: T201
                f"  fit: fixed {1e3 * fixed:.2f} ms a take + {1e6 * per_row:.1f} us a row "
                f"(fixed cost = {fixed / per_row:.0f} rows' worth)"
            )


if __name__ == "__main__":
    main()
