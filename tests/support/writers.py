"""Writers that change a Lance dataset while a loader reads it, in a test's thread or (run as a
script: ``python writers.py URI OPERATION...``) in a separate process.

Every write makes a new dataset version. Rows are written like ``conftest.write_ids`` writes them
(``id``, ``vector`` = id * [1, 2, 3], ``label`` = id % 10), with the ``id`` values given.
"""

from __future__ import annotations

import datetime
import sys
from collections.abc import Sequence

import lance
import numpy as np
import pyarrow as pa

#: ids of the rows ``append`` adds and of the rows ``overwrite`` leaves (other ids, fewer rows)
APPENDED_IDS = range(100_000, 100_500)
OVERWRITTEN_IDS = range(50_000, 50_300)


def rows(ids: Sequence[int]) -> pa.Table:
    """A table of the given ``id`` values, with the ``vector`` and ``label`` columns they imply."""
    id_array = np.asarray(ids, dtype=np.int64)
    vector = (id_array[:, None] * np.array([1, 2, 3])).astype(np.float32)
    return pa.table(
        {
            "id": id_array,
            "vector": pa.FixedSizeListArray.from_arrays(pa.array(vector.reshape(-1)), 3),
            "label": id_array % 10,
        }
    )


def write(uri: str, operation: str, *, storage_options: dict[str, str] | None = None) -> None:
    """Change the dataset at ``uri`` by one ``operation``:

    - ``append``: add the rows ``APPENDED_IDS`` (500 rows, in new fragments);
    - ``delete``: delete the rows with ``id < 100``;
    - ``overwrite``: replace everything by the rows ``OVERWRITTEN_IDS`` (300 rows, other ids);
    - ``compact``: delete every third row (``id % 3 = 0``), then compact the fragments into one
      (rewriting the data files, so the latest version's offsets all move);
    - ``cleanup``: remove every version but the latest, and the files only they reference
      (``cleanup_old_versions(older_than=0)``).

    ``storage_options``: for a dataset on an object store.
    """
    options = {"storage_options": storage_options}
    if operation == "append":
        lance.write_dataset(rows(APPENDED_IDS), uri, mode="append", **options)
    elif operation == "delete":
        lance.dataset(uri, **options).delete("id < 100")
    elif operation == "overwrite":
        lance.write_dataset(rows(OVERWRITTEN_IDS), uri, mode="overwrite", **options)
    elif operation == "compact":
        dataset = lance.dataset(uri, **options)
        dataset.delete("id % 3 = 0")
        lance.dataset(uri, **options).optimize.compact_files(target_rows_per_fragment=1_000_000)
    elif operation == "cleanup":
        lance.dataset(uri, **options).cleanup_old_versions(older_than=datetime.timedelta(seconds=0))
    else:
        raise ValueError(f"unknown operation {operation!r}")


def live_ids(uri: str, version: int | None = None) -> list[int]:
    """The ``id`` of each live row of ``version`` (default: the latest), in offset order."""
    return lance.dataset(uri, version=version).to_table(columns=["id"])["id"].to_pylist()


if __name__ == "__main__":
    for name in sys.argv[2:]:
        write(sys.argv[1], name)
