"""The public surface: what ``lance_prefetch`` exports, which modules are public (the rule books)
and which are private machinery, and that every module declares ``__all__``."""

from __future__ import annotations

import importlib
import pathlib

import pytest

import lance_prefetch

PACKAGE = pathlib.Path(lance_prefetch.__file__).parent
#: The modules users read as rule books; everything else is private machinery.
PUBLIC = ["convert", "lightning", "permutation", "retry", "sampling", "splits", "state", "tokens"]
PRIVATE = [
    "_audit",
    "_bitset",
    "_blocking",
    "_budget",
    "_cache",
    "_cache_files",
    "_cli",
    "_coalesce",
    "_config",
    "_coverage",
    "_demo",
    "_device",
    "_direct",
    "_epochs",
    "_errors",
    "_exit_guard",
    "_facade",
    "_filling",
    "_frameworks",
    "_gathered",
    "_interrupts",
    "_iteration",
    "_loader",
    "_mapstyle",
    "_memory_cache",
    "_mixture",
    "_multi",
    "_hedging",
    "_periods",
    "_positions",
    "_prefetcher",
    "_projection",
    "_ranks",
    "_seeds",
    "_sequences",
    "_shutdown",
    "_slots",
    "_source",
    "_subset",
    "_storage",
    "_telemetry",
    "_tuning",
    "_uris",
    "_validate",
    "_versions",
    "_bench",
    "_bench.config",
    "_bench.contenders",
    "_bench.data",
    "_bench.latency_proxy",
    "_bench.local_s3",
    "_bench.report",
    "_bench.run",
    "_bench.verdicts",
    "_bench._map_contenders",
    "_bench._spec",
]


def test_top_level_exports():
    assert lance_prefetch.__all__ == [
        "AuditReport",
        "BatchLoadError",
        "CoverageError",
        "HedgePolicy",
        "LanceMapDataset",
        "LoaderStats",
        "PrefetchLoader",
        "RetryPolicy",
        "Split",
        "__version__",
        "collate",
        "state_from_dataloader",
    ]
    assert lance_prefetch.__version__ == "0.1.0"
    assert issubclass(lance_prefetch.BatchLoadError, RuntimeError)
    assert issubclass(lance_prefetch.CoverageError, RuntimeError)


def test_only_the_rule_books_are_public_modules():
    """Every module without a leading underscore is one of PUBLIC; the machinery is private."""
    modules = sorted(
        path.stem
        for path in PACKAGE.iterdir()
        if (path.suffix == ".py" or (path / "__init__.py").exists())
        and not path.name.startswith("__")
    )
    assert [name for name in modules if not name.startswith("_")] == PUBLIC
    assert sorted(name for name in modules if name.startswith("_")) == sorted(
        name for name in PRIVATE if "." not in name
    )


@pytest.mark.parametrize("name", PUBLIC + PRIVATE)
def test_module_all_is_sorted_and_defined(name):
    module = importlib.import_module(f"lance_prefetch.{name}")
    assert sorted(module.__all__) == module.__all__
    for attribute in module.__all__:
        assert getattr(module, attribute).__doc__, f"{name}.{attribute} has no docstring"


def test_only_source_imports_lance():
    """Lance I/O stays in one module (the demo, at the edge, writes its own data); the readers
    name ``lance.LanceDataset`` in annotations only (under ``TYPE_CHECKING``)."""
    importers = []
    for path in sorted(PACKAGE.glob("*.py")):
        type_checking = False
        for line in path.read_text().splitlines():
            if line.startswith("if TYPE_CHECKING:"):
                type_checking = True
            elif line and not line.startswith(" "):
                type_checking = False
            if line.strip().startswith("import lance") and "lance_prefetch" not in line:
                if not type_checking:
                    importers.append(path.name)
    assert sorted(set(importers)) == ["_demo.py", "_source.py"]
