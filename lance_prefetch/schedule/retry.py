"""Retries: which read errors are worth another attempt, and how long to wait between attempts.

:class:`RetryPolicy` is a small, picklable description (it travels into DataLoader workers with the
loader); :func:`run_with_retries` runs its attempts on the prefetcher's event loop through a
``tenacity.AsyncRetrying`` (``retry_on`` itself runs in a worker thread). Waiting between attempts
happens on the event loop, so a batch that backs off holds no thread and other reads carry on
meanwhile.

Lance retries each HTTP request to an object store itself (storage options
``client_max_retries``, default 3, and ``client_retry_timeout``); these retries wrap a whole
``take`` and come on top, for what is still failing after Lance gave up: an object store that keeps
answering 503 "slow down" for a while, a connection that drops, a request that hangs (see
``timeout``).
"""

from __future__ import annotations

import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import anyio
import tenacity

from lance_prefetch._validate import check_seconds

__all__ = ["RetryPolicy", "is_transient", "run_with_retries"]

T = TypeVar("T")

# OSError messages (Lance reports every storage failure as OSError) that no retry will fix: the
# object is gone (a data file deleted by a cleanup of old versions) or the store refuses access.
_PERMANENT_MARKERS = (
    "not found",
    "notfound",
    "no such file",
    "forbidden",
    "accessdenied",
    "access denied",
    "signaturedoesnotmatch",
    "invalidaccesskeyid",
    "permission denied",
)


# HTTP 403 and 404 as whole numbers: object names (hex) often hold the digits, and Lance's messages
# hold durations ("in 403.5ms" for a 503 that took 403 ms), so a number touching a "." is not one.
_PERMANENT_STATUS = re.compile(r"(?<![\w.])40[34](?![\w.])")


def is_transient(error: BaseException) -> bool:
    """The default rule: is ``error``, raised by a ``take``, worth another attempt?

    Transient (``True``): ``TimeoutError`` (also a per-take ``timeout``), ``ConnectionError``, and
    any other ``OSError`` (Lance's ``LanceError(IO)``: HTTP 5xx, "503 Slow Down", a dropped
    connection, a local I/O error), unless its message says the object is missing or access is
    denied.

    Permanent (``False``): everything else: ``FileNotFoundError``, ``PermissionError``,
    ``IsADirectoryError``, ``NotADirectoryError``, an ``OSError`` whose message holds "Not found",
    "404", "403", "Forbidden", "AccessDenied", "SignatureDoesNotMatch", "InvalidAccessKeyId" or
    "Permission denied", and every error that is not an ``OSError`` (bad offsets are an
    ``IndexError``, Lance's schema errors a ``ValueError``, a short read a
    :class:`~lance_prefetch.sources._lance.ShortReadError`).
    """
    if isinstance(error, (TimeoutError, ConnectionError)):
        return True
    if not isinstance(error, OSError) or getattr(error, "permanent", False):
        return False
    if isinstance(
        error, (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)
    ):
        return False
    text = str(error).lower()
    if _PERMANENT_STATUS.search(text):
        return False
    return not any(marker in text for marker in _PERMANENT_MARKERS)


