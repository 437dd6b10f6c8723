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
position. Lightning saves no state for a plain ``DataLoader`` (it has no ``state_dict``), so in a
run resumed mid-epoch the callback loads, into a loader inside one, the state after the batches
Lightning counts as done in that epoch (:meth:`~lance_prefetch.PrefetchLoader.state_after`):
the resumed epoch goes on with the next batch, as with a bare loader.

Importing this module imports ``lightning`` (``pip install lightning``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol, runtime_checkable

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
        fit_loop = trainer.fit_loop
        if not fit_loop.restarted_mid_epoch:
            return
        # the batches of this epoch Lightning counts as done once its epoch loop resets: with a
        # checkpoint saved at a batch's end, the processed one too
        epoch_loop = fit_loop.epoch_loop
        progress = epoch_loop.batch_progress.current
        done = progress.processed if epoch_loop.restarted_on_train_batch_end else progress.completed
        for loader in _unsaved(trainer.train_dataloader):
            loader.load_state_dict(loader.state_after(done, epoch=trainer.current_epoch))

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        self._set_epochs(trainer)

    def _set_epochs(self, trainer: Any) -> None:
        for loader in _loaders(trainer.train_dataloader):
            loader.set_epoch(trainer.current_epoch)


def _iterables(iterables: Any) -> Iterator[Any]:
    """Lightning's train iterables, one by one: one, or a list, tuple or dict of them, nested."""
    if isinstance(iterables, dict):
        iterables = list(iterables.values())
    if isinstance(iterables, (list, tuple)):
        for iterable in iterables:
            yield from _iterables(iterable)
    else:
        yield iterables


@runtime_checkable
class _EpochLoader(Protocol):
    """What this callback uses of a ``PrefetchLoader``: its epoch and its position by batches
    consumed (matched by these methods, so that this module sits below the loader's)."""

    def set_epoch(self, epoch: int) -> None: ...

    def state_after(self, batches: int, *, epoch: int | None = None) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


def _loader_of(iterable: Any) -> Any:
    """The PrefetchLoader a train iterable is, or holds as its ``dataset``; else ``None``."""
    for candidate in (iterable, getattr(iterable, "dataset", None)):
        if isinstance(candidate, _EpochLoader):
            return candidate
    return None


def _loaders(iterables: Any) -> Iterator[Any]:
    """The PrefetchLoaders among Lightning's train iterables, or their datasets."""
    for iterable in _iterables(iterables):
        loader = _loader_of(iterable)
        if loader is not None:
            yield loader


def _unsaved(iterables: Any) -> Iterator[Any]:
    """The PrefetchLoaders among Lightning's train iterables that Lightning saves no state for:
    the ``dataset`` of an iterable without ``state_dict`` (a plain ``DataLoader``)."""
    for iterable in _iterables(iterables):
        loader = _loader_of(iterable)
        if loader is not None and loader is not iterable and not hasattr(iterable, "state_dict"):
            yield loader
