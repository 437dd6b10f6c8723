"""A long soak of PrefetchLoader: does the process's memory stay flat over many ``take`` calls?

Reads ``--takes`` batches (one ``take`` each) through one loader, epoch after epoch
(``set_epoch(0)``, ``set_epoch(1)``, ...; a new iterator, event loop and worker threads each
epoch), and samples the process's resident set size (RSS) every ``--sample-every`` batches. It
prints RSS over time, then a verdict:

* ``warm-up RSS``: RSS at the end of warm-up (the first ``--warmup`` fraction of the takes, 10% by
  default: imports, Lance's caches, the allocator's pools and the first epoch settle there);
* ``end RSS`` and the ``peak`` after warm-up;
* ``growth``: peak after warm-up minus warm-up RSS, and per 10,000 takes (the least-squares
  slope of RSS over the samples after warm-up, which one step of the allocator moves little).

Without ``--uri`` it writes a small temporary dataset of ``--rows`` rows (``id`` int64, ``vector``
``--dim`` x float32, ``label`` int64) and removes it afterwards. ``--uri`` may be an object store
(``s3://...``, with ``--storage-option KEY=VALUE``); ``--local-s3`` writes the bench's synthetic
dataset (``--rows`` rows of 128 x float32) to the bench's emulated S3 on 127.0.0.1 (nginx +
rclone + the latency proxy, all stopped at the end) and soaks against it. ``--max-seconds``
bounds the soak in time as ``--takes`` does in count. With ``--max-growth-mib`` it exits with
status 1 when the growth after warm-up exceeds that budget. Run::

    .venv/bin/python benchmarks/soak.py [--takes 200000] [--batch-size 8] [--readahead 8]
        [--max-in-flight 4] [--rows 20000] [--uri data.lance] [--plot soak.png]
    .venv/bin/python benchmarks/soak.py --local-s3 --rows 2000000 --batch-size 256 \
        --readahead auto --max-in-flight auto --takes 200000 --max-seconds 300
"""

from __future__ import annotations

import argparse
import contextlib
import platform
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import lance
import numpy as np
import psutil
import pyarrow as pa

from lance_prefetch import Dataset, PrefetchLoader, ReadOptions

MIB = 2**20


@dataclass(frozen=True)
class Sample:
    """The process's RSS after ``takes`` batches, ``seconds`` into the soak."""

    takes: int
    seconds: float
    rss: int


@dataclass(frozen=True)
class Verdict:
    """What the samples say, in bytes (see the module docstring)."""

    warmup_takes: int
    warmup_rss: int
    end_rss: int
    peak_rss: int
    growth: int  # peak after warm-up - warm-up RSS
    slope_per_10k: float  # least-squares RSS slope after warm-up, bytes per 10,000 takes


def write_small(uri: str, rows: int, *, dim: int = 8, rows_per_file: int = 4096) -> str:
    """Write ``rows`` rows (``id`` = offset, ``vector`` = id * [1 .. dim], ``label`` = id % 10)."""
    ids = np.arange(rows, dtype=np.int64)
    vector = (ids[:, None] * np.arange(1, dim + 1)).astype(np.float32)
    table = pa.table(
        {
            "id": ids,
            "vector": pa.FixedSizeListArray.from_arrays(pa.array(vector.reshape(-1)), dim),
            "label": ids % 10,
        }
    )
    lance.write_dataset(table, uri, mode="create", max_rows_per_file=rows_per_file)
    return uri


def soak(
    loader: PrefetchLoader,
    takes: int,
    *,
    sample_every: int,
    max_seconds: float | None = None,
    on_batch: Callable[[], None] | None = None,
    on_sample: Callable[[Sample], None] | None = None,
) -> list[Sample]:
    """Read ``takes`` batches from ``loader``, epoch after epoch, or fewer once ``max_seconds``
    have passed; RSS every ``sample_every``.

    The first sample is taken before the first batch (``takes=0``), the last after the last one.
    ``on_batch`` is called after every batch (a progress bar's update), ``on_sample`` with every
    sample.
    """
    process = psutil.Process()
    samples = [Sample(0, 0.0, process.memory_info().rss)]
    if on_sample is not None:
        on_sample(samples[0])
    start = time.perf_counter()
    done = 0
    epoch = 0
    while done < takes:
        loader.set_epoch(epoch)
        epoch += 1
        with loader:  # closes the epoch's iterator when the soak stops mid-epoch
            for _batch in loader:
                done += 1
                if on_batch is not None:
                    on_batch()
                late = max_seconds is not None and time.perf_counter() - start >= max_seconds
                if late:
                    takes = done  # the last sample, then stop
                if done % sample_every == 0 or done == takes:
                    sample = Sample(done, time.perf_counter() - start, process.memory_info().rss)
                    samples.append(sample)
                    if on_sample is not None:
                        on_sample(sample)
                if done == takes:
                    break
    return samples


