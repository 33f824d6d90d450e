"""The comparison harness (kkmgpu.compare, ``kkmgpu compare``, bench/compare.py) on tiny inputs.

- the CLI writes the Markdown, CSV, JSON and PNG outputs, and the numbers in them are scikit-learn's metrics of
  the partition an independent scikit-learn run produces;
- the two scenarios give one row per point, seed and method, summarised as mean and standard deviation;
- a missing optional package or a kkmgpu feature that has not landed is skipped with a message, not a crash;
- unknown names are usage errors; undefined metrics are NaN with a note.
"""

import ast
import csv
import importlib.util
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import kkmgpu
from conftest import write_shape_csv
from kkmgpu import compare
from kkmgpu.cli import main
from kkmgpu.compare import contestants, data, report as report_module, runner

REPO_ROOT = Path(__file__).resolve().parents[1]

sk_metrics = pytest.importorskip("sklearn.metrics", reason="the comparison's baselines need scikit-learn")
sk_cluster = pytest.importorskip("sklearn.cluster", reason="the comparison's baselines need scikit-learn")


def read_csv(path):
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def test_cli_writes_every_output_with_scikit_learn_numbers(tmp_path, shared_data_dir, capsys):
    status = main(["compare", "--datasets", "flame", "--methods", "kkmgpu-exact,kkmgpu-eigen,sklearn-kmeans",
                   "--no-scenarios", "--out", str(tmp_path), "--prefix", "tiny", "--device", "cpu", "--quiet",
                   "--data-dir", str(shared_data_dir)])
    assert status == 0
    for suffix in (".md", ".csv", ".json", "-datasets.png", "-shapes.png"):
        assert (tmp_path / f"tiny{suffix}").stat().st_size > 0
    assert "wrote" in capsys.readouterr().out

    rows = {row["method"]: row for row in read_csv(tmp_path / "tiny.csv")}
    assert set(rows) == {"kkmgpu-exact", "kkmgpu-eigen", "sklearn-kmeans"}
    # the same standardised flame, clustered by scikit-learn itself with the harness's settings
    X, y = kkmgpu.datasets.load_shape_set("flame", shared_data_dir / "shapes")
    X = (X - X.mean(axis=0)) / X.std(axis=0)
    labels = sk_cluster.KMeans(2, n_init=contestants.N_INIT, random_state=0).fit(X).labels_
    row = rows["sklearn-kmeans"]
    assert float(row["nmi"]) == pytest.approx(sk_metrics.normalized_mutual_info_score(y, labels), rel=1e-9)
    assert float(row["ari"]) == pytest.approx(sk_metrics.adjusted_rand_score(y, labels), rel=1e-9)
    assert float(row["silhouette"]) == pytest.approx(sk_metrics.silhouette_score(X, labels), rel=1e-9)
    assert float(row["calinski_harabasz"]) == pytest.approx(sk_metrics.calinski_harabasz_score(X, labels), rel=1e-9)
    assert float(row["davies_bouldin"]) == pytest.approx(sk_metrics.davies_bouldin_score(X, labels), rel=1e-9)
    assert float(row["sum_of_variances"]) == pytest.approx(
        sk_cluster.KMeans(2, n_init=contestants.N_INIT, random_state=0).fit(X).inertia_, rel=1e-6)
    assert float(row["time_s"]) > 0
    # with every eigenpair, the eigen route reaches the same kernel objective as the exact route here
    assert float(rows["kkmgpu-eigen"]["kernel_objective"]) == pytest.approx(
        float(rows["kkmgpu-exact"]["kernel_objective"]), rel=1e-4)

    report = json.loads((tmp_path / "tiny.json").read_text())
    assert report["schema"] == runner.SCHEMA
    assert len(report["load_average_start"]) == 3 and report["environment"]["device"] == "cpu"
    assert report["environment"]["numpy"] == np.__version__
    text = (tmp_path / "tiny.md").read_text()
    assert "| flame | 240 x 2, 2 |" in text and "## Every metric" in text


