"""The benchmark's outputs: a JSON file, a Markdown table and a plot (the verdicts they show are
computed by :mod:`~lance_prefetch_bench.verdicts`).

A report is a plain dict (written as JSON as it is)::

    {"meta": {...machine, versions, dataset, storage, settings...},
     "contenders": [{"name", "label", "settings", "passes": {"throughput": {...}, "step": {...}},
                     "ids": {"0": {...}, "1": {...}}, "peak_rss_mib", "notes", ...}, ...],
     "ids_check": {...}, "targets": [...] (with ``--targets`` only)}

``meta.progress`` holds ``finished`` and ``planned`` (contender runs), ``complete`` and
``interrupted`` (``None``, ``"Ctrl-C"`` or ``"exit status N"``): the outputs are rewritten after
every run, so a partial report is a report too.

A contender has ``io`` (the Lance reader its takes went through: ``"uring"`` or
``"default"``), ``uniform`` (whether its batches are uniformly random, and how; see
:data:`~lance_prefetch_bench._spec.UNIFORM`), and ``skipped`` (why, and how to install it) in place
of ``passes`` when it is a peer loader that is not installed.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from lance_prefetch_bench._spec import UNIFORM
from lance_prefetch_bench.verdicts import (
    NOISE_GAP,
    PREFETCH,
    best_labels,
    by_name,
    defaults_vs_best,
    is_ok,
    noise_flags,
    prefetch_runs,
    same_rows_verdict,
    setting_of,
    spread,
    sweep_winners,
)

__all__ = [
    "reader_text",
    "sweep_lines",
    "table_rows",
    "takes_text",
    "to_markdown",
    "bar_chart",
    "write_grid_plot",
    "write_outputs",
    "write_plot",
]


# -- Markdown ------------------------------------------------------------------------------------
def _fmt(value: Any, spec: str = ",.0f", scale: float = 1.0) -> str:
    if value is None:
        return "n/a"
    return format(value * scale, spec)


def _settings_text(contender: Mapping[str, Any]) -> str:
    settings = contender.get("settings", {})
    if contender["name"] == PREFETCH:
        text = f"readahead={settings['readahead']}, max_in_flight={settings['max_in_flight']}"
        if settings.get("defaults"):
            text = f"no tuning arguments (its defaults: {text}, coalesce={settings['coalesce']})"
        elif "coalesce" in settings:  # (reports before coalescing read one take a batch)
            text += f", coalesce={settings['coalesce']}"
        if settings.get("cache", "none") != "none":
            text += f", cache={settings['cache']}"
            if contender.get("fill_s") is not None:  # timed passes read the filled cache
                text += f" (filled {contender['fill_s']:.1f} s after the first iter())"
        if settings.get("hedge", "auto") != "auto":
            text += f", hedge={settings['hedge']}"
        if settings.get("io", "auto") != "auto" and not settings.get("defaults"):
            text += f", io={settings['io']}"
        return text + _failed_rounds_text(contender)
    return _other_settings_text(contender, settings) + _failed_rounds_text(contender)


def _failed_rounds_text(contender: Mapping[str, Any]) -> str:
    failed = contender.get("failed_rounds", [])
    if not failed:
        return ""
    return f"; {len(failed)} of {len(contender['rounds'])} runs FAILED: {failed[0]}"


def _other_settings_text(contender: Mapping[str, Any], settings: Mapping[str, Any]) -> str:
    if contender["name"] in ("ceiling", "coalesced-ceiling") and is_ok(contender):
        repeats = settings.get("repeats", 1)
        tried = f"{settings['concurrency']}" + (f" x {repeats} runs" if repeats > 1 else "")
        threads = f"{contender['best_concurrency']} threads (best of {tried})"
        if contender["name"] == "ceiling":
            return f"one take a batch, {threads}"
        return (
            f"the loader defaults' takes: coalesce={contender.get('coalesce')} batches a take, "
            f"{threads}"
        )
    if contender["name"] in ("map-style", "lance-map", "lance-map-rows"):
        return f"num_workers={settings['num_workers']}, spawn"
    if contender["name"] == "prefetch-workers":
        return (
            f"num_workers={settings['num_workers']}, spawn; readahead={settings['readahead']}, "
            f"max_in_flight={settings['max_in_flight']} each"
        )
    if contender["name"] == "lance-torch":
        return f"batch_readahead={settings['batch_readahead']}, pseudo-random"
    if contender["name"] == "scan":
        return f"to_batches(batch_readahead={settings['batch_readahead']}), disk order"
    if contender["name"] == "grain":
        return f"ReadOptions(num_threads={settings['num_threads']}), one take per index batch"
    if contender["name"] == "spdl":
        return f"take concurrency={settings['concurrency']}, output_order=input"
    if contender["name"] == "lancedb-streaming":
        return f"num_splits={settings['num_splits']}, read_batch_size=64, io_queue_depth=4"
    return ""


def reader_text(contender: Mapping[str, Any]) -> str:
    """The reader behind the contender's rows: ``io_uring`` or ``Lance default`` (Lance's
    reader its takes went through), ``contiguous scan`` (``lance-torch``), or ``peer's own``."""
    io = {"uring": "io_uring", "default": "Lance default"}.get(contender.get("io", ""), "n/a")
    name = contender["name"]
    if name == "lance-torch":
        return "contiguous scan" + (" (io_uring)" if io == "io_uring" else "")
    if name == "scan":
        return "sequential scan" + (" (io_uring)" if io == "io_uring" else "")
    if name in ("grain", "spdl"):
        return f"peer's own, takes through {io}"
    if name == "lancedb-streaming":
        return "peer's own (LanceDB take_offsets)"
    return io


