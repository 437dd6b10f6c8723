"""A disk copy's fixed-width columns as raw, memory-mapped files (``cache/_columns.py``): every
fixed-width type gives exactly the dataset's own ``take`` (values, types, order) and the tensors
``to_tensors`` makes of it; variable-width columns and columns holding a null stay in the copy's
Lance part; the mapped files are opened per process (spawn workers map their own)."""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import pickle
from pathlib import Path

import lance
import numpy as np
import pyarrow as pa
import pytest
import torch
from support.helpers import batch_ids, collect, expected_rank_ids

from lance_prefetch import DiskCache, PrefetchLoader
from lance_prefetch.cache import _disk
from lance_prefetch.cache._columns import LAYOUT, MAX_FILES, ColumnFiles
from lance_prefetch.cache._disk import ROWS
from lance_prefetch.convert import to_tensors

ROWS_IN = 1000


def typed_table(num_rows: int) -> pa.Table:
    """``id`` and a column of every fixed-width type a copy stores raw, then a string."""
    rng = np.random.default_rng(7)
    ids = np.arange(num_rows)

    def ints(dtype):
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, num_rows, dtype=dtype, endpoint=True)

    grid = rng.standard_normal((num_rows, 2, 3)).astype(np.float32)
    nested = pa.FixedSizeListArray.from_arrays(
        pa.FixedSizeListArray.from_arrays(pa.array(ints(np.int16).repeat(6)), 3), 2
    )
    return pa.table(
        {
            "id": ids,
            "i8": ints(np.int8),
            "i16": ints(np.int16),
            "i32": ints(np.int32),
            "u8": ints(np.uint8),
            "u16": ints(np.uint16),
            "u32": ints(np.uint32),
            "u64": rng.integers(0, 2**62, num_rows, dtype=np.uint64),
            "f16": rng.standard_normal(num_rows).astype(np.float16),
            "f32": rng.standard_normal(num_rows).astype(np.float32),
            "f64": rng.standard_normal(num_rows),
            "flag": rng.random(num_rows) < 0.3,
            "vector": pa.FixedSizeListArray.from_arrays(
                pa.array(rng.standard_normal(num_rows * 4).astype(np.float32)), 4
            ),
            "flags": pa.FixedSizeListArray.from_arrays(pa.array(rng.random(num_rows * 3) < 0.5), 3),
            "nested": nested,
            "grid": pa.FixedShapeTensorArray.from_numpy_ndarray(grid),
            "name": pa.array([f"row {i}" for i in ids]),
        }
    )


FIXED = [name for name in typed_table(1).column_names if name != "name"]


