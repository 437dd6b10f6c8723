"""The rows of docs/errors.md: for each bad input, the error (type, message, when, how fast) or the
data (exact ids) that the table promises. Rows already proven elsewhere name their test in the
table; the tests here add what those do not check."""

from __future__ import annotations

import ast
import decimal
import functools
import math
import re
import time
import traceback
from contextlib import contextmanager

import lance
import numpy as np
import pyarrow as pa
import pyarrow.dataset as pds
import pyarrow.parquet as pq
import pytest
import torch
from conftest import write_ids
from support.helpers import WORKERS, batch_ids, collect, epoch_sequence, stopping
from torch.utils.data import DataLoader

from lance_prefetch import (
    BatchLoadError,
    Dataset,
    LanceMapDataset,
    Mixture,
    PrefetchLoader,
    ReadOptions,
    Split,
    collate,
)


@contextmanager
def within(seconds: float):
    """Assert that the block (an expected failure included) took less than ``seconds``."""
    start = time.monotonic()
    yield
    elapsed = time.monotonic() - start
    assert elapsed < seconds, f"took {elapsed:.2f} s, expected < {seconds} s"


#: The bound for "at once" (construction errors, the next batch's error): ~10x what they take on
#: the 2-core development machine, so a busy machine does not fail the tests; Lance's own retries
#: (~2 s for a file) are well above it.
AT_ONCE = 1.0


def permutation(num_rows: int, seed: int = 0, epoch: int = 0) -> list[int]:
    """The documented rule (lance_prefetch.plan.sampling, rule 1 and "Seeds"), computed here without
    the library."""
    rows = np.arange(num_rows)
    np.random.Generator(np.random.PCG64(epoch_sequence(seed, epoch))).shuffle(rows)
    return rows.tolist()


def both(uri, **kwargs):
    """The two public entry points that open a dataset, for cases where both must fail alike."""
    return [
        lambda: PrefetchLoader(uri, 1, **kwargs),
        lambda: LanceMapDataset(uri, **kwargs),
    ]


# -- not a Lance dataset ---------------------------------------------------------------------------
# (also test_loader.py::test_errors_that_need_the_dataset, test_source.py::test_missing_dataset and
# ::test_directory_that_is_not_a_dataset; here: the time bound and LanceMapDataset)


def _parquet_file(tmp_path):
    path = tmp_path / "train.parquet"
    pq.write_table(pa.table({"id": [0, 1, 2]}), path)
    return str(path), str(path), "format='parquet'"


def _csv_file(tmp_path):
    path = tmp_path / "train.csv"
    path.write_text("id\n0\n1\n2\n")
    return str(path), str(path), "format='csv'"


def _under_a_file(tmp_path):
    path = tmp_path / "train.csv"
    path.write_text("id\n0\n")
    return str(path / "data.lance"), str(path), "format='csv'"


def _file_uri(tmp_path):
    path, _, fmt = _parquet_file(tmp_path)
    return f"file://{path}", path, fmt


def _unknown_suffix(tmp_path):
    path = tmp_path / "train.bin"
    path.write_bytes(b"\x00" * 16)
    return str(path), str(path), None


@pytest.mark.parametrize(
    "case",
    [_parquet_file, _csv_file, _under_a_file, _file_uri, _unknown_suffix],
    ids=["parquet-file", "csv-file", "path-under-a-file", "file-uri", "unknown-suffix"],
)
def test_a_file_is_refused_at_once_with_how_to_convert_it(tmp_path, case):
    """Lance alone retries "Not a directory" for ~2 s; the loader answers before calling it."""
    uri, file, fmt = case(tmp_path)
    read = repr(file) + (f", {fmt}" if fmt else "")
    for construct in both(uri):
        with within(AT_ONCE), pytest.raises(FileNotFoundError) as info:
            construct()
        assert str(info.value) == (
            f"source: no Lance dataset at {uri!r}: {file!r} is a file, but a Lance dataset is a "
            f"directory with a _versions/ folder; to read a Parquet, CSV or Arrow file, write it "
            f"to Lance once and pass that, e.g. "
            f"lance.write_dataset(pyarrow.dataset.dataset({read}), 'data.lance')"
        )


