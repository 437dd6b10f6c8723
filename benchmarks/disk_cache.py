"""``cache="disk"`` once filled: against a numpy gather from memory, and against ``pread``.

Two modes, one synthetic dataset (``id`` int64, ``vector`` 128 x float32, ``label`` int64; the
columns ``vector`` and ``label`` read, both stored raw in the copy):

``--mode warm`` (the copy in the page cache): rounds alternate between the loader (batches 2 ..
``--batches`` of an epoch, as a training loop receives them) and the reference: the same batches
of the loader's own plan (``EpochPlan``) gathered with numpy fancy indexing from arrays in this
process's memory, in one thread. The ratio (loader / reference, medians of the rounds) is the
figure ``docs/benchmarks.md`` reports.

``--mode cold`` (the page cache emptied of the copy's files before each round: the loader's
mappings with ``madvise(MADV_DONTNEED)``, then each file with
``posix_fadvise(POSIX_FADV_DONTNEED)``): rounds alternate between the loader and the reference
``pread``: the same batches' rows read from the copy's raw files with ``os.pread`` (one call a
row and a column), from 2 threads taking batches in turn. Run it on a dataset far larger than
the batches read, so that few rows are read twice.

    python benchmarks/disk_cache.py --mode warm --rows 200000 --batch-size 64 256
    python benchmarks/disk_cache.py --mode cold --rows 4000000 --batch-size 256 --batches 200
"""

from __future__ import annotations

import argparse
import mmap
import os
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from lance_prefetch import DiskCache, PrefetchLoader
from lance_prefetch.plan.sampling import EpochPlan
from lance_prefetch_bench.data import write_synthetic

COLUMNS = ["vector", "label"]


def identity(batch: dict) -> dict:
    """A transform that changes nothing (its presence makes the loader read ahead in threads)."""
    return batch


def loader_round(loader: PrefetchLoader, epoch: int, batches: int) -> float:
    """Rows/s of the loader over batches 2 .. ``batches`` of ``epoch`` (the first one, which
    pays for the epoch's permutation, is left out)."""
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


def plan_batches(num_rows: int, batch_size: int, epoch: int, batches: int) -> list[np.ndarray]:
    """The indices of the loader's batches 2 .. ``batches`` of ``epoch``."""
    plan = EpochPlan(num_rows=num_rows, batch_size=batch_size, epoch=epoch)
    chosen = [b.indices for _, b in zip(range(batches), plan.rank_batches(0), strict=False)]
    return chosen[1:]


def gather_round(columns: dict[str, np.ndarray], chosen: list[np.ndarray]) -> float:
    """Rows/s of a numpy gather of ``chosen`` from ``columns`` (arrays in memory)."""
    rows = 0
    started = time.perf_counter()
    for indices in chosen:
        gathered = {name: values[indices] for name, values in columns.items()}
        rows += len(gathered["label"])
    return rows / (time.perf_counter() - started)


def pread_round(files: list[tuple[str, int]], chosen: list[np.ndarray], threads: int) -> float:
    """Rows/s of ``os.pread`` of ``chosen``'s rows from ``files`` (path, bytes a row), one
    call a row and a file, ``threads`` threads taking batches in turn."""
    descriptors = [(os.open(path, os.O_RDONLY), width) for path, width in files]
    for descriptor, _ in descriptors:  # no readahead around each row: the loader's advice too
        os.posix_fadvise(descriptor, 0, 0, os.POSIX_FADV_RANDOM)

    def read(indices: np.ndarray) -> int:
        for row in indices.tolist():
            for descriptor, width in descriptors:
                if len(os.pread(descriptor, width, row * width)) != width:
                    raise OSError("short read")
        return len(indices)

    try:
        started = time.perf_counter()
        with ThreadPoolExecutor(threads) as pool:
            rows = sum(pool.map(read, chosen))
        return rows / (time.perf_counter() - started)
    finally:
        for descriptor, _ in descriptors:
            os.close(descriptor)


def drop_from_page_cache(copy: Path, mappings: list[mmap.mmap]) -> None:
    """Ask the kernel to drop the copy's files from the page cache: this process's mappings of
    them first (a page mapped into a process is not dropped), then each file."""
    for mapping in mappings:
        mapping.madvise(mmap.MADV_DONTNEED)
    for path in copy.rglob("*"):
        if path.is_file():
            descriptor = os.open(path, os.O_RDONLY)
            try:
                os.fsync(descriptor)
                os.posix_fadvise(descriptor, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(descriptor)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=["warm", "cold"], default="warm")
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--batch-size", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--batches", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2, help="pread threads (cold mode)")
    parser.add_argument("--dir", help="where the dataset and the copy go (default: a temp dir)")
    parser.add_argument(
        "--as-larger-than-memory",
        action="store_true",
        help="read the copy as one larger than half the memory is read: through the readahead "
        "threads (here by an identity transform), its mappings advised MADV_RANDOM",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as folder:
        started = time.perf_counter()
        uri = write_synthetic(f"{folder}/data.lance", rows=args.rows, rows_per_file=args.rows // 10)
        print(f"dataset: {args.rows:,} rows written in {time.perf_counter() - started:.1f} s")
        for batch_size in args.batch_size:
            cache = DiskCache(dir=f"{folder}/cache")
            loader = PrefetchLoader(
                uri,
                batch_size=batch_size,
                columns=COLUMNS,
                cache=cache,
                transform=identity if args.as_larger_than_memory else None,
            )
            started = time.perf_counter()
            copy = loader._source.fill()  # the copy, made (or found) here (private: a benchmark)
            fill_s = time.perf_counter() - started
            if args.as_larger_than_memory:
                copy.files.read_randomly()
            path = loader._source.path
            arrays = {name: copy.files._arrays[name] for name in COLUMNS}  # the mapped arrays
            in_memory = {name: np.array(values) for name, values in arrays.items()}
            batches = min(args.batches, len(loader))
            results: dict[str, list[float]] = {}
            for round_ in range(args.rounds):
                epoch = 1 + round_
                chosen = plan_batches(args.rows, batch_size, epoch, batches)
                order = ["loader", "reference"] if round_ % 2 == 0 else ["reference", "loader"]
                for which in order:
                    if args.mode == "cold":
                        drop_from_page_cache(path, copy.files._mappings)
                    if which == "loader":
                        rate = loader_round(loader, epoch, batches)
                    elif args.mode == "warm":
                        rate = gather_round(in_memory, chosen)
                    else:
                        files = [
                            (str(path / "columns" / f"{COLUMNS.index(name)}.raw"), values[0].nbytes)
                            for name, values in arrays.items()
                        ]
                        rate = pread_round(files, chosen, args.threads)
                    results.setdefault(which, []).append(rate)
            ours, theirs = (statistics.median(results[key]) for key in ("loader", "reference"))
            reference = "numpy gather from memory" if args.mode == "warm" else "os.pread"
            print(
                f"{args.mode}, batch_size={batch_size}: loader {ours:,.0f} rows/s, {reference} "
                f"{theirs:,.0f} rows/s, ratio {ours / theirs:.2f}x (medians of {args.rounds} "
                f"interleaved rounds of {batches - 1} batches; fill {fill_s:.2f} s)"
            )


if __name__ == "__main__":
    main()