@pytest.fixture(scope="module")
def typed(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("typed") / "typed.lance"
    lance.write_dataset(typed_table(ROWS_IN), path, max_rows_per_file=300)
    return str(path)


def layout(loader: PrefetchLoader) -> list[str]:
    """The columns the copy stores raw (its layout file)."""
    text = (loader._source.path / LAYOUT).read_text()
    return [entry["name"] for entry in json.loads(text)["columns"]]


def same_tensors(got: dict, expected: dict) -> None:
    assert list(got) == list(expected)
    for name, value in expected.items():
        if isinstance(value, torch.Tensor):
            assert got[name].dtype == value.dtype and got[name].shape == value.shape, name
            assert torch.equal(got[name], value), name
        else:
            assert got[name] == value, name


@pytest.mark.parametrize("columns", [None, FIXED, ["name", "grid", "id"]])
def test_every_fixed_width_type_is_stored_raw_and_read_as_the_dataset_reads_it(
    typed, tmp_path, columns
):
    """Each fixed-width column (ints and uints of every width, floats 16-64, bool, fixed-size
    lists, nested ones, a fixed-shape tensor) is a raw file; the string stays in the Lance part.
    ``take`` of unsorted and repeated offsets returns the dataset's own table (types, values,
    order); ``gather`` the tensors ``to_tensors`` makes of it."""
    loader = PrefetchLoader(typed, 10, columns=columns, cache=DiskCache(dir=tmp_path / "c"))
    plain = PrefetchLoader(typed, 10, columns=columns)._source
    cache = loader._source
    cache.fill()
    asked = columns or typed_table(1).column_names
    assert layout(loader) == [name for name in asked if name != "name"]
    assert (cache.path / ROWS).exists() == ("name" in asked)
    for indices in (np.array([999, 0, 517, 3, 300, 299, 998]), np.array([5, 5, 12, 5])):
        table = cache.take(indices)
        expected = plain.take(indices)
        assert table.schema == expected.schema and table.equals(expected)
        assert table["id"].to_pylist() == indices.tolist()
        same_tensors(cache.gather(indices).values, to_tensors(expected))
    every = np.random.default_rng(1).permutation(ROWS_IN)
    assert cache.take(every).equals(plain.take(every))  # every row, shuffled
    assert cache.ready == ("name" not in asked)  # all raw: gathered in the training thread


def test_a_loader_on_the_copy_gives_the_datasets_batches(typed, tmp_path):
    """Two epochs through the loader (coalesced takes, split into batches) equal the uncached
    loader's, every column."""
    cache = DiskCache(dir=tmp_path / "c")
    cached = PrefetchLoader(typed, 64, seed=2, drop_last=False, cache=cache)
    cached._source.fill()
    plain = PrefetchLoader(typed, 64, seed=2, drop_last=False)
    for epoch in (0, 1):
        cached.set_epoch(epoch)
        plain.set_epoch(epoch)
        pairs = list(zip(cached, plain, strict=True))
        assert len(pairs) == 16
        for got, expected in pairs:
            same_tensors(got, expected)


def test_a_fixed_width_column_holding_a_null_stays_in_the_lance_part(tmp_path):
    """A null (in a late record batch, so the fill starts over; and one inside a fixed-size
    list) keeps that column in the Lance part; the rows, nulls included, are the dataset's."""
    values = pa.array([None if i == 9000 else i for i in range(10_000)], pa.int32())
    inner = pa.array([None if i == 7 else float(i) for i in range(20_000)], pa.float32())
    table = pa.table(
        {
            "id": np.arange(10_000),
            "maybe": values,
            "pair": pa.FixedSizeListArray.from_arrays(inner, 2),
        }
    )
    uri = str(tmp_path / "nulls.lance")
    lance.write_dataset(table, uri)
    loader = PrefetchLoader(uri, 10, cache=DiskCache(dir=tmp_path / "c"))
    loader._source.fill()
    assert layout(loader) == ["id"]
    indices = np.array([9000, 3, 9999, 0])
    expected = PrefetchLoader(uri, 10)._source.take(indices)
    got = loader._source.take(indices)
    assert got.equals(expected) and got["maybe"].to_pylist() == [None, 3, 9999, 0]
    pairs = loader._source.gather(np.array([3, 2])).values["pair"].tolist()
    assert str(pairs) == "[[6.0, nan], [4.0, 5.0]]"  # a null float is NaN, as to_tensors says
    assert loader._source.gather(np.array([3, 9000])) is None  # the batch's conversion fails


def open_files(folder: Path) -> list[str]:
    """The files under ``folder`` that this process holds descriptors of, one entry each."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the listing's own descriptor, closed by now
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target.startswith(f"{folder}/"):
                found.append(target.removeprefix(f"{folder}/"))
    return sorted(found)


def test_a_wide_table_stores_the_first_256_fixed_width_columns_raw_one_descriptor_each(tmp_path):
    """300 float columns and an id: the id and the first 255 floats are raw files (the fill and
    each reader hold one descriptor a file, under a soft limit of 1,024 open files), the other
    45 are in the Lance part; every value is the dataset's."""
    table = pa.table(
        {"id": np.arange(40), **{f"c{i}": np.arange(40) * 1000.0 + i for i in range(300)}}
    )
    uri = str(tmp_path / "wide.lance")
    lance.write_dataset(table, uri)
    loader = PrefetchLoader(uri, 8, seed=1, cache=DiskCache(dir=tmp_path / "c"))
    loader._source.fill()
    assert MAX_FILES == 256
    assert layout(loader) == ["id"] + [f"c{i}" for i in range(255)]
    assert open_files(loader._source.path / "columns") == sorted(f"{i}.raw" for i in range(256))
    indices = np.array([39, 0, 17, 17])
    expected = PrefetchLoader(uri, 8)._source.take(indices)
    assert loader._source.take(indices).equals(expected)
    batches = list(loader)
    assert batch_ids(batches) == expected_rank_ids(loader)
    for batch in batches:
        assert batch["c299"].tolist() == (batch["id"] * 1000.0 + 299).tolist()
        assert batch["c254"].tolist() == (batch["id"] * 1000.0 + 254).tolist()


def test_the_cache_pickles_without_its_mappings_and_spawn_workers_map_their_own(typed, tmp_path):
    """A filled cache pickles as its source and folder only (no array, kilobytes); unpickled it
    opens the copy and maps its files again; spawn DataLoader workers reading through it give
    every id once, the dataset's order."""
    cache = DiskCache(dir=tmp_path / "c")
    loader = PrefetchLoader(typed, 50, columns=["id", "vector"], seed=5, cache=cache)
    loader._source.fill()
    state = pickle.dumps(loader._source)
    assert len(state) < 20_000
    clone = pickle.loads(state)
    assert not clone.cached
    clone.prepare()  # the copy found whole: opened at once
    assert clone.cached and clone.take(np.array([7, 2]))["id"].to_pylist() == [7, 2]
    expected = expected_rank_ids(loader, epoch=1)
    spawn = multiprocessing.get_context("spawn")
    ids = collect(loader, num_workers=2, epoch=1, context=spawn)
    assert sorted(ids) == sorted(expected)  # the workers' batches interleave
    assert sorted(i for batch in ids for i in batch) == list(range(ROWS_IN))
    loader.set_epoch(1)
    assert batch_ids(loader) == expected


def test_a_copy_larger_than_half_the_memory_is_read_ahead_in_threads_and_advised_random(
    typed, tmp_path, monkeypatch
):
    """With half the memory (the bound) below the raw files' size, the copy is not ``ready``:
    the readahead threads read it (exact batches still), and its mappings are advised
    ``MADV_RANDOM``; under the bound the same copy is ``ready`` and not advised."""
    advised = []
    original = ColumnFiles.read_randomly

    def read_randomly(files):
        advised.append(files.nbytes)
        original(files)

    monkeypatch.setattr(ColumnFiles, "read_randomly", read_randomly)
    columns = ["id", "vector"]
    for bound, ready in ((1 << 40, True), (1000, False)):
        monkeypatch.setattr(_disk, "default_cache_bytes", lambda bound=bound: bound)
        loader = PrefetchLoader(
            typed, 50, columns=columns, seed=6, cache=DiskCache(dir=tmp_path / "c")
        )
        loader._source.fill()
        assert loader._source.ready is ready
        assert advised == ([] if ready else [ROWS_IN * (8 + 16)])
        assert batch_ids(loader) == expected_rank_ids(loader)
