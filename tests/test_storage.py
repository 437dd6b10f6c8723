"""Tests for lance_prefetch.sources._storage: secret handling, S3 option checks, the endpoint probe and the
explanation of Lance's open and read errors (Lance's messages as pylance 14 words them; no server
needed)."""

from __future__ import annotations

import pytest
from support.s3server import SilentServer, closed_port

from lance_prefetch.sources._storage import (
    check_s3_options,
    explain_missing_files,
    explain_open_error,
    explain_read_error,
    explain_refused_read,
    is_s3,
    probe_endpoint,
    redact,
    scrub,
)

SECRETS = {
    "aws_access_key_id": "AKIAEXAMPLE",
    "aws_secret_access_key": "s3cr3t/with+chars",
    "aws_session_token": "FQoGtok",
    "aws_endpoint": "http://127.0.0.1:9000",
    "aws_region": "us-east-1",
    "allow_http": "true",
}
URI = "s3://bucket/data.lance"

# Lance's messages (pylance 14.0.2), with the XML S3-compatible servers send.
NO_SUCH_BUCKET = (
    "LanceError(IO): Generic S3 error: Error performing list request: Error performing GET "
    "http://127.0.0.1:9000/bucket?list-type=2&prefix=data.lance%2F_versions%2F in 4.6ms - Server "
    'returned non-2xx status code: 404 Not Found: <?xml version="1.0" encoding="utf-8"?>\n'
    "<Error><Code>NoSuchBucket</Code><Message>The specified bucket does not exist</Message>"
    "<BucketName>bucket</BucketName></Error>, /home/runner/work/lance/rust/lance-io/src/object_store.rs:1576:42"
)
BAD_SIGNATURE = (
    "LanceError(IO): Generic S3 error: Error performing list request: Error performing GET "
    "http://127.0.0.1:9000/bucket?list-type=2 in 6.5ms - Server returned non-2xx status code: 403 "
    "Forbidden: <Error><Code>SignatureDoesNotMatch</Code><Message>The request signature we "
    "calculated does not match the signature you provided.</Message><AWSAccessKeyId>AKIAEXAMPLE"
    "</AWSAccessKeyId></Error>, /home/runner/work/lance/rust/lance-io/src/object_store.rs:1576:42"
)
REFUSED = (
    "LanceError(IO): Generic S3 error: Error performing list request: Error performing GET "
    "http://127.0.0.1:9000/bucket?list-type=2&prefix=data.lance%2F_versions%2F in 459ms, after 3 "
    "retries, max_retries: 3, retry_timeout: 180s  - HTTP error: error sending request, "
    "/home/runner/work/lance/rust/lance-io/src/object_store.rs:1576:42"
)
NO_DATASET = (
    "Dataset at path data.lance was not found: Not found: data.lance/_versions, "
    "/home/runner/work/lance/rust/lance-table/src/io/commit.rs:653:26"
)
# A take after the access key was deleted (moto's answer; S3 words it the same).
READ_REVOKED = (
    "LanceError(IO): Generic N/A error: LanceError(IO): The operation lacked the necessary "
    "privileges to complete for path data.lance/data/1100.lance: Error performing GET "
    "http://127.0.0.1:9000/bucket/data.lance/data/1100.lance in 56.7ms - Server returned non-2xx "
    'status code: 403 Forbidden: <?xml version="1.0" encoding="utf-8"?>\n<Error><Code>'
    "InvalidAccessKeyId</Code><Message>The AWS Access Key Id you provided does not exist in our "
    "records.</Message></Error>, /home/runner/work/lance/rust/lance-io/src/object_reader.rs:335:56"
)
READ_SLOW_DOWN = (
    "LanceError(IO): Generic N/A error: LanceError(IO): Generic S3 error: Error performing GET "
    "http://127.0.0.1:9000/bucket/data.lance/data/1100.lance in 403.2ms - Server returned non-2xx "
    "status code: 503 Service Unavailable: <Error><Code>SlowDown</Code></Error>"
)
NO_CREDENTIALS = (
    "LanceError(IO): Generic N/A error: LanceError(IO): Failed to get AWS credentials: "
    "ProviderError(...), /home/runner/work/lance/rust/lance-io/src/object_store/providers/aws.rs:630:30"
)


