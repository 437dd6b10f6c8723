"""Tests for lance_prefetch.sources._lance: pinning, projection, take by offset, pickling."""

from __future__ import annotations

import pickle
import traceback

import lance
import numpy as np
import pyarrow as pa
import pytest

from lance_prefetch.sources._lance import LanceSource, redact
from lance_prefetch.sources._options import SourceOptions


def test_take_returns_rows_in_the_requested_order_across_fragments(ids_1003):
    source = LanceSource(ids_1003, SourceOptions(columns=["id", "vector"]))
    indices = np.array([1002, 0, 299, 300, 601, 5, 5], dtype=np.uint16)  # 4 fragments, a repeat
    table = source.take(indices)
    assert table.column("id").to_pylist() == [1002, 0, 299, 300, 601, 5, 5]
    assert table.column_names == ["id", "vector"]
    assert table.column("vector").to_pylist()[1] == [0.0, 0.0, 0.0]
    assert table.column("vector").to_pylist()[0] == [1002.0, 2004.0, 3006.0]


def test_out_of_range_offsets_are_refused_before_reading(ids_25):
    """Lance would silently drop offset 25; the source refuses the whole batch."""
    source = LanceSource(ids_25)
    with pytest.raises(
        IndexError, match=r"^row offsets must be in \[0, 25\) for .* but got min 3, max 25$"
    ):
        source.take(np.array([3, 25]))


def test_version_is_pinned_at_construction(fresh_ids):
    uri = fresh_ids(10)
    source = LanceSource(uri)
    lance.write_dataset(
        pa.table({"id": [99], "vector": source.take(np.array([0])).column("vector"), "label": [9]}),
        uri,
        mode="append",
    )
    fresh = pickle.loads(pickle.dumps(source))  # reopens by URI + pinned version
    assert source.version == fresh.version == 1 and fresh.num_rows == 10
    assert fresh.take(np.arange(10)).column("id").to_pylist() == list(range(10))
    assert LanceSource(uri).num_rows == 11
    assert LanceSource(uri, SourceOptions(version=1)).num_rows == 10


def test_offsets_address_live_rows_after_deletes(fresh_ids):
    uri = fresh_ids(10)
    lance.dataset(uri).delete("id >= 3 AND id <= 5")
    source = LanceSource(uri, SourceOptions(columns=["id"]))
    assert source.num_rows == 7
    assert source.take(np.arange(7)).column("id").to_pylist() == [0, 1, 2, 6, 7, 8, 9]


def test_open_dataset_and_tag(fresh_ids):
    uri = fresh_ids(5)
    dataset = lance.dataset(uri)
    dataset.tags.create("v1", 1)
    assert LanceSource(dataset).version == 1
    assert LanceSource(uri, SourceOptions(version="v1")).version == 1


def test_pickles_small_without_the_open_dataset(ids_1003):
    source = LanceSource(ids_1003, SourceOptions(storage_options={"region": "x"}))
    data = pickle.dumps(source)
    assert len(data) < 1500
    clone = pickle.loads(data)
    assert clone._dataset is None  # opened lazily, on first take
    assert clone.take(np.array([7])).column("id").to_pylist() == [7]


def test_missing_dataset(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"^source: no Lance dataset at '.*nothing.lance'"):
        LanceSource(tmp_path / "nothing.lance")


def test_directory_that_is_not_a_dataset(tmp_path):
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "file.txt").write_text("hello")
    with pytest.raises(FileNotFoundError, match=r"^source: no Lance dataset at"):
        LanceSource(tmp_path / "plain")


def test_missing_version(ids_25):
    with pytest.raises(
        ValueError, match=r"^version=7 does not exist in '.*'; its latest version is 1$"
    ):
        LanceSource(ids_25, SourceOptions(version=7))


