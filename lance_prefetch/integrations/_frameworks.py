"""What the loader needs to know of the training frameworks that wrap it.

Accelerate prepares a ``DataLoader`` over an ``IterableDataset`` in one of two ways, and both
assume a dataset that does not shard itself:

- by default (``DataLoaderDispatcher``) the main process alone iterates the dataset and deals
  each batch it reads to one process: the loader must then read every rank's batches there, in
  global order (global batch ``g`` reaches process ``g % world_size``, the rank that would have
  read it), and count every rank's batches as its length;
- with ``dispatch_batches=False`` every process iterates the dataset through an
  ``IterableDatasetShard`` that keeps one element of every ``world_size``: the loader already
  reads its rank's share, so the shard is made a pass-through (it would otherwise drop
  ``world_size - 1`` of every ``world_size`` batches, or fail on ``batch_size=None``).

:func:`reads_every_rank` finds which of them (if any) wraps the loader, from the call stack of
the loader's ``__len__`` and ``__iter__`` (both reached from Accelerate's own calls), and acts.

Some wrappers pull batches before the training step asks for them: Accelerate's
``DataLoaderShard`` one batch (to know the last one), its ``DataLoaderDispatcher`` one round of
``num_processes`` batches, Ray Train's ``prepare_data_loader`` wrapper one batch (to move it to
the device early). A checkpoint must record what the step consumed, not what the loader handed
out, so :func:`find_read_ahead` recognises these wrappers among the callers of an iteration's
first ``next()`` and returns a :class:`ReadAhead` that tells, when a state is saved, how many of
the batches the loader delivered the wrapper still holds.

PyTorch Lightning calls ``set_epoch(epoch)`` on ``dl.sampler`` of each train iterable ``dl`` as
each training epoch starts, after a checkpoint's iterable states are loaded and before the
epoch's first batch. A bare loader is ``dl`` itself: its ``sampler``, an :class:`EpochSetter`,
passes the epoch on. A loader inside a ``DataLoader`` or ``StatefulDataLoader`` is out of
Lightning's reach (``dl.sampler`` is the DataLoader's own); :func:`warn_unset_epochs` finds
Lightning's fit loop among the callers of the loader's ``__len__`` (Lightning asks each epoch)
and warns once if no ``LoaderEpochs`` callback sets the epoch instead.

With DataLoader workers the batches are counted in the workers' own states, which a torchdata
``StatefulDataLoader`` snapshots as it hands each batch out: the batch Ray's wrapper holds is
counted there, and no state saved later can tell. :func:`workers_read_ahead_by` recognises the
wrapper among the callers when the loader is pickled for the workers (the wrapper's ``iter()``
starts them), so that their states carry a mark that refuses them (:mod:`lance_prefetch.state`).
"""

from __future__ import annotations

import math
import sys
import warnings
import weakref
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any, Literal

__all__ = [
    "AccelerateDispatcher",
    "EpochSetter",
    "ReadAhead",
    "accelerate_caller",
    "dispatcher_of",
    "find_read_ahead",
    "lightning_fit_loop",
    "pass_through",
    "pass_through_prepared",
    "reads_every_rank",
    "refuse_rebatching",
    "refuse_stateful_dispatch",
    "save_one_state",
    "warn_unset_epochs",
    "workers_read_ahead_by",
]

#: Frames looked through for a framework's caller (DataLoader and its iterator sit between).
_DEPTH = 40
#: Lightning's fit loop, in either of its packages.
_FIT_LOOPS = ("lightning.pytorch.loops.fit_loop", "pytorch_lightning.loops.fit_loop")
#: The loaders :func:`warn_unset_epochs` warned about (once each).
_warned: weakref.WeakSet[Any] = weakref.WeakSet()


def _calling(match: Callable[[Any], bool]) -> Any:
    """The first ``self`` among the callers of the current call (at most ``_DEPTH`` frames up)
    that ``match`` accepts, or ``None``."""
    return next((caller for caller, _ in _callers(2) if match(caller)), None)


