"""Coalescing: read several consecutive batches of the plan with one ``take``, then split them.

A ``take`` has a fixed cost on top of its cost per row (measured by ``benchmarks/coalesce.py``;
figures in ``docs/benchmarks.md``), so a small batch's take spends most of its time on the fixed
part. The readahead window already knows the next batches of the plan, so a :class:`Group` of
``k`` of them (this worker's next ``k``, in plan order) is read with one ``take`` of their offsets
laid end to end, and the table is cut back into the ``k`` batches, each with exactly its own rows
in its own order (zero-copy slices).

The rule (``coalesce="auto"``): ``k = ceil(target / batch_size)``, at most ``readahead // 2``
(so that one group can be read while the previous one is consumed) and at least 1, ``target``
being :data:`TARGET_ROWS` for local files and, on object stores, what :func:`remote_target`
says for the dataset's density (a take's rows that lie close together are fetched by one
request, so a larger take needs fewer requests a row only when its rows are dense enough in the
dataset; :func:`fetch_bytes` and :func:`take_memory` model what such a take reads and holds). An
integer ``coalesce`` sets ``k`` itself (``1``: one take per batch). An iteration ramps up to
``k``: its first groups hold 1, 2, 4, ... batches, so that its first batch waits for one batch's
take (and transform) only. Pure code: no Lance, no torch.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from lance_prefetch._validate import check_int
from lance_prefetch.plan.sampling import PlannedBatch

__all__ = [
    "Group",
    "HELD_FRACTION",
    "HELD_FRACTION_RELEASED",
    "LONE_READ",
    "MERGE_GAP",
    "REMOTE_LEVEL",
    "REMOTE_LEVEL_SPARSE",
    "SPARSE_REQUESTS",
    "TARGET_ROWS",
    "TARGET_ROWS_REMOTE",
    "check_coalesce",
    "coalesce_size",
    "fetch_bytes",
    "groups",
    "remote_max_level",
    "remote_target",
    "requests_per_row",
    "share_size",
    "split",
    "take_memory",
]

#: Rows per ``take`` that ``coalesce="auto"`` aims for on local files ...
TARGET_ROWS = 4096
#: ... and, at most, on object stores (see :func:`remote_target`).
TARGET_ROWS_REMOTE = 16384
#: On an object store, Lance fetches two of a take's rows with one request when the gap between
#: them is below this many bytes (the gap is fetched too) ...
MERGE_GAP = 64 << 10
#: ... and a row that is fetched alone with a request of about this many bytes.
LONE_READ = 4 << 10
#: The part of a take's fetched bytes that a process holds for it while it is read, with glibc's
#: allocator as it is: Lance decodes as it fetches, and the allocator keeps much of what it frees
#: (``ReadOptions(release_memory=False)``) ...
HELD_FRACTION = 0.5
#: ... and with the allocator giving freed buffers back (``release_memory=True``, the default): a
#: take in flight added about a tenth of that, ~3.5% of its fetched bytes; this counts three
#: times the measure, a margin for other densities and loads (``docs/benchmarks.md``, "Memory on
#: an object store").
HELD_FRACTION_RELEASED = 0.1
#: The most takes in flight ``"auto"`` goes to on an object store (:func:`remote_max_level`) ...
REMOTE_LEVEL = 4
#: ... and for sparse takes: those making at least ``SPARSE_REQUESTS`` requests a row.
REMOTE_LEVEL_SPARSE = 8
SPARSE_REQUESTS = 0.9


def _mean_gap(rows: int, num_rows: int, row_bytes: float) -> float:
    """The mean gap in bytes between neighbours of a take of ``rows`` random rows of
    ``num_rows``."""
    return max(num_rows, 1) * max(row_bytes, 1.0) / max(rows, 1)


def requests_per_row(rows: int, num_rows: int, row_bytes: float) -> float:
    """Expected requests a row of an object-store ``take`` of ``rows`` distinct random rows out of
    ``num_rows`` rows of ``row_bytes`` bytes each.

    The gaps between a random take's neighbours are about exponential with mean
    ``m = num_rows * row_bytes / rows``; a row starts a new request when its gap is at least
    :data:`MERGE_GAP` ``G``, with probability ``exp(-G / m)``. A sparse take (``m >> G``) thus
    makes about one request a row, whatever its size; a dense one (``m << G``) few.
    """
    return math.exp(-MERGE_GAP / _mean_gap(rows, num_rows, row_bytes))


def fetch_bytes(rows: int, num_rows: int, row_bytes: float) -> float:
    """Expected bytes an object-store ``take`` of ``rows`` random rows out of ``num_rows`` rows of
    ``row_bytes`` bytes fetches: each merged gap (below :data:`MERGE_GAP` ``G``) is fetched whole,
    each lone row with :data:`LONE_READ` ``S`` bytes. With ``m`` the mean gap and
    ``p = exp(-G / m)`` (:func:`requests_per_row`), a row costs
    ``E[gap; gap < G] + p * S = m * (1 - p) - G * p + p * S`` bytes, at least ``row_bytes``.
    Near ``rows = num_rows * row_bytes / G`` a take fetches about 40 times its own bytes: this,
    not its rows, is what it holds while it is read.
    """
    gap = _mean_gap(rows, num_rows, row_bytes)
    p = math.exp(-MERGE_GAP / gap)
    per_row = gap * (1.0 - p) - MERGE_GAP * p + LONE_READ * p
    return rows * max(per_row, row_bytes)


def take_memory(
    rows: int, num_rows: int, row_bytes: float, *, remote: bool, released: bool = True
) -> float:
    """Bytes one ``take`` of ``rows`` random rows holds while it is read, besides its result: on
    an object store :data:`HELD_FRACTION_RELEASED` of its :func:`fetch_bytes` when the allocator
    gives freed buffers back (``released``, the default), else :data:`HELD_FRACTION` of them; on
    local files ``0`` (the reads are small and served from the page cache)."""
    if not remote:
        return 0.0
    fraction = HELD_FRACTION_RELEASED if released else HELD_FRACTION
    return fraction * fetch_bytes(rows, num_rows, row_bytes)


def remote_target(num_rows: int, row_bytes: float | None) -> int:
    """Rows a ``take`` aims at on an object store (``coalesce="auto"``), for a dataset of
    ``num_rows`` rows of ``row_bytes`` bytes (``None``: unknown, :data:`TARGET_ROWS_REMOTE`).

    A larger take pays on an object store only through the neighbours it merges into one request
    (:func:`requests_per_row`); it costs latency to its first row and the bytes it fetches
    (:func:`fetch_bytes`, gaps included). Its requests a row fall to ``1/e`` at
    ``k = num_rows * row_bytes / MERGE_GAP`` rows (neighbours one merge gap apart on average).
    Hence:

    * ``k <= 2 * TARGET_ROWS_REMOTE`` (a take of ``TARGET_ROWS_REMOTE`` rows saves at least
      ``1 - exp(-1/2)``, 39%, of its requests): ``k`` within ``[TARGET_ROWS,
      TARGET_ROWS_REMOTE]``; denser than ``k`` buys few more merges and fetches the gaps;
    * else (sparse: a take of ``TARGET_ROWS_REMOTE`` rows still makes most of a request a row):
      :data:`TARGET_ROWS`, as on local files, since growing the take buys no requests.
    """
    if not row_bytes:
        return TARGET_ROWS_REMOTE
    merging = math.ceil(num_rows * row_bytes / MERGE_GAP)
    if merging > 2 * TARGET_ROWS_REMOTE:
        return TARGET_ROWS
    return min(max(merging, TARGET_ROWS), TARGET_ROWS_REMOTE)


def remote_max_level(rows: int, num_rows: int, row_bytes: float | None) -> int:
    """The most takes in flight ``max_in_flight="auto"`` goes to on an object store, for takes
    of ``rows`` random rows out of ``num_rows`` rows of ``row_bytes`` bytes (``None``: unknown).

    Lance sends one take's requests concurrently, so what another take in flight buys depends on
    what holds a take (``docs/benchmarks.md``, "Memory on an object store"):

    * a take whose rows share requests (fewer than :data:`SPARSE_REQUESTS` a row) fetches whole
      ranges and then decodes them: beyond :data:`REMOTE_LEVEL` more takes in flight read no
      more rows/s, and each holds about what it fetched while it waits for the CPU;
    * a sparse take (about a request a row) waits on its requests and holds little for each:
      up to :data:`REMOTE_LEVEL_SPARSE` read more rows/s.

    Unknown row bytes count as dense: :data:`REMOTE_LEVEL`.
    """
    if row_bytes and requests_per_row(rows, num_rows, row_bytes) >= SPARSE_REQUESTS:
        return REMOTE_LEVEL_SPARSE
    return REMOTE_LEVEL


def check_coalesce(coalesce: object) -> int | str:
    """Validate ``coalesce``: ``"auto"`` or an int ``>= 1``.

    Raises:
        TypeError: neither ``"auto"`` nor an int. ValueError: an int below 1.
    """
    if isinstance(coalesce, str):
        if coalesce != "auto":
            raise TypeError(
                f"coalesce should be 'auto' or a number of batches per take >= 1, but got "
                f"coalesce={coalesce!r}"
            )
        return coalesce
    try:
        return check_int("coalesce", coalesce, minimum=1)
    except TypeError:
        raise TypeError(
            f"coalesce should be 'auto' or a number of batches per take >= 1, but got "
            f"coalesce={coalesce!r}"
        ) from None


def coalesce_size(
    coalesce: int | str, batch_size: int, readahead: int, *, target: int = TARGET_ROWS
) -> int:
    """Batches per ``take``: the rule above for ``"auto"`` (aiming at ``target`` rows), else
    ``coalesce`` itself, at most ``readahead`` (a take's batches all count against the
    readahead bound, so a larger one could never start)."""
    if coalesce == "auto":
        return max(1, min(math.ceil(target / batch_size), readahead // 2))
    return min(int(coalesce), readahead)


def share_size(size: int, share: int, max_in_flight: int) -> int:
    """``size`` batches a take, at most ``ceil(share / (2 * max_in_flight))`` (at least 1) for a
    worker reading ``share`` batches: a small epoch's takes (and their transforms) still run
    ``max_in_flight`` at a time."""
    return min(size, max(math.ceil(share / (2 * max_in_flight)), 1))


@dataclass(frozen=True)
class Group:
    """Consecutive batches of one worker's plan, read with one ``take``.

    Attributes:
        batches (tuple[PlannedBatch, ...]): in plan order, at least one.
        indices (numpy.ndarray): shape ``(rows,)``: the batches' offsets laid end to end.
    """

    batches: tuple[PlannedBatch, ...]
    indices: np.ndarray

    def __len__(self) -> int:
        return len(self.batches)

    @property
    def position(self) -> int:
        """The first batch's position in the epoch."""
        return self.batches[0].position

    def __repr__(self) -> str:
        positions = [batch.position for batch in self.batches]
        return f"Group(positions={positions}, rows={len(self.indices)})"


