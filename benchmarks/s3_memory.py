"""Where a PrefetchLoader's memory goes on the emulated S3: its floor, its peak, its rows/s.

Starts the bench's emulated S3 on 127.0.0.1 (nginx + rclone + the latency proxy, all stopped at
the end), writes ``--rows`` synthetic rows (``id``, 128 x float32 ``vector``, ``label``) to it once,
then runs each ``--variant`` in a fresh process, ``--rounds`` times, interleaved (variant A, B,
..., A, B, ...), so that all see the same load. A variant is ``NAME`` or
``NAME:KEY=VALUE,KEY=VALUE``: the keys ``readahead``, ``max_in_flight``, ``coalesce`` and
``max_buffer_bytes`` go to the loader, ``release_memory=0`` is ``ReadOptions(release_memory=False)``
(glibc's allocator left as it is), ``trim=1`` calls glibc's ``malloc_trim(0)`` after every
take's batches, ``epoch_s=S`` cuts each epoch after S seconds (a new iterator, as a new epoch), and upper-case keys are environment variables of the process (for instance
``MALLOC_ARENA_MAX=2``). Each process reports, in MiB: RSS after the imports (Python, torch,
pyarrow, Lance), after the loader was built (the dataset opened: Lance's runtime started), the
floor; then reads for ``--seconds`` with RSS sampled every 0.5 s and reports the peak, the end and
the rows/s after the first 5 s, and the highest readahead, max_in_flight and takes in flight
that ``stats()`` showed. Lance's request-rate limiter is pinned at 5,000 requests/s. Run::

    PYTHONPATH=. .venv/bin/python benchmarks/s3_memory.py --rows 2000000 --seconds 60 --rounds 2 \
        --variant defaults --variant arena2:MALLOC_ARENA_MAX=2
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Sequence

from lance_prefetch import Dataset, ReadOptions

MIB = 2**20
LOADER_KEYS = ("readahead", "max_in_flight", "coalesce", "max_buffer_bytes")


def parse_variant(text: str) -> tuple[str, dict[str, str], dict[str, str]]:
    """``NAME[:KEY=VALUE,...]`` -> (name, loader and probe settings, environment variables)."""
    name, _, rest = text.partition(":")
    settings: dict[str, str] = {}
    env: dict[str, str] = {}
    for item in filter(None, rest.split(",")):
        key, _, value = item.partition("=")
        (env if key.isupper() else settings)[key] = value
    unknown = set(settings) - {*LOADER_KEYS, "trim", "epoch_s", "release_memory"}
    if unknown:
        raise ValueError(f"unknown keys {sorted(unknown)} in variant {text!r}")
    return name, settings, env


def _value(text: str) -> int | str:
    return text if text == "auto" else int(text)


def child(uri: str, options: dict[str, str], settings: dict[str, str], seconds: float) -> dict:
    """Run one variant in this process; the figures as a dict."""
    import psutil

    process = psutil.Process()
    rss = lambda: process.memory_info().rss / MIB  # noqa: E731
    import lance  # noqa: F401
    import pyarrow  # noqa: F401
    import torch  # noqa: F401

    from lance_prefetch import PrefetchLoader

    imported = rss()
    read = {key: _value(settings[key]) for key in LOADER_KEYS[1:] if key in settings}
    loader = PrefetchLoader(
        Dataset(uri, storage_options=options),
        256,
        drop_last=False,
        readahead=_value(settings.get("readahead", "auto")),
        read=ReadOptions(**read, release_memory=settings.get("release_memory", "1") == "1"),
    )
    floor = rss()
    trim = None
    if settings.get("trim") == "1":
        import ctypes

        trim = ctypes.CDLL("libc.so.6").malloc_trim
    samples: list[tuple[float, float]] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.5):
            samples.append((time.perf_counter() - start, rss()))

    start = time.perf_counter()
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    rows = counted = 0
    counted_from = None
    levels = {"readahead": 0, "max_in_flight": 0, "in_flight": 0}  # the highest seen
    done = 0
    epoch_s = float(settings.get("epoch_s", "inf"))
    epoch, now = 0, 0.0
    while now < seconds:  # each epoch cut after epoch_s: a new iterator and its threads
        loader.set_epoch(epoch)
        epoch += 1
        began = now
        with loader:
            for batch in loader:
                done += 1
                now = time.perf_counter() - start
                if now >= 5.0:
                    if counted_from is None:
                        counted_from = now
                    else:
                        counted += len(batch["id"])
                rows += len(batch["id"])
                if done % loader.coalesce == 0:
                    if trim is not None:
                        trim(0)
                    now_stats = loader.stats()
                    for key in levels:
                        levels[key] = max(levels[key], getattr(now_stats, key))
                if now >= seconds or now - began >= epoch_s:
                    break
    elapsed = time.perf_counter() - start
    stop.set()
    sampler.join()
    end = rss()
    return {
        "imported_mib": imported,
        "floor_mib": floor,
        "peak_mib": max([end, *(s for _, s in samples)]),
        "end_mib": end,
        "rows_per_s": counted / (elapsed - counted_from) if counted_from else 0.0,
        "batches": done,
        "coalesce": loader.coalesce,
        "readahead": levels["readahead"],
        "max_in_flight": levels["max_in_flight"],
        "in_flight": levels["in_flight"],
        "every_2s": [round(s) for t, s in samples[3::4]],
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--variant", action="append", default=[])
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        spec = json.loads(args.child)
        result = child(spec["uri"], spec["options"], spec["settings"], spec["seconds"])
        print("RESULT " + json.dumps(result), flush=True)
        return 0

    from lance_prefetch_bench.data import write_synthetic
    from lance_prefetch_bench.latency_proxy import Latency
    from lance_prefetch_bench.local_s3 import LocalS3

    variants = [parse_variant(v) for v in args.variant or ["defaults"]]
    results: dict[str, list[dict]] = {name: [] for name, _, _ in variants}
    with contextlib.ExitStack() as stack:
        s3 = stack.enter_context(LocalS3(latency=Latency()))
        uri = s3.uri("memory.lance")
        started = time.perf_counter()
        write_synthetic(uri, args.rows, storage_options=s3.storage_options(with_latency=False))
        print(f"wrote {args.rows:,} rows in {time.perf_counter() - started:.0f} s", flush=True)
        rate = {"lance_aimd_initial_rate": "5000", "lance_aimd_max_rate": "5000"}
        options = {**s3.storage_options(), **rate}
        for round_ in range(args.rounds):
            for name, settings, env in variants:
                spec = {
                    "uri": uri,
                    "options": options,
                    "settings": settings,
                    "seconds": args.seconds,
                }
                out = subprocess.run(
                    [sys.executable, __file__, "--child", json.dumps(spec)],
                    env={**os.environ, **env},
                    capture_output=True,
                    text=True,
                    timeout=args.seconds + 120,
                )
                lines = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
                if not lines:
                    print(f"{name}: failed\n{out.stderr[-2000:]}", flush=True)
                    continue
                result = json.loads(lines[-1][len("RESULT ") :])
                results[name].append(result)
                load = os.getloadavg()[0]
                print(
                    f"round {round_} {name}: imported {result['imported_mib']:.0f}, floor "
                    f"{result['floor_mib']:.0f}, peak {result['peak_mib']:.0f}, end "
                    f"{result['end_mib']:.0f} MiB, {result['rows_per_s']:,.0f} rows/s, coalesce "
                    f"{result['coalesce']}, highest readahead {result['readahead']}, max_in_flight "
                    f"{result['max_in_flight']}, in flight {result['in_flight']}, "
                    f"load {load:.1f}; every 2 s {result['every_2s']}",
                    flush=True,
                )
    print("| variant | floor MiB | peak MiB | peak - floor | rows/s (median) |")
    print("|---|---|---|---|---|")
    for name, runs in results.items():
        if runs:
            floor = statistics.median(r["floor_mib"] for r in runs)
            peak = statistics.median(r["peak_mib"] for r in runs)
            rate = statistics.median(r["rows_per_s"] for r in runs)
            print(f"| {name} | {floor:.0f} | {peak:.0f} | {peak - floor:.0f} | {rate:,.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
