"""bench/bench_selection.py (issue 28's model-selection benchmark) on tiny inputs: the registry, the split rule
(recomputed here from its formula), missing data skipped with a reason, and a run of two cheap contestants on two
small sets whose JSON holds scikit-learn's own scores of the same partitions, a timeout recorded, and the report."""

import hashlib
import importlib.util
import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest

sk_cluster = pytest.importorskip("sklearn.cluster", reason="the benchmark's sets and baselines need scikit-learn")
from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bench():
    saved = list(sys.path)
    spec = importlib.util.spec_from_file_location("bench_selection", REPO_ROOT / "bench" / "bench_selection.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module   # its dataclasses look their module up there
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path[:] = saved   # the module puts bench/ first on the path; the rest of the suite should not see it
    yield module
    sys.modules.pop(spec.name, None)


def test_registry_has_30_sets_of_every_family_with_unique_names(bench):
    names = [spec.name for spec in bench._synthetic() + bench._real()]
    assert len(names) == len(set(names)) == len(bench.REGISTRY) >= 30
    assert set(bench.FAMILIES) >= {"moons", "circles", "blobs-unequal", "aniso", "swissroll", "spirals2", "spirals3",
                                   "shapes", "uci", "digits", "mnist"}
    # each generator at several noise levels, sizes or added dimensions
    for family in ("moons", "circles", "blobs-unequal", "aniso", "swissroll", "spirals2", "spirals3"):
        assert sum(spec.family == family for spec in bench.REGISTRY.values()) >= 3


def test_split_is_the_hash_rule_disjoint_and_complete(bench):
    halves = bench.split()
    assert set(halves["tuning"]).isdisjoint(halves["validation"])
    assert sorted(halves["tuning"] + halves["validation"]) == sorted(bench.REGISTRY)
    for name in bench.REGISTRY:
        first_byte = int(hashlib.sha256(name.encode("utf-8")).hexdigest()[:2], 16)
        assert bench.half_of(name) == ("tuning" if first_byte % 2 == 0 else "validation")
    assert bench.split() == halves
    assert min(len(halves["tuning"]), len(halves["validation"])) >= 10


@pytest.mark.parametrize("name, n, d, k", [("moons-n1000-noise0.10-plus8d", 1000, 10, 2),
                                           ("blobs-unequal-k5-n2000-d10-std1.0", 2000, 10, 5),
                                           ("spirals3-n312-noise0.3", 312, 2, 3),
                                           ("swissroll-k4-n1500-noise0.2", 1500, 3, 4)])
def test_generated_sets_match_their_names_and_max_n_subsamples(bench, name, n, d, k):
    X, y, got_k = bench.load_set(name)
    assert X.shape == (n, d) and got_k == k and set(np.unique(y)) == set(range(k))
    X2, y2, k2 = bench.load_set(name)
    assert np.array_equal(X, X2) and np.array_equal(y, y2)
    Xs, ys, ks = bench.load_set(name, max_n=200)
    assert Xs.shape == (200, d) and set(np.unique(ys)) == set(range(ks))
    rows = {tuple(row) for row in X.round(12)}
    assert all(tuple(row) in rows for row in Xs.round(12))      # a subset of the set's points, not new ones


def test_missing_shared_data_is_unavailable_with_the_reason(bench, tmp_path, monkeypatch):
    from kkmgpu import datasets

    monkeypatch.setattr(datasets, "_shared_data_dirs", lambda subdir: [tmp_path / "nowhere" / subdir])
    monkeypatch.delenv("KKMGPU_MNIST_DIR", raising=False)
    for name in ("flame", "wifi", "mnist-2000"):
        with pytest.raises(bench.Unavailable, match="nowhere|not found"):
            bench.load_set(name)
    assert bench.load_set("wine")[0].shape == (178, 13)   # scikit-learn ships it: never skipped


def test_run_records_scikit_learn_scores_and_the_report_quotes_them(bench, tmp_path):
    out = tmp_path / "sel.json"
    bench.main(["run", "--sets", "wine", "moons-n1000-noise0.10", "--contestants", "sk-kmeans", "kkm-rbf-scale",
                "--max-n", "120", "--timeout", "120", "--out", str(out)])
    doc = json.loads(out.read_text())
    assert doc["schema"] == bench.SCHEMA and doc["split"] == bench.split()
    assert set(doc["sets"]) == set(bench.REGISTRY)
    cases = {(c["set"], c["contestant"]): c for c in doc["cases"]}
    assert set(cases) == {(s, w) for s in ("wine", "moons-n1000-noise0.10") for w in ("sk-kmeans", "kkm-rbf-scale")}
    for (name, who), case in cases.items():
        assert case["status"] == "ok" and case["half"] == bench.half_of(name) and case["n"] == 120
        assert case["seconds"] > 0 and 0 <= case["nmi"] <= 1
    # the harness's subsample and metrics against scikit-learn's run of its own (sets a fresh clone can make)
    for name in ("wine", "moons-n1000-noise0.10"):
        X, y, k = bench.load_set(name, max_n=120)
        labels = sk_cluster.KMeans(k, random_state=0).fit_predict(X)
        assert cases[name, "sk-kmeans"]["nmi"] == pytest.approx(normalized_mutual_info_score(y, labels), abs=1e-12)
        assert cases[name, "sk-kmeans"]["ari"] == pytest.approx(adjusted_rand_score(y, labels), abs=1e-12)
    assert cases["wine", "kkm-rbf-scale"]["evidence"]["gamma"] > 0
    text = bench.report(doc)
    assert bench.half_of("wine") != bench.half_of("moons-n1000-noise0.10")   # one set in each half: both tables appear
    for half in ("validation", "tuning"):
        name = "wine" if bench.half_of("wine") == half else "moons-n1000-noise0.10"
        row = re.search(rf"\| sk-kmeans \| ([0-9.]+) \| ([0-9.]+) \|", text.split(f"### {half.capitalize()} half")[1])
        assert float(row.group(1)) == pytest.approx(cases[name, "sk-kmeans"]["nmi"], abs=5e-4)
        assert float(row.group(2)) == pytest.approx(cases[name, "sk-kmeans"]["ari"], abs=5e-4)


def test_a_case_past_its_time_limit_is_recorded_not_fatal(bench, tmp_path):
    out = tmp_path / "slow.json"
    assert bench.main(["run", "--sets", "wine", "--contestants", "sk-kmeans", "--timeout", "0.001", "--out",
                       str(out)]) == out
    doc = json.loads(out.read_text())
    assert [(c["contestant"], c["status"], c["seconds_at_least"]) for c in doc["cases"]] == [
        ("sk-kmeans", "timeout", 0.001)]
    assert doc["runs"][-1]["timeout_s"] == 0.001 and "finished" in doc["runs"][-1]


def test_affinity_search_evidence_is_kept_candidate_by_candidate(bench):
    """The result file keeps a graph search's evidence whole: every candidate's components and criterion and the
    chosen one, as JSON (issue 28 point 4)."""
    import kkmgpu

    X = np.random.default_rng(0).normal(size=(60, 2))
    result = kkmgpu.fit(X, 2, objective="ncut", affinity="search", device="cpu", random_state=0)
    evidence = json.loads(json.dumps(bench._evidence(result)))["graph_search"]
    search = result.method_params["graph_search"]
    assert len(evidence["candidates"]) == len(search.candidates)
    for row, candidate in zip(evidence["candidates"], search.candidates):
        assert (row["affinity"], row["n_neighbors"], row["components"]) == (
            candidate.affinity, candidate.n_neighbors, candidate.components)
        assert row["ratio"] == (candidate.ratio if np.isfinite(candidate.ratio) else str(candidate.ratio))
    assert (evidence["chosen"]["affinity"], evidence["chosen"]["n_neighbors"]) == (
        search.chosen.affinity, search.chosen.n_neighbors)
