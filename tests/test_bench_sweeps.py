"""The like-for-like rows of the bench: the coalesced ceiling (the loader's own takes), the
sequential scan, the peers and map-style at the best of a sweep of their own concurrency, the
reader and takes per batch of every row, and ``--sweep-loader`` (the defaults against a grid)."""

from __future__ import annotations

import argparse

import lance
import numpy as np
import pytest

from lance_prefetch_bench import _arguments, report, verdicts
from lance_prefetch_bench._ceiling import coalesced_takes
from lance_prefetch_bench._spec import ContenderSpec, plan_batches
from lance_prefetch_bench.config import SWEEP_GRID, BenchConfig
from lance_prefetch_bench.contenders import run_contender
from lance_prefetch_bench.data import write_synthetic
from lance_prefetch_bench.run import _plan, run_bench

ROWS, BATCH, BATCHES = 600, 32, 5


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    uri = write_synthetic(
        str(tmp_path_factory.mktemp("sweeps") / "tiny.lance"), ROWS, rows_per_file=200
    )
    return uri, lance.dataset(uri).version


def _spec(tiny, kind, **settings):
    uri, version = tiny
    return ContenderSpec(
        kind=kind,
        uri=uri,
        version=version,
        num_rows=ROWS,
        columns=["id", "vector", "label"],
        batch_size=BATCH,
        batches=BATCHES,
        warmup_batches=1,
        step_ms=0,
        record_ids=True,
        **settings,
    )


def _fake(name, label, rate, **settings):
    return {
        "name": name,
        "label": label,
        "settings": settings,
        "uniform": "yes",
        "setup_s": 0.1,
        "warmup_s": 0.1,
        "passes": {
            "throughput": {
                "rows_per_s": rate,
                "batches_per_s": 1.0,
                "mib_per_s": 1.0,
                "first_batch_s": 0.01,
            },
            "step": {"wait_fraction": 0.1},
        },
    }


# -- the coalesced ceiling -------------------------------------------------------------------------
def test_coalesced_takes_lay_groups_of_batches_end_to_end():
    batches = [np.arange(i * 4, i * 4 + 4) for i in range(10)]  # 10 batches of 4 rows
    # enough takes to cover 5 batches (2 of 3) and two a thread (4 for 2 threads)
    takes = coalesced_takes(batches, 3, 2, 5)
    assert [take.tolist() for take in takes] == [
        list(range(0, 12)),
        list(range(12, 24)),
        list(range(24, 36)),
        [36, 37, 38, 39],  # the epoch's last batch: a smaller take
    ]
    assert len(coalesced_takes(batches, 3, 1, 5)) == 2  # ceil(5 / 3), 2 for 1 thread
    assert len(coalesced_takes(batches, 2, 8, 5)) == 5  # capped at the epoch's 10 batches


def test_coalesced_ceiling_reads_the_loaders_takes_through_its_reader(tiny):
    spec = _spec(tiny, "coalesced-ceiling", defaults=True, concurrency=[1, 2], ceiling_repeats=1)
    result = run_contender(spec)
    # 18 batches an epoch: the defaults' 128-batch takes (4096 rows) are cut, as the loader
    # does for a small epoch, to ceil(18 / (2 * 4 takes in flight at the start)) = 3 batches
    assert result["coalesce"] == 3
    throughput = result["passes"]["throughput"]
    # max(ceil(5 batches / 3), 2 takes x 2 threads) = 4 takes of 3 batches of 32 rows
    assert throughput["takes"] == 4 and throughput["rows"] == 4 * 3 * BATCH
    assert throughput["batches"] == 12 and "step" not in result["passes"]
    assert [point["concurrency"] for point in result["sweep"]] == [1, 2]
    assert result["best_concurrency"] == throughput["concurrency"]
    assert throughput["rows_per_s"] == max(p["rows_per_s"] for p in result["sweep"])
    # the ids of the first 5 batches: the plan's, in the same batches as the loader's
    expected = sorted(int(i) for b in plan_batches(spec, 0, BATCHES) for i in b)
    assert result["ids"]["0"]["ids"] == expected and result["ids"]["0"]["from"] == "id column"
    loader = run_contender(_spec(tiny, "lance-prefetch", defaults=True))
    assert result["ids"]["0"]["batches_sha256"] == loader["ids"]["0"]["batches_sha256"]
    assert result["io"] == loader["io"] and result["io"] in ("uring", "default")
    row = {"name": "coalesced-ceiling", "settings": {}, **result}
    assert report.takes_text(row, BATCH) == "1/3"
    assert (
        report.reader_text(row) == {"uring": "io_uring", "default": "Lance default"}[result["io"]]
    )


