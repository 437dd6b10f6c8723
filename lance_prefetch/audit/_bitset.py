"""The coverage audit's record: the rows one process hands out in one iteration, 1 bit a row.

:class:`CoverageRecord` keeps a bitmap over the pinned version's row offsets (row ``r`` is bit
``r % 8`` of byte ``r // 8``: ``num_rows / 8`` bytes) and an exact list of the deliveries of a row
after its first (normally empty). Adding a batch appends its offsets (no copy); every
:data:`FLUSH_ROWS` rows the pending offsets are folded in with one sort, vectorised. Row offsets,
not batch positions, are recorded, so the check (:mod:`lance_prefetch.audit._coverage`) proves the rows
themselves: the rows of the positions a rank reads, the split of padding, an elastic resume's
re-split, not only that every planned batch came out once. Pure numpy.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

__all__ = [
    "CoverageRecord",
    "Delivered",
    "FLUSH_ROWS",
    "bitmap",
    "has_rows",
    "popcount",
    "rows_of",
    "set_rows",
]

#: Row offsets buffered before a record folds them into its bitmap (one sort each time).
FLUSH_ROWS = 1 << 16

_POPCOUNT = np.array([bin(i).count("1") for i in range(256)], dtype=np.uint8)
NO_ROWS = np.zeros(0, dtype=np.int64)


# -- bitmaps ------------------------------------------------------------------------------------
def bitmap(num_rows: int, *, full: bool = False) -> np.ndarray:
    """``ceil(num_rows / 8)`` bytes, every row's bit clear (``full``: set)."""
    if not full:
        return np.zeros(-(-num_rows // 8), dtype=np.uint8)
    bits = np.full(-(-num_rows // 8), 0xFF, dtype=np.uint8)
    if num_rows % 8:
        bits[-1] = (1 << (num_rows % 8)) - 1
    return bits


def _masks(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(bytes, masks)`` for sorted distinct ``values``: one entry per byte touched, its bits
    or-ed together (so that a scatter on the bytes loses none)."""
    offsets = (values >> 3).astype(np.intp)
    masks = np.left_shift(np.uint8(1), (values & 7).astype(np.uint8))
    starts = np.flatnonzero(np.r_[True, offsets[1:] != offsets[:-1]])
    return offsets[starts], np.bitwise_or.reduceat(masks, starts)


def set_rows(bits: np.ndarray, values: np.ndarray, *, on: bool = True) -> None:
    """Set (``on=False``: clear) the bits of ``values``, distinct row offsets in any order."""
    if len(values) == 0:
        return
    offsets, masks = _masks(np.sort(values))
    if on:
        bits[offsets] |= masks
    else:
        bits[offsets] &= ~masks


def has_rows(bits: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Whether each of ``values`` has its bit set (a bool array)."""
    values = np.asarray(values)
    return ((bits[values >> 3] >> (values & 7).astype(np.uint8)) & 1).astype(bool)


def rows_of(bits: np.ndarray, limit: int | None = None) -> np.ndarray:
    """The rows whose bits are set, ascending (the first ``limit``), as ``int64``."""
    offsets = np.flatnonzero(bits)
    if limit is not None:
        offsets = offsets[:limit]
    unpacked = np.unpackbits(bits[offsets][:, None], axis=1, bitorder="little")
    which, bit = np.nonzero(unpacked)
    rows = offsets[which].astype(np.int64) * 8 + bit
    return rows if limit is None else rows[:limit]


def popcount(bits: np.ndarray) -> int:
    """Rows whose bits are set."""
    return int(_POPCOUNT[bits].sum(dtype=np.int64))


# -- the record ---------------------------------------------------------------------------------
class Delivered(NamedTuple):
    """One process's deliveries in one iteration: ``bits`` (1 bit a row), ``repeats`` (the
    offsets of every delivery of a row after its first, sorted ``int64``), ``batches`` and
    ``rows`` handed out."""

    bits: np.ndarray
    repeats: np.ndarray
    batches: int
    rows: int


class CoverageRecord:
    """The rows one process hands out in one iteration (see the module docstring).

    Args:
        num_rows (int): rows of the pinned version (the bitmap's size).

    Attributes:
        batches (int): batches added.
        rows (int): rows added, repeats included.
    """

    def __init__(self, num_rows: int) -> None:
        self.num_rows = num_rows
        self.batches = self.rows = 0
        self._bits = bitmap(num_rows)
        self._pending: list[np.ndarray] = []  # offsets not yet folded into the bitmap
        self._pending_rows = 0
        self._repeats: list[np.ndarray] = []

    def add(self, indices: np.ndarray) -> None:
        """Record one batch handed out: its row offsets (kept, not copied, until the next fold)."""
        self._pending.append(indices)
        self.batches += 1
        self.rows += len(indices)
        self._pending_rows += len(indices)
        if self._pending_rows >= FLUSH_ROWS:
            self._flush()

    def _flush(self) -> None:
        if not self._pending:
            return
        values = np.sort(np.concatenate(self._pending))
        self._pending, self._pending_rows = [], 0
        again = values[1:] == values[:-1]  # a row twice among the pending ones
        if again.any():
            self._repeats.append(values[1:][again].astype(np.int64))
            values = values[np.r_[True, ~again]]
        seen = has_rows(self._bits, values)  # a row delivered before the pending ones
        if seen.any():
            self._repeats.append(values[seen].astype(np.int64))
            values = values[~seen]
        set_rows(self._bits, values)

    def delivered(self) -> Delivered:
        """Everything recorded so far, folded in."""
        self._flush()
        repeats = np.sort(np.concatenate(self._repeats)) if self._repeats else NO_ROWS
        return Delivered(self._bits, repeats, self.batches, self.rows)