def takes_text(contender: Mapping[str, Any], batch_size: int) -> str:
    """``take`` calls a batch: measured for ``lance-prefetch`` (its takes during the throughput
    pass over its batches; ``1/16``: one take serves 16 batches), the size of its takes for
    ``coalesced-ceiling``, else what the contender does (``lancedb-streaming``: one
    ``take_offsets`` of 64 rows, its ``read_batch_size``, for every 64 rows of a batch)."""
    name = contender["name"]
    if name == PREFETCH:
        throughput = (contender.get("passes") or {}).get("throughput") or {}
        takes, batches = throughput.get("takes"), throughput.get("batches")
        if not takes or not batches:
            return "n/a"
        value = takes / batches
        return f"1/{1 / value:.0f}" if value < 1 else f"{value:.2g}"
    coalesce = contender.get("coalesce")
    if name == "coalesced-ceiling":
        return "n/a" if coalesce is None else f"1/{coalesce}"
    if name == "prefetch-workers":
        if coalesce is None:
            return f"coalesce={setting_of(contender, 'coalesce', 'auto')}"
        return f"1/{coalesce} at most (resolved; the workers' takes are not counted)"
    if name == "lance-map-rows":
        return f"{batch_size} (a row each)"
    if name in ("lance-torch", "scan"):
        return "0 (scan)"
    if name == "lancedb-streaming":  # take_offsets of read_batch_size (64) rows of a split
        return f"{batch_size / 64:.2g} ({64}-row take_offsets)"
    return "1"


def uniform_text(contender: Mapping[str, Any]) -> str:
    """Whether the contender's batches are uniformly random (``yes``, ``yes (...)``, ``no (...)``)."""
    return contender.get("uniform") or UNIFORM.get(contender["name"], "n/a")


def display_name(contender: Mapping[str, Any]) -> str:
    """The contender's name, with ``defaults`` for the loader run without tuning arguments."""
    if contender["name"] == PREFETCH and setting_of(contender, "defaults", False):
        return f"{PREFETCH} defaults"
    return contender["name"]


