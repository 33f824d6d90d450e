"""The comparison's outputs (:func:`write_outputs`): Markdown tables, CSV, JSON and PNG plots of a report."""

from __future__ import annotations

import csv
import importlib
import json
import math
from pathlib import Path

import numpy as np

from kkmgpu.compare.data import BLOB_STD
from kkmgpu.compare.runner import _log
from kkmgpu.compare.scoring import LOWER_IS_BETTER, METRICS

COLUMNS = ("section", "dataset", "n", "d", "k", "method", "seed", "gamma", "time_s", *METRICS,
           "n_clusters_found", "note")
_LABELS = {"nmi": "NMI", "ari": "ARI", "silhouette": "silhouette", "calinski_harabasz": "Calinski-Harabasz",
           "davies_bouldin": "Davies-Bouldin", "sum_of_variances": "sum of variances",
           "kernel_objective": "kernel objective", "cnnc": "c-NNC", "time_s": "time (s)"}


def _fmt(value, digits=3):
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if isinstance(value, float):
        if value != 0 and (abs(value) >= 1e4 or abs(value) < 1e-2):
            return f"{value:.{digits}g}"
        return f"{value:.{digits}f}" if abs(value) < 100 else f"{value:.0f}"
    return str(value)


def _group(rows, section):
    out = {}
    for row in rows:
        if row["section"] == section:
            out.setdefault(row["dataset"], []).append(row)
    return out


def _best(rows, metric):
    values = [r[metric] for r in rows if not math.isnan(r[metric])]
    if not values:
        return None
    return min(values) if LOWER_IS_BETTER[metric] else max(values)