def test_the_conversion_the_message_gives_works(tmp_path):
    path, _, _ = _parquet_file(tmp_path)
    lance.write_dataset(pds.dataset(path, format="parquet"), str(tmp_path / "data.lance"))
    loader = PrefetchLoader(tmp_path / "data.lance", 3)
    assert batch_ids(loader) == [permutation(3)]


@pytest.mark.parametrize("layout", ["missing", "empty", "parquet-files"])
def test_a_directory_without_versions_is_not_a_dataset(tmp_path, layout):
    folder = tmp_path / "data"
    if layout != "missing":
        folder.mkdir()
    if layout == "parquet-files":
        pq.write_table(pa.table({"id": [0, 1]}), folder / "part-0.parquet")
    for construct in both(folder):
        with within(AT_ONCE), pytest.raises(FileNotFoundError) as info:
            construct()
        assert str(info.value) == (
            f"source: no Lance dataset at {str(folder)!r}; check the path (a Lance dataset is a "
            f"directory with a _versions/ folder) and, for object stores, storage_options"
        )


# -- S3 credentials --------------------------------------------------------------------------------
# (PrefetchLoader: test_s3.py::test_wrong_location_or_credentials_fail_fast_and_clearly)


def test_wrong_s3_secret_fails_the_map_dataset_too(s3, s3_ids_503):
    options = s3.storage_options(aws_secret_access_key="wrong-secret-7bYz")
    with within(10), pytest.raises(PermissionError) as info:
        LanceMapDataset(Dataset(s3_ids_503, storage_options=options))
    assert str(info.value).startswith(
        f"source: the endpoint storage_options['aws_endpoint']={s3.endpoint!r} refused the "
        f"credentials for 's3://training/ids503.lance' (SignatureDoesNotMatch: "
    )
    assert "check storage_options['aws_access_key_id'] and ['aws_secret_access_key']" in str(
        info.value
    )
    text = "".join(traceback.format_exception(info.value))
    assert "wrong-secret-7bYz" not in text and s3.secret_access_key not in text


# -- empty datasets --------------------------------------------------------------------------------
# (all rows deleted, PrefetchLoader: test_loader.py::test_errors_that_need_the_dataset)


@pytest.fixture
def written_empty(tmp_path) -> str:
    """A dataset written with 0 rows (version 1)."""
    uri = str(tmp_path / "empty.lance")
    lance.write_dataset(pa.table({"id": pa.array([], pa.int64())}), uri)
    return uri


@pytest.fixture
def all_deleted(fresh_ids) -> str:
    """5 rows at version 1, all deleted at version 2."""
    uri = fresh_ids(5, name="deleted.lance")
    lance.dataset(uri).delete("true")
    return uri


@pytest.mark.parametrize("drop_last", [True, False])
def test_a_dataset_with_no_rows_is_refused_by_the_loader(written_empty, drop_last):
    with within(AT_ONCE), pytest.raises(ValueError) as info:
        PrefetchLoader(written_empty, 4, drop_last=drop_last)
    assert str(info.value) == (
        f"source: the dataset {written_empty!r} has no rows at version 1; write data first or "
        f"pick another version"
    )


def test_an_earlier_version_of_an_emptied_dataset_still_reads(all_deleted):
    """The message's "pick another version": version 1 still holds the 5 rows."""
    loader = PrefetchLoader(Dataset(all_deleted, version=1), 5, columns=["id"])
    assert (loader.num_rows, batch_ids(loader)) == (5, [permutation(5)])


