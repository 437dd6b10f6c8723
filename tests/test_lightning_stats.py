"""LoaderStatsLogger under a real Lightning Trainer (CPU, one process, a tiny model): the metric
names the loggers record, at Lightning's own step interval and at each epoch's end, with values in
range and the exact batch counts."""

from __future__ import annotations

import csv
import warnings

import lightning as L
import pytest
import torch

from lance_prefetch import PrefetchLoader
from lance_prefetch.integrations.lightning import LoaderStatsLogger


class Tiny(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(3, 1)

    def training_step(self, batch, batch_idx):
        parts = [batch] if "vector" in batch else batch.values()  # one loader, or a dict of them
        return sum(self.layer(part["vector"]).pow(2).mean() for part in parts)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def fit(tmp_path, loaders, callbacks, *, epochs=2, log_every_n_steps=3):
    """Fit ``epochs`` epochs on ``loaders`` with a CSVLogger into ``tmp_path``; the rows it wrote."""
    logger = L.pytorch.loggers.CSVLogger(tmp_path, name="run", version=0)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=epochs,
        logger=logger,
        log_every_n_steps=log_every_n_steps,
        callbacks=callbacks,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Lightning's own tips (workers, GPU unused)
        trainer.fit(Tiny(), train_dataloaders=loaders)
    with open(tmp_path / "run" / "version_0" / "metrics.csv") as f:
        return list(csv.DictReader(f))


def logged(rows, name):
    """(step, value) of each row that holds ``name``."""
    return [(int(r["step"]), float(r[name])) for r in rows if r.get(name)]


def test_step_and_epoch_figures_reach_the_logger(ids_1003, tmp_path):
    """10 batches an epoch (100 rows, drop_last), 2 epochs, log_every_n_steps=3: the step
    figures at Lightning's logging steps, the epoch figures once an epoch with its 10 batches."""
    loader = PrefetchLoader(ids_1003, 100, columns=["vector"])
    rows = fit(tmp_path, loader, [LoaderStatsLogger(), LoaderStatsLogger("epoch", prefix="epoch")])
    names = {name for row in rows for name, value in row.items() if value}
    assert names == {
        "epoch",
        "step",
        "loader/wait_fraction",
        "loader/rows_per_s",
        "loader/mib_per_s",
        "loader/take_ms_p50",
        "loader/batches",
        "epoch/wait_fraction_total",
        "epoch/rows_per_s_total",
        "epoch/mib_per_s_total",
        "epoch/take_ms_p50",
        "epoch/batches",
    }
    steps = [2, 5, 8, 11, 14, 17]  # every 3rd of the 20 steps
    assert [step for step, _ in logged(rows, "loader/batches")] == steps
    # the batches of the epoch so far: batch_idx + 1 (Lightning reads none ahead of the step)
    assert [value for _, value in logged(rows, "loader/batches")] == [3, 6, 9, 2, 5, 8]
    # at trainer.global_step, with the epoch
    assert logged(rows, "epoch/batches") == [(10, 10.0), (20, 10.0)]
    assert [r["epoch"] for r in rows if r["epoch/batches"]] == ["0", "1"]
    for name in ("loader/wait_fraction", "epoch/wait_fraction_total"):
        assert all(0.0 <= value <= 1.0 for _, value in logged(rows, name)), name
    for name in ("loader/rows_per_s", "loader/mib_per_s", "epoch/rows_per_s_total"):
        assert all(value > 0 for _, value in logged(rows, name)), name
    assert all(value > 0 for _, value in logged(rows, "epoch/mib_per_s_total"))
    assert all(0 < value < 60_000 for _, value in logged(rows, "loader/take_ms_p50"))


def test_several_loaders_are_numbered_and_other_iterables_left_alone(ids_1003, tmp_path):
    loaders = {
        "a": PrefetchLoader(ids_1003, 100, columns=["vector"]),
        "b": PrefetchLoader(ids_1003, 200, columns=["vector"]),
        "c": torch.utils.data.DataLoader([{"vector": torch.zeros(3)}] * 30, batch_size=10),
    }
    logger = LoaderStatsLogger("epoch", metrics=["batches", "rows"])
    rows = fit(tmp_path, loaders, [logger], epochs=1, log_every_n_steps=50)
    # Lightning's default "max_size_cycle" mode: the longer "a" ends the epoch at 10 batches,
    # "b" (5 an epoch) goes round twice (its latest iteration: 5); "c" is no PrefetchLoader
    assert logged(rows, "loader/0/batches") == [(10, 10.0)]
    assert logged(rows, "loader/0/rows") == [(10, 1000.0)]
    assert logged(rows, "loader/1/batches") == [(10, 5.0)]
    assert logged(rows, "loader/1/rows") == [(10, 1000.0)]
    names = {name for row in rows for name, value in row.items() if value}
    assert names == {"epoch", "step"} | {
        f"loader/{i}/{key}" for i in (0, 1) for key in ("batches", "rows")
    }


@pytest.mark.parametrize(
    "args, kwargs, error, message",
    [
        (("batch",), {}, ValueError, r"^logging_interval should be 'step' or 'epoch', but got "),
        ((), {"metrics": "rows"}, TypeError, r"^metrics should be a sequence of LoaderStats keys"),
        ((), {"metrics": []}, ValueError, r"^metrics should name at least one LoaderStats key"),
        ((), {"prefix": ""}, ValueError, r"^prefix should be a non-empty string, e\.g\. 'loader'"),
        (
            (),
            {"prefix": 3},
            TypeError,
            r"^prefix should be a string, e\.g\. 'loader', but got prefix=3$",
        ),
    ],
)
def test_bad_arguments_are_refused(args, kwargs, error, message):
    with pytest.raises(error, match=message):
        LoaderStatsLogger(*args, **kwargs)


def test_an_unknown_metric_is_named_with_the_known_keys(ids_1003, tmp_path):
    loader = PrefetchLoader(ids_1003, 100, columns=["vector"])
    with pytest.raises(ValueError, match=r"^metrics should be LoaderStats keys \(epoch, "):
        fit(tmp_path, loader, [LoaderStatsLogger(metrics=["rows", "waits"])], epochs=1)
    assert loader.stats().epoch is None  # refused as training starts, before any batch
