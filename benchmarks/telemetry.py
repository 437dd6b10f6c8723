"""What the always-on telemetry (``loader.stats()``) costs, measured on this machine.

Two measurements:

* per call: :meth:`Telemetry.record_batch` (the training thread, once per batch, plus the two
  clock reads around ``next()``) and :meth:`Telemetry.record_take` (a worker thread, once per
  take, plus two clock reads), timed with ``timeit``; and ``loader.stats()`` itself.
* end to end: a local dataset of small rows read in small batches (where a fixed per-batch cost
  matters most), each pass with the real telemetry and with its recording methods replaced by
  no-ops, alternating, best of ``--repeats``.

Run::

    .venv/bin/python benchmarks/telemetry.py [--rows 200000] [--batch-size 64] [--repeats 5]
"""

from __future__ import annotations

import argparse
import platform
import tempfile
import time
import timeit

import lance
import numpy as np
import pyarrow as pa

from lance_prefetch import PrefetchLoader, ReadOptions
from lance_prefetch.loader import _telemetry as telemetry_module
from lance_prefetch.schedule._prefetcher import PrefetchStatistics


def per_call() -> dict[str, float]:
    telemetry = telemetry_module.Telemetry(0)
    nothing = PrefetchStatistics(held=0, in_flight=0, received=0)
    telemetry.attach(lambda: nothing)
    clock = time.perf_counter

    def batch() -> None:
        started = clock()
        telemetry.record_batch(64, clock() - started)

    def take() -> None:
        started = clock()
        telemetry.record_take(clock() - started, 1024)

    number = 200_000
    for _ in range(LATENCY_WARMUP):
        telemetry.record_take(0.001, 0)
    return {
        "record_batch_us": min(timeit.repeat(batch, number=number, repeat=3)) / number * 1e6,
        "record_take_us": min(timeit.repeat(take, number=number, repeat=3)) / number * 1e6,
        "stats_us": min(timeit.repeat(telemetry.snapshot, number=2000, repeat=3)) / 2000 * 1e6,
    }


LATENCY_WARMUP = telemetry_module.LATENCIES  # stats() over a full ring of latencies


def end_to_end(uri: str, batch_size: int, repeats: int) -> dict[str, float]:
    loader = PrefetchLoader(uri, batch_size, readahead=8, read=ReadOptions(max_in_flight=4))
    real = telemetry_module.Telemetry.record_batch, telemetry_module.Telemetry.record_take
    best = {"on": 0.0, "off": 0.0}
    for repeat in range(repeats):
        for mode in ("on", "off") if repeat % 2 else ("off", "on"):  # neither always goes first
            if mode == "off":
                telemetry_module.Telemetry.record_batch = lambda self, rows, waited: None
                telemetry_module.Telemetry.record_take = lambda self, seconds, nbytes: None
            try:
                started = time.perf_counter()
                rows = sum(len(batch["id"]) for batch in loader)
                best[mode] = max(best[mode], rows / (time.perf_counter() - started))
            finally:
                telemetry_module.Telemetry.record_batch, telemetry_module.Telemetry.record_take = (
                    real
                )
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    print(f"{platform.processor() or platform.machine()}, Python {platform.python_version()}")
    calls = per_call()
    print(
        f"per call: record_batch {calls['record_batch_us']:.2f} us, record_take "
        f"{calls['record_take_us']:.2f} us (each with its two clock reads), stats() "
        f"{calls['stats_us']:.0f} us"
    )
    with tempfile.TemporaryDirectory() as folder:
        uri = f"{folder}/small.lance"
        ids = np.arange(args.rows, dtype=np.int64)
        lance.write_dataset(pa.table({"id": ids, "label": ids % 10}), uri)
        best = end_to_end(uri, args.batch_size, args.repeats)
    print(
        f"end to end, {args.rows:,} rows of 16 bytes in batches of {args.batch_size}, best of "
        f"{args.repeats}: telemetry on {best['on']:,.0f} rows/s, off {best['off']:,.0f} rows/s "
        f"(on/off = {best['on'] / best['off']:.3f})"
    )


if __name__ == "__main__":
    main()