@pytest.mark.parametrize("case", ["written-empty", "all-deleted"])
def test_an_empty_map_dataset_has_length_zero(request, case):
    uri = request.getfixturevalue(case.replace("-", "_"))
    dataset = LanceMapDataset(uri, columns=["id"])
    assert len(dataset) == 0
    for index in (0, -1):
        with pytest.raises(IndexError) as info:
            dataset[index]
        assert str(info.value) == (
            f"index {index} is out of range for a dataset of 0 rows (it has no rows)"
        )
    assert list(DataLoader(dataset, batch_size=4, collate_fn=collate)) == []
    with pytest.raises(ValueError, match=r"num_samples should be a positive integer value"):
        DataLoader(dataset, batch_size=4, shuffle=True)  # torch's RandomSampler refuses it


# -- one row, and batch_size above the row count ---------------------------------------------------


@pytest.fixture(scope="module")
def one_row(tmp_path_factory) -> str:
    return write_ids(tmp_path_factory.mktemp("one") / "one.lance", 1)


def test_one_row_with_drop_last_and_a_larger_batch_is_refused(one_row):
    with within(AT_ONCE), pytest.raises(ValueError) as info:
        PrefetchLoader(one_row, 2)
    assert str(info.value) == (
        "drop_last=True needs at least batch_size * world_size = 2 * 1 = 2 rows, but the dataset "
        "has 1; use a smaller batch_size or drop_last=False"
    )
    with pytest.raises(ValueError, match=r"= 1 \* 2 = 2 rows, but the dataset has 1;"):
        PrefetchLoader(one_row, 1, rank=0, world_size=2)


def test_too_few_rows_names_the_filter_split_or_list_that_has_them(ids_25, one_row):
    """The count is of the rows the loader reads, and the message says what selects them."""
    needs = "drop_last=True needs at least batch_size * world_size = 8 * 1 = 8 rows, but"
    fix = "; use a smaller batch_size or drop_last=False"
    parts = Split(fractions={"big": 0.9, "small": 0.1}, name="small", seed=1)
    cases = [
        (
            dict(source=ids_25, filter="id < 5"),
            "filter='id < 5' of the dataset's 25 rows selects 5",
        ),
        (dict(source=ids_25, split=parts), "split part 'small' of the dataset's 25 rows selects 2"),
        (dict(source=[one_row, one_row]), "the 2 datasets have 2"),
        (
            dict(source=[ids_25, one_row], filter="id < 3"),
            "the selected rows of the 2 datasets are 4",
        ),
        (dict(source=[ids_25, ids_25], split=parts), "the selected rows of the 2 datasets are 4"),
        (
            dict(source=Mixture([ids_25, one_row], weights=[1, 1])),
            "an epoch of the mixture of 2 datasets has 2",
        ),
    ]
    for options, rows in cases:
        with pytest.raises(ValueError) as info:
            PrefetchLoader(batch_size=8, columns=["id"], **options)
        assert str(info.value) == f"{needs} {rows}{fix}"


def test_too_few_rows_for_ranks_detected_later_names_the_filter(ids_25, monkeypatch):
    """One rank at construction; two detected (RANK/WORLD_SIZE) when the loader is used."""
    loader = PrefetchLoader(ids_25, 4, columns=["id"], filter="id < 5")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError) as info:
        len(loader)
    assert str(info.value) == (
        "drop_last=True needs at least batch_size * world_size = 4 * 2 = 8 rows, but "
        "filter='id < 5' of the dataset's 25 rows selects 5; use a smaller batch_size or "
        "drop_last=False"
    )


@pytest.mark.parametrize("batch_size,drop_last", [(2, False), (64, False), (1, True), (1, False)])
def test_one_row_gives_one_one_row_batch_every_epoch(one_row, batch_size, drop_last):
    loader = PrefetchLoader(one_row, batch_size, drop_last=drop_last)
    assert len(loader) == 1
    for epoch in range(3):
        (batch,) = list(loader)
        assert loader.epoch == epoch
        assert batch["id"].tolist() == [0] and batch["vector"].tolist() == [[0.0, 0.0, 0.0]]


