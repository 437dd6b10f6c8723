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
"""

from __future__ import annotations

import sys
from typing import Any, Literal

__all__ = ["accelerate_caller", "pass_through", "reads_every_rank"]

#: Frames looked through for Accelerate's wrapper (DataLoader and its iterator sit between).
_DEPTH = 40


def accelerate_caller(dataset: Any) -> tuple[Literal["dispatcher", "shard"], Any] | None:
    """The Accelerate wrapper of ``dataset`` among the callers of the current call, and its kind:
    ``"dispatcher"`` (a ``DataLoaderDispatcher`` whose dataset it is) or ``"shard"`` (an
    ``IterableDatasetShard`` over it). ``None`` when neither calls (or Accelerate was not
    imported)."""
    module = sys.modules.get("accelerate.data_loader")
    if module is None:
        return None
    kinds = (("dispatcher", getattr(module, "DataLoaderDispatcher", None)),
             ("shard", getattr(module, "IterableDatasetShard", None)))  # fmt: skip
    frame = sys._getframe(1)
    for _ in range(_DEPTH):
        if frame is None:
            return None
        caller = frame.f_locals.get("self")
        for kind, cls in kinds:  # Accelerate's own classes only: no other object is asked
            if cls is not None and isinstance(caller, cls) and caller.dataset is dataset:
                return kind, caller  # type: ignore[return-value]
        frame = frame.f_back
    return None


def pass_through(shard: Any) -> None:
    """Make an ``IterableDatasetShard`` yield every element of its dataset, in order: one
    process, batches of one element, no split."""
    shard.num_processes, shard.process_index = 1, 0
    shard.batch_size, shard.split_batches = 1, False


def reads_every_rank(dataset: Any) -> bool:
    """Whether Accelerate's dispatcher calls over ``dataset`` (this process must then read every
    rank's batches); an ``IterableDatasetShard`` that calls is made a pass-through."""
    caller = accelerate_caller(dataset)
    if caller is not None and caller[0] == "shard":
        pass_through(caller[1])
    return caller is not None and caller[0] == "dispatcher"