def table_rows(report: Mapping[str, Any]) -> list[list[str]]:
    """The Markdown table's rows (header first). ``rows/s`` is the median of the runs (one run:
    its own), ``!`` after it marks rows of identical settings that differ by more than their
    spread (:func:`~lance_prefetch_bench.verdicts.noise_flags`), and ``(best)`` the
    ``lance-prefetch`` row with the highest median of its family (one ``cache`` value)."""
    step_ms = report["meta"]["settings"]["step_ms"]
    batch_size = report["meta"]["settings"]["batch_size"]
    rows = [
        [
            "contender",
            "settings",
            "reader",
            "takes/batch",
            "uniform",
            "rows/s",
            "spread (min-max, runs)",
            "batches/s",
            "MiB/s",
            "first batch ms, cold",
            "first batch ms, epoch",
            "take p50 ms",
            "take p99 ms",
            "peak RSS MiB",
            f"waited, {step_ms:g} ms step",
            "start s",
        ]
    ]
    best = set(best_labels(report["contenders"]))
    winners = {w["label"] for w in sweep_winners(report["contenders"]) if len(w["tried"]) > 1}
    flagged = {label for flag in noise_flags(report["contenders"]) for label in flag["labels"]}
    for contender in report["contenders"]:
        name = display_name(contender)
        if contender["label"] in best:
            name = f"**{name}** (best)"
        elif contender["label"] in winners:
            name = f"**{name}** (best of its sweep)"
        elif name != contender["name"]:
            name = f"**{name}**"
        described = [
            name,
            _settings_text(contender),
            reader_text(contender),
            takes_text(contender, batch_size),
            uniform_text(contender),
        ]
        if not is_ok(contender):
            why = f"skipped: {contender['skipped']}" if "skipped" in contender else None
            why = why or f"failed: {contender['error']}"
            rows.append(described + [why] + [""] * (len(rows[0]) - len(described) - 1))
            continue
        throughput = contender["passes"]["throughput"]
        step = contender["passes"].get("step", {})
        low, high, runs = spread(contender) or (0.0, 0.0, 0)
        rows.append(
            described
            + [
                _fmt(throughput["rows_per_s"]) + (" !" if contender["label"] in flagged else ""),
                f"{low:,.0f}-{high:,.0f} ({runs})" if runs > 1 else "1 run",
                _fmt(throughput["batches_per_s"], ",.1f"),
                _fmt(throughput["mib_per_s"], ",.1f"),
                _fmt(contender.get("cold_first_batch_s"), ",.0f", 1000),
                _fmt(throughput["first_batch_s"], ",.0f", 1000),
                _fmt(throughput.get("take_p50_ms"), ",.1f"),
                _fmt(throughput.get("take_p99_ms"), ",.1f"),
                _fmt(contender.get("peak_rss_mib")),
                _fmt(step.get("wait_fraction"), ".1%"),
                _fmt(contender["setup_s"] + contender["warmup_s"], ",.1f"),
            ]
        )
    return rows


