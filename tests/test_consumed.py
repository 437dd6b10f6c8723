"""A checkpoint records what the training step consumed: the batches handed out, less those a
framework wrapper pulled ahead of the step; between iterations, what the next one reads.

The wrappers here are the frameworks' real classes, in this one process (Ray Train's
``prepare_data_loader`` wrapper, Accelerate's ``DataLoaderShard`` and ``DataLoaderDispatcher``);
tests/test_frameworks.py runs them over 2 processes. Every expectation is the exact batch
sequence of an uninterrupted loader.
"""

from __future__ import annotations

import pytest
import torch
from support.helpers import WORKERS, batch_ids, collect
from torch.utils.data import DataLoader

from lance_prefetch import PrefetchLoader

BATCHES = 100  # 1,003 rows in batches of 10, the 3-row tail dropped


def loader_of(uri: str, **kwargs) -> PrefetchLoader:
    return PrefetchLoader(uri, 10, columns=["id"], seed=5, **kwargs)


def uninterrupted(uri: str, epoch: int) -> list[list[int]]:
    return collect(loader_of(uri), epoch=epoch)


def resumed(uri: str, state: dict) -> list[list[int]]:
    """What a new loader reads after loading ``state``: the rest of its epoch."""
    loader = loader_of(uri)
    loader.load_state_dict(state)
    return batch_ids(loader)


def steps(iterator, count: int) -> list[list[int]]:
    """The ids of the next ``count`` batches the training step gets (``next()`` calls: Ray's
    wrapper restarts its iteration at every ``iter()``, as ``islice`` would call)."""
    return batch_ids(next(iterator) for _ in range(count))


# -- between and during iterations -----------------------------------------------------------------
def test_set_epoch_during_an_iteration_leaves_the_state_on_the_live_iteration(ids_1003):
    """set_epoch(7) 3 batches into epoch 0 selects the next iteration's epoch: the state still
    says epoch 0 after 3 batches, and resuming it delivers the other 97."""
    loader = loader_of(ids_1003)
    iterator = iter(loader)
    first = steps(iterator, 3)
    loader.set_epoch(7)
    state = loader.state_dict()
    assert (state["epoch"], state["position"]) == (0, 3)
    assert first + resumed(ids_1003, state) == uninterrupted(ids_1003, 0)
    iterator.close()
    after = loader.state_dict()  # no iteration live: the selected epoch, from its start
    assert (after["epoch"], after["position"]) == (7, 0)
    assert batch_ids(loader) == uninterrupted(ids_1003, 7)


def test_after_a_break_the_state_resumes_what_the_loader_reads_next(ids_1003):
    """A loop that breaks out of epoch 0 after 3 batches reads epoch 1 next; so does a run
    resumed from the state taken after the break."""
    loader = loader_of(ids_1003)
    for count, _ in enumerate(loader, 1):
        if count == 3:
            break
    state = loader.state_dict()
    assert (state["epoch"], state["position"]) == (1, 0)
    assert resumed(ids_1003, state) == batch_ids(loader) == uninterrupted(ids_1003, 1)


def test_an_exhausted_epoch_resumes_at_the_next_one(ids_1003):
    loader = loader_of(ids_1003)
    assert len(batch_ids(loader)) == BATCHES
    state = loader.state_dict()
    assert (state["epoch"], state["position"]) == (0, BATCHES)
    assert resumed(ids_1003, state) == uninterrupted(ids_1003, 1)


# -- state_after: the loop's own count ---------------------------------------------------------------
def test_state_after_counts_this_ranks_batches_over_every_rank(ids_1003):
    """On rank 1 of 2 (50 batches an epoch), 7 consumed batches are global position 14; 50 are
    the epoch's end; more is refused naming the limit."""
    loader = loader_of(ids_1003, rank=1, world_size=2)
    loader.set_epoch(3)
    state = loader.state_after(7)
    assert (state["epoch"], state["position"], state["world_size"]) == (3, 14, 2)
    assert loader.state_after(50, epoch=4)["position"] == BATCHES
    with pytest.raises(ValueError, match=r"^batches should be at most 50, the batches of an epoch"):
        loader.state_after(51)
    with pytest.raises(ValueError, match="batches"):
        loader.state_after(-1)
    rank1 = loader_of(ids_1003, rank=1, world_size=2)
    rank1.load_state_dict(state)
    full = loader_of(ids_1003, rank=1, world_size=2)
    assert batch_ids(rank1) == collect(full, epoch=3)[7:]


