"""The coverage audit's rule and check: what an epoch's rule says every row should get, and the
check of every rank's and worker's record (:mod:`lance_prefetch.audit._bitset`, 1 bit a row) against
it, as an :class:`AuditReport`.

Pure code: numpy only, no I/O (the exchange of records between processes is
:mod:`lance_prefetch.audit._wiring`).

The rule
--------
A plan from global batch ``start`` delivers the permutation's positions ``[a, a + D)``, ``a =
start * batch_size``, ``D =`` :attr:`~lance_prefetch.plan.sampling.EpochPlan.num_delivered`, each once,
a position ``q >= num_rows`` standing for ``q % num_rows`` (``drop_last=False`` padding wraps
around): the rows there once, padded rows once more, the tail after ``a + D`` (``drop_last=True``)
and the rows before ``a`` (delivered before a mid-epoch resume) not at all, unless the
checkpoint's record of the batches consumed before it is given (``before``): then the rows before
``a`` are due once too, the record's rows count as delivered once (by the checker, in no share's
record), and a resumed epoch is checked whole. A DataLoader worker that resumed its own share
(``skip``) leaves out the batches it delivered before.
:func:`expected_deliveries` builds that as a bitmap and the few rows expected more than once.

The check
---------
:func:`check` folds the records one at a time (a union bitmap and the rows found in two records,
so the checker holds a few bitmaps however many ranks there are) and compares every row's
deliveries with the rule: **missing** rows were delivered fewer times than the rule says,
**repeated** ones more (the rule saying at least once), **unexpected** ones were delivered although
the rule leaves them out. An :class:`AuditReport` holds the counts and the first :data:`SHOWN` ids
of each, and each share's batches against the rule's.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, NamedTuple

import numpy as np

from lance_prefetch.audit._bitset import (
    NO_ROWS,
    Delivered,
    bitmap,
    has_rows,
    popcount,
    rows_of,
    set_rows,
)
from lance_prefetch.plan._positions import first_local
from lance_prefetch.plan.sampling import EpochPlan

__all__ = [
    "AuditReport",
    "Expected",
    "Share",
    "ShareCount",
    "Spans",
    "add_span",
    "check",
    "clip_spans",
    "complete",
    "disagreement",
    "expected_deliveries",
    "prior_rows",
]

#: Global batch positions of an epoch as ``[start, stop)`` intervals, ascending, not overlapping:
#: the batches the training loop consumed before a checkpoint (``state["audit"]``).
Spans = tuple[tuple[int, int], ...]
#: The order in which :func:`disagreement` names what records disagree on (the rest after it).
RULE_ORDER = (
    "uri",
    "version",
    "datasets",
    "seed",
    "epoch",
    "start",
    "batch_size",
    "world_size",
    "filter",
    "split",
    "weights",
    "num_rows",
    "permutation",
    "shuffle",
    "drop_last",
    "before",
)
#: Permutation positions handled per pass while the rule's bitmap is built.
CHUNK = 1 << 20
#: The most ids of each kind an :class:`AuditReport` lists (and a :class:`CoverageError` shows).
SHOWN = 20
#: The most extra deliveries listed one by one during a check; beyond, repeats are counted as
#: rows in two records only (the report says ``exact=False``).
LISTED = 1 << 22


# -- the rule -----------------------------------------------------------------------------------
class Share(NamedTuple):
    """Which batches of a plan one record holds: rank ``rank``'s (``-1``: every rank's, read by
    one process for Accelerate's dispatcher), as DataLoader worker ``worker_id`` of
    ``num_workers``, from the rank's batch ``skip`` (a worker that resumed its own share)."""

    rank: int
    worker_id: int = 0
    num_workers: int = 1
    skip: int = 0

    def __str__(self) -> str:
        who = "every rank (one reader)" if self.rank < 0 else f"rank {self.rank}"
        if self.num_workers > 1:
            who += f" worker {self.worker_id} of {self.num_workers}"
        return who

    def locals(self, plan: EpochPlan) -> range:
        """The rank's batches (``j``) this share hands out by the rule."""
        total = plan.num_batches if self.rank < 0 else plan.batches_of(self.rank)
        return range(
            first_local(self.worker_id, self.num_workers, self.skip), total, self.num_workers
        )

    def skipped(self, plan: EpochPlan) -> list[int]:
        """Global positions of the batches this share delivered before it resumed."""
        total = plan.num_batches if self.rank < 0 else plan.batches_of(self.rank)
        first = min(first_local(self.worker_id, self.num_workers, self.skip), total)
        width, rank = (1, 0) if self.rank < 0 else (plan.world_size, self.rank)
        return [
            plan.start + j * width + rank for j in range(self.worker_id, first, self.num_workers)
        ]


