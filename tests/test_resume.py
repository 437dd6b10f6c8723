"""Checkpoint and resume: state_dict/load_state_dict, epochs in DataLoader workers, elastic resume.

Every expectation is an exact batch sequence: the uninterrupted run of an identical loader.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import json
import time

import pytest
import torch
from support.contracts import check_resume
from support.helpers import WORKERS, batch_ids, collect, stops_workers_mid_epoch, wait_until
from torch.utils.data import DataLoader
from torchdata.stateful_dataloader import StatefulDataLoader

from lance_prefetch import PrefetchLoader, ReadOptions, state_from_dataloader


class SlowFirstStart(PrefetchLoader):
    """Worker 1 starts its first iteration 1.5 s late (a busy machine, made certain)."""

    def __iter__(self):
        worker = torch.utils.data.get_worker_info()
        if worker is not None and worker.id == 1 and self._control._iterations == 0:
            time.sleep(1.5)
        return super().__iter__()


def take(iterable, count: int) -> list[list[int]]:
    """The ids of the next ``count`` batches (fewer if it ends)."""
    return batch_ids(itertools.islice(iterable, count))


def uninterrupted(uri, epoch: int, **kwargs) -> list[list[int]]:
    loader = PrefetchLoader(uri, 10, columns=["id"], **kwargs)
    return collect(loader, epoch=epoch)


def test_state_is_a_small_plain_dict(ids_1003):
    loader = PrefetchLoader(ids_1003, 10, columns=["id"], seed=3, rank=1, world_size=2)
    loader.set_epoch(4)
    iterator = iter(loader)
    take(iterator, 7)
    state = loader.state_dict()
    assert state == {
        "format_version": 5,
        "uri": loader.uri,
        "version": loader.version,
        "num_rows": 1003,
        "seed": 3,
        "batch_size": 10,
        "drop_last": True,
        "world_size": 2,
        "epoch": 4,
        "position": 14,  # 7 batches on each of 2 ranks
        "permutation": "array",
        "filter": None,
        "split": None,
        "datasets": None,
        "weights": None,
    }
    encoded = json.dumps(state)
    assert json.loads(encoded) == state and len(encoded) < 1024
    iterator.close()


@pytest.mark.parametrize("format_version", [1, 2, 3, 4])
def test_a_state_of_an_earlier_version_is_refused(ids_1003, format_version):
    """Formats 1 to 4 were saved with the permutations of SeedSequence([seed, epoch]), which
    this version no longer makes: refused, with the fix, rather than resumed in another order."""
    loader = PrefetchLoader(ids_1003, 10, columns=["id"], seed=3)
    fields = {1: 10, 2: 11, 3: 13, 4: 15}[format_version]  # the fields that format held
    state = dict(list(loader.state_dict().items())[:fields], format_version=format_version)
    state["epoch"], state["position"] = 2, 40
    with pytest.raises(ValueError) as info:
        loader.load_state_dict(state)
    assert str(info.value) == (
        f"state['format_version'] is {format_version}: the state was saved by an earlier "
        f"lance-prefetch, whose permutations differ from this version's (the seed rule of "
        f"lance_prefetch.plan.sampling), so it cannot resume in the same order; start the epoch "
        f"afresh: call loader.set_epoch(2) instead of load_state_dict"
    )


def test_position_counts_batches_delivered_not_read_ahead(ids_1003, permutation_kind):
    loader = PrefetchLoader(
        ids_1003, 10, columns=["id"], readahead=8, read=ReadOptions(max_in_flight=4)
    )
    iterator = iter(loader)
    try:
        take(iterator, 5)
        # more batches read ahead: 8 with one take per batch; with coalesced takes of k batches,
        # the rest of the take being consumed plus whole takes: at least 8 - k + 1
        least = loader.readahead - loader.coalesce + 1
        assert wait_until(lambda: iterator.statistics().held >= least)
        state = loader.state_dict()
        assert state["position"] == 5
    finally:
        iterator.close()
    resumed = PrefetchLoader(ids_1003, 10, columns=["id"])
    resumed.load_state_dict(state)
    assert collect(resumed) == uninterrupted(ids_1003, 0)[5:]


def run_in_new_process(uri, state, rank, world_size, epochs):
    """Build a loader in a fresh (spawned) process, load ``state``, read ``epochs`` to the end."""
    loader = PrefetchLoader(uri, 10, columns=["id"], rank=rank, world_size=world_size)
    loader.load_state_dict(state)
    return [collect(loader, epoch=epoch) for epoch in epochs]


@pytest.mark.slow
@pytest.mark.parametrize(
    "make_loader", ["coalesced", pytest.param("disk", marks=pytest.mark.system)], indirect=True
)  # see READ_MODES
def test_two_ranks_stop_mid_epoch_and_resume_in_a_new_process(make_loader, ids_1003):
    """Acceptance 3: stop at epoch 1 batch 17 on 2 ranks, save, resume in a new process: the rest
    of epoch 1 and all of epoch 2 equal the uninterrupted run, batch for batch."""
    states, head = [], []
    for rank in range(2):
        loader = make_loader(ids_1003, 10, columns=["id"], rank=rank, world_size=2)
        collect(loader, epoch=0)
        loader.set_epoch(1)
        iterator = iter(loader)
        head.append(take(iterator, 17))
        states.append(json.loads(json.dumps(loader.state_dict())))  # as a checkpoint file would
        iterator.close()
    assert states[0] == states[1] and states[0]["position"] == 34
    context = WORKERS  # processes that never opened the dataset
    with concurrent.futures.ProcessPoolExecutor(2, mp_context=context) as pool:
        runs = [
            pool.submit(run_in_new_process, ids_1003, states[0], r, 2, (1, 2)) for r in range(2)
        ]
        resumed = [run.result() for run in runs]
    for rank in range(2):
        epoch_1 = uninterrupted(ids_1003, 1, rank=rank, world_size=2)
        epoch_2 = uninterrupted(ids_1003, 2, rank=rank, world_size=2)
        assert head[rank] == epoch_1[:17]
        assert resumed[rank] == [epoch_1[17:], epoch_2]


@pytest.mark.parametrize("midpoint", [0, 1, 37, 100, 101])
def test_the_resume_contract_holds_in_every_read_mode(make_loader, ids_1003, midpoint):
    """check_resume: stopped at the start, after one batch, mid-epoch, after the last batch and
    past the end, each read mode resumes exactly (1,003 rows, batches of 10, seed 4)."""
    check_resume(
        lambda: make_loader(ids_1003, 10, columns=["id"], seed=4), midpoint=midpoint, epoch=2
    )


def test_saves_at_the_start_and_end_and_repeated_resumes_match_no_interruption(
    make_loader, ids_1003, permutation_kind
):
    """Acceptance 4: save after batch 0 and after the epoch's last batch; resume 3 times in one
    epoch (at 30, 40 and 70 batches): the joined output equals the uninterrupted run."""
    expected = uninterrupted(ids_1003, 0) + uninterrupted(ids_1003, 1)
    joined, state = [], None
    for stop in (1, 30, 40, 70, 100):
        loader = make_loader(ids_1003, 10, columns=["id"])
        if state is not None:
            loader.load_state_dict(state)
        iterator = iter(loader)
        joined += take(iterator, stop - len(joined))
        state = loader.state_dict()
        iterator.close()
    assert state["epoch"] == 0 and state["position"] == 100  # saved after the last batch
    assert state.get("permutation", "array") == loader.permutation == permutation_kind
    loader = make_loader(ids_1003, 10, columns=["id"])
    loader.load_state_dict(state)
    joined += collect(loader)  # nothing is left of epoch 0: without set_epoch, the next epoch
    assert loader.epoch == 1
    assert joined == expected
    # The same with a loop that calls set_epoch(saved epoch), then set_epoch(next).
    loader = make_loader(ids_1003, 10, columns=["id"])
    loader.load_state_dict(state)
    assert collect(loader, epoch=0) == [] and collect(loader, epoch=1) == expected[100:]
    # A state saved before the first batch resumes the whole epoch.
    fresh = make_loader(ids_1003, 10, columns=["id"])
    fresh.set_epoch(1)
    loader = make_loader(ids_1003, 10, columns=["id"])
    loader.load_state_dict(fresh.state_dict())
    assert collect(loader) == expected[100:]


@pytest.mark.system
@stops_workers_mid_epoch
@pytest.mark.slow
@pytest.mark.parametrize("make_loader", ["coalesced"], indirect=True)  # see READ_MODES
def test_elastic_resume_from_stateful_dataloader_workers_to_three_ranks(make_loader, ids_1003):
    """Acceptance 5: save at 2 ranks x 2 workers (StatefulDataLoader), resume at 3 ranks x 1
    worker: over the epoch every id exactly once (but the documented tail)."""
    before, states = [], []
    for rank in range(2):
        loader = make_loader(ids_1003, 10, columns=["id"], rank=rank, world_size=2)
        dataloader = StatefulDataLoader(
            loader, batch_size=None, num_workers=2, multiprocessing_context=WORKERS
        )
        iterator = iter(dataloader)
        before += take(iterator, 13)
        states.append(state_from_dataloader(dataloader.state_dict()))
        del iterator, dataloader
    assert states[0] == states[1] and states[0]["position"] == 26
    after, steps = [], []
    for rank in range(3):
        loader = make_loader(ids_1003, 10, columns=["id"], rank=rank, world_size=3)
        loader.load_state_dict(states[0])
        batches = collect(loader, num_workers=1)
        steps.append(len(batches))
        after += batches
    delivered = [i for batch in before + after for i in batch]
    assert len(set(steps)) == 1  # every new rank runs the same number of steps
    assert len(delivered) == len(set(delivered))  # no row twice
    permutation = make_loader(ids_1003, 10, columns=["id"]).epoch_plan(0).permutation
    # 1003 - 260 = 743 rows remain: 24 rounds of 30; the permutation's last 23 rows are dropped
    assert steps == [24] * 3
    assert sorted(delivered) == sorted(permutation[:980].tolist())


@stops_workers_mid_epoch
@pytest.mark.slow
@pytest.mark.parametrize(
    "make_loader", [pytest.param("coalesced", marks=pytest.mark.system), "per-take"], indirect=True
)  # see READ_MODES
def test_stateful_dataloader_resumes_its_workers_in_place(make_loader, ids_1003):
    """StatefulDataLoader's own save/load with the same num_workers continues batch for batch."""
    expected = uninterrupted(ids_1003, 0)
    loader = make_loader(ids_1003, 10, columns=["id"])
    dataloader = StatefulDataLoader(
        loader, batch_size=None, num_workers=2, multiprocessing_context=WORKERS
    )
    iterator = iter(dataloader)
    head = take(iterator, 23)
    saved = dataloader.state_dict()
    del iterator, dataloader
    assert state_from_dataloader(saved)["position"] == 23
    restored = StatefulDataLoader(
        make_loader(ids_1003, 10, columns=["id"]),
        batch_size=None,
        num_workers=2,
        multiprocessing_context=WORKERS,
    )
    restored.load_state_dict(saved)
    assert head + batch_ids(restored) == expected


