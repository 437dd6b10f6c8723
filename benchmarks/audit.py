"""What the coverage audit (``PrefetchLoader(audit=True)``) costs, measured on this machine.

Three measurements:

* per batch: :meth:`CoverageRecord.add` of a 64-row batch of a shuffled epoch, the folds every
  ``FLUSH_ROWS`` rows included, and the memory of a record (``num_rows / 8`` bytes);
* per epoch: the check of two ranks' records (:func:`~lance_prefetch.audit._coverage.check`) and the
  write of a record into an ``audit_dir``, at ``--check-rows`` rows;
* end to end: a local dataset of small rows read in batches of ``--batch-size``, without a cache
  and with ``cache="memory"`` (where a fixed per-batch cost weighs most), each pass with and
  without ``audit=True``, alternating, best of ``--repeats``; and the time spent inside the audit
  (its methods timed) as a share of the audited passes' time.

Run::

    .venv/bin/python benchmarks/audit.py [--rows 200000] [--batch-size 64] [--repeats 5]
"""

from __future__ import annotations

import argparse
import platform
import tempfile
import time

import lance
import numpy as np
import pyarrow as pa

from lance_prefetch import PrefetchLoader
from lance_prefetch.audit._bitset import CoverageRecord
from lance_prefetch.audit._coverage import Share, check
from lance_prefetch.audit._wiring import EpochAudit
from lance_prefetch.plan.sampling import EpochPlan


def per_batch(num_rows: int, batch_size: int) -> dict[str, float]:
    plan = EpochPlan(num_rows=num_rows, batch_size=batch_size, world_size=2)
    batches = [b.indices for b in plan.rank_batches(0)][: 2_000_000 // batch_size]
    best = float("inf")
    for _ in range(3):
        record = CoverageRecord(num_rows)
        started = time.perf_counter()
        for indices in batches:
            record.add(indices)
        record.delivered()
        best = min(best, time.perf_counter() - started)
    return {
        "add_us": best / len(batches) * 1e6,
        "row_ns": best / (len(batches) * batch_size) * 1e9,
        "record_mib": len(record.delivered().bits) / 2**20,
    }


def per_epoch(num_rows: int, batch_size: int) -> dict[str, float]:
    plan = EpochPlan(num_rows=num_rows, batch_size=batch_size, world_size=2, drop_last=False)
    records = []
    for rank in range(2):
        record = CoverageRecord(num_rows)
        for batch in plan.rank_batches(rank):
            record.add(batch.indices)
        records.append(record.delivered())
    started = time.perf_counter()
    report = check(plan, [Share(0), Share(1)], records, uri="bench", version=1)
    checked = time.perf_counter() - started
    assert report.ok, report.failure()
    with tempfile.TemporaryDirectory() as folder:
        audit = EpochAudit(
            plan,
            Share(0),
            exchange="dir",
            audit_dir=folder,
            identity={"uri": "bench", "version": 1},
        )
        started = time.perf_counter()
        audit._dir(records[0])  # writes the record; rank 1's is missing, so no check
        written = time.perf_counter() - started
    return {"check_s": checked, "write_s": written}


def end_to_end(uri: str, batch_size: int, repeats: int, cache: str | None) -> dict[str, float]:
    """Best rows/s with and without the audit, alternating, and the share of the audited passes'
    wall time spent inside the audit itself (``EpochAudit.add`` and ``finish``, timed), which
    the machine's noise moves far less than the rows/s of two passes."""
    loaders = {
        mode: PrefetchLoader(uri, batch_size, cache=cache, audit=mode == "on")
        for mode in ("on", "off")
    }
    spent = [0.0]
    real = EpochAudit.add, EpochAudit.finish

    def timed(method):
        def run(self, *args):
            started = time.perf_counter()
            try:
                return method(self, *args)
            finally:
                spent[0] += time.perf_counter() - started

        return run

    best, audited_wall, audited_spent = {"on": 0.0, "off": 0.0}, 0.0, 0.0
    EpochAudit.add, EpochAudit.finish = timed(real[0]), timed(real[1])
    try:
        for repeat in range(repeats + 1):  # the first round fills the caches, not counted
            for mode in ("on", "off") if repeat % 2 else ("off", "on"):  # neither always first
                spent[0] = 0.0
                started = time.perf_counter()
                rows = sum(len(batch["id"]) for batch in loaders[mode])
                wall = time.perf_counter() - started
                if repeat:
                    best[mode] = max(best[mode], rows / wall)
                    if mode == "on":
                        audited_wall, audited_spent = audited_wall + wall, audited_spent + spent[0]
    finally:
        EpochAudit.add, EpochAudit.finish = real
    assert loaders["on"].audit_report.ok
    return {**best, "share": audited_spent / audited_wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--check-rows", type=int, default=10_000_000)
    args = parser.parse_args()
    print(f"{platform.processor() or platform.machine()}, Python {platform.python_version()}")
    calls = per_batch(args.check_rows, args.batch_size)
    print(
        f"per batch of {args.batch_size} ({args.check_rows:,}-row epoch): add {calls['add_us']:.2f} "
        f"us ({calls['row_ns']:.0f} ns a row, folds included); record {calls['record_mib']:.2f} MiB"
    )
    epoch = per_epoch(args.check_rows, args.batch_size)
    print(
        f"per epoch of {args.check_rows:,} rows on 2 ranks: check {epoch['check_s'] * 1e3:.0f} ms, "
        f"record written to audit_dir {epoch['write_s'] * 1e3:.1f} ms"
    )
    with tempfile.TemporaryDirectory() as folder:
        uri = f"{folder}/small.lance"
        ids = np.arange(args.rows, dtype=np.int64)
        lance.write_dataset(pa.table({"id": ids, "label": ids % 10}), uri)
        for cache in (None, "memory"):
            best = end_to_end(uri, args.batch_size, args.repeats, cache)
            print(
                f"end to end, cache={cache!r}, {args.rows:,} rows of 16 bytes in batches of "
                f"{args.batch_size}, best of {args.repeats}: audit on {best['on']:,.0f} rows/s, "
                f"off {best['off']:,.0f} rows/s (on/off = {best['on'] / best['off']:.3f}); time "
                f"inside the audit: {best['share'] * 100:.2f}% of the audited passes"
            )


if __name__ == "__main__":
    main()