def test_a_fixed_max_in_flight_is_the_coalesced_ceilings_only_pool(tiny):
    spec = _spec(
        tiny,
        "coalesced-ceiling",
        readahead=4,
        max_in_flight=2,
        coalesce=2,
        concurrency=[1, 8],
        ceiling_repeats=1,
    )
    result = run_contender(spec)
    assert result["coalesce"] == 2
    assert [point["concurrency"] for point in result["sweep"]] == [2]
    assert result["passes"]["throughput"]["takes"] == 4  # max(ceil(5 / 2), 2 x 2)


# -- the scan --------------------------------------------------------------------------------------
def test_scan_reads_the_dataset_in_disk_order(tiny):
    result = run_contender(_spec(tiny, "scan"))
    for epoch in ("0", "1"):
        assert result["ids"][epoch]["ids"] == list(range(BATCHES * BATCH))
    assert result["passes"]["throughput"]["takes"] == 0
    row = {"name": "scan", "settings": {"batch_readahead": 16}, **result}
    assert report.reader_text(row) == "sequential scan"
    assert report.takes_text(row, BATCH) == "0 (scan)"
    assert report.uniform_text(row) == "no (sequential scan, disk order)"
    assert "scan" in verdicts.EXCLUDED_FROM_IDS


# -- the sweeps ------------------------------------------------------------------------------------
def test_sweep_winners_pick_the_most_rows_per_s_of_each_name():
    contenders = [
        _fake("grain", "grain num_threads=4", 900.0, num_threads=4),
        _fake("grain", "grain num_threads=16", 1200.0, num_threads=16),
        _fake("spdl", "spdl concurrency=4", 700.0, concurrency=4),
        _fake("spdl", "spdl concurrency=16", 650.0, concurrency=16),
        {
            "name": "spdl",
            "label": "spdl concurrency=32",
            "error": "boom",
            "settings": {"concurrency": 32},
        },
        _fake("map-style", "map-style num_workers=2", 300.0, num_workers=2),
        _fake("sequential", "sequential", 5000.0),  # not swept
    ]
    winners = verdicts.sweep_winners(contenders)
    assert [(w["name"], w["parameter"], w["value"], w["rows_per_s"]) for w in winners] == [
        ("grain", "num_threads", 16, 1200.0),
        ("spdl", "concurrency", 4, 700.0),
        ("map-style", "num_workers", 2, 300.0),
    ]
    assert winners[1]["tried"] == [(4, 700.0), (16, 650.0)] and winners[1]["label"] == (
        "spdl concurrency=4"
    )
    assert [w["edge"] for w in winners] == ["highest", "lowest", None]  # map-style: one value
    # what the targets and the plot compare with: the winner
    assert verdicts.by_name(contenders, "grain")["label"] == "grain num_threads=16"
    assert verdicts.by_name(contenders, "spdl")["label"] == "spdl concurrency=4"
    table = report.table_rows(
        {"meta": {"settings": {"step_ms": 1, "batch_size": 64}}, "contenders": contenders}
    )
    names = [row[0] for row in table[1:]]
    assert names[:4] == [
        "grain",
        "**grain** (best of its sweep)",
        "**spdl** (best of its sweep)",
        "spdl",
    ]
    assert names[5] == "map-style"  # one setting: nothing to win
    lines = report.sweep_lines(contenders)
    assert (
        "- spdl: **concurrency=4** (700 rows/s; tried 4: 700, 16: 650; the lowest value tried: "
        "a wider sweep may find more)" in lines
    )
    middle = [
        _fake("grain", f"grain num_threads={n}", rate, num_threads=n)
        for n, rate in ((4, 1.0), (16, 3.0), (64, 2.0))
    ]
    assert verdicts.sweep_winners(middle)[0]["edge"] is None
    assert "- grain: **num_threads=16** (3 rows/s; tried 4: 1, 16: 3, 64: 2)" in (
        report.sweep_lines(middle)
    )


