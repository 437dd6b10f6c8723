"""The benchmark's outputs: a JSON file, a Markdown table and a plot (the verdicts they show are
computed by :mod:`~lance_prefetch_bench.verdicts`).

A report is a plain dict (written as JSON as it is)::

    {"meta": {...machine, versions, dataset, storage, settings...},
     "contenders": [{"name", "label", "settings", "passes": {"throughput": {...}, "step": {...}},
                     "ids": {"0": {...}, "1": {...}}, "peak_rss_mib", "notes", ...}, ...],
     "ids_check": {...}, "targets": [...] (with ``--targets`` only)}

A contender has ``uniform`` (whether its batches are uniformly random, and how; see
:data:`~lance_prefetch_bench._spec.UNIFORM`), and ``skipped`` (why, and how to install it) in place
of ``passes`` when it is a peer loader that is not installed.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lance_prefetch_bench._spec import UNIFORM
from lance_prefetch_bench.verdicts import (
    PREFETCH,
    best_prefetch,
    by_name,
    is_ok,
    prefetch_runs,
    same_rows_verdict,
    setting_of,
)

__all__ = ["table_rows", "to_markdown", "write_outputs", "write_plot"]


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
        rates = [r["rows_per_s"] for r in contender.get("rounds", []) if "rows_per_s" in r]
        if rates:
            text += (
                f"; median of {len(rates)} runs ({min(rates):,.0f}-{max(rates):,.0f} rows/s, "
                f"waited {_fmt(contender['passes']['step'].get('wait_fraction'), '.1%')})"
            )
        failed = contender.get("failed_rounds", [])
        if failed:
            text += f"; {len(failed)} of {len(contender['rounds'])} runs FAILED: {failed[0]}"
        return text
    if contender["name"] == "ceiling" and is_ok(contender):
        repeats = settings.get("repeats", 1)
        tried = f"{settings['concurrency']}" + (f" x {repeats} runs" if repeats > 1 else "")
        return f"{contender['best_concurrency']} threads (best of {tried})"
    if contender["name"] in ("map-style", "lance-map", "lance-map-rows"):
        return f"num_workers={settings['num_workers']}, spawn"
    if contender["name"] == "prefetch-workers":
        return (
            f"num_workers={settings['num_workers']}, spawn; readahead={settings['readahead']}, "
            f"max_in_flight={settings['max_in_flight']} each"
        )
    if contender["name"] == "lance-torch":
        return f"batch_readahead={settings['batch_readahead']}, pseudo-random"
    if contender["name"] == "grain":
        return f"ReadOptions(num_threads={settings['num_threads']}), one take per index batch"
    if contender["name"] == "spdl":
        return f"take concurrency={settings['concurrency']}, output_order=input"
    if contender["name"] == "lancedb-streaming":
        return f"num_splits={settings['num_splits']}, read_batch_size=64, io_queue_depth=4"
    return ""


def uniform_text(contender: Mapping[str, Any]) -> str:
    """Whether the contender's batches are uniformly random (``yes``, ``yes (...)``, ``no (...)``)."""
    return contender.get("uniform") or UNIFORM.get(contender["name"], "n/a")


def display_name(contender: Mapping[str, Any]) -> str:
    """The contender's name, with ``defaults`` for the loader run without tuning arguments."""
    if contender["name"] == PREFETCH and setting_of(contender, "defaults", False):
        return f"{PREFETCH} defaults"
    return contender["name"]


