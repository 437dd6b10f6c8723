"""The option groups (lance_prefetch.options): each checks itself when built, before any I/O,
the shorthands mean their defaults, and no option is valid only with another's value."""

from __future__ import annotations

import re

import pytest
from support.helpers import batch_ids

from lance_prefetch import (
    Audit,
    Dataset,
    DiskCache,
    HedgePolicy,
    MemoryCache,
    Mixture,
    PrefetchLoader,
    ReadOptions,
    RetryPolicy,
    Shuffle,
)
from lance_prefetch.options import as_audit, as_cache, as_dataset, as_shuffle


@pytest.mark.parametrize(
    ("make", "error", "message"),
    [
        (
            lambda: ReadOptions(max_in_flight=0),
            ValueError,
            "max_in_flight should be an integer >= 1, but got max_in_flight=0",
        ),
        (
            lambda: ReadOptions(max_in_flight=2.0),
            TypeError,
            "max_in_flight should be an integer or 'auto', but got max_in_flight=2.0 (float)",
        ),
        (
            lambda: ReadOptions(max_buffer_bytes=0),
            ValueError,
            "max_buffer_bytes should be an integer >= 1, but got max_buffer_bytes=0",
        ),
        (
            lambda: ReadOptions(io="fast"),
            ValueError,
            "io should be 'auto' (io_uring for local files where the kernel allows it, else "
            "Lance's reader), 'default' (Lance's reader) or 'uring' (its io_uring reader, local "
            "files only), but got io='fast'",
        ),
        (lambda: ReadOptions(io=None), TypeError, "io should be a string, but got io=None"),
        (
            lambda: ReadOptions(retry=3),
            TypeError,
            "retry should be a lance_prefetch.RetryPolicy or None, but got retry=3",
        ),
        (
            lambda: Shuffle(permutation="random"),
            ValueError,
            "permutation should be one of 'auto', 'array', 'lazy', but got permutation='random'",
        ),
        (
            lambda: Dataset(3),
            TypeError,
            "Dataset: uri should be a dataset URI (str or os.PathLike) or a lance.LanceDataset, "
            "but got int",
        ),
        (
            lambda: Dataset("a.lance", version=0),
            ValueError,
            "version should be an integer >= 1, but got version=0",
        ),
        (
            lambda: Dataset("a.lance", storage_options={"region": 1}),
            TypeError,
            "storage_options should be a dict of str to str, but got a mapping with keys "
            "['region']",
        ),
        (
            lambda: ReadOptions(release_memory=1),
            TypeError,
            "release_memory should be True or False, but got release_memory=1",
        ),
        (
            lambda: MemoryCache(max_bytes=0),
            ValueError,
            "max_bytes should be an integer >= 1, but got max_bytes=0",
        ),
        (
            lambda: Audit(dir=""),
            ValueError,
            "Audit: dir should be a folder (created if missing), but got dir=''; pass a folder "
            "this process can write",
        ),
        (
            lambda: as_shuffle("yes"),
            TypeError,
            "shuffle should be True, False or a lance_prefetch.options.Shuffle, but got "
            "shuffle='yes'",
        ),
        (
            lambda: as_dataset(3, name="source[2]"),
            TypeError,
            "source[2] should be a dataset URI (str or os.PathLike), a lance.LanceDataset or a "
            "lance_prefetch.options.Dataset, but got int",
        ),
    ],
)
def test_each_group_checks_itself_when_built(make, error, message):
    with pytest.raises(error) as info:
        make()
    assert str(info.value) == message


@pytest.mark.parametrize("option", [DiskCache, Audit])
def test_a_dir_option_expands_the_home_before_its_check(option, monkeypatch, tmp_path):
    """``dir`` of DiskCache and Audit: ``~`` is the home, also in the check, so a file there is
    refused when the option is built (not when the folder is first written), by its full path."""
    monkeypatch.setenv("HOME", str(tmp_path))
    assert option(dir="~/records") == option(dir=str(tmp_path / "records"))
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError) as info:
        option(dir="~/file/records")
    assert str(info.value) == (
        f"{option.__name__}: dir should be a folder (created if missing), but got "
        f"dir='{tmp_path}/file/records', below '{tmp_path}/file', which is not a folder; pass a "
        f"folder this process can write"
    )


