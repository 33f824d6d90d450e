"""Progress bars (kkmgpu._progress): tqdm when installed, plain lines otherwise, silent when off."""

import sys

import pytest

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

    if tqdm_installed:
        pytest.importorskip("tqdm", reason="tqdm is an optional dependency (pip install kkmgpu[progress])")
    else:
        _without_tqdm(monkeypatch)
    monkeypatch.setattr(compare, "QUICK_SCENARIO_N", {"sizes": (40,), "d": 3, "k": 2})
    monkeypatch.setattr(compare, "QUICK_SCENARIO_D", {"dims": (2,), "n": 40, "k": 2})
    report = compare.run_comparison(dataset_names=[], method_names=["kkmgpu-exact"], quick=True, seeds=1,
                                    device="cpu", verbose=False, progress=True)
    assert len(report["rows"]) == 2
    err = capsys.readouterr().err
    assert "compare" in err and "2/2" in err
    with pytest.raises(TypeError, match="progress="):
        compare.run_comparison(dataset_names=[], method_names=["kkmgpu-exact"], quick=True, device="cpu",
                               verbose=False, progress="on")
