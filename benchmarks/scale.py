"""PrefetchLoader at scale: rows/s, peak RSS and time to first batch as the dataset grows, on the
emulated S3 and on local disk with a cold page cache.

For each of ``--sizes`` (rows of ``id`` int64, 128 x float32 ``vector``, ``label`` int64: 528
bytes a row, in files of ``--rows-per-file`` rows), the dataset is written once to
``--data-dir`` and reused by later runs. Every contender runs in its own fresh process, reads
256-row batches (``--batch-size``) for ``--seconds`` and reports rows/s (after a warm-up of
``min(5 s, seconds / 4)``; the warm-up's own rows/s beside it), its peak RSS (``ru_maxrss``), its
peak anonymous RSS (``RssAnon`` of ``/proc/self/status`` every 0.1 s: memory the process
allocated, without the pages of mapped files such as a disk cache's copy) and its time to
first batch (from the loader's construction, the dataset's opening included).

``--s3`` (the bench's emulated S3 on 127.0.0.1: nginx + rclone behind the latency proxy, 30 ms a
request +/- 10 ms, 1% of requests +150 ms, Lance's request rate pinned at 5,000/s; the cached
files are linked into its bucket, not copied), contenders:

* ``defaults``: ``PrefetchLoader(Dataset(uri, storage_options=...), 256)``;
* ``coalesce=1``: ``read=ReadOptions(coalesce=1)``, one take a batch: ``defaults`` over it is
  the coalescing gain, reported with the take's density (rows a take / rows in the dataset);
* ``disk-filling``: ``cache=DiskCache(dir=<new folder>)``: the fill's time (until the copy is
  published in the folder) and bandwidth (the dataset's bytes / that time), rows/s meanwhile;
  it reads until the fill ends (at most ``--fill-timeout``);
* ``disk-filled``: a new process over the same folder: rows/s once filled;
* ``memory``: ``cache="memory"``: the fill's time (until the takes are served by the cache, from
  ``stats().cache_hit_ratio``), then ``--seconds`` more for rows/s once filled; left out when
  the dataset's bytes exceed a third of the memory available.

``--local`` (the files themselves): ``defaults-cold`` after ``posix_fadvise(DONTNEED)`` of every
file of the dataset (the page cache emptied of it, no root needed; checked first by timing a
read of a part of the files after it and again) and ``defaults-warm`` after reading every file
once. Neither flag: both. Writes ``--out`` (JSON) and prints markdown tables. Run::

    PYTHONPATH=.:benchmarks .venv/bin/python benchmarks/scale.py --sizes 200k,2M,20M \\
        --seconds 30 --out scale.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

MIB = 2**20
ROW_BYTES = 8 + 128 * 4 + 8
_SUFFIXES = {"k": 1_000, "m": 1_000_000, "g": 1_000_000_000}
S3_CONTENDERS = ("defaults", "coalesce=1", "disk-filling", "disk-filled", "memory")
LOCAL_CONTENDERS = ("defaults-cold", "defaults-warm")
#: Part of the memory available a ``memory`` contender's dataset may take.
MEMORY_SHARE = 1 / 3
#: A cumulative hit ratio within this of 1 over a sample's new rows: the cache serves the takes.
FILLED_HITS = 0.99
#: The fadvise check reads up to this many bytes of the dataset's files, cold then warm.
CHECK_BYTES = 256 * MIB


def parse_size(text: str) -> int:
    """``"200k"`` -> 200000, ``"2M"`` -> 2000000, ``"5000"`` -> 5000.

    Raises:
        ValueError: not a positive number of rows with an optional k/M/G suffix.
    """
    value = text.strip().lower()
    scale = _SUFFIXES.get(value[-1:], 1)
    number = value[:-1] if value[-1:] in _SUFFIXES else value
    try:
        rows = int(float(number) * scale)
    except ValueError:
        rows = 0
    if rows < 1:
        raise ValueError(f"a size should be a number of rows like 200k or 2M, but got {text!r}")
    return rows


# -- one contender, in its own process -------------------------------------------------------------
class Sample(NamedTuple):
    """A contender's progress ``seconds`` after its loader's construction: ``rows`` delivered in
    all; the iteration's ``epoch``, rows ``taken`` (delivered or queued) and cache hit ratio."""

    seconds: float
    rows: int
    epoch: int | None
    taken: int
    hits: float | None


