"""Tests for ``lance-prefetch bench``: the emulated S3, the bookkeeping, the outputs, the cleanup."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

psutil = pytest.importorskip("psutil")
pytest.importorskip("matplotlib")
pytest.importorskip("tqdm")

from support.helpers import wait_until  # noqa: E402

from lance_prefetch import _cli as cli  # noqa: E402
from lance_prefetch.plan.sampling import EpochPlan  # noqa: E402
from lance_prefetch_bench import _cli as bench_cli  # noqa: E402
from lance_prefetch_bench import local_s3, report, verdicts  # noqa: E402
from lance_prefetch_bench._process import ManagedProcess  # noqa: E402
from lance_prefetch_bench.config import BenchConfig  # noqa: E402
from lance_prefetch_bench.data import write_synthetic  # noqa: E402
from lance_prefetch_bench.latency_proxy import Latency  # noqa: E402
from lance_prefetch_bench.run import run_bench  # noqa: E402


@pytest.fixture
def need_nginx():
    """Skip without nginx, except under CI (CI=true), where `make test` must have installed it."""
    try:
        local_s3.find_nginx()
    except FileNotFoundError:
        if os.environ.get("CI"):
            raise
        pytest.skip("nginx is not installed (make install installs it)")


def _listening_ports() -> set[int]:
    return {
        conn.laddr.port
        for conn in psutil.net_connections(kind="tcp")
        if conn.status == psutil.CONN_LISTEN
    }


def _processes_mentioning(text: str) -> list[str]:
    found = []
    for process in psutil.process_iter(["cmdline"]):
        cmdline = " ".join(process.info["cmdline"] or [])
        if text in cmdline and process.pid != os.getpid():
            found.append(f"{process.pid}: {cmdline[:200]}")
    return found


# -- the emulated S3 -------------------------------------------------------------------------------
def test_local_s3_routes_reads_to_nginx_and_the_api_to_rclone(need_nginx):
    """Lance writes and reads through the endpoint; an object GET with a Range gets a real 206
    (nginx), a request without a signature is refused (rclone checks it); all stopped at exit."""
    import lance

    with local_s3.LocalS3(latency=None) as s3:
        uri = write_synthetic(
            s3.uri("t.lance"), 300, rows_per_file=100, storage_options=s3.storage_options()
        )
        dataset = lance.dataset(uri, storage_options=s3.storage_options())
        assert dataset.take([299, 0, 150], columns=["id"]).column("id").to_pylist() == [299, 0, 150]
        data_file = dataset.get_fragments()[0].data_files()[0].path
        port = int(s3.endpoint.rsplit(":", 1)[1])
        with contextlib.closing(http.client.HTTPConnection("127.0.0.1", port, timeout=10)) as http_:
            http_.request("GET", f"/bench/t.lance/data/{data_file}", headers={"Range": "bytes=0-9"})
            response = http_.getresponse()
            assert (response.status, len(response.read())) == (206, 10)  # nginx, a real range
            for method, path in (("PUT", "/bench/t.lance/unsigned"), ("GET", "/bench?list-type=2")):
                http_.request(method, path, body=b"x" if method == "PUT" else None)
                response = http_.getresponse()
                body = response.read()  # rclone: an S3 error for a request without a signature
                assert response.status in (400, 403) and body.startswith(b"<?xml"), body
        pids, ports = list(s3.pids), list(s3.ports)
    assert not [pid for pid in pids if psutil.pid_exists(pid)]
    assert not set(ports) & _listening_ports()


def test_latency_proxy_holds_each_response(need_nginx):
    """Every request on a kept-alive connection takes at least the delay, tail included."""
    with local_s3.LocalS3(
        latency=Latency(delay_ms=40, jitter_ms=0, tail_fraction=1.0, tail_ms=30)
    ) as s3:
        port = int(s3.endpoint.rsplit(":", 1)[1])
        assert s3.endpoint != s3.server_endpoint
        took = []
        with contextlib.closing(http.client.HTTPConnection("127.0.0.1", port, timeout=10)) as http_:
            for _ in range(4):
                started = time.perf_counter()
                http_.request("GET", "/bench/missing-object")
                response = http_.getresponse()
                response.read()
                took.append(time.perf_counter() - started)
                assert response.status == 404
    assert all(0.069 <= seconds < 1.0 for seconds in took), took


def test_latency_draws_are_seeded_and_bounded():
    latency = Latency(delay_ms=30, jitter_ms=10, tail_fraction=0.5, tail_ms=150, seed=7)
    first, second = latency.sampler(), latency.sampler()
    draws = [first() for _ in range(200)]
    assert draws == [second() for _ in range(200)]
    assert all(0.020 <= d <= 0.040 or 0.170 <= d <= 0.190 for d in draws)
    assert 50 < sum(d > 0.1 for d in draws) < 150
    with pytest.raises(ValueError, match=r"^tail_fraction should be in \[0, 1\], but got"):
        Latency(tail_fraction=2)
    with pytest.raises(ValueError, match=r"^delay_ms should be >= 0, but got delay_ms=-1"):
        Latency(delay_ms=-1)


def test_missing_nginx_says_how_to_install_it(monkeypatch):
    monkeypatch.setattr(local_s3.shutil, "which", lambda *args, **kwargs: None)
    with pytest.raises(FileNotFoundError, match=r"apt-get install -y nginx-light"):
        local_s3.find_nginx()
    with pytest.raises(FileNotFoundError, match=r"pip install -e benchmarks in a checkout"):
        local_s3.find_rclone()


def _running(pids: list[int]) -> list[int]:
    """The processes of ``pids`` still running (a zombie, ended but not yet reaped, is not)."""
    running = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                running.append(pid)
        except psutil.NoSuchProcess:
            pass
    return running


def test_managed_process_stops_its_whole_group():
    """SIGTERM reaches the process and what it started; nothing is left."""
    process = ManagedProcess(["sh", "-c", "sleep 60 & sleep 60 & wait"], name="sleepers")
    assert wait_until(lambda: len(psutil.Process(process.pid).children()) == 2)
    children = [child.pid for child in psutil.Process(process.pid).children()]
    assert len(children) == 2
    process.stop()
    process.stop()  # idempotent
    assert wait_until(lambda: not _running([process.pid, *children]))


# -- configuration and the command line ------------------------------------------------------------
def test_config_refuses_bad_combinations():
    with pytest.raises(ValueError, match=r"^--local-s3 writes its own dataset"):
        BenchConfig(local_s3=True, uri="data.lance")
    with pytest.raises(ValueError, match=r"^no lance-prefetch setting has max_in_flight <= read"):
        BenchConfig(readahead=(2,), max_in_flight=(4,))
    with pytest.raises(ValueError, match=r"^contenders should be among"):
        BenchConfig(contenders=("sequential", "magic"))
    with pytest.raises(ValueError, match=r"^--io uring reads local datasets only"):
        BenchConfig(local_s3=True, io="uring")
    with pytest.raises(ValueError, match=r"^--io uring reads local datasets only"):
        BenchConfig(uri="s3://bucket/train.lance", io="uring")
    with pytest.raises(ValueError, match=r"^io should be 'default' or 'uring'"):
        BenchConfig(io="fast")
    assert BenchConfig(uri="file:///data/x.lance", io="uring").io == "uring"
    assert BenchConfig(readahead=(1, 4), max_in_flight=(1, 4, 16)).grid() == [
        (1, 1),
        (4, 1),
        (4, 4),
    ]


def test_the_hedge_grid_runs_each_setting_with_and_without_hedged_takes():
    config = BenchConfig(readahead=(4,), max_in_flight=(4,), hedge=("auto", "none"))
    assert config.prefetch_settings() == [
        {"readahead": 4, "max_in_flight": 4, "coalesce": "auto", "cache": "none"},
        {"readahead": 4, "max_in_flight": 4, "coalesce": "auto", "cache": "none", "hedge": "none"},
    ]
    with pytest.raises(
        ValueError, match=r"^hedge should be among 'auto', 'none', but got \['off'\]$"
    ):
        BenchConfig(hedge=("off",))


def test_lance_prefetch_bench_forwards_to_the_bench(capsys):
    """``lance-prefetch bench ARGS`` is ``lance-prefetch-bench ARGS``, named as it was typed."""
    with pytest.raises(SystemExit) as info:
        cli.main(["bench", "--help"])
    assert info.value.code == 0
    assert capsys.readouterr().out.startswith("usage: lance-prefetch bench [-h] [--local-s3]")
    with pytest.raises(SystemExit) as info:
        bench_cli.main(["--rows", "many"])
    assert info.value.code == 2
    assert capsys.readouterr().err.startswith("usage: lance-prefetch-bench [-h] [--local-s3]")


def test_help_shows_every_default_and_no_markup(capsys, monkeypatch):
    """Every option that takes a value ends its help with its default, as it is typed; the
    description is plain text."""
    monkeypatch.setenv("COLUMNS", "400")  # no wrapping inside the names
    parser = bench_cli.parser()
    with pytest.raises(SystemExit):
        parser.parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    for flag in ("--readahead", "--max-in-flight", "--ceiling-concurrency", "--contenders"):
        assert f"{flag} " in text
    assert "(default: 1,4,16,64)" in text and "(default: 1,4,16)" in text
    assert "(default: sequential,map-style,lance-torch,ceiling,coalesced-ceiling,scan," in text
    assert "--map-workers N,... map-style: DataLoader workers" in text
    assert "(default: 2,4)" in text and "(default: 2,4,8,16)" in text  # the sweeps
    assert "(default: 4,16,64)" in text and "(default: 1,2,4)" in text
    assert "--sweep-loader run only lance-prefetch: its defaults and a grid" in text
    assert "--aimd-rate AIMD_RATE pin Lance's" in text and "(default: 5000)" in text
    assert "(default: bench-results)" in text and "(default: 300.0)" in text
    formatter = parser._get_formatter()
    for action in parser._actions:
        if action.option_strings and action.nargs != 0 and action.default != "==SUPPRESS==":
            assert "(default:" in formatter._get_help_string(action), action.option_strings
    assert not re.search(r"`|\*\*|::|:class:|\.\. ", parser.description)


def test_cli_bench_reports_errors_without_a_traceback(tmp_path, capsys):
    assert cli.main(["bench", "--local-s3", str(tmp_path / "x.lance")]) == 1
    assert capsys.readouterr().err.startswith("ValueError: --local-s3 writes its own dataset")
    assert cli.main(["bench", str(tmp_path / "missing.lance"), "--out", str(tmp_path)]) == 1
    assert capsys.readouterr().err.startswith("FileNotFoundError: no Lance dataset at")


# -- the report ------------------------------------------------------------------------------------
def _contender(name, label, sha, batches_sha="b", rows=8):
    record = {
        "epoch": 0,
        "from": "id column",
        "rows": rows,
        "sha256": sha,
        "batches_sha256": batches_sha,
    }
    return {"name": name, "label": label, "ids": {"0": record}}


def test_check_ids_finds_a_contender_that_read_other_rows():
    same = [_contender("sequential", "sequential", "a"), _contender("ceiling", "ceiling", "a")]
    torch_reader = _contender("lance-torch", "lance-torch", "z")
    assert verdicts.check_ids([*same, torch_reader])["ok"]
    assert verdicts.same_rows_verdict(verdicts.check_ids([*same, torch_reader])) == "yes"
    assert "lance-torch" in verdicts.check_ids([*same, torch_reader])["excluded"]
    other = verdicts.check_ids([*same, _contender("lance-prefetch", "lance-prefetch r1/m1", "x")])
    assert not other["ok"] and not other["epochs"]["0"]["same_rows"]
    reordered = verdicts.check_ids([*same, _contender("map-style", "map-style", "a", "c")])
    assert not reordered["ok"] and reordered["epochs"]["0"]["same_rows"]
    assert not reordered["epochs"]["0"]["same_batches"]


def _fake_report(tmp_path):
    meta = {
        "machine": {"summary": "2 cores", "cores": 2},
        "versions": {"pylance": "14"},
        "load_average_start": "0",
        "load_average_end": "0",
        "total_s": 1.0,
        "storage": {
            "kind": "emulated S3",
            "description": "d",
            "lance_io_threads": "unset",
            "limiter": "pinned",
            "latency": {"delay_ms": 30, "jitter_ms": 10, "tail_fraction": 0.01, "tail_ms": 150},
        },
        "dataset": {"rows": 1000, "fragments": 1, "columns": ["id"], "bytes_per_row": 8.0},
        "settings": {
            "batch_size": 10,
            "batches": 5,
            "warmup_batches": 1,
            "step_ms": 50.0,
            "seed": 0,
        },
    }

    def passes(rows_per_s, wait, take_ms):
        metrics = {
            "rows_per_s": rows_per_s,
            "batches_per_s": 1.0,
            "mib_per_s": 1.0,
            "first_batch_s": 0.1,
            "take_p50_ms": take_ms,
            "take_p99_ms": take_ms,
            "take_mean_ms": take_ms,
            "batches": 5,
            "takes": 5 if rows_per_s < 2000 else 1,  # the fast ones coalesce
        }
        return {"throughput": metrics, "step": {**metrics, "step_ms": 50.0, "wait_fraction": wait}}

    common = {"setup_s": 0.1, "warmup_s": 0.1, "peak_rss_mib": 300.0, "notes": [], "io": "uring"}
    contenders = [
        {
            "name": "sequential",
            "label": "sequential",
            "settings": {},
            "passes": passes(1000, 0.6, 100),
            **common,
        },
        {
            "name": "map-style",
            "label": "map-style",
            "settings": {"num_workers": 4},
            "error": "RuntimeError: boom",
        },
        *(
            {
                "name": "lance-prefetch",
                "label": f"lance-prefetch r{ra}/m{mif}",
                "settings": {"readahead": ra, "max_in_flight": mif},
                "passes": passes(rate, wait, 100),
                **common,
            }
            for ra, mif, rate, wait in ((4, 1, 1100, 0.5), (4, 4, 4500, 0.01), (16, 4, 3900, 0.08))
        ),
    ]
    return {"meta": meta, "contenders": contenders, "ids_check": verdicts.check_ids(contenders)}


def test_report_targets_and_outputs_survive_a_failed_contender(tmp_path):
    """Targets use the best setting; a failed contender is a table row and not evaluated."""
    fake = _fake_report(tmp_path)
    targets = {t["target"]: t for t in verdicts.evaluate_targets(fake)}
    four_x = targets["emulated S3: best lance-prefetch >= 4x sequential rows/s"]
    assert four_x["met"] and four_x["value"] == pytest.approx(4.5)
    assert targets["emulated S3: best lance-prefetch >= map-style rows/s"]["met"] is None
    wait = targets[
        "lance-prefetch wait fraction < 5% when step_ms >= 1.2 x mean take time / max_in_flight"
    ]
    # 50 ms >= 1.2 * 100 / 4 for the two max_in_flight=4 settings; r16/m4 waited 8%
    assert wait["met"] is False and "lance-prefetch r16/m4: 8.0%" in wait["detail"]
    fake["targets"] = list(targets.values())
    paths = report.write_outputs(fake, tmp_path / "out", "fake")
    markdown = paths["markdown"].read_text()
    assert "| map-style | num_workers=4, spawn | n/a | 1 | yes | failed: RuntimeError: boom |" in (
        markdown
    )
    assert (
        "| **lance-prefetch** (best) | readahead=4, max_in_flight=4 | io_uring | 1/5 | yes | "
        "4,500 | 1 run |" in markdown
    )
    assert "| lance-prefetch | readahead=4, max_in_flight=1 | io_uring | 1 | yes | 1,100 |" in (
        markdown
    )
    assert "**Targets:**" in markdown  # the report has them (--targets)
    assert paths["plot"].stat().st_size > 10_000


def test_repeats_run_interleaved_rounds_and_keep_each_settings_median(tmp_path):
    """repeats=3: every contender in round 0, then every one but ceiling twice more, each round
    rotated by one; the report keeps each setting's median run and median wait."""
    from lance_prefetch_bench.run import _plan

    config = BenchConfig(
        readahead=(4, 16),
        max_in_flight=(4,),
        contenders=("sequential", "ceiling", "lance-prefetch"),
        repeats=3,
    )
    with pytest.raises(ValueError, match="repeats should be >= 1"):
        BenchConfig(repeats=0)
    base = dict(
        uri="x",
        version=1,
        num_rows=100,
        columns=["id"],
        storage_options=None,
        batch_size=10,
        batches=2,
        warmup_batches=0,
        seed=0,
        step_ms=0.0,
        id_column="id",
        record_ids=False,
    )
    order = [(round_, label) for round_, label, _, _ in _plan(config, base)]
    assert order == [
        (0, "sequential"),
        (0, "ceiling"),
        (0, "lance-prefetch defaults"),
        (0, "lance-prefetch r4/m4"),
        (0, "lance-prefetch r16/m4"),
        (1, "lance-prefetch defaults"),
        (1, "lance-prefetch r4/m4"),
        (1, "lance-prefetch r16/m4"),
        (1, "sequential"),
        (2, "lance-prefetch r4/m4"),
        (2, "lance-prefetch r16/m4"),
        (2, "sequential"),
        (2, "lance-prefetch defaults"),
    ]

    fake = _fake_report(tmp_path)["contenders"]
    r4 = fake[2]
    runs = [fake[0], r4]
    for round_, rate, wait in ((1, 900, 0.3), (2, 1300, 0.7), (3, 1000, 0.05)):
        run = json.loads(json.dumps(r4))
        run["round"] = round_
        run["passes"]["throughput"]["rows_per_s"] = rate
        run["passes"]["step"]["wait_fraction"] = wait
        runs.append(run)
    runs.append({**r4, "round": 4, "error": "RuntimeError: boom", "passes": None})
    merged = verdicts.merge_rounds(runs)
    assert [m["label"] for m in merged] == ["sequential", "lance-prefetch r4/m1"]
    entry = merged[1]
    # rows/s 1100, 900, 1300, 1000: the lower middle is 1000 (round 3); waits 0.5, 0.3, 0.7, 0.05
    assert entry["round"] == 3 and entry["passes"]["throughput"]["rows_per_s"] == 1000
    # waits 0.05, 0.3, 0.5, 0.7: the higher middle, 0.5 (both medians lean to the worse side)
    assert entry["passes"]["step"]["wait_fraction"] == 0.5
    assert [r.get("rows_per_s") for r in entry["rounds"]] == [1100, 900, 1300, 1000, None]
    assert entry["rounds"][-1] == {"round": 4, "error": "RuntimeError: boom"}
    assert entry["failed_rounds"] == ["RuntimeError: boom"]
    assert verdicts.failures(merged) == ["lance-prefetch r4/m1"]  # a failed round fails the run
    assert report._settings_text(entry).endswith("; 1 of 5 runs FAILED: RuntimeError: boom")
    assert verdicts.spread(entry) == (900, 1300, 4)
    row = report.table_rows({**_fake_report(tmp_path), "contenders": merged})[2]
    assert row[5:7] == ["1,000", "900-1,300 (4)"]  # the median run, the spread of the 4 that ran
    # the runs themselves are not changed
    assert [run["passes"]["step"]["wait_fraction"] for run in runs[1:5]] == [0.5, 0.3, 0.7, 0.05]
    assert verdicts.failures(verdicts.merge_rounds(runs[:4])) == []
    # every run of a setting failed: its first failure, with the rounds
    failing = [{**r4, "round": i, "error": f"E{i}", "passes": None} for i in range(2)]
    (alone,) = verdicts.merge_rounds(failing)
    assert alone["error"] == "E0" and alone["failed_rounds"] == ["E0", "E1"]

    # the same-ids check: a setting's rounds count once (one label is not "two contenders")
    one = [_contender("lance-prefetch", "lance-prefetch r4/m2", "a") for _ in range(2)]
    check = verdicts.check_ids(one)
    assert not check["ok"] and check["epochs"]["0"]["contenders"] == ["lance-prefetch r4/m2"]
    assert not check["compared"] and verdicts.same_rows_verdict(check).startswith("not checked:")
    other = verdicts.check_ids([*one, _contender("lance-prefetch", "lance-prefetch r4/m2", "b")])
    assert not other["epochs"]["0"]["same_rows"]  # a round that read other rows is caught
    assert not other["compared"] and verdicts.same_rows_verdict(other) == "NO"


