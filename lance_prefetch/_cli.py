"""The ``lance-prefetch`` command (also ``python -m lance_prefetch``).

``lance-prefetch demo`` trains a small classifier through :class:`~lance_prefetch.PrefetchLoader`
on scikit-learn's digits (or on ``--uri``) and prints, per epoch, the loss, held-out accuracy,
rows/s and the fraction of wall time the training loop waited for data.

``lance-prefetch bench`` measures PrefetchLoader against the usual alternatives on one dataset,
local or S3 (or an emulated S3 on 127.0.0.1 with ``--local-s3``), and writes a JSON file, a
Markdown table and a plot (see :mod:`lance_prefetch._bench`).
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from collections.abc import Sequence

__all__ = ["main"]


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"should be an integer >= 1, got {value}")
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
    bench = commands.add_parser(
        "bench",
        help="measure PrefetchLoader against the usual ways to read random batches",
        description="Read the same random batches with each contender (sequential takes, a "
        "map-style DataLoader, lance.torch, a raw thread-pool ceiling, and PrefetchLoader over a "
        "readahead x max_in_flight grid), each in its own process, and write NAME.json, NAME.md "
        "and NAME.png to --out. Needs the bench extra (pip install 'lance-prefetch[bench]'); "
        "--local-s3 also needs nginx (apt-get install nginx-light).",
    )
    from lance_prefetch._bench._arguments import add_arguments

    add_arguments(bench)
    bench.add_argument("-v", "--verbose", action="store_true", help="log what is being set up")
    return parser


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def _run_bench(args: argparse.Namespace) -> int:
    missing = []
    for module in ("tqdm", "psutil", "matplotlib"):
        try:
            __import__(module)
        except ModuleNotFoundError:
            missing.append(module)
    if missing:
        print(
            f"ModuleNotFoundError: the bench needs {', '.join(missing)}; install the bench extra: "
            f"pip install 'lance-prefetch[bench]'",
            file=sys.stderr,
        )
        return 1
    from lance_prefetch._bench._arguments import config_from_args
    from lance_prefetch._bench.report import to_markdown
    from lance_prefetch._bench.run import run_bench
    from lance_prefetch._bench.verdicts import failures, same_rows_verdict

    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    config = config_from_args(args)
    try:  # `kill` (SIGTERM) unwinds like Ctrl-C does, so the servers and contenders are stopped
        previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    except ValueError:  # not the main thread: leave signals alone
        previous = None
    try:
        report, paths = run_bench(config)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    print(to_markdown(report, plot_name=str(paths["plot"])))
    print(f"wrote {paths['json']}, {paths['markdown']} and {paths['plot']}")
    failed = failures(report["contenders"])
    if failed:
        print(
            f"RuntimeError: {len(failed)} contender(s) failed: {', '.join(failed)}", file=sys.stderr
        )
        return 1
    verdict = same_rows_verdict(report["ids_check"])
    if verdict != "yes":
        message = "the contenders did not read the same rows" if verdict == "NO" else verdict
        print(f"RuntimeError: {message}", file=sys.stderr)
        return 1
    return 0


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


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line ``argv`` (default: ``sys.argv[1:]``); return the exit status.

    Errors from the library (bad arguments, missing dataset, failed batch) are printed as
    ``TypeName: message`` and give exit status 1.
    """
    args = _parser().parse_args(argv)
    try:
        if args.command == "demo":
            return _run_demo(args)
        if args.command == "bench":
            return _run_bench(args)
    except (TypeError, ValueError, OSError, RuntimeError) as exc:
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return 2
