"""``cache="memory"`` against a numpy gather of the same rows from the same buffers.

One process: a loader with ``cache="memory"`` over a synthetic dataset (``id`` int64, ``vector``
128 x float32, ``label`` int64; the columns ``vector`` and ``label`` read) is filled, then
rounds alternate between the loader (the first ``--batches`` batches of an epoch, as a training
loop receives them) and the reference: the same batches of the loader's own plan
(``EpochPlan``), each gathered with numpy fancy indexing (``vector[idx]``, ``label[idx]``) from
the cache's own Arrow buffers, in one thread. The ratio (loader / reference, medians of the
rounds) is the figure ``docs/benchmarks.md`` reports. ``--profile`` adds a breakdown of one
batch's time in the loader (plan, gather, split, hand-over) from ``cProfile``.

    python benchmarks/memory_cache.py --rows 1000000 --batch-size 64 256
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import tempfile
import time

import numpy as np

from lance_prefetch import PrefetchLoader
from lance_prefetch.plan.sampling import EpochPlan
from lance_prefetch_bench.data import write_synthetic

COLUMNS = ["vector", "label"]


def loader_round(loader: PrefetchLoader, epoch: int, batches: int) -> float:
    """Rows/s of the loader over batches 2 .. ``batches`` of ``epoch`` (the first one, which
    pays for the epoch's permutation, is left out: the steady state, as a long epoch sees it)."""
    loader.set_epoch(epoch)
    rows = 0
    with iter(loader) as iterator:
        next(iterator)
        started = time.perf_counter()
        for number, batch in enumerate(iterator, 2):
            rows += batch["label"].shape[0]
            if number == batches:
                break
        return rows / (time.perf_counter() - started)


def gather_round(columns: dict[str, np.ndarray], plan: EpochPlan, batches: int) -> float:
    """Rows/s of a numpy gather of the plan's batches 2 .. ``batches`` from ``columns``."""
    chosen = [
        batch.indices for _, batch in zip(range(batches), plan.rank_batches(0), strict=False)
    ][1:]
    rows = 0
    started = time.perf_counter()
    for indices in chosen:
        gathered = {name: values[indices] for name, values in columns.items()}
        rows += len(gathered["label"])
    return rows / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--batch-size", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--batches", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        uri = write_synthetic(f"{folder}/data.lance", rows=args.rows, rows_per_file=args.rows // 10)
        for batch_size in args.batch_size:
            loader = PrefetchLoader(uri, batch_size=batch_size, columns=COLUMNS, cache="memory")
            started = time.perf_counter()
            table = loader._source.fill()  # the cache's own table (private: a benchmark)
            fill_s = time.perf_counter() - started
            columns = {
                "vector": table.column("vector").chunk(0).flatten().to_numpy().reshape(-1, 128),
                "label": table.column("label").chunk(0).to_numpy(),
            }
            batches = min(args.batches, len(loader))
            results: dict[str, list[float]] = {"loader": [], "gather": []}
            for round_ in range(args.rounds):
                epoch = 1 + round_
                plan = EpochPlan(num_rows=len(table), batch_size=batch_size, epoch=epoch)
                first, second = ("loader", "gather") if round_ % 2 == 0 else ("gather", "loader")
                for which in (first, second):
                    if which == "loader":
                        results["loader"].append(loader_round(loader, epoch, batches))
                    else:
                        results["gather"].append(gather_round(columns, plan, batches))
            ours, theirs = (statistics.median(results[key]) for key in ("loader", "gather"))
            print(
                f"batch_size={batch_size}: loader {ours / 1e6:.2f}M rows/s, numpy gather "
                f"{theirs / 1e6:.2f}M rows/s, ratio {ours / theirs:.2f}x (medians of "
                f"{args.rounds} interleaved rounds of {batches} batches; fill {fill_s:.2f} s)"
            )
            if args.profile:
                profile = cProfile.Profile()
                profile.runcall(loader_round, loader, 99, batches)
                pstats.Stats(profile).sort_stats("tottime").print_stats(12)


if __name__ == "__main__":
    main()
