"""Tests for the command line: ``python -m lance_prefetch demo`` on scikit-learn's digits."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from lance_prefetch import _cli as cli
from lance_prefetch import _demo as demo


@pytest.mark.system
@pytest.mark.slow
@pytest.mark.timeout(300)  # the subprocess is bounded at 300 s
def test_demo_learns_and_reports_throughput(tmp_path):
    """Acceptance 9: the demo's held-out accuracy is far above chance (10%) after 3 epochs, and
    every epoch line carries rows/s and the wait fraction."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "lance_prefetch",
            "demo",
            "--epochs",
            "3",
            "--data-dir",
            str(tmp_path),
            "--readahead",
            "4",
            "--max-in-flight",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    lines = re.findall(
        r"^epoch (\d): loss ([\d.]+)  held-out accuracy ([\d.]+)  rows/s ([\d,]+)  "
        r"waiting for data ([\d.]+)% of [\d.]+ s$",
        result.stdout,
        flags=re.MULTILINE,
    )
    assert [int(line[0]) for line in lines] == [0, 1, 2], result.stdout
    accuracies = [float(line[2]) for line in lines]
    assert accuracies[-1] > 0.85
    assert float(lines[-1][1]) < float(lines[0][1])  # the loss went down
    assert all(int(line[3].replace(",", "")) > 0 for line in lines)
    assert all(0.0 <= float(line[4]) <= 100.0 for line in lines)


def test_demo_train_on_a_given_uri_reports_every_epoch(tmp_path):
    train_uri, test_uri = demo.write_digits(tmp_path)
    reports = demo.train(train_uri, eval_uri=test_uri, epochs=2, batch_size=128)
    assert [r.epoch for r in reports] == [0, 1]
    assert all(0.0 <= r.wait_fraction <= 1.0 and r.rows_per_s > 0 for r in reports)
    # 1,437 training rows, batch 128, drop_last: 11 full batches = 1,408 rows an epoch.
    assert all(abs(r.rows_per_s * r.seconds - 1408) < 1e-6 for r in reports)
    without_eval = demo.train(train_uri, epochs=1, batch_size=256)
    assert without_eval[0].accuracy is None


def test_write_digits_is_real_data_split_without_overlap(tmp_path):
    import lance

    train_uri, test_uri = demo.write_digits(tmp_path)
    train = lance.dataset(train_uri).to_table()
    test = lance.dataset(test_uri).to_table()
    assert train.num_rows + test.num_rows == 1797
    assert not set(train.column("id").to_pylist()) & set(test.column("id").to_pylist())
    assert (
        str(train.schema.field("image").type)
        == "fixed_size_list<item: fixed_size_list<item: uint8>[8]>[8]"
    )
    assert demo.write_digits(tmp_path) == (train_uri, test_uri)  # reused, not rewritten
    assert lance.dataset(train_uri).version == 1


def test_demo_with_a_cache_and_auto_depths(tmp_path, capsys):
    """--cache memory --readahead auto --max-in-flight auto: every epoch's batches come from the
    cache (the first take of the check batch filled it) and the 11 batches of an epoch arrive."""
    assert (
        cli.main(
            [
                "demo",
                "--data-dir",
                str(tmp_path),
                "--epochs",
                "2",
                "--batch-size",
                "128",
                "--cache",
                "memory",
                "--readahead",
                "auto",
                "--max-in-flight",
                "auto",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "readahead=auto max_in_flight=auto cache=memory epochs=2" in out
    stats = re.findall(r"loader.stats\(\): epoch (\d): (\d+) batches.*cache hits ([\d.]+)%", out)
    assert stats == [("0", "11", "100.0"), ("1", "11", "100.0")]
    with pytest.raises(SystemExit):
        cli.main(["demo", "--readahead", "most"])
    assert "should be an integer >= 1 or auto, got 'most'" in capsys.readouterr().err


def test_cli_reports_library_errors_without_a_traceback(tmp_path, capsys):
    status = cli.main(["demo", "--uri", str(tmp_path / "missing.lance"), "--epochs", "1"])
    assert status == 1
    assert capsys.readouterr().err.startswith("FileNotFoundError: source: no Lance dataset at")


def test_cli_rejects_bad_numbers(capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["demo", "--batch-size", "0"])
    assert info.value.code == 2
    assert "should be an integer >= 1, got 0" in capsys.readouterr().err


def test_demo_refuses_unusable_columns(tmp_path):
    import lance
    import pyarrow as pa

    uri = str(tmp_path / "odd.lance")
    table = pa.table({"x": [1.0, 2.0, 3.0, 4.0], "neg": [0, -1, 1, 0], "name": list("abcd")})
    lance.write_dataset(table, uri)
    with pytest.raises(ValueError, match=r"^the label column 'neg' holds -1; labels should be"):
        demo.train(uri, columns=["x", "neg"], batch_size=2, epochs=1)
    with pytest.raises(ValueError, match=r"^column 'name' is not numeric"):
        demo.train(uri, columns=["name", "neg"], batch_size=2, epochs=1)
    with pytest.raises(ValueError, match=r"^the label column 'x' should hold integers"):
        demo.train(uri, columns=["neg", "x"], batch_size=2, epochs=1)


#: ``python -m lance_prefetch ARGS`` as if the bench were not installed: ``None`` in
#: ``sys.modules`` halts the import of ``lance_prefetch_bench`` with ModuleNotFoundError, as a
#: missing package does (whether or not ``make install`` installed it here).
WITHOUT_THE_BENCH = (
    "import runpy, sys; sys.modules['lance_prefetch_bench'] = None; sys.argv[0] = 'lance-prefetch'; "
    "runpy.run_module('lance_prefetch', run_name='__main__', alter_sys=True)"
)


@pytest.mark.slow
@pytest.mark.parametrize("argv", [["bench"], ["bench", "--local-s3", "--rows", "1000"]])
def test_bench_without_the_bench_installed_exits_2_with_one_line_saying_how_to_install_it(argv):
    result = subprocess.run(
        [sys.executable, "-c", WITHOUT_THE_BENCH, *argv],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == (
        "lance-prefetch bench needs the lance-prefetch-bench distribution, which is not "
        "installed: pip install -e benchmarks (from a checkout), or run make bench\n"
    )


def test_the_command_lists_bench_and_where_it_comes_from(capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["--help"])
    assert info.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert (
        "bench measure PrefetchLoader against the usual ways to read random batches (runs "
        "lance-prefetch-bench, installed apart: pip install -e benchmarks)"
    ) in out