def test_one_row_over_two_ranks_is_padded_on_both(make_loader, one_row):
    """drop_last=False pads as DistributedSampler does: both ranks get row 0."""
    streams = [
        collect(make_loader(one_row, 4, drop_last=False, rank=rank, world_size=2))
        for rank in (0, 1)
    ]
    assert streams == [[[0]], [[0]]]


def test_batch_size_above_the_row_count(make_loader, ids_25):
    with within(AT_ONCE), pytest.raises(ValueError) as info:
        make_loader(ids_25, 100)  # raised at construction, before any iteration
    assert str(info.value) == (
        "drop_last=True needs at least batch_size * world_size = 100 * 1 = 100 rows, but the "
        "dataset has 25; use a smaller batch_size or drop_last=False"
    )
    loader = make_loader(ids_25, 100, drop_last=False, columns=["id"])
    assert len(loader) == 1 and batch_ids(loader) == [permutation(25)]  # one batch of 25 rows
    order = permutation(25)
    ranks = [
        collect(make_loader(ids_25, 100, drop_last=False, columns=["id"], rank=r, world_size=2))
        for r in (0, 1)
    ]
    assert ranks == [[order[:13]], [order[13:] + order[:1]]]  # 13 each, one row padded


# -- columns ---------------------------------------------------------------------------------------
# (unknown names for LanceSource: test_source.py::test_bad_columns)


def test_unknown_columns_are_listed_with_the_schema(ids_25):
    for construct in both(ids_25, columns=["id", "Label", "image"]):
        with within(AT_ONCE), pytest.raises(ValueError) as info:
            construct()
        assert str(info.value) == (
            f"columns ['Label', 'image'] are not in the dataset {ids_25!r} (version 1); its "
            f"columns are ['id', 'vector', 'label']"
        )


UNSUPPORTED = [
    (
        "when",
        pa.array([10, 20, 30], pa.timestamp("us")),
        "CAST(`when` AS BIGINT)",
        "when_int",
        [10, 20, 30],
    ),
    (
        "price",
        pa.array(
            [decimal.Decimal("1.25"), decimal.Decimal("2.5"), decimal.Decimal("-3")],
            pa.decimal128(6, 2),
        ),
        "CAST(`price` AS DOUBLE)",
        "price_float",
        [1.25, 2.5, -3.0],
    ),
    (
        "kind",
        pa.array(["cat", "dog", "cat"]).dictionary_encode(),
        "CAST(`kind` AS STRING)",
        "kind_str",
        ["cat", "dog", "cat"],
    ),
    # a struct's field: named by its path, and the other fields offered
    (
        "meta",
        pa.StructArray.from_arrays(
            [pa.array([10, 20, 30], pa.timestamp("us")), pa.array([1, 2, 3])], names=["when", "n"]
        ),
        "CAST(`meta`.`when` AS BIGINT)",
        "meta_when_int",
        [10, 20, 30],
    ),
]


@pytest.mark.parametrize(
    "name,values,expression,new,converted", UNSUPPORTED, ids=[u[0] for u in UNSUPPORTED]
)
def test_an_unsupported_column_names_the_fix_and_the_fix_works(
    tmp_path, name, values, expression, new, converted
):
    """Refused at construction (before any row is read) with the add_columns call that stores a
    supported copy; running that call makes the copy readable, with the right values."""
    uri = str(tmp_path / "typed.lance")
    lance.write_dataset(pa.table({"id": [0, 1, 2], name: values}), uri)
    for construct in both(uri):
        with within(AT_ONCE), pytest.raises(TypeError) as info:
            construct()
        message = str(info.value)
        column, arrow_type, leave = name, values.type, "leave it out of columns="
        if name == "meta":
            column, arrow_type = "meta.when", values.type.field("when").type
            leave += " (name the other fields of 'meta' instead: ['meta.n'])"
        assert message == (
            f"column {column!r} has Arrow type {arrow_type}, which lance_prefetch cannot turn "
            f"into a tensor, and transform cannot help (it receives batches already converted); "
            f"{leave}, or add a converted copy to the dataset once and read that instead, e.g. "
            f"lance.dataset(uri).add_columns({{{new!r}: {expression!r}}})"
        )
    call = re.search(r"add_columns\((\{.*\})\)$", message).group(1)
    lance.dataset(uri).add_columns(ast.literal_eval(call))
    dataset = LanceMapDataset(uri, columns=["id", new])
    batch = collate(dataset.__getitems__([0, 1, 2]))
    assert batch["id"].tolist() == [0, 1, 2]
    got = batch[new] if isinstance(batch[new], list) else batch[new].tolist()
    assert got == converted
    (only,) = PrefetchLoader(uri, 3, columns=["id", new])  # and the loader reads it
    assert sorted(only["id"].tolist()) == [0, 1, 2]