@pytest.mark.system
@pytest.mark.slow
def test_set_epoch_reaches_persistent_workers(ids_1003):
    """Acceptance 2: 3 persistent workers, 3 epochs with set_epoch: the orders differ per epoch and
    equal the num_workers=0 run; then, without set_epoch, the epochs keep advancing."""
    loader = PrefetchLoader(ids_1003, 10, columns=["id"], seed=5)
    dataloader = DataLoader(
        loader,
        batch_size=None,
        num_workers=3,
        multiprocessing_context=WORKERS,
        persistent_workers=True,
    )
    orders = []
    for epoch in range(3):
        loader.set_epoch(epoch)
        orders.append(batch_ids(dataloader))
    assert orders == [uninterrupted(ids_1003, epoch, seed=5) for epoch in range(3)]
    assert orders[0] != orders[1] != orders[2] != orders[0]
    assert batch_ids(dataloader) == uninterrupted(ids_1003, 3, seed=5)
    assert loader.epoch == 3  # the workers' choice is visible in the main process


@pytest.mark.system
@pytest.mark.slow
def test_without_set_epoch_each_dataloader_iteration_reads_the_next_epoch(ids_1003):
    loader = PrefetchLoader(ids_1003, 10, columns=["id"], seed=5)
    dataloader = DataLoader(loader, batch_size=None, num_workers=2, multiprocessing_context=WORKERS)
    assert [batch_ids(dataloader) for _ in range(2)] == [
        uninterrupted(ids_1003, epoch, seed=5) for epoch in range(2)
    ]
    assert loader.epoch == 1
    # The main process cannot count what workers deliver: state_dict says so rather than guess.
    with pytest.raises(RuntimeError, match="StatefulDataLoader"):
        loader.state_dict()
    loader.set_epoch(2)
    assert loader.state_dict()["epoch"] == 2 and loader.state_dict()["position"] == 0


