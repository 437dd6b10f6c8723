"""Faults injected at the HTTP level between Lance and the suite's real S3-compatible server (moto,
signatures checked), by the proxy of ``support/faultproxy.py``: the store going away and coming
back, gone for good, a share of requests answered 503 SlowDown or reset, credentials revoked
mid-epoch. Each with the epoch's exact ids and a time bound computed from the retry settings.

Lance's own retries are set short through storage options (:data:`LANCE_RETRIES`), which is how
these bounds are computed (pylance 14.0.2; see docs/reliability.md, "Faults at the HTTP level"):

- each HTTP request is retried ``client_max_retries`` times by object_store, the k-th wait drawn
  from ``[0.1, 0.1 * 2**(k-1)]`` s (the first exactly 0.1 s), and not after
  ``client_retry_timeout`` seconds; a 403 is not retried;
- Lance reads each range of a file up to :data:`LANCE_TRIES` times in a row (a fixed loop in
  ``lance-io``'s object reader), each time with those retries;
- its request-rate limiter would retry again any request that failed after a retry (it takes
  that for throttling) and slow all requests down: ``lance_aimd_max_retries=0`` turns it off.
"""

from __future__ import annotations

import random
import re
import socket
import threading
import time
import traceback

import boto3
import numpy as np
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError, ConnectionClosedError, ReadTimeoutError
from support.faultproxy import FaultProxy, Rule
from support.helpers import batch_ids, expected_rank_ids, read_until_failure, wait_until

from lance_prefetch import Dataset, PrefetchLoader, ReadOptions, RetryPolicy

#: Lance's own retries in these tests: one retry per request (object_store waits 0.1 s first), a
#: retry timeout that never cuts in, and no retries by the request-rate limiter.
LANCE_RETRIES = {
    "client_max_retries": "1",
    "client_retry_timeout": "5",
    "lance_aimd_max_retries": "0",
}
#: How many times in a row Lance 14 reads a range whose request failed.
LANCE_TRIES = 4
#: object_store's first backoff (``BackoffConfig::init_backoff``): every wait is at least this.
FIRST_WAIT_S = 0.1
#: Files of ``s3_ids_503`` (200, 200 and 103 rows); a batch of 50 random rows touches each.
FILES = 3
#: Scheduling slack on top of a computed bound, on this shared 2-core machine (the suite runs
#: 3 test processes on it, and moto answers each request in Python).
SLACK_S = 1.5


def lance_take_s(retries: int) -> tuple[float, float]:
    """The shortest and longest time a take spends on a range that fails every request (store
    gone): :data:`LANCE_TRIES` tries, each with ``retries`` waits of object_store."""
    waits = [FIRST_WAIT_S * 2**k for k in range(retries)]  # the k-th wait is at most this
    return LANCE_TRIES * FIRST_WAIT_S * retries, LANCE_TRIES * sum(waits)


def give_up_bound_s(policy: RetryPolicy, retries: int) -> float:
    """The longest time from the store going away to ``BatchLoadError``: the failing batch's
    attempts, each a take as long as :func:`lance_take_s` at most, and the policy's waits (the
    n-th at most ``min(max_backoff, backoff * 2**(n-2))``)."""
    waits = sum(
        min(policy.max_backoff, policy.backoff * 2 ** (n - 2))
        for n in range(2, policy.attempts + 1)
    )
    return policy.attempts * lance_take_s(retries)[1] + waits


@pytest.fixture(scope="module")
def proxy(s3):
    """One fault proxy in front of the session's S3 server for this module; stopped at its end,
    leaving no thread or port behind (checked)."""
    proxy = FaultProxy(s3.endpoint).start()
    port = int(proxy.endpoint.rsplit(":", 1)[1])
    try:
        yield proxy
    finally:
        proxy.stop()
    assert not proxy.threads(), proxy.threads()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()


@pytest.fixture
def faults(proxy):
    """The proxy, forwarding everything and listening before and after the test."""
    proxy.clear()
    proxy.resume()
    yield proxy
    proxy.clear()
    proxy.resume()


def through(s3, proxy, **overrides: str) -> dict[str, str]:
    """Storage options reaching the S3 server through ``proxy``, with :data:`LANCE_RETRIES`."""
    return s3.storage_options(aws_endpoint=proxy.endpoint, **{**LANCE_RETRIES, **overrides})


