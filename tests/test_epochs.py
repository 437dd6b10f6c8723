"""epochs: the rules that pick each iteration's epoch and start, and the shared block."""

from __future__ import annotations

import copy
import pickle

from lance_prefetch.loader._epochs import (
    ADVANCE,
    EPOCH,
    SLOT_COUNT,
    START,
    EpochControl,
    begin,
    iteration_ident,
)
from lance_prefetch.plan._positions import Decision, DeliveryCounter

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


def test_a_state_saved_at_an_epochs_end_moves_on_unless_set_epoch_asks_for_it():
    """Loaded at its end (position 100 of 100), epoch 4 has nothing left: the next iteration
    reads epoch 5; after set_epoch(4) (a loop asking for the finished epoch) it is the empty rest
    of epoch 4. Without the end (end=None), a loaded start is read as it is."""
    control = EpochControl()
    control.load(4, 100)
    assert control.pending() == Decision(4, 100)
    assert control.begin(iteration_ident(), end=100) == Decision(5, 0)
    control.load(4, 100)
    control.set_epoch(4)
    assert control.begin(iteration_ident(), end=100) == Decision(4, 100)
    assert control.begin(iteration_ident(), end=100) == Decision(5, 0)
    control.set_epoch(4)  # asked for before the load (a StatefulDataLoader loads at iter())
    control.load(4, 100)
    assert control.begin(iteration_ident(), end=100) == Decision(4, 100)
    control.set_epoch(3)  # another epoch asked for: the load decides
    control.load(4, 100)
    assert control.begin(iteration_ident(), end=100) == Decision(5, 0)
    control.load(4, 99)  # one batch left
    assert control.begin(iteration_ident(), end=100) == Decision(4, 99)
    control.load(4, 100)
    assert control.begin(iteration_ident()) == Decision(4, 100)


def test_a_worker_resuming_its_own_share_is_recorded_for_the_next_iteration():
    block, decision = begin(FRESH, 9, forced=Decision(3, 40))
    assert decision == Decision(3, 40)
    block, decision = begin(block, 9, forced=Decision(3, 40))  # the other worker
    assert decision == Decision(3, 40)
    assert begin(block, 10)[1] == Decision(4, 0)


def test_worker_identities_differ_by_token_count_and_workers():
    assert iteration_ident(5, 1, 2) == iteration_ident(5, 1, 2) > 0
    assert (
        len(
            {
                iteration_ident(5, 1, 2),
                iteration_ident(6, 1, 2),
                iteration_ident(5, 2, 2),
                iteration_ident(5, 1, 3),
            }
        )
        == 4
    )
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


def _read_two_epochs(loader, results):
    """In a process that is not a DataLoader worker: two iterations' ids."""
    results.put([[b["id"].tolist() for b in loader] for _ in range(2)])


def test_an_iterator_never_advanced_uses_up_no_epoch(ids_1003):
    """A framework's check that the loader is iterable, a len() and a thrown-away iterator read
    nothing and decide nothing (no loop thread starts): the first epoch read is epoch 0. A
    set_epoch between iter() and the first next() applies to that iteration."""
    from support.helpers import batch_ids, expected_rank_ids, loop_threads

    from lance_prefetch import PrefetchLoader

    loader = PrefetchLoader(ids_1003, 10, columns=["id"], seed=1)
    probe = iter(loader)
    assert len(loader) == 100 and not loop_threads() and loader.state_dict()["epoch"] == 0
    del probe
    iter(loader)
    assert batch_ids(loader) == expected_rank_ids(loader, epoch=0)
    assert batch_ids(loader) == expected_rank_ids(loader, epoch=1)
    iterator = iter(loader)
    loader.set_epoch(5)  # Lightning's on_train_epoch_start comes after its iter()
    assert batch_ids(iterator) == expected_rank_ids(loader, epoch=5)
    assert batch_ids(loader) == expected_rank_ids(loader, epoch=6)


def test_ranks_spawned_with_the_loader_keep_epochs_of_their_own(ids_1003):
    """Two processes (not DataLoader workers) started with the loader pickled in, as
    torch.multiprocessing.spawn starts Lightning's ddp_spawn ranks: each reads epochs 0 then 1
    (a shared epoch state would have dealt the epochs out between them)."""
    from support.helpers import WORKERS, batch_ids, expected_rank_ids

    from lance_prefetch import PrefetchLoader

    loader = PrefetchLoader(ids_1003, 10, columns=["id"], seed=2)
    results = WORKERS.Queue()
    processes = [WORKERS.Process(target=_read_two_epochs, args=(loader, results)) for _ in range(2)]
    for process in processes:
        process.start()
    reads = [results.get(timeout=120) for _ in processes]
    for process in processes:
        process.join(30)
    expected = [expected_rank_ids(loader, epoch=e) for e in (0, 1)]
    assert reads == [expected, expected]
    assert loader.epoch == 0 and batch_ids(loader) == expected[0]  # this process: untouched
