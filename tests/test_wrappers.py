"""Accelerate's wrappers as the loader sees them, in one process: its ``IterableDatasetShard``
made a pass-through, and only Accelerate's own classes looked at on the call stack."""

from __future__ import annotations

from accelerate.data_loader import IterableDatasetShard
from support.helpers import batch_ids, expected_rank_ids

from lance_prefetch import PrefetchLoader


def test_an_iterable_dataset_shard_passes_every_batch_through(ids_1003):
    """dispatch_batches=False wraps the loader in IterableDatasetShard(batch_size=None, 2
    processes): its first len() (Accelerate's begin() asks) makes it yield the rank's batches as
    they are, not one of every two (and not fail on ``None * 2``)."""
    loader = PrefetchLoader(ids_1003, 10, columns=["id"], rank=1, world_size=2)
    shard = IterableDatasetShard(loader, batch_size=None, num_processes=2, process_index=1)
    assert len(shard) == len(loader) == 50
    assert batch_ids(shard) == expected_rank_ids(loader, epoch=0)


def test_other_objects_on_the_call_stack_are_not_asked_for_a_dataset(ids_25):
    class Foreign:
        @property
        def dataset(self):
            raise RuntimeError("not to be read")

        def run(self, loader):
            return len(loader), len(batch_ids(loader))

    assert Foreign().run(PrefetchLoader(ids_25, 5)) == (5, 5)
