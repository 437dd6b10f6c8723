"""Reading from a real S3-compatible server on 127.0.0.1 (moto, request signatures checked): exact
rows, credentials only in storage_options (also in spawned workers), clear and fast errors for each
way of getting the location wrong, and no secret value in any repr, message or traceback."""

from __future__ import annotations

import os
import pickle
import re
import time
import traceback
from collections import Counter

import lance
import numpy as np
import pytest
from support.helpers import batch_ids, collect, expected_rank_ids, stopping
from support.s3server import SilentServer, closed_port
from torch.utils.data import DataLoader

from lance_prefetch import BatchLoadError, Dataset, PrefetchLoader, ReadOptions


def full_text(error: BaseException) -> str:
    """Everything a traceback of ``error`` prints, its causes and contexts included."""
    return "".join(traceback.format_exception(error))


def secrets_of(s3, options: dict[str, str]) -> list[str]:
    """The values that must never be printed: the server's real credentials and those passed."""
    values = [s3.access_key_id, s3.secret_access_key]
    values += [v for k, v in options.items() if "key" in k or "token" in k]
    return values


def test_full_epoch_reads_every_row_exactly_once(make_loader, s3, s3_ids_503):
    """One epoch over S3 yields the plan's exact batches: every row once, the right values."""
    loader = make_loader(
        Dataset(s3_ids_503, storage_options=s3.storage_options()),
        10,
        columns=["id", "vector"],
        seed=3,
        drop_last=False,
    )
    assert (loader.num_rows, loader.version, len(loader)) == (503, 1, 51)
    batches = list(loader)
    ids = batch_ids(batches)
    assert ids == expected_rank_ids(loader)
    assert [len(b) for b in ids] == [10] * 50 + [3]
    assert sorted(i for b in ids for i in b) == list(range(503))
    for batch in batches:  # the vector column belongs to the same rows: id * [1, 2, 3]
        expected = batch["id"].numpy()[:, None] * np.array([1, 2, 3], dtype=np.float32)
        np.testing.assert_array_equal(batch["vector"].numpy(), expected)


def test_ranks_split_an_s3_epoch_without_repeats(make_loader, s3, s3_ids_503):
    """Two ranks, drop_last=True: 25 full batches each, 500 distinct rows, the plan's exact ids."""
    streams = []
    for rank in (0, 1):
        loader = make_loader(
            Dataset(s3_ids_503, storage_options=s3.storage_options()),
            10,
            columns=["id"],
            seed=5,
            rank=rank,
            world_size=2,
            readahead=4,
            read=ReadOptions(max_in_flight=2),
        )
        streams.append(collect(loader))
        assert streams[-1] == expected_rank_ids(loader)
    assert [len(s) for s in streams] == [25, 25]
    counts = Counter(i for stream in streams for batch in stream for i in batch)
    assert len(counts) == 500 and max(counts.values()) == 1


def no_aws_environment(batch):
    """A transform that fails in a worker whose environment holds any AWS_* variable."""
    names = sorted(name for name in os.environ if name.startswith("AWS_"))
    if names:
        raise RuntimeError(f"AWS environment variables in the worker: {names}")
    return batch


@pytest.mark.system
@pytest.mark.slow
def test_spawn_workers_read_with_credentials_only_in_storage_options(s3, s3_ids_503, monkeypatch):
    """The credentials travel with the pickled loader: two spawn workers, no AWS_* variable in
    this process or theirs, and the server accepts only signed requests; exact ids."""
    for name in [name for name in os.environ if name.startswith("AWS_")]:
        monkeypatch.delenv(name)
    loader = PrefetchLoader(
        Dataset(s3_ids_503, storage_options=s3.storage_options()),
        10,
        columns=["id"],
        seed=7,
        drop_last=False,
        transform=no_aws_environment,
    )
    # spawn: a forkserver started earlier would hand its workers the environment of then
    assert collect(loader, num_workers=2, context="spawn") == expected_rank_ids(loader)


def _wrong_bucket(s3):
    return "s3://no-such-bucket/ids503.lance", s3.storage_options()


def _missing_dataset(s3):
    return "s3://training/nothing-here.lance", s3.storage_options()


def _closed_port(s3):
    endpoint = f"http://127.0.0.1:{closed_port()}"
    return "s3://training/ids503.lance", s3.storage_options(aws_endpoint=endpoint)


def _wrong_secret(s3):
    wrong = s3.storage_options(aws_secret_access_key="wrong-secret-5aXq")
    return "s3://training/ids503.lance", wrong


def _unknown_key(s3):
    return "s3://training/ids503.lance", s3.storage_options(aws_access_key_id="AKIAUNKNOWN00000")


def _http_not_allowed(s3):
    options = s3.storage_options()
    del options["allow_http"]
    return "s3://training/ids503.lance", options


def _endpoint_without_scheme(s3):
    return "s3://training/ids503.lance", s3.storage_options(aws_endpoint="127.0.0.1:9000")


ENDPOINT = r"storage_options\['aws_endpoint'\]='http://127\.0\.0\.1:\d+'"


