"""PyTorch Lightning: :class:`LoaderEpochs`, a callback that gives each epoch of ``trainer.fit``
its own permutation, resumed runs included.

Without it, a ``PrefetchLoader`` returned from ``train_dataloader`` already reads permutation
``k`` in epoch ``k`` of an uninterrupted ``fit`` (each finished iteration moves it to the next
epoch) and resumes a mid-epoch checkpoint exactly (Lightning saves and loads its
``state_dict``). What plain rules cannot give is a run resumed from an **end-of-epoch**
checkpoint: Lightning then loads no loader state (the epoch was complete), and a fresh loader
would read permutation 0 in epoch ``k``. The callback calls ``set_epoch(trainer.current_epoch)``
on every ``PrefetchLoader`` Lightning trains on, bare or inside a ``DataLoader`` or torchdata's
``StatefulDataLoader``, at the start of every training epoch; a loaded mid-epoch state of that
epoch keeps its position.

Importing this module imports ``lightning`` (``pip install lightning``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from lightning.pytorch.callbacks import Callback

__all__ = ["LoaderEpochs"]


class LoaderEpochs(Callback):
    """Set every training ``PrefetchLoader``'s epoch to ``trainer.current_epoch`` as each training
    epoch starts (``Trainer(callbacks=[LoaderEpochs()])``). Loaders are found as Lightning's
    train iterables, or their ``dataset`` (a ``DataLoader`` or ``StatefulDataLoader``); other
    iterables are left alone."""

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        for loader in _loaders(trainer.train_dataloader):
            loader.set_epoch(trainer.current_epoch)


def _loaders(iterables: Any) -> Iterator[Any]:
    """The PrefetchLoaders among Lightning's train iterables (one, or a list, tuple or dict of
    them, nested), or their datasets."""
    from ._loader import PrefetchLoader

    if isinstance(iterables, dict):
        iterables = list(iterables.values())
    if isinstance(iterables, (list, tuple)):
        for iterable in iterables:
            yield from _loaders(iterable)
        return
    for candidate in (iterables, getattr(iterables, "dataset", None)):
        if isinstance(candidate, PrefetchLoader):
            yield candidate
            return
