"""The landmark route's default number of representatives at small n, chosen on the selection benchmark's tuning
half and then reported once on its validation half (the project's rule: never tune a default to a bench set).

    python bench/selection_tuning/landmark_p.py tuning      # every rule on the 18 tuning sets
    python bench/selection_tuning/landmark_p.py validation --rules n//4   # the chosen rule, once

Rules: p = min(1500, max(k, f(n))) with f(n) = n (the first default: every point its own representative below
1,500 points), n // 2, n // 4, n // 8. One seed (0), NMI against the labels; prints a table and the means.
"""
import json
import sys
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import bench_selection as bs  # noqa: E402

import kkmgpu  # noqa: E402

RULES = {"n": lambda n: n, "n//2": lambda n: n // 2, "n//4": lambda n: n // 4, "n//8": lambda n: n // 8}


def main(argv):
    half = argv[0]
    rules = argv[argv.index("--rules") + 1:] if "--rules" in argv else list(RULES)
    names = bs.split()[half]
    rows = {}
    for name in sorted(names):
        try:
            X, y, k = bs.load_set(name)[:3]
        except Exception as exc:  # a set whose data is missing
            print(f"{name}: skipped ({exc})", flush=True)
            continue
        n = X.shape[0]
        for rule in rules:
            p = min(1500, max(k, RULES[rule](n)))
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                labels = kkmgpu.fit(X, k, objective="ncut", method="landmark", n_landmarks=p, random_state=0,
                                    device="cpu").labels
            rows.setdefault(name, {})[rule] = float(kkmgpu.metrics.nmi(y, labels))
        print(name, n, k, {r: round(v, 3) for r, v in rows[name].items()}, flush=True)
    means = {r: float(np.mean([rows[s][r] for s in rows])) for r in rules}
    print("mean NMI", {r: round(v, 3) for r, v in means.items()}, f"({len(rows)} sets, {half} half)")
    print(json.dumps({"half": half, "rules": rules, "nmi": rows, "mean": means}))


if __name__ == "__main__":
    main(sys.argv[1:])
