"""The ``lance-prefetch`` command (also ``python -m lance_prefetch``).

``lance-prefetch demo`` trains a small classifier through :class:`~lance_prefetch.PrefetchLoader`
on scikit-learn's digits (or on ``--uri``) and prints, per epoch, the loss, held-out accuracy,
rows/s and the fraction of wall time the training loop waited for data.

``lance-prefetch info URI`` describes a dataset before training: each column's tensor form,
rows, fragments, versions and tags, bytes a row, the memory a ``cache="memory"`` copy takes and a
few seconds' rows/s through the loader (``--json``: the same as one JSON object). A bad argument
(not a dataset, an unknown column or version, a malformed or refused ``--storage-option``) is one
line on stderr naming it, and exit status 2, before any long work.

``lance-prefetch bench ...`` runs ``lance-prefetch-bench ...``: the benchmark that measures
PrefetchLoader against the usual alternatives is a distribution of its own
(``lance-prefetch-bench``, ``benchmarks/`` in a checkout), outside the library's wheel. When it is
not installed, the command prints how to install it and exits with status 2.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lance_prefetch import _info

__all__ = ["main"]


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"should be an integer >= 1, got {value}")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"should be a number of seconds >= 0, got {text!r}")
    return value


def _depth(text: str) -> int | str:
    """An integer >= 1 or ``auto`` (``--readahead``, ``--max-in-flight``)."""
    if text == "auto":
        return text
    try:
        return _positive_int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"should be an integer >= 1 or auto, got {text!r}"
        ) from None


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lance-prefetch", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser(
        "demo",
        help="train a small classifier through PrefetchLoader and report per-epoch figures",
        description="Train a small classifier through PrefetchLoader. Without --uri, writes "
        "scikit-learn's handwritten digits (1,797 real 8x8 images) to --data-dir and trains on "
        "them; with --uri, the last of --columns is the integer label, the others are features.",
    )
    demo.add_argument("--data-dir", default="demo-data", help="where the digits datasets go")
    demo.add_argument("--uri", help="train on this Lance dataset instead of the digits")
    demo.add_argument("--eval-uri", help="held-out Lance dataset (default: the digits' test split)")
    demo.add_argument(
        "--columns", default="image,label", help="comma-separated: features..., label"
    )
    demo.add_argument("--batch-size", type=_positive_int, default=64)
    demo.add_argument(
        "--readahead", type=_depth, default="auto", help="an integer, or auto (default)"
    )
    demo.add_argument(
        "--max-in-flight", type=_depth, default="auto", help="an integer, or auto (default)"
    )
    demo.add_argument(
        "--cache",
        choices=("none", "memory", "disk"),
        default="none",
        help="serve the epochs from a copy filled by one scan (default: none)",
    )
    demo.add_argument("--epochs", type=_positive_int, default=5)
    demo.add_argument("--seed", type=int, default=0)
    info = commands.add_parser(
        "info",
        help="describe a dataset: tensor forms, rows, versions, bytes a row, cache size, rows/s",
        description="Describe a Lance dataset as PrefetchLoader would read it: each column's "
        "tensor form (dtype[per-row shape], or what is delivered instead), rows, fragments, "
        "versions and tags, Arrow bytes a row, the memory a cache='memory' copy takes, and "
        "the rows/s of a real loader run of --seconds seconds.",
    )
    info.add_argument("uri", metavar="URI", help="the dataset (local path, file://, s3://, ...)")
    info.add_argument("--columns", help="comma-separated columns (default: all)")
    info.add_argument("--version", help="version number or tag (default: the latest)")
    info.add_argument(
        "--storage-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a storage option for Lance (repeat for more), e.g. aws_endpoint=http://...",
    )
    info.add_argument(
        "--batch-size", type=_positive_int, default=256, help="the timed run's (default: 256)"
    )
    info.add_argument(
        "--seconds",
        type=_seconds,
        default=3.0,
        help="how long the loader runs for rows/s; 0: no run (default: 3)",
    )
    info.add_argument("--json", action="store_true", help="print one JSON object")
    commands.add_parser(
        "bench",
        add_help=False,  # `lance-prefetch bench --help` is the bench's own help
        help="measure PrefetchLoader against the usual ways to read random batches "
        "(runs lance-prefetch-bench, installed apart: pip install -e benchmarks)",
    )
    return parser


#: The one line printed when ``lance-prefetch bench`` finds no bench to run.
BENCH_HINT = (
    "lance-prefetch bench needs the lance-prefetch-bench distribution, which is not installed: "
    "pip install -e benchmarks (from a checkout), or run make bench"
)


def _run_bench(argv: Sequence[str]) -> int:
    """Forward ``argv`` (what follows ``bench``) to ``lance_prefetch_bench``'s command, imported by
    name so that the library never depends on it; 2 and :data:`BENCH_HINT` when it is absent."""
    try:
        bench = importlib.import_module("lance_prefetch_bench._cli")
    except ModuleNotFoundError as exc:
        if exc.name in ("lance_prefetch_bench", "lance_prefetch_bench._cli"):
            print(BENCH_HINT, file=sys.stderr)
            return 2
        print(
            f"ModuleNotFoundError: {exc}; reinstall the bench: pip install -e benchmarks",
            file=sys.stderr,
        )
        return 1
    return bench.main(argv, prog="lance-prefetch bench")


def _run_demo(args: argparse.Namespace) -> int:
    try:
        from lance_prefetch import _demo as demo
    except (
        ModuleNotFoundError
    ) as exc:  # torch-free installs never reach here; sklearn may be absent
        print(f"{exc}; install the demo extra: pip install 'lance-prefetch[demo]'", file=sys.stderr)
        return 1
    uri, eval_uri = args.uri, args.eval_uri
    if uri is None:
        uri, default_eval = demo.write_digits(args.data_dir)
        eval_uri = eval_uri or default_eval
        print(f"wrote scikit-learn's digits to {uri} (train) and {default_eval} (held out)")
    columns = [name.strip() for name in args.columns.split(",") if name.strip()]
    print(
        f"training on {uri}: columns={columns} batch_size={args.batch_size} "
        f"readahead={args.readahead} max_in_flight={args.max_in_flight} cache={args.cache} "
        f"epochs={args.epochs}"
    )

    def show(report: demo.EpochReport) -> None:
        accuracy = "n/a" if report.accuracy is None else f"{report.accuracy:.3f}"
        print(
            f"epoch {report.epoch}: loss {report.loss:.4f}  held-out accuracy {accuracy}  "
            f"rows/s {report.rows_per_s:,.0f}  waiting for data {report.wait_fraction:.1%} "
            f"of {report.seconds:.2f} s",
            flush=True,
        )
        print(f"  loader.stats(): {report.stats}", flush=True)

    demo.train(
        uri,
        eval_uri=eval_uri,
        columns=columns,
        batch_size=args.batch_size,
        readahead=args.readahead,
        max_in_flight=args.max_in_flight,
        cache=None if args.cache == "none" else args.cache,
        epochs=args.epochs,
        seed=args.seed,
        report=show,
    )
    return 0


def _storage_options(pairs: Sequence[str]) -> dict[str, str] | None:
    """``KEY=VALUE`` strings as a mapping (``None`` for none).

    Raises:
        ValueError: a pair has no ``=`` or an empty key.
    """
    options = {}
    for pair in pairs:
        key, equals, value = pair.partition("=")
        if not equals or not key.strip():
            raise ValueError(f"should be KEY=VALUE, got {pair!r}")
        options[key.strip()] = value
    return options or None


def _run_info(args: argparse.Namespace) -> int:
    from lance_prefetch import _info

    try:
        storage_options = _storage_options(args.storage_option)
    except ValueError as exc:
        print(f"lance-prefetch info: --storage-option: {exc}", file=sys.stderr)
        return 2
    columns = None
    if args.columns is not None:
        columns = [name.strip() for name in args.columns.split(",") if name.strip()]
    version = args.version
    if version is not None and version.strip().isdigit():
        version = int(version)
    try:
        source = _info.open_source(
            args.uri, columns=columns, version=version, storage_options=storage_options
        )
    except _info.ArgumentError as exc:
        print(f"lance-prefetch info: {exc}", file=sys.stderr)
        return 2
    found = _info.describe(
        source,
        batch_size=args.batch_size,
        seconds=args.seconds,
        storage_options=storage_options,
    )
    if args.json:
        print(json.dumps(found.as_dict()))
    else:
        print(_info_text(found))
    return 0


def _mib(size: float) -> str:
    return f"{size:,.0f} bytes ({size / 2**20:,.1f} MiB)"


def _info_text(found: _info.DatasetInfo) -> str:
    """``lance-prefetch info``'s report, one fact a line."""
    versions = ", ".join(str(v) for v, _ in found.versions)
    tags = ", ".join(f"{name} -> {v}" for name, v in found.tags.items()) or "none"
    width = max(len(c.name) for c in found.columns) if found.columns else 0
    lines = [
        f"dataset    {found.uri} (version {found.version})",
        f"rows       {found.rows:,}",
        f"fragments  {found.fragments:,}",
        f"versions   {len(found.versions)}: {versions}",
        f"tags       {tags}",
        "columns    name: Arrow type -> tensor form (dtype[per-row shape]) or what is delivered",
    ]
    for c in found.columns:
        form = (
            c.tensor
            if c.tensor is not None
            else f"none: {c.why}"
            if c.delivers == "nothing"
            else f"no tensor: {c.delivers} ({c.why})"
        )
        lines.append(f"  {c.name:<{width}}  {c.arrow_type} -> {form}")
    how = (
        "exact: fixed-width columns"
        if found.row_bytes_exact
        else f"Arrow bytes of {found.sample_rows:,} sampled rows / rows, fixed-width columns exact"
    )
    lines.append(f"bytes/row  {found.row_bytes:,.1f} ({how})")
    fits = "fits" if found.cache_bytes <= found.cache_limit else "does NOT fit"
    lines.append(
        f"cache      cache='memory' takes {_mib(found.cache_bytes)} "
        f"({'exact' if found.row_bytes_exact else 'estimated'}: bytes/row x rows); {fits} "
        f"the default limit, {_mib(found.cache_limit)} (half the physical memory)"
    )
    run = found.throughput
    if run is None:
        lines.append("rows/s     not measured (no run asked for, no rows, or no column converts)")
    else:
        lines.append(
            f"rows/s     {run.rows_per_s:,.0f} (PrefetchLoader defaults, batch_size="
            f"{run.batch_size}: {run.rows:,} rows in {run.seconds:.2f} s, columns "
            f"{list(run.columns)})"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line ``argv`` (default: ``sys.argv[1:]``); return the exit status.

    Errors from the library (bad arguments, missing dataset, failed batch) are printed as
    ``TypeName: message`` and give exit status 1. ``info`` gives 2 and one line naming the
    argument at fault (``URI``, ``--columns``, ``--version``, ``--storage-option``) for a bad
    argument, before any long work. ``bench ...`` returns what
    ``lance-prefetch-bench ...`` returns, or 2 with a one-line install hint on stderr when the
    ``lance_prefetch_bench`` package is not installed.
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["bench"]:  # the bench parses its own arguments
        return _run_bench(argv[1:])
    args = _parser().parse_args(argv)
    try:
        if args.command == "demo":
            return _run_demo(args)
        if args.command == "info":
            return _run_info(args)
    except (TypeError, ValueError, OSError, RuntimeError) as exc:
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return 2