def test_redact_and_scrub_hide_every_secret_value():
    assert redact(SECRETS) == {
        **SECRETS,
        "aws_access_key_id": "***",
        "aws_secret_access_key": "***",
        "aws_session_token": "***",
    }
    text = "key AKIAEXAMPLE secret s3cr3t/with+chars token FQoGtok at http://127.0.0.1:9000"
    assert scrub(text, SECRETS) == "key *** secret *** token *** at http://127.0.0.1:9000"
    assert scrub(text, None) == text
    assert scrub("nothing here", {"aws_secret_access_key": ""}) == "nothing here"


@pytest.mark.parametrize(
    "uri,expected",
    [
        ("s3://b/p", True),
        ("S3://b/p", True),
        ("s3a://b/p", True),
        ("s3+ddb://b/p?ddbTableName=t", True),
        ("gs://b/p", False),
        ("/tmp/data.lance", False),
        ("file:///tmp/x", False),
        ("data.lance", False),
    ],
)
def test_is_s3(uri, expected):
    assert is_s3(uri) is expected


def test_s3_options_that_pass_return_the_endpoint(monkeypatch):
    monkeypatch.delenv("AWS_ALLOW_HTTP", raising=False)
    assert check_s3_options(None) is None
    assert check_s3_options({"aws_region": "us-east-1"}) is None  # AWS's own endpoints
    assert check_s3_options(SECRETS) == ("aws_endpoint", "http://127.0.0.1:9000")
    https = {"endpoint": "https://minio.example.com"}
    assert check_s3_options(https) == ("endpoint", "https://minio.example.com")
    assert check_s3_options({"endpoint_url": "http://h:1", "aws_allow_http": "1"}) == (
        "endpoint_url",
        "http://h:1",
    )
    monkeypatch.setenv("AWS_ALLOW_HTTP", "true")
    assert check_s3_options({"aws_endpoint_url": "http://h:1"}) == (
        "aws_endpoint_url",
        "http://h:1",
    )


@pytest.mark.parametrize(
    "options,message",
    [
        (
            {"aws_endpoint": "http://127.0.0.1:9000"},
            r"^storage_options\['aws_endpoint'\]='http://127\.0\.0\.1:9000' is plain http, which Lance refuses unless allowed: add storage_options\['allow_http'\]='true' \(or use https\)$",
        ),
        (
            {"aws_endpoint": "http://h:1", "allow_http": "false"},
            r"is plain http, which Lance refuses unless allowed",
        ),
        (
            {"endpoint": "minio:9000"},
            r"^storage_options\['endpoint'\] should be an http:// or https:// URL with a host, like 'https://minio\.example\.com:9000', but got 'minio:9000'$",
        ),
        ({"aws_endpoint": "ftp://h"}, r"should be an http:// or https:// URL with a host"),
        ({"aws_endpoint": "http://"}, r"should be an http:// or https:// URL with a host"),
    ],
)
def test_s3_options_that_cannot_work_are_refused(monkeypatch, options, message):
    monkeypatch.delenv("AWS_ALLOW_HTTP", raising=False)
    with pytest.raises(ValueError, match=message):
        check_s3_options(options)


def test_probe_refused_port_fails_at_once():
    endpoint = f"http://127.0.0.1:{closed_port()}"
    with pytest.raises(
        ConnectionError,
        match=r"^storage_options\['aws_endpoint'\]='http://127\.0\.0\.1:\d+' is not reachable: "
        r"nothing accepts connections at 127\.0\.0\.1:\d+ \(connection refused\); check the host, "
        r"port and scheme of the S3-compatible endpoint for 's3://bucket/data\.lance', and that "
        r"its server is running$",
    ):
        probe_endpoint("aws_endpoint", endpoint, URI, None)


