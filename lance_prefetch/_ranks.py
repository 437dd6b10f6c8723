"""Rank and world size, resolved once where the loader is built (see ``docs/distributed.md``)."""

from __future__ import annotations

import os

import torch.distributed

from ._validate import check_int

__all__ = ["resolve_rank"]


def resolve_rank(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """``(rank, world_size)``: explicit, else the ``torch.distributed`` group, else env, else (0, 1)."""
    if (rank is None) != (world_size is None):
        raise ValueError(
            f"pass rank and world_size together (or neither, to detect them), but got "
            f"rank={rank!r}, world_size={world_size!r}"
        )
    if rank is None:
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            rank, world_size = torch.distributed.get_rank(), torch.distributed.get_world_size()
        elif "RANK" in os.environ or "WORLD_SIZE" in os.environ:
            if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
                raise ValueError(
                    "only one of the RANK and WORLD_SIZE environment variables is set; set both "
                    "(torchrun does), or pass rank= and world_size= explicitly"
                )
            rank, world_size = _env_int("RANK"), _env_int("WORLD_SIZE")
        else:
            rank, world_size = 0, 1
    rank = check_int("rank", rank, minimum=0)
    world_size = check_int("world_size", world_size, minimum=1)
    if rank >= world_size:
        raise ValueError(
            f"Invalid rank {rank}, rank should be in the interval [0, {world_size - 1}] "
            f"for world_size={world_size}"
        )
    return rank, world_size


def _env_int(name: str) -> int:
    try:
        return int(os.environ[name])
    except ValueError:
        raise ValueError(
            f"the environment variable {name}={os.environ[name]!r} is not an integer; "
            f"pass rank= and world_size= explicitly"
        ) from None
