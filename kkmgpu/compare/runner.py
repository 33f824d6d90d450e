"""The comparison's runs (:func:`run_comparison`): data sets and scenario points x methods x seeds, each fit
timed and scored, with the machine and versions it ran on (:func:`environment`)."""

from __future__ import annotations

import datetime
import importlib.metadata
import os
import platform
import time

import numpy as np

import kkmgpu
from kkmgpu.backend.device import import_cupy, resolve_device
from kkmgpu._progress import check_progress, progress_bar
from kkmgpu.compare.contestants import N_INIT, Context, methods
from kkmgpu.compare.data import (DEFAULT_DATASETS, QUICK_DATASETS, Unavailable, _check_dataset_name, load_dataset,
                                 make_blobs)
from kkmgpu.compare.scoring import METRICS, evaluate, shared_gamma

SCHEMA = "kkmgpu-compare/1"
SCENARIO_N = {"sizes": (500, 1000, 2000, 4000), "d": 10, "k": 5}
SCENARIO_D = {"dims": (2, 10, 50, 200, 784), "n": 1000, "k": 5}
QUICK_SCENARIO_N = {"sizes": (150, 300), "d": 5, "k": 3}
QUICK_SCENARIO_D = {"dims": (2, 16), "n": 200, "k": 3}


def _log(verbose, text, bar=None):
    if verbose:
        if bar is None:
            print(text, flush=True)
        else:
            bar.write(text)


def _warm_up(selected, device):
    """One tiny fit of each kkmgpu method, so timings exclude numba compilation and GPU context creation."""
    X, _ = make_blobs(60, 3, 2, seed=0)
    ctx = Context(gamma=shared_gamma(X), seed=0, device=device, n_init=1)
    for method in selected:
        if method.family == "kkmgpu":
            try:
                method.run(X, 2, ctx)
            except Exception:  # the timed run reports the error
                pass


def _run_one(method, X, y, k, ctx, *, K, metric_device, section, dataset, seed, verbose, extra=None, bar=None):
    row = {"section": section, "dataset": dataset, "n": int(X.shape[0]), "d": int(X.shape[1]), "k": int(k),
           "method": method.name, "seed": seed, "gamma": ctx.gamma, "time_s": float("nan"),
           **{m: float("nan") for m in METRICS}, "note": "", **(extra or {})}
    if bar is not None:
        bar.set_postfix_str(f"{dataset}: {method.name}")
    t0 = time.perf_counter()
    try:
        labels = np.asarray(method.run(X, k, ctx))
    except Unavailable as exc:
        row["note"] = f"not available: {exc}"
        _log(verbose, f"  {method.name:<22} {row['note']}", bar)
        return row, None
    except Exception as exc:  # one failing method must not end the comparison; the row says what happened
        row["note"] = f"error: {type(exc).__name__}: {exc}"
        _log(verbose, f"  {method.name:<22} {row['note']}", bar)
        return row, None
    row["time_s"] = time.perf_counter() - t0
    values, notes = evaluate(X, y, labels, K=K, device=metric_device)
    row.update(values)
    row["n_clusters_found"] = int(np.unique(labels).size)
    row["note"] = "; ".join(notes)
    _log(verbose, f"  {method.name:<22} {row['time_s']:8.3f} s   NMI {row['nmi']:.3f}   ARI {row['ari']:.3f}   "
                  f"silhouette {row['silhouette']:.3f}", bar)
    return row, labels


def _kernel_for_objective(X, gamma, device):
    return kkmgpu.kernel_matrix(X, gamma=gamma, dtype="float64", device=device)


