"""Shared fixtures: small Lance datasets whose ``id`` column is each row's position, locally and on
a real S3-compatible server on 127.0.0.1 (started on first use, stopped at the end of the session)."""

from __future__ import annotations

import dataclasses
import gc
import os
import socket
from pathlib import Path

import lance
import pytest
from support.fakes import ids_table


def write_ids(
    path: Path | str,
    num_rows: int,
    *,
    rows_per_file: int = 1024,
    storage_options: dict[str, str] | None = None,
) -> str:
    """Write ``num_rows`` rows: ``id`` (int64, = position), ``vector`` (3 x float32 = id * [1, 2, 3])
    and ``label`` (int64, id % 10), in fragments of ``rows_per_file`` rows. Returns the URI."""
    lance.write_dataset(
        ids_table(num_rows),
        str(path),
        mode="overwrite",
        max_rows_per_file=rows_per_file,
        storage_options=storage_options,
    )
    return str(path)


@pytest.fixture(scope="session")
def ids_1003(tmp_path_factory: pytest.TempPathFactory) -> str:
    """1,003 rows in 4 fragments (300 rows each, the last 103)."""
    return write_ids(tmp_path_factory.mktemp("ids") / "ids1003.lance", 1003, rows_per_file=300)


@pytest.fixture(scope="session")
def ids_25(tmp_path_factory: pytest.TempPathFactory) -> str:
    """25 rows in one fragment."""
    return write_ids(tmp_path_factory.mktemp("ids") / "ids25.lance", 25)


@pytest.fixture
def fresh_ids(tmp_path: Path):
    """A factory for a new dataset in this test's own folder (for tests that modify it)."""

    def make(num_rows: int, *, rows_per_file: int = 1024, name: str = "data.lance") -> str:
        return write_ids(tmp_path / name, num_rows, rows_per_file=rows_per_file)

    return make


@pytest.fixture(scope="session")
def s3():
    """A moto S3 server on 127.0.0.1 (signatures checked) with the bucket ``training``; stopped at
    the end of the session, leaving no thread or port behind (checked)."""
    from support.s3server import S3Server  # moto and boto3 load only when an S3 test runs

    server = S3Server().start()
    port = int(server.endpoint.rsplit(":", 1)[1])
    try:
        server.client().create_bucket(Bucket="training")
        yield server
    finally:
        server.stop()
    assert not server.threads(), server.threads()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()


@pytest.fixture(scope="session")
def s3_ids_503(s3) -> str:
    """503 rows on the S3 server in 3 fragments (200, 200, 103 rows): ``s3://training/ids503.lance``."""
    return write_ids(
        "s3://training/ids503.lance", 503, rows_per_file=200, storage_options=s3.storage_options()
    )


@pytest.fixture
def fresh_s3_ids(s3, request):
    """A factory for a new dataset on the S3 server, under this test's own prefix (for tests that
    modify it); returns its ``s3://`` URI."""
    count = 0

    def make(num_rows: int, *, rows_per_file: int = 1024) -> str:
        nonlocal count
        count += 1
        uri = f"s3://training/{request.node.name}/data{count}.lance"
        return write_ids(
            uri, num_rows, rows_per_file=rows_per_file, storage_options=s3.storage_options()
        )

    return make


@pytest.fixture(params=["array", "lazy"])
def permutation_kind(request, monkeypatch):
    """Run a test with each permutation kind. ``"lazy"`` is made the ``"auto"`` choice for any
    size (``LAZY_THRESHOLD = 0``), in passes of 32 rows and groups of 50 rows of batches, so that
    batches are computed a few at a time and some are split across passes."""
    if request.param == "lazy":
        from lance_prefetch.plan import permutation, sampling

        monkeypatch.setattr(permutation, "LAZY_THRESHOLD", 0)
        monkeypatch.setattr(permutation, "CHUNK_ROWS", 32)
        monkeypatch.setattr(sampling, "CHUNK_ROWS", 50)
    return request.param


@pytest.fixture(autouse=True)
def _no_loop_thread_outlives_its_test():
    """Every event-loop thread a test starts has ended within 10 s of its end (the loaders it made
    closed or collected): a thread left running fails this test, not a later one that counts
    threads."""
    from support.helpers import loop_threads, wait_until

    before = set(loop_threads())
    yield

    def left() -> list:
        return [thread for thread in loop_threads() if thread not in before]

    if left():
        gc.collect()
    assert wait_until(lambda: not left(), timeout=10.0), (
        f"event-loop threads left running: {left()}"
    )


@pytest.fixture(scope="session", autouse=True)
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Disk caches (``cache="disk"`` without ``cache_dir``) go to a folder of this session, also
    in spawned processes (through the environment), never to the user's ``~/.cache``."""
    path = tmp_path_factory.mktemp("cache")
    os.environ["LANCE_PREFETCH_CACHE_DIR"] = str(path)
    return path


#: The ways of reading that tests of exact batches run in (the ``make_loader`` fixture):
#: PrefetchLoader options merged under the test's own. In-process tests run all four. A test
#: through DataLoader workers or new processes runs the modes it can tell apart (a cache filled
#: in each worker, a cache against writers or versions, groups of takes against worker shares),
#: chosen with ``@pytest.mark.parametrize("make_loader", [...], indirect=True)``; every mode
#: still runs through workers in ``test_ranks_times_workers`` (and the caches in
#: ``test_cache.py``, the fork tests and the writer tests). Worker starts are most of the suite's
#: CPU time, so a worker test runs one mode unless another reads differently there.
READ_MODES = {
    "coalesced": {},  # the defaults: coalesce="auto", no cache
    "per-take": {"coalesce": 1},  # ReadOptions(coalesce=1)
    "memory": {"cache": "memory"},
    "disk": {"cache": "disk"},
}


@pytest.fixture(params=list(READ_MODES))
def make_loader(request):
    """A ``PrefetchLoader`` factory for one read mode (:data:`READ_MODES`): the test's arguments,
    over the mode's options. ``loader_class``: a subclass to build instead."""
    from lance_prefetch import PrefetchLoader, ReadOptions

    mode = READ_MODES[request.param]

    def make(*args, loader_class=PrefetchLoader, **options):
        read = options.pop("read", None) or ReadOptions()
        if "coalesce" in mode and read.coalesce == "auto":  # the test's own coalesce wins
            read = dataclasses.replace(read, coalesce=mode["coalesce"])
        cache = {"cache": mode["cache"]} if "cache" in mode else {}
        return loader_class(*args, **{**cache, **options, "read": read})

    make.mode = request.param
    return make


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist, start each test process on one of the ``long`` tests: the initial
    split gives process ``k`` of ``n`` a contiguous share (``len // (n - k)`` of what is left),
    so each share begins with its long tests and none of them is left for the end of the run."""
    workers = getattr(config, "workerinput", {}).get("workercount")
    if not workers:
        return
    long = [item for item in items if item.get_closest_marker("long")]
    rest = [item for item in items if not item.get_closest_marker("long")]
    ordered: list[pytest.Item] = []
    for k in range(workers):
        share = (len(items) - len(ordered)) // (workers - k) - len(long[k::workers])
        ordered += long[k::workers] + rest[:share]
        rest = rest[share:]
    items[:] = ordered + rest
