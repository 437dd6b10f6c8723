"""mapstyle: LanceMapDataset with PyTorch's samplers, its collate, and workers."""

from __future__ import annotations

import pickle

import lance
import numpy as np
import pyarrow as pa
import pytest
import torch
from conftest import write_ids
from support.helpers import WORKERS, stopping
from support.sources import tapped
from torch.utils.data import BatchSampler, DataLoader, DistributedSampler, RandomSampler

from lance_prefetch import Dataset, LanceMapDataset, PrefetchLoader, collate
from lance_prefetch.loader._mapstyle import ColumnBatch


@pytest.fixture(scope="module")
def six_rows(tmp_path_factory) -> str:
    """6 rows in 3 fragments of 2."""
    return write_ids(tmp_path_factory.mktemp("six") / "six.lance", 6, rows_per_file=2)


def test_rows_and_batches_in_index_order(six_rows):
    """Acceptance 1: no None, ids in index order, one take across 3 fragments keeps the order."""
    dataset = LanceMapDataset(six_rows)
    assert len(dataset) == 6 and len(lance.dataset(six_rows).get_fragments()) == 3
    row = dataset[4]
    assert set(row) == {"id", "vector", "label"} and None not in row.values()
    assert row["id"].shape == () and row["id"].item() == 4 and row["id"].dtype == torch.int64
    assert torch.equal(row["vector"], torch.tensor([4.0, 8.0, 12.0]))
    assert dataset[-1]["id"].item() == 5
    batch = dataset.__getitems__([5, 0, 3])
    assert isinstance(batch, ColumnBatch) and len(batch) == 3
    assert batch.data["id"].tolist() == [5, 0, 3]
    assert batch.data["vector"].shape == (3, 3) and None not in batch.data.values()
    assert dataset.__getitems__([1, 1, -6]).data["id"].tolist() == [1, 1, 0]  # repeats, negative


def test_one_take_per_batch(six_rows):
    with tapped() as tap:
        dataset = LanceMapDataset(six_rows, columns=["id"])
    data = DataLoader(dataset, batch_size=2, collate_fn=collate)
    assert [b["id"].tolist() for b in data] == [[0, 1], [2, 3], [4, 5]]
    assert tap.takes == [[0, 1], [2, 3], [4, 5]]


@pytest.mark.parametrize(
    ("index", "error", "message"),
    [
        (6, IndexError, "index 6 is out of range for a dataset of 6 rows (valid: -6 .. 5)"),
        (-7, IndexError, "index -7 is out of range for a dataset of 6 rows (valid: -6 .. 5)"),
        (1.0, TypeError, "index should be an integer, but got 1.0"),
        (True, TypeError, "index should be an integer, but got True"),
    ],
)
def test_bad_indices(six_rows, index, error, message):
    dataset = LanceMapDataset(six_rows)
    with pytest.raises(error) as info:
        dataset[index]
    assert str(info.value) == message
    with pytest.raises(IndexError, match=r"^index 9 is out of range"):
        dataset.__getitems__([0, 9, 1])
    with pytest.raises(TypeError, match=r"^indices should be integers, but got 0.5"):
        dataset.__getitems__([0.5])


def test_collate_gives_the_prefetch_loader_batch(ids_1003):
    """Acceptance 3: same keys, dtypes, shapes and values as PrefetchLoader for the same indices."""
    loader = PrefetchLoader(ids_1003, 10, seed=3)
    indices = loader.epoch_plan(0).batch(7).indices
    expected = next(b for i, b in enumerate(loader) if i == 7)
    dataset = LanceMapDataset(ids_1003)
    batch = collate(dataset.__getitems__(indices.tolist()))
    assert batch.keys() == expected.keys()
    for name in expected:
        assert batch[name].dtype == expected[name].dtype
        assert torch.equal(batch[name], expected[name])
    # the default collate re-stacks the rows into the same values (with a copy)
    restacked = torch.utils.data.default_collate(dataset.__getitems__(indices.tolist()))
    assert all(torch.equal(restacked[name], expected[name]) for name in expected)


