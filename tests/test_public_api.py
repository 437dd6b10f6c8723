"""The public surface: what ``lance_prefetch`` exports, which modules are public (the rule books)
and which are private machinery, and that every module declares ``__all__``."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import pathlib

import pytest

import lance_prefetch
import lance_prefetch.options

PACKAGE = pathlib.Path(lance_prefetch.__file__).parent
#: The modules users read as rule books (or import from); everything else is private machinery.
PUBLIC = [
    "convert",
    "convert.tokens",
    "integrations.lightning",
    "options",
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
        "Audit",
        "AuditReport",
        "BatchLoadError",
        "CoverageError",
        "Dataset",
        "DiskCache",
        "HedgePolicy",
        "LanceMapDataset",
        "LoaderStats",
        "MemoryCache",
        "Mixture",
        "PrefetchLoader",
        "ReadOptions",
        "RetryPolicy",
        "Shuffle",
        "Split",
        "__version__",
        "collate",
        "state_from_dataloader",
    ]
    assert lance_prefetch.__version__ == "0.2.0.dev0"  # pyproject.toml's version
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


def signature_of(callable_) -> list[tuple[str, str, object]]:
    """``(name, kind, default)`` of each parameter but ``self`` (``default``: ``"-"`` if none)."""
    return [
        (p.name, p.kind.name, "-" if p.default is inspect.Parameter.empty else p.default)
        for p in inspect.signature(callable_).parameters.values()
        if p.name != "self"
    ]


def test_the_loader_takes_its_source_batch_size_and_16_keywords():
    """The surface docs/api.md describes: the names torch and Lance users expect, flat, and the
    option groups of ``lance_prefetch.options`` for the rest."""
    assert signature_of(lance_prefetch.PrefetchLoader.__init__) == [
        ("source", "POSITIONAL_OR_KEYWORD", "-"),
        ("batch_size", "POSITIONAL_OR_KEYWORD", "-"),
        ("columns", "KEYWORD_ONLY", None),
        ("filter", "KEYWORD_ONLY", None),
        ("split", "KEYWORD_ONLY", None),
        ("shuffle", "KEYWORD_ONLY", True),
        ("drop_last", "KEYWORD_ONLY", None),
        ("seed", "KEYWORD_ONLY", 0),
        ("rank", "KEYWORD_ONLY", None),
        ("world_size", "KEYWORD_ONLY", None),
        ("readahead", "KEYWORD_ONLY", "auto"),
        ("read", "KEYWORD_ONLY", None),
        ("cache", "KEYWORD_ONLY", None),
        ("transform", "KEYWORD_ONLY", None),
        ("pin_memory", "KEYWORD_ONLY", False),
        ("device", "KEYWORD_ONLY", None),
        ("audit", "KEYWORD_ONLY", False),
        ("log_every_s", "KEYWORD_ONLY", None),
    ]
    assert signature_of(lance_prefetch.LanceMapDataset.__init__) == [
        ("source", "POSITIONAL_OR_KEYWORD", "-"),
        ("columns", "KEYWORD_ONLY", None),
        ("transform", "KEYWORD_ONLY", None),
        ("retry", "KEYWORD_ONLY", lance_prefetch.RetryPolicy()),
        ("io", "KEYWORD_ONLY", "auto"),
    ]


def test_the_option_groups_are_frozen_dataclasses_with_these_fields():
    fields = {
        "Dataset": [("uri", "-"), ("version", None), ("storage_options", None)],
        "Mixture": [("datasets", "-"), ("weights", "-")],
        "ReadOptions": [
            ("max_in_flight", "auto"),
            ("coalesce", "auto"),
            ("max_buffer_bytes", 256 << 20),
            ("io", "auto"),
            ("retry", lance_prefetch.RetryPolicy()),
            ("hedge", "auto"),
            ("release_memory", True),
        ],
        "Shuffle": [("permutation", "auto")],
        "MemoryCache": [("max_bytes", None)],
        "DiskCache": [("dir", None)],
        "Audit": [("dir", None)],
    }
    for name, expected in fields.items():
        group = getattr(lance_prefetch, name)
        assert dataclasses.is_dataclass(group) and group.__dataclass_params__.frozen, name
        assert [(n, d) for n, _, d in signature_of(group)] == expected, name
        assert getattr(lance_prefetch.options, name) is group
