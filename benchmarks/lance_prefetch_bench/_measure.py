"""Measuring one contender's pass: timings, take latencies, ids read, memory (in its process)."""

from __future__ import annotations

import hashlib
import os
import resource
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Protocol

import numpy as np
import torch

MIB = 2**20


class Contender(Protocol):
    """What :func:`measure_pass` drives."""

    latencies: list[float]  # seconds of each take call, appended by the contender

    def iterate(self, epoch: int, count: int) -> Iterator[tuple[dict[str, Any], Any]]:
        """``count`` batches of ``epoch``: (batch dict, offsets asked for or ``None``)."""


def batch_bytes(batch: Mapping[str, Any]) -> int:
    """Bytes of the batch's tensors (lists of strings or bytes are not counted)."""
    return sum(
        value.element_size() * value.nelement()
        for value in batch.values()
        if isinstance(value, torch.Tensor)
    )


def batch_ids(
    batch: Mapping[str, Any], offsets: Any, id_column: str | None
) -> tuple[np.ndarray | None, str]:
    """(ids of the batch's rows, where they came from: ``"id column"``, ``"offsets"``, ``"unknown"``)."""
    if id_column is not None and isinstance(batch.get(id_column), torch.Tensor):
        return batch[id_column].numpy().astype(np.int64, copy=False), "id column"
    if offsets is not None:
        return np.asarray(offsets, dtype=np.int64), "offsets"
    return None, "unknown"


def ids_record(
    per_batch: Sequence[np.ndarray | None], *, epoch: int, source: str, record: bool
) -> dict[str, Any]:
    """Checksums of the ids read in one pass.

    Returns:
        dict: ``epoch``, ``from`` (see :func:`batch_ids`), ``rows``, ``sha256`` (of the sorted
        ids, as little-endian int64: the same rows, repeats counted), ``batches_sha256`` (of each
        batch's sorted ids, in delivery order: the same batches in the same order) and, with
        ``record``, ``ids`` (the sorted ids). ``rows`` and the checksums are ``None`` when some
        batch's ids are unknown.
    """
    if not per_batch or any(ids is None for ids in per_batch):
        return {"epoch": epoch, "from": "unknown", "rows": None, "sha256": None}
    everything = np.sort(np.concatenate(per_batch)).astype("<i8")
    batches = hashlib.sha256()
    for ids in per_batch:
        batches.update(np.sort(ids).astype("<i8").tobytes())
        batches.update(b"|")
    return {
        "epoch": epoch,
        "from": source,
        "rows": int(everything.size),
        "sha256": hashlib.sha256(everything.tobytes()).hexdigest(),
        "batches_sha256": batches.hexdigest(),
        **({"ids": everything.tolist()} if record else {}),
    }


def latency_stats(latencies: Sequence[float]) -> dict[str, float | int | None]:
    """``take_p50_ms``, ``take_p99_ms``, ``take_mean_ms`` (``None`` without takes) and ``takes``."""
    if not latencies:
        return {"take_p50_ms": None, "take_p99_ms": None, "take_mean_ms": None, "takes": 0}
    values = np.asarray(latencies) * 1000
    return {
        "take_p50_ms": float(np.percentile(values, 50)),
        "take_p99_ms": float(np.percentile(values, 99)),
        "take_mean_ms": float(values.mean()),
        "takes": int(values.size),
    }


def measure_pass(
    contender: Contender,
    *,
    kind: str,
    epoch: int,
    batches: int,
    step_s: float,
    id_column: str | None,
    record_ids: bool,
    tick: Callable[[], None],
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Read ``batches`` batches of ``epoch`` from ``contender``, sleeping ``step_s`` after each.

    Returns:
        tuple[dict, dict]: the pass's metrics (see :mod:`~lance_prefetch_bench.contenders`) and
        its :func:`ids_record`.

    Raises:
        RuntimeError: the contender delivered fewer batches.
    """
    contender.latencies.clear()
    rows = nbytes = 0
    waited_after_first = 0.0
    per_batch: list[np.ndarray | None] = []
    source = "unknown"
    started = time.perf_counter()
    iterator = contender.iterate(epoch, batches)
    try:
        for position in range(batches):
            before = time.perf_counter()
            item = next(iterator, None)
            arrived = time.perf_counter()
            if item is None:
                raise RuntimeError(f"{kind} delivered {position} batches, {batches} were asked for")
            if position == 0:
                first = arrived
            else:
                waited_after_first += arrived - before
            last = arrived
            batch, offsets = item
            ids, source = batch_ids(batch, offsets, id_column)
            per_batch.append(ids)
            rows += len(ids) if ids is not None else len(next(iter(batch.values())))
            nbytes += batch_bytes(batch)
            tick()
            if step_s:
                time.sleep(step_s)
        ended = time.perf_counter()
    finally:
        close = getattr(iterator, "close", None)
        if close is not None:
            close()
    seconds = last - started
    metrics: dict[str, Any] = {
        "epoch": epoch,
        "batches": batches,
        "rows": rows,
        "seconds": seconds,
        "rows_per_s": rows / seconds,
        "batches_per_s": batches / seconds,
        "mib_per_s": nbytes / MIB / seconds,
        "first_batch_s": first - started,
        **latency_stats(contender.latencies),
    }
    if step_s:
        metrics["step_ms"] = step_s * 1000
        metrics["wait_fraction"] = waited_after_first / (ended - first) if batches > 1 else None
    return metrics, ids_record(per_batch, epoch=epoch, source=source, record=record_ids)


def rss_mib() -> float:
    """This process's resident memory now, in MiB."""
    with open(f"/proc/{os.getpid()}/statm") as statm:
        pages = int(statm.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / MIB


def peak_rss_mib() -> float:
    """This process's peak resident memory so far, in MiB (``getrusage``)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / MIB if sys.platform == "darwin" else peak / 1024