def _published(folder: str) -> bool:
    """A copy published in a DiskCache folder: an entry that is neither hidden (a fill's private
    folder) nor a lock file."""
    with contextlib.suppress(FileNotFoundError):
        return any(
            not name.startswith(".") and not name.endswith(".lock") for name in os.listdir(folder)
        )
    return False


def anonymous_mib() -> float | None:
    """This process's anonymous resident memory (``RssAnon``), MiB; ``None`` where
    ``/proc/self/status`` does not say (not Linux)."""
    with contextlib.suppress(OSError):
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) / 1024  # kB
    return None


def child(spec: dict[str, Any]) -> dict[str, Any]:
    """Run one contender in this process; its figures as a dict (times from the loader's
    construction, in seconds)."""
    import psutil

    from lance_prefetch import Dataset, DiskCache, PrefetchLoader, ReadOptions

    process = psutil.Process()
    floor_mib = process.memory_info().rss / MIB
    kind, seconds = spec["contender"], float(spec["seconds"])
    warmup = min(5.0, seconds / 4)
    read = ReadOptions(coalesce=1) if kind == "coalesce=1" else None
    cache: Any = None
    if kind.startswith("disk"):
        cache = DiskCache(dir=spec["cache_dir"])
    elif kind == "memory":
        cache = "memory"
    timeline: list[Sample] = []
    events: dict[str, float] = {}
    depths: list[tuple[int, int]] = []  # (readahead, max_in_flight) every 0.5 s
    stop = threading.Event()
    start = time.perf_counter()
    loader: Any = None
    rows = 0

    anonymous: list[float] = []  # RssAnon every 0.1 s

    def watch() -> None:
        """Every 0.1 s: the fill published and RssAnon; every 0.5 s: rows and the cache's
        hits."""
        ticks = 0
        while not stop.wait(0.1):
            now = time.perf_counter() - start
            anon = anonymous_mib()
            if anon is not None:
                anonymous.append(anon)
            if kind == "disk-filling" and "filled" not in events and _published(spec["cache_dir"]):
                events["filled"] = now
            ticks += 1
            if ticks % 5 == 0 and loader is not None:
                stats = loader.stats()
                taken = stats.rows + stats.queue_depth * spec["batch_size"]
                timeline.append(Sample(now, rows, stats.epoch, taken, stats.cache_hit_ratio))
                if stats.readahead:  # while an iteration runs: the tuner's bounds now
                    depths.append((stats.readahead, stats.max_in_flight))
                if kind == "memory" and "filled" not in events and _served(timeline):
                    events["filled"] = timeline[-2].seconds

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    loader = PrefetchLoader(
        Dataset(spec["uri"], storage_options=spec.get("storage_options")),
        spec["batch_size"],
        drop_last=False,
        read=read,
        cache=cache,
    )
    events["opened"] = time.perf_counter() - start
    counted_from = None
    counted = 0

    def done(now: float) -> bool:
        if kind in ("disk-filling", "memory"):
            if "filled" not in events:
                return now >= spec["fill_timeout"]
            if kind == "disk-filling":
                return now >= seconds
            return now >= events["filled"] + seconds
        return now >= seconds

    epoch, now = 0, 0.0
    while not done(now):
        loader.set_epoch(epoch)
        epoch += 1
        with loader:
            for batch in loader:
                now = time.perf_counter() - start
                events.setdefault("first_batch", now)
                rows += len(batch["id"])
                if now >= warmup:
                    if counted_from is None:
                        counted_from = now
                    else:
                        counted += len(batch["id"])
                if done(now):
                    break
    elapsed = time.perf_counter() - start
    stop.set()
    watcher.join()
    stats = loader.stats()
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    result: dict[str, Any] = {
        "rows_per_s": counted / (elapsed - counted_from) if counted_from else 0.0,
        "warmup_s": warmup,
        "warmup_rows_per_s": _rows_between(timeline, 0.0, warmup) / warmup,
        "first_batch_s": events.get("first_batch"),
        "opened_s": events["opened"],
        "peak_rss_mib": peak_mib,
        "peak_anon_mib": max(anonymous) if anonymous else None,
        "floor_rss_mib": floor_mib,
        "end_rss_mib": process.memory_info().rss / MIB,
        "rows_read": rows,
        "seconds": elapsed,
        "coalesce": loader.coalesce,
        "rows_per_take": loader.coalesce * spec["batch_size"],
        "readahead": depths[-1][0] if depths else None,  # the latest while reading
        "max_in_flight": depths[-1][1] if depths else None,
        "cache_hit_ratio": stats.cache_hit_ratio,
        "take_ms_p50": None if stats.take_ms_p50 != stats.take_ms_p50 else stats.take_ms_p50,
        "fill_s": events.get("filled"),
    }
    if kind == "disk-filling" and "filled" in events:
        fill = events["filled"]
        result["rows_per_s"] = _rows_between(timeline, 0.0, fill) / fill  # while filling
    if kind == "memory" and "filled" in events:
        fill = events["filled"]
        result["rows_per_s"] = _rows_between(timeline, fill, elapsed) / max(elapsed - fill, 1e-9)
    return result