def test_the_loader_checks_the_kind_of_each_group_before_any_io(tmp_path):
    missing = tmp_path / "missing.lance"
    with pytest.raises(TypeError, match=r"^read should be a lance_prefetch\.options\.ReadOptions"):
        PrefetchLoader(missing, 4, read={"max_in_flight": 2})
    with pytest.raises(TypeError, match=r"^shuffle should be True, False or a lance_prefetch"):
        PrefetchLoader(missing, 4, shuffle=1)
    with pytest.raises(TypeError, match=r"^audit should be True, False or a lance_prefetch"):
        PrefetchLoader(missing, 4, audit="yes")
    with pytest.raises(TypeError, match=re.escape("source should be a dataset URI")):
        PrefetchLoader(3, 4)


def test_the_shorthands_are_the_groups_defaults():
    assert as_cache("memory") == MemoryCache() and as_cache("disk") == DiskCache()
    assert as_cache(None) is None
    assert as_audit(True) == Audit() and as_audit(False) is None
    assert as_shuffle(True) == Shuffle() and as_shuffle(False) is None
    assert as_dataset("a.lance") == Dataset("a.lance")
    assert ReadOptions() == ReadOptions(
        max_in_flight="auto",
        coalesce="auto",
        max_buffer_bytes=256 << 20,
        io="auto",
        retry=RetryPolicy(),
        hedge="auto",
    )
    assert ReadOptions(hedge=None).hedge is None
    assert ReadOptions(hedge=HedgePolicy()).hedge == HedgePolicy()


def test_groups_are_frozen_and_normalised(tmp_path):
    options = ReadOptions(max_in_flight=2)
    with pytest.raises(AttributeError):
        options.max_in_flight = 3  # type: ignore[misc]
    assert DiskCache(dir=tmp_path).dir == str(tmp_path)  # a str, for pickling and messages
    assert Dataset("a.lance", storage_options={"region": "x"}).storage_options == {"region": "x"}


def test_a_shuffle_object_and_true_read_the_same_epochs(ids_1003):
    plain = PrefetchLoader(ids_1003, 10, columns=["id"], seed=4)
    grouped = PrefetchLoader(ids_1003, 10, columns=["id"], seed=4, shuffle=Shuffle())
    lazy = PrefetchLoader(ids_1003, 10, columns=["id"], seed=4, shuffle=Shuffle("lazy"))
    assert (plain.permutation, grouped.permutation, lazy.permutation) == ("array", "array", "lazy")
    assert batch_ids(plain) == batch_ids(grouped)
    rows = sum(batch_ids(lazy), [])
    assert len(rows) == len(set(rows)) == 1000  # another order, the same guarantees
    assert rows != sum(batch_ids(plain), [])


def test_take_sizes_and_concurrency_are_bounded_by_readahead(ids_1003):
    """max_in_flight and coalesce above an int readahead mean readahead: no pair of values is
    refused, and the iteration never holds more than readahead batches."""
    loader = PrefetchLoader(
        ids_1003, 10, columns=["id"], readahead=2, read=ReadOptions(max_in_flight=8, coalesce=9)
    )
    assert loader.coalesce == 2
    assert loader.config.max_in_flight == 2
    iterator = iter(loader)
    next(iterator)
    stats = loader.stats()
    assert (stats.readahead, stats.max_in_flight) == (2, 2)
    assert len(batch_ids(iterator)) == 99


def test_a_rank_given_alone_takes_the_detected_world_size(ids_1003, monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "4")
    loader = PrefetchLoader(ids_1003, 10, columns=["id"], rank=3)
    assert (loader.rank, loader.world_size, len(loader)) == (3, 4, 25)
    sized = PrefetchLoader(ids_1003, 10, columns=["id"], world_size=2)
    assert (sized.rank, sized.world_size, len(sized)) == (0, 2, 50)
    with pytest.raises(ValueError) as info:
        PrefetchLoader(ids_1003, 10, columns=["id"], world_size=1)  # RANK=0 is fine
        PrefetchLoader(ids_1003, 10, columns=["id"], rank=4)
    assert str(info.value) == (
        "rank should be < world_size, but rank=4 and world_size=4 (rank given, world_size "
        "detected from the process group or RANK/WORLD_SIZE); pass both rank= and world_size=, "
        "or neither"
    )