def accelerate_caller(dataset: Any) -> tuple[Literal["dispatcher", "shard"], Any] | None:
    """The Accelerate wrapper of ``dataset`` among the callers of the current call, and its kind:
    ``"dispatcher"`` (a ``DataLoaderDispatcher`` whose dataset it is) or ``"shard"`` (an
    ``IterableDatasetShard`` over it). ``None`` when neither calls (or Accelerate was not
    imported)."""
    module = sys.modules.get("accelerate.data_loader")
    if module is None:
        return None
    dispatcher = getattr(module, "DataLoaderDispatcher", None)
    shard = getattr(module, "IterableDatasetShard", None)
    classes = tuple(cls for cls in (dispatcher, shard) if cls is not None)
    # Accelerate's own classes only: no other object is asked
    caller = _calling(lambda obj: isinstance(obj, classes) and obj.dataset is dataset)
    if caller is None:
        return None
    kind = "dispatcher" if dispatcher is not None and isinstance(caller, dispatcher) else "shard"
    return kind, caller  # type: ignore[return-value]


def _callers(skip: int) -> Iterator[tuple[Any, str]]:
    """``(self, function name)`` of the calling frames, nearest first, at most :data:`_DEPTH`
    of them, ``skip`` frames up from this function's caller (``self`` is ``None`` in a plain
    function)."""
    frame: FrameType | None = sys._getframe(skip)
    for _ in range(_DEPTH):
        if frame is None:
            return
        yield frame.f_locals.get("self"), frame.f_code.co_name
        frame = frame.f_back


def pass_through(shard: Any, *, stateful: bool = True) -> None:
    """Make an ``IterableDatasetShard`` yield every element of its dataset, in order: one
    process, batches of one element, no split; with ``stateful``, also pass the loader's
    ``state_dict`` and ``load_state_dict`` on, so that torchdata's StatefulDataLoader saves and
    restores the loader's state (without them it restores by reading the batches delivered
    again, and a state taken at an epoch's end then reads on into the next epoch). Not while
    the shard is being pickled (new attributes would change the dict pickle is reading)."""
    shard.num_processes, shard.process_index = 1, 0
    shard.batch_size, shard.split_batches = 1, False
    if stateful:
        shard.state_dict = shard.dataset.state_dict
        shard.load_state_dict = shard.dataset.load_state_dict


def pass_through_prepared(dataset: Any) -> None:
    """Make the ``IterableDatasetShard`` over ``dataset`` a pass-through when Accelerate's
    ``DataLoaderShard`` that holds it calls (it starts DataLoader workers, which get the shard
    pickled, before any of the shard's own calls reach the loader: a StatefulDataLoader does as
    the wrapper is built)."""
    module = sys.modules.get("accelerate.data_loader")
    shard_cls = getattr(module, "DataLoaderShard", None)
    dataset_shard_cls = getattr(module, "IterableDatasetShard", None)
    if shard_cls is None or dataset_shard_cls is None:
        return
    for caller, _ in _callers(2):
        if isinstance(caller, shard_cls):
            inner = getattr(getattr(caller, "base_dataloader", None), "dataset", None)
            if isinstance(inner, dataset_shard_cls) and inner.dataset is dataset:
                pass_through(inner, stateful=False)  # (called while the shard is pickled)
                return


def reads_every_rank(dataset: Any) -> bool:
    """Whether Accelerate's dispatcher calls over ``dataset`` (this process must then read every
    rank's batches); an ``IterableDatasetShard`` that calls is made a pass-through."""
    caller = accelerate_caller(dataset)
    if caller is not None and caller[0] == "shard":
        pass_through(caller[1], stateful=_read_in_process(caller[1]))
    return caller is not None and caller[0] == "dispatcher"


def _read_in_process(shard: Any) -> bool:
    """Whether the ``DataLoaderShard`` among the callers that holds ``shard`` reads it in this
    process (no DataLoader workers: their copies of the shard must not look stateful to
    torchdata, which would ask them for a state before their iteration begins)."""
    module = sys.modules.get("accelerate.data_loader")
    wrapper = getattr(module, "DataLoaderShard", None)
    if wrapper is None:
        return False
    holder = _calling(
        lambda obj: (
            isinstance(obj, wrapper) and getattr(obj.base_dataloader, "dataset", None) is shard
        )
    )
    return holder is not None and not holder.base_dataloader.num_workers


