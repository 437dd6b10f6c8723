"""Keep the interpreter from finalizing under a thread that is inside a native call.

A thread that released the GIL for a long native call (a Lance ``take``) and returns while the
interpreter finalizes is ended by Python 3.10-3.13 inside the native frames, and the process aborts
("terminate called without an active exception", SIGABRT); so may a read's thread that has called
into Lance and still runs, between two calls (a retry, the next take of a long read).
:func:`native_call` marks such calls; :func:`exit_if_stuck`, run by the prefetcher's ``atexit``
hook once it has waited for running reads, ends the process at once with ``os._exit`` if a thread
is still inside one, or a read's thread that has called into Lance still runs. From then on no
native call starts.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing.util
import os
import signal
import sys
import threading
import weakref
from collections.abc import Iterable, Iterator

__all__ = ["exit_if_stuck", "native_call"]

_logger = logging.getLogger("lance_prefetch.scheduling")
_inside: set[threading.Thread] = set()
_called: weakref.WeakSet[threading.Thread] = weakref.WeakSet()  # have called into Lance
_exiting = False  # set by exit_if_stuck: no native call starts after it
_lock = threading.Lock()


@contextlib.contextmanager
def native_call(*, lance: bool = True) -> Iterator[None]:
    """Mark the calling thread as inside a native call for the ``with`` block; ``lance``: a call
    into Lance (else native code such as torch's, in a conversion or a transform).

    Raises:
        RuntimeError: the process is exiting (:func:`exit_if_stuck` has run): a call started now
            could still be running when the interpreter finalizes.
    """
    thread = threading.current_thread()
    with _lock:
        if _exiting:
            raise RuntimeError(
                "the interpreter is exiting; lance_prefetch starts no new read (a read still "
                "running when it finalizes would abort the process)"
            )
        _inside.add(thread)
        if lance and thread not in _called:  # membership makes no new weakref: per take
            _called.add(thread)
    try:
        yield
    finally:
        with _lock:
            _inside.discard(thread)


def exit_if_stuck(running: Iterable[threading.Thread] = ()) -> None:
    """If a thread is still inside a :func:`native_call`, or one of ``running`` (the threads of
    reads left to finish) still runs and has called into Lance, end the process now, before
    finalizing. Either way, no :func:`native_call` starts afterwards.

    The exit status is kept where it can be known: 1 after an unhandled exception, SIGINT after an
    unhandled ``KeyboardInterrupt`` (as Python itself exits), else 0 (the status of a
    ``sys.exit(n)`` is not visible from an ``atexit`` hook). ``atexit`` hooks registered before
    lance_prefetch was imported do not run then; standard streams and logging are flushed, and
    multiprocessing's exit work is done (shared semaphores unlinked, daemonic children stopped).
    """
    global _exiting
    with _lock:
        _exiting = True
        # Membership alone: a thread leaves the set when its call returns. (Not is_alive() for
        # these: a join() cut short by Ctrl-C marks a running thread stopped in Python 3.11.)
        stuck = set(_inside)
        # A read's thread between two calls into Lance (retrying, or looping over takes) is in
        # none now, but still runs. Whether it runs is read from the interpreter's thread states
        # (sys._current_frames), not is_alive(), for the reason above.
        live = sys._current_frames().keys()
        stuck.update(thread for thread in running if thread.ident in live and thread in _called)
    if not stuck:
        return
    error = getattr(sys, "last_value", None)  # set when an unhandled exception was printed
    _logger.warning(
        "%d read(s) still inside Lance or a transform at exit; ending the process now rather than "
        "finalizing the interpreter under them (which would abort it)",
        len(stuck),
    )
    logging.shutdown()
    with contextlib.suppress(Exception):
        # What multiprocessing's own atexit hook does (it would not run after os._exit): run its
        # finalizers (shared semaphores are unlinked) and stop daemonic child processes.
        multiprocessing.util._exit_function()  # type: ignore[attr-defined]
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    if isinstance(error, KeyboardInterrupt):
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(1 if error is not None else 0)