def test_standard_samplers(ids_1003):
    dataset = LanceMapDataset(ids_1003, columns=["id"])
    generator = torch.Generator().manual_seed(4)
    order = list(RandomSampler(dataset, generator=torch.Generator().manual_seed(4)))
    data = DataLoader(
        dataset,
        batch_size=16,
        sampler=RandomSampler(dataset, generator=generator),
        collate_fn=collate,
    )
    assert [i for b in data for i in b["id"].tolist()] == order
    sampler = BatchSampler(range(10), batch_size=4, drop_last=False)
    data = DataLoader(dataset, batch_sampler=sampler, collate_fn=collate)
    assert [b["id"].tolist() for b in data] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    torch.manual_seed(0)
    shuffled = [
        i
        for b in DataLoader(dataset, batch_size=100, shuffle=True, collate_fn=collate)
        for i in b["id"].tolist()
    ]
    assert sorted(shuffled) == list(range(1003)) and shuffled != list(range(1003))


def run_ranks(uri, num_workers):
    """Both ranks' ids under DistributedSampler(num_replicas=2, seed=9), epoch 1."""
    streams = []
    for rank in range(2):
        dataset = LanceMapDataset(uri, columns=["id"])
        sampler = DistributedSampler(dataset, num_replicas=2, rank=rank, seed=9)
        sampler.set_epoch(1)
        data = DataLoader(
            dataset,
            batch_size=32,
            sampler=sampler,
            num_workers=num_workers,
            multiprocessing_context=WORKERS if num_workers else None,
            collate_fn=collate,
        )
        streams.append([b["id"].tolist() for b in data])
    return streams


@pytest.mark.system
@pytest.mark.slow
def test_distributed_sampler_with_spawn_workers(ids_1003):
    """Acceptance 2: the two ranks cover every id; spawn workers give the num_workers=0 result."""
    reference = run_ranks(ids_1003, 0)
    ids = [i for stream in reference for batch in stream for i in batch]
    assert sorted(set(ids)) == list(range(1003)) and len(ids) == 1004  # one padded row
    assert run_ranks(ids_1003, 2) == reference


@pytest.mark.system
@pytest.mark.slow
def test_transform_runs_in_the_worker(ids_1003):
    """transform sees the whole batch in the worker process and its result is what the loop gets."""
    dataset = LanceMapDataset(ids_1003, columns=["id", "vector"], transform=_norms)
    data = DataLoader(
        dataset, batch_size=50, num_workers=2, multiprocessing_context=WORKERS, collate_fn=collate
    )
    batches = list(data)
    assert [b["id"].tolist() for b in batches[:2]] == [list(range(50)), list(range(50, 100))]
    assert all(b["pid"] != 0 and b["pid"] != _pid() for b in batches)
    expected = torch.arange(1003, dtype=torch.float32) * np.sqrt(14)
    assert torch.allclose(torch.cat([b["norm"] for b in batches]), expected)


def _norms(batch):
    return {"id": batch["id"], "norm": batch["vector"].norm(dim=1), "pid": _pid()}


def _pid():
    import os

    return os.getpid()


def test_strings_rows_and_pickling(tmp_path):
    uri = str(tmp_path / "text.lance")
    lance.write_dataset(pa.table({"id": [0, 1, 2], "text": ["a", None, "ccc"]}), uri)
    dataset = LanceMapDataset(Dataset(uri, storage_options={"aws_secret_access_key": "hunter2"}))
    assert dataset[2]["text"] == "ccc" and dataset[1]["text"] is None
    batch = collate(dataset.__getitems__([2, 0]))
    assert batch["text"] == ["ccc", "a"] and batch["id"].tolist() == [2, 0]
    clone = pickle.loads(pickle.dumps(dataset))
    assert clone[0]["text"] == "a" and len(pickle.dumps(dataset)) < 2000
    assert "hunter2" not in repr(dataset)  # (the pickle carries it: workers need it)


def test_a_transformed_batch_needs_the_documented_collate(six_rows):
    dataset = LanceMapDataset(six_rows, transform=lambda batch: batch["id"].sum())
    batch = dataset.__getitems__([1, 2])
    assert collate(batch).item() == 3
    with pytest.raises(TypeError, match=r"collate_fn=lance_prefetch.collate"):
        torch.utils.data.default_collate(batch)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:lance is not fork-safe")
def test_forked_workers_fail_at_once_naming_spawn(ids_1003):
    import time

    dataset = LanceMapDataset(ids_1003, columns=["id"])
    dataset[0]  # the parent has read (and opened Lance) before forking
    data = DataLoader(
        dataset, batch_size=8, num_workers=1, multiprocessing_context="fork", collate_fn=collate
    )
    start = time.monotonic()
    with stopping(data) as iterator:
        with pytest.raises(RuntimeError, match=r"multiprocessing_context='spawn'"):
            list(iterator)
    assert time.monotonic() - start < 30