def test_an_unsupported_type_without_a_cast_gets_the_general_advice(tmp_path):
    uri = str(tmp_path / "tags.lance")
    lance.write_dataset(pa.table({"id": [0, 1], "tags": [["a"], ["b", "c"]]}), uri)
    with pytest.raises(TypeError) as info:
        PrefetchLoader(uri, 1)
    assert str(info.value).endswith(
        "leave it out of columns=, or add a converted copy to the dataset once and read that "
        "instead, as integers, floats, bools, (fixed-size) lists of them, tensors, strings or "
        "binary (lance.dataset(uri).add_columns() computes a column from an SQL expression)"
    )
    assert str(info.value).startswith("column 'tags' has Arrow type list<item: string>, which")


# -- nulls -----------------------------------------------------------------------------------------


def _fixed(values, size, mask=None):
    return pa.FixedSizeListArray.from_arrays(pa.array(values, pa.float32()), size, mask=mask)


@pytest.fixture(scope="module")
def with_nulls(tmp_path_factory) -> str:
    """Three rows, ``id`` 0..2; row 1 holds a null (or a null inside a list) in every other column."""
    uri = str(tmp_path_factory.mktemp("nulls") / "nulls.lance")
    table = pa.table(
        {
            "id": pa.array([0, 1, 2], pa.int64()),
            "f32": pa.array([1.5, None, 3.5], pa.float32()),
            "f16": pa.array([1.5, None, 3.5], pa.float16()),
            "vec_item": _fixed([1.0, 2.0, None, 4.0, 5.0, 6.0], 2),
            "floats": pa.array([[1.0], [None, 2.0], []], pa.list_(pa.float32())),
            "text": pa.array(["a", None, "c"]),
            "blob": pa.array([b"a", None, b"c"]),
            "ints": pa.array([[1, 2], None, [3]], pa.list_(pa.int32())),
            "i64": pa.array([1, None, 3], pa.int64()),
            "u32": pa.array([1, None, 3], pa.uint32()),
            "flag": pa.array([True, None, False]),
            "vec": _fixed([1.0, 2.0, 3.0, 4.0, 5.0, 6.0], 2, mask=pa.array([False, True, False])),
            "int_item": pa.array([[1], [None], [3]], pa.list_(pa.int32())),
        }
    )
    lance.write_dataset(table, uri)
    return uri


def _plain(value):
    """Tensors and lists of tensors as Python values, NaN as the string 'nan' (NaN != NaN)."""
    if isinstance(value, torch.Tensor):
        value = value.tolist()
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, float) and math.isnan(value):
        return "nan"
    return value


@pytest.mark.parametrize(
    "column,expected",
    [
        ("f32", [1.5, "nan", 3.5]),
        ("f16", [1.5, "nan", 3.5]),
        ("vec_item", [[1.0, 2.0], ["nan", 4.0], [5.0, 6.0]]),
        ("floats", [[1.0], ["nan", 2.0], []]),
        ("text", ["a", None, "c"]),
        ("blob", [b"a", None, b"c"]),
        ("ints", [[1, 2], None, [3]]),
    ],
)
def test_nulls_that_have_a_value(with_nulls, column, expected):
    """Floats give NaN, strings, bytes and variable-length lists None: exact values, both forms."""
    loader = PrefetchLoader(with_nulls, 3, columns=["id", column])
    (batch,) = list(loader)
    order = batch["id"].tolist()
    assert order == permutation(3)
    assert _plain(batch[column]) == [expected[i] for i in order]
    dataset = LanceMapDataset(with_nulls, columns=["id", column])
    assert _plain(collate(dataset.__getitems__([0, 1, 2]))[column]) == expected


