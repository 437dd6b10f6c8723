"""PyTorch Lightning: :class:`LoaderEpochs`, a callback that sets the epoch of a ``PrefetchLoader``
Lightning trains on inside a ``DataLoader`` or torchdata's ``StatefulDataLoader``, and
:class:`LoaderStatsLogger`, a callback that logs the training loaders' ``stats()`` to the trainer's
loggers.

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

from collections.abc import Iterator, Sequence
from typing import Any, Literal, Protocol, runtime_checkable

from lightning.pytorch.callbacks import Callback

__all__ = ["EPOCH_METRICS", "LoaderEpochs", "LoaderStatsLogger", "STEP_METRICS"]

#: What :class:`LoaderStatsLogger` logs by default, at each logging step: the recent window's
#: figures (``LoaderStats`` keys).
STEP_METRICS = ("wait_fraction", "rows_per_s", "mib_per_s", "take_ms_p50", "batches")
#: ... and at each training epoch's end: the whole epoch's figures.
EPOCH_METRICS = (
    "wait_fraction_total",
    "rows_per_s_total",
    "mib_per_s_total",
    "take_ms_p50",
    "batches",
)


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


class LoaderStatsLogger(Callback):
    """Log each training ``PrefetchLoader``'s :meth:`~lance_prefetch.PrefetchLoader.stats` to the
    trainer's loggers (``Trainer(callbacks=[LoaderStatsLogger()])``) as ``"loader/<key>"``
    (e.g. ``loader/wait_fraction``, ``loader/rows_per_s``; with several loaders
    ``"loader/<i>/<key>"``, ``i`` their order among the train iterables).

    With ``logging_interval="step"`` the figures are logged through ``pl_module.log`` at each
    training batch's end and reach the loggers every ``Trainer(log_every_n_steps=...)`` steps,
    Lightning's own interval (by default :data:`STEP_METRICS`: the last 10 s's wait fraction in
    ``[0, 1]``, rows/s and MiB/s, the take latency p50 in ms, and the epoch's batches so far).
    With ``"epoch"`` they go to each of ``trainer.loggers`` once at each training epoch's end, at
    step ``trainer.global_step``, with the ``epoch`` (by default :data:`EPOCH_METRICS`: the whole
    epoch's figures).

    Loaders are found as :class:`LoaderEpochs` finds them: Lightning's train iterables, or their
    ``dataset``. The figures are this process's (rank 0's reach the loggers); a loader read in
    DataLoader workers has no iteration in this process, and nothing is logged for it, nor for a
    value that is ``None`` (``take_ms_p50`` before the first take returned).

    Args:
        logging_interval ("step" | "epoch", optional): when to log. Default: ``"step"``.
        metrics (Sequence[str], optional): the :meth:`~lance_prefetch.LoaderStats.to_dict` keys to
            log. Default: ``None``, :data:`STEP_METRICS` or :data:`EPOCH_METRICS`.
        prefix (str, optional): the metric names' first part. Default: ``"loader"``.

    Raises:
        TypeError, ValueError: a wrong ``logging_interval``, ``metrics`` or ``prefix``; a name in
            ``metrics`` that is no ``LoaderStats`` key (as training starts, before the first step).
    """

    def __init__(
        self,
        logging_interval: Literal["step", "epoch"] = "step",
        *,
        metrics: Sequence[str] | None = None,
        prefix: str = "loader",
    ) -> None:
        if logging_interval not in ("step", "epoch"):
            raise ValueError(
                f"logging_interval should be 'step' or 'epoch', but got "
                f"logging_interval={logging_interval!r}"
            )
        if metrics is None:
            metrics = STEP_METRICS if logging_interval == "step" else EPOCH_METRICS
        if isinstance(metrics, str) or not all(isinstance(m, str) for m in metrics):
            raise TypeError(
                f"metrics should be a sequence of LoaderStats keys, e.g. ['wait_fraction'], but "
                f"got metrics={metrics!r}"
            )
        if not metrics:
            raise ValueError("metrics should name at least one LoaderStats key, but got none")
        if not isinstance(prefix, str):
            raise TypeError(f"prefix should be a string, e.g. 'loader', but got prefix={prefix!r}")
        if not prefix:
            raise ValueError("prefix should be a non-empty string, e.g. 'loader', but got ''")
        self.logging_interval = logging_interval
        self.metrics = tuple(metrics)
        self.prefix = prefix

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        # a metric that is no key of the loaders' stats is refused before the first step
        for loader in _loaders(trainer.train_dataloader):
            if callable(getattr(loader, "stats", None)):
                self._check(loader.stats().to_dict())

    def _check(self, plain: dict[str, Any]) -> None:
        unknown = [m for m in self.metrics if m not in plain]
        if unknown:
            raise ValueError(
                f"metrics should be LoaderStats keys ({', '.join(plain)}), but got "
                f"{', '.join(map(repr, unknown))}"
            )

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self.logging_interval == "step":
            for name, value in self.figures(trainer).items():
                pl_module.log(name, value, on_step=True, on_epoch=False, rank_zero_only=True)

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        # straight to the loggers (they write on rank 0 only): an epoch-level pl_module.log
        # without sync_dist warns under DDP, and a sync would hang if ranks log different names
        if self.logging_interval == "epoch" and trainer.is_global_zero:
            figures = self.figures(trainer)
            if figures:
                metrics = {**figures, "epoch": trainer.current_epoch}
                for logger in trainer.loggers:
                    logger.log_metrics(metrics, step=trainer.global_step)

    def figures(self, trainer: Any) -> dict[str, float]:
        """The metrics to log now: name -> value, for each training loader with an iteration in
        this process."""
        loaders = list(_loaders(trainer.train_dataloader))
        found: dict[str, float] = {}
        for i, loader in enumerate(loaders):
            stats = loader.stats() if callable(getattr(loader, "stats", None)) else None
            # none read in this process (in DataLoader workers), or not yet: nothing to log
            if stats is None or stats.epoch is None:
                continue
            plain = stats.to_dict()
            self._check(plain)
            where = self.prefix if len(loaders) == 1 else f"{self.prefix}/{i}"
            for metric in self.metrics:
                value = plain[metric]
                if value is not None:  # to_dict() has no nan
                    found[f"{where}/{metric}"] = float(value)
        return found
