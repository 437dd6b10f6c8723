"""Position algebra: where an iteration is within its epoch, what a checkpoint records of it, and
where a resumed iteration starts.

A *position* counts the global batches of an epoch (over all ranks) delivered before the next one
(:mod:`lance_prefetch.plan.sampling`). Rank ``r`` delivers its ``j``-th batch at global position
``start + j * world_size + r``; DataLoader worker ``w`` of ``K`` delivers the rank's batches
``j = w (mod K)``. Pure code: no Lance, no torch, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

__all__ = [
    "Decision",
    "DeliveryCounter",
    "Resume",
    "consumed_position",
    "end_position",
    "first_local",
    "merge_worker_states",
    "plan_resume",
    "saved_position",
    "worker_skip",
]


class Decision(NamedTuple):
    """What one iteration reads: ``epoch``, from global position ``start``."""

    epoch: int
    start: int


def first_local(worker_id: int, num_workers: int, skip: int = 0) -> int:
    """The rank's first batch that worker ``worker_id`` of ``num_workers`` produces after the
    rank's first ``skip`` batches: the smallest ``j >= skip`` with ``j % num_workers == worker_id``."""
    return worker_id + -(-max(skip - worker_id, 0) // num_workers) * num_workers


def end_position(num_rows: int, batch_size: int, *, drop_last: bool) -> int:
    """The position that stands for "this epoch is over", for any world size.

    A plan started there has no batches: fewer than ``batch_size`` rows remain with
    ``drop_last=True`` (``num_rows // batch_size``), none with ``drop_last=False``
    (``ceil(num_rows / batch_size)``). Every earlier position still has batches, so a finished
    epoch's position (which a padded last round can push past this) is saved as this one.
    """
    if drop_last:
        return num_rows // batch_size
    return math.ceil(num_rows / batch_size)


def consumed_position(batches: int, per_rank: int, world_size: int, end: int) -> int:
    """The position after a rank's training step consumed its first ``batches`` of an epoch in
    which it has ``per_rank``: ``batches`` whole rounds of ``world_size``, or ``end`` once the
    rank's share is over.

    Raises:
        ValueError: ``batches`` above ``per_rank``.
    """
    if batches > per_rank:
        raise ValueError(
            f"batches should be at most {per_rank}, the batches of an epoch on this rank, "
            f"but got batches={batches}; count the batches of the current epoch only"
        )
    return end if batches == per_rank else batches * world_size


def worker_skip(position: int, start: int, world_size: int) -> int:
    """The rank's batches delivered between ``start`` and ``position`` (whole rounds)."""
    return (position - start) // world_size


class DeliveryCounter:
    """How far one iteration in this process got: the position after its last delivered batch.

    The iteration reads ``decision.epoch`` from ``decision.start`` for one rank; in DataLoader
    worker ``worker_id`` of ``num_workers`` it delivers the rank's batches ``j = worker_id (mod
    num_workers)``, ``j >= skip`` (see :meth:`~lance_prefetch.plan.sampling.EpochPlan.rank_batches`).

    Attributes:
        delivered (int): batches handed to the consumer so far (incremented by the iterator).
        finished (bool): the iterator was exhausted: every batch of the share was handed out.
    """

    def __init__(
        self,
        ident: int,
        decision: Decision,
        *,
        world_size: int,
        worker_id: int = 0,
        num_workers: int = 1,
        skip: int = 0,
    ) -> None:
        self.ident, self.decision, self.world_size = ident, decision, world_size
        self.worker_id, self.num_workers, self.skip = worker_id, num_workers, skip
        self.first = first_local(worker_id, num_workers, skip)
        self.delivered = 0
        self.finished = False

    @property
    def position(self) -> int:
        """Global batches of the epoch delivered before this worker's next batch."""
        return self.position_after(self.delivered)

    def position_after(self, delivered: int) -> int:
        """The position after this iteration's first ``delivered`` batches (``<= delivered``)."""
        if delivered == 0:
            return self.decision.start + self.skip * self.world_size
        last = self.first + (delivered - 1) * self.num_workers
        return self.decision.start + (last + 1) * self.world_size


def saved_position(
    *,
    pending: Decision | None,
    counter: DeliveryCounter | None,
    in_worker: bool,
    decided: bool,
    end: int,
    live: bool = False,
    held: int = 0,
) -> tuple[int, int, dict[str, int] | None]:
    """``(epoch, position, worker)`` for a checkpoint: what resuming should continue.

    In order:

    1. A ``live`` iteration in this process (begun, not closed; its decision the latest when
       ``decided``): its epoch after the batches the training step consumed, i.e. those
       delivered but the ``held`` ones a framework wrapper pulled ahead. A ``set_epoch`` called
       meanwhile applies to the next iteration, not to this state.
    2. Outside a worker, what the next iteration reads if it was selected (``pending``:
       ``set_epoch`` or ``load_state_dict`` since the latest iteration began).
    3. Outside a worker, an iteration closed before its end (``break``, ``close()``): the next
       iteration reads the next epoch from its start, and so does a resumed run.
    4. Otherwise the latest iteration's position (``counter``). Outside a worker a finished
       epoch (an exhausted iteration, or a position at ``end``) is saved at ``end``
       (:func:`end_position`); inside one, ``worker`` describes its share.

    Raises:
        RuntimeError: the latest iteration runs in DataLoader worker processes (or ran in the
            loader this copy was pickled from), so this process cannot know the position.
    """
    ours = counter is not None and (in_worker or decided)
    if pending is not None and not in_worker and not (live and ours):
        return pending.epoch, min(pending.start, end), None
    if counter is None or not ours:
        raise RuntimeError(
            "this loader's latest iteration ran elsewhere (in DataLoader worker processes, or "
            "in the loader this copy was pickled from), so this process cannot tell how many "
            "batches reached the training loop; with workers use torchdata's "
            "StatefulDataLoader and its state_dict(); otherwise take state_dict() from the "
            "loader that iterated, or call it between epochs after set_epoch()"
        )
    epoch = counter.decision.epoch
    consumed = counter.delivered - held
    if not in_worker:
        if counter.finished and held == 0:
            return epoch, end, None
        if not live and not counter.finished:  # broken off: rule 3 reads the next epoch
            return epoch + 1, 0, None
        # a rank's share can end before the epoch's last batch (shuffle=False)
        return epoch, min(counter.position_after(consumed), end), None
    worker = {
        "id": counter.worker_id,
        "num_workers": counter.num_workers,
        "start": counter.decision.start,
    }
    return epoch, counter.position_after(consumed), worker


class Resume(NamedTuple):
    """Where a loaded state makes the next iteration start.

    ``in_worker``: the decision applies to this DataLoader worker's copy only (the worker joins
    it instead of the shared epoch state), skipping the rank's first ``skip`` batches; else it
    is loaded into the shared epoch state.
    """

    decision: Decision
    skip: int
    in_worker: bool


def plan_resume(
    state: Mapping[str, Any], *, here: tuple[int, int] | None, world_size: int
) -> Resume:
    """Where a checked ``state`` resumes, loaded in DataLoader worker ``here = (id,
    num_workers)`` (``None``: outside workers) of a loader with ``world_size`` ranks.

    Raises:
        ValueError: ``state`` holds a worker's share and is loaded elsewhere than in that worker,
            or with another ``world_size``.
    """
    decision = Decision(state["epoch"], state["position"])
    saved_by = state.get("worker")
    if saved_by is None:
        return Resume(decision, 0, in_worker=here is not None)
    if here != (saved_by["id"], saved_by["num_workers"]):
        where = (
            "outside DataLoader workers" if here is None else f"in worker {here[0]} of {here[1]}"
        )
        raise ValueError(
            f"state holds only the share of DataLoader worker {saved_by['id']} of "
            f"{saved_by['num_workers']}, but it is loaded {where}; merge the workers' states "
            f"with lance_prefetch.state_from_dataloader() and load that into the loader before "
            f"the DataLoader starts"
        )
    if state["world_size"] != world_size:
        raise ValueError(
            f"state holds a DataLoader worker's share saved with "
            f"world_size={state['world_size']}, but this loader has "
            f"world_size={world_size}; to resume on another number of ranks, merge "
            f"the workers' states with lance_prefetch.state_from_dataloader() and load "
            f"that into the loader before the DataLoader starts"
        )
    start = saved_by["start"]
    skip = worker_skip(state["position"], start, world_size)
    return Resume(Decision(state["epoch"], start), skip, in_worker=True)


def merge_worker_states(states: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The state of the whole rank from its DataLoader workers' states (each with a
    ``"worker"`` share of one iteration): workers deliver round-robin, so the furthest worker's
    position is the rank's; a finished epoch is clamped to :func:`end_position`.

    Raises:
        ValueError: the states disagree on the epoch, the iteration's start or ``num_workers``.
    """
    shared = {(s["epoch"], s["worker"]["start"], s["worker"]["num_workers"]) for s in states}
    if len(shared) != 1:
        raise ValueError(f"the workers' states disagree on (epoch, start, num_workers): {shared}")
    merged = dict(max(states, key=lambda s: s["position"]))
    del merged["worker"]
    merged.pop("read_ahead", None)
    end = end_position(merged["num_rows"], merged["batch_size"], drop_last=merged["drop_last"])
    merged["position"] = min(merged["position"], end)
    return merged
