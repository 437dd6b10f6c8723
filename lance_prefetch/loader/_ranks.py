"""This process's rank and world size, for one loader (see ``docs/distributed.md``).

Given ranks (``rank=``, ``world_size=``) are kept as they are; one of them given alone is
combined with the other detected, as ``DistributedSampler`` does. Detected ones follow the process
that reads: each time the loader is used in a process (an iteration, ``len()``, a checkpoint, a
pickling for DataLoader workers) they are detected again, from an initialized ``torch.distributed``
process group, else from the ``RANK`` and ``WORLD_SIZE`` environment variables, and a change is
adopted (with an INFO log line): a loader built before the process group existed (in a Ray Train
driver, in a LightningDataModule's ``__init__`` under ``ddp_spawn``) reads the share of the rank
it is used in. DataLoader workers have no process group: they keep the ranks their parent process
had when it started them.
"""

from __future__ import annotations

import logging
import os

import torch.distributed

from lance_prefetch._validate import check_rank

__all__ = ["Ranks", "detect_ranks"]

logger = logging.getLogger("lance_prefetch")


class _HalfSet(Exception):
    """Only one of RANK and WORLD_SIZE is set (Lightning's ddp children start so)."""


def detect_ranks() -> tuple[int, int] | None:
    """``(rank, world_size)`` of an initialized ``torch.distributed`` group, else of the ``RANK``
    and ``WORLD_SIZE`` environment variables, else ``None``.

    Raises:
        _HalfSet: no group, and only one of the variables is set.
        ValueError: a variable is not an integer, or the rank is outside ``[0, world_size)``.
    """
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    has_rank, has_world = "RANK" in os.environ, "WORLD_SIZE" in os.environ
    if not (has_rank or has_world):
        return None
    if not (has_rank and has_world):
        raise _HalfSet
    rank, world_size = _env_int("RANK"), _env_int("WORLD_SIZE")
    try:
        return check_rank(rank, world_size)
    except ValueError as exc:
        raise ValueError(
            f"the environment variables RANK={os.environ['RANK']} and "
            f"WORLD_SIZE={os.environ['WORLD_SIZE']} are not a rank of a world ({exc}); fix "
            f"them, or pass rank= and world_size= explicitly"
        ) from None


class Ranks:
    """The rank and world size of one loader in this process.

    Args:
        rank (int, optional): given (checked by the config), or ``None`` to detect it.
        world_size (int, optional): likewise.

    Raises:
        ValueError: a given ``rank`` is not below the detected world size, or a given
            ``world_size`` not above the detected rank.
    """

    def __init__(self, rank: int | None, world_size: int | None) -> None:
        self._given = (rank, world_size)
        self.given = rank is not None and world_size is not None
        self._unknown = False  # only one of RANK/WORLD_SIZE was set: known at first use
        self.value: tuple[int, int]
        if rank is not None and world_size is not None:
            self.value = (rank, world_size)
            return
        try:
            self.value = self._combined(detect_ranks() or (0, 1))
        except _HalfSet:
            self.value, self._unknown = self._combined((0, 1)), True

    def _combined(self, detected: tuple[int, int]) -> tuple[int, int]:
        """The given rank or world size in place of the detected one (checked together)."""
        rank, world_size = self._given
        combined = (
            detected[0] if rank is None else rank,
            detected[1] if world_size is None else world_size,
        )
        if combined[0] >= combined[1]:
            given, detected_name = (
                ("rank", "world_size") if rank is not None else ("world_size", "rank")
            )
            raise ValueError(
                f"rank should be < world_size, but rank={combined[0]} and "
                f"world_size={combined[1]} ({given} given, {detected_name} detected from the "
                f"process group or RANK/WORLD_SIZE); pass both rank= and world_size=, or neither"
            )
        return combined

    def current(self, *, in_worker: bool, reading: bool = False) -> tuple[int, int]:
        """The ranks to read with now: given ones; in a DataLoader worker the parent's; else
        detected again here (a change is adopted and logged).

        Args:
            in_worker (bool): this is a DataLoader worker process.
            reading (bool): an iteration is reading with the current ranks in this process.

        Raises:
            ValueError: only one of ``RANK``/``WORLD_SIZE`` is set and no process group is
                initialized: this process's rank is not known (the message says where to build
                or use the loader); or a given rank or world size does not fit the detected one.
            RuntimeError: the ranks changed while ``reading``.
        """
        if self.given or in_worker:
            return self.value
        try:
            detected = detect_ranks()
        except _HalfSet:
            raise ValueError(_half_set_message()) from None
        if detected is None:
            if self._unknown:
                raise ValueError(_half_set_message())
            return self.value
        self._unknown = False
        live = self._combined(detected)
        if live != self.value and reading:
            raise RuntimeError(
                f"this process became rank {live[0]} of {live[1]} while an iteration of the "
                f"loader reads rank {self.value[0]} of {self.value[1]}; initialize the process "
                f"group before iterating, or pass rank= and world_size="
            )
        if live != self.value:
            logger.info(
                "lance_prefetch: this process is rank %d of %d (the loader was built as rank %d "
                "of %d); it reads rank %d's share",
                *live,
                *self.value,
                live[0],
            )
            self.value = live
        return self.value


def _half_set_message() -> str:
    given = {name: os.environ.get(name) for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    shown = ", ".join(f"{name}={value}" for name, value in given.items() if value is not None)
    return (
        f"this process's rank is not known: only part of the environment is set ({shown}) and no "
        f"torch.distributed process group is initialized yet (Lightning's ddp starts its "
        f"processes like this). Use the loader where the ranks exist: build it in "
        f"LightningDataModule.setup() or train_dataloader(), or in the training loop, after the "
        f"process group is initialized (torchrun sets both RANK and WORLD_SIZE); or pass rank= "
        f"and world_size="
    )


def _env_int(name: str) -> int:
    try:
        return int(os.environ[name])
    except ValueError:
        raise ValueError(
            f"the environment variable {name}={os.environ[name]!r} is not an integer; "
            f"pass rank= and world_size= explicitly"
        ) from None
