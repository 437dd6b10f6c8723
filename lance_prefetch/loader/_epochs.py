"""Epochs across processes: which epoch, from which position, each iteration of a loader reads.

A :class:`~lance_prefetch.PrefetchLoader` is copied into every DataLoader worker process, and a
persistent worker keeps its copy for the whole run, so the main process and the copies must agree
on the epoch without talking to each other. They share one small :class:`EpochControl`: a block of
integers in shared memory (a torch tensor, which torch's multiprocessing pickler hands to spawned
workers as shared memory) and an inter-process lock.

The rules
---------
1. ``set_epoch(e)`` (in any process, normally the main one) selects epoch ``e`` for the next
   iteration, read from its start; or from the position a state loaded for epoch ``e`` points to.
2. ``load_state_dict`` selects the state's epoch and position for the next iteration. A state
   saved after its epoch's last batch has nothing left of that epoch: the next iteration reads
   the epoch after it, from its start (as a framework resuming from an end-of-epoch checkpoint
   expects), unless ``set_epoch`` asked for the state's epoch since the last iteration began,
   before or after the load (then that iteration is empty: the loop asked for the finished
   epoch).
3. Otherwise a new iteration reads the epoch after the previous iteration's, from its start, so
   epochs never silently repeat.

An *iteration* is one ``iter()`` in one process, or one DataLoader ``iter()`` across all its ``K``
workers. The workers of one DataLoader iteration must share one decision, even if one of them
starts late (after another already began the next iteration, as persistent workers can). So each
decision is recorded under the iteration's identity in a small table, and a worker that finds its
identity there joins that decision. The identity is ``(token, count, K)``. ``token``: the main
process numbers each pickling of the loader for a new process (``1, 2, 3, ...``), and a DataLoader
starts its workers in order ``0 .. K-1``, so worker ``w`` holding copy number ``n`` computes
``n - w``: the same for all workers of one DataLoader start, different for the next, however the
starts interleave with the workers' first steps. ``count`` numbers the iterations a copy has run
(persistent workers run several). In the main process every iteration is new. :func:`begin`
holds the rules as a pure function; :class:`EpochControl` applies it to the shared block under
the lock and numbers its own picklings and iterations (:meth:`EpochControl.identify`).
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.context
import os
import secrets
from collections.abc import Sequence
from typing import Any

import torch
from torch.utils.data import get_worker_info

from lance_prefetch.plan._positions import Decision

__all__ = ["EpochControl", "LOCK_TIMEOUT_S", "MAX_EPOCH", "begin", "iteration_ident"]

#: How long an iteration start waits for the shared lock, in seconds, before failing loudly.
LOCK_TIMEOUT_S = 10.0
#: The largest epoch ``set_epoch`` accepts (the shared block holds signed 64-bit integers).
MAX_EPOCH = 2**62

# The shared block's fields. Invariant: EPOCH is the epoch of the running or most recent iteration
# when ADVANCE == 1, and the epoch the next iteration reads when ADVANCE == 0.
EPOCH = 0  # epoch selected or last decided
START = 1  # pending start position from load_state_dict, or -1 for none
ADVANCE = 2  # 1: an iteration began since the last set_epoch/load, so the next one moves on
LOADED = 3  # 1: START came from load_state_dict, and set_epoch did not ask for that epoch
ASKED = 4  # 1: set_epoch was called since the last iteration began
NEXT_SLOT = 5  # where the next decision is recorded
SLOTS = 6  # then SLOT_COUNT decisions of (ident, epoch, start), a ring
SLOT_COUNT = 32
_NUM_FIELDS = SLOTS + 3 * SLOT_COUNT
_IDENT_MASK = (1 << 62) - 1


def begin(
    block: Sequence[int], ident: int, forced: Decision | None = None, *, end: int | None = None
) -> tuple[list[int], Decision]:
    """Apply the module's rules: the shared block after an iteration starts, and what it reads.

    Args:
        block: the current shared fields (see the field constants).
        ident (int): the iteration's identity, ``> 0``; equal for all workers of one iteration.
        forced (Decision, optional): a worker resuming from its own saved state reads this instead
            (it is recorded so later iterations move on from it).
        end (int, optional): the position that ends an epoch
            (:func:`~lance_prefetch.plan._positions.end_position`), for rule 2. Default: ``None``, a
            loaded start is read as it is.

    Returns:
        ``(new_block, decision)``.
    """
    new = list(block)
    for slot in range(SLOTS, _NUM_FIELDS, 3):
        if new[slot] == ident:  # another process of this iteration decided already: join it
            return new, forced or Decision(new[slot + 1], new[slot + 2])
    if forced is not None:
        decision = forced
    elif new[ADVANCE]:
        decision = Decision(new[EPOCH] + 1, 0)
    elif new[LOADED] and end is not None and new[START] >= end:  # a finished epoch was loaded
        decision = Decision(new[EPOCH] + 1, 0)
    else:
        decision = Decision(new[EPOCH], max(new[START], 0))
    new[EPOCH], new[START], new[ADVANCE], new[LOADED], new[ASKED] = decision.epoch, -1, 1, 0, 0
    slot = SLOTS + 3 * new[NEXT_SLOT]
    new[slot : slot + 3] = [ident, *decision]
    new[NEXT_SLOT] = (new[NEXT_SLOT] + 1) % SLOT_COUNT
    return new, decision


def iteration_ident(token: int | None = None, count: int = 0, num_workers: int = 1) -> int:
    """An iteration's identity, ``> 0``.

    In a DataLoader worker, pass the token (see the module docstring; without a pickling number,
    the DataLoader's base seed ``get_worker_info().seed - id``), the number of iterations the copy
    has started, and ``num_workers``: every worker of one DataLoader iteration gets the same value. In the main
    process (``token=None``) a random value.
    """
    if token is None:
        return secrets.randbits(62) | 1
    return (hash((token, count, num_workers)) & _IDENT_MASK) | 1


class EpochControl:
    """The epoch state a loader shares with its copies in DataLoader worker processes.

    Pickled while a process is being spawned (a DataLoader starting its workers), the copy shares
    this one's memory and lock, and gets the next pickling number (the token of
    :meth:`identify`); pickled any other way (``copy.deepcopy``, ``pickle.dumps``) it is an
    independent snapshot. A shared copy used in a spawned process that is not a DataLoader worker
    (a rank started by ``torch.multiprocessing.spawn``, as Lightning's ``ddp_spawn`` does) detaches
    there into a snapshot of its own: ranks never share one epoch state.

    Args:
        epoch (int, optional): the first epoch. Default: ``0``.
    """

    def __init__(self, epoch: int = 0) -> None:
        block = [0] * _NUM_FIELDS
        block[EPOCH], block[START] = epoch, -1
        self._block = torch.tensor(block, dtype=torch.int64)
        self._block.share_memory_()
        self._lock = multiprocessing.get_context("spawn").Lock()
        self._spawned = 0  # times pickled for a new process; in a copy, its own number
        self._iterations = 0  # iterations this copy has started
        self._home = os.getpid()  # the process whose block this is (workers share it)

    # -- commands --------------------------------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        """Rule 1: the next iteration reads ``epoch``; a pending start loaded for it is kept."""
        with self._locked() as block:
            if not (block[START] >= 0 and block[EPOCH] == epoch):
                block[START] = -1
            block[EPOCH], block[ADVANCE], block[LOADED], block[ASKED] = epoch, 0, 0, 1

    def load(self, epoch: int, position: int) -> None:
        """Rule 2: the next iteration reads ``epoch`` from ``position`` (or, once that epoch is
        over, the next epoch)."""
        with self._locked() as block:
            asked = block[ASKED] and block[EPOCH] == epoch and block[ADVANCE] == 0
            block[EPOCH], block[START], block[ADVANCE] = epoch, position, 0
            block[LOADED] = 0 if asked else 1

    def identify(self, worker: Any) -> int:
        """Count a new iteration of this copy and return its identity: in DataLoader worker
        ``worker`` (``torch.utils.data.get_worker_info()``; ``None`` in the main process), the
        same for every worker of one DataLoader iteration (see the module docstring)."""
        self._iterations += 1
        if worker is None:
            return iteration_ident()
        # equal for the workers of one DataLoader start (they are pickled in worker order)
        token = (self._spawned or worker.seed) - worker.id
        return iteration_ident(token, self._iterations, worker.num_workers)

    def begin(
        self, ident: int, forced: Decision | None = None, *, end: int | None = None
    ) -> Decision:
        """Start an iteration: decide (or join the decision of) what it reads. See :func:`begin`."""
        with self._locked() as block:
            new, decision = begin(block, ident, forced, end=end)
            block[:] = new
        return decision

    # -- queries ---------------------------------------------------------------------------------
    @property
    def epoch(self) -> int:
        """The running or most recent iteration's epoch, or the next one's once selected."""
        self._attach()
        return int(self._block[EPOCH])

    def pending(self) -> Decision | None:
        """What the next iteration reads if it was selected (set_epoch, load_state_dict, or a new
        loader) rather than left to rule 3; else ``None``. A loaded finished epoch is reported as
        it was loaded (its end)."""
        self._attach()
        epoch, start, advance = self._block[:3].tolist()
        if advance == 0:
            return Decision(epoch, max(start, 0))
        return None

    def upcoming(self, end: int) -> Decision:
        """What the next iteration would read if it began now (:func:`begin`), deciding nothing."""
        self._attach()
        return begin(self._block.tolist(), -1, end=end)[1]  # -1: no iteration's identity

    def decided_by(self, ident: int) -> bool:
        """Whether the latest decision is the one of the iteration identified by ``ident``."""
        self._attach()
        block = self._block.tolist()
        latest = SLOTS + 3 * ((block[NEXT_SLOT] - 1) % SLOT_COUNT)
        return block[latest] == ident

    # -- internals -------------------------------------------------------------------------------
    def _locked(self) -> _Locked:
        self._attach()
        return _Locked(self)

    def _attach(self) -> None:
        """Detach a shared copy in a process that is not one of its owner's DataLoader workers."""
        if os.getpid() != self._home and get_worker_info() is None:
            self._block = self._block.clone()
            self._block.share_memory_()
            self._lock = multiprocessing.get_context("spawn").Lock()
            self._home = os.getpid()

    def __getstate__(self) -> dict[str, Any]:
        if multiprocessing.context.get_spawning_popen() is not None:
            self._spawned += 1  # shared with the new process, which gets the next number
            return {
                "block": self._block,
                "lock": self._lock,
                "spawned": self._spawned,
                "iterations": 0,
                "home": self._home,
            }
        return {
            "block": self._block.clone(),
            "lock": None,
            "spawned": self._spawned,
            "iterations": self._iterations,
            "home": None,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._block = state["block"]
        self._spawned, self._iterations = state["spawned"], state["iterations"]
        if state["lock"] is None:
            self._block.share_memory_()
            self._lock = multiprocessing.get_context("spawn").Lock()
            self._home = os.getpid()
        else:
            self._lock, self._home = state["lock"], state["home"]

    def __repr__(self) -> str:
        epoch, start, advance = self._block[:3].tolist()
        return f"EpochControl(epoch={epoch}, start={start}, advance={advance})"


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