def new_threads(before: set[threading.Thread]) -> list[threading.Thread]:
    """Threads alive now that were not in ``before``, other than the servers' own."""
    return [
        t
        for t in threading.enumerate()
        if t not in before and t.is_alive() and not t.name.startswith(("faultproxy", "s3server"))
    ]


def full_text(error: BaseException) -> str:
    return "".join(traceback.format_exception(error))


def test_the_proxy_forwards_signed_requests_and_injects_each_fault(s3, faults):
    """Through the proxy a signed GET returns the object's bytes (moto verified the signature
    over the Host header the client signed); each action gives its status and S3 error code, a
    reset drops the connection, a stall holds the request until the rule changes, refuse()
    closes the port and resume() opens it again; a fraction is drawn from the seed."""
    s3.client().put_object(Bucket="training", Key="proxy/object", Body=b"exact bytes")
    client = boto3.client(
        "s3",
        endpoint_url=faults.endpoint,
        region_name="us-east-1",
        aws_access_key_id=s3.access_key_id,
        aws_secret_access_key=s3.secret_access_key,
        config=Config(retries={"total_max_attempts": 1}, read_timeout=0.3, connect_timeout=0.3),
    )

    def get() -> bytes:
        return client.get_object(Bucket="training", Key="proxy/object")["Body"].read()

    assert get() == b"exact bytes"
    for action, status, code in [
        ("slow_down", 503, "SlowDown"),
        ("internal_error", 500, "InternalError"),
        ("access_denied", 403, "AccessDenied"),
        ("invalid_key", 403, "InvalidAccessKeyId"),
    ]:
        faults.set_rule(action)
        with pytest.raises(ClientError) as caught:
            get()
        error = caught.value.response
        assert (error["ResponseMetadata"]["HTTPStatusCode"], error["Error"]["Code"]) == (
            status,
            code,
        )
    faults.set_rule("reset")
    with pytest.raises(ConnectionClosedError):
        get()
    faults.set_rule("stall")
    with pytest.raises(ReadTimeoutError):
        get()
    faults.refuse()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", int(faults.endpoint.rsplit(":", 1)[1])), 1).close()
    faults.clear()
    faults.resume()
    assert get() == b"exact bytes"
    since = time.monotonic()
    faults.set_rule(Rule("slow_down", fraction=0.5, seed=7, methods=("GET",)))
    outcomes = []
    for _ in range(20):
        try:
            get()
            outcomes.append(True)
        except ClientError:
            outcomes.append(False)
    draw = random.Random(7)
    assert outcomes == [draw.random() >= 0.5 for _ in range(20)]
    seen = faults.requests(since=since)
    assert [r.status for r in seen] == [200 if ok else 503 for ok in outcomes]
    assert [r.action for r in seen] == ["pass" if ok else "slow_down" for ok in outcomes]


def read_with_outage(loader, start, end, *, after: int = 3, outage_s: float = 1.0):
    """Iterate ``loader`` (its ``id`` column), calling ``start()`` once ``after`` batches arrived
    and ``end()`` ``outage_s`` seconds later. Returns the ids of each batch, the iterator, and
    whether the outage lasted its full time before the epoch ended."""
    ended = threading.Event()

    def finish() -> None:
        end()
        ended.set()

    timer = threading.Timer(outage_s, finish)
    iterator = iter(loader)
    received = []
    try:
        for batch in iterator:
            received.append(batch["id"].tolist())
            if len(received) == after:
                start()
                timer.start()
    finally:
        full = ended.is_set()
        timer.cancel()
        if timer.is_alive():
            timer.join()
        end()
    return received, iterator, full