def test_probe_waits_at_most_connect_timeout_and_skips_behind_a_proxy(monkeypatch):
    for name in (
        "http_proxy",
        "https_proxy",
        "all_proxy",
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "ALL_PROXY",
    ):
        monkeypatch.delenv(name, raising=False)
    with SilentServer() as silent:
        endpoint = f"http://127.0.0.1:{silent.port}"
        with pytest.raises(ConnectionError, match=r"is not reachable: no answer within 0\.3 s;"):
            probe_endpoint("aws_endpoint", endpoint, URI, {"connect_timeout": "300ms"})
        probe_endpoint("aws_endpoint", endpoint, URI, {"proxy_url": "http://127.0.0.1:1"})
        monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:1")
        probe_endpoint("aws_endpoint", endpoint, URI, None)  # returns at once: not probed


@pytest.mark.parametrize(
    "lance_message,error,message",
    [
        (
            NO_SUCH_BUCKET,
            FileNotFoundError,
            r"^source: the bucket 'bucket' of 's3://bucket/data\.lance' does not exist at the endpoint storage_options\['aws_endpoint'\]='http://127\.0\.0\.1:9000'; check the bucket name in source \(or the endpoint, if it points at another server\)$",
        ),
        (
            BAD_SIGNATURE,
            PermissionError,
            r"^source: the endpoint storage_options\['aws_endpoint'\]='http://127\.0\.0\.1:9000' refused the credentials for 's3://bucket/data\.lance' \(SignatureDoesNotMatch: The request signature we calculated does not match the signature you provided\.\); check storage_options\['aws_access_key_id'\] and \['aws_secret_access_key'\] \(and \['aws_session_token'\] for temporary credentials\), and that they may read the bucket$",
        ),
        (
            NO_CREDENTIALS,
            PermissionError,
            r"^source: no AWS credentials were found for 's3://bucket/data\.lance'; pass storage_options\['aws_access_key_id'\] and \['aws_secret_access_key'\]",
        ),
        (
            NO_DATASET,
            FileNotFoundError,
            r"^source: no Lance dataset at 's3://bucket/data\.lance'; check the path",
        ),
        (
            REFUSED,
            ConnectionError,
            r"^source: could not reach the endpoint storage_options\['aws_endpoint'\]='http://127\.0\.0\.1:9000' for 's3://bucket/data\.lance' \(LanceError\(IO\): .* HTTP error: error sending request\); check storage_options\['aws_endpoint'\] \(scheme, host and port\) and, for plain http, storage_options\['allow_http'\]='true'$",
        ),
    ],
    ids=["no-such-bucket", "bad-signature", "no-credentials", "no-dataset", "refused"],
)
def test_lance_open_errors_are_explained_without_secrets(lance_message, error, message):
    explained = explain_open_error(ValueError(lance_message), URI, SECRETS)
    assert type(explained) is error
    with pytest.raises(error, match=message):
        raise explained
    for secret in ("AKIAEXAMPLE", "s3cr3t/with+chars"):
        assert secret not in str(explained)
    assert ".rs:" not in str(explained)  # no Rust source locations


def test_unknown_errors_are_left_to_the_caller():
    assert explain_open_error(ValueError("Invalid value for storage option 'x'"), URI, None) is None
    # a local path: only "not found" is explained, never as an S3 connection problem
    assert explain_open_error(OSError("error sending request"), "/tmp/x.lance", None) is None


def test_a_read_refused_for_its_credentials_is_a_permission_error_naming_the_dataset():
    explained = explain_refused_read(OSError(READ_REVOKED), URI, SECRETS)
    assert type(explained) is PermissionError
    assert str(explained) == (
        "the endpoint storage_options['aws_endpoint']='http://127.0.0.1:9000' refused the "
        "credentials while reading 's3://bucket/data.lance' (InvalidAccessKeyId: The AWS Access "
        "Key Id you provided does not exist in our records.); they may have been revoked, "
        "deactivated or expired since the loader was built, or may not read this object: check "
        "storage_options['aws_access_key_id'] and ['aws_secret_access_key'] (and "
        "['aws_session_token'] for temporary credentials)"
    )
    denied = explain_refused_read(OSError(BAD_SIGNATURE.replace("AKIAEXAMPLE", "k")), URI, SECRETS)
    assert "(SignatureDoesNotMatch: The request signature" in str(denied)
    bare = explain_refused_read(OSError("Generic S3 error: 403 Forbidden"), URI, None)
    assert str(bare).startswith("the object store refused the credentials while reading")


