"""The benchmark's verdicts: whether the contenders read the same rows, the medians of repeated
rounds, and the performance targets, all computed from the plain report dict (see
:mod:`~lance_prefetch_bench.report`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from lance_prefetch_bench._spec import SWEPT_KINDS

__all__ = [
    "best_labels",
    "best_prefetch",
    "by_name",
    "check_ids",
    "comparisons",
    "defaults_vs_best",
    "evaluate_targets",
    "failures",
    "is_ok",
    "merge_rounds",
    "noise_flags",
    "paired_ratio",
    "prefetch_runs",
    "same_rows_verdict",
    "setting_of",
    "spread",
    "sweep_winners",
]

PREFETCH = "lance-prefetch"
BASELINES = ("sequential", "map-style", "lance-torch", "ceiling")
EXCLUDED_FROM_IDS = {
    "lance-torch": "pseudo-random sampler of its own (shuffled contiguous ranges), so it cannot "
    "read the plan's batches",
    "scan": "a sequential scan in disk order, not the plan's batches",
    "grain": "Grain's own global index shuffle (uniform), not the plan's batches",
    "lancedb-streaming": "its own permutation (uniform), not the plan's batches",
}
WAIT_TARGET = 0.05
#: Identical settings whose rows/s ranges lie further apart than this fraction are flagged.
NOISE_GAP = 0.05


def is_ok(contender: Mapping[str, Any]) -> bool:
    """Whether the contender ran and ended without an error (not failed, not skipped)."""
    return "error" not in contender and "skipped" not in contender


def check_ids(contenders: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Whether every contender (but those in :data:`EXCLUDED_FROM_IDS`) read the same rows.

    For each epoch, the contenders that read it are compared on the checksum of their sorted ids
    (the same rows, repeats counted) and on the checksum of their batches in order (the same
    batches, in the same order). Contenders that failed are listed, not compared. The runs of one
    label (``BenchConfig.repeats``) are all compared, and count as one contender.

    Returns:
        dict: ``ok`` (bool: every epoch has one checksum of each kind, from at least two
        labels), ``compared`` (bool: every epoch was read by at least two labels; when not, a
        failed ``ok`` means there was nothing to compare, not that rows differed), ``epochs``
        (per epoch: ``contenders``, ``rows``, ``same_rows``, ``same_batches``, ``from``),
        ``excluded`` (name: reason).
    """
    epochs: dict[str, dict[str, Any]] = {}
    excluded = {}
    for contender in contenders:
        name = contender["label"]
        if contender["name"] in EXCLUDED_FROM_IDS:
            excluded[name] = EXCLUDED_FROM_IDS[contender["name"]]
            continue
        if "skipped" in contender:
            excluded[name] = f"skipped: {contender['skipped']}"
            continue
        if not is_ok(contender):
            excluded[name] = f"failed: {contender['error']}"
            continue
        for epoch, record in contender.get("ids", {}).items():
            entry = epochs.setdefault(
                epoch,
                {"contenders": [], "rows": set(), "sha": set(), "batches": set(), "from": set()},
            )
            if name not in entry["contenders"]:  # a setting's repeated runs count once
                entry["contenders"].append(name)
            entry["rows"].add(record["rows"])
            entry["sha"].add(record["sha256"])
            entry["batches"].add(record.get("batches_sha256"))
            entry["from"].add(record["from"])
    summary = {}
    for epoch, entry in sorted(epochs.items()):
        summary[epoch] = {
            "contenders": entry["contenders"],
            "rows": sorted(r for r in entry["rows"] if r is not None),
            "same_rows": len(entry["sha"]) == 1 and None not in entry["sha"],
            "same_batches": len(entry["batches"]) == 1 and None not in entry["batches"],
            "from": sorted(entry["from"]),
        }
    compared = bool(summary) and all(len(e["contenders"]) >= 2 for e in summary.values())
    ok = compared and all(e["same_rows"] and e["same_batches"] for e in summary.values())
    return {"ok": ok, "compared": compared, "epochs": summary, "excluded": excluded}


