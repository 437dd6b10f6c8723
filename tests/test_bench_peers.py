"""The peer loaders as bench contenders (Grain, SPDL, LanceDB's StreamingDataset): each reads
real rows of a tiny dataset; a peer that is not installed is a skipped row saying how to install
it. `make install` installs the `peers` extra after torch, so these tests need no skip."""

from __future__ import annotations

import lance
import numpy as np
import pytest

from lance_prefetch_bench import _peer_contenders, report, verdicts
from lance_prefetch_bench._arguments import _contenders
from lance_prefetch_bench._spec import ContenderSpec, plan_batches
from lance_prefetch_bench.config import BenchConfig
from lance_prefetch_bench.contenders import run_contender
from lance_prefetch_bench.data import write_synthetic
from lance_prefetch_bench.run import run_bench

ROWS, BATCH, BATCHES = 600, 32, 5


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    uri = write_synthetic(
        str(tmp_path_factory.mktemp("peers") / "tiny.lance"), ROWS, rows_per_file=200
    )
    return uri, lance.dataset(uri).version


def _run(tiny, kind, **settings):
    uri, version = tiny
    spec = ContenderSpec(
        kind=kind,
        uri=uri,
        version=version,
        num_rows=ROWS,
        columns=["id", "vector", "label"],
        batch_size=BATCH,
        batches=BATCHES,
        warmup_batches=1,
        step_ms=1,
        record_ids=True,
        **settings,
    )
    return spec, run_contender(spec)


def _check_passes(result, *, takes):
    for name, epoch in (("throughput", "0"), ("step", "1")):
        metrics = result["passes"][name]
        assert metrics["rows"] == BATCHES * BATCH and metrics["batches"] == BATCHES
        assert metrics["rows_per_s"] > 0 and 0 < metrics["first_batch_s"] < metrics["seconds"]
        assert metrics["takes"] == takes
        record = result["ids"][epoch]
        assert record["from"] == "id column" and record["rows"] == BATCHES * BATCH
        ids = record["ids"]
        assert len(set(ids)) == len(ids) and 0 <= ids[0] and ids[-1] < ROWS  # no repeats
    assert result["ids"]["0"]["ids"] != result["ids"]["1"]["ids"]  # each epoch its own shuffle
    assert result["peak_rss_self_mib"] > 0


def _plan_ids(spec, epoch):
    return sorted(int(i) for batch in plan_batches(spec, epoch, BATCHES) for i in batch)


def test_spdl_reads_the_plans_batches_in_order(tiny):
    spec, result = _run(tiny, "spdl", threads=3)
    _check_passes(result, takes=BATCHES)
    for epoch in (0, 1):
        assert result["ids"][str(epoch)]["ids"] == _plan_ids(spec, epoch)
    # the same batches in the same order as the loader's
    _, loader = _run(tiny, "lance-prefetch", defaults=True)
    for epoch in ("0", "1"):
        assert result["ids"][epoch]["batches_sha256"] == loader["ids"][epoch]["batches_sha256"]


def test_grain_reads_grains_global_shuffle_one_take_per_batch(tiny):
    import grain.python as grain

    spec, result = _run(tiny, "grain", threads=2)
    _check_passes(result, takes=BATCHES)  # one take per index batch, no row reads
    for epoch in (0, 1):
        shuffled = grain.MapDataset.range(ROWS).shuffle(seed=spec.seed + epoch)
        expected = sorted(int(shuffled[i]) for i in range(BATCHES * BATCH))
        assert result["ids"][str(epoch)]["ids"] == expected
        assert expected != _plan_ids(spec, epoch)  # its own order, hence out of the ids check
    assert "grain" in verdicts.EXCLUDED_FROM_IDS


def test_lancedb_streaming_reads_rows_of_its_own_permutation(tiny):
    _, result = _run(tiny, "lancedb-streaming", splits=2)
    _check_passes(result, takes=0)  # its reads run inside LanceDB: not timed
    ids = np.array(result["ids"]["0"]["ids"])
    assert not np.array_equal(ids, np.arange(ids.size))  # not the first rows in order
    assert "lancedb-streaming" in verdicts.EXCLUDED_FROM_IDS


