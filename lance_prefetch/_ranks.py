"""Rank and world size, resolved once where the loader is built (see ``docs/distributed.md``)."""

from __future__ import annotations

import os

import torch.distributed

from ._validate import check_rank

__all__ = ["resolve_rank"]


def resolve_rank(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """``(rank, world_size)``: as given (both or neither, checked by the config), else from an
    initialized ``torch.distributed`` group, else from the ``RANK``/``WORLD_SIZE`` environment
    variables, else ``(0, 1)``.

    Raises:
        ValueError: only one of the environment variables is set, one is not an integer, or the
            rank they give is outside ``[0, world_size)``.
    """
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
    return check_rank(rank, world_size)


def _env_int(name: str) -> int:
    try:
        return int(os.environ[name])
    except ValueError:
        raise ValueError(
            f"the environment variable {name}={os.environ[name]!r} is not an integer; "
            f"pass rank= and world_size= explicitly"
        ) from None
