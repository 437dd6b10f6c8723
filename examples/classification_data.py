"""The synthetic classification dataset the training examples write when none is there."""

from __future__ import annotations

import lance
import numpy as np
import pyarrow as pa

#: Columns the examples read.
COLUMNS = ["id", "features", "label"]
FEATURES, CLASSES = 16, 4


def write_dataset(uri: str, num_rows: int) -> None:
    """``id`` (int64), ``features`` (16 x float32) and a ``label`` (int64) that the features predict."""
    rng = np.random.default_rng(0)
    labels = rng.integers(0, CLASSES, num_rows)
    centers = rng.normal(size=(CLASSES, FEATURES)).astype(np.float32)
    features = centers[labels] + 0.5 * rng.normal(size=(num_rows, FEATURES)).astype(np.float32)
    table = pa.table(
        {
            "id": pa.array(np.arange(num_rows)),
            "features": pa.FixedSizeListArray.from_arrays(pa.array(features.ravel()), FEATURES),
            "label": pa.array(labels),
        }
    )
    lance.write_dataset(table, uri, max_rows_per_file=400)
