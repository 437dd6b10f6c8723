"""io="uring": Lance's io_uring reader gives exactly the rows of the default reader; bad values are
refused before any I/O; a kernel that refuses io_uring falls back with a warning."""

from __future__ import annotations

import pickle
import warnings

import lance
import numpy as np
import pytest
from conftest import write_ids
from support.helpers import expected_rank_ids

from lance_prefetch import LanceMapDataset, PrefetchLoader, ReadOptions
from lance_prefetch.sources import _lance as source_module
from lance_prefetch.sources._lance import LanceSource
from lance_prefetch.sources._options import SourceOptions
from lance_prefetch.sources._uris import uring_uri


def epoch(loader) -> list[dict[str, list]]:
    return [{name: tensor.tolist() for name, tensor in batch.items()} for batch in loader]


def test_uring_reads_exactly_the_rows_of_the_default_reader(ids_1003):
    default = PrefetchLoader(ids_1003, 64, seed=3, drop_last=False, read=ReadOptions(io="default"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback on this machine
        uring = PrefetchLoader(ids_1003, 64, seed=3, drop_last=False, read=ReadOptions(io="uring"))
    assert (default.io, uring.io) == ("default", "uring")
    assert uring._source._read_uri == "file+uring://" + ids_1003
    for _ in range(2):  # two epochs: each a new permutation
        got = epoch(uring)
        assert got == epoch(default)
        assert [batch["id"] for batch in got] == expected_rank_ids(uring)
        assert all(
            batch["vector"] == [[i * 1.0, i * 2.0, i * 3.0] for i in batch["id"]] for batch in got
        )
        assert sorted(i for batch in got for i in batch["id"]) == list(range(1003))


def test_a_file_uring_uri_selects_uring_and_is_kept_as_given(ids_1003):
    uri = "file+uring://" + ids_1003
    loader = PrefetchLoader(uri, 100, columns=["id"], seed=1)
    assert (loader.io, loader.uri, loader.num_rows) == ("uring", uri, 1003)
    assert [batch["id"].tolist() for batch in loader] == expected_rank_ids(loader)


def test_the_map_dataset_reads_through_uring_too(ids_1003):
    offsets = [1002, 0, 517, 3, 3]
    default = LanceMapDataset(ids_1003, columns=["id", "label"])
    uring = LanceMapDataset(ids_1003, columns=["id", "label"], io="uring")
    assert uring.io == "uring"
    got = uring.__getitems__(offsets).data
    assert got["id"].tolist() == offsets and got["label"].tolist() == [2, 0, 7, 3, 3]
    assert default.__getitems__(offsets).data["id"].tolist() == offsets


def test_a_copy_for_a_worker_reopens_through_uring(ids_1003):
    source = LanceSource(ids_1003, SourceOptions(columns=["id"], io="uring"))
    copy = pickle.loads(pickle.dumps(source))
    assert copy._dataset is None and copy.io == "uring"
    assert copy.take(np.array([5, 1000, 7])).column("id").to_pylist() == [5, 1000, 7]
    assert copy._dataset.uri.startswith("file+uring://")


def test_uring_uri_rules(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert uring_uri("/data/x.lance") == "file+uring:///data/x.lance"
    assert uring_uri("file:///data/x.lance") == "file+uring:///data/x.lance"
    assert uring_uri("file+uring:///data/x.lance") == "file+uring:///data/x.lance"
    assert uring_uri("rel.lance") == f"file+uring://{tmp_path}/rel.lance"
    with pytest.raises(ValueError, match=r"io='uring' reads local files only.*s3://"):
        uring_uri("s3://bucket/train.lance")


@pytest.mark.parametrize(
    "io,error,message",
    [
        (
            "fast",
            ValueError,
            r"io should be 'auto' .*, 'default' .* or 'uring' .*, but got io='fast'",
        ),
        ("URING", ValueError, r"but got io='URING'"),
        (1, TypeError, r"^io should be a string, but got io=1$"),
        (None, TypeError, r"^io should be a string, but got io=None$"),
        (b"uring", TypeError, r"but got io=b'uring'"),
    ],
)
def test_bad_io_values_are_refused_before_any_io(io, error, message):
    with pytest.raises(error, match=message):
        PrefetchLoader("/nonexistent/never/opened.lance", 4, read=ReadOptions(io=io))


def test_uring_on_an_object_store_is_refused_before_any_io():
    # no endpoint is contacted: this would otherwise try to reach AWS
    with pytest.raises(ValueError, match=r"io='uring' reads local files only.*use io='default'"):
        PrefetchLoader("s3://bucket/train.lance", 4, read=ReadOptions(io="uring"))
    with pytest.raises(ValueError, match=r"io='uring' reads local files only"):
        LanceMapDataset("s3://bucket/train.lance", io="uring")


def refuse_uring(monkeypatch) -> None:
    """Make every open of a file+uring:// URI fail as a kernel refusing io_uring does."""
    opened = lance.dataset

    def refusing(uri, *args, **kwargs):
        if str(uri).startswith("file+uring://"):
            raise OSError("LanceError(IO): io_uring_setup: Operation not permitted (os error 1)")
        return opened(uri, *args, **kwargs)

    monkeypatch.setattr(source_module.lance, "dataset", refusing)


def test_a_kernel_refusing_io_uring_falls_back_with_a_warning(ids_1003, monkeypatch):
    refuse_uring(monkeypatch)
    with pytest.warns(RuntimeWarning, match=r"io='uring'.*Operation not permitted.*default reader"):
        loader = PrefetchLoader(ids_1003, 100, columns=["id"], seed=5, read=ReadOptions(io="uring"))
    assert loader.io == "default" and loader._source._read_uri == ids_1003
    assert [batch["id"].tolist() for batch in loader] == expected_rank_ids(loader)
    copy = pickle.loads(pickle.dumps(loader._source))  # workers use the default reader too
    assert copy.take(np.array([9])).column("id").to_pylist() == [9]


def test_io_default_contradicting_a_file_uring_uri_is_refused(ids_1003):
    with pytest.raises(ValueError, match=r"io='default' contradicts the URI .*file\+uring://"):
        PrefetchLoader("file+uring://" + ids_1003, 100, read=ReadOptions(io="default"))
    assert PrefetchLoader(ids_1003, 100, read=ReadOptions(io="default")).io == "default"
    assert (
        PrefetchLoader("file+uring://" + ids_1003, 100, read=ReadOptions(io="uring")).io == "uring"
    )


def test_io_auto_is_the_default_uring_for_local_files_default_on_object_stores(ids_1003):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # io_uring works on this machine: no fallback
        loader = PrefetchLoader(ids_1003, 100, read=ReadOptions(io="auto"))
        assert (loader.io, loader._source._read_uri) == ("uring", "file+uring://" + ids_1003)
        assert PrefetchLoader(ids_1003, 100).io == "uring"
        assert LanceMapDataset(ids_1003).io == "uring"
    assert SourceOptions().io == SourceOptions(io=None).io == "auto"
    with pytest.raises(ValueError, match=r"io='uring' reads local files only"):
        PrefetchLoader(
            "s3://bucket/train.lance", 4, read=ReadOptions(io="uring")
        )  # no I/O: refused first


def test_io_auto_falls_back_to_the_default_reader_without_a_warning(ids_1003, monkeypatch, caplog):
    refuse_uring(monkeypatch)
    with warnings.catch_warnings(), caplog.at_level("DEBUG", logger="lance_prefetch.source"):
        warnings.simplefilter("error")
        loader = PrefetchLoader(ids_1003, 100, columns=["id"], seed=5)
    assert loader.io == "default" and loader._source._read_uri == ids_1003
    assert "io_uring failed" in caplog.text and "Operation not permitted" in caplog.text
    assert [batch["id"].tolist() for batch in loader] == expected_rank_ids(loader)


def test_a_missing_dataset_with_uring_is_the_usual_error_without_a_warning(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(FileNotFoundError, match="no Lance dataset at"):
            PrefetchLoader(str(tmp_path / "missing.lance"), 4, read=ReadOptions(io="uring"))
        with pytest.raises(FileNotFoundError, match="no Lance dataset at"):
            PrefetchLoader("file+uring://" + str(tmp_path / "missing.lance"), 4)


def test_a_path_with_percent_signs_reads_that_dataset(tmp_path):
    """'%41' in a path is not decoded to 'A' on the way to the io_uring reader."""
    write_ids(tmp_path / "A.lance", 10)
    uri = write_ids(tmp_path / "%41 x%.lance", 30)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loader = PrefetchLoader(uri, 10, columns=["id"], read=ReadOptions(io="uring"))
    assert loader.io == "uring"
    assert sorted(i for batch in loader for i in batch["id"].tolist()) == list(range(30))
