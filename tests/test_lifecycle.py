"""Process-level lifecycle: a training script that breaks, fails or is interrupted exits cleanly.

Each case runs a real script in a subprocess with a hard timeout, so a hang fails the test instead
of the run. A thread that returns from a Lance ``take`` while the interpreter finalizes is ended
inside Lance's frames and the process aborts (SIGABRT; stderr shows "terminate called without an
active exception", "FATAL: exception not rethrown" or nothing); these tests repeat each case
because that abort is timing-dependent.

The cases with a take stuck in I/O (``stuck_take.py``) replace Lance's ``take`` with a fake, so no
thread ever runs a Lance take there and one run each suffices; they measure how long each way of
letting go of an iterator takes. The ``in-lance-*`` cases keep a real read inside Lance through the
exit instead (the exit guard ends the process rather than let finalization abort it). A new
iteration after ``break`` is checked in this process.
"""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from support.helpers import batch_ids, checkout_env, expected_rank_ids, loop_threads
from support.sources import Tap, tapped

from lance_prefetch import PrefetchLoader, ReadOptions
from lance_prefetch.lifecycle._shutdown import CLOSE_WAIT_S, EXIT_WAIT_S

HERE = Path(__file__).parent

SCRIPT = textwrap.dedent(
    """
    import gc, sys, threading, time
    import numpy as np
    from lance_prefetch import PrefetchLoader, ReadOptions

    # one take per batch: the take of batch 2 is the one held below
    loader = PrefetchLoader(
        sys.argv[1], 512, readahead=8, read=ReadOptions(max_in_flight=4, coalesce=1)
    )
    mode = sys.argv[2]
    if mode == "break":
        for batch in loader:
            break
    elif mode == "raise":
        for batch in loader:
            raise ValueError("the training step failed")
    elif mode == "with":
        with loader:
            for batch in loader:
                break
    elif mode == "close+gc":
        iterator = iter(loader)
        next(iterator)
        loader.close()
        print("closed:", iterator.closed, flush=True)
        iterator = iter(loader)
        next(iterator)
        cycle = [iterator]
        cycle.append(cycle)  # only the cycle collector frees it
        del iterator, cycle
        # gc.collect() returns at once, collecting nothing, while an automatic collection runs
        # on another thread (one of the loader's, which started before the del): collect again
        # until the cycle is freed. Collected on one of the loader's own threads, the close runs
        # in a helper thread: give it a moment too.
        from support.helpers import collect_until

        collect_until(
            lambda: not any(t.name == "lance-prefetch-loop" for t in threading.enumerate())
        )
    elif mode.startswith("in-lance-"):  # then break, raise, sigint or timeout
        from support.sources import tapped

        from lance_prefetch import RetryPolicy

        how = mode[len("in-lance-"):]
        read = ReadOptions(max_in_flight=4, coalesce=1)
        if how == "timeout":  # a take running past 1 s is abandoned and tried again
            read = ReadOptions(max_in_flight=4, coalesce=1, retry=RetryPolicy(attempts=3, timeout=1.0))
        with tapped() as tap:  # the same loader, its dataset's takes through the tap
            loader = PrefetchLoader(sys.argv[1], 512, readahead=8, read=read)
        slow = loader.epoch_plan().batch(2).indices.tolist()
        every_row = np.arange(loader.num_rows)
        attempts, in_lance = [], threading.Event()

        def busy_take(read, indices):  # a first attempt that stays in Lance for 60 s, as a read
            if indices.tolist() == slow and not attempts:  # from a stalled store does
                attempts.append(1)
                in_lance.set()
                end = time.monotonic() + 60
                while time.monotonic() < end:
                    read(every_row)  # long calls: the thread is nearly always in Lance
            return read(indices)

        tap.take = busy_take
        if how == "timeout":
            print("batches:", sum(1 for _ in loader), flush=True)  # the whole epoch
        for batch in loader if how != "timeout" else ():
            assert in_lance.wait(30)  # the take of batch 2 runs, in Lance
            if how == "raise":
                raise ValueError("the training step failed")
            if how == "sigint":
                print("step", flush=True)
                time.sleep(30)  # a long training step, interrupted by Ctrl-C
            break
    elif mode == "sigint":
        for batch in loader:
            print("step", flush=True)
            time.sleep(30)  # a long training step, interrupted by Ctrl-C
    left = [t.name for t in threading.enumerate() if t.name == "lance-prefetch-loop"]
    print("loop threads left:", left, flush=True)
    """
)


