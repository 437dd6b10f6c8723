"""Tests for ``benchmarks/scale.py``: its size parsing, its fill detection, the page-cache eviction
it relies on, and end-to-end runs on tiny datasets (the table and the JSON it writes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("psutil")

BENCHMARKS = Path(__file__).parents[1] / "benchmarks"
ROWS = 5_000


@pytest.fixture(scope="module")
def scale():
    """benchmarks/scale.py as a module."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import scale

        yield scale
    finally:
        sys.path.remove(str(BENCHMARKS))


@pytest.fixture
def need_nginx():
    """Skip without nginx, except under CI (CI=true), where `make test` must have installed it."""
    from lance_prefetch_bench import local_s3

    try:
        local_s3.find_nginx()
    except FileNotFoundError:
        if os.environ.get("CI"):
            raise
        pytest.skip("nginx is not installed (make install installs it)")


def test_sizes_take_k_m_g_suffixes(scale):
    assert [scale.parse_size(s) for s in ("5000", "200k", "2M", "1.5m", "1G")] == [
        5_000,
        200_000,
        2_000_000,
        1_500_000,
        1_000_000_000,
    ]
    for bad in ("", "0", "-3k", "two"):
        with pytest.raises(
            ValueError,
            match=f"^a size should be a number of rows like 200k or 2M, but got {bad!r}$",
        ):
            scale.parse_size(bad)


def test_densities_keep_three_significant_digits(scale):
    assert [scale.percent(x) for x in (0.0205, 0.000128, 4096 / 20_000_000, 1.0)] == [
        "2.05%",
        "0.0128%",
        "0.0205%",
        "100%",
    ]


def test_a_fill_is_seen_when_a_samples_new_takes_are_hits(scale):
    """Served: the rows taken since the previous sample of the same iteration were hits (hit
    ratio x rows taken), or a new iteration's own ratio is 1; not while takes still miss."""
    sample = scale.Sample
    filling = [sample(0.5, 1000, 0, 2000, 0.0), sample(1.0, 3000, 0, 4000, 0.25)]
    assert not scale._served(filling)  # 1000 hits of the 2000 new rows: half
    filled = [sample(0.5, 1000, 0, 2000, 0.0), sample(1.0, 3000, 0, 4000, 0.5)]
    assert scale._served(filled)  # 2000 hits of the 2000 new rows
    assert scale._served([sample(0.5, 1000, 0, 2000, 0.3), sample(1.0, 1500, 1, 500, 1.0)])
    assert not scale._served([sample(0.5, 1000, 0, 2000, 0.3), sample(1.0, 1500, 1, 500, 0.5)])
    assert not scale._served([sample(0.5, 1000, 0, 2000, 0.0), sample(1.0, 1000, 0, 2000, 0.0)])
    assert not scale._served([sample(0.5, 0, None, 0, None), sample(1.0, 256, 0, 256, None)])


def test_evicted_files_are_read_from_disk_again(scale, tmp_path):
    """posix_fadvise(DONTNEED) after fdatasync drops a file from the page cache without root: its
    next read is slower than the one after it (warm)."""
    path = tmp_path / "blob"
    path.write_bytes(os.urandom(32 << 20))
    scale.read_all([path])
    scale.evict([path])
    cold = scale.read_all([path])
    warm = scale.read_all([path])
    assert cold > warm


