"""Epochs across processes: which epoch, from which position, each iteration of a loader reads.

A :class:`~lance_prefetch.PrefetchLoader` is copied into every DataLoader worker process, and a
persistent worker keeps its copy for the whole run, so the main process and the copies must agree
on the epoch without talking to each other. They share one small :class:`EpochControl`: seven
integers in shared memory (a torch tensor, which torch's multiprocessing pickler hands to spawned
workers as shared memory) and an inter-process lock.

The rules
---------
1. ``set_epoch(e)`` (in any process, normally the main one) selects epoch ``e`` for the next
   iteration, read from its start; or from the position a state loaded for epoch ``e`` points to.
2. ``load_state_dict`` selects the state's epoch and position for the next iteration. A state
   saved after the epoch's last batch counts as a finished iteration: rule 3 then moves on.
3. Otherwise a new iteration reads the epoch after the previous iteration's, from its start, so
   epochs never silently repeat.

An *iteration* is one ``iter()`` in one process, or one DataLoader ``iter()`` across all its
workers: the ``K`` workers identify it by the DataLoader's per-iteration base seed (and, for
persistent workers, the number of iterations their copy has run), so the first of them to start
decides by the rules above and the others join that decision. A pure function, :func:`begin`, holds
the rules; :class:`EpochControl` applies it to the shared block under the lock.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.context
import secrets
from collections.abc import Sequence
from typing import Any, NamedTuple

import torch

__all__ = ["Decision", "EpochControl", "LOCK_TIMEOUT_S", "Progress", "begin", "iteration_ident"]

#: How long an iteration start waits for the shared lock, in seconds, before failing loudly.
LOCK_TIMEOUT_S = 10.0

# The shared block's fields. Invariant: EPOCH is the epoch of the running or most recent iteration
# when ADVANCE == 1, and the epoch the next iteration reads when ADVANCE == 0.
EPOCH = 0  # epoch selected or last decided
START = 1  # pending start position from load_state_dict, or -1 for none
ADVANCE = 2  # 1: an iteration began since the last set_epoch/load, so the next one moves on
IDENT = 3  # identity of the iteration that decided last (0: none yet)
JOINED = 4  # processes that joined that decision so far
DECIDED_EPOCH = 5  # the decision they share
DECIDED_START = 6
_NUM_FIELDS = 7
_IDENT_MASK = (1 << 62) - 1


class Decision(NamedTuple):
    """What one iteration reads: ``epoch``, from global position ``start``."""

    epoch: int
    start: int


def begin(
    block: Sequence[int], ident: int, num_workers: int, forced: Decision | None = None
) -> tuple[list[int], Decision]:
    """Apply the module's rules: the shared block after an iteration starts, and what it reads.

    Args:
        block: the current shared fields (see the field constants).
        ident (int): the iteration's identity, ``> 0``; equal for all workers of one iteration.
        num_workers (int): how many processes start this iteration (DataLoader workers, else 1).
        forced (Decision, optional): a worker resuming from its own saved state reads this instead
            (it is recorded so later iterations move on from it).

    Returns:
        ``(new_block, decision)``.
    """
    new = list(block)
    if new[IDENT] == ident and new[JOINED] < num_workers:  # join the iteration's decision
        new[JOINED] += 1
        if forced is None:
            return new, Decision(new[DECIDED_EPOCH], new[DECIDED_START])
        return new, forced
    if forced is not None:
        decision = forced
    elif new[ADVANCE]:
        decision = Decision(new[EPOCH] + 1, 0)
    else:
        decision = Decision(new[EPOCH], max(new[START], 0))
    new[EPOCH], new[START], new[ADVANCE] = decision.epoch, -1, 1
    new[IDENT], new[JOINED] = ident, 1
    new[DECIDED_EPOCH], new[DECIDED_START] = decision
    return new, decision


def iteration_ident(worker_seed: int | None = None, worker_id: int = 0, count: int = 0) -> int:
    """An iteration's identity, ``> 0``.

    In a DataLoader worker, pass ``get_worker_info().seed`` and ``.id`` and the number of
    iterations this copy has started: every worker of one DataLoader iteration gets the same value
    (the base seed ``seed - id`` is drawn once per DataLoader iterator). In the main process
    (``worker_seed=None``) a random value.
    """
    if worker_seed is None:
        return secrets.randbits(62) | 1
    return (hash((worker_seed - worker_id, count)) & _IDENT_MASK) | 1


class EpochControl:
    """The epoch state a loader shares with its copies in DataLoader worker processes.

    Pickled while a process is being spawned (a DataLoader starting its workers), the copy shares
    this one's memory and lock; pickled any other way (``copy.deepcopy``, ``pickle.dumps``) it is an
    independent snapshot.

    Args:
        epoch (int, optional): the first epoch. Default: ``0``.
    """

    def __init__(self, epoch: int = 0) -> None:
        self._block = torch.tensor([epoch, -1, 0, 0, 0, epoch, 0], dtype=torch.int64)
        self._block.share_memory_()
        self._lock = multiprocessing.get_context("spawn").Lock()

    # -- commands --------------------------------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        """Rule 1: the next iteration reads ``epoch``; a pending start loaded for it is kept."""
        with self._locked() as block:
            if not (block[START] >= 0 and block[EPOCH] == epoch):
                block[START] = -1
            block[EPOCH], block[ADVANCE] = epoch, 0

    def load(self, epoch: int, position: int, *, finished: bool) -> None:
        """Rule 2: the next iteration reads ``epoch`` from ``position``; ``finished``: the state was
        saved after the epoch's last batch, so without ``set_epoch`` the next iteration moves on."""
        with self._locked() as block:
            block[EPOCH], block[START], block[ADVANCE] = epoch, position, int(finished)

    def begin(self, ident: int, num_workers: int, forced: Decision | None = None) -> Decision:
        """Start an iteration: decide (or join the decision of) what it reads. See :func:`begin`."""
        with self._locked() as block:
            new, decision = begin(block, ident, num_workers, forced)
            block[:] = new
        return decision

    # -- queries ---------------------------------------------------------------------------------
    @property
    def epoch(self) -> int:
        """The running or most recent iteration's epoch, or the next one's once selected."""
        return int(self._block[EPOCH])

    def pending(self) -> Decision | None:
        """What the next iteration reads if it was selected (set_epoch, load_state_dict, or a new
        loader) rather than left to rule 3; else ``None``."""
        block = self._block.tolist()
        if block[ADVANCE] == 0 or block[START] >= 0:
            return Decision(block[EPOCH], max(block[START], 0))
        return None

    def decided_by(self, ident: int) -> bool:
        """Whether the latest iteration is the one identified by ``ident``."""
        return int(self._block[IDENT]) == ident

    # -- internals -------------------------------------------------------------------------------
    def _locked(self) -> _Locked:
        return _Locked(self)

    def __getstate__(self) -> dict[str, Any]:
        if multiprocessing.context.get_spawning_popen() is not None:
            return {"block": self._block, "lock": self._lock}  # shared with the new process
        return {"block": self._block.clone(), "lock": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._block = state["block"]
        if state["lock"] is None:
            self._block.share_memory_()
            self._lock = multiprocessing.get_context("spawn").Lock()
        else:
            self._lock = state["lock"]

    def __repr__(self) -> str:
        return f"EpochControl({dict(zip(_FIELD_NAMES, self._block.tolist(), strict=True))})"


_FIELD_NAMES = (
    "epoch",
    "start",
    "advance",
    "ident",
    "joined",
    "decided_epoch",
    "decided_start",
)
assert len(_FIELD_NAMES) == _NUM_FIELDS


class _Locked:
    """``with control._locked() as block:`` the shared fields as a list, written back on exit."""

    def __init__(self, control: EpochControl) -> None:
        self._control = control

    def __enter__(self) -> list[int]:
        if not self._control._lock.acquire(timeout=LOCK_TIMEOUT_S):
            raise RuntimeError(
                f"could not take the loader's epoch lock within {LOCK_TIMEOUT_S:.0f} s; a "
                f"DataLoader worker holding it was probably killed. Recreate the loader"
            )
        self._block = self._control._block.tolist()
        return self._block

    def __exit__(self, exc_type: object, *rest: object) -> None:
        try:
            if exc_type is None:
                self._control._block.copy_(torch.tensor(self._block, dtype=torch.int64))
        finally:
            self._control._lock.release()


class Progress:
    """How far one iteration in this process got: the position after its last delivered batch.

    The iteration reads ``decision.epoch`` from ``decision.start`` for one rank; in DataLoader
    worker ``worker_id`` of ``num_workers`` it delivers the rank's batches ``j = worker_id (mod
    num_workers)``, ``j >= skip`` (see :meth:`~lance_prefetch.sampling.EpochPlan.rank_batches`).

    Attributes:
        delivered (int): batches handed to the consumer so far (incremented by the iterator).
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
        self.first = worker_id + -(-max(skip - worker_id, 0) // num_workers) * num_workers
        self.delivered = 0

    @property
    def position(self) -> int:
        """Global batches of the epoch delivered before this worker's next batch."""
        if self.delivered == 0:
            return self.decision.start + self.skip * self.world_size
        last = self.first + (self.delivered - 1) * self.num_workers
        return self.decision.start + (last + 1) * self.world_size
