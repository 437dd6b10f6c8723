"""The public surface: what ``lance_prefetch`` exports, and that every module declares __all__."""

from __future__ import annotations

import importlib

import pytest

import lance_prefetch

MODULES = [
    "sampling", "permutation", "epochs", "state", "scheduling", "retry", "source", "convert",
    "dataset", "mapstyle", "_exit_guard", "_interrupts", "telemetry", "coalesce", "cache",
    "tuning",
    "demo", "cli", "bench", "bench.run", "bench.contenders", "bench.report", "bench.local_s3",
    "bench.latency_proxy", "bench.data",
]  # fmt: skip


def test_top_level_exports():
    assert lance_prefetch.__all__ == [
        "BatchLoadError",
        "LanceMapDataset",
        "LoaderStats",
        "PrefetchLoader",
        "RetryPolicy",
        "__version__",
        "collate",
        "state_from_dataloader",
    ]
    assert lance_prefetch.__version__ == "0.1.0"
    assert issubclass(lance_prefetch.BatchLoadError, RuntimeError)


@pytest.mark.parametrize("name", MODULES)
def test_module_all_is_sorted_and_defined(name):
    module = importlib.import_module(f"lance_prefetch.{name}")
    assert sorted(module.__all__) == module.__all__
    for attribute in module.__all__:
        assert getattr(module, attribute).__doc__, f"{name}.{attribute} has no docstring"


def test_only_source_imports_lance():
    """Lance I/O stays in one module (the demo, at the edge, writes its own data)."""
    import pathlib

    package = pathlib.Path(lance_prefetch.__file__).parent
    importers = sorted(
        path.name
        for path in package.glob("*.py")
        if any(
            line.startswith(("import lance", "    import lance"))
            and not line.strip().startswith("import lance_prefetch")
            for line in path.read_text().splitlines()
        )
    )
    # dataset.py and mapstyle.py only name lance.LanceDataset in annotations
    assert importers == ["dataset.py", "demo.py", "mapstyle.py", "source.py"]