def test_scenarios_rows_and_summary(tmp_path, monkeypatch):
    monkeypatch.setattr(runner, "QUICK_SCENARIO_N", {"sizes": (40, 80), "d": 3, "k": 2})
    monkeypatch.setattr(runner, "QUICK_SCENARIO_D", {"dims": (2, 6, 12), "n": 60, "k": 3})
    report = compare.run_comparison(dataset_names=[], method_names=["kkmgpu-exact", "sklearn-kmeans"], quick=True,
                                    seeds=2, device="cpu", verbose=False)
    rows = report["rows"]
    assert len(rows) == (2 + 3) * 2 * 2
    assert {(r["n"], r["d"]) for r in rows if r["section"] == "growing_n"} == {(40, 3), (80, 3)}
    assert {(r["n"], r["d"]) for r in rows if r["section"] == "growing_d"} == {(60, 2), (60, 6), (60, 12)}
    summary = report_module.scenario_summary(rows, "growing_d")
    runs = [r["silhouette"] for r in rows if r["section"] == "growing_d" and r["d"] == 6
            and r["method"] == "sklearn-kmeans"]
    mean, std = summary[(6, "sklearn-kmeans")]["silhouette"]
    assert mean == pytest.approx(np.mean(runs)) and std == pytest.approx(np.std(runs))
    paths = compare.write_outputs(report, tmp_path, "scen", verbose=False)
    assert {p.name for p in paths} >= {"scen.md", "scen-scenario-n.png", "scen-scenario-d.png"}
    assert "## Scenario: growing d at fixed n" in (tmp_path / "scen.md").read_text()


def test_make_blobs():
    X, y = compare.make_blobs(103, 4, 5, seed=1)
    assert X.shape == (103, 4) and np.bincount(y).max() - np.bincount(y).min() <= 1
    X2, y2 = compare.make_blobs(103, 4, 5, seed=1)
    np.testing.assert_array_equal(X, X2)
    centres = np.array([X[y == c].mean(axis=0) for c in range(5)])
    assert np.all(np.abs(centres) < 10 + 3 * data.BLOB_STD)


@pytest.mark.parametrize("args, match", [
    ((10, 2, 0, 0), "k=0 must be an integer >= 1"),
    ((0, 2, 1, 0), "n=0 must be an integer >= 1"),
    ((10, 2.5, 2, 0), "d=2.5 must be an integer >= 1"),
    ((3, 2, 4, 0), "k=4 must be <= n=3"),
])
def test_make_blobs_rejects_bad_sizes(args, match):
    with pytest.raises(ValueError, match=match):
        compare.make_blobs(*args)
    with pytest.raises(ValueError, match="cluster_std=-1.0 must be a finite number >= 0"):
        compare.make_blobs(10, 2, 2, 0, cluster_std=-1.0)


def test_evaluate_rejects_labels_of_the_wrong_length():
    X, y = compare.make_blobs(30, 2, 2, seed=0)
    with pytest.raises(ValueError, match=r"labels has shape \(29,\); expected \(30,\)"):
        compare.evaluate(X, y, np.zeros(29, dtype=int), device="cpu")


def test_scenario_plot_ticks_are_the_measured_points(monkeypatch):
    pytest.importorskip("matplotlib", reason="the plots need matplotlib")
    from matplotlib.figure import Figure

    monkeypatch.setattr(runner, "QUICK_SCENARIO_N", {"sizes": (40, 80), "d": 3, "k": 2})
    monkeypatch.setattr(runner, "QUICK_SCENARIO_D", {"dims": (2, 6, 12), "n": 60, "k": 3})
    report = compare.run_comparison(dataset_names=[], method_names=["sklearn-kmeans"], quick=True, device="cpu",
                                    verbose=False)
    saved = []
    monkeypatch.setattr(Figure, "savefig", lambda self, path, **kw: saved.append((Path(path).name, self)))
    report_module._plots(report, Path("."), "p")
    figures = dict(saved)
    for name, expected in (("p-scenario-n.png", [40, 80]), ("p-scenario-d.png", [2, 6, 12])):
        for ax in figures[name].axes:
            assert list(ax.get_xticks()) == expected
            assert [t.get_text() for t in ax.get_xticklabels()] == [str(x) for x in expected]
            assert len(ax.xaxis.get_minorticklocs()) == 0