def test_every_row_names_its_reader_and_takes_per_batch():
    rows = {
        "grain": "peer's own, takes through Lance default",
        "spdl": "peer's own, takes through io_uring",
        "lancedb-streaming": "peer's own (LanceDB take_offsets)",
        "map-style": "Lance default",
        "ceiling": "io_uring",
    }
    ios = {"grain": "default", "spdl": "uring", "map-style": "default", "ceiling": "uring"}
    for name, reader in rows.items():
        row = {"name": name, "io": ios.get(name, "default"), "settings": {}}
        assert report.reader_text(row) == reader, name
    takes = {name: report.takes_text({"name": name}, 256) for name in rows}
    assert takes == {
        "grain": "1",
        "spdl": "1",
        "lancedb-streaming": "4 (64-row take_offsets)",
        "map-style": "1",
        "ceiling": "1",
    }


def test_defaults_vs_best_is_the_defaults_over_the_best_grid_setting():
    defaults = _fake(
        "lance-prefetch", "lance-prefetch defaults", 900.0, defaults=True, readahead="auto"
    )
    grid = [
        _fake("lance-prefetch", "lance-prefetch r8/m4", 1000.0, readahead=8, max_in_flight=4),
        _fake("lance-prefetch", "lance-prefetch r64/m16", 1200.0, readahead=64, max_in_flight=16),
        _fake(  # a cache is another family: not compared
            "lance-prefetch", "lance-prefetch r8/m4 memory", 9000.0, readahead=8, cache="memory"
        ),
    ]
    versus = verdicts.defaults_vs_best([defaults, *grid])
    assert versus == {
        "defaults": 900.0,
        "best": 1200.0,
        "best_label": "lance-prefetch r64/m16",
        "ratio": 0.75,
        "settings": 2,
    }
    assert verdicts.defaults_vs_best(grid) is None  # no defaults row
    assert verdicts.defaults_vs_best([defaults]) is None  # nothing to compare with
    assert "**Defaults vs the best setting:** 0.75x" in "\n".join(
        report.sweep_lines([defaults, *grid])
    )


def test_the_plan_sweeps_each_peer_and_runs_both_ceilings():
    config = BenchConfig(
        uri="/data/x.lance",
        readahead=(4,),
        max_in_flight=(4,),
        io_grid=("auto", "default"),
        map_workers=(1, 3),
        grain_threads=(2, 8),
        streaming_splits=(1,),
        coalesced_ceiling_concurrency=(2, 4),
        contenders=("map-style", "ceiling", "coalesced-ceiling", "scan", "lance-prefetch")
        + ("grain", "lancedb-streaming"),
    )
    base = {
        "uri": "/data/x.lance",
        "version": 1,
        "num_rows": 1000,
        "columns": ["id"],
        "batch_size": 8,
        "batches": 4,
    }
    planned = {label: (settings, spec) for _, label, settings, spec in _plan(config, base)}
    assert list(planned) == [
        "map-style num_workers=1",
        "map-style num_workers=3",
        "ceiling",
        "coalesced-ceiling",
        "scan",
        "lance-prefetch defaults",
        "lance-prefetch r4/m4",
        "lance-prefetch r4/m4 io=default",
        "grain num_threads=2",
        "grain num_threads=8",
        "lancedb-streaming num_splits=1",
    ]
    assert planned["map-style num_workers=3"][1].num_workers == 3
    assert planned["grain num_threads=8"][1].threads == 8
    settings, spec = planned["coalesced-ceiling"]
    assert spec.defaults and spec.concurrency == [2, 4]
    assert settings["concurrency"] == [2, 4] and settings["coalesce"] == "auto"
    assert planned["lance-prefetch r4/m4 io=default"][1].io == "default"
    assert planned["lance-prefetch r4/m4"][1].io == "auto"


