"""Two commits' CPU benchmarks in one run: is a change of structure within noise of the code before it?

    python bench/compare_commits.py                      # HEAD~1 against the working tree
    python bench/compare_commits.py --base main~3 --rounds 3 --sizes 2000 5000

The base commit is checked out into a temporary git worktree; the head is the working tree (or ``--head REV``,
another worktree). Each round runs the selected pytest-benchmark cases in both trees, alternating which goes first,
each tree importing its own ``kkmgpu`` (checked). Per case the script compares the medians over rounds of each
tree's best time, and calls a difference noise when it is within the largest of 5%, the spread of that case's
best times across the rounds of either tree, and twice the scatter within a run. The selection (``--select``, a
pytest ``-k`` expression) defaults to the exact engine's iterations and end-to-end fit, CATS end to end and the bandwidth search
(``bench_exact.py``, ``bench_cats.py::test_cats_fit``, ``bench_offgrid.py::test_search_bandwidth_speed``).

Writes ``bench/results/<date>-<device>-commits-<base>-<head>.json`` (both commits, every round's times, the verdicts) and prints
a table. A benchmark, not a test: it exits 0 whatever the verdicts (``--fail-on-slower`` exits 1 on a slower case).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
FILES = ("bench/bench_exact.py", "bench/bench_cats.py", "bench/bench_offgrid.py")
DEFAULT_SELECT = "(exact_iterations or fit_end_to_end or cats_fit or search_bandwidth_speed) and cpu"
NOISE_FLOOR = 0.05


def _git(*args, cwd=REPO_ROOT) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def _data_env() -> dict:
    """The data folders of this checkout, passed to both trees (a temporary worktree has no ../shared beside it)."""
    env = {}
    data = Path(os.environ.get("KKMGPU_DATA_DIR", "") or REPO_ROOT.parent / "shared" / "data")
    if data.is_dir():
        env["KKMGPU_DATA_DIR"] = str(data.resolve())
    mnist = Path(os.environ.get("KKMGPU_MNIST_DIR", "") or data / "mnist")
    if mnist.is_dir():
        env["KKMGPU_MNIST_DIR"] = str(mnist.resolve())
    return env


def _tree_env(tree: Path, results: Path, sizes) -> dict:
    env = dict(os.environ)
    env.update(_data_env())
    env.update(PYTHONPATH=str(tree), KKMGPU_BENCH_DEVICES="cpu", KKMGPU_BENCH_RESULTS_DIR=str(results),
               PYTHONUNBUFFERED="1")
    if sizes:
        env["KKMGPU_BENCH_SIZES"] = ",".join(str(n) for n in sizes)
    return env


def _check_import(tree: Path, env: dict) -> None:
    where = subprocess.run([sys.executable, "-c", "import kkmgpu; print(kkmgpu.__file__)"], cwd=tree, env=env,
                           check=True, capture_output=True, text=True).stdout.strip()
    if not Path(where).resolve().is_relative_to(tree.resolve()):
        raise SystemExit(f"in {tree} `import kkmgpu` loads {where}, not the tree's own copy: an installed kkmgpu "
                         "shadows PYTHONPATH (uninstall it, or install it in non-editable mode elsewhere)")


def _run(tree: Path, env: dict, select: str, out: Path) -> dict:
    files = [f for f in FILES if (tree / f).exists()]
    cmd = [sys.executable, "-m", "pytest", *files, "--benchmark-only", "-q", "-p", "no:cacheprovider",
           "-k", select, f"--benchmark-json={out}"]
    print(f"  [{tree.name}] {' '.join(cmd[3:])}", flush=True)
    proc = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
    if proc.returncode not in (0, 5) or not out.exists():
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-4000:])
        raise SystemExit(f"the benchmarks failed in {tree} (exit {proc.returncode})")
    data = json.loads(out.read_text())
    return {b["name"]: {key: b["stats"][key] for key in ("min", "median", "max", "rounds")} for b in data["benchmarks"]}


def compare(times_base: dict, times_head: dict) -> list[dict]:
    """Per case: medians over rounds of each tree's best times, their ratio, the noise and a verdict.

    The noise is the largest of NOISE_FLOOR, the spread of the best times across the rounds of either tree, and
    twice the median gap between a run's median and its best (the scatter within a run)."""
    rows = []
    for name in sorted(set(times_base) & set(times_head)):
        runs = {"base": times_base[name], "head": times_head[name]}
        best = {role: [r["min"] for r in rs] for role, rs in runs.items()}
        across = max((max(t) - min(t)) / min(t) for t in best.values())
        within = 2.0 * statistics.median((r["median"] - r["min"]) / r["min"] for rs in runs.values() for r in rs)
        noise = max(NOISE_FLOOR, across, within)
        ratio = statistics.median(best["head"]) / statistics.median(best["base"])
        verdict = "within noise" if abs(ratio - 1.0) <= noise else ("slower" if ratio > 1.0 else "faster")
        rows.append({"case": name, "base_seconds": best["base"], "head_seconds": best["head"], "runs": runs,
                     "ratio": ratio, "noise": noise, "verdict": verdict})
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="compare_commits.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", default="HEAD~1", help="the commit before the change (default HEAD~1)")
    parser.add_argument("--head", default=None, help="the commit after it (default: the working tree)")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each tree, alternating (default 3)")
    parser.add_argument("--select", default=DEFAULT_SELECT, help="pytest -k expression over the benchmarks")
    parser.add_argument("--sizes", type=int, nargs="*", default=[2000, 5000],
                        help="bench_exact's n (default 2000 5000)")
    parser.add_argument("--results-dir", default=str(BENCH_DIR / "results"))
    parser.add_argument("--fail-on-slower", action="store_true")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds={args.rounds} must be >= 1")
    scratch = Path(tempfile.mkdtemp(prefix="kkmgpu-commits-"))
    trees, made = {}, []
    try:
        for role, rev in (("base", args.base), ("head", args.head)):
            if rev is None:
                trees[role] = REPO_ROOT
                continue
            path = scratch / role
            _git("worktree", "add", "--detach", str(path), rev)
            made.append(path)
            trees[role] = path
        commits = {role: _git("rev-parse", "HEAD", cwd=tree) for role, tree in trees.items()}
        dirty = bool(_git("status", "--porcelain", "--untracked-files=no", cwd=trees["head"]))
        envs = {role: _tree_env(tree, scratch / f"results-{role}", args.sizes) for role, tree in trees.items()}
        for role in trees:
            _check_import(trees[role], envs[role])
        print(f"base {args.base} = {commits['base'][:10]}, head {args.head or 'working tree'} = "
              f"{commits['head'][:10]}{' (+ uncommitted changes)' if dirty else ''}", flush=True)
        times = {"base": {}, "head": {}}
        for r in range(args.rounds):
            order = ("base", "head") if r % 2 == 0 else ("head", "base")
            print(f"round {r + 1}/{args.rounds}: {' then '.join(order)}", flush=True)
            for role in order:
                got = _run(trees[role], envs[role], args.select, scratch / f"{role}-{r}.json")
                for name, seconds in got.items():
                    times[role].setdefault(name, []).append(seconds)
        rows = compare(times["base"], times["head"])
    finally:
        for path in made:
            subprocess.run(["git", "worktree", "remove", "--force", str(path)], cwd=REPO_ROOT, capture_output=True)
        shutil.rmtree(scratch, ignore_errors=True)
    if not rows:
        raise SystemExit(f"no benchmark case ran in both trees for --select {args.select!r}")
    width = max(len(r["case"]) for r in rows)
    print(f"\n{'case':{width}}  base s (best, median over rounds)  head s  head/base  noise  verdict")
    for r in rows:
        print(f"{r['case']:{width}}  {statistics.median(r['base_seconds']):10.4f}  "
              f"{statistics.median(r['head_seconds']):10.4f}  {r['ratio']:6.3f}  {r['noise']:5.3f}  {r['verdict']}")
    results_dir = Path(args.results_dir)
    results_dir.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(BENCH_DIR))
    from _kkmgpu_bench import device_identity

    ident = device_identity("cpu")
    path = results_dir / (f"{datetime.date.today().isoformat()}-{ident['slug']}-commits-{commits['base'][:7]}-"
                          f"{commits['head'][:7]}{'-dirty' if dirty else ''}.json")
    record = {"schema": "kkmgpu-bench-commits/1", "device": ident, "base": {"rev": args.base, "commit": commits["base"]},
              "head": {"rev": args.head or "working tree", "commit": commits["head"], "uncommitted_changes": dirty},
              "rounds": args.rounds, "select": args.select, "sizes": args.sizes, "noise_floor": NOISE_FLOOR,
              "cases": rows, "finished": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "load_average_end": list(os.getloadavg())}
    path.write_text(json.dumps(record, indent=1) + "\n")
    print(f"\nwrote {path}")
    slower = [r["case"] for r in rows if r["verdict"] == "slower"]
    return 1 if (slower and args.fail_on_slower) else 0


if __name__ == "__main__":
    sys.exit(main())