def table_rows(report: Mapping[str, Any]) -> list[list[str]]:
    """The Markdown table's rows (header first)."""
    step_ms = report["meta"]["settings"]["step_ms"]
    rows = [
        [
            "contender",
            "settings",
            "uniform",
            "rows/s",
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
    best = best_prefetch(report["contenders"])
    for contender in report["contenders"]:
        name = display_name(contender)
        if best is not None and contender is best:
            name = f"**{name}** (best)"
        elif name != contender["name"]:
            name = f"**{name}**"
        if not is_ok(contender):
            why = f"skipped: {contender['skipped']}" if "skipped" in contender else None
            why = why or f"failed: {contender['error']}"
            rows.append([name, _settings_text(contender), uniform_text(contender), why] + [""] * 9)
            continue
        throughput = contender["passes"]["throughput"]
        step = contender["passes"].get("step", {})
        rows.append(
            [
                name,
                _settings_text(contender),
                uniform_text(contender),
                _fmt(throughput["rows_per_s"]),
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
        f"- total run time: {meta['total_s']:.0f} s",
        "",
    ]
    if settings.get("repeats", 1) > 1 and PREFETCH in settings.get("contenders", [PREFETCH]):
        lines[-1:-1] = [
            f"- each {PREFETCH} setting ran {settings['repeats']} times, in interleaved rounds "
            f"(order rotated each round); its row shows the median run (rows/s) and the median "
            f"wait fraction"
        ]
    table = table_rows(report)
    lines.append("| " + " | ".join(table[0]) + " |")
    lines.append("|" + "---|" * len(table[0]))
    lines.extend("| " + " | ".join(row) + " |" for row in table[1:])
    lines.append("")
    if plot_name:
        lines += [f"![throughput and wait fraction vs readahead]({plot_name})", ""]
    check = report["ids_check"]
    lines.append(f"**Same rows:** {same_rows_verdict(check)}.")
    for epoch, entry in check["epochs"].items():
        lines.append(
            f"- epoch {epoch}: {len(entry['contenders'])} contenders, {entry['rows']} rows each, "
            f"same rows: {entry['same_rows']}, same batches in the same order: "
            f"{entry['same_batches']} (ids from {', '.join(entry['from'])})"
        )
    lines.extend(f"- {name} not compared: {reason}" for name, reason in check["excluded"].items())
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


# -- plot ------------------------------------------------------------------------------------------
def write_plot(report: Mapping[str, Any], path: Path) -> None:
    """Above: rows/s and wait fraction vs readahead, one line per max_in_flight, the other
    contenders as horizontal lines. Below: every contender's rows/s as a bar, labelled with its
    setting and whether it is uniform, annotated with its first batch and peak RSS."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    contenders = [c for c in report["contenders"] if is_ok(c)]
    entries = report["contenders"]
    figure = plt.figure(figsize=(12, 5.4 + 0.32 * len(entries)), layout="constrained")
    top, bottom = figure.subfigures(2, 1, height_ratios=[4.8, 0.6 + 0.32 * len(entries)])
    left, right = top.subplots(1, 2)
    _bars(bottom.subplots(), entries)
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
    baselines = {  # name: (color, line style)
        "sequential": ("black", ":"),
        "map-style": ("tab:red", "--"),
        "lance-torch": ("tab:purple", "-."),
        "ceiling": ("dimgray", "-"),
        "prefetch-workers": ("tab:green", "--"),
        "lance-map": ("tab:orange", "--"),
        "lance-map-rows": ("tab:brown", ":"),
        "grain": ("tab:olive", "-."),
        "spdl": ("tab:cyan", "-."),
        "lancedb-streaming": ("tab:pink", "-."),
    }
    for name, (color, style) in baselines.items():
        contender = by_name(contenders, name)
        if contender is None:
            continue
        label = {
            "lance-torch": "lance-torch (pseudo-random)",
            "ceiling": f"ceiling ({contender.get('best_concurrency')} threads)",
        }.get(name, contender["label"])  # a peer: its first setting
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
        if axis.get_legend_handles_labels()[0]:  # (no step pass: nothing on the right)
            axis.legend(fontsize=8)
    left.set_ylabel("rows/s (throughput pass)")
    left.set_ylim(bottom=0)
    step_ms = report["meta"]["settings"]["step_ms"]
    right.set_ylabel(f"% of wall time waiting for data ({step_ms:g} ms step)")
    right.set_ylim(bottom=0)
    meta = report["meta"]
    storage, settings = meta["storage"], meta["settings"]
    latency = storage.get("latency")
    added = (
        f", +{latency['delay_ms']:g} +/- {latency['jitter_ms']:g} ms, "
        f"{latency['tail_fraction']:.0%} +{latency['tail_ms']:g} ms"
        if latency
        else ""
    )
    figure.suptitle(
        f"lance-prefetch bench, {storage['kind']}{added}: {meta['dataset']['rows']:,} rows, "
        f"batch {settings['batch_size']}, {settings['batches']} batches a pass, "
        f"{meta['machine']['cores']} cores",
        fontsize=10,
    )
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _bars(axis: Any, entries: list[Mapping[str, Any]]) -> None:
    """Each contender's rows/s (throughput pass) as a horizontal bar, first entry on top."""
    labels, rates, texts, colors = [], [], [], []
    for entry in entries:
        label = f"{entry['label']}\nuniform: {uniform_text(entry)}"
        defaults = setting_of(entry, "defaults", False)
        if defaults:  # the values it ran with
            label += "; " + ", ".join(
                f"{name}={setting_of(entry, name, '?')}"
                for name in ("readahead", "max_in_flight", "coalesce")
            )
        labels.append(label)
        colors.append(
            "tab:orange" if defaults else "tab:blue" if entry["name"] == PREFETCH else "tab:gray"
        )
        if not is_ok(entry):
            rates.append(0.0)
            texts.append("skipped (not installed)" if "skipped" in entry else "failed")
            continue
        throughput = entry["passes"]["throughput"]
        rates.append(throughput["rows_per_s"])
        texts.append(
            f"{throughput['rows_per_s']:,.0f} rows/s, first batch "
            f"{_fmt(entry.get('cold_first_batch_s', throughput['first_batch_s']), ',.0f', 1000)} "
            f"ms, peak RSS "
            f"{_fmt(entry.get('peak_rss_mib'))} MiB"
        )
    positions = list(range(len(entries)))[::-1]
    axis.barh(positions, rates, color=colors, height=0.6)
    top = max(rates, default=0.0) or 1.0
    for position, rate, text in zip(positions, rates, texts, strict=True):
        axis.text(rate + top * 0.01, position, text, va="center", fontsize=7)
    axis.set_yticks(positions, labels, fontsize=7)
    axis.set_xlim(0, top * 1.6)
    axis.set_xlabel("rows/s (throughput pass)")
    axis.grid(True, axis="x", alpha=0.3)


def write_outputs(report: Mapping[str, Any], out_dir: Path, name: str) -> dict[str, Path]:
    """Write ``NAME.json``, ``NAME.md`` and ``NAME.png`` to ``out_dir`` (created if missing).

    Returns:
        dict[str, Path]: the paths, keyed ``json``, ``markdown``, ``plot``.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {
        "json": out_dir / f"{name}.json",
        "markdown": out_dir / f"{name}.md",
        "plot": out_dir / f"{name}.png",
    }
    paths["json"].write_text(json.dumps(report, indent=1) + "\n")
    write_plot(report, paths["plot"])
    paths["markdown"].write_text(to_markdown(report, plot_name=paths["plot"].name))
    return paths
