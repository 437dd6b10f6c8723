"""Retries and per-fetch timeouts: the policy (lance_prefetch.schedule.retry) and the prefetcher running it
(lance_prefetch.schedule._prefetcher, lance_prefetch.schedule._blocking), with fake fetch functions (no Lance)."""

from __future__ import annotations

import pickle
import threading
import time
from collections import Counter

import pytest
import tenacity
from support.helpers import loop_threads, wait_until

from lance_prefetch import RetryPolicy
from lance_prefetch.schedule._blocking import BlockingPrefetcher
from lance_prefetch.schedule._prefetcher import FetchError, Prefetcher
from lance_prefetch.schedule.retry import is_transient
from lance_prefetch.sources._lance import ShortReadError

FAST = {"backoff": 0.01, "max_backoff": 0.02}  # retries without slowing the tests down

LANCE_503 = (
    "LanceError(IO): Generic N/A error: LanceError(IO): Generic S3 error: Error performing GET "
    "http://127.0.0.1:33879/training/x.lance/data/0101.lance in 6.8ms - Server returned non-2xx "
    "status code: 503 Service Unavailable: <Error><Code>SlowDown</Code></Error>"
)
LANCE_REFUSED = (
    "LanceError(IO): Generic N/A error: LanceError(IO): Generic S3 error: Error performing GET "
    "http://127.0.0.1:33879/training/x.lance/data/0101.lance in 77us - HTTP error: error sending "
    "request"
)
LANCE_GONE = (
    "LanceError(IO): Generic N/A error: Not found: /tmp/nf.lance/data/1110.lance, "
    "rust/lance-io/src/object_reader.rs:335:56"
)


class Flaky:
    """A fetch whose items in ``failures`` raise ``error`` on their first ``failures[item]``
    attempts; counts attempts per item and the most items held at once."""

    def __init__(self, failures, error=lambda: OSError(LANCE_503), delay=0.0):
        self.failures = dict(failures)
        self.error = error
        self.delay = delay
        self.attempts: Counter[int] = Counter()
        self.lock = threading.Condition()  # notified as each attempt starts
        self.iterator = None
        self.max_held = 0

    def __call__(self, item):
        with self.lock:
            self.attempts[item] += 1
            attempt = self.attempts[item]
            if self.iterator is not None:
                stats = self.iterator._prefetcher.statistics()
                self.max_held = max(self.max_held, stats.held)
            self.lock.notify_all()
        time.sleep(self.delay)
        if attempt <= self.failures.get(item, 0):
            raise self.error()
        return item * 10

    def wait_for(self, predicate, timeout: float = 5.0) -> bool:
        """Whether ``predicate()`` (read under the lock) holds, waiting up to ``timeout`` s."""
        with self.lock:
            return self.lock.wait_for(predicate, timeout)


def test_transient_failures_are_retried_and_every_item_arrives_once_in_order():
    """Items 3 and 7 fail twice, item 11 once; 3 attempts are enough for all."""
    fetch = Flaky({3: 2, 7: 2, 11: 1}, delay=0.002)
    iterator = BlockingPrefetcher(
        Prefetcher(
            range(20), fetch, readahead=4, max_in_flight=2, retry=RetryPolicy(attempts=3, **FAST)
        )
    )
    fetch.iterator = iterator
    assert list(iterator) == [i * 10 for i in range(20)]
    assert fetch.attempts == Counter({i: 1 for i in range(20)} | {3: 3, 7: 3, 11: 2})
    assert iterator._prefetcher.statistics().retries == 5
    assert fetch.max_held <= 4  # retries and backoff stay inside the readahead bound


def test_attempts_run_out():
    fetch = Flaky({2: 100})
    iterator = BlockingPrefetcher(
        Prefetcher(
            range(10), fetch, readahead=3, max_in_flight=1, retry=RetryPolicy(attempts=4, **FAST)
        )
    )
    assert [next(iterator), next(iterator)] == [0, 10]
    with pytest.raises(FetchError) as caught:
        next(iterator)
    assert (caught.value.item, caught.value.attempts) == (2, 4)
    assert str(caught.value.__cause__) == LANCE_503
    assert fetch.attempts[2] == 4
    assert iterator.closed and wait_until(lambda: not loop_threads())


