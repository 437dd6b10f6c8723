"""epochs: the rules that pick each iteration's epoch and start, and the shared block."""

from __future__ import annotations

import copy
import pickle

from lance_prefetch._epochs import (
    ADVANCE,
    EPOCH,
    SLOT_COUNT,
    START,
    EpochControl,
    begin,
    iteration_ident,
)
from lance_prefetch._positions import Decision, DeliveryCounter

FRESH = EpochControl()._block.tolist()


def run(block, *idents):
    """Apply ``begin`` for each iteration identity in turn; the decisions in order."""
    decisions = []
    for ident in idents:
        block, decision = begin(block, ident)
        decisions.append(decision)
    return block, decisions


def test_a_new_loader_reads_epoch_0_then_advances_every_iteration():
    _, decisions = run(FRESH, 11, 12, 13)
    assert decisions == [Decision(0, 0), Decision(1, 0), Decision(2, 0)]


def test_the_workers_of_one_iteration_share_one_decision():
    """3 workers start each of 2 DataLoader iterations: one epoch per iteration, not per worker."""
    _, decisions = run(FRESH, 7, 7, 7, 8, 8, 8)
    assert decisions == [Decision(0, 0)] * 3 + [Decision(1, 0)] * 3


def test_a_late_worker_joins_its_own_iteration_after_the_next_one_began():
    """Persistent workers: worker 1 starts iteration 7 only after worker 0 began iteration 8."""
    _, decisions = run(FRESH, 7, 8, 7, 8)
    assert decisions == [Decision(0, 0), Decision(1, 0), Decision(0, 0), Decision(1, 0)]
    # decisions are remembered for the last SLOT_COUNT iterations
    block, _ = run(FRESH, *range(100, 100 + SLOT_COUNT))
    assert begin(block, 100)[1] == Decision(0, 0)
    block, _ = run(block, 999)
    assert begin(block, 100)[1] == Decision(SLOT_COUNT + 1, 0)  # forgotten: a new iteration


def test_set_epoch_and_load_through_the_control():
    control = EpochControl()
    control.set_epoch(5)
    assert control.pending() == Decision(5, 0) and control.epoch == 5
    assert control.begin(iteration_ident()) == Decision(5, 0)
    assert control.pending() is None and control.epoch == 5
    assert control.begin(iteration_ident()) == Decision(6, 0)  # no set_epoch: moves on
    control.load(2, 34)
    control.set_epoch(2)  # the loaded epoch: its position is kept
    assert control.pending() == Decision(2, 34)
    control.set_epoch(3)  # another epoch: from its start
    assert control.begin(iteration_ident()) == Decision(3, 0)


def test_a_state_saved_at_an_epochs_end_leaves_an_empty_rest_then_moves_on():
    control = EpochControl()
    control.load(4, 100)
    assert control.begin(iteration_ident()) == Decision(4, 100)  # nothing left of epoch 4 ...
    assert control.begin(iteration_ident()) == Decision(5, 0)


def test_a_worker_resuming_its_own_share_is_recorded_for_the_next_iteration():
    block, decision = begin(FRESH, 9, forced=Decision(3, 40))
    assert decision == Decision(3, 40)
    block, decision = begin(block, 9, forced=Decision(3, 40))  # the other worker
    assert decision == Decision(3, 40)
    assert begin(block, 10)[1] == Decision(4, 0)


def test_worker_identities_differ_by_token_count_and_workers():
    assert iteration_ident(5, 1, 2) == iteration_ident(5, 1, 2) > 0
    assert len({iteration_ident(5, 1, 2), iteration_ident(6, 1, 2), iteration_ident(5, 2, 2),
                iteration_ident(5, 1, 3)}) == 4  # fmt: skip
    assert iteration_ident() != iteration_ident()


def test_plain_copies_are_independent_snapshots():
    control = EpochControl()
    control.set_epoch(3)
    for clone in (pickle.loads(pickle.dumps(control)), copy.deepcopy(control)):
        assert clone.epoch == 3
        clone.set_epoch(9)
        assert control.epoch == 3
        clone.begin(iteration_ident())  # its own lock works
    assert repr(control) == "EpochControl(epoch=3, start=-1, advance=0)"


def test_progress_counts_positions_of_delivered_batches():
    # world_size 2, no workers, resumed at 34: each delivered batch moves the position by 2
    progress = DeliveryCounter(1, Decision(1, 34), world_size=2)
    assert progress.position == 34
    progress.delivered = 3
    assert progress.position == 40
    # worker 1 of 3 (world_size 2, from 0) delivers the rank's batches 1, 4, 7, ...
    progress = DeliveryCounter(1, Decision(0, 0), world_size=2, worker_id=1, num_workers=3)
    assert progress.position == 0
    progress.delivered = 2  # its last batch is the rank's 4th: global batches 0..9 came before
    assert progress.position == 10
    # the same worker resumed with skip=5 (the rank delivered 5 batches): next is the rank's 7th
    progress = DeliveryCounter(1, Decision(0, 0), world_size=2, worker_id=1, num_workers=3, skip=5)
    assert progress.position == 10 and progress.first == 7
    progress.delivered = 1
    assert progress.position == 16


def test_field_layout():
    control = EpochControl(epoch=2)
    block = control._block.tolist()
    assert (block[EPOCH], block[START], block[ADVANCE]) == (2, -1, 0)