@pytest.fixture(scope="module")
def wide_dataset(tmp_path_factory):
    """6,000 rows of 256 float32 (6 MB) in 6 fragments: takes that are still running at a break."""
    import lance

    rows = 6000
    values = np.random.default_rng(0).random(rows * 256, dtype=np.float32)
    table = pa.table(
        {
            "id": np.arange(rows),
            "vector": pa.FixedSizeListArray.from_arrays(pa.array(values), 256),
        }
    )
    path = tmp_path_factory.mktemp("wide") / "wide.lance"
    lance.write_dataset(table, str(path), max_rows_per_file=1000)
    return str(path)


def run_script(tmp_path, uri: str, mode: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    return subprocess.run(
        [sys.executable, str(script), uri, mode],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    "mode,expected_code",
    [
        ("break", 0),
        pytest.param("with", 0, marks=pytest.mark.system),
        pytest.param("raise", 1, marks=pytest.mark.system),
    ],
)
def test_script_exits_cleanly(tmp_path, wide_dataset, mode, expected_code):
    """The exit code is the script's own, with no abort and no thread left."""
    result = run_script(tmp_path, wide_dataset, mode)
    assert result.returncode == expected_code, result.stderr[-2000:]
    assert "terminate called" not in result.stderr
    assert "Fatal Python error" not in result.stderr
    if mode == "raise":
        assert result.stderr.rstrip().endswith("ValueError: the training step failed")
    else:
        assert "loop threads left: []" in result.stdout


@pytest.mark.system
@pytest.mark.slow
def test_ctrl_c_during_a_training_step_exits_promptly(tmp_path, wide_dataset):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    process = subprocess.Popen(
        [sys.executable, str(script), wide_dataset, "sigint"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout.readline() == "step\n"
        time.sleep(0.2)  # reads of the next batches are in flight or done
        started = time.monotonic()
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=30)
        elapsed = time.monotonic() - started
    finally:
        process.kill()
    assert elapsed < 10
    assert "KeyboardInterrupt" in stderr
    assert "terminate called" not in stderr and "Fatal Python error" not in stderr
    assert process.returncode in (-signal.SIGINT, 130, 1)


def run_at_once(
    tmp_path, uri: str, modes: list[str], sigints: dict[int, int] | None = None
) -> list[subprocess.Popen]:
    """Run SCRIPT once per mode, all at once (a hard timeout of 90 s each); ``sigints``: for the
    run at that index, how many SIGINTs to send (1 s apart) once it printed ``step``. Returns the
    finished processes, with ``.out`` and ``.err`` set to their stdout and stderr."""
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    processes = [
        subprocess.Popen(
            [sys.executable, str(script), uri, mode],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=checkout_env(),
        )
        for mode in modes
    ]
    deadline = time.monotonic() + 90
    try:
        drivers = [
            threading.Thread(
                target=interrupt_when_ready, args=(processes[index], "step\n", count, deadline)
            )
            for index, count in (sigints or {}).items()
        ]
        for driver in drivers:
            driver.start()
        for driver in drivers:  # each has read its line before communicate() reads the rest
            driver.join()
        for process in processes:
            process.out, process.err = process.communicate(
                timeout=max(deadline - time.monotonic(), 0.1)
            )
    finally:
        for process in processes:
            process.kill()
    return processes


@pytest.mark.system
@pytest.mark.slow
def test_close_then_garbage_collection_exit_cleanly(tmp_path, wide_dataset):
    """After one batch, ``loader.close()`` with the iterator still referenced, then a new iterator
    freed by the cycle collector after one batch: two runs (at once), exit code 0, no abort, no
    thread left."""
    for run in run_at_once(tmp_path, wide_dataset, ["close+gc"] * 2):
        assert run.returncode == 0, run.err[-2000:]
        assert "terminate called" not in run.err and "Fatal Python error" not in run.err
        assert "closed: True" in run.out and "loop threads left: []" in run.out


# -- a take stuck in I/O ---------------------------------------------------------------------------

EXIT_WARNING = (
    f"a fetch was still running {EXIT_WAIT_S:.1f} s after it was left to finish; it was abandoned"
)
#: what close() logs (at DEBUG, so never on stderr here) when it leaves a read running
CLOSE_NOTE = "still running at close()"

# name: (stuck_take.py mode, SIGINTs sent, expected exit code). Python ends a process whose
# KeyboardInterrupt went uncaught by killing itself with SIGINT, so its code is -SIGINT.
STUCK_CASES = {
    "break": ("break", 0, 0),
    "close": ("close", 0, 0),
    "with": ("with", 0, 0),
    "gc": ("gc", 0, 0),
    "raise": ("raise", 0, 1),
    "sigint-step": ("sigint-step", 1, -signal.SIGINT),
    "sigint-next": ("sigint-next", 1, -signal.SIGINT),
    "sigint-next-twice": ("sigint-next", 2, -signal.SIGINT),
}


def interrupt_when_ready(process: subprocess.Popen, ready: str, sigints: int, deadline: float):
    """Send ``sigints`` SIGINTs (1 s apart) to ``process``, the first 0.2 s after it printed
    ``ready``; kill it if it does not print that before ``deadline``."""
    reader = threading.Thread(
        target=lambda: setattr(reader, "line", process.stdout.readline()), daemon=True
    )
    reader.start()
    reader.join(max(deadline - time.monotonic(), 0.0))
    if getattr(reader, "line", None) != ready:
        process.kill()
        return
    for count in range(sigints):
        time.sleep(0.2 if count == 0 else 1.0)
        process.send_signal(signal.SIGINT)


def run_stuck_cases(uri: str, timeout: float) -> dict[str, dict]:
    """Run every STUCK_CASES script at once (each case's SIGINTs sent by a thread of its own as
    soon as its script is ready); per case: the exit code, stderr, the script's RESULT and when the
    process ended (on the system-wide monotonic clock). A process still running at ``timeout`` is
    killed and fails the test."""
    deadline = time.monotonic() + timeout
    processes = {
        name: subprocess.Popen(
            [sys.executable, str(HERE / "support" / "stuck_take.py"), uri, mode],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=checkout_env(),
        )
        for name, (mode, _, _) in STUCK_CASES.items()
    }
    try:
        for name, (mode, sigints, _) in STUCK_CASES.items():
            if sigints:
                ready = "step\n" if mode == "sigint-step" else "blocked\n"
                args = (processes[name], ready, sigints, deadline)
                threading.Thread(target=interrupt_when_ready, args=args, daemon=True).start()
        ended: dict[str, float] = {}
        while len(ended) < len(processes) and time.monotonic() < deadline:
            for name, process in processes.items():
                if name not in ended and process.poll() is not None:
                    ended[name] = time.monotonic()
            time.sleep(0.01)
        hung = sorted(set(processes) - set(ended))
        assert not hung, f"still running after {timeout} s: {hung}"
        out = {}
        for name, process in processes.items():
            stdout, stderr = process.communicate()
            results = [line for line in stdout.splitlines() if line.startswith("RESULT ")]
            out[name] = {
                "code": process.returncode,
                "stderr": stderr,
                "result": json.loads(results[0][len("RESULT ") :]) if results else None,
                "ended": ended[name],
            }
        return out
    finally:
        for process in processes.values():
            process.kill()


@pytest.mark.system
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_stuck_take_never_holds_up_shutdown(ids_1003):
    """The take of batch 2 blocks for 60 s, those of 3..5 for 3 s (fakes; no Lance take runs).
    Each way of letting go of the iterator after batch 0 (or, for ``sigint-next``, while ``next()``
    waits for batch 2) stops the event-loop thread at once and cancels the pending takes 6 and 7.
    ``close()`` and ``with`` then wait CLOSE_WAIT_S (0.5 s) for the running takes and return,
    without a warning; ``break``, gc, an error and Ctrl-C return at once. At exit the stuck take is
    waited for until EXIT_WAIT_S after it was left, with one warning, and the process exits with
    the script's own code (no abort), leaving only the stuck read's daemon thread. A second Ctrl-C
    cuts the exit's wait short."""
    loader = PrefetchLoader(ids_1003, 10, columns=["id"])
    plan = expected_rank_ids(loader, epoch=0)
    runs = run_stuck_cases(ids_1003, timeout=240)
    measured = {name: stuck_times(run) for name, run in runs.items()}
    sys.stdout.write(f"shutdown times (s): {json.dumps(measured)}\n")  # shown with -s
    for name, (mode, sigints, code) in STUCK_CASES.items():
        run, times = runs[name], measured[name]
        stderr, result = run["stderr"], run["result"]
        assert run["code"] == code, (name, stderr[-2000:])
        assert "terminate called" not in stderr and "Fatal Python error" not in stderr, name
        assert result is not None and times is not None, (name, stderr[-2000:])
        assert result["delivered"] == plan[: 2 if mode == "sigint-next" else 1], name
        assert sorted(result["takes"]) == [0, 1, 2, 3, 4, 5], name  # 6 and 7 were cancelled
        assert 0 <= times["loop_gone_s"] < 2.0, (name, times)
        # left at exit: the stuck read's daemon thread; after a second Ctrl-C the slow reads'
        # too (all three, unless the machine stalled the script for seconds)
        main, *readers = result["threads"]
        assert main == ["MainThread", False], name
        assert set(map(tuple, readers)) == {("AnyIO worker thread", True)}, name
        assert len(readers) == 1 or (sigints == 2 and len(readers) <= 4), (name, readers)
        assert result.get("closed", True), name
        if mode in ("close", "with"):  # waits CLOSE_WAIT_S for the running takes, no longer
            assert CLOSE_WAIT_S - 0.05 < times["returns_s"] < 1.0 + 0.25, (name, times)
        else:
            assert times["returns_s"] < 2.0, (name, times)  # 1.04 s once on a busy machine
        assert CLOSE_NOTE not in stderr, (name, stderr[-2000:])
        if sigints == 2:  # the second Ctrl-C interrupts the exit's wait
            first, second = result["sigints"]
            assert 0.8 < second - first < 3.0, name
            assert result["exit"] - second < 2.0, (name, times)
            assert EXIT_WARNING not in stderr
            assert (
                "Exception ignored in atexit callback: <function _close_live_prefetchers" in stderr
            )
        else:  # the exit waits until EXIT_WAIT_S after the read was left running, once
            assert EXIT_WAIT_S - 0.5 < times["trigger_to_exit_s"] < EXIT_WAIT_S + 3, (name, times)
            assert stderr.count(EXIT_WARNING) == 1, (name, stderr[-2000:])
        # well before the stuck take would return (60 s), however loaded the machine
        assert times["trigger_to_process_end_s"] < 30.0, (name, times)
        ending = {"raise": "ValueError: the training step failed"}.get(mode, "KeyboardInterrupt")
        if code != 0:
            assert ending in stderr, (name, stderr[-2000:])


def stuck_times(run: dict) -> dict[str, float | int] | None:
    """From one stuck_take.py run, in seconds: ``loop_gone_s`` (trigger to loop thread gone),
    ``returns_s`` (trigger to the statement that let go returning, or to the uncaught error's
    traceback: what the training script waits for), ``exit_wait_s`` (from then to the end of
    lance_prefetch's exit hook), ``trigger_to_exit_s`` (trigger to the end of that hook),
    ``trigger_to_process_end_s``, ``exit_hook_to_process_end_s``
    (interpreter finalization), ``process_s``; and ``threads_left``, the Python threads alive at
    exit."""
    result = run["result"]
    if result is None or "trigger" not in result:
        return None
    trigger, end = result["trigger"], run["ended"] - result["start"]
    released = result.get("released", float("nan"))
    return {
        "loop_gone_s": round(result.get("loop_gone", float("nan")) - trigger, 3),
        "returns_s": round(released - trigger, 3),
        "exit_wait_s": round(result["exit"] - released, 3),
        "trigger_to_exit_s": round(result["exit"] - trigger, 3),
        "trigger_to_process_end_s": round(end - trigger, 3),
        "exit_hook_to_process_end_s": round(end - result["exit"], 3),
        "process_s": round(end, 3),
        "threads_left": len(result["threads"]),
    }


GUARD_WARNING = (
    "1 read(s) still inside Lance or a transform at exit; ending the process now rather than "
    "finalizing the interpreter under them (which would abort it)"
)
# A thread ended by finalization inside Lance's frames aborts: SIGABRT, with one of these or nothing.
ABORT_SIGNS = ("terminate called", "Fatal Python error", "FATAL: exception not rethrown")


@pytest.mark.system
@pytest.mark.slow
def test_a_read_still_in_lance_at_exit_does_not_abort_it(tmp_path, wide_dataset):
    """The first attempt at batch 2's take keeps Lance busy for 60 s (real takes, one after the
    other, as a read from a stalled store would). ``break``, an error or Ctrl-C while it runs, or
    ``RetryPolicy(timeout=1.0)`` abandoning it (the retry delivers, the epoch ends normally): the
    exit waits EXIT_WAIT_S for it, then ends the process (it would abort if the interpreter
    finalized under it) with the script's own exit code."""
    cases = {
        "in-lance-break": 0,
        "in-lance-raise": 1,
        "in-lance-timeout": 0,
        "in-lance-sigint": -signal.SIGINT,
    }
    started = time.monotonic()
    runs = run_at_once(tmp_path, wide_dataset, list(cases), sigints={3: 1})
    elapsed = time.monotonic() - started
    for run, (mode, code) in zip(runs, cases.items(), strict=True):
        assert run.returncode == code, (mode, run.returncode, run.err[-2000:])
        assert run.err.count(GUARD_WARNING) == 1, (mode, run.err[-2000:])
        assert not any(sign in run.err for sign in ABORT_SIGNS), (mode, run.err[-2000:])
    assert "loop threads left: []" in runs[0].out
    assert "batches: 11" in runs[2].out and "loop threads left: []" in runs[2].out
    assert runs[1].err.count("ValueError: the training step failed") == 1
    assert "KeyboardInterrupt" in runs[3].err
    assert elapsed < 45, "the exit waited for the read"


@pytest.mark.system
@pytest.mark.slow
def test_a_second_ctrl_c_during_the_exit_wait_ends_the_process_by_sigint(tmp_path, wide_dataset):
    """As above, Ctrl-C in the training step while a read is in Lance, then Ctrl-C again during
    the exit's wait for it: the process ends at once, by SIGINT, not by an abort. Two runs at once
    (the abort needed the read's thread inside Lance at that moment: nearly always)."""
    runs = run_at_once(tmp_path, wide_dataset, ["in-lance-sigint"] * 2, sigints={0: 2, 1: 2})
    for run in runs:
        assert run.err.count(GUARD_WARNING) == 1, run.err[-2000:]
        assert not any(sign in run.err for sign in ABORT_SIGNS), run.err[-2000:]
    codes = [run.returncode for run in runs]
    assert codes == [-signal.SIGINT] * 2, f"exit codes {codes}; -6 is SIGABRT"


GUARD_SCRIPT = textwrap.dedent(
    """
    import atexit, sys, threading, time

    atexit.register(lambda: print("earlier hook ran", flush=True))  # runs after lance_prefetch's

    from lance_prefetch.lifecycle import _shutdown
    from lance_prefetch.lifecycle._exit_guard import native_call

    def late_read():  # a hook that runs after lance_prefetch's: no Lance call starts any more
        try:
            with native_call():
                print("late read started", flush=True)
        except RuntimeError as exc:
            print("late read refused:", exc, flush=True)

    atexit.register(late_read)  # registered after: runs before "earlier hook ran"
    atexit.unregister(_shutdown._close_live_prefetchers)
    atexit.register(_shutdown._close_live_prefetchers)  # ... and lance_prefetch's before both
    between = threading.Event()

    def read():  # a read that called into Lance, retries in 30 s, and then calls again
        with native_call():
            pass
        between.set()
        time.sleep(30)
        with native_call():
            pass

    if sys.argv[1] == "between-calls":
        thread = threading.Thread(target=read, daemon=True)
        thread.start()
        between.wait()
        _shutdown.abandon([thread], time.monotonic() + 0.5)  # as close(wait=False) leaves it
    print("leaving", flush=True)
    """
)


@pytest.mark.parametrize("mode", ["between-calls", "idle"])
def test_the_exit_guard_counts_a_read_between_two_calls_and_then_refuses_new_ones(tmp_path, mode):
    """A read's thread that has called into Lance and is between two calls (a retry) at exit is
    as unsafe to finalize under as one inside a call: after the wait the process ends with
    ``os._exit`` (exit code 0, hooks registered earlier skipped). With no such read, the exit goes
    on normally, and a native call started by a later ``atexit`` hook is refused."""
    script = tmp_path / "guard.py"
    script.write_text(GUARD_SCRIPT)
    started = time.monotonic()
    run = subprocess.run(
        [sys.executable, str(script), mode],
        capture_output=True,
        text=True,
        env=checkout_env(),
        timeout=60,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert time.monotonic() - started < 20, "the exit waited for the 30 s retry"
    if mode == "between-calls":
        assert run.stderr.count(GUARD_WARNING) == 1, run.stderr[-2000:]
        assert run.stdout.splitlines() == ["leaving"]
    else:
        assert GUARD_WARNING not in run.stderr, run.stderr[-2000:]
        refused = (
            "late read refused: the interpreter is exiting; lance_prefetch starts no new read (a "
            "read still running when it finalizes would abort the process)"
        )
        assert run.stdout.splitlines() == ["leaving", refused, "earlier hook ran"]


# -- a new iteration after break -------------------------------------------------------------------


def test_a_new_iteration_after_break_reads_a_whole_epoch_exactly(make_loader, ids_1003):
    """After ``break`` at batch k nothing is left over: the next iteration is exactly the next
    epoch's plan, or after ``set_epoch(e)`` exactly epoch e's plan from its first batch (also the
    epoch that was broken off), and a broken-off iterator still referenced keeps its own epoch."""
    loader = make_loader(
        ids_1003, 10, columns=["id"], readahead=8, read=ReadOptions(max_in_flight=4)
    )

    def broken_off(k: int) -> list[list[int]]:
        batches = []
        for batch in loader:
            batches.append(batch["id"].tolist())
            if len(batches) == k:
                break
        return batches

    assert broken_off(3) == expected_rank_ids(loader, epoch=0)[:3]
    assert batch_ids(loader) == expected_rank_ids(loader, epoch=1)
    assert broken_off(1) == expected_rank_ids(loader, epoch=2)[:1]
    loader.set_epoch(7)
    assert batch_ids(loader) == expected_rank_ids(loader, epoch=7)
    assert broken_off(50) == expected_rank_ids(loader, epoch=8)[:50]
    loader.set_epoch(8)  # the epoch just broken off: again from its first batch
    assert batch_ids(loader) == expected_rank_ids(loader, epoch=8)

    live = iter(loader)  # epoch 9, broken off but still referenced
    head = [next(live)["id"].tolist() for _ in range(4)]
    assert batch_ids(loader) == expected_rank_ids(loader, epoch=10)
    assert head + batch_ids(live) == expected_rank_ids(loader, epoch=9)
    assert not loop_threads()


# -- close() does not wait for a stuck take ---------------------------------------------------------


class StuckTakes:
    """The takes of the given batches, of the datasets ``tap`` sees, block (before Lance reads)
    until :meth:`release` (10 s at most); ``started`` is set once one is blocked, ``threads``
    holds the threads that blocked."""

    def __init__(self, tap: Tap, batches: list[list[int]]) -> None:
        self.released = threading.Event()
        self.started = threading.Event()
        self.threads: list[threading.Thread] = []
        stuck = {tuple(batch) for batch in batches}

        def take(read, indices):
            if tuple(indices.tolist()) in stuck:
                self.threads.append(threading.current_thread())
                self.started.set()
                self.released.wait(10)
            return read(indices)

        tap.take = take

    def release(self) -> None:
        self.released.set()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", ["close", "with loader", "with iterator"])
def test_close_returns_within_a_second_and_the_next_iteration_reads_its_epoch_exactly(
    ids_1003, caplog, how
):
    """The take of batch 1 is stuck. ``loader.close()``, leaving ``with loader:`` or leaving
    ``with iter(loader) as it:`` after batch 0 returns after CLOSE_WAIT_S (0.5 s), not later, and
    logs no warning; the iterator is closed, its loop thread gone, the stuck take still running. A
    new iteration right away reads exactly the next epoch while that take still runs. Once the
    take returns, its rows are dropped (the closed iterator ends) and its thread ends."""
    caplog.set_level(logging.WARNING, logger="lance_prefetch")
    with tapped() as tap:
        loader = PrefetchLoader(
            ids_1003, 10, columns=["id"], readahead=4, read=ReadOptions(max_in_flight=2, coalesce=1)
        )
    plan = expected_rank_ids(loader, epoch=0)
    stuck = StuckTakes(tap, [plan[1]])
    started = None
    if how == "with iterator":
        with iter(loader) as iterator:
            assert next(iterator)["id"].tolist() == plan[0]
            assert stuck.started.wait(10)
            started = time.monotonic()
    elif how == "with loader":
        with loader:
            iterator = iter(loader)
            assert next(iterator)["id"].tolist() == plan[0]
            assert stuck.started.wait(10)
            started = time.monotonic()
    else:
        iterator = iter(loader)
        assert next(iterator)["id"].tolist() == plan[0]
        assert stuck.started.wait(10)
        started = time.monotonic()
        loader.close()
    elapsed = time.monotonic() - started
    assert CLOSE_WAIT_S - 0.05 < elapsed < 1.0, elapsed
    assert iterator.closed and not loop_threads()
    assert [thread.is_alive() for thread in stuck.threads] == [True]
    assert batch_ids(loader) == expected_rank_ids(loader, epoch=1)  # while the take is stuck
    assert stuck.threads[0].is_alive()
    stuck.release()
    stuck.threads[0].join(10)
    assert not stuck.threads[0].is_alive()
    with pytest.raises(StopIteration):
        next(iterator)
    assert caplog.records == []