def to_markdown(report: Mapping[str, Any], *, plot_name: str | None = None) -> str:
    """The report as Markdown: setup, the table, the same-ids check, the comparisons, the notes
    (and the targets, when the report has them: ``--targets``)."""
    meta = report["meta"]
    settings, storage, dataset = meta["settings"], meta["storage"], meta["dataset"]
    lines = [
        f"## lance-prefetch bench: {storage['kind']}",
        "",
        f"- machine: {meta['machine']['summary']}; load average {meta['load_average_start']} at "
        f"the start, {meta['load_average_end']} at the end",
        f"- versions: {', '.join(f'{k} {v}' for k, v in meta['versions'].items())}",
        f"- storage: {storage['description']}",
        f"- `LANCE_IO_THREADS`: {storage['lance_io_threads']}; request-rate limiter: "
        f"{storage['limiter']}",
        f"- dataset: {dataset['rows']:,} rows in {dataset['fragments']} fragment(s), columns "
        f"{dataset['columns']} ({dataset['bytes_per_row']:,.0f} bytes a row)",
        f"- each contender: its own process; {settings['warmup_batches']} warm-up batches, then "
        f"{settings['batches']} batches of {settings['batch_size']} rows as fast as it can "
        f"(rows/s, MiB/s, first batch, take latency), then {settings['batches']} more with a "
        f"{settings['step_ms']:g} ms sleep after each (waited); start = building it and the "
        f"warm-up (for map-style: starting its workers); seed {settings['seed']}",
        "- uniform: whether every batch is a uniform random sample of the epoch's rows (yes), and "
        "whose shuffle it is when not the plan's; lance-prefetch defaults: the loader given no "
        "tuning arguments, next to the tuned settings",
        "- reader: the Lance reader the takes went through (io_uring, or Lance's default reader), "
        "a contiguous or sequential scan (lance-torch, scan), or a peer's own; takes/batch: take "
        "calls per batch (measured for lance-prefetch: 1/16 is one coalesced take serving 16 "
        "batches); ceiling: one raw take a batch from a thread pool; coalesced-ceiling: the "
        "loader defaults' own takes (their size, their reader) from a thread pool, no "
        "conversion: the limit of the loader's take path",
        f"- total run time: {meta['total_s']:.0f} s",
        "",
    ]
    repeats = settings.get("repeats", 1)
    lines[-1:-1] = [
        f"- each contender setting ran {repeats} time(s), in interleaved rounds (order rotated "
        f"each round; ceiling: the best of its own repeats); rows/s is the median run, spread "
        f"the lowest and highest run, waited the median wait fraction"
        if repeats > 1
        else "- each contender ran once (no spread: --repeats 3 gives medians and spreads)"
    ]
    progress = meta.get("progress") or {}
    if progress and not progress.get("complete"):
        state = progress.get("interrupted") or "still running"
        lines[-1:-1] = [
            f"- **partial results**: {progress['finished']} of {progress['planned']} contender "
            f"runs finished ({state})"
        ]
    table = table_rows(report)
    lines.append("| " + " | ".join(table[0]) + " |")
    lines.append("|" + "---|" * len(table[0]))
    lines.extend("| " + " | ".join(row) + " |" for row in table[1:])
    lines.append("")
    flags = noise_flags(report["contenders"])
    if flags:
        lines.append(
            f"! identical settings whose rows/s ranges lie more than {NOISE_GAP:.0%} apart: the "
            f"machine's noise exceeds the spread of their runs, so differences of that size "
            f"between other rows mean nothing either (more --repeats, or a quieter machine):"
        )
        lines.extend(f"- {flag['detail']}" for flag in flags)
        lines.append("")
    lines.append(
        "(best): the lance-prefetch row (its defaults included) with the highest median rows/s "
        "among those with the same cache."
    )
    lines.append("")
    if plot_name:
        lines += [f"![rows/s of every contender, sorted]({plot_name})", ""]
    check = report["ids_check"]
    lines.append(f"**Same rows:** {same_rows_verdict(check)}.")
    for epoch, entry in check["epochs"].items():
        lines.append(
            f"- epoch {epoch}: {len(entry['contenders'])} contenders, {entry['rows']} rows each, "
            f"same rows: {entry['same_rows']}, same batches in the same order: "
            f"{entry['same_batches']} (ids from {', '.join(entry['from'])})"
        )
    lines.extend(f"- {name} not compared: {reason}" for name, reason in check["excluded"].items())
    lines.extend(sweep_lines(report["contenders"]))
    comparisons = report.get("comparisons", [])
    if comparisons:
        lines += ["", "**Comparisons:**"]
        lines.extend(f"- {c['what']}: **{c['ratio']:.1f}x** ({c['detail']})" for c in comparisons)
    if report.get("targets") is not None:  # --targets
        lines += ["", "**Targets:**"]
    for target in report.get("targets") or []:
        if not target["applies"]:  # e.g. an S3 target on a local run: the ratio, for information
            lines.append(
                f"- {target['target']}: does not apply to this storage; {target['detail']}"
            )
            continue
        verdict = {True: "met", False: "MISSED", None: "not evaluated"}[target["met"]]
        lines.append(f"- {target['target']}: **{verdict}**; {target['detail']}")
    notes = sorted(
        {f"{c['name']}: {note}" for c in report["contenders"] for note in c.get("notes", [])}
    )
    if notes:
        lines += ["", "**Notes:**"] + [f"- {note}" for note in notes]
    return "\n".join(lines) + "\n"


def sweep_lines(contenders: list[Mapping[str, Any]]) -> list[str]:
    """The Markdown lines naming the winner of each contender's sweep of its own concurrency
    (:func:`~lance_prefetch_bench.verdicts.sweep_winners`) and the loader's defaults against the
    best setting of its grid (:func:`~lance_prefetch_bench.verdicts.defaults_vs_best`); none
    when there is neither."""
    lines = []
    winners = sweep_winners(contenders)
    if winners:
        lines += ["", "**Sweeps** (each contender at the best of its own concurrency):"]
        for winner in winners:
            tried = ", ".join(f"{value}: {rate:,.0f}" for value, rate in winner["tried"])
            edge = (
                f"; the {winner['edge']} value tried: a wider sweep may find more"
                if winner["edge"]
                else ""
            )
            lines.append(
                f"- {winner['name']}: **{winner['parameter']}={winner['value']}** "
                f"({winner['rows_per_s']:,.0f} rows/s; tried {tried}{edge})"
            )
    versus = defaults_vs_best(contenders)
    if versus is not None:
        lines += [
            "",
            f"**Defaults vs the best setting:** {versus['ratio']:.2f}x (lance-prefetch defaults "
            f"{versus['defaults']:,.0f} rows/s, best of {versus['settings']} setting(s): "
            f"{versus['best_label']} {versus['best']:,.0f} rows/s)",
        ]
    return lines