def test_mismatched_states_are_refused_with_the_mismatch_named(ids_1003, fresh_ids):
    """Acceptance 6: a state from another dataset or seed names what differs."""
    state = PrefetchLoader(ids_1003, 10, columns=["id"]).state_dict()
    other_uri = fresh_ids(1003)
    other = PrefetchLoader(other_uri, 10, columns=["id"])
    with pytest.raises(ValueError) as info:
        other.load_state_dict(state)
    assert str(info.value).startswith(
        f"state does not match this loader: uri is {state['uri']!r} in the state but "
        f"{other.uri!r} in this loader. Build the loader"
    )
    reseeded = PrefetchLoader(ids_1003, 10, columns=["id"], seed=1)
    with pytest.raises(ValueError, match=r"seed is 0 in the state but 1 in this loader"):
        reseeded.load_state_dict(state)
    with pytest.raises(
        ValueError, match=r"batch_size is 10 in the state but 20 in this loader; drop_last"
    ):
        PrefetchLoader(ids_1003, 20, columns=["id"], drop_last=False).load_state_dict(state)


def test_another_version_needs_the_explicit_opt_in(ids_1003, fresh_ids):
    import lance

    uri = fresh_ids(40)
    loader = PrefetchLoader(uri, 10, columns=["id"])
    state = loader.state_dict()
    dataset = lance.dataset(uri)
    dataset.tags.create("same-rows", dataset.version)
    lance.write_dataset(dataset.to_table().slice(0, 0), uri, mode="append")  # a new, equal version
    newer = PrefetchLoader(uri, 10, columns=["id"])
    assert newer.version == loader.version + 1
    with pytest.raises(
        ValueError,
        match=r"version is \d+ in the state but \d+ in this loader.*"
        r"allow_version_change=True",
    ):
        newer.load_state_dict(state)
    newer.load_state_dict(state, allow_version_change=True)
    assert collect(newer) == collect(loader)