@pytest.mark.slow
def test_a_missing_peer_is_a_skipped_row_with_the_install_line(tiny, tmp_path, monkeypatch):
    """grain reported missing: the run goes on, its row says how to install it, nothing fails."""
    assert _contenders("sequential,peers") == ("sequential", "grain", "spdl", "lancedb-streaming")
    found = _peer_contenders.importlib.util.find_spec
    monkeypatch.setattr(
        _peer_contenders.importlib.util,
        "find_spec",
        lambda name, *a: None if name == "grain" else found(name, *a),
    )
    hint = "grain needs grain, which is not installed: install the peers after torch: pip install 'lance-prefetch-bench[peers]'"
    assert _peer_contenders.missing_peer("grain").startswith(hint)
    assert _peer_contenders.missing_peer("spdl") is None
    config = BenchConfig(
        uri=tiny[0],
        batch_size=BATCH,
        batches=2,
        warmup_batches=0,
        step_ms=0,
        contenders=("sequential", "grain"),
        grain_threads=(16,),
        out_dir=tmp_path,
        name="skip",
        progress=False,
    )
    result, paths = run_bench(config)
    sequential, grain_row = result["contenders"]
    assert sequential["passes"]["throughput"]["rows"] == 2 * BATCH
    assert grain_row["skipped"].startswith(hint) and "passes" not in grain_row
    assert verdicts.failures(result["contenders"]) == []
    markdown = paths["markdown"].read_text()
    assert (
        f"| grain | ReadOptions(num_threads=16), one take per index batch | peer's own, takes "
        f"through n/a | 1 | yes (its own shuffle) | skipped: {hint}" in markdown
    )
    assert "**Targets:**" not in markdown and "targets" not in result  # only with --targets
    assert paths["plot"].stat().st_size > 10_000


def test_the_defaults_row_is_marked_and_kept_out_of_the_tuned_settings():
    def run(label, settings, rate):
        passes = {
            "rows_per_s": rate,
            "batches_per_s": 1.0,
            "mib_per_s": 1.0,
            "first_batch_s": 0.25,
            "take_p50_ms": 1.0,
            "take_p99_ms": 2.0,
        }
        return {
            "name": "lance-prefetch",
            "label": label,
            "settings": settings,
            "uniform": "yes",
            "setup_s": 0.1,
            "warmup_s": 0.2,
            "peak_rss_mib": 321.0,
            "cold_first_batch_s": 0.6,
            "passes": {"throughput": passes, "step": {"wait_fraction": 0.01}},
        }

    defaults = run(
        "lance-prefetch defaults",
        {"defaults": True, "readahead": "auto", "max_in_flight": "auto", "coalesce": "auto"},
        9000.0,
    )
    tuned = run("lance-prefetch r4/m4", {"readahead": 4, "max_in_flight": 4}, 5000.0)
    assert verdicts.prefetch_runs([defaults, tuned]) == [tuned]
    assert verdicts.best_prefetch([defaults, tuned]) is tuned
    table = report.table_rows(
        {"meta": {"settings": {"step_ms": 50, "batch_size": 8}}, "contenders": [defaults, tuned]}
    )
    assert table[0][:7] == [
        "contender",
        "settings",
        "reader",
        "takes/batch",
        "uniform",
        "rows/s",
        "spread (min-max, runs)",
    ]
    # the defaults read more than the tuned setting: they carry the (best) mark, not it
    assert table[1][:11] == [
        "**lance-prefetch defaults** (best)",
        "no tuning arguments (its defaults: readahead=auto, max_in_flight=auto, coalesce=auto)",
        "n/a",
        "n/a",
        "yes",
        "9,000",
        "1 run",
        "1.0",
        "1.0",
        "600",
        "250",
    ]
    assert table[1][13] == "321"  # peak RSS MiB
    assert table[2][:6] == [
        "lance-prefetch",
        "readahead=4, max_in_flight=4",
        "n/a",
        "n/a",
        "yes",
        "5,000",
    ]