def test_the_loader_shows_its_groups(ids_1003, tmp_path):
    loader = PrefetchLoader(
        ids_1003,
        10,
        read=ReadOptions(max_in_flight=2),
        cache=DiskCache(dir=tmp_path),
        audit=True,
    )
    assert loader.read == ReadOptions(max_in_flight=2)
    assert loader.cache == DiskCache(dir=str(tmp_path))
    assert loader.audit == Audit()
    assert PrefetchLoader(ids_1003, 10).cache is None
    assert PrefetchLoader(ids_1003, 10, cache="memory").cache == MemoryCache()


def test_a_dataset_prints_its_secrets_hidden_wherever_it_is_shown(tmp_path):
    secret = {"aws_secret_access_key": "hunter2", "aws_endpoint": "http://127.0.0.1:9000"}
    dataset = Dataset("s3://bucket/d.lance", version=3, storage_options=secret)
    assert repr(dataset) == (
        "Dataset(uri='s3://bucket/d.lance', version=3, storage_options="
        "{'aws_secret_access_key': '***', 'aws_endpoint': 'http://127.0.0.1:9000'})"
    )
    assert "hunter2" not in repr(Mixture([dataset, dataset], weights=[1, 1]))
    with pytest.raises(TypeError) as info:  # a group where another is expected, echoed
        PrefetchLoader(tmp_path / "missing.lance", 4, audit=dataset)
    assert "hunter2" not in str(info.value) and "'***'" in str(info.value)
    assert hash(dataset) == hash(Dataset("s3://bucket/d.lance", version=3))  # frozen, hashable


@pytest.mark.parametrize(
    ("make", "error", "message"),
    [
        (
            lambda: Mixture(["a.lance", "b.lance"], weights=None),
            TypeError,
            "Mixture: weights should be a list of numbers, one per dataset, but got None; e.g. "
            "Mixture([uri_a, uri_b], weights=[0.7, 0.3]), or a plain list of datasets to read "
            "them whole, one after the other",
        ),
        (
            lambda: Dataset("a.lance", version=""),
            ValueError,
            "version should be a version number >= 1 or a tag, but got version=''; pass None for "
            "the latest version",
        ),
        (
            lambda: Dataset(""),
            ValueError,
            "Dataset: uri should be a dataset URI or path, but got ''",
        ),
        (
            lambda: PrefetchLoader("/nonexistent.lance", 4, device=True),
            TypeError,
            "device should be a str such as 'cuda' or 'cuda:1', an int or a torch.device, but got "
            "bool",
        ),
        (
            lambda: PrefetchLoader("/nonexistent.lance", 4, device=-1),
            ValueError,
            "device should be an accelerator index >= 0, but got device=-1; e.g. device=0 or "
            "device='cuda:0'",
        ),
    ],
)
def test_more_wrong_arguments_are_refused_before_any_io(make, error, message):
    with pytest.raises(error) as info:
        make()
    assert str(info.value) == message


def test_a_wrong_rank_environment_is_named_as_the_environment(ids_25, monkeypatch):
    monkeypatch.setenv("RANK", "5")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError) as info:
        PrefetchLoader(ids_25, 5, rank=0)
    assert str(info.value).startswith(
        "the environment variables RANK=5 and WORLD_SIZE=2 are not a rank of a world (Invalid "
        "rank 5"
    )
    assert str(info.value).endswith("; fix them, or pass rank= and world_size= explicitly")
    assert PrefetchLoader(ids_25, 5, rank=0, world_size=1).world_size == 1  # both given: kept


def test_every_item_of_a_list_source_is_checked_before_any_is_opened(ids_25, tmp_path):
    missing = str(tmp_path / "missing.lance")
    with pytest.raises(TypeError, match=r"^source\[1\] should be a dataset URI"):
        PrefetchLoader([missing, 5], 4)  # the missing path is never opened
    with pytest.raises(FileNotFoundError) as info:
        PrefetchLoader(Mixture([ids_25, missing], weights=[1, 1]), 4)
    assert str(info.value).startswith(f"source[1]: no Lance dataset at {missing!r}")