# -- whole runs ------------------------------------------------------------------------------------
@pytest.mark.system
@pytest.mark.slow
@pytest.mark.timeout(240)  # a process per contender
def test_every_contender_reads_the_same_rows(tmp_path):
    """Acceptance 3: on a local dataset, every contender read exactly the plan's rows in each
    epoch, in the same batches (ids from the data's id column, recorded in full). lance-torch,
    which cannot read the plan's batches, is left out here (its exclusion from the check is tested
    above), to keep the test short."""
    uri = write_synthetic(str(tmp_path / "ids.lance"), 700, rows_per_file=250)
    config = BenchConfig(
        uri=uri,
        batch_size=32,
        batches=6,
        warmup_batches=1,
        step_ms=1,
        readahead=(2,),
        max_in_flight=(2,),
        ceiling_concurrency=(1, 3),
        ceiling_repeats=1,
        map_workers=1,
        contenders=("sequential", "map-style", "ceiling", "lance-prefetch"),
        record_ids=True,
        out_dir=tmp_path / "out",
        name="ids",
        progress=False,
    )
    result, paths = run_bench(config)
    contenders = {c["label"]: c for c in result["contenders"]}
    assert [c for c in contenders.values() if "error" in c] == []
    assert sorted(contenders) == [
        "ceiling",
        "lance-prefetch defaults",
        "lance-prefetch r2/m2",
        "map-style num_workers=1",
        "sequential",
    ]
    for epoch in (0, 1):
        plan = EpochPlan(num_rows=700, batch_size=32, seed=0, epoch=epoch, world_size=1)
        expected = sorted(i for b in list(plan.rank_batches(0))[:6] for i in b.indices.tolist())
        readers = [c for c in contenders.values() if str(epoch) in c["ids"]]
        assert len(readers) == (5 if epoch == 0 else 4)  # ceiling has no step pass
        for contender in readers:
            record = contender["ids"][str(epoch)]
            assert record["from"] == "id column"
            assert record["ids"] == expected, contender["label"]
        assert len({c["ids"][str(epoch)]["batches_sha256"] for c in readers}) == 1
    assert result["ids_check"]["ok"] and result["ids_check"]["excluded"] == {}
    assert result["ids_check"]["epochs"]["0"]["same_batches"]
    assert json.loads(paths["json"].read_text())["ids_check"]["ok"]