def test_other_read_errors_are_left_as_they_are():
    assert explain_refused_read(OSError(READ_SLOW_DOWN), URI, SECRETS) is None
    assert explain_refused_read(OSError(REFUSED), URI, SECRETS) is None
    # a local dataset: "permission denied" is the file system's, left to Lance's own error
    assert explain_refused_read(OSError("403 Forbidden"), "/tmp/x.lance", None) is None


@pytest.mark.parametrize(
    "message,path",
    [
        (  # a take, a file it had read before (local disk)
            "LanceError(IO): Generic N/A error: Not found: /tmp/a b/data/x.lance/data/0110d4.lance"
            ", /home/runner/work/lance/lance/rust/lance-io/src/object_reader.rs:335:56",
            "data/0110d4.lance",
        ),
        (  # a take opening a file (local disk): the root without its leading "/"
            "Not found: tmp/x.lance/data/0011ff.lance, /home/runner/work/lance/local.rs:273:40",
            "data/0011ff.lance",
        ),
        (  # a scan (pyarrow's ArrowInvalid), a deletion file
            "External error: Not found: tmp/x.lance/_deletions/1-1-169.arrow, local.rs:273:40",
            "_deletions/1-1-169.arrow",
        ),
        ("LanceError(IO): Not found: data/9a.lance", "data/9a.lance"),  # at a bucket's root
    ],
)
def test_a_read_of_files_that_are_gone_names_the_version_the_cause_and_the_fix(message, path):
    explained = explain_missing_files(OSError(message), URI, 7)
    assert type(explained) is FileNotFoundError
    assert str(explained) == (
        f"the files of version 7 of {URI!r} are gone (its {path} was not found): were old "
        "versions cleaned up (cleanup_old_versions) after a newer version was written, or the "
        "files deleted, while the loader read version 7? Rows of another version are never read "
        "instead. Tag the version you train on (dataset.tags.create(name, version)) and pass "
        "Dataset(uri, version=name), so that cleanup keeps it, or build the loader again on the "
        "latest version"
    )


@pytest.mark.parametrize(
    "message",
    [
        NO_DATASET,  # the dataset's manifest: explained when it is opened
        "LanceError(IO): Generic S3 error: 503 Slow Down",
        "Not found: data/notes.txt",  # not a file of a Lance version
    ],
)
def test_other_missing_file_errors_are_left_as_they_are(message):
    assert explain_missing_files(OSError(message), URI, 7) is None


def test_a_read_error_is_explained_by_whichever_rule_matches():
    assert type(explain_read_error(OSError(READ_REVOKED), URI, 7, SECRETS)) is PermissionError
    gone = OSError("LanceError(IO): Not found: data/9a.lance")
    assert type(explain_read_error(gone, URI, 7, SECRETS)) is FileNotFoundError
    assert explain_read_error(OSError(READ_SLOW_DOWN), URI, 7, SECRETS) is None


@pytest.mark.parametrize(
    "uri,options",
    [
        (
            "gs://bucket/data.lance",
            "check storage_options['google_service_account'] (the path of a service account's "
            "JSON key) or ['google_service_account_key'] (the key itself), and that",
        ),
        (
            "az://container/data.lance",
            "check storage_options['azure_storage_account_name'] and "
            "['azure_storage_account_key'] (or ['azure_storage_sas_token']), and that",
        ),
        (
            "s3://bucket/data.lance",
            "check storage_options['aws_access_key_id'] and ['aws_secret_access_key'] (and "
            "['aws_session_token'] for temporary credentials), and that",
        ),
    ],
)
def test_refused_credentials_name_the_options_of_the_uris_object_store(uri, options):
    refused = OSError("<Error><Code>AccessDenied</Code><Message>Access Denied</Message></Error>")
    explained = explain_open_error(refused, uri, None)
    assert type(explained) is PermissionError
    assert options in str(explained)
    assert ("aws_" in str(explained)) == uri.startswith("s3://")