@pytest.mark.parametrize(
    "column,message",
    [
        (
            "i64",
            "column 'i64' (int64) holds 1 nulls in this batch; integer and bool tensors cannot represent them: fill them in the dataset, or store the column as floats to get NaN",
        ),
        ("u32", "column 'u32' (uint32) holds 1 nulls in this batch; integer and bool tensors"),
        ("flag", "column 'flag' (bool) holds 1 nulls in this batch; integer and bool tensors"),
        (
            "int_item",
            "column 'int_item' (int32) holds 1 nulls in this batch; integer and bool tensors",
        ),
        (
            "vec",
            "column 'vec' holds 1 null fixed-size lists in this batch; a tensor cannot represent them: fill them in the dataset",
        ),
    ],
)
def test_nulls_without_a_value_fail_only_the_batch_that_holds_one(with_nulls, column, message):
    """The loader is built without reading data; batches without the null row arrive, the one
    with it raises BatchLoadError (cause: ValueError naming the column); the map-style dataset
    raises the ValueError itself, for that row only."""
    loader = PrefetchLoader(with_nulls, 1, columns=["id", column], drop_last=False)
    order = permutation(3)
    position = order.index(1)
    assert position > 0  # seed 0: [2, 0, 1], two batches arrive first
    iterator = iter(loader)
    assert [next(iterator)["id"].tolist() for _ in range(position)] == [
        [i] for i in order[:position]
    ]
    with within(AT_ONCE), pytest.raises(BatchLoadError) as info:
        next(iterator)
    error = info.value
    assert (error.epoch, error.position, error.num_rows, error.uri) == (0, position, 1, with_nulls)
    assert type(error.__cause__) is ValueError and str(error.__cause__).startswith(message)
    dataset = LanceMapDataset(with_nulls, columns=["id", column])
    assert _plain(dataset[2]["id"]) == 2
    with pytest.raises(ValueError) as direct:
        dataset[1]
    assert str(direct.value).startswith(message)


# -- integers: wrong types -------------------------------------------------------------------------
# (batch_size=1.5 and 0, seed=-3, readahead=0, ...:
# test_loader.py::test_bad_arguments_are_refused_before_any_io)


def _int_cases():
    for name in ("batch_size", "seed", "readahead"):
        for value, shown in (
            (2.0, "2.0 (float)"),
            (True, "True (a bool)"),
            ("8", "'8' (str)"),
            (None, "None (NoneType)"),
        ):
            kwargs = {"batch_size": 4, name: value}
            kind = "an integer or 'auto'" if name == "readahead" else "an integer"
            yield kwargs, TypeError, f"{name} should be {kind}, but got {name}={shown}"
    for name, other in (("rank", ("world_size", 2)), ("world_size", ("rank", 0))):
        for value, shown in ((1.0, "1.0 (float)"), (True, "True (a bool)"), ("1", "'1' (str)")):
            kwargs = {"batch_size": 4, name: value, other[0]: other[1]}
            yield kwargs, TypeError, f"{name} should be an integer, but got {name}={shown}"
    yield (
        {"batch_size": np.float64(4)},
        TypeError,
        "batch_size should be an integer, but got batch_size=np.float64(4.0) (float64)",
    )


INT_CASES = list(_int_cases())