def refuse_rebatching(dataset: Any) -> None:
    """Refuse to be iterated by a ``DataLoader`` that batches what it iterates (a ``batch_size``
    other than ``None``: its fetcher collates ``batch_size`` of the loader's batches into one,
    batches of batches), over ``dataset`` or an ``IterableDatasetShard`` of it. Called from the
    loader's ``__iter__``, which the DataLoader's fetcher calls as it is built (at ``iter()`` of a
    DataLoader without workers, in each worker as it starts).

    Raises:
        ValueError: such a DataLoader calls; the message names ``batch_size=None`` and, for
            Hugging Face's ``Trainer`` (whose ``get_train_dataloader`` passes
            ``per_device_train_batch_size``), the override of ``get_train_dataloader``.
    """
    module = sys.modules.get("torch.utils.data._utils.fetch")
    fetcher_cls = getattr(module, "_IterableDatasetFetcher", None)
    if fetcher_cls is None:
        return
    fetcher = _calling(
        lambda obj: (
            isinstance(obj, fetcher_cls)
            and (obj.dataset is dataset or getattr(obj.dataset, "dataset", None) is dataset)
        )
    )
    if fetcher is None or not fetcher.auto_collation:
        return
    raise ValueError(
        f"a DataLoader with a batch_size (not None) iterates this PrefetchLoader, which yields "
        f"whole batches of {dataset.batch_size} rows: the DataLoader would collate them into "
        f"batches of batches. Use DataLoader(loader, batch_size=None). Hugging Face's Trainer "
        f"passes batch_size=per_device_train_batch_size: override its get_train_dataloader to "
        f"return self.accelerator.prepare(DataLoader(self.train_dataset, batch_size=None)) "
        f"(docs/recipes.md)"
    )


def refuse_stateful_dispatch(dataset: Any) -> None:
    """Refuse to start DataLoader workers for Accelerate's ``DataLoaderDispatcher`` with
    ``use_stateful_dataloader=True`` (called as the loader is pickled for a worker, in every
    process: none of them then waits for the others).

    Raises:
        RuntimeError: that dispatcher calls. Its snapshots, taken before each batch it pulls,
            hold the DataLoader workers' states of the batches already pulled for the next step
            (up to a round ahead), and a worker's state cannot be taken back: a resume would skip
            them.
    """
    caller = accelerate_caller(dataset)
    if caller is None or caller[0] != "dispatcher":
        return
    if getattr(caller[1], "use_stateful_dataloader", False):
        raise RuntimeError(
            "Accelerate's DataLoaderDispatcher with use_stateful_dataloader=True cannot "
            "checkpoint this loader exactly in DataLoader workers: its snapshots hold the "
            "workers' states of batches pulled ahead of the training step; use "
            "DataLoaderConfiguration(dispatch_batches=False, use_stateful_dataloader=True) (each "
            "process reads its own share), or num_workers=0, or save loader.state_after(steps) "
            "without use_stateful_dataloader"
        )


class ReadAhead:
    """A framework wrapper between the loader and the training step that pulls batches ahead.

    Attributes:
        name (str): the wrapper, in words, for messages.
        counted_in_workers (bool): a state a ``StatefulDataLoader`` over DataLoader workers
            snapshots between steps counts the batches this wrapper holds (Ray's wrapper); not
            for Accelerate's wrappers, whose own snapshot is taken before they pull.
    """

    name = "a wrapper"
    counted_in_workers = False

    def __init__(self, wrapper: Any) -> None:
        self.wrapper = wrapper

    def held(self, delivered: int) -> int:
        """Of the ``delivered`` batches the loader handed to the wrapper in this iteration, how
        many it holds that the training step has not consumed yet (``0 <= held <= delivered``)."""
        raise NotImplementedError

    def snapshot(self) -> bool:
        """Whether the wrapper itself is asking for the state now (Accelerate snapshots the
        state of a StatefulDataLoader when it builds the wrapper, in ``__init__``, and in
        ``_update_state_dict``, before it pulls)."""
        names = ("_update_state_dict", "__init__")
        return any(caller is self.wrapper and name in names for caller, name in _callers(2))