def test_missing_package_and_missing_feature_are_skipped(monkeypatch):
    monkeypatch.setitem(sys.modules, "tslearn", None)  # import tslearn now raises ImportError
    monkeypatch.setitem(sys.modules, "tslearn.clustering", None)
    monkeypatch.delattr(kkmgpu, "search_bandwidth", raising=False)
    monkeypatch.delitem(getattr(kkmgpu, "_LAZY", {}), "search_bandwidth", raising=False)  # PEP 562 lazy names
    report = compare.run_comparison(dataset_names=[], method_names=["tslearn-kernelkmeans", "kkmgpu-search",
                                                                    "sklearn-kmeans"],
                                    scenarios=False, device="cpu", verbose=False)
    skipped = "\n".join(report["skipped"])
    assert "method tslearn-kernelkmeans: tslearn is not installed" in skipped
    assert "method kkmgpu-search: not available" in skipped
    assert "Skipped:" in report_module.markdown(report)


def test_unavailable_data_set_is_skipped(tmp_path):
    report = compare.run_comparison(dataset_names=["jain", "mnist-100"], method_names=["sklearn-kmeans"],
                                    scenarios=False, device="cpu", data_dir=tmp_path, verbose=False)
    assert report["rows"] == []
    assert report["skipped"][0].startswith("data set jain: shape set 'jain' not found")
    assert report["skipped"][1].startswith("data set mnist-100: MNIST files")
    assert str(tmp_path) in report["skipped"][0] and "\n" not in report["skipped"][0]


def test_unknown_names_are_usage_errors(capsys):
    assert main(["compare", "--methods", "kkmgpu-magic", "--quiet"]) == 2
    assert "unknown method(s) ['kkmgpu-magic']" in capsys.readouterr().err
    assert main(["compare", "--datasets", "iris", "--quiet"]) == 2
    assert "data set 'iris' is not known" in capsys.readouterr().err


def test_undefined_metric_is_nan_with_a_note():
    X, y = compare.make_blobs(30, 2, 2, seed=0)
    values, notes = compare.evaluate(X, y, np.zeros(30, dtype=int), device="cpu")
    assert math.isnan(values["silhouette"]) and math.isnan(values["kernel_objective"])
    assert any(note.startswith("silhouette: ") for note in notes)
    assert values["sum_of_variances"] == pytest.approx(((X - X.mean(axis=0)) ** 2).sum())


def test_bench_script_uses_the_same_code(tmp_path):
    spec = importlib.util.spec_from_file_location("bench_compare", REPO_ROOT / "bench" / "compare.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.default_prefix("cpu", "2026-11-22").startswith("2026-11-22-cpu-")
    assert module.default_prefix("cpu", "2026-11-22").endswith("-compare")
    assert module.main(["--datasets", "", "--methods", "sklearn-kmeans", "--no-scenarios", "--no-plots",
                        "--out", str(tmp_path), "--prefix", "b", "--quiet", "--device", "cpu"]) == 0
    report = json.loads((tmp_path / "b.json").read_text())
    assert report["environment"]["host"]["cpu_count"] >= 1


def _compare_imports(path):
    """(line, statement, inside a function) for every import of kkmgpu.compare in one module: ``import
    kkmgpu.compare...``, ``from kkmgpu.compare... import``, ``from kkmgpu import compare`` (relative forms
    resolved) and ``importlib.import_module("kkmgpu.compare...")``."""
    package = ".".join(path.relative_to(REPO_ROOT).parts[:-1])  # what a relative import is relative to

    def is_compare(name):
        return name == "kkmgpu.compare" or name.startswith("kkmgpu.compare.")

    found = []

    def visit(node, in_function):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                source = f"{base}.{node.module}" if node.module else base
            else:
                source = node.module or ""
            names = [source] + [f"{source}.{alias.name}" for alias in node.names]
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None))
              in ("import_module", "__import__") and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)):
            names = [node.args[0].value]
        if any(is_compare(name) for name in names):
            found.append((node.lineno, ast.unparse(node), in_function))
        inside = in_function or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        for child in ast.iter_child_nodes(node):
            visit(child, inside)

    visit(ast.parse(path.read_text(), filename=str(path)), False)
    return found


def test_only_the_cli_imports_the_comparison_and_only_lazily():
    """The comparison harness is out of the library's core: no module of kkmgpu outside kkmgpu/compare/ imports
    it, except the command line (kkmgpu/cli/commands.py), and that one only inside the function that builds the
    ``compare`` command."""
    package_dir = REPO_ROOT / "kkmgpu"
    cli = package_dir / "cli" / "commands.py"
    offenders, lazy_in_cli = [], []
    for path in sorted(package_dir.rglob("*.py")):
        if (package_dir / "compare") in path.parents:
            continue
        for line, statement, in_function in _compare_imports(path):
            if path == cli and in_function:
                lazy_in_cli.append(statement)
            else:
                offenders.append(f"{path.relative_to(REPO_ROOT)}:{line} {statement}")
    assert offenders == [], "kkmgpu.compare imported outside the CLI's compare command:\n" + "\n".join(offenders)
    assert lazy_in_cli, "the parse no longer sees the CLI's lazy import of kkmgpu.compare"