class Expected(NamedTuple):
    """What the rule delivers: ``bits``, the rows delivered at least once; ``extra_rows``
    (sorted) delivered ``extra_counts`` more times than once."""

    bits: np.ndarray
    extra_rows: np.ndarray
    extra_counts: np.ndarray

    @property
    def total(self) -> int:
        """Deliveries the rule calls for."""
        return popcount(self.bits) + int(self.extra_counts.sum())


def expected_deliveries(
    plan: EpochPlan, shares: Sequence[Share] = (), *, whole: bool = False
) -> Expected:
    """The rule of the module docstring for ``plan``, without the batches that ``shares``
    resumed past; ``whole``: the rows before the plan's start too, once each (a resumed epoch
    audited over the whole epoch). Costs a few bitmaps; the permutation is computed only where
    the covered range is not the whole epoch (a resume, a dropped tail), in passes of
    :data:`CHUNK` positions."""
    num_rows, order = plan.num_rows, plan.order
    end = plan.start * plan.batch_size + plan.num_delivered
    first = 0 if whole else plan.start * plan.batch_size
    top = min(end, num_rows)
    if top - first > num_rows // 2:  # most rows: all set, the rest cleared
        bits = bitmap(num_rows, full=True)
        spans, on = [(0, min(first, num_rows)), (top, num_rows)], False
    else:
        bits, spans, on = bitmap(num_rows), [(first, top)], True
    for low, high in spans:
        for start in range(low, high, CHUNK):
            set_rows(bits, order.slice(start, min(start + CHUNK, high)), on=on)
    extra_rows, extra_counts = NO_ROWS, NO_ROWS
    if end > num_rows:  # padding: positions past the end wrap around to the permutation's start
        rows, counts = np.unique(
            order.take(np.arange(num_rows, end) % num_rows), return_counts=True
        )
        new = ~has_rows(bits, rows)
        set_rows(bits, rows[new])
        counts = counts - new
        extra_rows, extra_counts = rows[counts > 0].astype(np.int64), counts[counts > 0]
    skipped = [p for share in shares if share.skip for p in share.skipped(plan)]
    if skipped:
        rows = np.concatenate([plan.batch(p).indices for p in skipped]).astype(np.int64)
        extra_rows, extra_counts = _subtract(bits, extra_rows, extra_counts, rows)
    return Expected(bits, extra_rows, extra_counts)