@pytest.mark.parametrize(
    "kwargs,error,message", INT_CASES, ids=[repr(sorted(c[0].items())) for c in INT_CASES]
)
def test_non_integers_are_refused_before_any_io(tmp_path, kwargs, error, message):
    """The path does not exist, so the error shows the check ran before any I/O."""
    with within(AT_ONCE), pytest.raises(error) as info:
        PrefetchLoader(tmp_path / "missing.lance", **kwargs)
    assert str(info.value) == message


def test_numpy_integers_are_accepted(ids_25):
    loader = PrefetchLoader(
        ids_25,
        np.int64(5),
        seed=np.uint8(3),
        readahead=np.int32(4),
        rank=np.int64(1),
        world_size=np.int64(2),
        columns=["id"],
        read=ReadOptions(max_in_flight=np.int16(2)),
    )
    assert (loader.batch_size, loader.seed, loader.readahead) == (5, 3, 4)
    assert loader.read.max_in_flight == 2
    assert all(type(v) is int for v in (loader.batch_size, loader.seed, loader.rank))
    assert len(collect(loader)) == 2


@pytest.mark.parametrize(
    "epoch,error,message",
    [
        (1.0, TypeError, "epoch should be an integer, but got epoch=1.0 (float)"),
        (True, TypeError, "epoch should be an integer, but got epoch=True (a bool)"),
        ("1", TypeError, "epoch should be an integer, but got epoch='1' (str)"),
        (-1, ValueError, "epoch should be an integer >= 0, but got epoch=-1"),
        (2**62 + 1, ValueError, f"epoch should be <= 2**62, but got epoch={2**62 + 1}"),
    ],
)
def test_set_epoch_refuses_non_integers(ids_25, epoch, error, message):
    loader = PrefetchLoader(ids_25, 5)
    with pytest.raises(error) as info:
        loader.set_epoch(epoch)
    assert str(info.value) == message
    assert loader.epoch == 0  # unchanged


@pytest.mark.parametrize(
    "version,error,message",
    [
        (
            2.0,
            TypeError,
            "version should be an int (version number) or a str (tag), but got version=2.0",
        ),
        (
            True,
            TypeError,
            "version should be an int (version number) or a str (tag), but got version=True",
        ),
        (0, ValueError, "version should be an integer >= 1, but got version=0"),
    ],
)
def test_map_dataset_version_types_are_refused_before_io(tmp_path, version, error, message):
    with within(AT_ONCE), pytest.raises(error) as info:
        LanceMapDataset(Dataset(tmp_path / "missing.lance", version=version))
    assert str(info.value) == message


@pytest.mark.parametrize(
    "index,error,message",
    [
        ("8", TypeError, "index should be an integer, but got '8'"),
        (None, TypeError, "index should be an integer, but got None"),
        (np.bool_(True), TypeError, "index should be an integer, but got np.True_"),
        (
            2**70,
            IndexError,
            f"index {2**70} is out of range for a dataset of 25 rows (valid: -25 .. 24)",
        ),
    ],
)
def test_map_dataset_indices(ids_25, index, error, message):
    """(1.0 and True: test_mapstyle.py::test_bad_indices.) A numpy integer is an index."""
    dataset = LanceMapDataset(ids_25, columns=["id"])
    with pytest.raises(error) as info:
        dataset[index]
    assert str(info.value) == message
    with pytest.raises(error):
        dataset.__getitems__([0, index])
    with pytest.raises(TypeError, match=r"^indices should be integers, but got True$"):
        dataset.__getitems__([0, True])  # not row 1
    assert dataset[np.int64(7)]["id"].item() == 7


# -- a transform that raises -----------------------------------------------------------------------


class _Broken(Exception):
    pass


def fail_on_row(row: int, batch: dict) -> dict:
    """A transform that raises for the batch holding ``row`` (module level: pickles into workers)."""
    if row in batch["id"].tolist():
        raise _Broken(f"cannot augment row {row}")
    return batch


