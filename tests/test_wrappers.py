"""The frameworks' wrappers as the loader sees them, in one process: Accelerate's
``IterableDatasetShard`` made a pass-through, and only Accelerate's own classes looked at on the
call stack; Lightning's epoch call reaching a bare loader, and a wrapped loader warning that
Lightning cannot reach it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from accelerate.data_loader import IterableDatasetShard
from lightning.fabric.utilities.data import _set_sampler_epoch
from lightning.pytorch.loops.fit_loop import _FitLoop
from lightning.pytorch.utilities.data import _is_dataloader_shuffled
from support.helpers import batch_ids, expected_rank_ids
from torch.utils.data import DataLoader

from lance_prefetch import PrefetchLoader
from lance_prefetch.integrations._frameworks import EpochSetter
from lance_prefetch.integrations.lightning import LoaderEpochs


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


def test_lightnings_epoch_call_reaches_a_bare_loader_through_its_sampler(ids_1003):
    """Lightning's ``_set_sampler_epoch(dl, epoch)`` (each training epoch's start) reaches a bare
    loader through ``loader.sampler``; after a loaded state of that epoch, the state's position
    is kept. ``batch_sampler`` is ``None`` (Lightning's shuffle check reads it next to
    ``sampler``: no error, not shuffled). A DataLoader over the loader keeps torch's own sampler:
    the call does not reach the loader."""
    loader = PrefetchLoader(ids_1003, 10, columns=["id"], rank=0, world_size=1)
    assert isinstance(loader.sampler, EpochSetter) and loader.batch_sampler is None
    _set_sampler_epoch(loader, 3)
    assert loader.epoch == 3
    assert batch_ids(loader) == expected_rank_ids(loader, epoch=3)
    state = {**loader.state_dict(), "epoch": 5, "position": 40}
    loader.load_state_dict(state)
    _set_sampler_epoch(loader, 5)
    assert batch_ids(loader) == expected_rank_ids(loader, epoch=5)[40:]
    assert not _is_dataloader_shuffled(loader)
    wrapped = PrefetchLoader(ids_1003, 10, columns=["id"], rank=0, world_size=1)
    _set_sampler_epoch(DataLoader(wrapped, batch_size=None), 4)
    assert wrapped.epoch == 0


class _Fit(_FitLoop):
    """Lightning's fit loop as the loader's ``__len__`` finds it on the call stack: its train
    iterables and its trainer's callbacks, nothing run."""

    def __init__(self, iterables, callbacks=()):  # no Trainer: only what the loader reads
        self._combined_loader = SimpleNamespace(flattened=list(iterables))  # a CombinedLoader's
        self.trainer = SimpleNamespace(callbacks=list(callbacks))

    def length(self, iterable):
        return len(iterable)


def test_a_wrapped_loader_that_lightning_trains_on_without_loader_epochs_warns_once(ids_25):
    """A ``DataLoader`` over the loader among Lightning's train iterables, no ``LoaderEpochs``:
    its first ``len()`` from the fit loop warns, naming the callback; later ones do not. No
    warning with ``LoaderEpochs``, for the bare loader, for a loader Lightning does not train on
    (validation) or one with ``shuffle=False``, nor outside the fit loop."""
    loader = PrefetchLoader(ids_25, 5)
    wrapped = DataLoader(loader, batch_size=None)
    assert len(wrapped) == 5  # outside Lightning's fit loop: no warning
    fit = _Fit([wrapped])
    with pytest.warns(UserWarning, match=r"LoaderEpochs\(\) to Trainer\(callbacks") as caught:
        assert fit.length(wrapped) == 5
    assert len(caught) == 1
    assert fit.length(wrapped) == 5  # once: `-W error` would raise here otherwise
    other = PrefetchLoader(ids_25, 5)
    sequential = PrefetchLoader(ids_25, 5, shuffle=False)
    wrapped_other = DataLoader(other, batch_size=None)
    wrapped_sequential = DataLoader(sequential, batch_size=None)
    assert _Fit([wrapped_other], [LoaderEpochs()]).length(wrapped_other) == 5
    assert _Fit([other]).length(other) == 5
    assert _Fit([wrapped]).length(DataLoader(other, batch_size=None)) == 5  # not trained on
    assert _Fit([wrapped_sequential]).length(wrapped_sequential) == 5