def run_comparison(*, dataset_names=None, method_names=None, scenarios=True, quick=False, seeds=None,
                   device="auto", data_dir=None, verbose=True, progress=False):
    """Run the comparison; returns the report dict that :func:`write_outputs` writes.

    Parameters
    ----------
    dataset_names : list of str, optional
        Default: :data:`DEFAULT_DATASETS` (:data:`QUICK_DATASETS` with ``quick``).
    method_names : list of str, optional
        Names from :func:`methods` (default: all; unavailable ones are reported, not run).
    scenarios : bool, default=True
        Also run the thesis's two scenarios (growing n at fixed d, growing d at fixed n).
    quick : bool, default=False
        Small data sets, small scenarios, one seed.
    seeds : int, optional
        Seeds per scenario point (default 3, 1 with ``quick``).
    device : {"auto", "cpu", "cuda", "cuda:N"}
        Where kkmgpu's methods and the metrics run (the other libraries run on the CPU).
    data_dir : path, optional
        The shared data folder (with ``shapes/``, ``uci/``, ``mnist/``); by default kkmgpu's search path.
    verbose : bool, default=True
        Print one line per run.
    progress : bool, default=False
        Show a progress bar over all runs (tqdm when installed, plain lines otherwise).

    Returns
    -------
    dict
        ``rows`` (one per data set / scenario point, method and seed), ``skipped`` (messages),
        ``config``, ``environment``.

    Raises
    ------
    ValueError
        For an unknown data set or method name.
    """
    every = methods()
    known = [m.name for m in every]
    if method_names is not None:
        unknown = [name for name in method_names if name not in known]
        if unknown:
            raise ValueError(f"unknown method(s) {unknown}; choose from {known}.")
        every = [m for m in every if m.name in method_names]
    if seeds is None:
        seeds = 1 if quick else 3
    if isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < 1:
        raise ValueError(f"seeds={seeds!r} must be an integer >= 1.")
    progress = check_progress(progress)
    names = list(dataset_names) if dataset_names is not None else list(QUICK_DATASETS if quick else DEFAULT_DATASETS)
    for name in names:
        _check_dataset_name(name)
    backend = resolve_device(device)
    metric_device = backend.name
    started = datetime.datetime.now(datetime.timezone.utc)
    load_start = _load_average()

    skipped, selected = [], []
    for method in every:
        reason = method.why_unavailable()
        if reason:
            skipped.append(f"method {method.name}: {reason}")
            _log(verbose, f"[compare] skipping {method.name}: {reason}")
        else:
            selected.append(method)
    _warm_up(selected, backend.name)

    scenario_config, points = {}, []
    if scenarios:
        grow_n = QUICK_SCENARIO_N if quick else SCENARIO_N
        grow_d = QUICK_SCENARIO_D if quick else SCENARIO_D
        scenario_config = {"growing_n": {**grow_n, "seeds": seeds}, "growing_d": {**grow_d, "seeds": seeds}}
        points = [("growing_n", n, grow_n["d"], grow_n["k"]) for n in grow_n["sizes"]]
        points += [("growing_d", grow_d["n"], d, grow_d["k"]) for d in grow_d["dims"]]

    rows, pictures = [], {}
    total = len(selected) * (len(names) + len(points) * seeds)
    with progress_bar(total, desc="compare", unit="run", enabled=progress) as bar:
        for name in names:
            try:
                data = load_dataset(name, data_dir)
            except Unavailable as exc:
                skipped.append(f"data set {name}: {exc}")
                _log(verbose, f"[compare] skipping data set {name}: {exc}", bar)
                bar.update(len(selected))
                continue
            gamma = shared_gamma(data.X)
            _log(verbose, f"[compare] {name} ({data.X.shape[0]} x {data.X.shape[1]}, k={data.k}, "
                          f"gamma={gamma:.4g}), load average {_load_average()}", bar)
            K = _kernel_for_objective(data.X, gamma, backend.name)
            ctx = Context(gamma=gamma, seed=0, device=backend.name)
            for method in selected:
                row, labels = _run_one(method, data.X, data.y, data.k, ctx, K=K, metric_device=metric_device,
                                       section="datasets", dataset=name, seed=0, verbose=verbose, bar=bar)
                rows.append(row)
                bar.update()
                if data.X.shape[1] == 2 and labels is not None:
                    pictures.setdefault(name, {"X": data.X, "labels": {}})["labels"][method.name] = labels
            del K

        for section, n, d, k in points:
            _log(verbose, f"[compare] scenario {section}: n={n}, d={d}, k={k}, {seeds} seed(s), "
                          f"load average {_load_average()}", bar)
            for seed in range(seeds):
                X, y = make_blobs(n, d, k, seed=1000 * seed + 17)
                gamma = shared_gamma(X)
                K = _kernel_for_objective(X, gamma, backend.name)
                ctx = Context(gamma=gamma, seed=seed, device=backend.name)
                for method in selected:
                    rows.append(_run_one(method, X, y, k, ctx, K=K, metric_device=metric_device, section=section,
                                         dataset=f"blobs-n{n}-d{d}", seed=seed, verbose=verbose, bar=bar)[0])
                    bar.update()
                del K

    return {
        "schema": SCHEMA,
        "started": started.isoformat(timespec="seconds"),
        "wall_s": (datetime.datetime.now(datetime.timezone.utc) - started).total_seconds(),
        "load_average_start": load_start,
        "load_average_end": _load_average(),
        "config": {
            "datasets": names, "methods": {m.name: m.description for m in every},
            "gamma_rule": "gamma = 1 / (n_features * X.var(axis=0).mean()) (kkmgpu's 'scale'), shared by every rbf method",
            "n_init": N_INIT, "device": backend.name, "quick": quick, "scenarios": scenario_config,
            "timing": "wall time of the fit call (kernel build, eigendecomposition, iterations); after a warm-up "
                      "fit of every kkmgpu method (numba compilation excluded)",
        },
        "environment": environment(backend),
        "skipped": skipped,
        "rows": rows,
        "_pictures": pictures,  # 2-D data sets and each method's labels, for the plots (not written to JSON)
    }


def _load_average():
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def _version(dist):
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def environment(backend):
    """Machine, device and package versions for the result file."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            cpu = next((line.split(":", 1)[1].strip() for line in fh if line.lower().startswith("model name")), cpu)
    except OSError:
        pass
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count()
    env = {"python": platform.python_version(), "platform": platform.platform(), "cpu_model": cpu,
           "cpu_count": cores, "device": backend.name, "kkmgpu": kkmgpu.__version__,
           **{name: _version(name) for name in ("numpy", "scipy", "numba", "scikit-learn", "tslearn", "matplotlib")}}
    if backend.is_gpu:
        cp = import_cupy()
        env["gpu"] = cp.cuda.runtime.getDeviceProperties(backend.index)["name"].decode()
        env["cupy"] = cp.__version__
    return env