def test_a_failing_transform_surfaces_from_next_with_its_batch(ids_25):
    raised = []

    def transform(batch):
        try:
            return fail_on_row(7, batch)
        except _Broken as exc:
            raised.append(exc)
            raise

    loader = PrefetchLoader(ids_25, 5, columns=["id"], transform=transform, seed=2)
    loader.set_epoch(1)
    order = permutation(25, seed=2, epoch=1)
    batches = [order[i : i + 5] for i in range(0, 25, 5)]
    position = next(p for p, ids in enumerate(batches) if 7 in ids)
    iterator = iter(loader)
    assert [next(iterator)["id"].tolist() for _ in range(position)] == batches[:position]
    with within(AT_ONCE), pytest.raises(BatchLoadError) as info:
        next(iterator)
    error = info.value
    assert (error.epoch, error.position, error.num_rows, error.uri) == (1, position, 5, ids_25)
    assert error.__cause__ is raised[0]
    assert f"batch {position} of epoch 1" in str(error)
    with pytest.raises(StopIteration):  # the iterator is closed after the error
        next(iterator)
    map_dataset = LanceMapDataset(ids_25, columns=["id"], transform=lambda b: fail_on_row(7, b))
    with pytest.raises(_Broken, match=r"^cannot augment row 7$"):  # map-style: unwrapped
        map_dataset.__getitems__([3, 7])


@pytest.mark.system
@pytest.mark.slow
def test_a_failing_transform_in_spawn_workers_names_its_position(ids_25):
    """Two spawn workers; the batch holding row 7 fails in its worker: the batches before it
    arrive in order, then a BatchLoadError whose message holds the position."""
    loader = PrefetchLoader(ids_25, 5, columns=["id"], transform=functools.partial(fail_on_row, 7))
    order = permutation(25)
    batches = [order[i : i + 5] for i in range(0, 25, 5)]
    position = next(p for p, ids in enumerate(batches) if 7 in ids)
    assert position > 0  # a batch arrives first (seed 0: row 7 is in batch 3)
    data = DataLoader(loader, batch_size=None, num_workers=2, multiprocessing_context=WORKERS)
    received, first = [], None
    with stopping(data) as iterator, pytest.raises(BatchLoadError) as info:
        for batch in iterator:  # (starting the workers takes seconds, more on a busy machine)
            first = first or time.monotonic()
            received.append(batch["id"].tolist())
    assert time.monotonic() - first < 10  # the error follows the batches before it at once
    assert received == batches[:position]
    assert f"batch {position} of epoch 0" in str(info.value)
    assert "cannot augment row 7" in str(info.value)


# -- versions and tags -----------------------------------------------------------------------------
# (a missing version number: test_source.py::test_missing_version)


@pytest.fixture
def tagged(fresh_ids) -> str:
    """10 rows at version 1 (tagged 'v1'), 5 deleted at version 2."""
    uri = fresh_ids(10, name="tagged.lance")
    dataset = lance.dataset(uri)
    dataset.tags.create("v1", 1)
    dataset.delete("id >= 5")
    return uri


@pytest.mark.parametrize(
    "version,ending",
    [
        ("v2", "its latest version is 2, and its tags are ['v1']"),
        (
            "2",
            "its latest version is 2, and its tags are ['v1'] (a str names a tag; for version number 2 pass an int)",
        ),
        (3, "its latest version is 2"),
        (2**70, "its latest version is 2"),
    ],
)
def test_a_missing_version_or_tag(tagged, version, ending):
    for construct in both(Dataset(tagged, version=version)):
        with within(AT_ONCE), pytest.raises(ValueError) as info:
            construct()
        assert str(info.value) == f"version={version!r} does not exist in {tagged!r}; {ending}"
    assert PrefetchLoader(Dataset(tagged, version="v1"), 10).num_rows == 10
    assert len(LanceMapDataset(Dataset(tagged, version=2))) == 5


def test_a_missing_tag_on_a_dataset_without_tags(ids_25):
    with pytest.raises(ValueError) as info:
        PrefetchLoader(Dataset(ids_25, version="best"), 5)
    assert str(info.value).endswith("its latest version is 1, and it has no tags")