# -- --sweep-loader --------------------------------------------------------------------------------
def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    _arguments.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_sweep_loader_runs_the_loader_over_its_grid():
    config = _arguments.config_from_args(_args("--sweep-loader", "/data/x.lance"))
    assert config.contenders == ("lance-prefetch",) and config.sweep_loader
    assert config.readahead == SWEEP_GRID["readahead"] == (8, 64)
    assert config.max_in_flight == (4, 16) and config.coalesce == ("auto", 1)
    assert config.io_grid == ("auto", "default")
    assert len(config.prefetch_settings()) == 3 * 2 * 2  # (8,4), (64,4), (64,16)
    # an option given keeps its value; on an object store the reader is not swept
    config = _arguments.config_from_args(_args("--sweep-loader", "--local-s3", "--readahead", "32"))
    assert config.readahead == (32,) and config.io_grid == ("auto",)
    assert config.max_in_flight == (4, 16)
    # given at the bench's own default value, an option is kept too
    config = _arguments.config_from_args(_args("--sweep-loader", "--coalesce", "auto"))
    assert config.coalesce == ("auto",) and config.readahead == (8, 64)
    plain = _arguments.config_from_args(_args("/data/x.lance"))
    assert (
        not plain.sweep_loader and plain.io_grid == ("auto",) and plain.readahead == (1, 4, 16, 64)
    )


def test_config_refuses_a_bad_io_grid():
    with pytest.raises(ValueError, match="io_grid should be among"):
        BenchConfig(io_grid=("fast",))
    with pytest.raises(ValueError, match="'uring' reads local datasets only"):
        BenchConfig(local_s3=True, io_grid=("uring",))
    with pytest.raises(ValueError, match="map_workers should be integers >= 1"):
        BenchConfig(map_workers=(0,))
    assert BenchConfig(map_workers=3).map_workers == (3,)


@pytest.mark.system
@pytest.mark.timeout(240)  # a process per contender
def test_a_run_shows_the_new_rows_and_the_winners(tiny, tmp_path):
    config = BenchConfig(
        uri=tiny[0],
        batch_size=BATCH,
        batches=BATCHES,
        warmup_batches=1,
        step_ms=0,
        readahead=(4,),
        max_in_flight=(2,),
        ceiling_repeats=1,
        coalesced_ceiling_concurrency=(1, 2),
        spdl_concurrency=(1, 2),
        contenders=("coalesced-ceiling", "scan", "lance-prefetch", "spdl"),
        out_dir=tmp_path,
        name="sweeps",
        progress=False,
        sweep_loader=True,
    )
    result, paths = run_bench(config)
    assert verdicts.failures(result["contenders"]) == []
    assert result["ids_check"]["ok"]  # the coalesced ceiling read the plan's batches
    markdown = paths["markdown"].read_text()
    rows = {line.split(" | ")[0].strip("| *"): line for line in markdown.splitlines()}
    assert "| 1/3 | yes |" in rows["coalesced-ceiling"]
    assert "| sequential scan | 0 (scan) | no (sequential scan, disk order) |" in rows["scan"]
    assert "**Sweeps** (each contender at the best of its own concurrency):" in markdown
    assert "- spdl: **concurrency=" in markdown
    assert "**Defaults vs the best setting:**" in markdown