def same_rows_verdict(check: Mapping[str, Any]) -> str:
    """``"yes"``, ``"NO"``, or why it was not checked, for a :func:`check_ids` result."""
    if check["ok"]:
        return "yes"
    differ = not all(e["same_rows"] and e["same_batches"] for e in check["epochs"].values())
    if differ or check["compared"]:
        return "NO"
    return "not checked: fewer than two contenders (settings) read rows; add another"


def merge_rounds(contenders: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One entry per label: a setting run in several rounds (``BenchConfig.repeats``) becomes its
    median run.

    The median run is the one with the median rows/s of the throughput pass (of an even count,
    the lower of the two middle ones); its step pass's ``wait_fraction`` is replaced by the median
    of the rounds' (of an even count, the higher: both medians lean to the worse side; they are
    taken separately). The entry gains ``rounds``: per run, ``round``, ``rows_per_s`` and
    ``wait_fraction``, or ``error``; and ``failed_rounds`` (the errors) when some runs failed,
    which the exit status counts as a failure. Failed runs are left out of the medians; a setting
    whose every run failed keeps its first failure. Entries keep the order of their labels' first
    runs.
    """
    by_label: dict[str, list[Mapping[str, Any]]] = {}
    for contender in contenders:
        by_label.setdefault(contender["label"], []).append(contender)
    merged = []
    for runs in by_label.values():
        if len(runs) == 1:
            merged.append(dict(runs[0]))
            continue
        ok = sorted((run for run in runs if is_ok(run)), key=_rows_per_s)
        entry = dict(ok[(len(ok) - 1) // 2]) if ok else dict(runs[0])
        waits = sorted(
            run["passes"]["step"]["wait_fraction"]
            for run in ok
            if run["passes"].get("step", {}).get("wait_fraction") is not None
        )
        if waits:
            passes = dict(entry["passes"])
            passes["step"] = {**passes["step"], "wait_fraction": waits[len(waits) // 2]}
            entry["passes"] = passes
        entry["rounds"] = [
            {"round": run.get("round"), "error": run["error"]}
            if not is_ok(run)
            else {
                "round": run.get("round"),
                "rows_per_s": _rows_per_s(run),
                "wait_fraction": run["passes"].get("step", {}).get("wait_fraction"),
            }
            for run in runs
        ]
        failed = [run["error"] for run in runs if not is_ok(run)]
        if failed:
            entry["failed_rounds"] = failed
        merged.append(entry)
    return merged


def failures(contenders: Sequence[Mapping[str, Any]]) -> list[str]:
    """Labels of the contenders that failed, in every run or in some (``failed_rounds``); a
    skipped one (a peer not installed) is not a failure."""
    return [c["label"] for c in contenders if "error" in c or c.get("failed_rounds")]


def by_name(contenders: Sequence[Mapping[str, Any]], name: str) -> Mapping[str, Any] | None:
    """The contender called ``name`` with the most rows/s among those that ran without an error
    (a swept contender's best setting; see :func:`sweep_winners`), or ``None``."""
    ran = [c for c in contenders if c["name"] == name and is_ok(c)]
    return max(ran, key=lambda c: c["passes"]["throughput"]["rows_per_s"], default=None)


def _rows_per_s(contender: Mapping[str, Any] | None) -> float | None:
    return None if contender is None else contender["passes"]["throughput"]["rows_per_s"]


def setting_of(contender: Mapping[str, Any], name: str, default: Any) -> Any:
    """The contender's setting ``name``, or ``default``."""
    return contender.get("settings", {}).get(name, default)


def prefetch_runs(
    contenders: Sequence[Mapping[str, Any]],
    *,
    cache: str | None = "none",
    auto: bool | None = None,
    coalesce: int | str | None = None,
) -> list[Mapping[str, Any]]:
    """The ``lance-prefetch`` settings that ran, but its defaults (``lance-prefetch defaults``):
    those with ``cache`` (``None``: any), with readahead ``"auto"`` (``auto=True``) or fixed
    (``auto=False``; ``None``: either), and with ``coalesce`` (``None``: any)."""
    runs = []
    for contender in contenders:
        if contender["name"] != PREFETCH or not is_ok(contender):
            continue
        if setting_of(contender, "defaults", False):
            continue
        if cache is not None and setting_of(contender, "cache", "none") != cache:
            continue
        if auto is not None and (setting_of(contender, "readahead", 0) == "auto") != auto:
            continue
        if coalesce is not None and setting_of(contender, "coalesce", "auto") != coalesce:
            continue
        runs.append(contender)
    return runs


def best_prefetch(
    contenders: Sequence[Mapping[str, Any]],
    *,
    cache: str | None = "none",
    auto: bool | None = None,
    coalesce: int | str | None = None,
) -> Mapping[str, Any] | None:
    """The ``lance-prefetch`` setting with the most rows/s in the throughput pass among
    :func:`prefetch_runs` (without a cache unless ``cache`` says otherwise)."""
    runs = prefetch_runs(contenders, cache=cache, auto=auto, coalesce=coalesce)
    return max(runs, key=_rows_per_s, default=None)


def evaluate_targets(report: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The performance targets, each with ``target``, ``applies`` (to this run's storage), ``value``,
    ``met`` (``None`` if it could not be evaluated) and ``detail``."""
    contenders = report["contenders"]
    remote = report["meta"]["storage"]["kind"] != "local disk"
    best = best_prefetch(contenders)
    best_rate = _rows_per_s(best)
    targets = []

    def ratio_target(target: str, other: str, factor: float, applies: bool) -> None:
        rate = _rows_per_s(by_name(contenders, other))
        if best_rate is None or rate is None:
            targets.append(
                {
                    "target": target,
                    "applies": applies,
                    "value": None,
                    "met": None,
                    "detail": f"not measured ({PREFETCH} or {other} not in --contenders, or failed)",
                }
            )
            return
        value = best_rate / rate
        targets.append(
            {
                "target": target,
                "applies": applies,
                "value": value,
                "met": value >= factor,
                "detail": f"best {PREFETCH} ({best['label']}) {best_rate:,.0f} rows/s = "
                f"{value:.2f}x {other} ({rate:,.0f} rows/s)",
            }
        )

    ratio_target(f"emulated S3: best {PREFETCH} >= 4x sequential rows/s", "sequential", 4, remote)
    ratio_target(f"emulated S3: best {PREFETCH} >= map-style rows/s", "map-style", 1, remote)
    ratio_target(f"local disk: best {PREFETCH} >= 0.9x ceiling rows/s", "ceiling", 0.9, not remote)
    targets.extend(_performance_targets(report, remote))

    applicable, missed = [], []
    for contender in prefetch_runs(contenders, cache=None):
        step = contender["passes"]["step"]
        mean_take = step.get("take_mean_ms")
        mif = contender["settings"]["max_in_flight"]
        if mean_take is None or step.get("wait_fraction") is None or mif == "auto":
            continue
        if step["step_ms"] >= 1.2 * mean_take / mif:
            applicable.append(contender["label"])
            if step["wait_fraction"] >= WAIT_TARGET:
                missed.append(f"{contender['label']}: {step['wait_fraction']:.1%}")
    step_ms = report["meta"]["settings"]["step_ms"]
    targets.append(
        {
            "target": f"{PREFETCH} wait fraction < 5% when step_ms >= 1.2 x mean take time / "
            f"max_in_flight",
            "applies": True,
            "value": len(applicable) - len(missed),
            "met": (not missed) if applicable else None,
            "detail": (
                f"step {step_ms:g} ms satisfies the condition for {len(applicable)} setting(s); "
                + (f"missed by {', '.join(missed)}" if missed else "all of them waited < 5%")
                if applicable
                else f"step {step_ms:g} ms is shorter than 1.2 x mean take / max_in_flight for "
                f"every setting: raise --step-ms"
            ),
        }
    )
    return targets


def paired_ratio(contender: Mapping[str, Any], other: Mapping[str, Any]) -> dict[str, Any] | None:
    """Rows/s of ``contender`` over ``other`` round by round (the runs of one round ran next to
    each other, so a machine that slows down for a while slows both): the median of the
    per-round ratios (of an even count, the lower middle one), their lowest and highest, and how
    many rounds both ran. ``None`` without a round both ran."""
    theirs = {r["round"]: r["rows_per_s"] for r in other.get("rounds", []) if "rows_per_s" in r}
    ratios = sorted(
        r["rows_per_s"] / theirs[r["round"]]
        for r in contender.get("rounds", [])
        if "rows_per_s" in r and theirs.get(r["round"])
    )
    if not ratios:
        return None
    return {
        "median": ratios[(len(ratios) - 1) // 2],
        "low": ratios[0],
        "high": ratios[-1],
        "rounds": len(ratios),
    }


def _ceiling_at(contenders: Sequence[Mapping[str, Any]], threads: int) -> float | None:
    """The best rows/s of ``ceiling`` with ``threads`` threads, if that size ran."""
    ceiling = by_name(contenders, "ceiling")
    if ceiling is None:
        return None
    rates = [p["rows_per_s"] for p in ceiling.get("sweep", []) if p["concurrency"] == threads]
    return max(rates, default=None)


def _performance_targets(report: Mapping[str, Any], remote: bool) -> list[dict[str, Any]]:
    """Coalescing, caches and auto readahead, for the settings that ran."""
    contenders = report["contenders"]
    targets: list[dict[str, Any]] = []

    def add(target: str, applies: bool, value: float | None, factor: float, detail: str) -> None:
        met = None if value is None else value >= factor
        targets.append(
            {"target": target, "applies": applies, "value": value, "met": met, "detail": detail}
        )

    def rate_text(contender: Mapping[str, Any] | None) -> str:
        if contender is None:
            return "not run"
        return f"{contender['label']} {_rows_per_s(contender):,.0f} rows/s"

    ceiling_4 = _ceiling_at(contenders, 4)
    scan = by_name(contenders, "lance-torch")
    anchor = f"; scan-speed anchor: lance-torch {_rows_per_s(scan):,.0f} rows/s" if scan else ""
    plain, memory = best_prefetch(contenders), best_prefetch(contenders, cache="memory")
    for contender, factor, what in ((plain, 1.0, "no cache"), (memory, 10.0, "cache=memory")):
        if contender is None or ceiling_4 is None:
            continue
        value = _rows_per_s(contender) / ceiling_4
        add(
            f"local disk, {what}: best {PREFETCH} >= {factor:g}x the 4-thread take ceiling",
            not remote,
            value,
            factor,
            f"{rate_text(contender)} = {value:.2f}x ceiling at 4 threads ({ceiling_4:,.0f} "
            f"rows/s){anchor}",
        )
    cached = max(
        (best_prefetch(contenders, cache=c) for c in ("memory", "disk")),
        key=lambda c: -1.0 if c is None else _rows_per_s(c),
    )
    if cached is not None and plain is not None:
        value = _rows_per_s(cached) / _rows_per_s(plain)
        add(
            f"emulated S3: a cached {PREFETCH}'s later epochs >= 20x the uncached loader's rows/s",
            remote,
            value,
            20.0,
            f"{rate_text(cached)} (filled during its start: {cached['warmup_s']:.1f} s) = "
            f"{value:.1f}x uncached {rate_text(plain)}",
        )
    one = best_prefetch(contenders, coalesce=1)
    coalesced_runs = [c for c in prefetch_runs(contenders) if setting_of(c, "coalesce", 1) != 1]
    coalesced = max(coalesced_runs, key=_rows_per_s, default=None)
    if one is not None and coalesced is not None:
        value = _rows_per_s(coalesced) / _rows_per_s(one)
        add(
            f"coalesced takes: best {PREFETCH} with coalescing >= 1.5x one take per batch",
            report["meta"]["settings"]["batch_size"] <= 64,
            value,
            1.5,
            f"{rate_text(coalesced)} = {value:.2f}x {rate_text(one)}",
        )
    for cache in ("none", "memory", "disk"):
        auto = best_prefetch(contenders, cache=cache, auto=True)
        fixed = best_prefetch(contenders, cache=cache, auto=False)
        if auto is None or fixed is None:
            continue
        value = _rows_per_s(auto) / _rows_per_s(fixed)
        paired = paired_ratio(auto, fixed)
        same_round = (
            f"; round by round: median {paired['median']:.2f}x "
            f"({paired['low']:.2f}-{paired['high']:.2f}x over {paired['rounds']} rounds)"
            if paired and paired["rounds"] > 1
            else ""
        )
        add(
            f"readahead='auto' (cache={cache}) within 10% of the best fixed setting",
            True,
            value,
            0.9,
            f"{rate_text(auto)} = {value:.2f}x the best fixed, {rate_text(fixed)}{same_round}",
        )
        calm = [
            c
            for c in prefetch_runs(contenders, cache=cache, auto=False)
            if (c["passes"]["step"].get("wait_fraction") or 1.0) < 0.01
        ]
        wait = auto["passes"]["step"].get("wait_fraction")
        if wait is not None:
            targets.append(
                {
                    "target": f"readahead='auto' (cache={cache}) waits < 1% of the step pass "
                    f"when a fixed setting does",
                    "applies": bool(calm),
                    "value": wait,
                    "met": (wait < 0.01) if calm else None,
                    "detail": f"{auto['label']} waited {wait:.2%}; fixed settings under 1%: "
                    f"{', '.join(c['label'] for c in calm) or 'none'}",
                }
            )
    return targets


def spread(contender: Mapping[str, Any]) -> tuple[float, float, int] | None:
    """(lowest, highest, runs) of the rows/s of the contender's runs that succeeded (one run:
    its own rows/s twice), or ``None`` when none did."""
    rates = [r["rows_per_s"] for r in contender.get("rounds", []) if "rows_per_s" in r]
    if not rates and is_ok(contender):
        rates = [contender["passes"]["throughput"]["rows_per_s"]]
    if not rates:
        return None
    return min(rates), max(rates), len(rates)


def _identity(contender: Mapping[str, Any]) -> tuple[Any, ...]:
    """What a ``lance-prefetch`` row runs: its defaults row and the same values given in the
    grid (``auto``) are the same setting."""
    return tuple(
        str(setting_of(contender, name, default))
        for name, default in (
            ("readahead", None),
            ("max_in_flight", None),
            ("coalesce", "auto"),
            ("cache", "none"),
            ("hedge", "auto"),
            ("io", "auto"),
        )
    )


def noise_flags(contenders: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Rows with identical settings (``lance-prefetch defaults`` and the same values given as a
    grid point) whose rows/s ranges (:func:`spread`) lie more than :data:`NOISE_GAP` apart:
    the machine's noise, larger than the spread their runs showed.

    Returns:
        list[dict]: per group flagged, ``labels`` (the rows) and ``detail`` (each row's median,
        range and runs).
    """
    groups: dict[tuple[Any, ...], list[Mapping[str, Any]]] = {}
    for contender in contenders:
        if contender["name"] == PREFETCH and is_ok(contender):
            groups.setdefault(_identity(contender), []).append(contender)
    flags = []
    for rows in groups.values():
        ranges = [(row, measured) for row in rows if (measured := spread(row)) is not None]
        if len(ranges) < 2:
            continue
        lowest_high = min(high for _, (_, high, _) in ranges)
        highest_low = max(low for _, (low, _, _) in ranges)
        if highest_low <= lowest_high * (1 + NOISE_GAP):
            continue
        flags.append(
            {
                "labels": [row["label"] for row, _ in ranges],
                "detail": " vs ".join(
                    f"{row['label']} {row['passes']['throughput']['rows_per_s']:,.0f} rows/s "
                    f"({low:,.0f}-{high:,.0f}, {runs} run{'s' if runs > 1 else ''})"
                    for row, (low, high, runs) in ranges
                ),
            }
        )
    return flags


def best_labels(contenders: Sequence[Mapping[str, Any]]) -> list[str]:
    """The ``lance-prefetch`` row with the highest rows/s (the median of its runs) of each
    family (the rows with one ``cache`` value), its defaults row included: no other row of the
    family reads more."""
    best: dict[str, Mapping[str, Any]] = {}
    for contender in contenders:
        if contender["name"] != PREFETCH or not is_ok(contender):
            continue
        family = str(setting_of(contender, "cache", "none"))
        rate = contender["passes"]["throughput"]["rows_per_s"]
        if family not in best or rate > best[family]["passes"]["throughput"]["rows_per_s"]:
            best[family] = contender
    return [contender["label"] for contender in best.values()]


def comparisons(contenders: list[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Rows/s ratios between optional contenders run together: one ``take`` per batch
    (``lance-map``) against one per row (``lance-map-rows``)."""
    found = []
    batch, rows = by_name(contenders, "lance-map"), by_name(contenders, "lance-map-rows")
    if _rows_per_s(batch) and _rows_per_s(rows):
        found.append(
            {
                "what": "LanceMapDataset __getitems__ (one take per batch) vs __getitem__ (one take "
                "per row)",
                "ratio": _rows_per_s(batch) / _rows_per_s(rows),
                "detail": f"{_rows_per_s(batch):,.0f} vs {_rows_per_s(rows):,.0f} rows/s, "
                "same workers and batches",
            }
        )
    return found


def sweep_winners(contenders: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """For each contender swept over its own concurrency knob (those of
    :data:`~lance_prefetch_bench._spec.SWEPT_KINDS`; rows of one name, one setting each), the
    setting with the most rows/s (the median of its runs) among those that ran.

    Returns:
        list[dict]: per name, in order of first appearance: ``name``, ``parameter`` (the knob),
        ``value`` and ``label`` of the winner, ``rows_per_s`` (its rows/s), ``tried`` (each
        setting that ran, in run order, as ``(value, rows/s)``) and ``edge`` (``"highest"`` or
        ``"lowest"`` when the winner is the highest or lowest of two or more values tried, so a
        wider sweep may find more; else ``None``); names none of whose settings ran are left out.
    """
    found: dict[str, dict[str, Any]] = {}
    for contender in contenders:
        if contender["name"] not in SWEPT_KINDS or not is_ok(contender):
            continue
        parameter = SWEPT_KINDS[contender["name"]][0]
        value = setting_of(contender, parameter, None)
        rate = contender["passes"]["throughput"]["rows_per_s"]
        entry = found.setdefault(
            contender["name"],
            {"name": contender["name"], "parameter": parameter, "tried": [], "rows_per_s": -1.0},
        )
        entry["tried"].append((value, rate))
        if rate > entry["rows_per_s"]:
            entry.update(value=value, label=contender["label"], rows_per_s=rate)
    for entry in found.values():
        values = [value for value, _ in entry["tried"]]
        entry["edge"] = None
        if len(set(values)) > 1 and entry["value"] in (max(values), min(values)):
            entry["edge"] = "highest" if entry["value"] == max(values) else "lowest"
    return list(found.values())


def defaults_vs_best(contenders: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The loader's defaults (``lance-prefetch defaults``) against the best setting of the grid
    without a cache (:func:`best_prefetch`), or ``None`` when either did not run.

    Returns:
        dict: ``defaults`` and ``best`` (rows/s), ``best_label``, ``ratio`` (defaults / best:
        ``1.0`` or more when no setting of the grid read more) and ``settings`` (the grid
        settings compared, without the defaults).
    """
    defaults = next(
        (
            c
            for c in contenders
            if c["name"] == PREFETCH and is_ok(c) and setting_of(c, "defaults", False)
        ),
        None,
    )
    best = best_prefetch(contenders)
    if defaults is None or best is None:
        return None
    rate, best_rate = _rows_per_s(defaults), _rows_per_s(best)
    assert rate is not None and best_rate is not None
    return {
        "defaults": rate,
        "best": best_rate,
        "best_label": best["label"],
        "ratio": rate / best_rate,
        "settings": len(prefetch_runs(contenders)),
    }