def _rows_between(timeline: Sequence[Sample], t0: float, t1: float) -> float:
    """Rows delivered between ``t0`` and ``t1`` (from the 0.5 s samples, interpolated)."""
    points = [(0.0, 0), *((sample.seconds, sample.rows) for sample in timeline)]

    def at(t: float) -> float:
        for (ta, ra), (tb, rb) in zip(points, points[1:], strict=False):
            if ta <= t <= tb:
                return ra + (rb - ra) * (t - ta) / max(tb - ta, 1e-9)
        return float(points[-1][1])

    return max(at(t1) - at(t0), 0.0)


def _served(timeline: Sequence[Sample]) -> bool:
    """Whether the takes since the previous 0.5 s sample were all but served by the cache: the
    new rows taken in the same iteration (its hit ratio times its rows taken, delivered or
    queued), or a new iteration's own hit ratio."""
    if len(timeline) < 2:
        return False
    before, latest = timeline[-2:]
    if latest.hits is None:
        return False
    if latest.epoch != before.epoch or before.hits is None:
        return latest.taken > 0 and latest.hits >= FILLED_HITS
    if latest.taken <= before.taken:
        return False
    new_hits = latest.hits * latest.taken - before.hits * before.taken
    return new_hits / (latest.taken - before.taken) >= FILLED_HITS


# -- the parent: datasets, page cache, processes, tables ----------------------------------------------
def dataset_path(data_dir: Path, rows: int, rows_per_file: int) -> Path:
    """The cached dataset of ``rows`` rows, written (once) if missing; atomically renamed into
    place, so an interrupted write leaves nothing reused."""
    from lance_prefetch_bench.data import write_synthetic

    path = data_dir / f"synthetic-{rows}-rows-{rows_per_file}-a-file.lance"
    if not path.exists():
        data_dir.mkdir(parents=True, exist_ok=True)
        partial = Path(tempfile.mkdtemp(prefix=".partial-", dir=data_dir))
        try:
            started = time.perf_counter()
            write_synthetic(str(partial / "data.lance"), rows, rows_per_file=rows_per_file)
            os.rename(partial / "data.lance", path)
            print(f"wrote {rows:,} rows in {time.perf_counter() - started:.0f} s to {path}")
        finally:
            shutil.rmtree(partial, ignore_errors=True)
    return path


def files_of(path: Path) -> list[Path]:
    return sorted(p for p in path.rglob("*") if p.is_file())


