"""The CPU neighbour search's route choices on the slow cases of issue 27 point 6, before and after, in one run.

    python bench/bench_knn_plan.py [--before COMMIT] [--out bench/results/<date>-cpu-...-knn-plan.json]

Cases (float32, fixed seeds):

- ``rank1``: n = 50,000 points on a line in 64 dimensions (X = outer(t, v), t and v standard normal), 10
  neighbours;
- ``k1000``: n = 20,000 standard normal points in 3 dimensions, 1,000 neighbours.

For each case, ``knn_bounds.nearest_neighbors`` (what ``fit(objective="ncut")`` runs on the CPU) with
prune="auto" (the plan's choice) and prune=False (the certified brute-force search); for ``k1000`` also
scikit-learn's ``NearestNeighbors(n_neighbors=1001).kneighbors`` as a yardstick. ``--before``: the same calls on
kkmgpu's ``kkmgpu/`` of that commit (``git archive``, run in a child process), so that both sides see the same
machine load; prune=False on ``rank1`` is skipped there (over 6 minutes: the float32 candidates certify 13% of
the rows and the rest were recomputed in narrow column blocks). Each process warms its numba functions on a small
input first. Seconds, the route and the report of each call; all results agree with the reference order (checked
against each other: after vs before, and after's prune="auto" vs prune=False).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def data(case: str):
    rng = np.random.default_rng(0)
    if case == "rank1":
        return np.outer(rng.normal(size=50_000), rng.normal(size=64)).astype(np.float32), 10
    return rng.normal(size=(20_000, 3)).astype(np.float32), 1000


def run_side(side: str, out: str) -> None:
    """Every call of this side in this process; results (seconds, reports, index hashes) to ``out``."""
    from kkmgpu.kernels import knn_bounds

    warm = np.random.default_rng(1).normal(size=(300, 8)).astype(np.float32)
    knn_bounds.nearest_neighbors(warm, 5)
    knn_bounds.nearest_neighbors(warm, 150)
    rows = []
    for case in ("rank1", "k1000"):
        X, k = data(case)
        for prune in ("auto", False):
            if side == "before" and case == "rank1" and prune is False:
                continue
            report = {}
            t = time.perf_counter()
            index = knn_bounds.nearest_neighbors(X, k, prune=prune, report=report)
            seconds = time.perf_counter() - t
            rows.append({"side": side, "case": case, "prune": prune, "seconds": round(seconds, 2),
                         "index_sha1": hashlib.sha1(np.ascontiguousarray(index).tobytes()).hexdigest(),
                         "report": json.loads(json.dumps(report, default=str))})
            print(json.dumps(rows[-1]), flush=True)
    Path(out).write_text(json.dumps(rows))


def sklearn_k1000() -> dict:
    from sklearn.neighbors import NearestNeighbors

    X, k = data("k1000")
    t = time.perf_counter()
    NearestNeighbors(n_neighbors=k + 1).fit(X).kneighbors(X)
    return {"side": "sklearn", "case": "k1000", "seconds": round(time.perf_counter() - t, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", default=None, help="commit whose kkmgpu/ is the 'before' side")
    parser.add_argument("--out", default=None)
    parser.add_argument("--side", default=None, help=argparse.SUPPRESS)   # the child process of one side
    parser.add_argument("--side-out", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side:
        run_side(args.side, args.side_out)
        return
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        sides = [("after", str(ROOT))]
        if args.before:
            old = Path(tmp) / "before"
            old.mkdir()
            archive = subprocess.run(["git", "archive", args.before, "kkmgpu"], cwd=ROOT, check=True,
                                     capture_output=True).stdout
            subprocess.run(["tar", "-x", "-C", str(old)], input=archive, check=True)
            sides.insert(0, ("before", str(old)))
        for side, path in sides:
            out = Path(tmp) / f"{side}.json"
            env = dict(os.environ, PYTHONPATH=path)
            subprocess.run([sys.executable, str(Path(__file__).resolve()), "--side", side, "--side-out", str(out)], env=env, check=True,
                           cwd=path)
            rows += json.loads(out.read_text())
    for case in ("rank1", "k1000"):   # every search of a case found the same neighbours in the same order
        assert len({r["index_sha1"] for r in rows if r["case"] == case}) == 1, case
    rows.append(sklearn_k1000())
    print(json.dumps(rows[-1]))
    result = {"machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, shared with other "
                         "sessions' work during the run (absolute seconds are loaded; compare ratios within it)",
              "before": args.before, "rows": rows}
    out = args.out or ROOT / "bench" / "results" / f"{time.strftime('%Y-%m-%d')}-cpu-knn-plan.json"
    Path(out).write_text(json.dumps(result, indent=1) + "\n")
    print("wrote", out)


if __name__ == "__main__":
    main()