# -- plot ------------------------------------------------------------------------------------------
def write_grid_plot(report: Mapping[str, Any], path: Path) -> bool:
    """Rows/s and wait fraction vs readahead, one line per max_in_flight, the other contenders as
    horizontal lines, the legend below the panels. Written only when the grid has at least two
    fixed readahead values (else each line would be a dot).

    Returns:
        bool: whether it was written.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    contenders = [c for c in report["contenders"] if is_ok(c)]
    if len({c["settings"]["readahead"] for c in prefetch_runs(contenders, auto=False)}) < 2:
        return False
    figure = plt.figure(figsize=(12, 6.5), layout="constrained")
    left, right = figure.subplots(1, 2)
    # lines: the fixed settings without a cache, one per (max_in_flight, coalesce); the others
    # (readahead="auto", caches) as horizontal lines
    grid = prefetch_runs(contenders, auto=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    lines = sorted(
        {(c["settings"]["max_in_flight"], str(setting_of(c, "coalesce", "auto"))) for c in grid}
    )
    several = len({coalesce for _, coalesce in lines}) > 1
    for index, (mif, coalesce) in enumerate(lines):
        points = sorted(
            (
                (c["settings"]["readahead"], c)
                for c in grid
                if (c["settings"]["max_in_flight"], str(setting_of(c, "coalesce", "auto")))
                == (mif, coalesce)
            ),
            key=lambda point: point[0],
        )
        xs = [ra for ra, _ in points]
        color = colors[index % len(colors)]
        label = f"max_in_flight={mif}" + (f", coalesce={coalesce}" if several else "")
        left.plot(
            xs,
            [c["passes"]["throughput"]["rows_per_s"] for _, c in points],
            "o-",
            color=color,
            label=label,
        )
        right.plot(
            xs,
            [100 * (c["passes"]["step"].get("wait_fraction") or 0) for _, c in points],
            "o-",
            color=color,
            label=label,
        )
    others = [
        c for c in contenders if c["name"] == PREFETCH and c not in grid
    ]  # the defaults, readahead="auto" and the caches
    for index, contender in enumerate(others):
        line = {
            "color": colors[(len(lines) + index) % len(colors)],
            "linestyle": "--",
            "linewidth": 2.5 if contender["label"].endswith("defaults") else 1.5,
            "label": contender["label"],
        }
        left.axhline(contender["passes"]["throughput"]["rows_per_s"], **line)
        wait = contender["passes"]["step"].get("wait_fraction")
        if wait is not None:
            right.axhline(100 * wait, **line)
    baselines = {  # name: (color, line style); not lance-torch (not uniform; the bar chart has it)
        "sequential": ("black", ":"),
        "map-style": ("tab:red", "--"),
        "ceiling": ("dimgray", "-"),
        "coalesced-ceiling": ("black", "-"),
        "prefetch-workers": ("tab:green", "--"),
        "lance-map": ("tab:orange", "--"),
        "lance-map-rows": ("tab:brown", ":"),
        "grain": ("tab:olive", "-."),
        "spdl": ("tab:cyan", "-."),
        "lancedb-streaming": ("tab:pink", "-."),
    }
    for name, (color, style) in baselines.items():
        contender = by_name(contenders, name)  # a swept contender: the winner of its sweep
        if contender is None:
            continue
        label = {
            "ceiling": f"ceiling ({contender.get('best_concurrency')} threads)",
            "coalesced-ceiling": f"coalesced ceiling ({contender.get('best_concurrency')} "
            f"threads, 1/{contender.get('coalesce')})",
        }.get(name, contender["label"])
        line = {"color": color, "linestyle": style, "linewidth": 1.2, "label": label}
        left.axhline(contender["passes"]["throughput"]["rows_per_s"], **line)
        wait = contender["passes"].get("step", {}).get("wait_fraction")
        if wait is not None:
            right.axhline(100 * wait, **line)
    readaheads = sorted({c["settings"]["readahead"] for c in grid})
    for axis in (left, right):
        axis.set_xscale("log", base=2)
        if readaheads:
            axis.set_xticks(readaheads, [str(value) for value in readaheads])
            axis.minorticks_off()
        axis.set_xlabel("readahead (batches)")
        axis.grid(True, alpha=0.3)
    left.set_ylabel("rows/s (throughput pass)")
    left.set_ylim(bottom=0)
    step_ms = report["meta"]["settings"]["step_ms"]
    right.set_ylabel(f"% of wall time waiting for data ({step_ms:g} ms step)")
    right.set_ylim(bottom=0)
    figure.suptitle(_title(report), fontsize=10)
    handles, labels = left.get_legend_handles_labels()
    figure.legend(handles, labels, loc="outside lower center", ncols=3, fontsize=8)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return True


def write_plot(report: Mapping[str, Any], path: Path) -> None:
    """Write :func:`bar_chart` to ``path`` (PNG)."""
    import matplotlib.pyplot as plt

    figure = bar_chart(report)
    figure.savefig(path, dpi=110)
    plt.close(figure)


def bar_chart(report: Mapping[str, Any]) -> Any:
    """Every contender's rows/s (the median of its runs, the spread as an error bar) as a
    horizontal bar, sorted, fastest on top: the uniform readers in one panel and the others
    (``lance-torch``'s shuffled contiguous ranges) in a panel of their own with its own scale, so
    a fast non-uniform reader does not squeeze the rest; ``lance-prefetch`` defaults, its tuned
    settings and the other contenders in three colours, the legend below the panels. Failed and
    skipped contenders are listed, without a bar, at the bottom of their panel.

    Returns:
        matplotlib.figure.Figure: the figure (one axis a panel, uniform first).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    entries = report["contenders"]
    uniform = [e for e in entries if not uniform_text(e).startswith("no")]
    other = [e for e in entries if uniform_text(e).startswith("no")]
    panels = [
        (group, title)
        for group, title in (
            (uniform, "uniform random batches"),
            (other, "not uniform (do not compare with the panel above)"),
        )
        if group
    ]
    sizes = [max(len(group), 1) for group, _ in panels]
    figure = plt.figure(figsize=(11, 1.6 + 0.42 * sum(sizes)), layout="constrained")
    axes = figure.subplots(len(panels), 1, height_ratios=sizes, squeeze=False)[:, 0]
    for axis, (group, title) in zip(axes, panels, strict=True):
        _bars(axis, group)
        axis.set_title(title, fontsize=9, loc="left")
    axes[-1].set_xlabel("rows/s, throughput pass (median of the runs; bar: lowest-highest run)")
    colors = {
        "lance-prefetch defaults": "tab:orange",
        "lance-prefetch (tuned settings)": "tab:blue",
        "other contenders": "tab:gray",
    }
    handles = [plt.Rectangle((0, 0), 1, 1, color=color) for color in colors.values()]
    labels = list(colors)
    if len(panels) > 1:
        handles.append(
            plt.Rectangle((0, 0), 1, 1, facecolor="tab:gray", hatch="//", edgecolor="white")
        )
        labels.append("not uniform (own panel and scale)")
    figure.legend(handles, labels, loc="outside lower center", ncols=len(labels), fontsize=8)
    figure.suptitle(_title(report), fontsize=10)
    return figure


def _bars(axis: Any, entries: list[Mapping[str, Any]]) -> None:
    """The entries' rows/s as horizontal bars, the fastest on top, each labelled with its setting
    and reader and annotated with its rows/s, first batch and peak RSS."""
    ran = sorted(
        (e for e in entries if is_ok(e)), key=lambda e: -e["passes"]["throughput"]["rows_per_s"]
    )
    entries = ran + [e for e in entries if not is_ok(e)]
    labels, rates, texts, colors = [], [], [], []
    errors: list[list[float]] = [[], []]  # below and above each bar
    for entry in entries:
        label = f"{entry['label']} ({reader_text(entry)})"
        defaults = setting_of(entry, "defaults", False)
        if defaults:  # the values it ran with
            label += "\n" + ", ".join(
                f"{name}={setting_of(entry, name, '?')}"
                for name in ("readahead", "max_in_flight", "coalesce")
            )
        labels.append(label)
        colors.append(
            "tab:orange" if defaults else "tab:blue" if entry["name"] == PREFETCH else "tab:gray"
        )
        if not is_ok(entry):
            rates.append(0.0)
            errors[0].append(0.0)
            errors[1].append(0.0)
            texts.append("skipped (not installed)" if "skipped" in entry else "failed")
            continue
        throughput = entry["passes"]["throughput"]
        rate = throughput["rows_per_s"]
        low, high, _ = spread(entry) or (rate, rate, 1)
        rates.append(rate)
        errors[0].append(max(rate - low, 0.0))
        errors[1].append(max(high - rate, 0.0))
        texts.append(
            f"{rate:,.0f} rows/s, first batch "
            f"{_fmt(entry.get('cold_first_batch_s', throughput['first_batch_s']), ',.0f', 1000)} "
            f"ms, peak RSS {_fmt(entry.get('peak_rss_mib'))} MiB"
        )
    positions = list(range(len(entries)))[::-1]
    bars = axis.barh(positions, rates, color=colors, height=0.6, xerr=errors, capsize=2)
    for bar, entry in zip(bars, entries, strict=True):
        if uniform_text(entry).startswith("no"):
            bar.set_hatch("//")
            bar.set_edgecolor("white")
    top = max((rate + high for rate, high in zip(rates, errors[1], strict=True)), default=0.0)
    top = top or 1.0
    for position, rate, high, text in zip(positions, rates, errors[1], texts, strict=True):
        axis.text(rate + high + top * 0.01, position, text, va="center", fontsize=7)
    axis.set_yticks(positions, labels, fontsize=7)
    axis.set_xlim(0, top * 1.6)
    axis.grid(True, axis="x", alpha=0.3)


def write_outputs(report: Mapping[str, Any], out_dir: Path, name: str) -> dict[str, Path]:
    """Write ``NAME.json``, ``NAME.md`` and ``NAME.png`` to ``out_dir`` (created if missing), each
    to a temporary file first and then renamed over the old one (:func:`os.replace`), so a reader,
    or a run killed while writing, finds a whole file, old or new.

    ``NAME-grid.png`` (:func:`write_grid_plot`) is added when the grid has two readahead values
    or more.

    Returns:
        dict[str, Path]: the paths, keyed ``json``, ``markdown``, ``plot`` (and ``grid_plot``).
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {
        "json": out_dir / f"{name}.json",
        "markdown": out_dir / f"{name}.md",
        "plot": out_dir / f"{name}.png",
    }
    _replace(paths["json"], lambda path: path.write_text(json.dumps(report, indent=1) + "\n"))
    markdown = to_markdown(report, plot_name=paths["plot"].name)
    _replace(paths["markdown"], lambda path: path.write_text(markdown))
    _replace(paths["plot"], lambda path: write_plot(report, path))
    grid = out_dir / f"{name}-grid.png"
    written = []
    _replace(grid, lambda path: written.append(write_grid_plot(report, path)), optional=True)
    if written[0]:
        paths["grid_plot"] = grid
    return paths


def _replace(path: Path, write: Callable[[Path], Any], *, optional: bool = False) -> None:
    """``write(temporary path)`` in ``path``'s folder, then rename it to ``path``; ``optional``:
    ``write`` may write nothing, and then an old ``path`` is removed."""
    temporary = path.with_name(f".{path.stem}.partial{path.suffix}")
    try:
        write(temporary)
        if optional and not temporary.exists():
            path.unlink(missing_ok=True)
            return
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


def _title(report: dict) -> str:
    """A plot's title: the storage (with the emulated latency), rows, batch size, batches a pass
    and cores of the run."""
    meta = report["meta"]
    storage, settings = meta["storage"], meta["settings"]
    latency = storage.get("latency")
    added = (
        f", +{latency['delay_ms']:g} +/- {latency['jitter_ms']:g} ms, "
        f"{latency['tail_fraction']:.0%} +{latency['tail_ms']:g} ms"
        if latency
        else ""
    )
    return (
        f"lance-prefetch bench, {storage['kind']}{added}: {meta['dataset']['rows']:,} rows, "
        f"batch {settings['batch_size']}, {settings['batches']} batches a pass, "
        f"{meta['machine']['cores']} cores"
    )
