"""The ``lance-prefetch bench`` command's arguments, and the :class:`BenchConfig` they make."""

from __future__ import annotations

import argparse
from pathlib import Path

from lance_prefetch_bench._spec import KINDS, PEER_KINDS
from lance_prefetch_bench.config import SWEEP_GRID, BenchConfig, _scheme
from lance_prefetch_bench.latency_proxy import Latency

__all__ = ["add_arguments", "config_from_args"]


def _int_list(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"should be integers separated by commas, got {text!r}"
        ) from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"should be integers >= 1, got {text!r}")
    return values


def _int_or_auto_list(text: str) -> tuple[int | str, ...]:
    parts = [part.strip() for part in text.split(",") if part.strip()]
    numbers = ",".join(part for part in parts if part != "auto")
    values: tuple[int | str, ...] = _int_list(numbers) if numbers else ()
    if not parts:
        raise argparse.ArgumentTypeError(f"should be integers or 'auto', got {text!r}")
    return values + (("auto",) if "auto" in parts else ())


def _caches(text: str) -> tuple[str, ...]:
    values = _names(text)
    wrong = [value for value in values if value not in ("none", "memory", "disk")]
    if wrong or not values:
        raise argparse.ArgumentTypeError(f"should be among none,memory,disk, got {text!r}")
    return values


def _hedges(text: str) -> tuple[str, ...]:
    values = _names(text)
    if not values or any(value not in ("auto", "none") for value in values):
        raise argparse.ArgumentTypeError(f"should be among auto,none, got {text!r}")
    return values


def _key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"should be KEY=VALUE, got {text!r}")
    return key, value