def judge(samples: Sequence[Sample], warmup: float) -> Verdict:
    """The :class:`Verdict` of ``samples``, warm-up being the first ``warmup`` of the takes."""
    total = samples[-1].takes
    end_of_warmup = [s for s in samples if s.takes <= int(total * warmup)][-1]
    warmup_takes, warmup_rss = end_of_warmup.takes, end_of_warmup.rss
    after = [s for s in samples if s.takes >= warmup_takes]
    peak = max(s.rss for s in after)
    if len(after) >= 2:
        slope = float(np.polyfit([s.takes for s in after], [s.rss for s in after], 1)[0])
    else:
        slope = 0.0
    return Verdict(
        warmup_takes=warmup_takes,
        warmup_rss=warmup_rss,
        end_rss=samples[-1].rss,
        peak_rss=peak,
        growth=peak - warmup_rss,
        slope_per_10k=slope * 10_000,
    )


def plot(samples: Sequence[Sample], verdict: Verdict, path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(8, 4))
    axes.plot([s.takes for s in samples], [s.rss / MIB for s in samples], marker=".")
    axes.axvline(verdict.warmup_takes, color="grey", linestyle="--", label="end of warm-up")
    axes.set_xlabel("takes")
    axes.set_ylabel("RSS, MiB")
    axes.set_title(title, fontsize=9)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def _int_or_auto(text: str) -> int | str:
    return text if text == "auto" else int(text)


