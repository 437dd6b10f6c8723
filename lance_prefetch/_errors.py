"""The error a batch's failure reaches the training loop as (re-exported by :mod:`~lance_prefetch._loader`)."""

from __future__ import annotations

import functools
from typing import Any

__all__ = ["BatchLoadError"]


class BatchLoadError(RuntimeError):
    """Reading, converting or transforming one batch failed; the original error is ``__cause__``.

    Attributes:
        epoch (int): the epoch being read.
        position (int): the batch's global position in that epoch (see :mod:`lance_prefetch.sampling`).
        num_rows (int): rows in the batch.
        uri (str): the dataset's URI (without credentials).
        attempts (int): read attempts made for the batch (see
            :class:`~lance_prefetch.RetryPolicy`); ``None`` when the read succeeded and conversion
            or ``transform`` failed.
        (Each is ``None`` when the error was re-raised by a DataLoader worker, whose message then
        holds them and the worker's traceback.)
    """

    def __init__(
        self,
        message: str,
        *,
        epoch: int | None = None,
        position: int | None = None,
        num_rows: int | None = None,
        uri: str | None = None,
        attempts: int | None = None,
    ) -> None:
        # The keywords are optional so that DataLoader workers can re-raise it from its message
        # alone (torch's ExceptionWrapper calls ``type(exc)(message)``).
        super().__init__(message)
        self.epoch, self.position, self.num_rows, self.uri = epoch, position, num_rows, uri
        self.attempts = attempts

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            functools.partial(
                BatchLoadError,
                epoch=self.epoch,
                position=self.position,
                num_rows=self.num_rows,
                uri=self.uri,
                attempts=self.attempts,
            ),
            self.args,
        )
