"""The public surface: what ``lance_prefetch`` exports, which modules are public (the rule books)
and which are private machinery, and that every module declares ``__all__``."""

from __future__ import annotations

import importlib
import pathlib

import pytest

import lance_prefetch

PACKAGE = pathlib.Path(lance_prefetch.__file__).parent
#: The modules users read as rule books (or import from); everything else is private machinery.
PUBLIC = [
    "convert",
    "convert.tokens",
    "integrations.lightning",
    "plan.sampling",
    "plan.permutation",
    "plan.splits",
    "schedule.retry",
    "state",
]
#: The subpackages, one concern each (``docs/design.md``): their faces are documentation only.
SUBPACKAGES = [
    "audit",
    "cache",
    "convert",
    "integrations",
    "lifecycle",
    "loader",
    "plan",
    "schedule",
    "sources",
]


def modules() -> list[str]:
    """Every module of the package by dotted name (``plan.sampling``)."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        if parts in {("__init__",), ("__main__",)}:
            continue
        found.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return found


def private(name: str) -> bool:
    return any(part.startswith("_") for part in name.split("."))


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
    """Every module without an underscore in its path is a rule book or a subpackage's face."""
    public = [name for name in modules() if not private(name)]
    assert sorted(public) == sorted(set(PUBLIC) | set(SUBPACKAGES))


@pytest.mark.parametrize("name", [n for n in modules() if n not in SUBPACKAGES or n == "convert"])
def test_module_all_is_sorted_and_defined(name):
    module = importlib.import_module(f"lance_prefetch.{name}")
    assert sorted(module.__all__) == module.__all__
    for attribute in module.__all__:
        assert getattr(module, attribute).__doc__, f"{name}.{attribute} has no docstring"