@pytest.mark.system
@pytest.mark.slow
@pytest.mark.timeout(240)  # a process per contender, the peers among them
def test_tiny_local_s3_run_writes_outputs_and_leaves_nothing_behind(tmp_path, need_nginx):
    """Acceptance 2, small: the command prints the table, writes JSON + Markdown + PNG with the
    expected contenders (the peer loaders too) and fields, exits 0, and no process or listening
    port it started is left (checked by the pids and ports it reports, and by any process naming
    its temporary folder)."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    out = tmp_path / "out"
    command = [
        sys.executable,
        "-m",
        "lance_prefetch",
        "bench",
        "--local-s3",
        "--rows",
        "600",
        "--rows-per-file",
        "200",
        "--batch-size",
        "64",
        "--batches",
        "4",
        "--warmup-batches",
        "1",
        "--contenders",
        "sequential,lance-prefetch,peers",
        "--readahead",
        "2",
        "--max-in-flight",
        "2",
        "--grain-threads",
        "2",
        "--spdl-concurrency",
        "2",
        "--streaming-splits",
        "1",
        "--delay-ms",
        "5",
        "--jitter-ms",
        "1",
        "--tail-fraction",
        "0",
        "--step-ms",
        "5",
        "--out",
        str(out),
        "--name",
        "tiny",
        "--targets",
    ]
    result = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=200,
        check=False,
        env={**os.environ, "TMPDIR": str(temp)},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert re.search(
        r"^\| contender \| settings \| reader \| takes/batch \| uniform \| rows/s \| spread",
        result.stdout,
        re.MULTILINE,
    )
    assert (out / "tiny.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| sequential |" in (out / "tiny.md").read_text()
    data = json.loads((out / "tiny.json").read_text())
    assert [c["label"] for c in data["contenders"]] == [
        "sequential",
        "lance-prefetch defaults",
        "lance-prefetch r2/m2",
        "grain num_threads=2",
        "spdl concurrency=2",
        "lancedb-streaming num_splits=1",
    ]
    for contender in data["contenders"]:
        assert "error" not in contender
        timed = contender["name"] != "lancedb-streaming"  # its reads run inside LanceDB
        for field in (
            "rows_per_s",
            "batches_per_s",
            "mib_per_s",
            "first_batch_s",
            *(("take_p50_ms", "take_p99_ms") if timed else ()),
        ):
            assert contender["passes"]["throughput"][field] > 0, field
        assert contender["passes"]["throughput"]["rows"] == 4 * 64
        assert 0 <= contender["passes"]["step"]["wait_fraction"] <= 1
        assert contender["peak_rss_mib"] > 0
    storage = data["meta"]["storage"]
    assert storage["kind"] == "emulated S3" and "lance_aimd_max_rate=5000" not in storage["limiter"]
    assert storage["limiter"].startswith("pinned at 5000 requests/s")
    assert data["ids_check"]["ok"]
    assert data["ids_check"]["epochs"]["0"]["contenders"] == [
        "sequential",
        "lance-prefetch defaults",
        "lance-prefetch r2/m2",
        "spdl concurrency=2",
    ]
    assert {t["target"] for t in data["targets"]} >= {
        "emulated S3: best lance-prefetch >= 4x sequential rows/s"
    }
    pids = storage["servers"]["pids"] + [c["pid"] for c in data["contenders"]]
    assert wait_until(lambda: not _running(pids)), _running(pids)
    assert not set(storage["servers"]["ports"]) & _listening_ports()
    assert _processes_mentioning(str(temp)) == []
    assert list(temp.iterdir()) == []  # temporary folders removed
    assert shutil.which("nginx") or os.path.exists("/usr/sbin/nginx")


@pytest.mark.system
@pytest.mark.slow
def test_ctrl_c_stops_everything(tmp_path, need_nginx):
    """Ctrl-C while a contender runs: exit code 130, "interrupted" on stderr and no traceback,
    and no process naming the run's temporary folder is left. (SIGTERM unwinds the same way, as
    exit code 143.)"""
    temp = tmp_path / "tmp"
    temp.mkdir()
    command = [
        sys.executable,
        "-m",
        "lance_prefetch",
        "bench",
        "--local-s3",
        "--rows",
        "20000",
        "--batch-size",
        "64",
        "--batches",
        "200",
        "--contenders",
        "sequential",
        "--step-ms",
        "200",
        "--out",
        str(tmp_path / "out"),
        "--no-progress",
    ]
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "TMPDIR": str(temp)},
    )
    try:
        deadline = time.monotonic() + 60
        while not any("_worker" in p for p in _processes_mentioning(str(temp))):
            assert process.poll() is None and time.monotonic() < deadline, process.communicate()
            time.sleep(0.1)
        time.sleep(1.0)  # the contender is reading
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=30)
    finally:
        process.kill()
    assert process.returncode == 130, stderr
    assert "Traceback" not in stderr
    assert stderr.strip().splitlines()[-1] == (
        "interrupted: 0 of 1 contender runs finished; nothing was written"
    )
    assert wait_until(lambda: _processes_mentioning(str(temp)) == [])
    assert list(temp.iterdir()) == []


@pytest.mark.system
@pytest.mark.slow
@pytest.mark.timeout(240)  # a process per contender
def test_map_dataset_and_worker_contenders_read_the_same_rows(tmp_path):
    """The optional contenders behind docs/choosing.md read the plan's batches too, and the report
    compares one take per batch with one take per row."""
    uri = write_synthetic(str(tmp_path / "ids.lance"), 300, rows_per_file=100)
    config = BenchConfig(
        uri=uri,
        batch_size=16,
        batches=3,
        warmup_batches=1,
        step_ms=1,
        map_workers=1,
        contenders=("prefetch-workers", "lance-map", "lance-map-rows"),
        record_ids=True,
        out_dir=tmp_path / "out",
        name="choose",
        progress=False,
    )
    result, paths = run_bench(config)
    contenders = {c["label"]: c for c in result["contenders"]}
    assert sorted(contenders) == ["lance-map", "lance-map-rows", "prefetch-workers"]
    assert [c for c in contenders.values() if "error" in c] == []
    for epoch in (0, 1):
        plan = EpochPlan(num_rows=300, batch_size=16, seed=0, epoch=epoch, world_size=1)
        expected = sorted(i for b in list(plan.rank_batches(0))[:3] for i in b.indices.tolist())
        for contender in contenders.values():
            assert contender["ids"][str(epoch)]["ids"] == expected, contender["label"]
    assert result["ids_check"]["ok"]
    (comparison,) = result["comparisons"]
    assert comparison["what"].startswith("LanceMapDataset __getitems__ (one take per batch) vs")
    rates = [
        contenders[n]["passes"]["throughput"]["rows_per_s"] for n in ("lance-map", "lance-map-rows")
    ]
    assert comparison["ratio"] == pytest.approx(rates[0] / rates[1])
    assert "**Comparisons:**" in paths["markdown"].read_text()


def test_auto_is_also_compared_round_by_round():
    """Rows/s by round: auto 100, 90, 200, 50 (round 4 failed for the other), the best fixed 100,
    100, 160, -, 40: per-round ratios 1.0, 0.9, 1.25 (round 3 ran only for auto, round 4 only
    for the fixed setting); median 1.0 (of an odd count, the middle one)."""
    auto = {
        "rounds": [
            {"round": 0, "rows_per_s": 100.0},
            {"round": 1, "rows_per_s": 90.0},
            {"round": 2, "rows_per_s": 200.0},
            {"round": 3, "rows_per_s": 50.0},
            {"round": 4, "error": "E"},
        ]
    }
    fixed = {
        "rounds": [
            {"round": 0, "rows_per_s": 100.0},
            {"round": 1, "rows_per_s": 100.0},
            {"round": 2, "rows_per_s": 160.0},
            {"round": 3, "error": "E"},
            {"round": 4, "rows_per_s": 40.0},
        ]
    }
    assert verdicts.paired_ratio(auto, fixed) == {
        "median": 1.0,
        "low": 0.9,
        "high": 1.25,
        "rounds": 3,
    }
    four = {"rounds": [*auto["rounds"][:3], {"round": 4, "rows_per_s": 10.0}]}
    assert verdicts.paired_ratio(four, fixed)["median"] == 0.9  # the lower middle: 0.25, 0.9, ...
    assert verdicts.paired_ratio({"rounds": []}, fixed) is None
    assert verdicts.paired_ratio({"passes": {}}, fixed) is None  # a single run: no rounds

    def setting(label, readahead, rates):
        return {
            "name": "lance-prefetch",
            "label": label,
            "settings": {"readahead": readahead, "max_in_flight": 4, "coalesce": 1},
            "passes": {
                "throughput": {"rows_per_s": sorted(rates)[(len(rates) - 1) // 2]},
                "step": {"wait_fraction": 0.02},
            },
            "rounds": [{"round": i, "rows_per_s": r} for i, r in enumerate(rates)],
        }

    contenders = [
        setting("fixed", 16, [100.0, 100.0, 160.0]),
        setting("auto", "auto", [90.0, 95.0, 200.0]),
    ]
    meta = {"meta": {"settings": {"batch_size": 256}}, "contenders": contenders}
    (target,) = [t for t in verdicts._performance_targets(meta, False) if "10%" in t["target"]]
    assert target["value"] == 0.95 and target["met"]  # medians: 95 / 100
    assert target["detail"].endswith("round by round: median 0.95x (0.90-1.25x over 3 rounds)")


# -- a run stopped half-way ------------------------------------------------------------------------
def _bench_until_first_run(tmp_path, name):
    """Start the bench on a tiny local dataset with three contender runs (sequential, the
    loader's defaults, one grid point) and return the process once the first run's line is out
    (its results are on disk before that line is printed), with the lines read so far."""
    uri = write_synthetic(str(tmp_path / "kill.lance"), 400, rows_per_file=200)
    command = [
        *(sys.executable, "-m", "lance_prefetch_bench", uri),
        *("--batch-size", "32", "--batches", "3", "--warmup-batches", "0", "--step-ms", "1"),
        *("--contenders", "sequential,lance-prefetch", "--readahead", "2", "--max-in-flight", "2"),
        *("--out", str(tmp_path / "out"), "--name", name),
    ]
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "TMPDIR": str(tmp_path)},
    )
    lines = []
    while not lines or not lines[-1].startswith("[1/3]"):
        line = process.stdout.readline()
        assert line, (lines, process.communicate())
        lines.append(line.rstrip("\n"))
    return process, lines


def _finished_on_disk(tmp_path, name):
    data = json.loads((tmp_path / "out" / f"{name}.json").read_text())
    (sequential,) = data["contenders"]  # the finished run, and only it
    assert sequential["label"] == "sequential" and "error" not in sequential
    assert sequential["passes"]["throughput"]["rows"] == 3 * 32
    assert sequential["passes"]["throughput"]["rows_per_s"] > 0
    assert 0 <= sequential["passes"]["step"]["wait_fraction"] <= 1
    assert data["meta"]["progress"]["finished"] == 1 and data["meta"]["progress"]["planned"] == 3
    assert not data["meta"]["progress"]["complete"]
    markdown = (tmp_path / "out" / f"{name}.md").read_text()
    assert "- **partial results**: 1 of 3 contender runs finished" in markdown
    assert re.search(
        r"^\| sequential \| {2}\| Lance default \| 1 \| yes \| [\d,]+ \| 1 run \|", markdown, re.M
    )
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        f"{name}.json",
        f"{name}.md",
        f"{name}.png",
    ]
    return data


@pytest.mark.timeout(120)
def test_sigterm_keeps_the_finished_contenders_on_disk(tmp_path):
    """SIGTERM after the first of three contender runs: exit status 143, a last line saying how
    many runs finished and where they are, and the outputs hold exactly that run."""
    process, lines = _bench_until_first_run(tmp_path, "stopped")
    try:
        assert re.fullmatch(
            r"\[1/3\] sequential: [\d,]+ rows/s, waited [\d.]+% \(\d+\.\d s\)", lines[-1]
        )
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 143, stderr
    out = tmp_path / "out"
    assert stderr.strip().splitlines()[-1] == (
        f"interrupted: 1 of 3 contender runs finished; their results are in {out / 'stopped.json'} "
        f"and {out / 'stopped.md'}"
    )
    assert "Traceback" not in stderr
    data = _finished_on_disk(tmp_path, "stopped")
    assert data["meta"]["progress"]["interrupted"] == "exit status 143"
    assert wait_until(lambda: _processes_mentioning(str(tmp_path / "lance-bench-")) == [])


@pytest.mark.timeout(120)
def test_sigkill_leaves_the_last_whole_outputs(tmp_path):
    """SIGKILL, which nothing can catch, after the first of three runs: each output was replaced
    whole after that run, so they hold it (and no half-written file is left)."""
    process, _ = _bench_until_first_run(tmp_path, "killed")
    process.kill()
    process.communicate(timeout=30)
    assert process.returncode == -signal.SIGKILL
    data = _finished_on_disk(tmp_path, "killed")
    assert data["meta"]["progress"]["interrupted"] is None
    # the running contender's process dies with the bench (PR_SET_PDEATHSIG)
    assert wait_until(lambda: _processes_mentioning(str(tmp_path / "lance-bench-")) == [])


def test_identical_settings_apart_beyond_their_spread_are_flagged(tmp_path):
    """The defaults and the same values given as a grid point (auto): medians 62k and 143k, runs
    61-63k and 140-145k, so the gap exceeds the spread: both rows get `!` and a footnote; a third
    setting is not flagged; (best) goes to the best median, the auto grid point. Overlapping
    ranges are not flagged."""
    fake = _fake_report(tmp_path)
    template = fake["contenders"][2]

    def setting(label, settings, rates):
        row = json.loads(json.dumps(template))
        row.update(label=label, settings=settings)
        row["passes"]["throughput"]["rows_per_s"] = sorted(rates)[(len(rates) - 1) // 2]
        row["rounds"] = [{"round": i, "rows_per_s": r} for i, r in enumerate(rates)]
        return row

    auto = {"readahead": "auto", "max_in_flight": "auto", "coalesce": "auto"}
    defaults = setting("lance-prefetch defaults", {"defaults": True, **auto}, [61e3, 63e3, 62e3])
    grid = setting("lance-prefetch auto", {**auto, "cache": "none"}, [140e3, 145e3, 143e3])
    fixed = setting("lance-prefetch r4/m4", {"readahead": 4, "max_in_flight": 4}, [70e3, 99e3])
    fake["contenders"] = [fake["contenders"][0], defaults, fixed, grid]
    (flag,) = verdicts.noise_flags(fake["contenders"])
    assert flag["labels"] == ["lance-prefetch defaults", "lance-prefetch auto"]
    assert flag["detail"] == (
        "lance-prefetch defaults 62,000 rows/s (61,000-63,000, 3 runs) vs lance-prefetch auto "
        "143,000 rows/s (140,000-145,000, 3 runs)"
    )
    table = report.table_rows(fake)[1:]
    rows = {c["label"]: row for c, row in zip(fake["contenders"], table, strict=True)}
    assert rows["lance-prefetch defaults"][0] == "**lance-prefetch defaults**"
    assert rows["lance-prefetch defaults"][5:7] == ["62,000 !", "61,000-63,000 (3)"]
    assert rows["lance-prefetch auto"][0] == "**lance-prefetch** (best)"
    assert rows["lance-prefetch auto"][5:7] == ["143,000 !", "140,000-145,000 (3)"]
    assert rows["lance-prefetch r4/m4"][:1] + rows["lance-prefetch r4/m4"][5:7] == [
        "lance-prefetch",
        "70,000",
        "70,000-99,000 (2)",
    ]
    assert verdicts.best_labels(fake["contenders"]) == ["lance-prefetch auto"]
    markdown = report.to_markdown(fake)
    assert "! identical settings whose rows/s ranges lie more than 5% apart" in markdown
    assert f"- {flag['detail']}" in markdown
    # ranges that overlap, or lie within 5%: noise the runs showed, not flagged
    grid["rounds"] = [{"round": 0, "rows_per_s": 64e3}, {"round": 1, "rows_per_s": 90e3}]
    assert verdicts.noise_flags(fake["contenders"]) == []
    grid["rounds"] = [{"round": 0, "rows_per_s": 66e3}]
    assert verdicts.noise_flags(fake["contenders"]) == []


def test_bar_chart_sorts_rows_and_keeps_non_uniform_readers_apart(tmp_path):
    """Uniform readers in the first panel, sorted fastest first and scaled to themselves; the
    460k rows/s of lance-torch (not uniform) in a second panel; a failed contender at the bottom."""
    import matplotlib.pyplot as plt

    fake = _fake_report(tmp_path)
    scan = json.loads(json.dumps(fake["contenders"][0]))
    scan.update(name="lance-torch", label="lance-torch", uniform="no (shuffled contiguous ranges)")
    scan["passes"]["throughput"]["rows_per_s"] = 460_000
    fake["contenders"].append(scan)
    figure = report.bar_chart(fake)
    try:
        uniform, other = figure.axes
        labels = [tick.get_text().split(" (")[0] for tick in uniform.get_yticklabels()]
        # from the top: the fastest ... the slowest, then the failed map-style
        assert labels == [
            "lance-prefetch r4/m4",  # 4,500
            "lance-prefetch r16/m4",  # 3,900
            "lance-prefetch r4/m1",  # 1,100
            "sequential",  # 1,000
            "map-style",  # failed
        ]
        assert uniform.get_xlim()[1] == pytest.approx(4500 * 1.6)
        assert [t.get_text().split(" (")[0] for t in other.get_yticklabels()] == ["lance-torch"]
        assert other.get_xlim()[1] == pytest.approx(460_000 * 1.6)
        assert uniform.get_title(loc="left") == "uniform random batches"
    finally:
        plt.close(figure)
    # the readahead grid's lines: with two readahead values or more only (else dots)
    assert report.write_grid_plot(fake, tmp_path / "grid.png")
    assert (tmp_path / "grid.png").read_bytes()[:4] == b"\x89PNG"
    fake["contenders"] = [c for c in fake["contenders"] if c["settings"].get("readahead") != 16]
    assert not report.write_grid_plot(fake, tmp_path / "none.png")
    assert not (tmp_path / "none.png").exists()
