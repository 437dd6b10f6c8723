"""Preprocess with Ray Data (on any number of machines) into a Lance dataset; train from it with
the loader's uniform batches.

    python examples/ray_data_preprocess.py --raw /tmp/raw.lance --out /tmp/ready.lance

What it shows (docs/recipes.md explains each):
- Ray Data reads the raw dataset (``ray.data.read_lance``) and preprocesses it in parallel tasks
  (``map_batches``); each task writes its rows as Lance fragments under the output URI
  (``LanceFragment.create``: on an object store every machine writes there), and the driver
  commits them as one new dataset version (``LanceOperation.Overwrite``), Lance's distributed
  write. (``Dataset.write_lance`` does the same in one call where the installed Ray and pylance
  agree.)
- The training process reads the committed version with ``PrefetchLoader``: every epoch a new
  uniform permutation of all rows, whatever order the tasks wrote them in; the preprocessing runs
  once, not every epoch.

Creates a raw dataset at ``--raw`` (``id``, ``text``) when none is there.
"""

from __future__ import annotations

import argparse
import json
import os

import lance
import numpy as np
import pyarrow as pa
import ray
from lance.fragment import FragmentMetadata, LanceFragment

from lance_prefetch import PrefetchLoader

#: What the preprocessing writes: the raw ``id``, the text's length and 4 token counts.
SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("length", pa.int64()),
        ("counts", pa.list_(pa.int64(), 4)),
    ]
)


def write_raw(uri: str, num_rows: int) -> None:
    """``num_rows`` rows: ``id`` (int64) and ``text`` (``"row <id>: " + "ab" * (id % 7)``)."""
    ids = np.arange(num_rows)
    texts = [f"row {i}: " + "ab" * (i % 7) for i in ids]
    lance.write_dataset(pa.table({"id": ids, "text": texts}), uri, max_rows_per_file=25)


def preprocess(batch: pa.Table) -> pa.Table:
    """The features of a batch of raw rows: the text's length and how often ``a``, ``b``, ``r``
    and a space occur in it."""
    texts = batch["text"].to_pylist()
    counts = [[text.count(c) for c in "abr "] for text in texts]
    return pa.table(
        {
            "id": batch["id"],
            "length": pa.array([len(text) for text in texts], pa.int64()),
            "counts": pa.array(counts, pa.list_(pa.int64(), 4)),
        },
        schema=SCHEMA,
    )


def write_fragments(batch: pa.Table, uri: str) -> dict:
    """A Ray Data task's write: its batch's preprocessed rows as Lance fragments under ``uri``;
    returns their metadata (JSON) for the driver to commit."""
    fragment = LanceFragment.create(uri, preprocess(batch), schema=SCHEMA)
    return {"fragment": [json.dumps(fragment.to_json())]}


def preprocess_to_lance(raw: str, out: str) -> int:
    """Preprocess ``raw`` into a new dataset at ``out`` with Ray Data; the committed version."""
    written = ray.data.read_lance(raw).map_batches(
        write_fragments, fn_kwargs={"uri": out}, batch_format="pyarrow", batch_size=20
    )
    fragments = [FragmentMetadata.from_json(row["fragment"]) for row in written.take_all()]
    operation = lance.LanceOperation.Overwrite(SCHEMA, fragments)
    return lance.LanceDataset.commit(out, operation).version


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--raw", required=True, help="raw Lance dataset (created if missing)")
    parser.add_argument("--out", required=True, help="the preprocessed dataset's URI")
    parser.add_argument("--rows", type=int, default=100, help="rows of a created raw dataset")
    parser.add_argument("--batch-size", type=int, default=10)
    parser.add_argument("--epochs", type=int, default=2)
    return parser.parse_args(argv)


def main(args: argparse.Namespace) -> list[list[list[int]]]:
    """Preprocess, then read ``--epochs`` epochs; each epoch's batches of ``id``s."""
    if not os.path.exists(args.raw):
        write_raw(args.raw, args.rows)
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)  # or the cluster's address
    try:
        version = preprocess_to_lance(args.raw, args.out)
    finally:
        ray.shutdown()
    loader = PrefetchLoader(args.out, args.batch_size, columns=["id", "length", "counts"], seed=0)
    epochs = []
    for epoch in range(args.epochs):
        loader.set_epoch(epoch)
        epochs.append([batch["id"].tolist() for batch in loader])
        print(f"epoch {epoch}: {len(epochs[-1])} batches from version {version}")
    return epochs


if __name__ == "__main__":
    main(parse_args())