def test_import_kkmgpu_does_not_load_the_comparison():
    code = "import kkmgpu, sys; print([m for m in sys.modules if m.startswith('kkmgpu.compare')])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO_ROOT)
    assert out.stdout.strip() == "[]"


# --------------------------------------------------------------------------- issue 27 point 7: a fresh install


def test_quick_on_a_fresh_install_runs_generated_sets_and_says_what_it_skipped(tmp_path, monkeypatch, capsys):
    """Installed (no checkout, no KKMGPU_DATA_DIR), ``kkmgpu compare --quick`` clusters the sets kkmgpu generates
    as well as wine, never looks beside site-packages, and lists every skipped set with how to provide it."""
    site_packages = tmp_path / "lib" / "site-packages"
    site_packages.mkdir(parents=True)
    monkeypatch.setattr(kkmgpu.datasets, "_REPO_ROOT", site_packages)
    monkeypatch.delenv("KKMGPU_DATA_DIR", raising=False)
    monkeypatch.delenv("KKMGPU_MNIST_DIR", raising=False)
    assert main(["compare", "--quick", "--no-scenarios", "--methods", "kkmgpu-exact", "--out", str(tmp_path),
                 "--no-plots", "--device", "cpu", "--quiet"]) == 0
    out = capsys.readouterr().out
    ran = {row["dataset"] for row in read_csv(tmp_path / "compare.csv")}
    assert ran == {"circles", "spirals", "wine"}
    skipped = [line.strip() for line in out.splitlines() if line.startswith("  data set ")]
    assert [line.split(":")[0] for line in skipped] == ["data set flame", "data set jain", "data set mnist-500"]
    assert all("KKMGPU_DATA_DIR" in line and "--data-dir" in line for line in skipped), skipped
    assert "ran 3 data set(s) (circles, spirals, wine); skipped 3:" in out
    assert "site-packages" not in out


@pytest.mark.parametrize("name, generator", [("circles", "make_two_circles"), ("spirals", "make_two_spirals")])
def test_generated_sets_are_the_datasets_generators(name, generator):
    X, y = getattr(kkmgpu.datasets, generator)(data.GENERATED_N, random_state=0)
    dataset = data.load_dataset(name)
    np.testing.assert_allclose(dataset.X, (X - X.mean(axis=0)) / X.std(axis=0), rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(dataset.y, y)
    assert dataset.k == 2


def test_an_explicit_data_dir_is_the_only_one_looked_in(tmp_path, monkeypatch):
    """--data-dir beats $KKMGPU_DATA_DIR, which beats the checkout's shared/data; with --data-dir nothing else is
    read, for the shape sets and for WiFi alike."""
    env_dir, explicit = tmp_path / "env", tmp_path / "explicit"
    for folder, offset in ((env_dir, 0.0), (explicit, 10.0)):
        (folder / "shapes").mkdir(parents=True)
        (folder / "uci").mkdir()
        write_shape_csv(folder / "shapes" / "jain.csv", np.array([[0.0, 1.0], [2.0, 3.0 + offset]]), np.array([0, 1]))
    np.savetxt(env_dir / "uci" / "wifi_localization.csv", np.c_[np.eye(4), [1, 2, 1, 2]], delimiter=",")
    monkeypatch.setenv("KKMGPU_DATA_DIR", str(env_dir))
    assert data.load_dataset("jain").X[1, 1] == pytest.approx(1.0)  # standardised [1, 3]
    assert data.load_dataset("jain", explicit).X[1, 1] == pytest.approx(1.0)
    raw_env = kkmgpu.datasets.load_shape_set("jain")[0]
    assert raw_env[1, 1] == 3.0
    assert data.load_dataset("wifi").X.shape == (4, 4)
    expected = re.escape(f"no wifi_localization.csv in {explicit / 'uci'});") + ".*--data-dir"
    with pytest.raises(data.Unavailable, match=expected):
        data.load_dataset("wifi", explicit)
