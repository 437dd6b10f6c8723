"""Where batches go once read: pinned host memory, and a device copy one batch ahead.

:func:`check_placement` checks ``pin_memory`` and ``device`` once (no I/O) and returns a
:class:`Placement`. Its :meth:`~Placement.pin` runs in the loader's read threads, after the
conversion and ``transform``; :class:`DeviceFeed` runs in the training loop's thread: when batch
``k`` is handed out, the copy of batch ``k + 1`` has already been issued (``non_blocking=True``
on a side stream of the device where its backend has streams), so the copy overlaps the step.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data._utils.pin_memory import pin_memory as _pin

__all__ = ["DeviceFeed", "Placement", "check_placement", "to_device"]

_NONE = object()  # no batch staged


def _accelerator_available() -> bool:
    accelerator = getattr(torch, "accelerator", None)  # torch >= 2.6
    if accelerator is not None:
        return bool(accelerator.is_available())
    return torch.cuda.is_available()


@dataclass(frozen=True)
class Placement:
    """``pin_memory`` and ``device`` resolved: ``pinned`` (pin in the read threads) and
    ``device`` (copy to it in the loop's thread; ``None``: batches stay where they are)."""

    pinned: bool = False
    device: torch.device | None = None

    def pin(self, batch: Any) -> Any:
        """``batch`` with its tensors in page-locked memory (as a ``DataLoader`` with
        ``pin_memory=True`` pins them), or as it is."""
        return _pin(batch) if self.pinned else batch

    @property
    def active(self) -> bool:
        """Whether anything is done to the batches."""
        return self.pinned or self.device is not None

    def check_worker(self, worker: Any) -> None:
        """Refuse pinning or a device in a DataLoader worker (``worker``: its
        ``get_worker_info()``; ``None`` in the main process).

        Raises:
            ValueError: ``pin_memory`` or ``device`` set, and ``worker`` is not ``None``.
        """
        if worker is not None and self.active:
            raise ValueError(
                "pin_memory and device apply where batches reach the training loop, not in "
                "DataLoader workers: pass DataLoader(..., pin_memory=True) and move batches in the "
                "loop, or leave num_workers=0"
            )


def check_placement(pin_memory: bool, device: str | torch.device | int | None) -> Placement:
    """Check the loader's ``pin_memory`` and ``device`` options.

    ``device="cpu"`` leaves batches as they are (they are read into host memory). Like
    ``DataLoader``, ``pin_memory=True`` without an accelerator warns and pins nothing.

    Raises:
        TypeError: ``pin_memory`` is not a bool, or ``device`` is not a str, int or
            ``torch.device``.
        ValueError: ``device`` names no device torch knows, or one whose backend is not
            available here (e.g. ``"cuda"`` on a CPU-only torch).
    """
    if not isinstance(pin_memory, bool):
        raise TypeError(f"pin_memory should be a bool, but got {type(pin_memory).__name__}")
    if isinstance(device, bool) or (
        device is not None and not isinstance(device, (str, int, torch.device))
    ):
        raise TypeError(
            f"device should be a str such as 'cuda' or 'cuda:1', an int or a torch.device, "
            f"but got {type(device).__name__}"
        )
    if isinstance(device, int) and device < 0:
        raise ValueError(
            f"device should be an accelerator index >= 0, but got device={device}; e.g. "
            f"device=0 or device='cuda:0'"
        )
    target = None
    if device is not None:
        try:
            target = torch.device(device)
        except (RuntimeError, ValueError) as exc:
            if isinstance(device, int):  # an accelerator's index
                raise ValueError(
                    f"device={device} is an accelerator index, but torch finds no accelerator "
                    f"here ({exc}); leave device out to get batches in host memory"
                ) from None
            raise ValueError(f"device={device!r} is not a device torch knows: {exc}") from None
        backend = getattr(torch, target.type, None)
        available = getattr(backend, "is_available", None)
        if target.type != "cpu" and available is not None and not available():
            raise ValueError(
                f"device={device!r}: torch.{target.type}.is_available() is False here (this "
                f"torch build or machine has no {target.type}); leave device out to get batches "
                f"in host memory"
            )
        if target.type == "cpu":
            target = None  # already there
    if pin_memory and not _accelerator_available():
        warnings.warn(
            "pin_memory=True, but no accelerator is found: batches are not pinned",
            UserWarning,
            stacklevel=5,  # the loader's caller
        )
        pin_memory = False
    return Placement(pinned=pin_memory, device=target)


def to_device(batch: Any, device: torch.device) -> Any:
    """``batch`` with every tensor (in dicts, lists and tuples, at any depth) copied to
    ``device`` with ``non_blocking=True``; anything else as it is."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, Mapping):
        moved = {key: to_device(value, device) for key, value in batch.items()}
        try:
            return type(batch)(moved)  # type: ignore[call-arg]
        except TypeError:  # a mapping that cannot be built from a dict (as torch's pin_memory)
            return moved
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a namedtuple
        return type(batch)(*(to_device(value, device) for value in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(value, device) for value in batch)
    return batch


class DeviceFeed:
    """Batches copied to ``device`` one ahead of the training loop.

    ``take()`` is the next host batch (raising ``StopIteration`` at the end, or the error of a
    batch). Each :meth:`next` makes the current stream wait for the copy of the batch it returns
    (issued at the previous call, on the side stream), then issues the copy of the next batch on
    the side stream, then returns: the copy of batch ``k + 1`` overlaps step ``k``. On a device
    whose backend has no streams (``"meta"``) the copies are made in order, in this thread. An
    error from ``take()`` or from the copy of the next batch is raised at the call after, once
    the batch before it is handed out; an interrupt (``KeyboardInterrupt``) is raised at once,
    and the batch it held back is not counted. ``delivered()`` is called as each batch is handed
    out.
    """

    def __init__(
        self, device: torch.device, take: Callable[[], Any], delivered: Callable[[], None]
    ) -> None:
        self._device, self._take, self._delivered = device, take, delivered
        backend = getattr(torch, device.type, None)
        streams = all(hasattr(backend, name) for name in ("Stream", "current_stream", "stream"))
        self._backend = backend if streams else None
        self._stream = None if self._backend is None else backend.Stream(device)  # type: ignore[union-attr]
        self._staged: Any = _NONE  # the batch whose copy was issued
        self._error: Exception | None = None  # raised once the staged batch is handed out
        self._started = False

    def _stage(self) -> Any:
        """Take the next host batch and issue its copy; ``_NONE`` once either raised."""
        try:
            host = self._take()
            if self._stream is None:
                return to_device(host, self._device)
            with self._backend.stream(self._stream):  # type: ignore[union-attr]
                return to_device(host, self._device)
        except Exception as exc:  # StopIteration included: raised after the staged batch
            self._error = exc
            return _NONE

    def clear(self) -> None:
        """Drop the staged batch: every later :meth:`next` raises ``StopIteration``."""
        self._staged, self._error, self._started = _NONE, StopIteration(), True

    def next(self) -> Any:
        """The next batch on the device (see the class)."""
        if not self._started:
            self._staged = self._stage()
            self._started = True
        batch = self._staged
        if batch is _NONE:
            error, self._error = self._error, StopIteration()
            raise error if error is not None else StopIteration
        if self._stream is not None:  # before the next copy is queued: wait for this one only
            current = self._backend.current_stream(self._device)  # type: ignore[union-attr]
            current.wait_stream(self._stream)
            _record(batch, current)
        self._staged = self._stage() if self._error is None else _NONE  # may be interrupted
        self._delivered()
        return batch


def _record(batch: Any, stream: Any) -> None:
    """Mark ``batch``'s tensors as used on ``stream`` (their memory is not reused before)."""
    if isinstance(batch, torch.Tensor):
        batch.record_stream(stream)
    elif isinstance(batch, Mapping):
        for value in batch.values():
            _record(value, stream)
    elif isinstance(batch, (list, tuple)):
        for value in batch:
            _record(value, stream)
