"""Sampling: which rows make up which batch, for one epoch, rank and DataLoader worker.

Pure code: no Lance, no torch, no global random state. Everything is derived from
``(num_rows, batch_size, seed, epoch, world_size, drop_last)``, so every process that builds the same
:class:`EpochPlan` gets the same batches, on any machine.

The rules
---------
1. **Permutation.** Epoch ``e`` orders the row offsets ``0 .. num_rows-1`` uniformly at random,
   without replacement, determined by ``(seed, e)`` and different for every epoch, in one of two
   kinds (:mod:`lance_prefetch.plan.permutation`): ``"array"``, a numpy ``Generator`` seeded from
   the epoch's ``SeedSequence`` (below, "Seeds") shuffling an array of the smallest unsigned dtype
   that fits
   (``uint8``/``uint16``/``uint32``/``uint64``), or ``"lazy"``, a keyed Feistel bijection computed
   per batch in constant memory. ``"auto"`` (the default) is ``"lazy"`` above
   :data:`~lance_prefetch.plan.permutation.LAZY_THRESHOLD` (2**27) rows. Rules 2-4 and resuming are the
   same for both; only the order differs.
2. **Global batches.** The permutation is cut into consecutive *global batches*. Global batch ``g``
   goes to rank ``g % world_size``; so rank ``r`` sees global batches ``r, r + W, r + 2W, ...``.
   Every rank yields ``batches_per_rank`` batches, the same number on every rank.
3. ``drop_last=True``: ``batches_per_rank = num_rows // (batch_size * world_size)``; every batch holds
   exactly ``batch_size`` rows, no row repeats, and the rows left out are the tail of that epoch's
   permutation (``num_rows - batches_per_rank * world_size * batch_size`` rows, a different set every
   epoch).
4. ``drop_last=False``: ``batches_per_rank = ceil(num_rows / (batch_size * world_size))``. All rounds
   but the last hold ``batch_size`` rows per batch. The last round covers the ``R`` remaining rows with
   one batch per rank of ``last_batch_size = ceil(R / world_size)`` rows each (the same size on every
   rank, never empty); the ``world_size * last_batch_size - R < world_size`` rows still needed are taken
   by wrapping around to the start of the permutation, as ``torch.utils.data.DistributedSampler`` pads.
   With ``world_size=1`` nothing repeats and only the last batch may be short.

These counts equal those of ``DistributedSampler`` followed by ``BatchSampler`` with the same
``drop_last`` on every rank.

5. ``shuffle=False`` (evaluation): the order is the dataset's own (``"identity"``: position
   ``p`` holds row ``p``), the same every epoch. With ``drop_last=False`` nothing is padded:
   global batch ``g`` holds rows ``g * batch_size ..`` (the last one may be short), ranks take
   them round-robin by rule 2, and a rank may get one batch fewer than rank 0 (``batches_of``):
   every row exactly once, in dataset order across ranks. With ``drop_last=True``, rule 3 in the
   dataset's order.

Worked example: ``num_rows=11, batch_size=2, world_size=2, drop_last=False``, permutation
``p = [p0 .. p10]``: ``batches_per_rank = ceil(11/4) = 3``; rounds 0 and 1 are global batches
``[p0 p1] [p2 p3] [p4 p5] [p6 p7]``; the last round has ``R = 3`` rows, ``last_batch_size = 2``:
``[p8 p9]`` for rank 0 and ``[p10 p0]`` for rank 1 (``p0`` is the one padded row). Rank 0 yields
``[p0 p1] [p4 p5] [p8 p9]``; rank 1 yields ``[p2 p3] [p6 p7] [p10 p0]``.

Seeds
-----
Every random stream (an epoch's permutation, a mixture's dataset, a split by position) is seeded
by one ``numpy.random.SeedSequence`` whose entropy is a fixed-width array of ``uint32`` words::

    [s_0, s_1, s_2, s_3, stream, v_lo, v_hi]

``seed = s_0 + 2**32 * s_1`` (``s_2 = s_3 = 0``: a seed is in ``[0, 2**64)``); ``stream`` names the
stream; ``v = v_lo + 2**32 * v_hi`` is its value, in ``[0, 2**64)``. Epoch ``e``'s permutation:
stream ``0x45504F43`` ("EPOC"), ``v = e``. A mixture's dataset ``i`` shuffles its rows each
epoch as an epoch permutation whose seed is ``SeedSequence(...).generate_state(1, uint64)`` of
stream ``0x4D495854`` ("MIXT"), ``v = i``. A split by position: stream ``0x53504C54`` ("SPLT")
and no ``v`` (``[s_0, s_1, s_2, s_3, stream]``, which is ``SeedSequence(seed,
spawn_key=(0x53504C54,))``). Every word is kept, zero words too, so distinct ``(seed, e)`` never
share an entropy. (Versions before this rule used ``SeedSequence([seed, e])``, which drops each
integer's high zero words: seed ``2**32 + 7`` in epoch 0 and seed ``7`` in epoch 1 shuffled
alike. Their checkpoint states are refused: :mod:`lance_prefetch.state`.)

DataLoader workers
------------------
Within a rank, worker ``w`` of ``K`` takes the rank's batches ``w, w + K, w + 2K, ...``. The
DataLoader collects from its workers round-robin, so the rank sees its batches in the same order for
any ``num_workers``.

Resuming mid-epoch
------------------
A *position* counts the global batches of an epoch already consumed (over all ranks). A plan with
``start=P`` lays out only the rows after them, ``permutation[P * batch_size:]``, by rules 2-4 with
its own ``world_size``, numbering its global batches ``P, P + 1, ...``. With the same ``world_size``
(``P`` is then a multiple of it) these are exactly the batches the uninterrupted epoch has from ``P``
on; with another ``world_size`` (an elastic resume) the remaining rows are re-split over the new ranks,
so across the old and new ranks every row is still delivered once (``drop_last=True``: but for a tail
shorter than one round of the new ranks, which is dropped).
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np

from lance_prefetch._validate import check_bool, check_int, check_seed
from lance_prefetch.plan._positions import first_local
from lance_prefetch.plan.permutation import (
    CHUNK_ROWS,
    ArrayPermutation,
    Permutation,
    epoch_permutation,
    index_dtype,
    make_permutation,
    resolve_kind,
)

__all__ = ["EpochPlan", "PlannedBatch", "TooFewRowsError", "epoch_permutation", "index_dtype"]


class TooFewRowsError(ValueError):
    """:class:`EpochPlan`'s ``ValueError`` for ``drop_last=True`` with fewer than ``needed`` rows
    (``num_rows``): a loader re-raises it naming its filter, split or datasets."""

    def __init__(self, needed: str, num_rows: int, rows: str = "the dataset has") -> None:
        self.needed, self.num_rows = needed, num_rows
        super().__init__(
            f"drop_last=True needs at least {needed} rows, but {rows} {num_rows}; use a smaller "
            f"batch_size or drop_last=False"
        )


@dataclass(frozen=True)
class PlannedBatch:
    """One batch of the plan.

    Attributes:
        position (int): the global batch number within the epoch (``0 .. num_batches-1``); rank
            ``position % world_size`` yields it, as its ``position // world_size``-th batch.
        indices (numpy.ndarray): shape ``(rows,)``, unsigned integer dtype; offsets among the live
            rows of the dataset version, in permutation order. Often a view of the epoch's
            permutation (``"array"``) or of a few batches computed together (``"lazy"``).
    """

    position: int
    indices: np.ndarray


@dataclass(frozen=True, kw_only=True)
class EpochPlan:
    """The batches of one epoch for every rank, following the rules in this module's docstring.

    Args:
        num_rows (int): live rows in the dataset version, ``>= 1``.
        batch_size (int): rows per batch, ``>= 1``.
        seed (int, optional): base seed, in ``[0, 2**64)``. Default: ``0``.
        epoch (int, optional): epoch number, in ``[0, 2**64)``. Default: ``0``.
        world_size (int, optional): number of ranks, ``>= 1``. Default: ``1``.
        drop_last (bool, optional): drop the permutation's tail so every batch is full (``True``), or
            pad by wrapping around so every row is delivered (``False``). Default: ``True``.
        start (int, optional): global batches of this epoch already consumed, ``>= 0``; the plan
            covers the rest (see "Resuming mid-epoch" above). Default: ``0``, the whole epoch.
        permutation_kind (str, optional): how the epoch's permutation is held (rule 1):
            ``"array"``, ``"lazy"`` or ``"auto"`` (``"lazy"`` above 2**27 rows); resolved to
            ``"array"`` or ``"lazy"`` on construction (``"identity"`` with ``shuffle=False``).
            Default: ``"auto"``.
        shuffle (bool, optional): ``False``: the dataset's order, without padding when
            ``drop_last=False`` (rule 5). Default: ``True``.

    Raises:
        TypeError: an argument has the wrong type (bools are not integers here).
        ValueError: a value is out of range (``seed`` or ``epoch`` ``2**64`` or more too).
        TooFewRowsError: (a ``ValueError``) ``drop_last=True``, ``start=0`` and
            ``num_rows < batch_size * world_size`` (no rank could get a single full batch).
    """

    num_rows: int
    batch_size: int
    seed: int = 0
    epoch: int = 0
    world_size: int = 1
    drop_last: bool = True
    start: int = 0
    permutation_kind: str = "auto"
    shuffle: bool = True

    def __post_init__(self) -> None:
        check_int("num_rows", self.num_rows, minimum=1)
        check_int("batch_size", self.batch_size, minimum=1)
        check_seed("seed", self.seed)
        check_seed("epoch", self.epoch)
        check_int("world_size", self.world_size, minimum=1)
        check_bool("drop_last", self.drop_last)
        check_int("start", self.start, minimum=0)
        check_bool("shuffle", self.shuffle)
        kind = (
            "identity" if not self.shuffle else resolve_kind(self.permutation_kind, self.num_rows)
        )
        object.__setattr__(self, "permutation_kind", kind)  # frozen: set once, resolved
        if self.drop_last and self.start == 0 and self.num_rows < self.rows_per_round:
            raise TooFewRowsError(
                f"batch_size * world_size = {self.batch_size} * {self.world_size} = "
                f"{self.batch_size * self.world_size}",
                self.num_rows,
            )

    @functools.cached_property
    def rows_per_round(self) -> int:
        """Rows in one full round (one full batch for every rank): ``batch_size * world_size``."""
        return self.batch_size * self.world_size

    @functools.cached_property
    def num_remaining(self) -> int:
        """Rows of the permutation this plan lays out: those after the first ``start`` batches."""
        return max(self.num_rows - self.start * self.batch_size, 0)

    @functools.cached_property
    def uneven(self) -> bool:
        """Whether ranks may get different numbers of batches: ``shuffle=False`` with
        ``drop_last=False`` (rule 5, no padding)."""
        return not self.shuffle and not self.drop_last

    @functools.cached_property
    def batches_per_rank(self) -> int:
        """Batches every rank yields (rank 0's, the most, when :attr:`uneven`)."""
        if self.uneven:
            return -(-self.num_batches // self.world_size)
        if self.drop_last:
            return self.num_remaining // self.rows_per_round
        return -(-self.num_remaining // self.rows_per_round)

    def batches_of(self, rank: int) -> int:
        """Batches rank ``rank`` yields (for ``start=0``, its ``len(loader)``)."""
        if self.uneven:
            return max(-(-(self.num_batches - rank) // self.world_size), 0)
        return self.batches_per_rank

    @functools.cached_property
    def num_batches(self) -> int:
        """Global batches in this plan, over all ranks: ``batches_per_rank * world_size`` (when
        :attr:`uneven`, ``ceil(num_remaining / batch_size)``)."""
        if self.uneven:
            return -(-self.num_remaining // self.batch_size)
        return self.batches_per_rank * self.world_size

    @functools.cached_property
    def end(self) -> int:
        """The position after this plan's last batch: ``start + num_batches``."""
        return self.start + self.num_batches

    @functools.cached_property
    def last_batch_size(self) -> int:
        """Rows in each rank's last batch: ``batch_size``, or less with ``drop_last=False``
        (``0`` when the plan has no batches); when :attr:`uneven`, of the last global batch."""
        if self.batches_per_rank == 0:
            return 0
        if self.uneven:
            return self.num_remaining - (self.num_batches - 1) * self.batch_size
        if self.drop_last:
            return self.batch_size
        remaining = self.num_remaining - (self.batches_per_rank - 1) * self.rows_per_round
        return -(-remaining // self.world_size)

    @property
    def num_delivered(self) -> int:
        """Rows this plan delivers over all ranks, padding included."""
        if self.batches_per_rank == 0:
            return 0
        if self.uneven:
            return self.num_remaining
        full_rounds = self.batches_per_rank - 1
        return full_rounds * self.rows_per_round + self.world_size * self.last_batch_size

    @property
    def num_dropped(self) -> int:
        """Rows of the permutation's tail left out (``drop_last=True``), else ``0``."""
        return max(self.num_remaining - self.num_delivered, 0)

    @property
    def num_padded(self) -> int:
        """Rows delivered twice by wrapping around (``drop_last=False``), else ``0``."""
        return max(self.num_delivered - self.num_remaining, 0)

    @functools.cached_property
    def order(self) -> Permutation:
        """This epoch's permutation, of kind :attr:`permutation_kind`; batches are read from it by
        position (a lazy one holds only its round keys; batches are computed a few at a time)."""
        return make_permutation(self.permutation_kind, self.num_rows, self.seed, self.epoch)

    @property
    def permutation(self) -> np.ndarray:
        """This epoch's whole permutation as an array. ``"array"``: :func:`epoch_permutation`
        ``(num_rows, seed, epoch)``, kept. ``"lazy"``: computed anew at each access,
        ``num_rows * itemsize`` bytes; the plan's own batches never need it (use :attr:`order`)."""
        order = self.order
        return order.array if isinstance(order, ArrayPermutation) else np.asarray(order)

    def batch(self, position: int) -> PlannedBatch:
        """Global batch ``position`` (``start .. end-1``).

        Raises:
            IndexError: ``position`` is outside ``[start, end)``.
        """
        position = check_int("position", position)
        if not self.start <= position < self.end:
            raise IndexError(
                f"position={position} is outside the plan's global batches "
                f"[{self.start}, {self.end})"
            )
        return self._planned(position)

    def _planned(self, position: int) -> PlannedBatch:
        """Global batch ``position``, known to be in ``[start, end)``."""
        start, stop = self._span(position)
        if stop <= self.num_rows:
            indices = self.order.slice(start, stop)
        else:  # drop_last=False padding: wrap around to the start of the permutation
            indices = self.order.take(np.arange(start, stop) % self.num_rows)
        return PlannedBatch(position, indices)

    def _span(self, position: int) -> tuple[int, int]:
        """Permutation positions ``[start, stop)`` of global batch ``position`` (``stop`` may pass
        ``num_rows``: those wrap around)."""
        if self.uneven:
            start = position * self.batch_size
            return start, min(start + self.batch_size, self.num_rows)
        last_round_start = self.start + (self.batches_per_rank - 1) * self.world_size
        if position < last_round_start:
            start, size = position * self.batch_size, self.batch_size
        else:
            size = self.last_batch_size
            start = last_round_start * self.batch_size + (position - last_round_start) * size
        return start, start + size

    def _batches(self, positions: list[int]) -> list[PlannedBatch]:
        """Global batches ``positions``, computed with one :meth:`Permutation.take`."""
        spans = np.array([self._span(position) for position in positions], dtype=np.int64)
        sizes = spans[:, 1] - spans[:, 0]
        ends = np.cumsum(sizes)
        rows = np.arange(ends[-1], dtype=np.int64)
        rows += np.repeat(spans[:, 0] - (ends - sizes), sizes)  # each batch's own positions
        if spans[:, 1].max() > self.num_rows:  # drop_last=False padding wraps around
            rows %= self.num_rows
        values = self.order.take(rows)
        return [
            PlannedBatch(p, v) for p, v in zip(positions, np.split(values, ends[:-1]), strict=True)
        ]

    def rank_batches(
        self, rank: int, *, worker_id: int = 0, num_workers: int = 1, skip: int = 0
    ) -> Iterator[PlannedBatch]:
        """The batches that worker ``worker_id`` of ``num_workers`` produces for rank ``rank``.

        The rank's ``j``-th batch is global batch ``start + j * world_size + rank``; the worker takes
        the rank's batches ``j = worker_id, worker_id + num_workers, ...`` with ``j >= skip``, in
        that order.

        Args:
            skip (int, optional): the rank's first ``skip`` batches were already delivered (a
                DataLoader worker resuming its own share). Default: ``0``.

        Raises:
            ValueError: ``rank`` is outside ``[0, world_size)`` or ``worker_id`` outside
                ``[0, num_workers)``.
        """
        rank = check_int("rank", rank, minimum=0)
        num_workers = check_int("num_workers", num_workers, minimum=1)
        worker_id = check_int("worker_id", worker_id, minimum=0)
        skip = check_int("skip", skip, minimum=0)
        if rank >= self.world_size:
            raise ValueError(
                f"Invalid rank {rank}, rank should be in the interval [0, {self.world_size - 1}]"
            )
        if worker_id >= num_workers:
            raise ValueError(
                f"Invalid worker_id {worker_id}, it should be in the interval [0, {num_workers - 1}]"
            )
        first = first_local(worker_id, num_workers, skip)
        locals_ = range(first, self.batches_of(rank), num_workers)
        return self._at(self.start + local * self.world_size + rank for local in locals_)

    def all_batches(
        self, *, worker_id: int = 0, num_workers: int = 1, skip: int = 0
    ) -> Iterator[PlannedBatch]:
        """Every rank's batches in global order, ``start, start + 1, ...``, for one process that
        reads for all ranks and deals the batches out itself (Accelerate's dispatching): worker
        ``worker_id`` of ``num_workers`` takes the plan's batches ``j = worker_id (mod
        num_workers)``, ``j >= skip``. Batch ``g`` is the one rank ``g % world_size`` would read.

        Raises:
            ValueError: ``worker_id`` is outside ``[0, num_workers)``.
        """
        num_workers = check_int("num_workers", num_workers, minimum=1)
        worker_id = check_int("worker_id", worker_id, minimum=0)
        skip = check_int("skip", skip, minimum=0)
        if worker_id >= num_workers:
            raise ValueError(
                f"Invalid worker_id {worker_id}, it should be in the interval [0, {num_workers - 1}]"
            )
        first = first_local(worker_id, num_workers, skip)
        return self._at(self.start + j for j in range(first, self.num_batches, num_workers))

    def _at(self, positions: Iterable[int]) -> Iterator[PlannedBatch]:
        """The global batches at ``positions``, lazily, in order (a lazy permutation computes
        several in one vectorised pass)."""
        group = CHUNK_ROWS // self.batch_size
        if self.permutation_kind != "lazy" or group <= 1:  # views, or ranges, per batch
            planned = self._planned
            for position in positions:
                yield planned(position)
            return
        positions = iter(positions)
        while chunk := list(itertools.islice(positions, group)):
            yield from self._batches(chunk)
