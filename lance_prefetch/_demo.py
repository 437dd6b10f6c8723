"""The demo job: train a small classifier from a Lance dataset through :class:`PrefetchLoader`.

By default it writes scikit-learn's handwritten digits (1,797 real 8x8 images, 10 classes; shipped
inside scikit-learn) to two local Lance datasets, a training split and a held-out split, and trains
a two-layer network on them. Pointed at another dataset with ``uri``, it treats the last of
``columns`` as the integer class label and the others as numeric features (flattened and joined).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch
from torch import nn

from lance_prefetch.loader._loader import PrefetchLoader
from lance_prefetch.loader._telemetry import LoaderStats
from lance_prefetch.options import ReadOptions

__all__ = ["EpochReport", "train", "write_digits"]

DIGITS_COLUMNS = ("image", "label")


def write_digits(data_dir: str | Path, *, held_out_fraction: float = 0.2) -> tuple[str, str]:
    """Write scikit-learn's digits to ``data_dir/digits-train.lance`` and ``digits-test.lance``.

    Columns: ``id`` (int64, position in scikit-learn's array), ``image`` (fixed_size_list<
    fixed_size_list<uint8>[8]>[8]: 8x8 pixels, ink 0..16) and ``label`` (int64, 0..9). The split is
    stratified-random with a fixed seed; an existing pair with the expected row counts is reused.

    Returns:
        tuple[str, str]: the training and held-out dataset paths.

    Raises:
        ModuleNotFoundError: scikit-learn is not installed (``pip install lance-prefetch[demo]``).
    """
    import lance
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    ids = np.arange(len(digits.target), dtype=np.int64)
    train_ids, test_ids = train_test_split(
        ids, test_size=held_out_fraction, random_state=0, stratify=digits.target
    )
    paths = []
    for name, part in (("train", np.sort(train_ids)), ("test", np.sort(test_ids))):
        path = Path(data_dir) / f"digits-{name}.lance"
        paths.append(str(path))
        if path.exists() and lance.dataset(str(path)).count_rows() == len(part):
            continue
        pixels = pa.array(digits.images[part].astype(np.uint8).reshape(-1))
        image = pa.FixedSizeListArray.from_arrays(pa.FixedSizeListArray.from_arrays(pixels, 8), 8)
        table = pa.table({"id": ids[part], "image": image, "label": digits.target[part]})
        mode = "overwrite" if path.exists() else "create"  # "overwrite" of nothing: Lance warns
        lance.write_dataset(table, str(path), mode=mode, max_rows_per_file=512)
    return paths[0], paths[1]


@dataclass(frozen=True)
class EpochReport:
    """What one demo epoch measured.

    Attributes:
        epoch (int): epoch number, from 0. loss (float): mean training cross-entropy.
        accuracy (float | None): held-out accuracy in [0, 1], ``None`` without a held-out set.
        rows_per_s (float): training rows delivered per second of the epoch's wall time.
        wait_fraction (float): fraction of the epoch's wall time the loop spent waiting in
            ``next()`` for a batch.
        seconds (float): the epoch's wall time in seconds.
        stats (LoaderStats): the loader's own telemetry at the epoch's end (``loader.stats()``),
            where the three figures above come from.
    """

    epoch: int
    loss: float
    accuracy: float | None
    rows_per_s: float
    wait_fraction: float
    seconds: float
    stats: LoaderStats


def _features(batch: dict[str, torch.Tensor], columns: Sequence[str]) -> torch.Tensor:
    parts = [batch[name].reshape(len(batch[name]), -1).to(torch.float32) for name in columns]
    return torch.cat(parts, dim=1)


def train(
    uri: str,
    *,
    eval_uri: str | None = None,
    columns: Sequence[str] = DIGITS_COLUMNS,
    batch_size: int = 64,
    readahead: int | Literal["auto"] = 8,
    max_in_flight: int | Literal["auto"] = 4,
    cache: Literal["memory", "disk"] | None = None,
    epochs: int = 5,
    seed: int = 0,
    learning_rate: float = 3e-3,
    report: Callable[[EpochReport], None] | None = None,
) -> list[EpochReport]:
    """Train a small classifier on ``uri`` for ``epochs`` epochs; evaluate on ``eval_uri``.

    The last of ``columns`` is the label (integers ``0 .. classes-1``), the rest are features.
    Model: ``BatchNorm1d -> Linear(features, 128) -> ReLU -> Linear(128, classes)``, Adam.
    Runs in one process, on the CPU; ``torch.manual_seed(seed)`` makes it repeatable.

    Returns:
        list[EpochReport]: one per epoch, also passed to ``report`` as each epoch ends.

    Raises:
        ValueError: fewer than two ``columns``, a column that is not numeric, or a label column
            that is not integers ``>= 0``.
    """
    if len(columns) < 2:
        raise ValueError(f"columns should be feature columns then the label, but got {columns}")
    *feature_columns, label_column = columns
    torch.manual_seed(seed)
    loader = PrefetchLoader(
        uri,
        batch_size,
        columns=columns,
        seed=seed,
        readahead=readahead,
        rank=0,
        world_size=1,
        cache=cache,
        read=ReadOptions(max_in_flight=max_in_flight),
    )
    held_out = None
    if eval_uri is not None:
        held_out = PrefetchLoader(
            eval_uri,
            512,
            columns=columns,
            drop_last=False,
            readahead=2,
            rank=0,
            world_size=1,
            read=ReadOptions(max_in_flight=2),
        )
    first = next(iter(loader))
    for name in columns:
        if not isinstance(first[name], torch.Tensor):
            raise ValueError(
                f"column {name!r} is not numeric (it arrives as a list, not a tensor); the demo "
                f"needs numeric feature columns and an integer label column"
            )
    if first[label_column].is_floating_point() or first[label_column].ndim != 1:
        raise ValueError(f"the label column {label_column!r} should hold integers, one per row")
    num_features = _features(first, feature_columns).shape[1]
    lowest, highest = _label_range(loader, label_column)
    if lowest < 0:
        raise ValueError(
            f"the label column {label_column!r} holds {lowest}; labels should be class numbers "
            f"0 .. classes-1"
        )
    num_classes = highest + 1
    model = nn.Sequential(
        nn.BatchNorm1d(num_features),
        nn.Linear(num_features, 128),
        nn.ReLU(),
        nn.Linear(128, num_classes),
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=learning_rate)
    reports = []
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        model.train()
        total_loss, rows = 0.0, 0
        for batch in loader:
            logits = model(_features(batch, feature_columns))
            loss = nn.functional.cross_entropy(logits, batch[label_column].long())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total_loss += loss.item() * len(logits)
            rows += len(logits)
        stats = loader.stats()
        accuracy = None if held_out is None else _accuracy(model, held_out, columns)
        epoch_report = EpochReport(
            epoch,
            total_loss / rows,
            accuracy,
            stats.rows_per_s_total,
            stats.wait_fraction_total,
            stats.elapsed_s,
            stats,
        )
        reports.append(epoch_report)
        if report is not None:
            report(epoch_report)
    return reports


def _label_range(loader: PrefetchLoader, label_column: str) -> tuple[int, int]:
    """The smallest and largest label of the pinned version (one scan of the label column)."""
    import lance

    dataset = lance.dataset(loader.uri, version=loader.version)
    labels = dataset.to_table(columns=[label_column]).column(label_column)
    extremes = pc.min_max(labels)
    return int(extremes["min"].as_py()), int(extremes["max"].as_py())


@torch.no_grad()
def _accuracy(model: nn.Module, loader: PrefetchLoader, columns: Sequence[str]) -> float:
    *feature_columns, label_column = columns
    model.eval()
    correct = total = 0
    for batch in loader:  # drop_last=False, one rank: every held-out row exactly once
        predicted = model(_features(batch, feature_columns)).argmax(dim=1)
        correct += int((predicted == batch[label_column]).sum())
        total += len(predicted)
    return correct / total
