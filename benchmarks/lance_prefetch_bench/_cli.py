"""The ``lance-prefetch-bench`` command (also ``lance-prefetch bench`` and
``python -m lance_prefetch_bench``).

Reads the same random batches with each contender, each in its own process, and writes
``NAME.json``, ``NAME.md`` and ``NAME.png`` to ``--out`` (see :mod:`lance_prefetch_bench`).
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from collections.abc import Sequence

from lance_prefetch_bench._arguments import add_arguments

__all__ = ["main"]

DESCRIPTION = (
    "Read the same random batches with each contender (sequential takes, a map-style "
    "DataLoader, lance.torch, a raw thread-pool ceiling, the peer loaders, and PrefetchLoader "
    "over a readahead x max_in_flight grid), each in its own process, and write NAME.json, "
    "NAME.md and NAME.png to --out. --local-s3 also needs nginx (apt-get install nginx-light)."
)


def parser(prog: str = "lance-prefetch-bench") -> argparse.ArgumentParser:
    """The command's argument parser, named ``prog`` in its usage and errors."""
    bench = argparse.ArgumentParser(prog=prog, description=DESCRIPTION, formatter_class=_Formatter)
    add_arguments(bench)
    bench.add_argument("-v", "--verbose", action="store_true", help="log what is being set up")
    return bench


class _Formatter(argparse.HelpFormatter):
    """Help lines that end with each option's default, as it is typed (``1,4,16,64``); an option
    whose default is ``None`` or a flag's ``False`` states its default in its own help."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if (
            not action.option_strings
            or "(default" in text
            or default is None
            or default is argparse.SUPPRESS
            or isinstance(default, bool)
        ):
            return text
        if isinstance(default, (tuple, list)) and not default:
            shown = "none"
        elif isinstance(default, (tuple, list)):
            shown = ",".join(str(value) for value in default)
        else:
            shown = str(default)
        return f"{text} (default: {shown.replace('%', '%%')})".lstrip()


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def _missing_modules() -> list[str]:
    missing = []
    for module in ("tqdm", "psutil", "matplotlib"):
        try:
            __import__(module)
        except ModuleNotFoundError:
            missing.append(module)
    return missing


def _run(args: argparse.Namespace) -> int:
    missing = _missing_modules()
    if missing:
        print(
            f"ModuleNotFoundError: the bench needs {', '.join(missing)}; install the bench: "
            f"pip install lance-prefetch-bench (in a checkout: pip install -e benchmarks)",
            file=sys.stderr,
        )
        return 1
    from lance_prefetch_bench._arguments import config_from_args
    from lance_prefetch_bench.report import to_markdown
    from lance_prefetch_bench.run import run_bench
    from lance_prefetch_bench.verdicts import defaults_vs_best, failures, same_rows_verdict

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
    plots = str(paths["plot"]) + (f" and {paths['grid_plot']}" if "grid_plot" in paths else "")
    print(f"wrote {paths['json']}, {paths['markdown']} and {plots}")
    versus = defaults_vs_best(report["contenders"])
    if config.sweep_loader and versus is not None:
        print(
            f"defaults/best: {versus['ratio']:.2f}x ({versus['defaults']:,.0f} vs "
            f"{versus['best']:,.0f} rows/s, {versus['best_label']})"
        )
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


def main(argv: Sequence[str] | None = None, prog: str = "lance-prefetch-bench") -> int:
    """Run the bench with the command line ``argv`` (default: ``sys.argv[1:]``); return the exit
    status.

    Args:
        argv: the arguments after the command's name (``--local-s3 --rows 1000``, ...).
        prog: the command's name in usage and error lines (``lance-prefetch bench`` when the
            library's command forwards here).

    Returns:
        int: 0 when every contender ran and all read the same rows; 1 when one failed, the rows
        differed, or an error (bad arguments, missing dataset, failed batch, missing module) was
        printed as ``TypeName: message``; 130 on Ctrl-C and 143 on SIGTERM, after a last line
        ``interrupted: N of M contender runs finished; their results are in ...`` (the outputs
        hold the finished runs). Bad command-line syntax exits with argparse's status 2.
    """
    args = parser(prog).parse_args(argv)
    try:
        return _run(args)
    except (TypeError, ValueError, OSError, RuntimeError) as exc:
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as exc:
        from lance_prefetch_bench.run import BenchInterrupted

        if not isinstance(exc, BenchInterrupted):
            print("interrupted", file=sys.stderr)
            return 130
        where = (
            f"; their results are in {exc.paths['json']} and {exc.paths['markdown']}"
            if exc.paths
            else "; nothing was written"
        )
        print(
            f"interrupted: {exc.finished} of {exc.planned} contender runs finished{where}",
            file=sys.stderr,
        )
        return exc.exit_code
