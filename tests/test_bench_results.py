"""bench/_kkmgpu_bench.py ScriptRun: the result files the bench scripts merge their cases into. A second run of a
command the same day replaces the first's cases of the same id and says so; KKMGPU_BENCH_TAG keeps a run apart."""

import importlib.util
import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _bench_module():
    spec = importlib.util.spec_from_file_location("_kkmgpu_bench", REPO / "bench" / "_kkmgpu_bench.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(module, tmp_path, figures, run_id):
    run = module.ScriptRun("cpu", ["x"], script="bench/x.py", topic="topic", schema="test-1", results_dir=tmp_path)
    run.run_id = run.meta["run_id"] = run_id
    for case_id, value in figures.items():
        run.add({"id": case_id, "value": value})
    return run


def test_a_second_run_replaces_cases_of_the_same_id_and_says_so(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("KKMGPU_BENCH_TAG", raising=False)
    module = _bench_module()
    first = _run(module, tmp_path, {"a": 1, "b": 2}, "run-1")
    assert capsys.readouterr().err == ""
    second = _run(module, tmp_path, {"b": 3, "c": 4}, "run-2")
    assert second.path == first.path
    err = capsys.readouterr().err
    assert "replaces the earlier case(s) b" in err and err.count("replaces") == 1    # once, for b alone
    document = json.loads(first.path.read_text())
    assert {c["id"]: (c["value"], c["run_id"]) for c in document["cases"]} == {
        "a": (1, "run-1"), "b": (3, "run-2"), "c": (4, "run-2")}
    assert [r["run_id"] for r in document["runs"]] == ["run-1", "run-2"]


def test_a_tag_writes_a_file_of_its_own(tmp_path, capsys, monkeypatch):
    module = _bench_module()
    monkeypatch.delenv("KKMGPU_BENCH_TAG", raising=False)
    plain = _run(module, tmp_path, {"a": 1}, "run-1")
    monkeypatch.setenv("KKMGPU_BENCH_TAG", "after fix/2")
    tagged = _run(module, tmp_path, {"a": 2}, "run-2")
    assert tagged.path.name == plain.path.name.replace(".json", "-after-fix-2.json")
    assert capsys.readouterr().err == ""
    assert json.loads(plain.path.read_text())["cases"][0]["value"] == 1
    assert json.loads(tagged.path.read_text())["cases"][0]["value"] == 2