def test_state_after_defaults_to_the_live_iterations_epoch(ids_1003):
    loader = loader_of(ids_1003)
    loader.set_epoch(2)
    iterator = iter(loader)
    steps(iterator, 4)
    loader.set_epoch(9)  # for the next iteration
    assert loader.state_after(4)["epoch"] == 2
    iterator.close()


# -- wrappers that pull ahead of the step ----------------------------------------------------------
def test_ray_prepare_data_loader_wrapper_holds_one_batch(ids_1003):
    """Ray Train's wrapper pulls the next batch before returning one: after 5 steps the loader
    delivered 6, the state says 5, and resuming it gives exactly the other 95; after the last
    step, the epoch's end."""
    from ray.train.torch.train_loop_utils import _WrappedDataLoader

    loader = loader_of(ids_1003)
    wrapped = _WrappedDataLoader(DataLoader(loader, batch_size=None), torch.device("cpu"), False)
    iterator = iter(wrapped)
    first = steps(iterator, 5)
    assert loader._counter.delivered == 6  # one read ahead by the wrapper
    state = loader.state_dict()
    assert state["position"] == 5
    assert first + resumed(ids_1003, state) == uninterrupted(ids_1003, 0)
    rest = steps(iterator, BATCHES - 5)
    assert first + rest == uninterrupted(ids_1003, 0)
    assert loader.state_dict()["position"] == BATCHES


