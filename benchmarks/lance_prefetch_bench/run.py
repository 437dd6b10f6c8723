"""The benchmark run: set up the data (and the emulated S3), run each contender, write the report.

Entry points: :func:`run_bench` (a :class:`~lance_prefetch_bench.config.BenchConfig` in, a
report dict out) and the ``lance-prefetch-bench`` command (:mod:`~lance_prefetch_bench._cli`;
its arguments are in :mod:`~lance_prefetch_bench._arguments`).
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

from lance_prefetch.sources._storage import redact
from lance_prefetch_bench import _environment as environment
from lance_prefetch_bench._process import sigint_ignored
from lance_prefetch_bench._spec import KINDS, SWEPT_KINDS, UNIFORM, ContenderSpec
from lance_prefetch_bench.config import _LOCAL_SCHEMES, BenchConfig, _scheme

__all__ = ["BenchConfig", "BenchInterrupted", "finished_line", "run_bench"]

logger = logging.getLogger(__name__)

_MIB = 2**20
CEILINGS = ("ceiling", "coalesced-ceiling")


class BenchInterrupted(KeyboardInterrupt):
    """The run was stopped (Ctrl-C, or SIGTERM through the command) after ``finished`` of its
    ``planned`` contender runs; their results are in ``paths`` (empty when none had finished).

    Attributes:
        finished (int): contender runs that had finished. planned (int): contender runs planned.
        paths (dict[str, Path]): the outputs holding them, keyed ``json``, ``markdown``, ``plot``.
        exit_code (int): the exit status the command should give: 130 for Ctrl-C, ``128 + N``
            for signal ``N``.
    """

    def __init__(self, finished: int, planned: int, paths: dict[str, Path], exit_code: int) -> None:
        super().__init__(f"interrupted after {finished} of {planned} contender runs")
        self.finished, self.planned, self.paths, self.exit_code = (
            finished,
            planned,
            paths,
            exit_code,
        )


def run_bench(config: BenchConfig) -> tuple[dict[str, Any], dict[str, Path]]:
    """Run the benchmark that ``config`` describes; stop everything it started, whatever happens.

    The outputs (JSON, Markdown, PNG; see :func:`~lance_prefetch_bench.report.write_outputs`) are
    rewritten, each file replaced atomically, after every contender run that finishes, so a run
    that is stopped or killed leaves the finished runs' results on disk (``meta.progress`` says
    how many of how many).

    Returns:
        tuple[dict, dict[str, Path]]: the report (see :mod:`~lance_prefetch_bench.report`) and
        the paths of the JSON, Markdown and PNG files written.

    Raises:
        FileNotFoundError: no dataset at ``uri``, or nginx/rclone missing for ``local_s3``.
        ValueError: a column is not in the dataset, or it has fewer rows than one batch.
        BenchInterrupted: Ctrl-C (a ``KeyboardInterrupt``), or a ``SystemExit`` raised while it
            ran (the command's SIGTERM handler); the servers, contender processes and temporary
            files are gone when it propagates, and the outputs hold the finished runs.
    """
    started = time.perf_counter()
    load_start = environment.load_average()
    stack = contextlib.ExitStack()
    results: list[dict[str, Any]] = []
    progress: dict[str, Any] = {"finished": 0, "planned": 0, "complete": False, "interrupted": None}
    meta: dict[str, Any] | None = None
    paths: dict[str, Path] = {}

    def write() -> dict[str, Any]:
        from lance_prefetch_bench import report as reporting

        assert meta is not None
        progress["finished"] = len(results)
        report = _assemble(config, meta, results, started)
        paths.update(reporting.write_outputs(report, Path(config.out_dir), config.name))
        return report

    try:
        try:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="lance-bench-")))
            uri, options, storage = _prepare_storage(config, stack, workdir)
            dataset = _describe_dataset(uri, options, config)
            meta = {
                "created": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
                "machine": environment.machine(),
                "versions": environment.versions(config.local_s3),
                "dataset": dataset,
                "storage": storage,
                "settings": _settings(config, dataset),
                "load_average_start": load_start,
                "progress": progress,
            }
            _run_contenders(
                config,
                uri,
                options,
                dataset,
                workdir,
                results=results,
                progress=progress,
                on_finished=lambda: write(),
            )
        finally:
            with sigint_ignored():
                stack.close()
    except (KeyboardInterrupt, SystemExit) as exc:
        code = 130 if isinstance(exc, KeyboardInterrupt) else _exit_code(exc)
        progress["interrupted"] = "Ctrl-C" if code == 130 else f"exit status {code}"
        if meta is not None and results:
            with sigint_ignored():
                write()
        raise BenchInterrupted(len(results), progress["planned"], paths, code) from exc
    progress["complete"] = True
    report = write()
    return report, dict(paths)


def _exit_code(exc: SystemExit) -> int:
    return exc.code if isinstance(exc.code, int) else 1


def _assemble(
    config: BenchConfig, meta: dict[str, Any], results: list[dict[str, Any]], started: float
) -> dict[str, Any]:
    """The report of the contender runs finished so far (the runs themselves are not changed)."""
    from lance_prefetch_bench import verdicts

    report: dict[str, Any] = {
        "meta": {
            **meta,
            "progress": dict(meta["progress"]),
            "load_average_end": environment.load_average(),
            "total_s": time.perf_counter() - started,
        },
        "ids_check": verdicts.check_ids(results),  # every run, every round
        "contenders": verdicts.merge_rounds(results),
    }
    if config.targets:  # development targets: only when asked for
        report["targets"] = verdicts.evaluate_targets(report)
    report["comparisons"] = verdicts.comparisons(report["contenders"])
    return report


# -- storage and data ------------------------------------------------------------------------------
def _prepare_storage(
    config: BenchConfig, stack: contextlib.ExitStack, workdir: Path
) -> tuple[str, dict[str, str], dict[str, Any]]:
    """(uri, storage options for the contenders, storage description)."""
    from lance_prefetch_bench.data import write_synthetic

    options = dict(config.storage_options)
    servers = None
    if config.local_s3:
        from lance_prefetch_bench.local_s3 import LocalS3

        s3 = stack.enter_context(LocalS3(latency=config.latency))
        uri = s3.uri("bench.lance")
        logger.info("writing %d rows to %s", config.rows, uri)
        # Written without the added latency (faster); read through it.
        write_synthetic(
            uri,
            config.rows,
            rows_per_file=config.rows_per_file,
            storage_options=s3.storage_options(with_latency=False),
            seed=config.seed,
        )
        options = {**s3.storage_options(), **options}
        servers = {"pids": list(s3.pids), "ports": list(s3.ports)}
        kind = "emulated S3"
        description = (
            f"emulated S3 on 127.0.0.1 (nginx {environment.nginx_version()} for object GET/HEAD, rclone serve "
            f"s3 for the rest), latency proxy adding {config.latency.describe()} per request "
            f"(seed {config.latency.seed})"
        )
    elif config.uri is None:
        uri = str(workdir / "bench.lance")
        logger.info("writing %d rows to %s", config.rows, uri)
        write_synthetic(uri, config.rows, rows_per_file=config.rows_per_file, seed=config.seed)
        kind, description = "local disk", f"synthetic dataset in a temporary folder ({workdir})"
    else:
        uri = config.uri
        remote = _scheme(uri) not in _LOCAL_SCHEMES
        kind = "object store" if remote else "local disk"
        description = uri if not remote else f"{uri} ({_endpoint(options)})"
    remote = kind != "local disk"
    if config.io == "uring":
        from lance_prefetch.sources._uris import uring_uri

        uri = uring_uri(uri)
        description += f", read through Lance's io_uring reader ({uri})"
    limiter = "not used (local files)"
    if remote:
        given = {"lance_aimd_initial_rate", "lance_aimd_max_rate"} & set(options)
        if given:
            limiter = ", ".join(f"{key}={options[key]}" for key in sorted(given)) + " (given)"
        elif config.aimd_rate:
            rate = str(config.aimd_rate)
            options.update(lance_aimd_initial_rate=rate, lance_aimd_max_rate=rate)
            limiter = f"pinned at {rate} requests/s (lance_aimd_initial_rate = lance_aimd_max_rate)"
        else:
            limiter = "Lance's default (starts near 2,000 requests/s and ramps up)"
    io_threads = config.io_threads or os.environ.get("LANCE_IO_THREADS")
    storage = {
        "kind": kind,
        "description": description,
        "latency": asdict(config.latency) if config.local_s3 else None,
        "limiter": limiter,
        "lance_io_threads": str(io_threads)
        if io_threads
        else "unset (Lance's default: 64 for object stores, 8 for local files)",
        "storage_options": redact(options),
        "servers": servers,
    }
    return uri, options, storage


def _endpoint(options: Mapping[str, str]) -> str:
    for key in ("aws_endpoint", "endpoint", "aws_endpoint_url"):
        if key in options:
            return f"endpoint {options[key]}"
    return "default endpoint"


def _describe_dataset(uri: str, options: dict[str, str], config: BenchConfig) -> dict[str, Any]:
    import lance

    try:
        dataset = lance.dataset(uri, storage_options=options or None)
    except ValueError as exc:
        if "not found" in str(exc).lower():
            raise FileNotFoundError(f"no Lance dataset at {uri!r}: {exc}") from exc
        raise
    names = dataset.schema.names
    columns = list(config.columns) if config.columns else names
    unknown = [name for name in columns if name not in names]
    if unknown:
        raise ValueError(
            f"columns {unknown} are not in the dataset {uri!r}; its columns are {names}"
        )
    rows = dataset.count_rows()
    if rows < config.batch_size:
        raise ValueError(
            f"the dataset {uri!r} has {rows} rows, fewer than one batch of {config.batch_size}"
        )
    sample = dataset.take(list(range(min(rows, 256))), columns=columns)
    return {
        "uri": uri,
        "version": dataset.version,
        "rows": rows,
        "fragments": len(dataset.get_fragments()),
        "columns": columns,
        "bytes_per_row": sample.nbytes / sample.num_rows,
        "synthetic": config.uri is None,
    }


# -- contenders ------------------------------------------------------------------------------------
def _settings(config: BenchConfig, dataset: Mapping[str, Any]) -> dict[str, Any]:
    per_epoch = dataset["rows"] // config.batch_size
    batches = min(config.batches, per_epoch)
    if batches < config.batches:
        logger.warning(
            "an epoch has only %d batches of %d rows; reading %d per pass, not %d",
            per_epoch,
            config.batch_size,
            batches,
            config.batches,
        )
    return {
        "batch_size": config.batch_size,
        "batches": batches,
        "batches_asked": config.batches,
        "warmup_batches": config.warmup_batches,
        "seed": config.seed,
        "step_ms": config.step_ms,
        "grid": config.grid(),
        "coalesce": list(config.coalesce),
        "cache": list(config.cache),
        "hedge": list(config.hedge),
        "repeats": config.repeats,
        "ceiling_concurrency": list(config.ceiling_concurrency),
        "ceiling_repeats": config.ceiling_repeats,
        "coalesced_ceiling_concurrency": list(config.coalesced_ceiling_concurrency),
        "io_grid": list(config.io_grid),
        "map_workers": list(config.map_workers),
        "grain_threads": list(config.grain_threads),
        "spdl_concurrency": list(config.spdl_concurrency),
        "streaming_splits": list(config.streaming_splits),
        "contenders": list(config.contenders),
        "sweep_loader": config.sweep_loader,
    }


def _plan(config: BenchConfig, base: dict[str, Any]) -> list[tuple[int, str, dict, ContenderSpec]]:
    """(round, label, settings, spec) of each contender process, in the order they run: every
    contender in round 0, then ``repeats - 1`` rounds of every contender but the ceilings (which
    repeat themselves: ``ceiling_repeats``) and the peers that are not installed, each round's order
    rotated by one more."""
    from lance_prefetch_bench._peer_contenders import missing_peer

    runs = _round_zero(config, base)
    repeated = [
        run for run in runs if run[2].kind not in CEILINGS and missing_peer(run[2].kind) is None
    ]
    for index in range(1, config.repeats if repeated else 1):
        shift = index % len(repeated)
        runs.extend(repeated[shift:] + repeated[:shift])
    planned, count = [], dict.fromkeys((label for label, _, _ in runs), 0)
    for label, settings, spec in runs:
        planned.append((count[label], label, settings, spec))
        count[label] += 1
    return planned


def _round_zero(config: BenchConfig, base: dict[str, Any]) -> list[tuple[str, dict, ContenderSpec]]:
    runs = []
    for kind in KINDS:
        if kind not in config.contenders:
            continue
        if kind == "lance-prefetch":
            spec = ContenderSpec(kind=kind, defaults=True, **base)
            runs.append((f"{kind} defaults", {"defaults": True, **_loader_defaults()}, spec))
            for settings in config.prefetch_settings():
                spec = ContenderSpec(kind=kind, **settings, **base)
                runs.append((_prefetch_label(config, settings), settings, spec))
            continue
        if kind in SWEPT_KINDS:  # a peer, or map-style: every value of its concurrency knob
            parameter, field = SWEPT_KINDS[kind]
            for value in dict.fromkeys(_sweep_values(config, kind)):
                spec = ContenderSpec(kind=kind, **{field: value}, **base)
                runs.append((f"{kind} {parameter}={value}", {parameter: value}, spec))
            continue
        settings: dict[str, Any] = {}
        extra: dict[str, Any] = {}
        if kind == "ceiling":
            extra["concurrency"] = settings["concurrency"] = list(config.ceiling_concurrency)
            extra["ceiling_repeats"] = settings["repeats"] = config.ceiling_repeats
        elif kind == "coalesced-ceiling":  # the takes of the loader's defaults
            extra["concurrency"] = settings["concurrency"] = list(
                config.coalesced_ceiling_concurrency
            )
            extra["ceiling_repeats"] = settings["repeats"] = config.ceiling_repeats
            extra["defaults"] = True
            settings |= _loader_defaults()
        elif kind in ("lance-map", "lance-map-rows"):
            extra["num_workers"] = settings["num_workers"] = config.map_workers[0]
        elif kind == "prefetch-workers":
            extra["num_workers"] = settings["num_workers"] = 2
            extra["readahead"] = settings["readahead"] = 8
            extra["max_in_flight"] = settings["max_in_flight"] = 4
        elif kind in ("lance-torch", "scan"):
            settings["batch_readahead"] = 16
        runs.append((kind, settings, ContenderSpec(kind=kind, **extra, **base)))
    return runs


def _sweep_values(config: BenchConfig, kind: str) -> tuple[int, ...]:
    """The values of ``kind``'s concurrency knob the run tries (see :data:`SWEPT_KINDS`)."""
    return {
        "map-style": config.map_workers,
        "grain": config.grain_threads,
        "spdl": config.spdl_concurrency,
        "lancedb-streaming": config.streaming_splits,
    }[kind]


def _loader_defaults() -> dict[str, Any]:
    """``PrefetchLoader``'s defaults of the settings the grid varies (``readahead``, and
    ``max_in_flight`` and ``coalesce`` of its ``ReadOptions``)."""
    import inspect

    from lance_prefetch import PrefetchLoader, ReadOptions

    read = ReadOptions()
    return {
        "readahead": inspect.signature(PrefetchLoader).parameters["readahead"].default,
        "max_in_flight": read.max_in_flight,
        "coalesce": read.coalesce,
        "io": read.io,
    }


def _prefetch_label(config: BenchConfig, settings: Mapping[str, Any]) -> str:
    """``lance-prefetch r16/m4``, with ``c<coalesce>`` when the run compares or sets coalescing
    and the cache when there is one."""
    r, m = settings["readahead"], settings["max_in_flight"]
    label = "lance-prefetch auto" if r == "auto" else f"lance-prefetch r{r}/m{m}"
    if len(set(config.coalesce)) > 1 or settings["coalesce"] != "auto":
        label += f" c{settings['coalesce']}"
    if settings["cache"] != "none":
        label += f" {settings['cache']}"
    if settings.get("hedge", "auto") != "auto":
        label += f" hedge={settings['hedge']}"
    if settings.get("io", "auto") != "auto":
        label += f" io={settings['io']}"
    return label


def _ticks(spec: ContenderSpec) -> int:
    if spec.kind == "ceiling":
        return spec.batches * len(spec.concurrency) * spec.ceiling_repeats
    if spec.kind == "coalesced-ceiling":  # a tick a take, their number known in its process
        return 0
    return 2 * spec.batches


def _run_contenders(
    config: BenchConfig,
    uri: str,
    options: dict[str, str],
    dataset: Mapping[str, Any],
    workdir: Path,
    *,
    results: list[dict[str, Any]],
    progress: dict[str, Any],
    on_finished: Callable[[], Any],
) -> None:
    """Run every planned contender, appending each run's result to ``results`` and calling
    ``on_finished`` after each; ``progress["planned"]`` is set to the number of runs."""
    from tqdm import tqdm

    from lance_prefetch_bench._launch import run_isolated
    from lance_prefetch_bench._peer_contenders import missing_peer

    settings = _settings(config, dataset)
    base = {
        "uri": uri,
        "version": dataset["version"],
        "num_rows": dataset["rows"],
        "columns": dataset["columns"],
        "storage_options": options or None,
        "batch_size": config.batch_size,
        "batches": settings["batches"],
        "warmup_batches": config.warmup_batches,
        "seed": config.seed,
        "step_ms": config.step_ms,
        "id_column": config.id_column,
        "record_ids": config.record_ids,
    }
    env = dict(os.environ)
    if config.io_threads:
        env["LANCE_IO_THREADS"] = str(config.io_threads)
    runs = _plan(config, base)
    progress["planned"] = len(runs)
    with tqdm(
        total=sum(_ticks(spec) for *_, spec in runs),
        unit="batch",
        disable=None if config.progress else True,  # None: only on a terminal
        file=sys.stderr,
        dynamic_ncols=True,
    ) as bar:
        for index, (round_, label, run_settings, spec) in enumerate(runs):
            bar.set_description(f"{label} ({index + 1}/{len(runs)})")
            started = time.perf_counter()
            missing = missing_peer(spec.kind)
            if missing is not None:  # a peer that is not installed: a row saying so
                bar.update(_ticks(spec))
                result: dict[str, Any] = {"skipped": missing}
            else:
                result = run_isolated(
                    spec,
                    workdir=workdir,
                    tag=f"{index:02d}-{spec.kind}",
                    env=env,
                    progress=bar.update,
                    timeout_s=config.contender_timeout_s,
                )
            if "error" in result:
                logger.warning("%s failed: %s\n%s", label, result["error"], result.get("log", ""))
            results.append(
                {
                    "name": spec.kind,
                    "label": label,
                    "settings": run_settings,
                    "round": round_,
                    "uniform": UNIFORM[spec.kind],
                    **result,
                }
            )
            on_finished()
            line = finished_line(results[-1], index + 1, len(runs), time.perf_counter() - started)
            if bar.disable:  # not on a terminal (CI, tee, nohup): one line a run, at once
                print(line, flush=True)
            else:
                bar.write(line, file=sys.stdout)


def finished_line(result: Mapping[str, Any], number: int, planned: int, seconds: float) -> str:
    """The line printed when a contender run finishes, e.g. ``[2/5] sequential: 2,138 rows/s,
    waited 61.0% (5.1 s)``, or ``... FAILED: why`` / ``... skipped: why``."""
    head = f"[{number}/{planned}] {result['label']}"
    if result.get("round"):
        head += f" (round {result['round'] + 1})"
    if "skipped" in result:
        return f"{head}: skipped: {result['skipped']}"
    if "error" in result:
        return f"{head}: FAILED: {result['error']} ({seconds:.1f} s)"
    throughput = result["passes"]["throughput"]
    text = f"{head}: {throughput['rows_per_s']:,.0f} rows/s"
    wait = result["passes"].get("step", {}).get("wait_fraction")
    if wait is not None:
        text += f", waited {wait:.1%}"
    return f"{text} ({seconds:.1f} s)"