class _RayWrapper(ReadAhead):
    """``ray.train.torch.prepare_data_loader``'s ``_WrappedDataLoader``: each ``next()`` returns
    the batch it pulled before and pulls the next one (``next_batch``), so between steps it holds
    one batch, none once the loader is exhausted."""

    name = "Ray Train's prepare_data_loader wrapper"
    counted_in_workers = True

    def held(self, delivered: int) -> int:
        return min(delivered, 0 if self.wrapper.next_batch is None else 1)


class _AccelerateShard(ReadAhead):
    """Accelerate's ``DataLoaderShard``: it yields a batch after pulling the next one (to know the
    last), so between steps it holds one batch; none once it flagged the end. Its own snapshot
    (``_update_state_dict``) is taken before that pull: then it holds none."""

    name = "Accelerate's DataLoaderShard"

    def held(self, delivered: int) -> int:
        if self.wrapper.end_of_dataloader or self.snapshot():
            return 0
        return min(delivered, 1)


class AccelerateDispatcher(ReadAhead):
    """Accelerate's ``DataLoaderDispatcher``: the main process pulls a round (``num_processes``
    batches, one with ``split_batches``) per step and the next round before it yields, so between
    steps it holds the last round pulled (maybe short at the epoch's end); none once it flagged the
    end. Its own snapshot, taken before each pull of the next round, is kept for the step after
    the one being yielded: it then counts the whole rounds before the one being pulled."""

    name = "Accelerate's DataLoaderDispatcher"

    def __init__(self, wrapper: Any, frame: FrameType | None = None) -> None:
        super().__init__(wrapper)
        self.frame = frame  # its __iter__ generator's frame, where known

    @property
    def round_size(self) -> int:
        """Global batches per step: ``num_processes``, or 1 with ``split_batches``."""
        dispatcher = self.wrapper
        return 1 if dispatcher.split_batches else dispatcher.state.num_processes

    def held(self, delivered: int) -> int:
        dispatcher = self.wrapper
        if dispatcher.end_of_dataloader or delivered == 0:
            return 0
        size = self.round_size
        if self.snapshot():
            return delivered % size
        return delivered - size * (math.ceil(delivered / size) - 1)

    def taken(self) -> int | None:
        """Steps (rounds) its latest iteration handed to the training step, skipped ones
        (``skip_first_batches``) included: ``0`` before any iteration began (:attr:`frame` is
        ``None``); else its generator's ``batch_index`` (the round being yielded) plus one, as
        the generator waits at a ``yield`` between steps. ``None``: the generator keeps no
        ``batch_index`` (an Accelerate this module does not know)."""
        if self.frame is None:
            return 0
        index = self.frame.f_locals.get("batch_index")
        return index + 1 if isinstance(index, int) else None

    def followed(self, pending: tuple[int, int], end: int) -> tuple[int, int]:
        """``(epoch, position)`` in a process other than the main one, which reads nothing: the
        main process reads a round of global batches per step and deals it out, so after
        :meth:`taken` steps of an iteration of ``pending = (epoch, start)`` the steps consumed
        ``start + taken * round_size`` (the main process's state); ``end`` once it is over.

        Raises:
            RuntimeError: :meth:`taken` is unknown.
        """
        epoch, start = pending
        if self.wrapper.end_of_dataloader:  # the epoch is over
            return epoch, end
        taken = self.taken()
        if taken is None:
            raise RuntimeError(
                "under Accelerate's DataLoaderDispatcher only the main process reads this "
                "loader, and this process cannot tell how many steps its dispatcher took (an "
                "Accelerate version lance-prefetch does not know); save the main process's "
                "loader.state_dict() (accelerator.is_main_process) and load it on every process, "
                "save loader.state_after(steps) with the loop's own count, or use "
                "DataLoaderConfiguration(dispatch_batches=False)"
            )
        consumed = taken * self.round_size if taken else 0  # (at 0 maybe not fully built yet)
        return epoch, min(start + consumed, end)