@pytest.fixture
def accelerator():
    """One Accelerate process (its state is a process-wide singleton: reset after the test)."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, GradientState, PartialState
    from accelerate.utils import DataLoaderConfiguration

    def make(**options):
        return Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(**options))

    yield make
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    PartialState._reset_state()


@pytest.mark.parametrize("dispatch_batches", [False, None], ids=["shard", "dispatcher"])
def test_accelerate_wrappers_hold_what_they_read_ahead(ids_1003, accelerator, dispatch_batches):
    """Accelerate's DataLoaderShard (dispatch_batches=False) and DataLoaderDispatcher (its
    default for an iterable dataset) both pull the next batch before yielding one: the loader's
    own state after 7 steps says 7, and resumes exactly."""
    from accelerate.data_loader import DataLoaderDispatcher, DataLoaderShard

    loader = loader_of(ids_1003)
    prepared = accelerator(dispatch_batches=dispatch_batches).prepare(
        DataLoader(loader, batch_size=None)
    )
    kind = DataLoaderShard if dispatch_batches is False else DataLoaderDispatcher
    assert type(prepared) is kind
    iterator = iter(prepared)
    first = steps(iterator, 7)
    assert loader._counter.delivered == 8
    state = loader.state_dict()
    assert state["position"] == 7
    assert first + resumed(ids_1003, state) == uninterrupted(ids_1003, 0)
    assert first + steps(iterator, BATCHES - 7) == uninterrupted(ids_1003, 0)
    assert loader.state_dict()["position"] == BATCHES


@pytest.mark.parametrize("dispatch_batches", [False, None], ids=["shard", "dispatcher"])
def test_accelerate_stateful_snapshot_counts_the_steps(ids_1003, accelerator, dispatch_batches):
    """With use_stateful_dataloader=True Accelerate snapshots the StatefulDataLoader's state
    (the loader's state inside it) before each pull: the snapshot after 7 steps resumes at 7."""
    from lance_prefetch import state_from_dataloader

    loader = loader_of(ids_1003)
    options = {"dispatch_batches": dispatch_batches, "use_stateful_dataloader": True}
    prepared = accelerator(**options).prepare(DataLoader(loader, batch_size=None))
    iterator = iter(prepared)
    first = steps(iterator, 7)
    state = state_from_dataloader(prepared.state_dict())
    assert state["position"] == 7
    assert first + resumed(ids_1003, state) == uninterrupted(ids_1003, 0)
    iterator.close()


@pytest.mark.slow
def test_ray_wrapper_over_dataloader_workers_refuses_their_states(ids_1003):
    """Ray's wrapper over a StatefulDataLoader with a worker: the worker's snapshot after 5 steps
    counts the 6 batches it delivered (the wrapper holds one), so ``state_from_dataloader``
    refuses the state (naming the wrapper and the fix), and so does a StatefulDataLoader that
    loads it (its worker refuses its share); ``loader.state_after(5)`` resumes exactly; at the
    epoch's end the wrapper holds nothing and the merged state is the epoch's end."""
    from ray.train.torch.train_loop_utils import _WrappedDataLoader
    from torchdata.stateful_dataloader import StatefulDataLoader

    from lance_prefetch import state_from_dataloader

    def stateful(loader: PrefetchLoader) -> StatefulDataLoader:
        return StatefulDataLoader(
            loader, batch_size=None, num_workers=1, multiprocessing_context=WORKERS
        )

    loader = loader_of(ids_1003)
    data = stateful(loader)
    iterator = iter(_WrappedDataLoader(data, torch.device("cpu"), False))
    first = steps(iterator, 5)
    saved = data.state_dict()
    share = saved["_snapshot"]["_worker_snapshots"]["worker_0"]["dataset_state"]
    assert (share["position"], share["read_ahead"]) == (
        6,
        "Ray Train's prepare_data_loader wrapper",
    )
    refusal = r"Ray Train's prepare_data_loader wrapper .*move_to_device=False.*state_after"
    with pytest.raises(ValueError, match=refusal):
        state_from_dataloader(saved)
    assert first + resumed(ids_1003, loader.state_after(5)) == uninterrupted(ids_1003, 0)
    rest = steps(iterator, BATCHES - 5)
    assert first + rest == uninterrupted(ids_1003, 0)
    with pytest.raises(StopIteration):
        next(iterator)
    state = state_from_dataloader(data.state_dict())
    assert (state["epoch"], state["position"], "read_ahead" in state) == (0, BATCHES, False)

    again = stateful(loader_of(ids_1003))
    again.load_state_dict(saved)
    with pytest.raises(ValueError, match=refusal):
        next(iter(again))


def test_accelerate_shard_saves_the_loaders_own_state_also_at_an_epochs_end(ids_1003, accelerator):
    """With dispatch_batches=False the StatefulDataLoader holds Accelerate's IterableDatasetShard,
    which passes the loader's state on: a snapshot after the epoch's last step holds the
    loader's state at the epoch's end (torchdata would otherwise read the epoch again to restore
    it, and read on into the next one), and resuming it reads nothing more of that epoch, then
    the next epoch."""
    options = {"dispatch_batches": False, "use_stateful_dataloader": True}
    loader = loader_of(ids_1003)
    prepared = accelerator(**options).prepare(DataLoader(loader, batch_size=None))
    prepared.set_epoch(0)
    iterator = iter(prepared)
    assert len(steps(iterator, BATCHES)) == BATCHES
    saved = prepared.state_dict()
    assert saved["_iterator_finished"] is True
    assert (saved["dataset_state"]["epoch"], saved["dataset_state"]["position"]) == (0, BATCHES)
    iterator.close()
    again = loader_of(ids_1003)
    resumed_data = accelerator(**options).prepare(DataLoader(again, batch_size=None))
    resumed_data.load_state_dict(saved)
    resumed_data.set_epoch(0)
    assert batch_ids(resumed_data) == []  # the rest of epoch 0: nothing
    resumed_data.set_epoch(1)
    assert batch_ids(resumed_data) == uninterrupted(ids_1003, 1)


def test_accelerate_dispatcher_refuses_an_empty_epoch_at_iter(ids_1003, accelerator):
    """The dispatcher cannot iterate an empty epoch (it fails in its broadcast): a state saved
    after an epoch's last step, loaded, with set_epoch asking for that epoch again, is refused
    at iter() naming the epoch to start at; the loop started there reads it exactly."""
    full = loader_of(ids_1003)
    assert len(batch_ids(full)) == BATCHES
    state = full.state_dict()
    loader = loader_of(ids_1003)
    prepared = accelerator().prepare(DataLoader(loader, batch_size=None))
    loader.load_state_dict(state)
    prepared.set_epoch(0)  # the loop restarted at the epoch it stopped in
    message = (
        r"^Accelerate's DataLoaderDispatcher cannot iterate an empty epoch, and nothing is left "
        r"of epoch 0 for this iteration: .* Start the resumed loop at epoch 1 "
    )
    with pytest.raises(RuntimeError, match=message):
        next(iter(prepared))
    loader.load_state_dict(state)
    prepared.set_epoch(1)
    assert batch_ids(prepared) == uninterrupted(ids_1003, 1)