@pytest.mark.parametrize(
    ("change", "error", "message"),
    [
        (lambda s: s.pop("position"), ValueError, "state is missing position; pass a dict"),
        (
            lambda s: s.update(format_version=2),
            ValueError,
            "state['format_version'] is 2: the state was saved by an earlier lance-prefetch",
        ),
        (
            lambda s: s.update(format_version=6),
            ValueError,
            "state['format_version'] is 6, but this version of lance-prefetch reads format 5",
        ),
        (
            lambda s: s.pop("weights"),
            ValueError,
            "state['format_version'] is 5, but state['weights'] is missing",
        ),
        (lambda s: s.update(epoch=-1), ValueError, "state['epoch'] should be >= 0, but got -1"),
        (
            lambda s: s.update(position=1.5),
            TypeError,
            "state['position'] should be int, but got 1.5",
        ),
        (
            lambda s: s.update(position=101),
            ValueError,
            "state['position']=101 is past the end of any epoch of 1003 rows in batches of 10 with drop_last=True (at most 100 global batches)",
        ),
        (lambda s: s.update(epoch=2**62 + 1), ValueError, "state['epoch'] should be <= 2**62"),
        (lambda s: s.update(world_size=0), ValueError, "state['world_size'] should be >= 1"),
    ],
)
def test_malformed_states_are_refused(ids_1003, change, error, message):
    loader = PrefetchLoader(ids_1003, 10, columns=["id"])
    state = loader.state_dict()
    change(state)
    with pytest.raises(error) as info:
        loader.load_state_dict(state)
    assert str(info.value).startswith(message)
    with pytest.raises(TypeError, match=r"^state should be a dict returned by"):
        loader.load_state_dict([("epoch", 1)])