def groups(batches: Iterable[PlannedBatch], size: int, *, ramp: bool = False) -> Iterator[Group]:
    """``batches`` in groups of ``size`` (the last may be smaller), lazily, in order. With
    ``ramp``, the first groups hold 1, 2, 4, ... batches until ``size``: the first batch comes
    after a take of its own rows, not of ``size`` batches (and not after ``size`` transforms)."""
    batches = iter(batches)
    step = 1 if ramp else size
    while chunk := tuple(itertools.islice(batches, step)):
        step = min(2 * step, size)
        indices = (
            chunk[0].indices
            if len(chunk) == 1
            else np.concatenate([batch.indices for batch in chunk])
        )
        yield Group(chunk, indices)


def split(table: Any, group: Group) -> list[Any]:
    """Cut ``table`` (a ``pyarrow.Table`` read for ``group.indices``, or rows already converted
    that ``split`` themselves) into one piece per batch of the group, zero-copy, in order."""
    if hasattr(table, "split"):  # converted rows: one split a column
        return table.split([len(batch.indices) for batch in group.batches])  # type: ignore[no-any-return]
    pieces = []
    offset = 0
    for batch in group.batches:
        pieces.append(table.slice(offset, len(batch.indices)))
        offset += len(batch.indices)
    return pieces