def evict(files: Sequence[Path]) -> None:
    """Drop ``files`` from the page cache: written back (``fdatasync``), then
    ``posix_fadvise(POSIX_FADV_DONTNEED)`` (no root needed)."""
    for file in files:
        fd = os.open(file, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def read_all(files: Sequence[Path]) -> float:
    """Read ``files`` once, sequentially; the seconds it took."""
    started = time.perf_counter()
    for file in files:
        with open(file, "rb", buffering=0) as handle:
            while handle.read(8 * MIB):
                pass
    return time.perf_counter() - started


def check_eviction(files: Sequence[Path]) -> dict[str, float]:
    """Time reading (up to :data:`CHECK_BYTES` of) ``files`` right after :func:`evict`, then again:
    eviction works when the first read is the slower."""
    chosen, total = [], 0
    for file in files:
        if total >= CHECK_BYTES:
            break
        chosen.append(file)
        total += file.stat().st_size
    read_all(chosen)
    evict(chosen)
    cold = read_all(chosen)
    warm = read_all(chosen)
    return {"bytes": total, "cold_s": cold, "warm_s": warm, "cold_over_warm": cold / warm}


def run_child(spec: dict[str, Any], timeout: float) -> dict[str, Any]:
    """Run one contender in a fresh process; its result, or ``{"error": ...}``."""
    try:
        out = subprocess.run(
            [sys.executable, __file__, "--child", json.dumps(spec)],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    if not lines:
        return {"error": f"exit code {out.returncode}: {out.stderr[-1500:]}"}
    return json.loads(lines[-1][len("RESULT ") :])


def _record(
    results: list[dict[str, Any]], mode: str, rows: int, contender: str, figures: dict[str, Any]
) -> None:
    figures = {"mode": mode, "rows": rows, "contender": contender, **figures}
    if "rows_per_take" in figures:
        figures["density"] = figures["rows_per_take"] / rows
    figures["load_1min"] = os.getloadavg()[0]
    results.append(figures)
    shown = {k: figures.get(k) for k in ("rows_per_s", "peak_rss_mib", "first_batch_s", "fill_s")}
    print(f"{mode} {rows:,} rows, {contender}: {figures.get('error') or shown}", flush=True)


def run_s3(
    args: argparse.Namespace, sizes: Sequence[int], results: list[dict[str, Any]]
) -> dict[str, Any]:
    import psutil

    from lance_prefetch_bench.latency_proxy import Latency
    from lance_prefetch_bench.local_s3 import LocalS3

    latency = Latency()
    rate = {"lance_aimd_initial_rate": "5000", "lance_aimd_max_rate": "5000"}
    with LocalS3(latency=latency) as s3:
        options = {**s3.storage_options(), **rate}
        # every dataset linked in before the first request: rclone caches its listings
        for rows in sizes:
            local = dataset_path(args.data_dir, rows, args.rows_per_file)
            for file in files_of(local):  # the cached files, served as they are
                target = s3.root / s3.bucket / local.name / file.relative_to(local)
                target.parent.mkdir(parents=True, exist_ok=True)
                os.link(file, target)
        for rows in sizes:
            local = dataset_path(args.data_dir, rows, args.rows_per_file)
            nbytes = sum(file.stat().st_size for file in files_of(local))
            name = local.name
            cache_dir = Path(tempfile.mkdtemp(prefix=".disk-cache-", dir=args.data_dir))
            try:
                for contender in args.s3_contenders:
                    spec = {
                        "contender": contender,
                        "uri": s3.uri(name),
                        "storage_options": options,
                        "batch_size": args.batch_size,
                        "seconds": args.seconds,
                        "fill_timeout": args.fill_timeout,
                        "cache_dir": str(cache_dir),
                    }
                    available = psutil.virtual_memory().available
                    if contender == "memory" and nbytes > MEMORY_SHARE * available:
                        figures: dict[str, Any] = {
                            "skipped": f"{nbytes / MIB:,.0f} MiB of data, "
                            f"{available / MIB:,.0f} MiB of memory available"
                        }
                    else:
                        timeout = args.seconds * 2 + args.fill_timeout + 120
                        figures = run_child(spec, timeout)
                    figures["dataset_mib"] = nbytes / MIB
                    if figures.get("fill_s"):
                        figures["fill_mib_per_s"] = nbytes / MIB / figures["fill_s"]
                    _record(results, "s3", rows, contender, figures)
            finally:
                shutil.rmtree(cache_dir, ignore_errors=True)
    return {"latency": latency.describe(), "request_rate_limit": 5000}


def run_local(
    args: argparse.Namespace, sizes: Sequence[int], results: list[dict[str, Any]]
) -> dict[str, Any]:
    checks = {}
    for rows in sizes:
        local = dataset_path(args.data_dir, rows, args.rows_per_file)
        files = files_of(local)
        nbytes = sum(file.stat().st_size for file in files)
        checks[rows] = check_eviction(files)
        print(f"local {rows:,} rows: eviction check {checks[rows]}", flush=True)
        for contender in LOCAL_CONTENDERS:
            if contender.endswith("cold"):
                evict(files)
            else:
                read_all(files)
            spec = {
                "contender": contender,
                "uri": str(local),
                "batch_size": args.batch_size,
                "seconds": args.seconds,
            }
            figures = run_child(spec, args.seconds * 2 + 120)
            figures["dataset_mib"] = nbytes / MIB
            _record(results, "local", rows, contender, figures)
    return {"eviction_checks": checks}


def percent(fraction: float) -> str:
    """``0.000128`` -> ``"0.0128%"``: three significant digits, however small."""
    return f"{100 * fraction:.3g}%"


def _number(value: Any, digits: int = 0) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and digits:
        return f"{value:,.{digits}f}"
    return f"{value:,.0f}"


TABLE_COLUMNS = (
    "where",
    "rows",
    "contender",
    "rows/take",
    "density",
    "rows/s",
    "rows/s in warm-up",
    "peak RSS MiB",
    "peak anon MiB",
    "first batch s",
    "fill s",
    "fill MiB/s",
)


def table(results: Sequence[dict[str, Any]]) -> str:
    """The results as a markdown table, one line a contender (:data:`TABLE_COLUMNS`)."""
    lines = ["| " + " | ".join(TABLE_COLUMNS) + " |", "|" + "---|" * len(TABLE_COLUMNS)]
    for r in results:
        if "error" in r or "skipped" in r:
            cells = [r["mode"], f"{r['rows']:,}", r["contender"]]
            cells += [r.get("skipped") or "failed: " + r["error"].splitlines()[-1][:80]]
            cells += [""] * (len(TABLE_COLUMNS) - len(cells))
        else:
            cells = [
                r["mode"],
                f"{r['rows']:,}",
                r["contender"],
                _number(r["rows_per_take"]),
                percent(r["density"]),
                _number(r["rows_per_s"]),
                _number(r["warmup_rows_per_s"]),
                _number(r["peak_rss_mib"]),
                _number(r.get("peak_anon_mib")),
                _number(r["first_batch_s"], 2),
                _number(r.get("fill_s"), 1),
                _number(r.get("fill_mib_per_s")),
            ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def gains(results: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per S3 size: the defaults' take density and rows/s over ``coalesce=1``'s."""
    found = []
    for r in results:
        if r["mode"] == "s3" and r["contender"] == "defaults" and "rows_per_s" in r:
            one = [
                o
                for o in results
                if o["mode"] == "s3" and o["rows"] == r["rows"] and o["contender"] == "coalesce=1"
            ]
            if one and one[0].get("rows_per_s"):
                found.append(
                    {
                        "rows": r["rows"],
                        "rows_per_take": r["rows_per_take"],
                        "density": r["density"],
                        "rows_per_s": r["rows_per_s"],
                        "coalesce_1_rows_per_s": one[0]["rows_per_s"],
                        "gain": r["rows_per_s"] / one[0]["rows_per_s"],
                        "peak_rss_mib": r["peak_rss_mib"],
                        "coalesce_1_peak_rss_mib": one[0]["peak_rss_mib"],
                    }
                )
    return found


GAIN_COLUMNS = (
    "rows",
    "rows/take (defaults)",
    "density",
    "rows/s defaults",
    "rows/s coalesce=1",
    "gain",
    "peak RSS MiB defaults / coalesce=1",
)


def gain_table(found: Sequence[dict[str, Any]]) -> str:
    """:func:`gains` as a markdown table (:data:`GAIN_COLUMNS`)."""
    lines = ["| " + " | ".join(GAIN_COLUMNS) + " |", "|" + "---|" * len(GAIN_COLUMNS)]
    for g in found:
        cells = [
            f"{g['rows']:,}",
            _number(g["rows_per_take"]),
            percent(g["density"]),
            _number(g["rows_per_s"]),
            _number(g["coalesce_1_rows_per_s"]),
            f"{g['gain']:.2f}x",
            f"{g['peak_rss_mib']:,.0f} / {g['coalesce_1_peak_rss_mib']:,.0f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--sizes",
        default="200k,2M,20M",
        help="rows of each dataset, comma-separated, k/M/G suffixes (default %(default)s)",
    )
    parser.add_argument(
        "--seconds", type=float, default=30.0, help="per contender (default %(default)s)"
    )
    parser.add_argument("--out", default="scale.json", help="results JSON (default %(default)s)")
    parser.add_argument("--s3", action="store_true", help="the emulated S3 only")
    parser.add_argument("--local", action="store_true", help="local disk only")
    parser.add_argument(
        "--contenders",
        default=",".join(S3_CONTENDERS),
        help="the S3 contenders, comma-separated (default %(default)s)",
    )
    parser.add_argument("--batch-size", type=int, default=256, help="default %(default)s")
    parser.add_argument("--rows-per-file", type=int, default=5_000, help="default %(default)s")
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=Path(tempfile.gettempdir()) / "lance-prefetch-scale",
        help="where the datasets are written once and reused (default %(default)s)",
    )
    parser.add_argument(
        "--fill-timeout",
        type=float,
        default=900.0,
        help="seconds a cache's fill may take before its contender stops (default %(default)s)",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print("RESULT " + json.dumps(child(json.loads(args.child))), flush=True)
        return 0
    try:
        sizes = [parse_size(size) for size in args.sizes.split(",")]
    except ValueError as exc:
        parser.error(f"--sizes: {exc}")
    args.s3_contenders = [name.strip() for name in args.contenders.split(",") if name.strip()]
    unknown = set(args.s3_contenders) - set(S3_CONTENDERS)
    if unknown:
        parser.error(f"--contenders: unknown {sorted(unknown)}; choose from {S3_CONTENDERS}")
    if args.seconds <= 0:
        parser.error(f"--seconds should be > 0, but got {args.seconds}")
    import lance

    results: list[dict[str, Any]] = []
    report: dict[str, Any] = {
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}, lance {lance.__version__}",
        "command": " ".join(["benchmarks/scale.py", *(argv or sys.argv[1:])]),
        "batch_size": args.batch_size,
        "rows_per_file": args.rows_per_file,
        "row_bytes": ROW_BYTES,
        "seconds": args.seconds,
        "lance_io_threads": os.environ.get("LANCE_IO_THREADS"),
    }
    both = not (args.s3 or args.local)
    for rows in sizes:  # written (once) before any measurement
        dataset_path(args.data_dir, rows, args.rows_per_file)
    if args.s3 or both:
        report["s3"] = run_s3(args, sizes, results)
    if args.local or both:
        report["local"] = run_local(args, sizes, results)
    report["results"] = results
    report["coalescing"] = gains(results)
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(table(results))
    if report["coalescing"]:
        print()
        print(gain_table(report["coalescing"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
