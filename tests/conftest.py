"""Shared fixtures: small Lance datasets whose ``id`` column is each row's position."""

from __future__ import annotations

from pathlib import Path

import lance
import numpy as np
import pyarrow as pa
import pytest


def write_ids(path: Path | str, num_rows: int, *, rows_per_file: int = 1024) -> str:
    """Write ``num_rows`` rows: ``id`` (int64, = position), ``vector`` (3 x float32 = id * [1, 2, 3])
    and ``label`` (int64, id % 10), in fragments of ``rows_per_file`` rows. Returns the URI."""
    ids = np.arange(num_rows, dtype=np.int64)
    vector = (ids[:, None] * np.array([1, 2, 3])).astype(np.float32)
    table = pa.table(
        {
            "id": ids,
            "vector": pa.FixedSizeListArray.from_arrays(pa.array(vector.reshape(-1)), 3),
            "label": ids % 10,
        }
    )
    lance.write_dataset(table, str(path), mode="overwrite", max_rows_per_file=rows_per_file)
    return str(path)


@pytest.fixture(scope="session")
def ids_1003(tmp_path_factory: pytest.TempPathFactory) -> str:
    """1,003 rows in 4 fragments (300 rows each, the last 103)."""
    return write_ids(tmp_path_factory.mktemp("ids") / "ids1003.lance", 1003, rows_per_file=300)


@pytest.fixture(scope="session")
def ids_25(tmp_path_factory: pytest.TempPathFactory) -> str:
    """25 rows in one fragment."""
    return write_ids(tmp_path_factory.mktemp("ids") / "ids25.lance", 25)


@pytest.fixture
def fresh_ids(tmp_path: Path):
    """A factory for a new dataset in this test's own folder (for tests that modify it)."""

    def make(num_rows: int, *, rows_per_file: int = 1024, name: str = "data.lance") -> str:
        return write_ids(tmp_path / name, num_rows, rows_per_file=rows_per_file)

    return make
