"""bench/bench_quick.py collect: the one result file of `bash bench/gpu_session.sh quick` from a work folder.

The measurements themselves need a GPU (or the stand-in, minutes); what is checked here is the bookkeeping that a
lent session relies on: each test group's counts and status from its JUnit file and exit code, steps cut off by
their limit or left out by the budget, and the targets' verdicts (none for a smoke run).
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" errors="0" failures="1" skipped="0" tests="3" time="12.5">
<testcase classname="tests.test_twins" name="test_a[cuda]" time="0.1"/>
<testcase classname="tests.test_twins" name="test_b[cuda]" time="0.1"/>
<testcase classname="tests.test_tiled" name="test_c[cuda]" time="0.2">
<failure message="AssertionError: 3 != 4&#10;more">trace</failure></testcase>
</testsuite></testsuites>
"""


def collect(work, *flags):
    """Run ``bench_quick.py collect`` on ``work`` (the CuPy stand-in names the device) and return its document."""
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "bench_quick.py"), "collect", "--work", str(work),
                           "--dest", str(work / "out"), "--phase", "quick", "--budget", "340", "--emulate", *flags],
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    written = Path((work / "result-path").read_text())
    assert written.parent == work / "out" and written.name.endswith("-quick" + ("-smoke" if flags else "") + ".json")
    return json.loads(written.read_text()), proc.stdout


@pytest.fixture
def work(tmp_path):
    rows = [("twins", "test", "100", "31.5", "1", ""), ("same-bits", "test", "60", "65.2", "124", ""),
            ("knn", "test", "45", "", "", "not run: 10s left, needs 15s"), ("engine", "bench", "90", "40.0", "0", ""),
            ("cats", "bench", "60", "61.0", "124", "")]
    (tmp_path / "steps.tsv").write_text("".join("\t".join(row) + "\n" for row in rows))
    (tmp_path / "tests-twins.xml").write_text(JUNIT)
    cases = [{"id": "engine-e2e-warm-default", "seconds": 0.2, "gemm_precision": "3xtf32"},
             {"id": "engine-build-default", "seconds": 0.5, "floor_s": 0.25, "ratio": 2.0}]
    (tmp_path / "engine.json").write_text(json.dumps({"part": "engine", "cases": cases, "errors": []}))
    (tmp_path / "cats.json").write_text(json.dumps({"part": "cats", "cases": [], "errors": []}))
    return tmp_path


def test_collect_reports_groups_steps_and_targets(work):
    doc, printed = collect(work)
    twins = doc["tests"]["twins"]
    assert (twins["status"], twins["tests"], twins["passed"], twins["failed"]) == ("failed", 3, 2, 1)
    assert twins["failures"] == [{"test": "tests.test_tiled::test_c[cuda]", "message": "AssertionError: 3 != 4"}]
    assert doc["tests"]["same-bits"]["status"] == "timed out" and doc["tests"]["same-bits"]["tests"] is None
    assert doc["tests"]["knn"]["status"] == "not run"
    status = {step["name"]: step["status"] for step in doc["steps"]}
    assert status["engine"] == "passed" and status["cats"] == "timed out"
    assert doc["budget"]["steps_seconds"] == pytest.approx(31.5 + 65.2 + 40.0 + 61.0)
    assert [case["id"] for case in doc["cases"]] == ["engine-e2e-warm-default", "engine-build-default"]
    targets = {target["case"]: target for target in doc["targets"]}
    assert targets["engine-e2e-warm-default"]["met"] is True      # 0.2 s <= 0.25 s
    assert targets["engine-build-default"]["met"] is False        # ratio 2.0 > 1.3
    assert targets["cats-1m-default"]["met"] is None and "not measured" in targets["cats-1m-default"]["note"]
    assert targets["ncut-1m"]["note"] == "not in this file: phase targets"
    assert "MISSED kernel build" in printed and "met    MNIST-70k" in printed


def test_a_smoke_run_gives_no_verdict(work):
    doc, _ = collect(work, "--smoke")
    assert doc["smoke"] is True and doc["emulated"] is True
    assert all(target["met"] is None for target in doc["targets"])
    assert {target["note"] for target in doc["targets"] if target["value"] is not None} == {
        "smoke run at a few thousand points: no verdict"}
