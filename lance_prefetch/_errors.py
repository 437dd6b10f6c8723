"""The errors that reach the training loop from ``next()``: a batch that failed
(:class:`BatchLoadError`) and an epoch that failed its coverage audit (:class:`CoverageError`);
and Lance's error text as messages quote it (:func:`lance_message`)."""

from __future__ import annotations

import functools
import re
from typing import Any

__all__ = ["BatchLoadError", "CoverageError", "lance_message"]


def lance_message(text: str) -> str:
    """Lance's error ``text`` without the Rust source locations it appends (``, /home/.../
    scanner.rs:3786:32``), its whitespace runs as single spaces."""
    return re.sub(r"\s+", " ", re.sub(r",?\s*/\S+\.rs:\d+:\d+", "", text)).strip()


class BatchLoadError(RuntimeError):
    """Reading, converting or transforming one batch failed; the original error is ``__cause__``.

    Each attribute is ``None`` when the error was re-raised by a DataLoader worker, whose message
    then holds them and the worker's traceback.

    Attributes:
        epoch (int): the epoch being read.
        position (int): the batch's global position in that epoch (see :mod:`lance_prefetch.plan.sampling`).
        num_rows (int): rows in the batch.
        uri (str): the dataset's URI (without credentials).
        attempts (int): read attempts made for the batch (see
            :class:`~lance_prefetch.RetryPolicy`); ``None`` when the read succeeded and conversion
            or ``transform`` failed.
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


class CoverageError(RuntimeError):
    """The coverage audit (``PrefetchLoader(audit=True)``) found an epoch whose rows were not
    delivered as its rule says: rows missing, repeated or unexpected, or records that disagree
    on what was read. Raised by the epoch's last ``next()`` instead of ``StopIteration``, in the
    process that ran the check; the message holds the counts, the first ids, the epoch and the
    ranks and workers involved.

    Attributes:
        report (AuditReport | None): the full verdict (``None`` when the records disagreed, or
            when the error was re-raised by a DataLoader worker, whose message holds it).
    """

    def __init__(self, message: str, *, report: Any = None) -> None:
        super().__init__(message)  # message alone: DataLoader workers re-raise it so
        self.report = report

    def __reduce__(self) -> tuple[Any, ...]:
        return functools.partial(CoverageError, report=self.report), self.args