def _pivot(rows, metric, method_names):
    """Markdown: one row per data set, one column per method; the best value in bold."""
    grouped = _group(rows, "datasets")
    lines = ["| data set | n x d, k | " + " | ".join(method_names) + " |",
             "|---|---|" + "---:|" * len(method_names)]
    for dataset, runs in grouped.items():
        by_method = {r["method"]: r for r in runs}
        best = _best(runs, metric)
        cells = []
        for name in method_names:
            value = by_method.get(name, {}).get(metric, float("nan"))
            text = _fmt(value, 2 if metric == "time_s" else 3)
            cells.append(f"**{text}**" if best is not None and value == best else text)
        first = runs[0]
        lines.append(f"| {dataset} | {first['n']} x {first['d']}, {first['k']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _mean_std(values):
    values = [v for v in values if not math.isnan(v)]
    if not values:
        return float("nan"), float("nan")
    return float(np.mean(values)), float(np.std(values))


def scenario_summary(rows, section):
    """(x, method) -> {metric: (mean, std)} over seeds for a scenario section."""
    key = "n" if section == "growing_n" else "d"
    cells = {}
    for row in rows:
        if row["section"] == section:
            cells.setdefault((row[key], row["method"]), []).append(row)
    return {cell: {m: _mean_std([r[m] for r in runs]) for m in (*METRICS, "time_s")}
            for cell, runs in sorted(cells.items())}


def _scenario_table(rows, section, metrics_shown):
    key = "n" if section == "growing_n" else "d"
    summary = scenario_summary(rows, section)
    lines = [f"| {key} | method | " + " | ".join(_LABELS[m] for m in metrics_shown) + " |",
             "|---:|---|" + "---:|" * len(metrics_shown)]
    for (x, method), stats in summary.items():
        cells = [f"{_fmt(stats[m][0])} ± {_fmt(stats[m][1], 2)}" for m in metrics_shown]
        lines.append(f"| {x} | {method} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def markdown(report) -> str:
    """The report as Markdown: pivot tables per metric, the full table, scenario tables, what was skipped."""
    rows = report["rows"]
    present = [name for name in report["config"]["methods"] if any(r["method"] == name for r in rows)]
    env = report["environment"]
    lines = [
        "# How kkmgpu compares",
        "",
        f"Run {report['started']} on {env.get('gpu') or env['cpu_model']} ({env['cpu_count']} cores), "
        f"device {env['device']}; {report['wall_s']:.0f} s in all. Load average at start "
        f"{report['load_average_start']}, at end {report['load_average_end']} (other work on the machine "
        "inflates wall times). Versions: " + ", ".join(f"{k} {v}" for k, v in env.items()
                                                       if k in ("kkmgpu", "numpy", "scipy", "scikit-learn",
                                                                "tslearn", "cupy") and v) + ".",
        "",
        f"Gamma: {report['config']['gamma_rule']}. Timing: {report['config']['timing']}.",
        "Best value per data set in bold (higher is better for NMI, ARI, silhouette and Calinski-Harabasz; lower "
        "for Davies-Bouldin, sum of variances, kernel objective, c-NNC and time).",
        "",
        "Methods:",
        "",
        *[f"- `{name}`: {desc}" for name, desc in report["config"]["methods"].items()],
        "",
    ]
    if report["skipped"]:
        lines += ["Skipped:", "", *[f"- {message}" for message in report["skipped"]], ""]
    if any(r["section"] == "datasets" for r in rows):
        for metric in ("nmi", "ari", "silhouette", "time_s"):
            lines += [f"## {_LABELS[metric]}", "", _pivot(rows, metric, present), ""]
        lines += ["## Every metric", "",
                  "| data set | method | time (s) | " + " | ".join(_LABELS[m] for m in METRICS) + " |",
                  "|---|---|---:|" + "---:|" * len(METRICS)]
        for dataset, runs in _group(rows, "datasets").items():
            best = {m: _best(runs, m) for m in (*METRICS, "time_s")}
            for r in runs:
                cells = []
                for m in ("time_s", *METRICS):
                    text = _fmt(r[m], 2 if m == "time_s" else 3)
                    cells.append(f"**{text}**" if best[m] is not None and r[m] == best[m] else text)
                lines.append(f"| {dataset} | {r['method']} | " + " | ".join(cells) + " |")
        lines.append("")
        notes = [f"- {r['dataset']} / {r['method']}: {r['note']}" for r in rows
                 if r["section"] == "datasets" and r["note"]]
        if notes:
            lines += ["Notes:", "", *notes, ""]
    shown = ("nmi", "silhouette", "calinski_harabasz", "davies_bouldin", "sum_of_variances", "time_s")
    for section, title in (("growing_n", "Scenario: growing n at fixed d"),
                           ("growing_d", "Scenario: growing d at fixed n")):
        if any(r["section"] == section for r in rows):
            cfg = report["config"]["scenarios"][section]
            fixed = f"d = {cfg['d']}" if section == "growing_n" else f"n = {cfg['n']}"
            lines += [f"## {title}", "",
                      f"Gaussian blobs (centres uniform in [-10, 10]^d, standard deviation {BLOB_STD}), "
                      f"k = {cfg['k']}, {fixed}; mean ± standard deviation over {cfg['seeds']} seed(s).", "", _scenario_table(rows, section, shown), ""]
    return "\n".join(lines)


def write_outputs(report, out_dir, prefix="compare", *, plots=True, verbose=True):
    """Write ``<prefix>.md``, ``.csv``, ``.json`` and the PNG plots into ``out_dir``.

    Parameters
    ----------
    report : dict
        What :func:`run_comparison` returns.
    out_dir : path
        Created if missing.
    prefix : str, default="compare"
        File name stem: ``<prefix>.md``, ``<prefix>.csv``, ``<prefix>.json``, ``<prefix>-datasets.png``,
        ``<prefix>-shapes.png`` (2-D data sets), ``<prefix>-scenario-n.png``, ``<prefix>-scenario-d.png``.
    plots : bool, default=True
        Write the PNG plots (skipped with a message when matplotlib is not installed).
    verbose : bool, default=True
        Print a message when the plots are skipped.

    Returns
    -------
    list of pathlib.Path
        The files written.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    md = out_dir / f"{prefix}.md"
    md.write_text(markdown(report) + "\n")
    paths.append(md)
    csv_path = out_dir / f"{prefix}.csv"
    with open(csv_path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=COLUMNS, extrasaction="ignore")
        writer.writeheader()
        for row in report["rows"]:
            writer.writerow({c: ("" if isinstance(row.get(c), float) and math.isnan(row[c]) else row.get(c, ""))
                             for c in COLUMNS})
    paths.append(csv_path)
    json_path = out_dir / f"{prefix}.json"
    public = {key: value for key, value in report.items() if not key.startswith("_")}
    json_path.write_text(json.dumps(public, indent=1, default=_json_default, allow_nan=True) + "\n")
    paths.append(json_path)
    if plots:
        try:
            importlib.import_module("matplotlib")
        except ImportError:
            _log(verbose, "[compare] plots skipped: matplotlib is not installed")
        else:
            paths += _plots(report, out_dir, prefix)
    return paths


def _json_default(value):
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating,)):
        return float(value)
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"cannot serialise {type(value).__name__}")


def _plots(report, out_dir, prefix):
    from matplotlib.figure import Figure
    from matplotlib.ticker import NullLocator

    rows = report["rows"]
    present = [name for name in report["config"]["methods"] if any(r["method"] == name for r in rows)]
    colours = {name: f"C{i}" for i, name in enumerate(present)}
    paths = []
    grouped = _group(rows, "datasets")
    if grouped:
        names = list(grouped)
        shown = ("nmi", "ari", "silhouette", "time_s")
        figure = Figure(figsize=(max(8, 1.1 * len(names) + 3), 3.2 * len(shown)), layout="constrained")
        width = 0.8 / max(1, len(present))
        for ax, metric in zip(figure.subplots(len(shown), 1), shown):
            for j, method in enumerate(present):
                values = [next((r[metric] for r in grouped[d] if r["method"] == method), float("nan")) for d in names]
                ax.bar(np.arange(len(names)) + (j - (len(present) - 1) / 2) * width, values, width,
                       label=method, color=colours[method])
            ax.set_xticks(np.arange(len(names)), names, rotation=20)
            ax.set_ylabel(_LABELS[metric])
            if metric == "time_s":
                ax.set_yscale("log")
            ax.grid(axis="y", alpha=0.3)
        figure.axes[0].legend(ncols=max(2, min(5, len(names))), fontsize=7, loc="lower left",
                              bbox_to_anchor=(0, 1.02))
        path = out_dir / f"{prefix}-datasets.png"
        figure.savefig(path, dpi=90)
        paths.append(path)

        if report.get("_pictures"):
            paths.append(_pictures_of_2d_sets(report, present, out_dir, prefix))

    for section, key, title in (("growing_n", "n", "growing n at fixed d"), ("growing_d", "d", "growing d at fixed n")):
        summary = scenario_summary(rows, section)
        if not summary:
            continue
        shown = ("nmi", "silhouette", "calinski_harabasz", "davies_bouldin", "sum_of_variances", "time_s")
        xs_all = sorted({x for x, _ in summary})
        figure = Figure(figsize=(13, 7), layout="constrained")
        axes = figure.subplots(2, 3).ravel()
        for ax, metric in zip(axes, shown):
            for method in present:
                points = sorted((x, s[metric]) for (x, m), s in summary.items() if m == method)
                if not points:
                    continue
                xs = [p[0] for p in points]
                ax.errorbar(xs, [p[1][0] for p in points], yerr=[p[1][1] for p in points], marker="o", ms=3,
                            capsize=2, label=method, color=colours[method])
            ax.set_xscale("log")
            # ticks at the scenario's own n (or d) values, written plainly: the default log locator labels
            # minor ticks as "2x10^0 3x10^0 ..." over a short range, which overlap and name no measured point
            ax.set_xticks(xs_all, [str(x) for x in xs_all])
            ax.xaxis.set_minor_locator(NullLocator())
            if metric in ("time_s", "calinski_harabasz", "sum_of_variances"):
                ax.set_yscale("log")
            ax.set_xlabel(key)
            ax.set_title(_LABELS[metric])
            ax.grid(alpha=0.3)
        axes[0].legend(fontsize=7)
        figure.suptitle(f"Scenario: {title} (Gaussian blobs; mean ± std over seeds)")
        path = out_dir / f"{prefix}-scenario-{key}.png"
        figure.savefig(path, dpi=90)
        paths.append(path)
    return paths


def _pictures_of_2d_sets(report, present, out_dir, prefix):
    """The 2-D data sets coloured by each method's partition."""
    from matplotlib.figure import Figure

    pictures = report["_pictures"]
    figure = Figure(figsize=(2.2 * len(present), 2.2 * len(pictures)), layout="constrained")
    axes = np.atleast_2d(figure.subplots(len(pictures), len(present)))
    for i, (name, picture) in enumerate(pictures.items()):
        X = picture["X"]
        for j, method in enumerate(present):
            ax = axes[i, j]
            labels = picture["labels"].get(method)
            if labels is not None:
                ax.scatter(X[:, 0], X[:, 1], c=labels, s=2, cmap="tab20")
                row = next(r for r in report["rows"] if r["dataset"] == name and r["method"] == method)
                ax.set_title((f"{method}\n" if i == 0 else "") + f"NMI {row['nmi']:.2f}", fontsize=7)
            else:
                ax.set_title((f"{method}\n" if i == 0 else "") + "no result", fontsize=7)
            ax.set_xticks([])
            ax.set_yticks([])
            if j == 0:
                ax.set_ylabel(name)
    path = out_dir / f"{prefix}-shapes.png"
    figure.savefig(path, dpi=90)
    return path
