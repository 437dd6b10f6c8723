"""Faults injected into the storage layer under a real PrefetchLoader: transient failures are
retried (every id still exactly once), permanent ones surface with their batch's context, and an
S3 endpoint that stops or hangs mid-epoch gives a clear error within the retry budget."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from support.fakes import FlakySource
from support.helpers import (
    WORKERS,
    batch_ids,
    collect,
    expected_rank_ids,
    loop_threads,
    read_until_failure,
    wait_until,
)
from torch.utils.data import DataLoader

from lance_prefetch import BatchLoadError, Dataset, PrefetchLoader, ReadOptions, RetryPolicy

FAST = RetryPolicy(attempts=3, backoff=0.01, max_backoff=0.05)


def reader_threads() -> list[threading.Thread]:
    """Live anyio worker threads (the loader's reads run in them)."""
    return [t for t in threading.enumerate() if t.name == "AnyIO worker thread" and t.is_alive()]


def test_one_take_in_three_failing_transiently_loses_nothing(ids_1003):
    loader = PrefetchLoader(
        ids_1003, 32, seed=4, readahead=6, read=ReadOptions(max_in_flight=3, retry=FAST, coalesce=1)
    )  # one take per batch: FlakySource fails every third batch's first read
    loader._source = flaky = FlakySource(loader._source, every=3)
    iterator = iter(loader)
    ids = batch_ids(iterator)
    assert ids == expected_rank_ids(loader)  # 31 full batches, each exactly once, in plan order
    assert len(ids) == 1003 // 32
    assert flaky.failures == len(ids) // 3 == 10  # the first attempt at batches 3, 6, ... 30
    assert flaky.takes == len(ids) + flaky.failures
    assert iterator.statistics().retries == flaky.failures


@pytest.mark.slow
def test_transient_failures_in_spawn_workers_lose_nothing(ids_1003):
    """Each worker's copy fails every 4th of its takes; two epochs through 2 workers."""
    loader = PrefetchLoader(
        ids_1003,
        50,
        seed=1,
        drop_last=False,
        readahead=4,
        read=ReadOptions(max_in_flight=2, retry=FAST),
    )
    loader._source = FlakySource(loader._source, every=4)
    data = DataLoader(
        loader,
        batch_size=None,
        num_workers=2,
        multiprocessing_context=WORKERS,
        persistent_workers=True,
    )
    for epoch in (0, 1):
        loader.set_epoch(epoch)
        ids = batch_ids(data)
        assert ids == expected_rank_ids(loader)
        assert sorted(i for batch in ids for i in batch) == list(range(1003))


def test_a_permanent_failure_surfaces_with_its_batch_and_leaves_no_thread(ids_1003):
    loader = PrefetchLoader(
        ids_1003, 64, seed=2, readahead=4, read=ReadOptions(max_in_flight=2, retry=FAST, coalesce=1)
    )
    later = [batch.indices for batch in loader.epoch_plan().rank_batches(0)][3:]
    loader._source = FlakySource(
        loader._source, always=later, error="LanceError(IO): Not found: data/0.lance"
    )
    expected = expected_rank_ids(loader)
    received = []
    started = time.monotonic()
    with pytest.raises(BatchLoadError) as caught:
        for batch in loader:
            received.append(batch["id"].tolist())
    assert time.monotonic() - started < 5
    error = caught.value
    assert received == expected[: len(received)]
    assert error.position == len(received) == 3  # batches 0-2 are read, 3 is the first one gone
    assert (error.epoch, error.num_rows, error.uri, error.attempts) == (0, 64, ids_1003, 1)
    assert str(error).startswith(
        f"batch 3 of epoch 0 (64 rows) from {ids_1003!r} version 1 failed after 1 attempt "
        "(not retried: OSError is not transient): OSError: LanceError(IO): Not found"
    )
    assert isinstance(error.__cause__, OSError)
    loader.close()  # the failed iterator was dropped: garbage collection closes it at once
    assert wait_until(lambda: not loop_threads() and not reader_threads(), timeout=2.0)


def test_attempts_running_out_name_the_count(ids_1003):
    loader = PrefetchLoader(
        ids_1003, 64, readahead=2, read=ReadOptions(max_in_flight=1, retry=FAST)
    )
    second = [batch.indices for batch in loader.epoch_plan().rank_batches(0)][1:2]
    loader._source = FlakySource(loader._source, always=second)
    with pytest.raises(BatchLoadError, match=r"^batch 1 of epoch 0 .* failed after 3 attempts: "):
        list(loader)


def test_retry_none_gives_up_at_the_first_failure(ids_1003):
    loader = PrefetchLoader(
        ids_1003, 64, readahead=2, read=ReadOptions(max_in_flight=1, retry=None)
    )
    loader._source = FlakySource(loader._source, every=2)
    with pytest.raises(BatchLoadError) as caught:
        list(loader)
    assert (caught.value.position, caught.value.attempts) == (1, 1)


def test_a_failing_transform_is_never_retried(ids_25):
    calls = []

    def transform(batch):
        calls.append(batch["id"][0].item())
        raise OSError("503 Slow Down")  # transient-looking, but transforms are not retried

    loader = PrefetchLoader(
        ids_25, 5, readahead=1, transform=transform, read=ReadOptions(max_in_flight=1)
    )
    with pytest.raises(BatchLoadError) as caught:
        next(iter(loader))
    assert len(calls) == 1
    assert caught.value.attempts is None
    assert "failed in conversion or transform: OSError: 503 Slow Down" in str(caught.value)


def test_bad_retry_argument(ids_25):
    with pytest.raises(TypeError, match="retry should be a lance_prefetch.RetryPolicy or None"):
        PrefetchLoader(ids_25, 5, read=ReadOptions(retry=3))


# -- a real S3-compatible endpoint ---------------------------------------------------------------


@pytest.fixture
def faults(s3):
    """The session S3 server's fault switches, cleared after the test (held requests go on)."""
    yield s3.faults
    s3.faults.clear()


@pytest.mark.slow
def test_an_s3_endpoint_stopped_mid_epoch_fails_within_the_retry_budget():
    """A server in a process of its own, killed after 3 batches. Lance's own retries are off
    (client_max_retries=0) so that the loader's 3 attempts are what is measured."""
    from conftest import write_ids

    server = subprocess.Popen(
        [sys.executable, str(Path(__file__).parent / "support" / "s3server.py"), "stop"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        started = json.loads(server.stdout.readline())
        options = {
            "aws_access_key_id": started["access_key_id"],
            "aws_secret_access_key": started["secret_access_key"],
            "aws_region": "us-east-1",
            "aws_endpoint": started["endpoint"],
            "allow_http": "true",
            "client_max_retries": "0",
        }
        uri = write_ids("s3://stop/ids.lance", 600, rows_per_file=200, storage_options=options)
        loader = PrefetchLoader(
            Dataset(uri, storage_options=options),
            50,
            seed=3,
            readahead=2,
            read=ReadOptions(
                max_in_flight=1, retry=RetryPolicy(attempts=3, backoff=0.1, max_backoff=0.2)
            ),
        )
        expected = expected_rank_ids(loader)
        received, error, _, stopped = read_until_failure(
            loader, 3, lambda: (server.kill(), server.wait(10))
        )
        elapsed = time.monotonic() - stopped
    finally:
        server.kill()
        server.wait(10)
        server.stdout.close()
        server.stdin.close()
    assert received == expected[: len(received)] and 3 <= len(received) <= 5
    assert error.position == len(received) and error.attempts == 3
    assert "error sending request" in str(error)
    assert started["secret_access_key"] not in str(error) + repr(loader)
    assert elapsed < 3  # 3 attempts and 2 waits of at most 0.1 s and 0.2 s
    assert not loop_threads() and wait_until(lambda: not reader_threads())


@pytest.mark.system
@pytest.mark.slow
def test_s3_answering_503_slow_down_for_a_while_loses_nothing(s3, s3_ids_503, faults):
    """The store answers every data read "503 Slow Down" for 5 s. Lance retries each read itself
    (~3 s here even with client_max_retries=0), gives up with the 503 in its error, and the
    loader's attempts carry the batch over the outage: every id of the epoch exactly once."""
    loader = PrefetchLoader(
        Dataset(s3_ids_503, storage_options=s3.storage_options(client_max_retries="0")),
        50,
        seed=6,
        readahead=4,
        read=ReadOptions(
            max_in_flight=2, retry=RetryPolicy(attempts=8, backoff=0.5, max_backoff=1.0)
        ),
    )
    faults.slow_down = 1_000_000
    timer = threading.Timer(5.0, faults.clear)
    timer.start()
    try:
        iterator = iter(loader)
        ids = batch_ids(iterator)
    finally:
        timer.cancel()
    assert ids == expected_rank_ids(loader)
    assert faults.slowed > 0
    assert iterator.statistics().retries >= 1


@pytest.mark.slow
def test_a_hung_s3_request_times_out_and_the_retry_delivers(s3, s3_ids_503, faults):
    loader = PrefetchLoader(
        Dataset(s3_ids_503, storage_options=s3.storage_options()),
        50,
        seed=5,
        readahead=4,
        read=ReadOptions(
            max_in_flight=2,
            retry=RetryPolicy(attempts=3, backoff=0.01, max_backoff=0.05, timeout=1.0),
        ),
    )
    # Epoch 0 reads every file's metadata, which Lance caches and shares between concurrent takes
    # (a hung metadata read holds every take of that file until Lance's own request timeout).
    assert batch_ids(loader) == expected_rank_ids(loader)
    faults.hang = 1  # the next data read hangs until the test ends
    started = time.monotonic()
    loader.set_epoch(1)
    iterator = iter(loader)
    ids = batch_ids(iterator)
    elapsed = time.monotonic() - started
    assert ids == expected_rank_ids(loader)
    assert faults.held == 1
    assert iterator.statistics().retries >= 1
    assert 1.0 <= elapsed < 5.0


@pytest.mark.slow
def test_an_s3_endpoint_that_stops_answering_fails_within_the_budget(s3, s3_ids_503, faults):
    loader = PrefetchLoader(
        Dataset(s3_ids_503, storage_options=s3.storage_options()),
        50,
        readahead=2,
        read=ReadOptions(
            max_in_flight=1,
            retry=RetryPolicy(attempts=2, backoff=0.01, max_backoff=0.05, timeout=0.5),
        ),
    )
    faults.hang = 10_000
    started = time.monotonic()
    with pytest.raises(BatchLoadError) as caught:
        next(iter(loader))
    elapsed = time.monotonic() - started
    assert caught.value.position == 0 and caught.value.attempts == 2
    assert isinstance(caught.value.__cause__, TimeoutError)
    assert "took longer than timeout=0.5 s" in str(caught.value)
    assert 1.0 <= elapsed < 5.0  # not waiting for the hung reads (10,000 s); loaded CI: 2.2 s
    assert not loop_threads()
    faults.clear()  # the hung requests are answered; their reads end, their threads exit
    assert wait_until(lambda: not reader_threads())


def test_collect_helper_still_sees_every_row_with_retries_on(ids_25):
    """The default policy changes nothing when nothing fails."""
    loader = PrefetchLoader(ids_25, 5, drop_last=False)
    assert loader.read.retry == RetryPolicy()
    assert sorted(i for batch in collect(loader) for i in batch) == list(range(25))


def test_the_map_dataset_retries_transient_failures_too(ids_1003):
    from lance_prefetch import LanceMapDataset

    dataset = LanceMapDataset(ids_1003, columns=["id"], retry=FAST)
    dataset._source = flaky = FlakySource(dataset._source, every=2)
    batches = [list(range(start, start + 10)) for start in range(0, 100, 10)]
    assert [dataset.__getitems__(b).data["id"].tolist() for b in batches] == batches
    assert flaky.failures == 5 and flaky.takes == 15

    once = LanceMapDataset(ids_1003, columns=["id"], retry=None)
    once._source = FlakySource(once._source, every=1)
    with pytest.raises(OSError, match="503 Service Unavailable"):
        once.__getitems__([1, 2])
    with pytest.raises(ValueError, match="takes no timeout .* storage_options\\['timeout'\\]"):
        LanceMapDataset(ids_1003, retry=RetryPolicy(timeout=5.0))