@pytest.mark.parametrize(
    "columns,error,message",
    [
        (
            ["id", "nope"],
            ValueError,
            r"^columns \['nope'\] are not in the dataset .* its columns are \['id', 'vector', 'label'\]$",
        ),
        ("id", TypeError, r"^columns should be a list of column names, but got columns='id'$"),
        ([], ValueError, r"^columns should name at least one column"),
        (["id", "id"], ValueError, r"^columns should not repeat a name"),
    ],
)
def test_bad_columns(ids_25, columns, error, message):
    with pytest.raises(error, match=message):
        LanceSource(ids_25, SourceOptions(columns=columns))


def test_bad_source_and_storage_options(ids_25):
    with pytest.raises(TypeError, match=r"^source should be a dataset URI .* but got int$"):
        LanceSource(42)
    with pytest.raises(TypeError, match=r"keys \['aws_secret_access_key'\]$") as info:
        LanceSource(ids_25, SourceOptions(storage_options={"aws_secret_access_key": 123}))
    assert "123" not in str(info.value)


def test_repr_and_redact_hide_secrets(ids_25):
    options = {
        "aws_access_key_id": "AKIA1",
        "aws_secret_access_key": "s3cr3t",
        "aws_session_token": "tok",
        "aws_endpoint": "http://127.0.0.1:9000",
    }
    text = repr(LanceSource(ids_25, SourceOptions(storage_options=options)))
    for secret in ("AKIA1", "s3cr3t", "tok'"):
        assert secret not in text
    assert "http://127.0.0.1:9000" in text
    assert redact(options) == {
        "aws_access_key_id": "***",
        "aws_secret_access_key": "***",
        "aws_session_token": "***",
        "aws_endpoint": "http://127.0.0.1:9000",
    }


def test_redact_masks_every_secret_looking_spelling():
    options = {
        "apikey": "a",
        "privateKey": "b",
        "awsAccessKeyId": "c",
        "authorization": "d",
        "azure_storage_sas_token": "e",
        "region": "us-east-1",
    }
    assert redact(options) == {k: "***" for k in options if k != "region"} | {"region": "us-east-1"}


QUOTING = {
    "aws_access_key_id": "AKIAQUOTED",
    "aws_secret_access_key": "s3cr3t-value",
    "aws_region": "us-east-1",
}


class _QuotingDataset:
    """Stands in for an open dataset whose take fails with a message that quotes a credential."""

    def take(self, indices, columns):
        raise ValueError("signing with s3cr3t-value for AKIAQUOTED failed")


def test_a_read_error_quoting_a_secret_is_re_raised_without_it(ids_25, monkeypatch):
    source = LanceSource(ids_25, SourceOptions(columns=["id"], storage_options=QUOTING))
    monkeypatch.setattr(source, "_dataset", _QuotingDataset())
    with pytest.raises(ValueError, match=r"^signing with \*\*\* for \*\*\* failed$") as info:
        source.take(np.array([1]))
    text = "".join(traceback.format_exception(info.value))
    assert "s3cr3t-value" not in text and "AKIAQUOTED" not in text


@pytest.mark.parametrize(
    "lance_message,error,message",
    [
        (
            "Server returned non-2xx status code: 403 Forbidden: <AWSAccessKeyId>AKIAQUOTED</AWSAccessKeyId>",
            PermissionError,
            r"^source: the object store refused the credentials for 's3://b/d\.lance' \(LanceError",
        ),
        (
            "Invalid value for storage option 'x': 's3cr3t-value'",
            ValueError,
            r"^LanceError\(IO\): Invalid value for storage option 'x': '\*\*\*'$",
        ),
    ],
)
def test_an_open_error_quoting_a_secret_is_raised_without_it(
    monkeypatch, lance_message, error, message
):
    def failing_open(uri, **kwargs):
        raise ValueError(f"LanceError(IO): {lance_message}")

    monkeypatch.setattr(lance, "dataset", failing_open)
    with pytest.raises(error, match=message) as info:
        LanceSource("s3://b/d.lance", SourceOptions(storage_options=QUOTING))
    text = "".join(traceback.format_exception(info.value))
    assert "s3cr3t-value" not in text and "AKIAQUOTED" not in text