@dataclass(frozen=True)
class RetryPolicy:
    """How a failed or stuck ``take`` is retried: bounded exponential backoff with full jitter.

    Attempt ``n`` (``n >= 2``) starts after a wait drawn uniformly from
    ``[0, min(max_backoff, backoff * 2 ** (n - 2))]`` seconds ("full jitter", so that many readers
    hit by one outage do not retry in step); the default waits are at most 0.1 s, then 0.2 s.
    A batch is given up after ``attempts`` attempts, or at once for an error that ``retry_on``
    calls permanent; the last error then reaches the training loop as
    :class:`~lance_prefetch.BatchLoadError`, with the number of attempts in its message.

    Args:
        attempts (int): attempts per batch, the first included, ``>= 1`` (``1``: no retry).
            Default: ``3``.
        backoff (float): the cap of the first wait, in seconds, ``>= 0``. Default: ``0.1``.
        max_backoff (float): the largest cap of any wait, in seconds, ``>= backoff``.
            Default: ``5.0``.
        timeout (float, optional): seconds one ``take`` may run before it counts as a failed
            attempt (a ``TimeoutError``, transient, so retried). The stuck call cannot be
            interrupted: it is abandoned, finishes in its thread in the background, and its rows
            are used only if they arrive before the retry's. Conversion and ``transform`` are not
            timed. Default: ``None``, no limit (Lance's storage option ``timeout`` still bounds
            each HTTP request).
        retry_on (Callable[[BaseException], bool]): whether an error is transient; called in a
            worker thread (not on the event loop), so a slow one delays only its own batch.
            Must pickle (a module-level function) to reach DataLoader workers. Default:
            :func:`is_transient`.

    Raises:
        TypeError, ValueError: a field has the wrong type or is out of range (the message names
            it).

    Example::

        # a store that throttles: up to 6 attempts, waits up to 1, 2, 4, 8, 10 s, 30 s per take
        RetryPolicy(attempts=6, backoff=1.0, max_backoff=10.0, timeout=30.0)
    """

    attempts: int = 3
    backoff: float = 0.1
    max_backoff: float = 5.0
    timeout: float | None = None
    retry_on: Callable[[BaseException], bool] = field(default=is_transient)

    def __post_init__(self) -> None:
        if isinstance(self.attempts, bool) or not isinstance(self.attempts, int):
            raise TypeError(f"attempts should be an int, but got attempts={self.attempts!r}")
        if self.attempts < 1:
            raise ValueError(
                f"attempts should be >= 1 (1 means no retry), but got attempts={self.attempts}"
            )
        check_seconds("backoff", self.backoff)
        check_seconds("max_backoff", self.max_backoff)
        if self.max_backoff < self.backoff:
            raise ValueError(
                f"max_backoff should be >= backoff, but got max_backoff={self.max_backoff} < "
                f"backoff={self.backoff}"
            )
        if self.timeout is not None:
            check_seconds("timeout", self.timeout)
            if self.timeout == 0:
                raise ValueError("timeout should be > 0 seconds, or None for no limit")
        if not callable(self.retry_on):
            raise TypeError(f"retry_on should be callable, but got retry_on={self.retry_on!r}")

    def retrying(
        self, judge: Callable[[BaseException], bool] | None = None
    ) -> tenacity.AsyncRetrying:
        """A fresh ``tenacity.AsyncRetrying`` for one batch (waits with ``anyio.sleep``; the last
        error is re-raised as it is). ``timeout`` is applied by the caller.

        Args:
            judge (Callable[[BaseException], bool], optional): decides instead of
                :meth:`is_retryable`, for a caller that judged the error already (the prefetcher
                runs ``retry_on`` in a worker thread, off its event loop). Default: ``None``.
        """
        return tenacity.AsyncRetrying(sleep=anyio.sleep, **self._strategy(judge))

    def is_retryable(self, error: BaseException) -> bool:
        """Whether ``error`` is worth another attempt: an ``Exception`` (a cancellation or
        ``KeyboardInterrupt`` never is) that ``retry_on`` calls transient."""
        return isinstance(error, Exception) and bool(self.retry_on(error))

    def call(self, function: Callable[..., T], *args: Any) -> T:
        """``function(*args)`` in this thread, retried by this policy (waits with ``time.sleep``;
        the last error is re-raised as it is). There is no ``timeout`` here: a blocking call cannot
        be abandoned from its own thread.

        Raises:
            ValueError: this policy has a ``timeout``.
        """
        if self.timeout is not None:
            raise ValueError(
                f"timeout={self.timeout:g} needs the reads to run in background threads, which "
                f"this reader does not use; use RetryPolicy(timeout=None) and bound each request "
                f"with the storage option 'timeout' instead"
            )
        return tenacity.Retrying(sleep=time.sleep, **self._strategy())(function, *args)

    def _strategy(self, judge: Callable[[BaseException], bool] | None = None) -> dict[str, Any]:
        return {
            "stop": tenacity.stop_after_attempt(self.attempts),
            "wait": tenacity.wait_random_exponential(multiplier=self.backoff, max=self.max_backoff),
            "retry": tenacity.retry_if_exception(judge or self.is_retryable),
            "reraise": True,
        }


async def run_with_retries(
    policy: RetryPolicy | None,
    error: Exception,
    attempt: Callable[[], Awaitable[Exception | None]],
    judge: Callable[[Exception], Awaitable[bool]],
    *,
    done: Callable[[], bool] = lambda: False,
) -> tuple[Exception | None, int]:
    """Attempt again by ``policy`` after a first attempt failed with ``error``, on the event loop.

    ``attempt()`` makes one more attempt and returns its error, or ``None`` once it succeeded;
    ``judge(error)`` says whether an error is worth another (the caller decides where
    ``retry_on`` runs); ``done()`` true before an attempt stops the retries (the result arrived
    by other means). Waits between attempts run on the loop (``anyio.sleep``), holding no thread.

    Returns:
        ``(None, attempts)`` once an attempt succeeded or ``done()``, else ``(the last error,
        attempts)``: the error was not transient, or the attempts ran out. ``attempts`` counts
        the first one. An error raised by ``judge`` itself is then the last error.
    """
    if policy is None or policy.attempts <= 1:
        return error, 1
    attempts, retryable = 1, False
    failed: Exception | None = error

    def judged(_: BaseException) -> bool:
        return retryable

    try:
        async for trial in policy.retrying(judged):
            with trial:
                attempts = trial.retry_state.attempt_number
                if attempts > 1:
                    if done():
                        return None, attempts
                    failed = await attempt()
                if failed is not None:
                    retryable = False  # stays False if judge raises: its error is the last
                    retryable = await judge(failed)
                    raise failed
        return None, attempts
    except Exception as exc:  # not retryable, or the attempts ran out
        return exc, attempts