@pytest.mark.parametrize(
    "error",
    [
        lambda: KeyError("bad column"),
        lambda: IndexError("offset 2000 out of range"),
        lambda: OSError(LANCE_GONE),
        lambda: ShortReadError("Lance returned 9 rows for 10 offsets"),
        lambda: PermissionError("denied"),
    ],
)
def test_permanent_errors_are_not_retried(error):
    fetch = Flaky({5: 100}, error=error)
    iterator = BlockingPrefetcher(
        Prefetcher(
            range(10), fetch, readahead=3, max_in_flight=2, retry=RetryPolicy(attempts=5, **FAST)
        )
    )
    with pytest.raises(FetchError) as caught:
        list(iterator)
    assert (caught.value.item, caught.value.attempts) == (5, 1)
    assert fetch.attempts[5] == 1
    assert iterator._prefetcher.statistics().retries == 0


def test_no_policy_means_one_attempt():
    fetch = Flaky({1: 1})
    iterator = BlockingPrefetcher(Prefetcher(range(4), fetch, readahead=2, max_in_flight=1))
    assert next(iterator) == 0
    with pytest.raises(FetchError) as caught:
        next(iterator)
    assert caught.value.attempts == 1 and fetch.attempts[1] == 1


def test_errors_of_process_are_raised_unchanged_and_never_retried():
    calls = Counter()

    def process(item, raw):
        calls[item] += 1
        if item == 2:
            raise OSError(LANCE_503)  # transient-looking, but conversion is never retried
        return raw + 1

    iterator = BlockingPrefetcher(
        Prefetcher(
            range(6),
            Flaky({}),
            process=process,
            readahead=2,
            max_in_flight=1,
            retry=RetryPolicy(attempts=3, **FAST),
        )
    )
    assert [next(iterator), next(iterator)] == [1, 11]
    with pytest.raises(OSError, match="503"):
        next(iterator)
    assert calls[2] == 1


class Stuck:
    """A fetch whose first attempt at ``item`` blocks until ``release`` is set (a request that
    hangs; the second attempt sets it, so the abandoned call then returns); every other call
    returns at once. ``always``: every attempt at ``item`` blocks."""

    def __init__(self, item, *, always=False):
        self.item, self.always = item, always
        self.release = threading.Event()
        self.attempts: Counter[int] = Counter()

    def __call__(self, item):
        self.attempts[item] += 1
        if item == self.item:
            if self.always or self.attempts[item] == 1:
                self.release.wait(30)
            else:
                self.release.set()
        return item * 10


def test_a_stuck_fetch_times_out_and_its_retry_delivers():
    fetch = Stuck(2)
    policy = RetryPolicy(attempts=3, timeout=0.3, **FAST)
    iterator = BlockingPrefetcher(
        Prefetcher(range(8), fetch, readahead=4, max_in_flight=2, retry=policy)
    )
    started = time.monotonic()
    try:
        assert list(iterator) == [i * 10 for i in range(8)]
        elapsed = time.monotonic() - started
    finally:
        fetch.release.set()  # the abandoned call returns; its result is dropped
    assert fetch.attempts[2] == 2
    assert iterator._prefetcher.statistics().retries == 1
    assert 0.3 <= elapsed < 2.0


def test_a_fetch_stuck_on_every_attempt_fails_within_the_budget():
    """3 attempts of 0.2 s, then the error at once: closing after an error does not wait for the
    stuck calls, which end in the background once released."""
    fetch = Stuck(1, always=True)
    policy = RetryPolicy(attempts=3, timeout=0.2, **FAST)
    iterator = BlockingPrefetcher(
        Prefetcher(range(8), fetch, readahead=2, max_in_flight=2, retry=policy)
    )
    started = time.monotonic()
    try:
        assert next(iterator) == 0
        with pytest.raises(FetchError) as caught:
            next(iterator)
        elapsed = time.monotonic() - started
        assert iterator.closed and not loop_threads()

        def alive():
            return [t for t in iterator._prefetcher.threads() if t.is_alive()]

        # the three abandoned attempts (an idle worker that ran retry_on exits in a moment)
        assert wait_until(lambda: len(alive()) == 3, timeout=2.0)
        stuck = alive()
    finally:
        fetch.release.set()
    assert caught.value.attempts == 3
    assert isinstance(caught.value.__cause__, TimeoutError)
    assert "timeout=0.2 s" in str(caught.value.__cause__)
    assert 0.6 <= elapsed < 0.6 + 2 * 0.02 + 1.0  # 3 timeouts, 2 short waits, some slack
    iterator.close()  # an explicit close() still waits for them
    assert not any(t.is_alive() for t in stuck)