def test_a_worker_share_is_refused_outside_its_worker(ids_1003):
    loader = PrefetchLoader(ids_1003, 10, columns=["id"])
    state = loader.state_dict() | {"worker": {"id": 1, "num_workers": 2, "start": 0}}
    with pytest.raises(
        ValueError,
        match=r"^state holds only the share of DataLoader worker 1 of "
        r"2, but it is loaded outside DataLoader workers; merge",
    ):
        loader.load_state_dict(state)
    with pytest.raises(ValueError, match=r"^dataloader_state holds no PrefetchLoader"):
        state_from_dataloader({"_snapshot": {"_worker_snapshots": {}}})


def test_load_state_dict_while_an_iterator_is_live_raises(ids_1003, permutation_kind):
    loader = PrefetchLoader(ids_1003, 10, columns=["id"])
    iterator = iter(loader)
    head = take(iterator, 3)
    state = loader.state_dict()
    with pytest.raises(RuntimeError, match=r"^load_state_dict\(\) was called while an iterator"):
        loader.load_state_dict(state)
    assert take(iterator, 1) == uninterrupted(ids_1003, 0)[3:4]  # the live one is unaffected
    loader.close()
    loader.load_state_dict(state)  # applies to the next iterator
    assert head + collect(loader) == uninterrupted(ids_1003, 0)


@pytest.mark.slow
def test_detected_ranks_follow_the_process_and_workers_read_their_parents(ids_1003, monkeypatch):
    """The process group wins over RANK/WORLD_SIZE; detected ranks are detected again where the
    loader is used (here the environment changes after construction: the new ranks are read);
    DataLoader workers read the ranks their parent had when it started them, never their own
    environment; given ranks always win."""
    import torch.distributed as dist

    from lance_prefetch.loader._ranks import Ranks

    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "3")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        from_group = PrefetchLoader(ids_1003, 10, columns=["id"])
        assert (from_group.rank, from_group.world_size) == (0, 1)
    finally:
        dist.destroy_process_group()
    assert (from_group.rank, from_group.world_size) == (1, 3)  # no group any more: RANK
    loader = PrefetchLoader(ids_1003, 10, columns=["id"])
    given = PrefetchLoader(ids_1003, 10, columns=["id"], rank=0, world_size=1)
    monkeypatch.setenv("RANK", "2")
    assert (loader.rank, loader.world_size, given.rank, given.world_size) == (2, 3, 0, 1)
    assert collect(loader, num_workers=2, epoch=0) == uninterrupted(
        ids_1003, 0, rank=2, world_size=3
    )
    ranks = Ranks(None, None)
    monkeypatch.setenv("RANK", "0")
    assert ranks.current(in_worker=True) == (2, 3)  # a worker: the parent's, as pickled
    assert ranks.current(in_worker=False) == (0, 3)


def test_stateful_dataloader_without_workers(make_loader, ids_1003, permutation_kind):
    """num_workers=0: StatefulDataLoader saves the loader's own state and restores it in place."""
    expected = uninterrupted(ids_1003, 0, seed=2)
    loader = make_loader(ids_1003, 10, columns=["id"], seed=2)
    dataloader = StatefulDataLoader(loader, batch_size=None)
    iterator = iter(dataloader)
    head = take(iterator, 13)
    saved = dataloader.state_dict()
    assert state_from_dataloader(saved) == loader.state_dict()
    assert loader.state_dict()["position"] == 13
    del iterator
    restored = StatefulDataLoader(
        make_loader(ids_1003, 10, columns=["id"], seed=2), batch_size=None
    )
    restored.load_state_dict(saved)
    assert head + batch_ids(restored) == expected


@pytest.mark.system
@pytest.mark.slow
def test_a_late_persistent_worker_joins_its_own_iteration(ids_1003):
    """Peek one batch (a common idiom), then epochs 0 and 1 with persistent workers, one of which
    starts its first iteration after the other began the next one: each epoch is exact."""
    loader = SlowFirstStart(ids_1003, 10, columns=["id"])
    dataloader = DataLoader(
        loader,
        batch_size=None,
        num_workers=2,
        multiprocessing_context=WORKERS,
        persistent_workers=True,
    )
    next(iter(dataloader))
    for epoch in range(2):
        loader.set_epoch(epoch)
        assert batch_ids(dataloader) == uninterrupted(ids_1003, epoch), epoch


