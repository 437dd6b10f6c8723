"""Ctrl-C (and KeyboardInterrupt from a signal handler) landing anywhere: never a hang, never lost.

The subprocess cases run ``interrupt_script.py`` with a hard timeout, so a hang fails the test.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from support.helpers import checkout_env

from lance_prefetch.lifecycle._interrupts import call_holding_sigint, sigint_deferred

SCRIPT = Path(__file__).parent / "support" / "interrupt_script.py"


def test_a_sigint_inside_the_block_is_raised_after_it():
    steps = []
    with pytest.raises(KeyboardInterrupt):
        with sigint_deferred():
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(1000):  # plenty of bytecodes where the interrupt would have landed
                time.sleep(0)
            steps.append("body finished")
    assert steps == ["body finished"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_second_sigint_is_raised_at_once():
    steps = []
    with pytest.raises(KeyboardInterrupt):
        with sigint_deferred():
            os.kill(os.getpid(), signal.SIGINT)
            steps.append("first deferred")
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(1000):
                time.sleep(0)
            steps.append("not reached")
    assert steps == ["first deferred"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_without_a_sigint_nothing_changes():
    previous = signal.getsignal(signal.SIGINT)
    with sigint_deferred():
        assert signal.getsignal(signal.SIGINT) is not previous
    assert signal.getsignal(signal.SIGINT) is previous


def test_the_previous_handler_gets_the_deferred_signal():
    seen = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: seen.append(signum))
    try:
        with sigint_deferred():
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(1000):
                time.sleep(0)
            assert seen == []
        for _ in range(1000):
            time.sleep(0)
        assert seen == [signal.SIGINT]
    finally:
        signal.signal(signal.SIGINT, previous)


def test_outside_the_main_thread_it_does_nothing():
    handlers = []

    def run():
        with sigint_deferred():
            handlers.append(signal.getsignal(signal.SIGINT))

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert handlers == [signal.default_int_handler]


def _spin(seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.001)


def test_a_sigint_during_a_finalizer_is_raised_after_it():
    steps = []

    def close():
        os.kill(os.getpid(), signal.SIGINT)
        _spin(0.05)
        steps.append("closed")

    class Finalized:
        def __del__(self):
            call_holding_sigint(close)

    with pytest.raises(KeyboardInterrupt):
        item = Finalized()
        del item
        steps.append("after del")
        _spin(5.0)
    assert steps == ["closed", "after del"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_finalizer_without_sigint_just_calls():
    steps = []
    call_holding_sigint(lambda: steps.append("called"))
    _spin(0.05)
    assert steps == ["called"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def _start(mode: str, seconds: float) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(SCRIPT), mode, str(seconds)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=checkout_env(),
    )


def _wait_ready(process: subprocess.Popen[str]) -> None:
    assert process.stdout is not None
    assert process.stdout.readline().strip() == "ready"


def _finish(process: subprocess.Popen[str], timeout: float) -> tuple[int, str, str]:
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
        pytest.fail(f"the process hung; stdout: {out[-2000:]}\nstderr: {err[-2000:]}")
    return process.returncode, out, err


def test_ctrl_c_while_iterators_start_and_stop_back_to_back_ends_the_process():
    """SIGINT at a random moment of a loop that mostly starts event-loop threads and closes
    dropped iterators: the process ends by SIGINT at once, every time (it could hang in the portal
    start, or lose the interrupt in garbage collection: "Exception ignored in __del__")."""
    rng = random.Random(7)
    processes = [_start("sigint", 60.0) for _ in range(6)]  # started together: imports overlap
    for process in processes:
        _wait_ready(process)
        time.sleep(rng.uniform(0.05, 0.3))
        process.send_signal(signal.SIGINT)
    try:
        for process in processes:
            code, out, err = _finish(process, timeout=15.0)
            assert code == -signal.SIGINT, (code, out[-2000:], err[-2000:])
            assert "KeyboardInterrupt" in err and "Exception ignored" not in err, err[-2000:]
            assert "no SIGINT came" not in out
    finally:  # one that failed: the others are not left running, their pipes open
        for process in processes:
            process.kill()
            process.communicate()


def test_keyboard_interrupt_from_a_signal_handler_anywhere_in_next_never_hangs():
    """A SIGALRM handler raising KeyboardInterrupt at random moments while next() waits and hands
    batches over: every interrupted iterator closes (its loop thread ends), 300 times."""
    process = _start("alarm", 30.0)
    _wait_ready(process)
    code, out, err = _finish(process, timeout=60.0)
    assert code == 0, err[-3000:]
    result = json.loads(out.split("RESULT ", 1)[1])
    assert result["loop_threads"] == []
    # an interrupt landing in a weakref callback is dropped by Python itself ("Exception
    # ignored"): rare, and that iteration is closed all the same
    assert result["interrupts"] + result["lost"] == result["iterations"] >= 200
    assert result["lost"] <= result["iterations"] // 20
    assert result["batches"] > 0


def test_a_sigint_while_the_loop_thread_starts_raises_from_next_and_leaves_no_thread(
    ids_1003, monkeypatch
):
    """The held-back Ctrl-C is raised at the end of the iterator's start, in the first next() (the
    loop thread starts there): next() raises it, and the half-built iterator is still closed by
    garbage collection (its loop thread ends)."""
    import contextlib

    import anyio.from_thread
    from support.helpers import collect_until, loop_threads

    from lance_prefetch import PrefetchLoader

    real = anyio.from_thread.start_blocking_portal

    @contextlib.contextmanager
    def portal_then_sigint(*args, **kwargs):
        with real(*args, **kwargs) as portal:
            os.kill(os.getpid(), signal.SIGINT)  # lands while the portal starts
            yield portal

    loader = PrefetchLoader(ids_1003, 100, columns=["id"])
    monkeypatch.setattr(anyio.from_thread, "start_blocking_portal", portal_then_sigint)
    iterator = iter(loader)  # nothing starts before the first next()
    with pytest.raises(KeyboardInterrupt):
        next(iterator)
    monkeypatch.undo()
    assert collect_until(lambda: not loop_threads(), timeout=3.0)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert len(list(loader)) == 10  # the loader still works


RECOVER_SCRIPT = """
import time
from lance_prefetch.lifecycle._interrupts import recover_interrupts_in

class Iterator:
    def __del__(self):
        raise KeyboardInterrupt  # as a SIGINT in its first bytecodes would

class Other:
    def __del__(self):
        raise ValueError("not an interrupt")

recover_interrupts_in(Iterator.__del__)
other = Other()
del other  # printed as usual
try:
    iterator = Iterator()
    del iterator
    for _ in range(1000):
        time.sleep(0.001)
    print("lost", flush=True)
except KeyboardInterrupt:
    print("raised again", flush=True)
"""


def test_an_interrupt_escaping_the_finalizer_is_raised_again_in_the_main_thread():
    """A ``KeyboardInterrupt`` that escapes a finalizer given to ``recover_interrupts_in`` (a
    SIGINT before it could hold SIGINT back) is raised again in the code it interrupted, not
    printed as "Exception ignored"; another finalizer's error is still printed as before."""
    run = subprocess.run(
        [sys.executable, "-c", RECOVER_SCRIPT],
        capture_output=True,
        text=True,
        env=checkout_env(),
        timeout=60,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.splitlines() == ["raised again"]
    assert run.stderr.count("Exception ignored") == 1, run.stderr[-2000:]
    assert "ValueError: not an interrupt" in run.stderr and "KeyboardInterrupt" not in run.stderr