@pytest.mark.parametrize(
    "case,error,message,seconds",
    [
        (
            _wrong_bucket,
            FileNotFoundError,
            rf"^source: the bucket 'no-such-bucket' of 's3://no-such-bucket/ids503\.lance' does not exist at the endpoint {ENDPOINT}; check the bucket name in source",
            10,
        ),
        (
            _missing_dataset,
            FileNotFoundError,
            r"^source: no Lance dataset at 's3://training/nothing-here\.lance'; check the path",
            10,
        ),
        (
            _closed_port,
            ConnectionError,
            rf"^{ENDPOINT} is not reachable: nothing accepts connections at 127\.0\.0\.1:\d+ \(connection refused\); check the host, port and scheme",
            1,
        ),
        (
            _wrong_secret,
            PermissionError,
            rf"^source: the endpoint {ENDPOINT} refused the credentials for 's3://training/ids503\.lance' \(SignatureDoesNotMatch: .*\); check storage_options\['aws_access_key_id'\] and \['aws_secret_access_key'\]",
            10,
        ),
        (
            _unknown_key,
            PermissionError,
            r"refused the credentials for 's3://training/ids503\.lance' \(InvalidAccessKeyId: ",
            10,
        ),
        (
            _http_not_allowed,
            ValueError,
            rf"^{ENDPOINT} is plain http, which Lance refuses unless allowed: add storage_options\['allow_http'\]='true' \(or use https\)$",
            0.5,
        ),
        (
            _endpoint_without_scheme,
            ValueError,
            r"^storage_options\['aws_endpoint'\] should be an http:// or https:// URL with a host, like 'https://minio\.example\.com:9000', but got '127\.0\.0\.1:9000'$",
            0.5,
        ),
    ],
    ids=[
        "wrong-bucket",
        "missing-dataset",
        "closed-port",
        "wrong-secret",
        "unknown-key",
        "http-not-allowed",
        "endpoint-without-scheme",
    ],
)
def test_wrong_location_or_credentials_fail_fast_and_clearly(
    s3, s3_ids_503, case, error, message, seconds
):
    """Each mistake raises at construction, within the bound, naming the parameter and the fix,
    with no secret value anywhere in the traceback."""
    uri, options = case(s3)
    start = time.monotonic()
    with pytest.raises(error, match=message) as info:
        PrefetchLoader(Dataset(uri, storage_options=options), 10, columns=["id"])
    assert time.monotonic() - start < seconds
    text = full_text(info.value)
    for secret in secrets_of(s3, options):
        assert secret not in text


def test_hung_endpoint_fails_within_connect_timeout(s3):
    """An endpoint that accepts connections but never answers (Lance alone would retry for
    minutes) fails after the probe's timeout, here the user's own connect_timeout of 1 s."""
    with SilentServer() as silent:
        options = s3.storage_options(
            aws_endpoint=f"http://127.0.0.1:{silent.port}", connect_timeout="1s"
        )
        start = time.monotonic()
        with pytest.raises(
            ConnectionError,
            match=rf"^{ENDPOINT} is not reachable: no answer within 1 s; check the host",
        ) as info:
            PrefetchLoader(Dataset("s3://training/ids503.lance", storage_options=options), 10)
        assert 0.9 < time.monotonic() - start < 3
    for secret in secrets_of(s3, options):
        assert secret not in full_text(info.value)


def test_repr_and_pickle_keep_s3_secrets_hidden(s3, s3_ids_503):
    """repr shows the endpoint and region, never the key id, secret or session token; the options
    survive pickling (that is how workers get them) and the copy's repr hides them too."""
    options = s3.storage_options(aws_session_token="FQoGZXIvYXdzEXAMPLEtoken")
    dataset = lance.dataset(s3_ids_503, storage_options=s3.storage_options())
    loader = PrefetchLoader(Dataset(dataset, storage_options=options), 10, columns=["id"])
    clone = pickle.loads(pickle.dumps(loader))
    assert clone._source._storage_options == options
    for text in (repr(loader), repr(clone), repr(loader._source)):
        for secret in secrets_of(s3, options):
            assert secret not in text
        assert "'aws_access_key_id': '***'" in text
        assert "'aws_secret_access_key': '***'" in text
        assert "'aws_session_token': '***'" in text
        assert f"'aws_endpoint': '{s3.endpoint}'" in text and "'aws_region': 'us-east-1'" in text


@pytest.mark.system
@pytest.mark.slow
def test_a_read_failing_in_a_worker_holds_no_secret(s3, fresh_s3_ids):
    """A worker whose take fails (the data objects are gone) re-raises a BatchLoadError naming the
    batch and the URI; neither it nor the worker's traceback in it holds a credential."""
    uri = fresh_s3_ids(30, rows_per_file=10)
    loader = PrefetchLoader(
        Dataset(uri, storage_options=s3.storage_options()),
        10,
        columns=["id"],
        read=ReadOptions(coalesce=1),
    )  # one take per batch: the error names batch 0
    client = s3.client()
    prefix = uri.removeprefix("s3://training/") + "/data/"
    listed = client.list_objects_v2(Bucket="training", Prefix=prefix)
    assert listed["KeyCount"] == 3
    for item in listed["Contents"]:
        client.delete_object(Bucket="training", Key=item["Key"])
    data = DataLoader(loader, batch_size=None, num_workers=1, multiprocessing_context="spawn")
    with (
        pytest.raises(
            BatchLoadError, match=rf"batch 0 of epoch 0 \(10 rows\) from {re.escape(repr(uri))}"
        ) as info,
        stopping(data) as iterator,
    ):
        list(iterator)
    for secret in secrets_of(s3, s3.storage_options()):
        assert secret not in full_text(info.value)
