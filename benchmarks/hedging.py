"""Hedged takes on the emulated S3: the training loop's wait per batch with and without
``hedge=HedgePolicy()``, and the extra takes it cost, side by side in interleaved rounds.

Starts the emulated S3 of ``lance-prefetch bench --local-s3`` (nginx + rclone + the latency proxy,
127.0.0.1 only; Lance's request-rate limiter pinned at ``--aimd-rate``), writes ``--rows`` rows
(id + 128 x float32 vector + label), then per round runs one loader with ``hedge=None`` and one
with ``hedge=HedgePolicy()`` (order alternating), same seed, same batches: ``--batches`` batches of
``--batch-size`` rows, sleeping ``--step-ms`` after each (a training step), the first
``--warmup`` not counted. It prints, per setting, p50/p90/p99/max of the time spent in ``next()``,
the takes and rows requested from Lance (counted at ``LanceSource.take``, hedges included), the
hedges issued and won, and checks that both settings delivered the same row ids in the same order.
With ``--local`` the dataset is on local disk instead. With ``--take-sizes`` it first prints the
duration of single random takes of those sizes (the request tail per take); with ``--pieces``
the time of a batch read as several concurrent takes, those still running after a delay read
again (``--rounds 0``: only these). Run (measurements under the machine's benchmark lock)::

    flock /tmp/bench.lock .venv/bin/python benchmarks/hedging.py [--tail-fraction 0.01]
        [--tail-ms 150] [--readahead auto] [--rounds 3] [--take-sizes 256,16,4]
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from lance_prefetch import Dataset, HedgePolicy, PrefetchLoader, ReadOptions
from lance_prefetch.sources._lance import LanceSource
from lance_prefetch_bench.data import write_synthetic
from lance_prefetch_bench.latency_proxy import Latency
from lance_prefetch_bench.local_s3 import LocalS3

COLUMNS = ["id", "vector", "label"]


class TakeCounter:
    """Counts every ``LanceSource.take`` (calls and rows) while installed."""

    def __init__(self) -> None:
        self.takes = self.rows = 0
        self._lock = threading.Lock()
        self._original = LanceSource.take

    def __enter__(self) -> TakeCounter:
        original, counter = self._original, self

        def take(source, indices, *args, **kwargs):  # type: ignore[no-untyped-def]
            with counter._lock:
                counter.takes += 1
                counter.rows += len(indices)
            return original(source, indices, *args, **kwargs)

        LanceSource.take = take  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc_info: object) -> None:
        LanceSource.take = self._original  # type: ignore[method-assign]


def depth(value: str) -> int | str:
    return value if value == "auto" else int(value)


def run_once(
    uri: str,
    options: dict[str, str],
    args: argparse.Namespace,
    seed: int,
    hedge: HedgePolicy | None,
) -> dict:
    loader = PrefetchLoader(
        Dataset(uri, storage_options=options),
        args.batch_size,
        columns=COLUMNS,
        seed=seed,
        readahead=depth(args.readahead),
        read=ReadOptions(max_in_flight=depth(args.max_in_flight), hedge=hedge),
    )
    waits, digest = [], hashlib.sha256()
    with TakeCounter() as counter:
        iterator = iter(loader)
        started = time.perf_counter()
        for _ in range(args.batches):
            before = time.perf_counter()
            batch = next(iterator)
            waits.append(time.perf_counter() - before)
            digest.update(batch["id"].numpy().tobytes())
            time.sleep(args.step_ms / 1000)
        elapsed = time.perf_counter() - started
        stats = loader.stats()
        iterator.close()
        takes, rows = counter.takes, counter.rows
    return {
        "waits": np.array(waits[args.warmup :]) * 1000,
        "digest": digest.hexdigest(),
        "takes": takes,
        "rows": rows,
        "hedges": stats.hedges,
        "won": stats.hedges_won,
        "take_p50": stats.take_ms_p50,
        "take_p99": stats.take_ms_p99,
        "rows_per_s": args.batches * args.batch_size / elapsed,
        "depths": f"{stats.readahead}/{stats.max_in_flight}",
    }


def take_sizes(uri: str, options: dict[str, str], sizes: list[int], count: int) -> None:
    import lance

    dataset = lance.dataset(uri, storage_options=options)
    rows = dataset.count_rows()
    rng = np.random.default_rng(0)

    def timed(indices: np.ndarray) -> float:
        started = time.perf_counter()
        dataset.take(indices, columns=COLUMNS[1:])
        return (time.perf_counter() - started) * 1000

    for size in sizes:
        with ThreadPoolExecutor(4) as pool:
            plan = [rng.choice(rows, size, replace=False) for _ in range(count)]
            times = np.array(list(pool.map(timed, plan)))
        p50, p90, p99 = np.percentile(times, [50, 90, 99])
        print(
            f"take of {size:4d} random rows (4 at once, {count}): p50 {p50:6.0f}  p90 {p90:6.0f}"
            f"  p99 {p99:6.0f}  max {times.max():6.0f} ms"
        )


def hedged_pieces(uri: str, options: dict[str, str], spec: str, count: int, batch: int) -> None:
    """A batch of ``batch`` random rows read as ``pieces`` concurrent takes, each still running
    after ``after_ms`` read again (first copy used): batch time and extra rows requested."""
    import concurrent.futures as futures

    import lance

    dataset = lance.dataset(uri, storage_options=options)
    rows = dataset.count_rows()
    rng = np.random.default_rng(1)
    for item in spec.split(","):
        pieces, after_ms = (int(v) for v in item.split("@"))
        pool = ThreadPoolExecutor(2 * pieces)
        times, extra = [], 0
        for _ in range(count):
            parts = np.array_split(rng.choice(rows, batch, replace=False), pieces)
            started = time.perf_counter()
            first = [pool.submit(dataset.take, part, columns=COLUMNS[1:]) for part in parts]
            done, late = futures.wait(first, timeout=after_ms / 1000) if after_ms else (first, [])
            waiting = {}
            for future in late if after_ms else []:
                index = first.index(future)
                waiting[index] = [
                    future,
                    pool.submit(dataset.take, parts[index], columns=COLUMNS[1:]),
                ]
                extra += len(parts[index])
            for copies in waiting.values():
                futures.wait(copies, return_when=futures.FIRST_COMPLETED)
            if not after_ms:
                futures.wait(first)
            times.append((time.perf_counter() - started) * 1000)
        pool.shutdown(wait=True)
        p50, p90, p99 = np.percentile(times, [50, 90, 99])
        hedged = f"hedged after {after_ms} ms" if after_ms else "not hedged"
        print(
            f"batch of {batch} as {pieces:3d} takes, {hedged:20s}: p50 {p50:5.0f}  p90 "
            f"{p90:5.0f}  p99 {p99:5.0f} ms, extra rows +{extra / (batch * count):.1%}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--batches", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--step-ms", type=float, default=50.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--readahead", default="auto")
    parser.add_argument("--max-in-flight", default="auto")
    parser.add_argument("--delay-ms", type=float, default=30.0)
    parser.add_argument("--jitter-ms", type=float, default=10.0)
    parser.add_argument("--tail-fraction", type=float, default=0.01)
    parser.add_argument("--tail-ms", type=float, default=150.0)
    parser.add_argument("--aimd-rate", default="5000")
    parser.add_argument("--local", action="store_true", help="a local dataset, no S3")
    parser.add_argument("--take-sizes", default="")
    parser.add_argument("--take-count", type=int, default=80)
    parser.add_argument(
        "--pieces",
        default="",
        help="e.g. 1@0,16@0,16@80,64@60: a batch as "
        "PIECES concurrent takes, each hedged after MS (0: never)",
    )
    args = parser.parse_args()
    latency = Latency(
        delay_ms=args.delay_ms,
        jitter_ms=args.jitter_ms,
        tail_fraction=args.tail_fraction,
        tail_ms=args.tail_ms,
    )
    with contextlib.ExitStack() as stack:
        if args.local:
            folder = stack.enter_context(tempfile.TemporaryDirectory(prefix="hedging-"))
            uri, options, where = (
                write_synthetic(f"{folder}/hedging.lance", args.rows),
                {},
                "local disk",
            )
        else:
            s3 = stack.enter_context(LocalS3(latency=latency))
            uri = s3.uri("hedging.lance")
            write_synthetic(uri, args.rows, storage_options=s3.storage_options(with_latency=False))
            options = {
                **s3.storage_options(),
                "lance_aimd_initial_rate": args.aimd_rate,
                "lance_aimd_max_rate": args.aimd_rate,
            }
            where = f"emulated S3: {latency.describe()}"
        print(
            f"{where}; {args.rows} rows, batches of "
            f"{args.batch_size}, step {args.step_ms:g} ms, readahead {args.readahead}, "
            f"max_in_flight {args.max_in_flight}, {args.batches} batches a run "
            f"({args.warmup} warm-up), {args.rounds} rounds"
        )
        if args.take_sizes:
            take_sizes(uri, options, [int(s) for s in args.take_sizes.split(",")], args.take_count)
        if args.pieces:
            hedged_pieces(uri, options, args.pieces, args.take_count, args.batch_size)
            if not args.rounds:
                return
        results: dict[str, list[dict]] = {"hedge=None": [], "hedge=HedgePolicy()": []}
        for round_ in range(args.rounds):
            order = list(results) if round_ % 2 == 0 else list(results)[::-1]
            digests = set()
            for name in order:
                hedge = None if name == "hedge=None" else HedgePolicy()
                result = run_once(uri, options, args, seed=round_, hedge=hedge)
                results[name].append(result)
                digests.add(result["digest"])
                print(
                    f"  round {round_} {name:20s} wait p50/p99 "
                    f"{np.percentile(result['waits'], 50):6.1f}/"
                    f"{np.percentile(result['waits'], 99):6.1f} ms, takes {result['takes']}, "
                    f"hedges {result['hedges']} ({result['won']} won)",
                    flush=True,
                )
            assert len(digests) == 1, "hedged and unhedged runs delivered different batches"
        print("same row ids in the same order in every round, hedged or not")
        for name, runs in results.items():
            waits = np.concatenate([run["waits"] for run in runs])
            takes = sum(run["takes"] for run in runs)
            hedges = sum(run["hedges"] for run in runs)
            primary = takes - hedges
            p50, p90, p99 = np.percentile(waits, [50, 90, 99])
            print(
                f"{name:20s} wait per batch p50 {p50:6.1f}  p90 {p90:6.1f}  p99 {p99:6.1f}  "
                f"max {waits.max():6.0f} ms | takes {takes} ({hedges} hedges, "
                f"{sum(run['won'] for run in runs)} won: +{hedges / max(primary, 1):.1%}), rows "
                f"{sum(run['rows'] for run in runs)} | take p50/p99 "
                f"{np.median([r['take_p50'] for r in runs]):.0f}/"
                f"{np.median([r['take_p99'] for r in runs]):.0f} ms | "
                f"{np.median([r['rows_per_s'] for r in runs]):,.0f} rows/s | depths "
                f"{runs[-1]['depths']}"
            )


if __name__ == "__main__":
    main()
