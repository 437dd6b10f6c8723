"""The benchmark's synthetic dataset: ``id``, a 128 x float32 ``vector`` and a ``label`` per row."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import numpy as np
import pyarrow as pa

__all__ = ["SCHEMA", "write_synthetic"]

DIM = 128
SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64()),
        pa.field("vector", pa.list_(pa.float32(), DIM)),
        pa.field("label", pa.int64()),
    ]
)
_CHUNK_ROWS = 65_536


def _chunks(rows: int, seed: int) -> Iterator[pa.RecordBatch]:
    rng = np.random.default_rng(seed)
    for start in range(0, rows, _CHUNK_ROWS):
        count = min(_CHUNK_ROWS, rows - start)
        values = rng.standard_normal(count * DIM, dtype=np.float32)
        yield pa.record_batch(
            [
                pa.array(np.arange(start, start + count, dtype=np.int64)),
                pa.FixedSizeListArray.from_arrays(pa.array(values), DIM),
                pa.array(rng.integers(0, 10, count, dtype=np.int64)),
            ],
            schema=SCHEMA,
        )


def write_synthetic(
    uri: str,
    rows: int,
    *,
    rows_per_file: int = 5_000,
    storage_options: Mapping[str, str] | None = None,
    seed: int = 0,
) -> str:
    """Write a new dataset of ``rows`` rows to ``uri``: ``id`` (int64, = the row's offset), ``vector``
    (fixed_size_list<float32>[128], standard normal: 512 bytes a row) and ``label`` (int64, 0..9).

    Written in chunks of 65,536 rows, so memory stays small for any ``rows``.

    Args:
        uri (str): where to write (a local path or ``s3://...``).
        rows (int): number of rows, ``>= 1``.
        rows_per_file (int): rows per data file (so per fragment). Default: ``5000``.
        storage_options (Mapping[str, str], optional): passed to Lance. Default: ``None``.
        seed (int): seed of the values. Default: ``0``.

    Returns:
        str: ``uri``.

    Raises:
        ValueError: ``rows`` or ``rows_per_file`` is below 1.
        OSError: a dataset exists at ``uri`` already.
    """
    import lance

    if rows < 1:
        raise ValueError(f"rows should be >= 1, but got rows={rows}")
    if rows_per_file < 1:
        raise ValueError(f"rows_per_file should be >= 1, but got rows_per_file={rows_per_file}")
    reader = pa.RecordBatchReader.from_batches(SCHEMA, _chunks(rows, seed))
    lance.write_dataset(
        reader,
        uri,
        mode="create",
        max_rows_per_file=rows_per_file,
        storage_options=dict(storage_options) if storage_options else None,
    )
    return uri
