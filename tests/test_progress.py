"""Progress bars (kkmgpu._progress): tqdm when installed, plain lines otherwise, silent when off."""

import sys

import numpy as np

import pytest

import kkmgpu
from kkmgpu import _progress
from kkmgpu._progress import check_progress, progress_bar


def _without_tqdm(monkeypatch):
    # A None entry in sys.modules makes `import tqdm.auto` raise ImportError, as on a machine without tqdm.
    monkeypatch.setitem(sys.modules, "tqdm", None)
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)


def test_disabled_bar_prints_nothing(capsys):
    with progress_bar(5, desc="quiet", enabled=False) as bar:
        for _ in range(5):
            bar.update()
        bar.set_postfix_str("x")
    out, err = capsys.readouterr()
    assert out == "" and err == ""


def test_plain_fallback_prints_tenths_and_a_final_line(monkeypatch, capsys):
    _without_tqdm(monkeypatch)
    bar = progress_bar(20, desc="work", enabled=True, unit="tile")
    assert isinstance(bar, _progress._PlainBar)
    bar.min_interval = 0.0
    with bar:
        for _ in range(20):
            bar.update()
        bar.set_postfix_str("sigma 0.5")
    lines = capsys.readouterr().err.strip().splitlines()
    # one line per tenth (2 tiles each), then the closing line
    assert len(lines) == 11
    assert lines[0].startswith("work: 2/20 tile ( 10%)")
    assert lines[-1].startswith("work: 20/20 tile (100%)") and lines[-1].endswith("sigma 0.5")


def test_plain_fallback_rate_limits(monkeypatch, capsys):
    _without_tqdm(monkeypatch)
    with progress_bar(1000, desc="fast", enabled=True) as bar:  # default: at most one line per 2 s
        for _ in range(1000):
            bar.update()
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == [lines[-1]] and lines[-1].startswith("fast: 1000/1000 it (100%)")


def test_plain_fallback_unknown_total(monkeypatch, capsys):
    _without_tqdm(monkeypatch)
    with progress_bar(None, desc="open", enabled=True, unit="step") as bar:
        bar.update(3)
    assert capsys.readouterr().err.strip().startswith("open: 3 step,")


def test_tqdm_bar_when_installed(capsys):
    pytest.importorskip("tqdm", reason="tqdm is an optional dependency (pip install kkmgpu[progress])")
    with progress_bar(4, desc="tq", enabled=True, unit="run") as bar:
        assert type(bar).__module__.startswith("tqdm")
        for _ in range(4):
            bar.update()
    err = capsys.readouterr().err
    assert "tq" in err and "4/4" in err


@pytest.mark.parametrize("value", ["yes", 1, None, 0.0])
def test_progress_must_be_a_bool(value):
    with pytest.raises(TypeError, match=r"progress=.* must be True or False"):
        check_progress(value)


@pytest.mark.parametrize("tqdm_installed", [True, False])
def test_compare_shows_a_bar_over_its_runs(monkeypatch, capsys, tqdm_installed):
    from kkmgpu import compare
    from kkmgpu.compare import runner

    if tqdm_installed:
        pytest.importorskip("tqdm", reason="tqdm is an optional dependency (pip install kkmgpu[progress])")
    else:
        _without_tqdm(monkeypatch)
    monkeypatch.setattr(runner, "QUICK_SCENARIO_N", {"sizes": (40,), "d": 3, "k": 2})
    monkeypatch.setattr(runner, "QUICK_SCENARIO_D", {"dims": (2,), "n": 40, "k": 2})
    report = compare.run_comparison(dataset_names=[], method_names=["kkmgpu-exact"], quick=True, seeds=1,
                                    device="cpu", verbose=False, progress=True)
    assert len(report["rows"]) == 2
    err = capsys.readouterr().err
    assert "compare" in err and "2/2" in err
    with pytest.raises(TypeError, match="progress="):
        compare.run_comparison(dataset_names=[], method_names=["kkmgpu-exact"], quick=True, device="cpu",
                               verbose=False, progress="on")


def _blobs(n=300, k=3, seed=0):
    rng = np.random.default_rng(seed)
    centres = rng.normal(scale=6.0, size=(k, 4))
    y = rng.integers(0, k, n)
    return centres[y] + rng.normal(size=(n, 4)), y


@pytest.mark.parametrize("method, extra", [("exact", {}), ("exact", {"engine": "tiled"}), ("cats", {}),
                                           ("eigen", {}), ("trimmed", {})])
def test_fit_progress_changes_nothing_but_stderr(monkeypatch, capsys, method, extra):
    _without_tqdm(monkeypatch)
    monkeypatch.setattr(_progress._PlainBar, "MIN_INTERVAL", 0.0)  # print every tenth at once
    X, _ = _blobs()
    quiet = kkmgpu.fit(X, 3, method=method, device="cpu", random_state=0, n_init=2, **extra)
    capsys.readouterr()
    shown = kkmgpu.fit(X, 3, method=method, device="cpu", random_state=0, n_init=2, progress=True, **extra)
    out, err = capsys.readouterr()
    np.testing.assert_array_equal(quiet.labels, shown.labels)
    assert shown.objective == quiet.objective and out == ""
    desc = "CATS" if method == "cats" else "kernel k-means"
    assert f"{desc}: 2/2 init (100%)" in err
    if extra.get("engine") == "tiled":
        assert "tiled pass: " in err and "row" in err


def test_fit_progress_is_off_by_default_and_checked(capsys):
    X, _ = _blobs(60)
    kkmgpu.fit(X, 3, device="cpu", random_state=0)
    assert capsys.readouterr().err == ""
    with pytest.raises(TypeError, match=r"progress='yes' must be True or False"):
        kkmgpu.fit(X, 3, device="cpu", progress="yes")


def test_search_progress_counts_its_runs(monkeypatch, capsys):
    _without_tqdm(monkeypatch)
    X, _ = _blobs(120)
    result = kkmgpu.search_bandwidth(X, 3, device="cpu", random_state=0, max_values=6, progress=True)
    err = capsys.readouterr().err.strip().splitlines()
    runs = len(result.evaluations)
    assert 1 <= runs <= 6
    assert err[-1].startswith(f"bandwidth search: {runs}/6 run") and "best c-NNC" in err[-1]
    fitted = kkmgpu.fit(X, 3, gamma="search", device="cpu", random_state=0, dtype="float64", init="random",
                        progress=True)
    assert "bandwidth search:" in capsys.readouterr().err
    assert fitted.method_params["sigma"] > 0


def test_cli_progress_flag(monkeypatch, capsys, tmp_path):
    from kkmgpu.cli import main

    _without_tqdm(monkeypatch)
    X, _ = _blobs(90)
    path = tmp_path / "x.csv"
    np.savetxt(path, X, delimiter=",")
    assert main(["fit", str(path), "-k", "3", "--device", "cpu", "--progress"]) == 0
    assert "kernel k-means: 1/1 init (100%)" in capsys.readouterr().err
    assert main(["fit", str(path), "-k", "3", "--device", "cpu"]) == 0  # stderr is not a terminal here: no bar
    assert "kernel k-means:" not in capsys.readouterr().err
