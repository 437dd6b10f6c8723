"""``lance-prefetch info URI``: exact facts about a known dataset (local and on the S3-compatible
server), as text and as JSON, and bad arguments refused in one line with exit status 2."""

from __future__ import annotations

import json
import subprocess
import sys

import lance
import numpy as np
import pyarrow as pa
import pytest

from lance_prefetch import _cli as cli
from lance_prefetch.cache._disk import default_cache_bytes

TEXTS = [f"row {i}" for i in range(300)]  # 5 to 7 characters


def table(start: int, stop: int) -> pa.Table:
    """Rows ``start .. stop - 1``: vector = id * [1..8] (float32[8]), label = id, text."""
    ids = np.arange(start, stop)
    values = (ids[:, None] * np.arange(1, 9, dtype=np.float32)).astype(np.float32)
    return pa.table(
        {
            "vector": pa.FixedSizeListArray.from_arrays(pa.array(values.ravel()), 8),
            "label": pa.array(ids, pa.int64()),
            "text": pa.array(TEXTS[start:stop]),
        }
    )


def write(uri: str, storage_options: dict[str, str] | None = None) -> str:
    """Version 1: 200 rows in 2 fragments; version 2: 100 more rows in a third; tag v1 -> 1."""
    lance.write_dataset(table(0, 200), uri, max_rows_per_file=100, storage_options=storage_options)
    dataset = lance.write_dataset(
        table(200, 300), uri, mode="append", storage_options=storage_options
    )
    dataset.tags.create("v1", 1)
    return uri


@pytest.fixture(scope="module")
def dataset_uri(tmp_path_factory) -> str:
    return write(str(tmp_path_factory.mktemp("info") / "known.lance"))


def run_json(capsys, *argv: str) -> dict:
    status = cli.main(["info", *argv, "--json", "--seconds", "0.5", "--batch-size", "32"])
    out, err = capsys.readouterr()
    assert (status, err) == (0, "")
    return json.loads(out)


#: Arrow bytes a row of the text column: all 300 rows are the sample (offsets + characters).
TEXT_ROW_BYTES = pa.array(TEXTS).nbytes / 300


def check_known(found: dict, uri: str) -> None:
    """The facts of :func:`write`'s dataset at its latest version, all columns."""
    assert found["uri"] == uri
    assert (found["version"], found["rows"], found["fragments"]) == (2, 300, 3)
    assert [v["version"] for v in found["versions"]] == [1, 2]
    assert all(v["timestamp"] for v in found["versions"])
    assert found["tags"] == {"v1": 1}
    columns = {c["name"]: c for c in found["columns"]}
    assert list(columns) == ["vector", "label", "text"]
    assert columns["vector"] == {
        "name": "vector",
        "arrow_type": "fixed_size_list<item: float>[8]",
        "tensor": "float32[8]",
        "delivers": "tensor float32[8]",
        "why": "",
        "row_bytes": 32.0,
        "fixed": True,
    }
    assert columns["label"]["tensor"] == "int64" and columns["label"]["row_bytes"] == 8.0
    assert columns["text"]["tensor"] is None
    assert columns["text"]["delivers"] == "list[str]"
    assert columns["text"]["fixed"] is False
    assert columns["text"]["row_bytes"] == TEXT_ROW_BYTES == 3190 / 300  # pyarrow's nbytes
    assert found["sample_rows"] == 300
    assert found["row_bytes"] == 40.0 + TEXT_ROW_BYTES
    assert found["row_bytes_exact"] is False
    assert found["cache_bytes"] == round((40.0 + TEXT_ROW_BYTES) * 300) == 15190
    assert found["cache_limit"] == default_cache_bytes()  # the memory cache's own default
    run = found["throughput"]
    assert run["rows_per_s"] > 0 and run["rows"] >= 300  # at least the first epoch
    assert run["columns"] == ["vector", "label", "text"] and run["batch_size"] == 32


def test_json_gives_the_exact_facts_of_a_local_dataset(capsys, dataset_uri):
    check_known(run_json(capsys, dataset_uri), dataset_uri)


def test_fixed_width_columns_give_exact_bytes_and_cache_size(capsys, dataset_uri):
    found = run_json(capsys, dataset_uri, "--columns", "label,vector", "--version", "v1")
    assert (found["version"], found["rows"], found["fragments"]) == (1, 200, 2)
    assert [v["version"] for v in found["versions"]] == [1, 2]  # every version of the dataset
    assert [c["name"] for c in found["columns"]] == ["label", "vector"]
    assert (found["row_bytes"], found["row_bytes_exact"]) == (40.0, True)
    assert found["cache_bytes"] == 40 * 200
    assert found["throughput"]["columns"] == ["label", "vector"]
    assert run_json(capsys, dataset_uri, "--version", "1", "--columns", "label")["rows"] == 200