def _names(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


def _contenders(text: str) -> tuple[str, ...]:
    """Contender names; ``peers`` stands for the three peer loaders."""
    names = [PEER_KINDS if name == "peers" else (name,) for name in _names(text)]
    return tuple(dict.fromkeys(name for group in names for name in group))


class _Given(argparse.Action):
    """Store the value and note that the option was given (``args.given``): ``--sweep-loader``
    replaces only the grid options left out, even where one is given at its default value."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        setattr(namespace, self.dest, values)
        namespace.given = {*getattr(namespace, "given", ()), self.dest}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``bench`` command's arguments to ``parser``."""
    defaults = BenchConfig()
    latency = defaults.latency
    add = parser.add_argument
    add(
        "uri",
        nargs="?",
        help="Lance dataset to read (local or s3://...); omit it to write a "
        "synthetic one (--rows) to a temporary folder, or to the emulated S3 with --local-s3",
    )
    add(
        "--local-s3",
        action="store_true",
        help="emulate S3 on 127.0.0.1 (nginx + rclone serve s3 + a latency proxy), write the "
        "synthetic dataset there, and stop it all at the end",
    )
    add(
        "--storage-option",
        action="append",
        type=_key_value,
        default=[],
        metavar="KEY=VALUE",
        help="passed to Lance (repeat for several), e.g. aws_endpoint=http://...",
    )
    add("--columns", type=_names, help="comma-separated columns to read (default: all)")
    add("--batch-size", type=int, default=defaults.batch_size, help="rows per batch")
    add("--batches", type=int, default=defaults.batches, help="batches per timed pass")
    add(
        "--warmup-batches",
        type=int,
        default=defaults.warmup_batches,
        help="untimed batches before the timed passes",
    )
    add("--seed", type=int, default=defaults.seed, help="seed of every epoch's permutation")
    add(
        "--step-ms",
        type=float,
        default=defaults.step_ms,
        help="simulated training step of the step pass (sleep), ms",
    )
    add("--rows", type=int, default=defaults.rows, help="rows of the synthetic dataset")
    add(
        "--rows-per-file",
        type=int,
        default=defaults.rows_per_file,
        help="rows per fragment of the synthetic dataset",
    )
    add(
        "--readahead",
        type=_int_or_auto_list,
        action=_Given,
        default=defaults.readahead,
        metavar="N,N,...",
        help="lance-prefetch readahead values; 'auto' adds a readahead=auto, "
        "max_in_flight=auto setting",
    )
    add(
        "--max-in-flight",
        type=_int_or_auto_list,
        action=_Given,
        default=defaults.max_in_flight,
        metavar="N,N,...",
        help="lance-prefetch max_in_flight values; pairs above readahead are skipped",
    )
    add(
        "--coalesce",
        type=_int_or_auto_list,
        action=_Given,
        default=defaults.coalesce,
        metavar="N,...",
        help="lance-prefetch coalesce values, e.g. 1,auto",
    )
    add(
        "--cache",
        type=_caches,
        default=defaults.cache,
        metavar="none,memory,disk",
        help="lance-prefetch cache values",
    )
    add(
        "--hedge",
        type=_hedges,
        default=defaults.hedge,
        metavar="auto,none",
        help="lance-prefetch hedge values: auto (hedged takes on object stores), none (hedge=None)",
    )
    add(
        "--io-grid",
        type=_ios,
        action=_Given,
        default=defaults.io_grid,
        metavar="auto,default,uring",
        help="lance-prefetch ReadOptions.io values",
    )
    add(
        "--repeats",
        type=int,
        default=defaults.repeats,
        help="runs of each contender (but ceiling) in interleaved rounds, each in its own "
        "process; the table shows the median rows/s and the spread (min-max)",
    )
    add(
        "--ceiling-concurrency",
        type=_int_list,
        default=defaults.ceiling_concurrency,
        metavar="N,N,...",
        help="thread-pool sizes tried by ceiling",
    )
    add(
        "--ceiling-repeats",
        type=int,
        default=defaults.ceiling_repeats,
        help="runs of ceiling per pool size; the best counts",
    )
    add(
        "--coalesced-ceiling-concurrency",
        type=_int_list,
        default=defaults.coalesced_ceiling_concurrency,
        metavar="N,N,...",
        help="thread-pool sizes tried by coalesced-ceiling (the loader defaults' takes)",
    )
    add(
        "--map-workers",
        type=_int_list,
        default=defaults.map_workers,
        metavar="N,...",
        help="map-style: DataLoader workers of each setting (lance-map and lance-map-rows use "
        "the first)",
    )
    add(
        "--grain-threads",
        type=_int_list,
        default=defaults.grain_threads,
        metavar="N,...",
        help="grain: ReadOptions.num_threads of each setting",
    )
    add(
        "--spdl-concurrency",
        type=_int_list,
        default=defaults.spdl_concurrency,
        metavar="N,...",
        help="spdl: take concurrency of each setting",
    )
    add(
        "--streaming-splits",
        type=_int_list,
        default=defaults.streaming_splits,
        metavar="N,...",
        help="lancedb-streaming: num_splits of each setting",
    )
    add(
        "--contenders",
        type=_contenders,
        default=defaults.contenders,
        help=f"comma-separated, among {','.join(KINDS)}; 'peers' for "
        f"{','.join(PEER_KINDS)} (pip install 'lance-prefetch-bench[peers]' after torch)",
    )
    add("--delay-ms", type=float, default=latency.delay_ms, help="--local-s3 added delay, ms")
    add("--jitter-ms", type=float, default=latency.jitter_ms, help="+/- uniform jitter, ms")
    add(
        "--tail-fraction",
        type=float,
        default=latency.tail_fraction,
        help="fraction of requests in the slow tail",
    )
    add("--tail-ms", type=float, default=latency.tail_ms, help="the slow tail's extra delay, ms")
    add("--latency-seed", type=int, default=latency.seed, help="seed of the --local-s3 delays")
    add(
        "--aimd-rate",
        type=int,
        default=defaults.aimd_rate,
        help="pin Lance's request-rate limiter on object stores at this many requests/s "
        "(0: Lance's default ramp)",
    )
    add(
        "--io",
        choices=("default", "uring"),
        default=defaults.io,
        help="uring: every contender reads the local dataset through Lance's io_uring reader "
        "(file+uring://)",
    )
    add(
        "--io-threads",
        type=int,
        help="set LANCE_IO_THREADS for the contenders (default: the environment's, else "
        "Lance's: 64 on object stores, 8 for local files)",
    )
    add(
        "--id-column",
        default=defaults.id_column,
        help="column with row ids for the same-ids check ('' for none: offsets are used)",
    )
    add("--record-ids", action="store_true", help="store every id read in the JSON")
    add("--out", type=Path, default=defaults.out_dir, help="folder for NAME.json/.md/.png")
    add("--name", default=defaults.name, help="file name of the outputs, without suffix")
    add(
        "--contender-timeout-s",
        type=float,
        default=defaults.contender_timeout_s,
        help="a contender run taking longer is stopped and reported as failed",
    )
    add(
        "--no-progress",
        action="store_true",
        help="no progress bar (there is one only on a terminal; a line per finished "
        "contender run is printed either way)",
    )
    add(
        "--sweep-loader",
        action="store_true",
        help="run only lance-prefetch: its defaults and a grid (readahead "
        f"{_listed(SWEEP_GRID['readahead'])}, max-in-flight {_listed(SWEEP_GRID['max_in_flight'])}, "
        f"coalesce {_listed(SWEEP_GRID['coalesce'])}, io-grid {_listed(SWEEP_GRID['io_grid'])} "
        "on local datasets; each replaced by its own option when given), and print the "
        "defaults' rows/s over the best setting's",
    )
    add(
        "--targets",
        action="store_true",
        help="add the development targets (met or missed) to the report",
    )


def _listed(values: tuple[int | str, ...]) -> str:
    return ",".join(str(value) for value in values)


def _ios(text: str) -> tuple[str, ...]:
    values = _names(text)
    if not values or any(value not in ("auto", "default", "uring") for value in values):
        raise argparse.ArgumentTypeError(f"should be among auto,default,uring, got {text!r}")
    return values


def _sweep_grid(args: argparse.Namespace) -> dict[str, object]:
    """With ``--sweep-loader``: only ``lance-prefetch``, and :data:`SWEEP_GRID` for each grid
    option not given (``io_grid`` on a local dataset read without ``--io uring`` only)."""
    if not args.sweep_loader:
        return {}
    given = getattr(args, "given", set())
    grid: dict[str, object] = {"contenders": ("lance-prefetch",), "sweep_loader": True}
    local = not args.local_s3 and args.io != "uring" and _scheme(args.uri or "") in ("", "file")
    for name, values in SWEEP_GRID.items():
        if name == "io_grid" and not local:
            continue
        if name not in given:
            grid[name] = values
    return grid


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    """The :class:`BenchConfig` for parsed ``bench`` arguments (``--sweep-loader``: see
    :func:`_sweep_grid`).

    Raises:
        ValueError: as :class:`BenchConfig`.
    """
    settings = {
        "readahead": args.readahead,
        "max_in_flight": args.max_in_flight,
        "coalesce": args.coalesce,
        "io_grid": args.io_grid,
        "contenders": args.contenders,
    } | _sweep_grid(args)
    return BenchConfig(
        **settings,  # type: ignore[arg-type]
        uri=args.uri,
        local_s3=args.local_s3,
        rows=args.rows,
        rows_per_file=args.rows_per_file,
        storage_options=dict(args.storage_option),
        columns=args.columns,
        batch_size=args.batch_size,
        batches=args.batches,
        warmup_batches=args.warmup_batches,
        seed=args.seed,
        step_ms=args.step_ms,
        cache=args.cache,
        hedge=args.hedge,
        repeats=args.repeats,
        ceiling_concurrency=args.ceiling_concurrency,
        ceiling_repeats=args.ceiling_repeats,
        coalesced_ceiling_concurrency=args.coalesced_ceiling_concurrency,
        map_workers=args.map_workers,
        grain_threads=args.grain_threads,
        spdl_concurrency=args.spdl_concurrency,
        streaming_splits=args.streaming_splits,
        latency=Latency(
            delay_ms=args.delay_ms,
            jitter_ms=args.jitter_ms,
            tail_fraction=args.tail_fraction,
            tail_ms=args.tail_ms,
            seed=args.latency_seed,
        ),
        aimd_rate=args.aimd_rate,
        io=args.io,
        io_threads=args.io_threads,
        id_column=args.id_column or None,
        record_ids=args.record_ids,
        out_dir=args.out,
        name=args.name,
        contender_timeout_s=args.contender_timeout_s,
        progress=not args.no_progress,
        targets=args.targets,
    )