@pytest.mark.system
@pytest.mark.slow
def test_new_dataloaders_with_the_same_seeded_generator_never_share_an_iteration(ids_1003):
    loader = PrefetchLoader(ids_1003, 10, columns=["id"])
    for epoch, num_workers in ((0, 2), (1, 3)):
        dataloader = DataLoader(
            loader,
            batch_size=None,
            num_workers=num_workers,
            multiprocessing_context=WORKERS,
            generator=torch.Generator().manual_seed(0),
        )
        loader.set_epoch(epoch)
        assert batch_ids(dataloader) == uninterrupted(ids_1003, epoch), epoch


@pytest.mark.parametrize("after_stop", [False, True])
def test_stateful_dataloader_restores_an_epochs_end(ids_1003, after_stop):
    """StatefulDataLoader's own path, num_workers=0, saved after the epoch's last batch: before
    its StopIteration the loop goes on with the saved epoch (empty), after it with the next."""
    dataloader = StatefulDataLoader(PrefetchLoader(ids_1003, 10, columns=["id"]), batch_size=None)
    iterator = iter(dataloader)
    take(iterator, 100)
    if after_stop:
        assert take(iterator, 1) == []
    saved = dataloader.state_dict()
    del iterator
    loader = PrefetchLoader(ids_1003, 10, columns=["id"])
    restored = StatefulDataLoader(loader, batch_size=None)
    restored.load_state_dict(saved)
    first = 1 if after_stop else 0
    reads = []
    for epoch in range(first, 3):
        loader.set_epoch(epoch)
        reads.append(batch_ids(restored))
    assert reads == ([] if after_stop else [[]]) + [uninterrupted(ids_1003, e) for e in (1, 2)]


def test_an_elastic_epochs_end_with_padding_loads(make_loader, ids_1003, permutation_kind):
    """drop_last=False, 2 ranks stop at 34, 3 ranks finish the epoch (at 34 + 23 * 3 = 103, past
    the 101 batches the rows fill): it is saved as the end (101), which loads on any number of
    ranks: the next iteration reads the next epoch (nothing is left of the saved one)."""
    before = make_loader(ids_1003, 10, columns=["id"], rank=0, world_size=2, drop_last=False)
    iterator = iter(before)
    take(iterator, 17)
    state = before.state_dict()
    iterator.close()
    for rank in range(3):
        loader = make_loader(ids_1003, 10, columns=["id"], rank=rank, world_size=3, drop_last=False)
        loader.load_state_dict(state)
        assert len(collect(loader)) == 23
    end = loader.state_dict()
    assert end["position"] == 101 and end["world_size"] == 3
    assert loader.epoch_plan().permutation_kind == permutation_kind
    loader.load_state_dict(end)
    assert collect(loader) == uninterrupted(ids_1003, 1, rank=2, world_size=3, drop_last=False)
    single = make_loader(ids_1003, 10, columns=["id"], drop_last=False)  # 1 rank
    single.load_state_dict(end)
    assert single.state_dict() == end | {"world_size": 1}
    single.load_state_dict(single.state_dict())  # a state it saved itself always loads
    assert collect(single) == uninterrupted(ids_1003, 1, drop_last=False)


def test_relative_and_absolute_paths_name_the_same_dataset(ids_1003, monkeypatch):
    import os

    state = PrefetchLoader(ids_1003, 10, columns=["id"]).state_dict()
    monkeypatch.chdir(os.path.dirname(ids_1003))
    relative = PrefetchLoader(os.path.basename(ids_1003), 10, columns=["id"])
    relative.load_state_dict(state)
    assert relative.state_dict()["position"] == 0 and relative.epoch == 0


class BigTransform:
    """A transform carrying 200 KB, so each worker's pickle outgrows the pipe buffer: the first
    worker starts iterating while the main process still pickles the next."""

    def __init__(self):
        self.table = bytes(200_000)

    def __call__(self, batch):
        return batch


@pytest.mark.system
@pytest.mark.slow
def test_workers_with_large_pickles_share_one_iteration(ids_1003):
    loader = PrefetchLoader(ids_1003, 10, columns=["id"], transform=BigTransform())
    dataloader = DataLoader(loader, batch_size=None, num_workers=3, multiprocessing_context=WORKERS)
    loader.set_epoch(3)
    assert batch_ids(dataloader) == uninterrupted(ids_1003, 3)
    assert batch_ids(dataloader) == uninterrupted(ids_1003, 4)  # no set_epoch: the next one