def test_text_report_lists_each_fact(capsys, dataset_uri):
    status = cli.main(["info", dataset_uri, "--seconds", "0.3"])
    out, err = capsys.readouterr()
    assert (status, err) == (0, "")
    lines = out.splitlines()
    assert lines[0] == f"dataset    {dataset_uri} (version 2)"
    assert lines[1:5] == [
        "rows       300",
        "fragments  3",
        "versions   2: 1, 2",
        "tags       v1 -> 1",
    ]
    assert lines[6:9] == [
        "  vector  fixed_size_list<item: float>[8] -> float32[8]",
        "  label   int64 -> int64",
        "  text    string -> no tensor: list[str] (strings: one str a row; turn them into "
        "tensors in transform)",
    ]
    assert lines[9] == (
        f"bytes/row  {40 + TEXT_ROW_BYTES:,.1f} (Arrow bytes of 300 sampled rows / rows, "
        f"fixed-width columns exact)"
    )
    assert lines[10].startswith("cache      cache='memory' takes 15,190 bytes (0.0 MiB) (estimated")
    rows_per_s = lines[11].split()[1]
    assert lines[11].startswith("rows/s     ") and float(rows_per_s.replace(",", "")) > 0


def test_refused_types_and_structs_say_what_is_delivered(capsys, tmp_path):
    uri = str(tmp_path / "kinds.lance")
    lance.write_dataset(
        pa.table(
            {
                "when": pa.array(np.arange(4).astype("datetime64[s]")),
                "meta": pa.array([{"a": i, "b": b"x"} for i in range(4)]),
                "seq": pa.array([[1.0] * i for i in range(4)], pa.list_(pa.float32())),
                "image": pa.FixedSizeListArray.from_arrays(
                    pa.FixedSizeListArray.from_arrays(pa.array(np.zeros(24, np.uint8)), 3), 2
                ),
            }
        ),
        uri,
    )
    found = run_json(capsys, uri, "--columns", "when,meta,seq,image,meta.a")
    columns = {c["name"]: c for c in found["columns"]}
    assert columns["when"]["delivers"] == "nothing"
    assert "cannot turn into a tensor" in columns["when"]["why"]
    assert columns["meta"]["delivers"] == "dict {a: tensor int64, b: list[bytes]}"
    assert columns["seq"]["delivers"] == "list[float32[n]]"
    assert columns["image"]["tensor"] == "uint8[2, 3]" and columns["image"]["row_bytes"] == 6.0
    assert columns["meta.a"]["tensor"] == "int64"
    assert found["throughput"]["columns"] == ["meta", "seq", "image", "meta.a"]  # not "when"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["{missing}"], "URI: source: no Lance dataset at '{missing}'"),
        (["{uri}", "--columns", "label,nope"], "--columns: columns ['nope'] are not in"),
        (["{uri}", "--version", "7"], "--version: version=7 does not exist in '{uri}'"),
        (["{uri}", "--version", "best"], "--version: version='best' does not exist in '{uri}'"),
        (["{uri}", "--storage-option", "timeout"], "--storage-option: should be KEY=VALUE"),
    ],
)
def test_bad_arguments_give_one_line_and_status_2(capsys, dataset_uri, tmp_path, argv, message):
    missing = str(tmp_path / "missing.lance")
    argv = [a.format(uri=dataset_uri, missing=missing) for a in argv]
    assert cli.main(["info", *argv]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1, err
    assert err.startswith(
        "lance-prefetch info: " + message.format(uri=dataset_uri, missing=missing)
    )


def test_s3_dataset_gives_the_same_facts(capsys, s3):
    options = s3.storage_options()
    uri = write("s3://training/info-known.lance", options)
    argv = [f"--storage-option={key}={value}" for key, value in options.items()]
    check_known(run_json(capsys, uri, *argv), uri)
    wrong = [*argv, "--storage-option", "aws_secret_access_key=wrong-secret-5aXq"]
    assert cli.main(["info", uri, *wrong]) == 2
    err = capsys.readouterr().err
    assert err.startswith("lance-prefetch info: --storage-option: source: the endpoint ")
    assert "refused the credentials" in err and "wrong-secret" not in err


def test_the_command_exits_2_with_one_line_for_a_missing_dataset(tmp_path):
    """The real entry point, in its own process: status 2, one line, nothing on stdout."""
    missing = str(tmp_path / "missing.lance")
    result = subprocess.run(
        [sys.executable, "-m", "lance_prefetch", "info", missing, "--columns", "a"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr.splitlines() == [
        f"lance-prefetch info: URI: source: no Lance dataset at '{missing}'; check the path (a "
        f"Lance dataset is a directory with a _versions/ folder) and, for object stores, "
        f"storage_options"
    ]


def test_a_run_shorter_than_a_batch_still_reads_one_batch(dataset_uri, capsys):
    """``--seconds`` far below one batch's time: one batch of 32 rows is read and timed, never
    ``0 rows/s``."""
    status = cli.main(["info", dataset_uri, "--json", "--seconds", "1e-9", "--batch-size", "32"])
    out, err = capsys.readouterr()
    assert (status, err) == (0, "")
    run = json.loads(out)["throughput"]
    assert run["rows"] == 32 and run["rows_per_s"] > 0