def test_the_timeout_covers_the_read_only_not_process():
    """A process step 3x longer than the timeout is not cut short: nothing is retried."""

    def process(item, raw):
        time.sleep(1.5)
        return raw + 1

    fetch = Flaky({})
    iterator = BlockingPrefetcher(
        Prefetcher(
            range(2),
            fetch,
            process=process,
            readahead=2,
            max_in_flight=2,
            retry=RetryPolicy(attempts=3, timeout=0.5, **FAST),
        )
    )
    assert list(iterator) == [1, 11]
    assert fetch.attempts == Counter({0: 1, 1: 1})
    assert iterator._prefetcher.statistics().retries == 0


def test_waiting_for_the_in_flight_limit_is_not_timed():
    """max_in_flight=1 and fetches of 0.15 s: later items wait ~1 s for their turn, far beyond the
    0.25 s timeout, yet none times out."""
    fetch = Flaky({}, delay=0.15)
    iterator = BlockingPrefetcher(
        Prefetcher(
            range(8), fetch, readahead=8, max_in_flight=1, retry=RetryPolicy(timeout=0.25, **FAST)
        )
    )
    assert list(iterator) == [i * 10 for i in range(8)]
    assert sum(fetch.attempts.values()) == 8


def test_close_during_backoff_ends_promptly():
    """A batch waiting 5 s before its next attempt does not hold close() up."""
    fetch = Flaky({1: 100})
    policy = RetryPolicy(attempts=5, backoff=5.0, max_backoff=5.0)
    iterator = BlockingPrefetcher(
        Prefetcher(range(4), fetch, readahead=2, max_in_flight=1, retry=policy)
    )
    assert next(iterator) == 0
    assert fetch.wait_for(lambda: fetch.attempts[1] >= 1)
    started = time.monotonic()
    iterator.close()
    assert time.monotonic() - started < 1.0
    assert not loop_threads()


def test_backoff_is_exponential_with_full_jitter_and_capped():
    policy = RetryPolicy(attempts=10, backoff=0.5, max_backoff=3.0)
    wait = policy.retrying().wait
    for failed_attempt, cap in [(1, 0.5), (2, 1.0), (3, 2.0), (4, 3.0), (8, 3.0)]:
        state = tenacity.RetryCallState(None, None, (), {})
        state.attempt_number = failed_attempt
        draws = [wait(state) for _ in range(400)]
        assert min(draws) >= 0 and max(draws) <= cap
        assert max(draws) > 0.9 * cap and min(draws) < 0.1 * cap  # spread over [0, cap]


@pytest.mark.parametrize(
    "error,transient",
    [
        (OSError(LANCE_503), True),
        (OSError(LANCE_503.replace("0101.lance", "d6e18348c1abb2b98d5e4047b7.lance")), True),
        (OSError(LANCE_503.replace("in 6.8ms", "in 403.479422ms")), True),  # a duration
        (OSError(LANCE_REFUSED.replace("in 77us", "in 1.404s")), True),
        (OSError("Generic S3 error: 404 Not Found"), False),
        (OSError(LANCE_REFUSED), True),
        (OSError("LanceError(IO): Generic S3 error: 500 Internal Server Error"), True),
        (TimeoutError("took too long"), True),
        (ConnectionResetError(104, "Connection reset by peer"), True),
        (OSError(5, "Input/output error"), True),
        (OSError(LANCE_GONE), False),
        (OSError("Generic S3 error: 403 Forbidden: <Code>AccessDenied</Code>"), False),
        (OSError("<Code>SignatureDoesNotMatch</Code>"), False),
        (FileNotFoundError(2, "No such file or directory"), False),
        (PermissionError(13, "Permission denied"), False),
        (ShortReadError("Lance returned 9 rows for 10 offsets"), False),
        (IndexError("row offsets must be in [0, 10)"), False),
        (ValueError("LanceError(Schema): column not found"), False),
        (RuntimeError("panicked"), False),
        (KeyboardInterrupt(), False),
    ],
)
def test_which_errors_are_transient(error, transient):
    assert is_transient(error) is transient