@pytest.mark.timeout(30)
@pytest.mark.parametrize("outage", ["refused", "reset"])
def test_a_store_gone_and_back_within_the_retry_budget_loses_nothing(
    s3, s3_ids_503, faults, outage
):
    """For 1 s mid-epoch the store refuses connections (the port closed, open connections reset)
    or resets every request; the attempts cover at least 2.4 s of it (each take spends at least
    4 x 0.1 s on a gone store), so the epoch completes: every id once, in the plan's order."""
    policy = RetryPolicy(attempts=6, backoff=0.2, max_backoff=0.5)
    assert policy.attempts * lance_take_s(1)[0] > 2 * 1.0  # the budget covers the outage twice
    loader = PrefetchLoader(
        Dataset(s3_ids_503, storage_options=through(s3, faults)),
        50,
        columns=["id"],
        seed=11,
        drop_last=False,
        readahead=2,
        read=ReadOptions(max_in_flight=2, coalesce=1, retry=policy),
    )
    if outage == "refused":
        start, end = faults.refuse, faults.resume
    else:
        start, end = (lambda: faults.set_rule("reset")), faults.clear
    since = time.monotonic()
    received, iterator, full = read_with_outage(loader, start, end)
    assert full  # the epoch was still reading when the store came back
    assert received == expected_rank_ids(loader)
    assert sorted(i for batch in received for i in batch) == list(range(503))
    assert iterator.statistics().retries >= 1  # the outage was felt
    if outage == "reset":
        assert len(faults.requests(since=since, action="reset")) >= LANCE_TRIES * 2


@pytest.mark.timeout(30)
def test_a_store_gone_for_good_fails_within_the_bound_and_leaves_no_thread(s3, s3_ids_503, faults):
    """The store stops listening after 3 batches: the batches read before it are delivered, then
    ``BatchLoadError`` after 3 attempts, within the bound the settings give (3 takes of 4 x 0.1 s
    and waits of at most 0.1 and 0.2 s: 1.5 s); close() returns at once and no thread is left."""
    policy = RetryPolicy(attempts=3, backoff=0.1, max_backoff=0.2)
    bound = give_up_bound_s(policy, 1)
    assert bound == pytest.approx(1.5)
    before = set(threading.enumerate())
    loader = PrefetchLoader(
        Dataset(s3_ids_503, storage_options=through(s3, faults)),
        50,
        columns=["id"],
        seed=2,
        readahead=2,
        read=ReadOptions(max_in_flight=2, coalesce=1, retry=policy),
    )
    expected = expected_rank_ids(loader)
    received, error, _, gone = read_until_failure(loader, 3, faults.refuse)
    elapsed = time.monotonic() - gone
    started = time.monotonic()
    loader.close()
    closing = time.monotonic() - started
    assert 3 <= len(received) <= 3 + loader.readahead and received == expected[: len(received)]
    assert (error.epoch, error.position, error.num_rows, error.attempts) == (
        0,
        len(received),
        50,
        3,
    )
    assert str(error).startswith(
        f"batch {len(received)} of epoch 0 (50 rows) from 's3://training/ids503.lance' version 1 "
        f"failed after 3 attempts: OSError: LanceError(IO): "
    )
    assert "error sending request" in str(error) and isinstance(error.__cause__, OSError)
    assert policy.attempts * lance_take_s(1)[0] - 0.1 <= elapsed < bound + SLACK_S
    assert closing < 0.5
    assert wait_until(lambda: not new_threads(before), timeout=2.0), new_threads(before)
    measured = f"BatchLoadError {elapsed:.2f} s after the store went away (bound {bound:.2f} s)"
    print(f"\ngone for good: {measured}")  # noqa: T201  (shown with -s)


@pytest.mark.timeout(30)
def test_five_percent_of_requests_slowed_down_or_reset_lose_nothing(s3, s3_ids_503, faults):
    """5% of requests (seeded) answered 503 SlowDown or reset: Lance's and the loader's retries
    carry the epoch; every id once, in order, with the right vectors."""
    loader = PrefetchLoader(
        Dataset(s3_ids_503, storage_options=through(s3, faults)),
        16,
        columns=["id", "vector"],
        seed=5,
        drop_last=False,
        readahead=4,
        read=ReadOptions(
            max_in_flight=2,
            coalesce=1,
            retry=RetryPolicy(attempts=4, backoff=0.05, max_backoff=0.2),
        ),
    )
    since = time.monotonic()
    faults.set_rule(Rule(("slow_down", "reset"), fraction=0.05, seed=11))
    iterator = iter(loader)
    batches = list(iterator)
    ids = batch_ids(batches)
    assert ids == expected_rank_ids(loader)
    assert sorted(i for batch in ids for i in batch) == list(range(503))
    for batch in batches:
        expected = batch["id"].numpy()[:, None] * np.array([1, 2, 3], dtype=np.float32)
        np.testing.assert_array_equal(batch["vector"].numpy(), expected)
    seen = faults.requests(since=since)
    slowed = sum(r.action == "slow_down" for r in seen)
    reset = sum(r.action == "reset" for r in seen)
    assert slowed >= 1 and reset >= 1  # both faults were injected
    measured = (
        f"{len(seen)} requests, {slowed} answered 503, {reset} reset; "
        f"{iterator.statistics().retries} loader retries for {len(ids)} batches"
    )
    print(f"\n5% faults: {measured}")  # noqa: T201  (shown with -s)


