"""epochs: the rules that pick each iteration's epoch and start, and the shared block."""

from __future__ import annotations

import copy
import pickle

from lance_prefetch.epochs import (
    ADVANCE,
    EPOCH,
    START,
    Decision,
    EpochControl,
    Progress,
    begin,
    iteration_ident,
)

FRESH = [0, -1, 0, 0, 0, 0, 0]


def run(block, *starts):
    """Apply ``begin`` for each ``(ident, num_workers)``; the decisions in order."""
    decisions = []
    for ident, num_workers in starts:
        block, decision = begin(block, ident, num_workers)
        decisions.append(decision)
    return block, decisions


def test_a_new_loader_reads_epoch_0_then_advances_every_iteration():
    _, decisions = run(FRESH, (11, 1), (12, 1), (13, 1))
    assert decisions == [Decision(0, 0), Decision(1, 0), Decision(2, 0)]


def test_the_workers_of_one_iteration_share_one_decision():
    """3 workers start each of 2 DataLoader iterations: one epoch per iteration, not per worker."""
    _, decisions = run(FRESH, (7, 3), (7, 3), (7, 3), (8, 3), (8, 3), (8, 3))
    assert decisions == [Decision(0, 0)] * 3 + [Decision(1, 0)] * 3


def test_a_repeated_identity_after_all_workers_joined_is_a_new_iteration():
    """E.g. a user re-seeding torch identically every epoch repeats the DataLoader's base seed."""
    _, decisions = run(FRESH, (7, 2), (7, 2), (7, 2), (7, 2))
    assert decisions == [Decision(0, 0)] * 2 + [Decision(1, 0)] * 2


def test_set_epoch_and_load_through_the_control():
    control = EpochControl()
    control.set_epoch(5)
    assert control.pending() == Decision(5, 0) and control.epoch == 5
    assert control.begin(iteration_ident(), 1) == Decision(5, 0)
    assert control.pending() is None and control.epoch == 5
    assert control.begin(iteration_ident(), 1) == Decision(6, 0)  # no set_epoch: moves on
    control.load(2, 34, finished=False)
    control.set_epoch(2)  # the loaded epoch: its position is kept
    assert control.pending() == Decision(2, 34)
    control.set_epoch(3)  # another epoch: from its start
    assert control.begin(iteration_ident(), 1) == Decision(3, 0)


def test_a_state_saved_at_an_epochs_end_moves_on_unless_its_epoch_is_set():
    control = EpochControl()
    control.load(4, 100, finished=True)
    assert control.begin(iteration_ident(), 1) == Decision(5, 0)
    control.load(4, 100, finished=True)
    control.set_epoch(4)  # the user's loop re-enters epoch 4: nothing is left of it
    assert control.begin(iteration_ident(), 1) == Decision(4, 100)


def test_a_worker_resuming_its_own_share_is_recorded_for_the_next_iteration():
    block, decision = begin(FRESH, 9, 2, forced=Decision(3, 40))
    assert decision == Decision(3, 40)
    block, decision = begin(block, 9, 2, forced=Decision(3, 40))  # the other worker
    assert decision == Decision(3, 40)
    assert begin(block, 10, 2)[1] == Decision(4, 0)


def test_worker_identities_agree_within_an_iteration_and_differ_across():
    base = 123456789
    same = {iteration_ident(base + w, w, 1) for w in range(4)}
    assert len(same) == 1 and same.pop() > 0
    assert iteration_ident(base, 0, 1) != iteration_ident(base, 0, 2)
    assert iteration_ident() != iteration_ident()


def test_plain_copies_are_independent_snapshots():
    control = EpochControl()
    control.set_epoch(3)
    for clone in (pickle.loads(pickle.dumps(control)), copy.deepcopy(control)):
        assert clone.epoch == 3
        clone.set_epoch(9)
        assert control.epoch == 3
        clone.begin(iteration_ident(), 1)  # its own lock works
    assert "'epoch': 3" in repr(control)


def test_progress_counts_positions_of_delivered_batches():
    # world_size 2, no workers, resumed at 34: each delivered batch moves the position by 2
    progress = Progress(1, Decision(1, 34), world_size=2)
    assert progress.position == 34
    progress.delivered = 3
    assert progress.position == 40
    # worker 1 of 3 (world_size 2, from 0) delivers the rank's batches 1, 4, 7, ...
    progress = Progress(1, Decision(0, 0), world_size=2, worker_id=1, num_workers=3)
    assert progress.position == 0
    progress.delivered = 2  # its last batch is the rank's 4th: global batches 0..9 came before
    assert progress.position == 10
    # the same worker resumed with skip=5 (the rank delivered 5 batches): next is the rank's 7th
    progress = Progress(1, Decision(0, 0), world_size=2, worker_id=1, num_workers=3, skip=5)
    assert progress.position == 10 and progress.first == 7
    progress.delivered = 1
    assert progress.position == 16


def test_field_layout():
    control = EpochControl(epoch=2)
    block = control._block.tolist()
    assert (block[EPOCH], block[START], block[ADVANCE]) == (2, -1, 0)