@pytest.mark.parametrize(
    "kwargs,error,message",
    [
        ({"attempts": 0}, ValueError, "attempts should be >= 1"),
        ({"attempts": 2.0}, TypeError, "attempts should be an int"),
        ({"attempts": True}, TypeError, "attempts should be an int"),
        ({"backoff": -1}, ValueError, "backoff should be a finite number of seconds >= 0"),
        ({"backoff": "1"}, TypeError, "backoff should be a number of seconds"),
        ({"backoff": 2.0, "max_backoff": 1.0}, ValueError, "max_backoff should be >= backoff"),
        ({"max_backoff": float("inf")}, ValueError, "max_backoff should be a finite number"),
        ({"timeout": 0}, ValueError, "timeout should be > 0 seconds, or None"),
        ({"timeout": float("nan")}, ValueError, "timeout should be a finite number"),
        ({"retry_on": "OSError"}, TypeError, "retry_on should be callable"),
    ],
)
def test_bad_policies_are_refused(kwargs, error, message):
    with pytest.raises(error, match=message):
        RetryPolicy(**kwargs)


def test_a_policy_pickles_and_the_prefetcher_refuses_anything_else():
    policy = RetryPolicy(attempts=5, backoff=0.2, max_backoff=2.0, timeout=10.0)
    assert pickle.loads(pickle.dumps(policy)) == policy
    with pytest.raises(TypeError, match="retry should be a RetryPolicy or None"):
        BlockingPrefetcher(Prefetcher(range(2), Flaky({}), readahead=1, max_in_flight=1, retry=3))


def test_a_late_duplicate_failing_after_the_slot_was_served_changes_nothing():
    """Item 0's first attempt times out but its rows arrive first (0.3 s); the retry's copy (0.6 s)
    then fails in process: that failure is moot, and every item still arrives."""
    calls = Counter()

    def fetch(item):
        calls[item] += 1
        if item == 0:
            time.sleep(0.3 if calls[item] == 1 else 0.6)
        return item

    processed = Counter()

    def process(item, raw):
        processed[item] += 1
        if item == 0 and processed[item] == 2:
            raise RuntimeError("the duplicate's transform failed")
        return raw * 10

    iterator = BlockingPrefetcher(
        Prefetcher(
            range(6),
            fetch,
            process=process,
            readahead=2,
            max_in_flight=1,
            retry=RetryPolicy(attempts=5, timeout=0.1, **FAST),
        )
    )
    assert list(iterator) == [i * 10 for i in range(6)]
    assert calls[0] >= 2


def test_a_crashing_producer_is_an_error_never_a_quiet_end():
    """A retry_on that raises KeyboardInterrupt crashes the producer: next() raises, it does not
    end the stream as if the plan were exhausted."""

    def rule(error):
        raise KeyboardInterrupt

    fetch = Flaky({3: 1}, delay=0.01)
    iterator = BlockingPrefetcher(
        Prefetcher(
            range(100),
            fetch,
            readahead=8,
            max_in_flight=2,
            retry=RetryPolicy(retry_on=rule, **FAST),
        )
    )
    received = []
    with pytest.raises((RuntimeError, KeyboardInterrupt)) as caught:
        for item in iterator:
            received.append(item)
    assert received == [i * 10 for i in range(len(received))] and len(received) <= 3
    if isinstance(caught.value, RuntimeError):
        assert "the prefetch producer crashed" in str(caught.value)


def blocked_on_retry_on(items):
    """A prefetcher whose retry_on blocks (until ``release`` is set) on item 2's one failure,
    once items 0 and 1 were received and items 3-9 read meanwhile (the readahead window full).
    Returns (iterator, fetch, release)."""
    release = threading.Event()

    def rule(error):
        release.wait(10.0)
        return True

    fetch = Flaky({2: 1})
    iterator = BlockingPrefetcher(
        Prefetcher(
            range(items),
            fetch,
            readahead=8,
            max_in_flight=2,
            retry=RetryPolicy(retry_on=rule, **FAST),
        )
    )
    assert [next(iterator), next(iterator)] == [0, 10]
    assert fetch.wait_for(lambda: set(fetch.attempts) == set(range(10)), timeout=3.0)
    return iterator, fetch, release


def test_a_slow_retry_on_stalls_neither_other_batches_nor_close():
    """retry_on runs in a worker thread: while it blocks on item 2's error, items 3-9 are read
    (up to readahead), and close() does not wait for it."""
    iterator, fetch, release = blocked_on_retry_on(20)
    try:
        assert fetch.attempts[2] == 1 and not release.is_set()
        before = time.monotonic()
        iterator.close(wait=False)
        assert time.monotonic() - before < 0.5 and not loop_threads()
    finally:
        release.set()


def test_a_slow_retry_on_delays_only_its_own_batch():
    iterator, fetch, release = blocked_on_retry_on(12)
    release.set()
    assert list(iterator) == [i * 10 for i in range(2, 12)]
    assert fetch.attempts[2] == 2 and iterator.statistics().retries == 1