def revoke_by_deleting_the_key(s3, faults, key):
    s3.client("iam").delete_access_key(UserName="loader", AccessKeyId=key["AccessKeyId"])


def revoke_by_denying_access(s3, faults, key):
    faults.set_rule("access_denied")


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    "revoke,code",
    [
        (
            revoke_by_deleting_the_key,
            r"InvalidAccessKeyId: The AWS Access Key Id you provided does not exist in our records\.",
        ),
        (revoke_by_denying_access, r"AccessDenied: Access Denied"),
    ],
    ids=["key-deleted", "access-denied"],
)
def test_credentials_revoked_mid_epoch_fail_at_once_naming_the_dataset(
    s3, s3_ids_503, faults, revoke, code
):
    """The loader's access key is deleted in the server (or every request answered 403
    AccessDenied) after 3 batches: ``BatchLoadError`` from a ``PermissionError`` naming the
    dataset and the options to check, after 1 attempt of 5, and no retry storm: after the
    revocation the store sees at most the takes in flight (a request per file) and readahead
    failed takes of 3 files x Lance's 4 tries."""
    iam = s3.client("iam")
    key = iam.create_access_key(UserName="loader")["AccessKey"]
    options = through(
        s3,
        faults,
        aws_access_key_id=key["AccessKeyId"],
        aws_secret_access_key=key["SecretAccessKey"],
    )
    try:
        loader = PrefetchLoader(
            Dataset(s3_ids_503, storage_options=options),
            50,
            columns=["id"],
            seed=4,
            readahead=2,
            read=ReadOptions(
                max_in_flight=2,
                coalesce=1,
                retry=RetryPolicy(attempts=5, backoff=0.01, max_backoff=0.02),
            ),
        )
        expected = expected_rank_ids(loader)
        received, error, revoked, _ = read_until_failure(loader, 3, lambda: revoke(s3, faults, key))
        elapsed = time.monotonic() - revoked
    finally:
        keys = iam.list_access_keys(UserName="loader")["AccessKeyMetadata"]
        if key["AccessKeyId"] in [k["AccessKeyId"] for k in keys]:
            iam.delete_access_key(UserName="loader", AccessKeyId=key["AccessKeyId"])
    assert received == expected[: len(received)] and error.position == len(received)
    assert error.attempts == 1
    assert isinstance(error.__cause__, PermissionError)
    uri = "'s3://training/ids503\\.lance'"
    assert re.match(
        rf"^batch {len(received)} of epoch 0 \(50 rows\) from {uri} version 1 failed after 1 "
        rf"attempt \(not retried: PermissionError is not transient\): PermissionError: the "
        rf"endpoint storage_options\['aws_endpoint'\]='http://127\.0\.0\.1:\d+' refused the "
        rf"credentials while reading {uri} \({code}\); they may have been revoked, deactivated or "
        rf"expired since the loader was built, or may not read this object: check "
        rf"storage_options\['aws_access_key_id'\] and \['aws_secret_access_key'\]",
        str(error),
    ), str(error)
    for secret in (key["SecretAccessKey"], s3.secret_access_key):
        assert secret not in full_text(error)
    after = faults.requests(since=revoked)
    # takes in flight at the revocation may still succeed (a request each file); then at most
    # readahead takes fail, each file's range tried 4 times by Lance, none retried by the loader
    bound = loader.read.max_in_flight * FILES + loader.readahead * FILES * LANCE_TRIES
    assert sum(r.status == 403 for r in after) >= LANCE_TRIES  # one range's tries, at least
    assert len(after) <= bound == 30  # a retry of each failed take would add 24
    assert elapsed < 5.0  # moto's 403s: 0.2-0.9 s in all on an idle machine, 3.5 s under load
    measured = f"{len(after)} requests after the revocation (bound {bound}), in {elapsed:.2f} s"
    print(f"\nrevoked: {measured}")  # noqa: T201  (shown with -s)