def _subtract(
    bits: np.ndarray, extra_rows: np.ndarray, extra_counts: np.ndarray, rows: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Take one expected delivery of each of ``rows`` off: an extra one first, else the bit."""
    rows, counts = np.unique(rows, return_counts=True)
    taken = np.minimum(_lookup(extra_rows, extra_counts, rows), counts)
    extra_counts = extra_counts - _lookup(rows, taken, extra_rows)
    set_rows(bits, rows[counts > taken], on=False)
    keep = extra_counts > 0
    return extra_rows[keep], extra_counts[keep]


def add_span(spans: Spans, start: int, stop: int) -> Spans:
    """``spans`` with ``[start, stop)`` joined in (merged with those it overlaps or touches)."""
    if stop <= start:
        return tuple(spans)
    kept = []
    for low, high in spans:
        if high < start or low > stop:
            kept.append((low, high))
        else:
            start, stop = min(low, start), max(high, stop)
    return tuple(sorted([*kept, (start, stop)]))


def clip_spans(spans: Spans, stop: int) -> Spans:
    """The part of ``spans`` before position ``stop``."""
    return tuple((low, min(high, stop)) for low, high in spans if low < stop)


def prior_rows(plan: EpochPlan, spans: Spans) -> Iterator[np.ndarray]:
    """The rows of the global batches ``spans`` of ``plan``'s epoch, as laid out before a
    checkpoint (batch ``p``: permutation positions ``[p * batch_size, (p + 1) * batch_size)``,
    the last one cut at ``num_rows``; every batch before a checkpoint is a full one), in chunks
    of at most :data:`CHUNK` rows."""
    for low, high in spans:
        top = min(high * plan.batch_size, plan.num_rows)
        for start in range(low * plan.batch_size, top, CHUNK):
            yield plan.order.slice(start, min(start + CHUNK, top))


def complete(shares: Iterable[Share], world_size: int) -> bool:
    """Whether ``shares`` (those found so far) are every share of an epoch: one reader of every
    rank with each of its workers, or every rank ``0 .. world_size-1`` with each of its workers
    (the number of workers may differ between ranks; each rank's records must agree on it)."""
    by_rank: dict[int, set[tuple[int, int]]] = {}
    for share in shares:
        by_rank.setdefault(share.rank, set()).add((share.worker_id, share.num_workers))
    ranks = [-1] if -1 in by_rank else range(world_size)
    for rank in ranks:
        found = by_rank.get(rank, set())
        counts = {k for _, k in found}
        if len(counts) != 1 or {w for w, _ in found} != set(range(counts.pop())):
            return False
    return True


def disagreement(rules: Sequence[tuple[Share, Mapping[str, Any]]]) -> str | None:
    """``None`` when every record read the same rule (``uri``, version, epoch, start, seed and
    the rest), else what differs, share by share, the fields in :data:`RULE_ORDER` (the first
    one named is the first difference)."""
    first_share, first = rules[0]
    lines = []

    def rank(key: str) -> tuple[int, str]:
        return (RULE_ORDER.index(key) if key in RULE_ORDER else len(RULE_ORDER), key)

    for share, rule in rules[1:]:
        differ = sorted((k for k in {*first, *rule} if first.get(k) != rule.get(k)), key=rank)
        if differ:
            shown = ", ".join(f"{k}={rule.get(k)!r} (against {first.get(k)!r})" for k in differ)
            lines.append(f"{share} read {shown}")
    if not lines:
        return None
    return f"the records disagree on what was read ({first_share} is the reference): " + "; ".join(
        lines
    )


# -- the check ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class ShareCount:
    """One record of a check: its share, the batches and rows it handed out, and the batches
    the rule gives it."""

    share: Share
    batches: int
    rows: int
    expected_batches: int

    def __str__(self) -> str:
        text = f"{self.share}: {self.batches} batches, {self.rows} rows"
        if self.batches != self.expected_batches:
            text += f" (the rule gives it {self.expected_batches} batches)"
        return text


@dataclass(frozen=True)
class AuditReport:
    """The verdict of one epoch's coverage audit over every rank and DataLoader worker.

    Attributes:
        uri (str): the dataset (without credentials); ``version`` (int): the pinned version.
        epoch (int), start (int): the epoch checked, from global batch ``start`` (a mid-epoch
            resume: the rows delivered before are not covered).
        world_size (int): the ranks of the epoch's rule.
        shares (tuple[ShareCount, ...]): each record: its rank and worker, batches and rows.
        rows_expected (int): deliveries the rule calls for (padding counted, the dropped tail
            and the rows before ``start`` not).
        rows_delivered (int): rows handed out over all records.
        num_padded (int), num_dropped (int): the rule's padded deliveries and dropped rows.
        num_missing, num_repeated, num_unexpected (int): rows delivered fewer times than the rule
            says, more times, and delivered although the rule leaves them out.
        missing (tuple[int, ...]): the first :data:`SHOWN` missing row ids (ascending).
        repeated (tuple[tuple[int, int, int], ...]): the first repeated ones, as
            ``(row, times delivered, times the rule says)``.
        unexpected (tuple[int, ...]): the first unexpected row ids.
        exact (bool): ``False`` when more than :data:`LISTED` extra deliveries were found:
            those beyond are not listed, so the counts are lower bounds (and ``ok`` is ``False``).
        before (tuple[tuple[int, int], ...] | None): a resumed epoch (``start > 0``): the global
            batches ``[start, stop)`` the checkpoint's record (``state["audit"]``) says were
            consumed before it, counted as delivered, so the check covers the whole epoch;
            ``None``: the state had no record, the check covers the rows from ``start`` on only.
            ``()`` for an epoch read from its start.
    """

    uri: str
    version: int
    epoch: int
    start: int
    world_size: int
    shares: tuple[ShareCount, ...]
    rows_expected: int
    rows_delivered: int
    num_padded: int
    num_dropped: int
    num_missing: int
    num_repeated: int
    num_unexpected: int
    missing: tuple[int, ...]
    repeated: tuple[tuple[int, int, int], ...]
    unexpected: tuple[int, ...]
    exact: bool = True
    before: Spans | None = ()

    @property
    def ok(self) -> bool:
        """Every row delivered as the rule says, every share with the rule's batches."""
        if not self.exact or self.num_missing or self.num_repeated or self.num_unexpected:
            return False
        return all(count.batches == count.expected_batches for count in self.shares)

    def summary(self) -> str:
        """One line: the verdict and its counts."""
        verdict = "passed" if self.ok else "FAILED"
        return (
            f"coverage audit of epoch {self.epoch} {verdict}: {self.uri!r} version {self.version}, "
            f"{len(self.shares)} record{'s' if len(self.shares) > 1 else ''} over "
            f"{self.world_size} rank{'s' if self.world_size > 1 else ''}"
            + self._covered()
            + f"; {self.rows_delivered} rows delivered, the rule calls for {self.rows_expected} "
            f"({self.num_padded} padded, {self.num_dropped} dropped); {self.num_missing} rows "
            f"missing, {self.num_repeated} repeated, {self.num_unexpected} unexpected"
        )

    def _covered(self) -> str:
        """What part of a resumed epoch the check covers, for :meth:`summary`."""
        if not self.start:
            return ""
        if self.before is None:
            return (
                f" from global batch {self.start} (the rest of the epoch only: the resumed "
                f"state had no audit record)"
            )
        shown = ", ".join(f"[{low}, {high})" for low, high in self.before) or "none"
        return (
            f" from global batch {self.start}, the whole epoch (the checkpoint's record of the "
            f"batches consumed before it: {shown})"
        )

    def failure(self) -> str:
        """What went wrong, for :class:`~lance_prefetch.CoverageError`: the summary, the first
        ids of each kind, and the shares off the rule (or all, when none is)."""
        parts = [self.summary()]
        if self.missing:
            parts.append(f"missing (first {SHOWN}): {list(self.missing)}")
        if self.repeated:
            shown = ", ".join(f"{row} ({n} times, rule: {k})" for row, n, k in self.repeated)
            parts.append(f"repeated (first {SHOWN}): {shown}")
        if self.unexpected:
            parts.append(f"unexpected (first {SHOWN}): {list(self.unexpected)}")
        off = [c for c in self.shares if c.batches != c.expected_batches] or list(self.shares)
        parts.append("records: " + "; ".join(str(count) for count in off))
        return ". ".join(parts)

    def to_json(self) -> str:
        """The report as JSON (``report.json`` of an ``audit_dir``)."""
        return json.dumps({**asdict(self), "ok": self.ok}, indent=1)


def check(
    plan: EpochPlan,
    shares: Sequence[Share],
    records: Iterable[Delivered],
    *,
    uri: str,
    version: int,
    before: Spans | None = None,
) -> AuditReport:
    """Check the records of ``shares`` (``records`` in the same order, consumed one at a time)
    against ``plan``'s rule (module docstring). ``before``: the batches of the epoch consumed
    before ``plan.start`` (a checkpoint's record): their rows count as delivered once, here (not
    by any share), and the rule covers the whole epoch; ``None``: from ``plan.start`` only."""
    if plan.start == 0:
        before = ()
    expected = expected_deliveries(plan, shares, whole=before is not None)
    union = bitmap(plan.num_rows)
    extra: list[np.ndarray] = []  # one entry per delivery of a row after its first
    listed, exact, counts, delivered = 0, True, [], 0
    for rows in prior_rows(plan, before or ()):  # distinct rows: the spans do not overlap
        set_rows(union, rows)
        delivered += len(rows)
    for share, record in zip(shares, records, strict=True):
        overlap = union & record.bits  # rows an earlier record delivered too
        if overlap.any():
            found = rows_of(overlap, LISTED - listed)
            exact = exact and len(found) == popcount(overlap)
            extra.append(found)
            listed += len(found)
        repeats = record.repeats[: LISTED - listed]
        exact = exact and len(repeats) == len(record.repeats)
        extra.append(repeats)
        listed += len(repeats)
        union |= record.bits
        delivered += record.rows
        counts.append(ShareCount(share, record.batches, record.rows, len(share.locals(plan))))
    again, times = np.unique(np.concatenate(extra), return_counts=True)
    rows = np.union1d(again, expected.extra_rows)  # the rows delivered or due more than once
    got = has_rows(union, rows) + _lookup(again, times, rows)
    due = has_rows(expected.bits, rows) + _lookup(expected.extra_rows, expected.extra_counts, rows)
    short = rows[(got > 0) & (got < due)]
    over = (got > due) & (due > 0)
    absent = expected.bits & ~union
    stray = union & ~expected.bits
    shown = np.flatnonzero(over)[:SHOWN]
    return AuditReport(
        uri=uri,
        version=version,
        epoch=plan.epoch,
        start=plan.start,
        world_size=plan.world_size,
        shares=tuple(counts),
        rows_expected=expected.total,
        rows_delivered=delivered,
        num_padded=plan.num_padded,
        num_dropped=plan.num_dropped,
        num_missing=popcount(absent) + len(short),
        num_repeated=int(over.sum()),
        num_unexpected=popcount(stray),
        missing=tuple(int(r) for r in np.union1d(rows_of(absent, SHOWN), short)[:SHOWN]),
        repeated=tuple((int(rows[i]), int(got[i]), int(due[i])) for i in shown),
        unexpected=tuple(int(r) for r in rows_of(stray, SHOWN)),
        exact=exact,
        before=None if before is None else tuple((int(a), int(b)) for a, b in before),
    )


def _lookup(keys: np.ndarray, values: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """``values`` of ``rows`` among sorted ``keys`` (``0`` where a row is not a key)."""
    if len(keys) == 0:
        return np.zeros(len(rows), dtype=np.int64)
    at = np.minimum(np.searchsorted(keys, rows), len(keys) - 1)
    return np.where(keys[at] == rows, values[at], 0).astype(np.int64)
