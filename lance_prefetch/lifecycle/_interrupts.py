"""Hold ``Ctrl-C`` back for the few milliseconds an iterator starts or stops its event-loop thread.

A ``KeyboardInterrupt`` raised while anyio's blocking portal starts (it waits for the new loop to
report in) leaves a loop thread nobody stops, and the process hangs until a second ``Ctrl-C``; one
raised while the portal stops leaves the loop thread running. :func:`sigint_deferred` records a
``SIGINT`` that arrives meanwhile and delivers it to the previous handler right after the block, so
the ``KeyboardInterrupt`` is raised where the caller can see it, with the thread state consistent.
A second ``SIGINT`` within the block is delivered at once (a way out if the block hangs).

Garbage collection closes a dropped iterator from ``__del__``, where an exception is only printed;
:func:`call_holding_sigint` holds ``SIGINT`` back there and sends it again once ``__del__`` has
returned; :func:`recover_interrupts_in` catches one that struck in the few bytecodes before that.
"""

from __future__ import annotations

import _signal
import _thread
import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

__all__ = ["call_holding_sigint", "recover_interrupts_in", "sigint_deferred"]

_SIGINT = int(signal.SIGINT)


@contextlib.contextmanager
def sigint_deferred() -> Iterator[None]:
    """Defer ``SIGINT`` until the ``with`` block ends, then deliver it (once) to the handler that
    was installed before.

    Only the main thread receives signals in Python: elsewhere, or when ``SIGINT`` is ignored or
    handled outside Python, this does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGINT)
    if previous in (signal.SIG_IGN, None):
        yield
        return
    received: list[int] = []

    def record(signum: int, frame: FrameType | None) -> None:
        received.append(signum)
        if len(received) > 1:  # asked twice: stop deferring
            signal.signal(signal.SIGINT, previous)
            signal.raise_signal(signal.SIGINT)

    signal.signal(signal.SIGINT, record)
    try:
        yield
    finally:
        if signal.getsignal(signal.SIGINT) is record:
            signal.signal(signal.SIGINT, previous)
            if received:
                signal.raise_signal(signal.SIGINT)  # the previous handler runs now


def call_holding_sigint(function: Callable[[], object]) -> None:
    """Call ``function()`` with ``SIGINT`` held back, and send a ``SIGINT`` that came meanwhile
    again once this call has returned: for a finalizer (``__del__``), where a
    ``KeyboardInterrupt`` would be printed as "Exception ignored" and lost.

    The signal is sent again from a new thread after this call's last statement, so that the
    ``KeyboardInterrupt`` is raised in the code the finalizer interrupted. The handler is
    installed before anything else runs (a ``SIGINT`` already pending is then held back too);
    only the few bytecodes from the finalizer's start to that point stay exposed. Elsewhere than
    in the main thread ``function`` is simply called (signals reach only the main thread).
    """
    state = [0, False]  # [SIGINTs held back, the caller is past this call]

    def record(signum: int, frame: FrameType | None) -> None:
        state[0] += 1

    # _signal.signal, the C function under signal.signal: the Python wrapper's extra calls are
    # points where a pending SIGINT would be raised, in here, and lost.
    try:
        previous = _signal.signal(_SIGINT, record)
    except ValueError:  # not the main thread
        function()
        return
    try:
        function()
    finally:
        if state[0]:  # started while record() still holds a SIGINT back: none is lost
            _thread.start_new_thread(_send_sigint_after, (state,))
        # None: a handler not installed from Python, which cannot be put back; the default one
        # is the closest (the interpreter's own handler raises KeyboardInterrupt).
        try:
            # signal.signal runs the handler of a SIGINT pending at this very moment, the
            # restored one: it must not raise in here either.
            _signal.signal(_SIGINT, signal.default_int_handler if previous is None else previous)
        except KeyboardInterrupt:
            if not state[0]:
                _thread.start_new_thread(_send_sigint_after, (state,))
        state[1] = True  # a plain store: no interrupt is raised between this and the return


def _send_sigint_after(state: list[Any]) -> None:
    """In a new thread: once ``state[1]`` is set, send the process a ``SIGINT`` (the restored
    handler runs it in the main thread)."""
    while not state[1]:
        time.sleep(0.001)
    os.kill(os.getpid(), signal.SIGINT)


_finalizers: set[Callable[..., object]] = set()
_previous_hook: Callable[[Any], object] | None = None


def _unraisable_hook(unraisable: Any) -> None:
    if isinstance(unraisable.exc_value, KeyboardInterrupt) and unraisable.object in _finalizers:
        # Sent again from another thread once this hook is done (a SIGINT handled in here would
        # be raised in the hook, and lost the same way): the main thread's own code gets it.
        state = [1, False]
        _thread.start_new_thread(_send_sigint_after, (state,))
        state[1] = True  # a plain store: no interrupt is raised between this and the return
        return
    (_previous_hook or sys.__unraisablehook__)(unraisable)


def recover_interrupts_in(finalizer: Callable[..., object]) -> None:
    """A ``KeyboardInterrupt`` that escapes ``finalizer`` (a ``__del__``; a ``SIGINT`` in its
    first bytecodes, before :func:`call_holding_sigint` holds it back) is raised again in the main
    thread instead of being printed as "Exception ignored" and lost: a wrapper around
    :data:`sys.unraisablehook`, installed once, that hands every other exception to the hook that
    was there before. A hook installed later (pytest installs its own) takes over.
    """
    global _previous_hook
    _finalizers.add(finalizer)
    if sys.unraisablehook is not _unraisable_hook:
        _previous_hook = sys.unraisablehook
        sys.unraisablehook = _unraisable_hook