def find_read_ahead(dataset: Any) -> ReadAhead | None:
    """The known wrapper that reads ``dataset`` ahead of the training step, among the callers of
    the current call (an iteration's first ``next()``), or ``None`` (a plain loop, a DataLoader
    without workers, Lightning's fetcher for a sized loader: none of them pulls ahead)."""
    accelerate = sys.modules.get("accelerate.data_loader")
    ray = sys.modules.get("ray.train.torch.train_loop_utils")
    kinds = [
        (getattr(ray, "_WrappedDataLoader", None), _RayWrapper),
        (getattr(accelerate, "DataLoaderShard", None), _AccelerateShard),
        (getattr(accelerate, "DataLoaderDispatcher", None), AccelerateDispatcher),
    ]
    found = [(cls, kind) for cls, kind in kinds if cls is not None]
    if not found:
        return None
    for caller, _ in _callers(2):
        for cls, kind in found:
            if isinstance(caller, cls) and _reads(caller, dataset):
                return kind(caller)
    return None


def workers_read_ahead_by(dataset: Any) -> str | None:
    """The name of the known wrapper, among the callers of the current call (the pickling of
    ``dataset`` for DataLoader workers), whose held batches the workers' states would count
    (:attr:`ReadAhead.counted_in_workers`), or ``None``."""
    ahead = find_read_ahead(dataset)
    return ahead.name if ahead is not None and ahead.counted_in_workers else None


def _reads(wrapper: Any, dataset: Any) -> bool:
    """Whether ``wrapper`` (a DataLoader-like wrapper) iterates ``dataset``: its DataLoader's
    dataset is ``dataset``, or an ``IterableDatasetShard`` over it."""
    inner = getattr(wrapper, "_dataloader", None) or getattr(wrapper, "base_dataloader", None)
    held = getattr(inner, "dataset", None)
    return held is dataset or getattr(held, "dataset", None) is dataset


def dispatcher_of(
    dataset: Any, known: AccelerateDispatcher | None = None
) -> AccelerateDispatcher | None:
    """Accelerate's ``DataLoaderDispatcher`` over ``dataset`` among the callers of the current
    call (the loader's ``__iter__`` or ``set_epoch``), as a :class:`ReadAhead` that holds the frame
    of the dispatcher's ``__iter__`` generator when that is among the callers too (it calls
    ``set_epoch`` at each iteration's start); else ``known`` if it is of the same dispatcher (a
    StatefulDataLoader's first iteration is made as the dispatcher is built, outside it), or
    ``None``."""
    caller = accelerate_caller(dataset)
    if caller is None or caller[0] != "dispatcher":
        return known
    frame: FrameType | None = sys._getframe(1)
    for _ in range(_DEPTH):
        if frame is None or (
            frame.f_locals.get("self") is caller[1] and frame.f_code.co_name == "__iter__"
        ):
            break
        frame = frame.f_back
    if frame is None and known is not None and known.wrapper is caller[1]:
        return known
    return AccelerateDispatcher(caller[1], frame)


#: The counters of torchdata's single-process StatefulDataLoader iterator state that count the
#: batches pulled in this process (the main process of Accelerate's dispatcher pulls them all,
#: the others none), and what :func:`save_one_state` writes for them on every process.
_PULL_COUNTERS = {"_sampler_iter_yielded": 0, "_num_yielded": 0, "_iterator_finished": False}