def _run(tmp_path: Path, *args: str) -> tuple[dict, list[list[str]]]:
    """Run the script on ``ROWS`` rows; its JSON and the cells of its printed tables' lines."""
    out = tmp_path / "scale.json"
    done = subprocess.run(
        [
            sys.executable,
            str(BENCHMARKS / "scale.py"),
            f"--sizes={ROWS}",
            "--seconds=1.5",
            f"--out={out}",
            f"--data-dir={tmp_path / 'data'}",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line for line in done.stdout.splitlines() if line.startswith("| ")]
    return json.loads(out.read_text()), [
        [c.strip() for c in ln.strip("|").split("|")] for ln in lines
    ]


def _check_table(scale, cells: list[list[str]], where: str, contenders) -> dict[str, list[str]]:
    assert cells[0] == list(scale.TABLE_COLUMNS)
    lines = {line[2]: line for line in cells[1 : 1 + len(contenders)]}
    assert list(lines) == list(contenders)
    for line in lines.values():
        assert line[:2] == [where, f"{ROWS:,}"]
    return lines


def _check_figures(result: dict, batch_size: int = 256) -> None:
    """Rows were read, memory measured, and the density is rows a take / rows."""
    assert result["rows"] == ROWS
    assert result["rows_per_s"] > 0 and result["rows_read"] > 0
    assert result["peak_rss_mib"] > 100  # Python, torch, pyarrow and Lance at least
    # allocated memory, a part of the RSS (Linux: RssAnon, sampled every 0.1 s)
    assert 100 < result["peak_anon_mib"] <= result["peak_rss_mib"]
    assert 0 < result["first_batch_s"] < result["seconds"]
    assert result["rows_per_take"] == result["coalesce"] * batch_size
    assert result["density"] == result["rows_per_take"] / ROWS


@pytest.mark.system
def test_local_run_reports_cold_and_warm_defaults(scale, tmp_path):
    """``--local``: the dataset written to --data-dir, a cold then a warm run of the defaults,
    each in its own process, in the table and the JSON with sane figures."""
    report, cells = _run(tmp_path, "--local")
    lines = _check_table(scale, cells, "local", scale.LOCAL_CONTENDERS)
    assert [r["contender"] for r in report["results"]] == list(scale.LOCAL_CONTENDERS)
    for result in report["results"]:
        _check_figures(result)
        line = lines[result["contender"]]
        assert line[3] == f"{result['rows_per_take']:,}"
        assert line[4] == scale.percent(result["density"])
        assert line[5] == f"{result['rows_per_s']:,.0f}"
    check = report["local"]["eviction_checks"][str(ROWS)]
    assert check["bytes"] == sum(
        p.stat().st_size for p in (tmp_path / "data").rglob("*") if p.is_file()
    )
    assert "s3" not in report and report["coalescing"] == []


@pytest.mark.system
def test_s3_run_reports_every_contender_and_the_coalescing_gain(scale, tmp_path, need_nginx):
    """``--s3`` on the emulated S3: defaults, coalesce=1, the disk cache filling then filled (a
    fill time and bandwidth), the memory cache (a fill time); the gain table divides the
    defaults' rows/s by coalesce=1's at the defaults' density."""
    report, cells = _run(tmp_path, "--s3")
    _check_table(scale, cells, "s3", scale.S3_CONTENDERS)
    results = {r["contender"]: r for r in report["results"]}
    assert list(results) == list(scale.S3_CONTENDERS)
    for result in results.values():
        _check_figures(result)
    assert results["coalesce=1"]["rows_per_take"] == 256
    nbytes = results["defaults"]["dataset_mib"]
    for filling in ("disk-filling", "memory"):
        fill = results[filling]["fill_s"]
        assert 0 < fill < results[filling]["seconds"]
        assert results[filling]["fill_mib_per_s"] == pytest.approx(nbytes / fill)
    assert results["disk-filled"]["cache_hit_ratio"] == 1.0  # the copy, found whole
    [gain] = report["coalescing"]
    assert gain["gain"] == results["defaults"]["rows_per_s"] / results["coalesce=1"]["rows_per_s"]
    assert gain["density"] == results["defaults"]["rows_per_take"] / ROWS
    assert cells[len(scale.S3_CONTENDERS) + 1] == list(scale.GAIN_COLUMNS)
    assert cells[-1][0] == f"{ROWS:,}" and cells[-1][5] == f"{gain['gain']:.2f}x"
