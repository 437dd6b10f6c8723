"""PyTorch Lightning: :class:`LoaderEpochs`, a callback that sets the epoch of a ``PrefetchLoader``
Lightning trains on inside a ``DataLoader`` or torchdata's ``StatefulDataLoader``.

A ``PrefetchLoader`` returned from ``train_dataloader`` as it is needs no callback: Lightning
calls ``set_epoch(epoch)`` on the ``sampler`` of each train iterable as each training epoch
starts (after loading a checkpoint's state, before the first batch), and the loader's
``sampler`` passes it on. Epoch ``k`` then reads permutation ``k``, also in a run resumed from an
end-of-epoch checkpoint (where Lightning loads no loader state), and a run resumed mid-epoch
goes on from the loaded state's position.

Inside a ``DataLoader`` the loader is out of Lightning's reach (``sampler`` is the DataLoader's
own). A fresh loader would then read permutation 0 in the first epoch of a run resumed from an
end-of-epoch checkpoint, and the loader warns (``UserWarning``, once) when Lightning trains on it
there without this callback. The callback calls ``set_epoch(trainer.current_epoch)`` on every
``PrefetchLoader`` among Lightning's train iterables, bare or the ``dataset`` of one, as the fit
starts and as each training epoch starts; a loaded mid-epoch state of that epoch keeps its
position.

Importing this module imports ``lightning`` (``pip install lightning``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from lightning.pytorch.callbacks import Callback

__all__ = ["LoaderEpochs"]


class LoaderEpochs(Callback):
    """Set every training ``PrefetchLoader``'s epoch to ``trainer.current_epoch`` as the fit
    starts (Lightning calls no ``on_train_epoch_start`` for an epoch it resumes mid-way) and as
    each training epoch starts (``Trainer(callbacks=[LoaderEpochs()])``). Loaders are found as
    Lightning's train iterables, or their ``dataset`` (a ``DataLoader`` or
    ``StatefulDataLoader``); other iterables are left alone. Needed only for a wrapped loader."""

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self._set_epochs(trainer)

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        self._set_epochs(trainer)

    def _set_epochs(self, trainer: Any) -> None:
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