def save_one_state(dispatcher: Any, state: Callable[[], dict[str, Any]]) -> None:
    """Make Accelerate's ``DataLoaderDispatcher`` with ``use_stateful_dataloader=True`` hand
    ``accelerator.save_state`` the same state, byte for byte, in every process.

    ``save_state`` writes ``dispatcher.state_dict()`` from every process into one
    ``dl_state_dict.bin``. Under the dispatcher that is a snapshot whose counters differ from
    process to process (the main one pulls every batch, the others none) and which the other
    processes take only when the wrapper is built and at an epoch's end: files of different
    bytes written at once into one path can tear. Here ``dispatcher.state_dict()`` becomes,
    computed when it is called, Accelerate's snapshot with ``dataset_state`` set to ``state()``
    (the loader's state, the same in every process: the others follow the main one) and the
    pull counters zeroed (a resume restores the position from the loader's state alone).
    ``load_state`` is unchanged: torchdata loads the loader's state and nothing is read again.
    Does nothing without ``use_stateful_dataloader`` (there is then no state to save).
    """
    if not getattr(dispatcher, "use_stateful_dataloader", False):
        return

    def state_dict() -> dict[str, Any]:
        snapshot = dispatcher.dl_state_dict  # its keys, in this torchdata's order
        saved = {**snapshot, "dataset_state": state()}
        for key, value in _PULL_COUNTERS.items():
            if key in saved:
                saved[key] = value
        fetcher = saved.get("fetcher_state")
        if isinstance(fetcher, dict) and "fetcher_ended" in fetcher:
            saved["fetcher_state"] = {**fetcher, "fetcher_ended": False}
        return saved

    dispatcher.state_dict = state_dict


class EpochSetter:
    """What a :class:`~lance_prefetch.PrefetchLoader`'s ``sampler`` is: no sampler (it yields no
    indices and cannot be iterated), only a ``set_epoch(epoch)`` that calls the loader's
    ``set_epoch(epoch)``. It exists so that a framework that calls ``set_epoch`` on the sampler of
    the iterable it trains on (PyTorch Lightning, as each training epoch starts) reaches the
    loader when it is that iterable."""

    __slots__ = ("loader",)

    def __init__(self, loader: Any) -> None:
        #: The loader whose epoch :meth:`set_epoch` selects.
        self.loader = loader

    def set_epoch(self, epoch: int) -> None:
        """``self.loader.set_epoch(epoch)``."""
        self.loader.set_epoch(epoch)

    def __repr__(self) -> str:
        return "EpochSetter(<the loader's set_epoch>)"


def lightning_fit_loop() -> Any:
    """Lightning's fit loop among the callers of the current call, or ``None`` (also when
    Lightning was not imported: nothing is imported here)."""
    classes = tuple(
        cls
        for cls in (getattr(sys.modules.get(name), "_FitLoop", None) for name in _FIT_LOOPS)
        if cls is not None
    )
    return _calling(lambda obj: isinstance(obj, classes)) if classes else None


def warn_unset_epochs(dataset: Any) -> None:
    """Called from the loader's ``__len__``: warn once (``UserWarning``) if Lightning's fit loop
    calls, trains on ``dataset`` (shuffled) inside a wrapper (a train iterable whose ``dataset``
    it is: a ``DataLoader``, a ``StatefulDataLoader``), and has no ``LoaderEpochs`` callback.
    Lightning cannot set the loader's epoch then: a run resumed from an end-of-epoch checkpoint
    would read a fresh loader's epoch 0 again."""
    if dataset in _warned or not dataset.shuffle:
        return
    fit_loop = lightning_fit_loop()  # Lightning's attributes read with defaults: never raise here
    iterables = getattr(getattr(fit_loop, "_combined_loader", None), "flattened", None) or []
    if any(dl is dataset for dl in iterables):
        return  # trained on bare: Lightning sets the epoch through its sampler
    if not any(getattr(dl, "dataset", None) is dataset for dl in iterables):
        return  # not a train iterable (a validation loader, ...)
    module = sys.modules.get("lance_prefetch.integrations.lightning")
    callback = None if module is None else module.LoaderEpochs
    callbacks = getattr(getattr(fit_loop, "trainer", None), "callbacks", None) or []
    if callback is not None and any(isinstance(c, callback) for c in callbacks):
        return
    _warned.add(dataset)
    warnings.warn(
        "Lightning trains on a PrefetchLoader inside a DataLoader, where it cannot set the "
        "loader's epoch (nor, in a plain DataLoader, save its position): a run resumed from an "
        "end-of-epoch checkpoint would read epoch 0's permutation again, one resumed mid-epoch "
        "would start the epoch again. Add lance_prefetch.integrations.lightning.LoaderEpochs() to "
        "Trainer(callbacks=[...]), or return the loader itself from train_dataloader().",
        UserWarning,
        stacklevel=3,
    )