def _local_s3(stack: contextlib.ExitStack, rows: int) -> tuple[str, dict[str, str]]:
    """Start the bench's emulated S3 (stopped with ``stack``), write ``rows`` synthetic rows to
    it (without the added latency) and return the URI and the storage options to read them
    through the latency proxy, Lance's request rate pinned at 5,000/s as the bench does."""
    from lance_prefetch_bench.data import write_synthetic
    from lance_prefetch_bench.latency_proxy import Latency
    from lance_prefetch_bench.local_s3 import LocalS3

    s3 = stack.enter_context(LocalS3(latency=Latency()))
    uri = s3.uri("soak.lance")
    write_synthetic(uri, rows, storage_options=s3.storage_options(with_latency=False))
    rate = {"lance_aimd_initial_rate": "5000", "lance_aimd_max_rate": "5000"}
    return uri, {**s3.storage_options(), **rate}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--takes", type=int, default=200_000, help="batches to read (default %(default)s)"
    )
    parser.add_argument(
        "--batch-size", type=int, default=8, help="rows per batch (default %(default)s)"
    )
    parser.add_argument(
        "--readahead", type=_int_or_auto, default=8, help="an int or auto (default %(default)s)"
    )
    parser.add_argument(
        "--max-in-flight", type=_int_or_auto, default=4, help="an int or auto (default %(default)s)"
    )
    parser.add_argument("--coalesce", type=_int_or_auto, default="auto", help="default %(default)s")
    parser.add_argument(
        "--storage-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="passed to Lance with --uri (repeat for several)",
    )
    parser.add_argument(
        "--local-s3",
        action="store_true",
        help="write the bench's synthetic dataset (--rows rows) to the bench's emulated S3 on "
        "127.0.0.1 and soak against it",
    )
    parser.add_argument("--max-seconds", type=float, help="stop after this long (default: none)")
    parser.add_argument(
        "--rows",
        type=int,
        default=20_000,
        help="rows of the temporary dataset (default %(default)s)",
    )
    parser.add_argument(
        "--dim",
        type=int,
        default=8,
        help="floats per row's vector in the temporary dataset (default %(default)s)",
    )
    parser.add_argument("--uri", help="read this dataset instead of a temporary one")
    parser.add_argument("--columns", help="comma-separated columns to read (default: all)")
    parser.add_argument(
        "--sample-every", type=int, help="takes between RSS samples (default: takes / 100)"
    )
    parser.add_argument(
        "--warmup",
        type=float,
        default=0.1,
        help="fraction of the takes that is warm-up (default %(default)s)",
    )
    parser.add_argument("--plot", help="write a PNG of RSS against takes to this path")
    parser.add_argument(
        "--max-growth-mib",
        type=float,
        help="exit with status 1 when the growth after warm-up is above this",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    if args.takes < 1:
        parser.error(f"--takes should be >= 1, but got {args.takes}")
    if not 0.0 <= args.warmup < 1.0:
        parser.error(f"--warmup should be in [0, 1), but got {args.warmup}")
    sample_every = args.sample_every or max(args.takes // 100, 1)
    columns = args.columns.split(",") if args.columns else None

    from tqdm import tqdm

    storage_options = dict(option.split("=", 1) for option in args.storage_option) or None
    with contextlib.ExitStack() as stack:
        tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="lance-prefetch-soak-"))
        if args.local_s3:
            uri, storage_options = _local_s3(stack, args.rows)
        else:
            uri = args.uri or write_small(str(Path(tmp) / "soak.lance"), args.rows, dim=args.dim)
        loader = PrefetchLoader(
            Dataset(uri, storage_options=storage_options),
            args.batch_size,
            columns=columns,
            readahead=args.readahead,
            drop_last=False,
            read=ReadOptions(max_in_flight=args.max_in_flight, coalesce=args.coalesce),
        )
        title = (
            f"{args.takes:,} takes of {args.batch_size} rows, readahead {args.readahead}, "
            f"max_in_flight {args.max_in_flight}, coalesce {loader.coalesce}, "
            f"{loader.num_rows:,} rows{' on the emulated S3' if args.local_s3 else ''} "
            f"({len(loader):,} batches an epoch)"
        )
        print(
            f"{platform.machine()}, Python {platform.python_version()}, lance {lance.__version__}"
        )
        print(title)
        print("| takes | seconds | RSS MiB |")
        print("|---|---|---|", flush=True)
        print_every = max(args.takes // 20, sample_every)  # about 20 rows, and the last

        with tqdm(
            total=args.takes, unit="take", disable=args.no_progress or None, file=sys.stderr
        ) as bar:

            def show(sample: Sample) -> None:
                if sample.takes % print_every == 0 or sample.takes == args.takes:
                    line = f"| {sample.takes:,} | {sample.seconds:.1f} | {sample.rss / MIB:.1f} |"
                    bar.write(line, file=sys.stdout)
                    sys.stdout.flush()

            samples = soak(
                loader,
                args.takes,
                sample_every=sample_every,
                max_seconds=args.max_seconds,
                on_batch=bar.update,
                on_sample=show,
            )
        verdict = judge(samples, args.warmup)
        seconds = samples[-1].seconds
        takes = samples[-1].takes
        print(
            f"{takes:,} takes in {seconds:.1f} s ({takes / seconds:,.0f} takes/s, "
            f"{takes * args.batch_size / seconds:,.0f} rows/s); "
            f"warm-up RSS {verdict.warmup_rss / MIB:.1f} MiB (after {verdict.warmup_takes:,} "
            f"takes), end RSS {verdict.end_rss / MIB:.1f} MiB, peak after warm-up "
            f"{verdict.peak_rss / MIB:.1f} MiB"
        )
        print(
            f"growth after warm-up {verdict.growth / MIB:.2f} MiB; "
            f"{verdict.slope_per_10k / MIB:+.3f} MiB per 10k takes (least squares)"
        )
        if args.plot:
            plot(samples, verdict, args.plot, title)
            print(f"plot: {args.plot}")
    if args.max_growth_mib is not None and verdict.growth > args.max_growth_mib * MIB:
        print(f"FAIL: growth {verdict.growth / MIB:.2f} MiB > {args.max_growth_mib} MiB")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
