"""Fixtures and hooks of the kkmgpu benchmarks (pytest-benchmark).

Run from the repository root with ``python -m pytest bench/ --benchmark-only`` (see bench/README.md).
A plain ``pytest`` from the root runs only ``tests/`` (``testpaths``), never these benchmarks.

Every speed is quoted as a ratio to a floor measured in the same run on the same device
(ARCHITECTURE.md, "Performance model"):

- memory floor of one dense iteration = bytes(K) / copy bandwidth, the bandwidth of a large
  device-to-device copy counting bytes read + bytes written;
- floor of building K = max(2 n^2 d / GEMM rate, bytes(K) / write bandwidth).

At the end of the session one JSON file per device is written (or merged into) under
``bench/results/<YYYY-MM-DD>-<device slug>.json``; its schema is described in bench/README.md.
"""

from __future__ import annotations

import fnmatch
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from _kkmgpu_bench import (
    DEFAULT_RESULTS_DIR,
    ENV_MNIST_DIR,
    ENV_RESULTS_DIR,
    REPO_ROOT,
    Floors,
    Recorder,
    available_devices,
    mnist_dir,
    summary_lines,
    write_results,
)

# Benchmark the working tree this folder belongs to, also when kkmgpu is not installed.
try:
    import kkmgpu  # noqa: F401
except ImportError:
    sys.path.insert(0, str(REPO_ROOT))

_RECORDER = pytest.StashKey[Recorder]()
_FLOORS = pytest.StashKey[Floors]()


def pytest_configure(config):
    config.stash[_RECORDER] = Recorder()
    config.stash[_FLOORS] = Floors()


def pytest_collect_file(file_path, parent):
    """Collect ``bench_*.py`` in this folder, without touching ``python_files`` for the rest of the project."""
    if file_path.suffix != ".py" or not fnmatch.fnmatch(file_path.name, "bench_*.py"):
        return None
    if parent.session.isinitpath(file_path):
        return None  # named on the command line: pytest's python plugin collects it already
    if any(fnmatch.fnmatch(file_path.name, pattern) for pattern in parent.config.getini("python_files")):
        return None  # the configuration already matches bench_*.py
    return pytest.Module.from_parent(parent, path=file_path)


def _devices() -> list[str]:
    try:
        return available_devices()
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None


def pytest_generate_tests(metafunc):
    # module scope, so that pytest groups the cases of one (device, n) and builds each K once
    if "device" in metafunc.fixturenames:
        metafunc.parametrize("device", _devices(), scope="module")


@pytest.fixture(scope="session")
def bench_devices() -> list[str]:
    """The devices benchmarked in this session: "cpu", and "cuda" where a GPU is usable ($KKMGPU_BENCH_DEVICES)."""
    return _devices()


@pytest.fixture(scope="session")
def mnist():
    """All 70,000 MNIST points (X float32 in [0, 1] of shape (70000, 784), y int64), read once per session."""
    try:
        from kkmgpu.datasets import load_mnist
    except ImportError as exc:
        pytest.skip(f"kkmgpu.datasets.load_mnist is not importable: {exc}")
    path = mnist_dir()
    try:
        X, y = load_mnist(path)
    except FileNotFoundError as exc:
        pytest.skip(f"MNIST files not found in {path} (set {ENV_MNIST_DIR} to their folder): {exc}")
    return np.ascontiguousarray(X, dtype=np.float32), np.asarray(y)


@pytest.fixture(scope="session")
def floors(pytestconfig) -> Floors:
    """The session's floor measurements (bandwidths per device, GEMM rates per size), taken lazily."""
    return pytestconfig.stash[_FLOORS]


@pytest.fixture(scope="session")
def recorder(pytestconfig) -> Recorder:
    """Where the benchmarks put their cases; written to bench/results/ at the end of the session."""
    return pytestconfig.stash[_RECORDER]


_WRITTEN = pytest.StashKey[list]()


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session, exitstatus):
    """Write (or merge into) bench/results/<date>-<device>.json, one file per benchmarked device."""
    config = session.config
    recorder = config.stash.get(_RECORDER, None)
    if recorder is None or not recorder.cases:
        return
    recorder.finalize(config.stash[_FLOORS])  # measures the bandwidths again, derives floors and ratios
    if config.getoption("benchmark_disable", False):
        config.stash[_WRITTEN] = ["--benchmark-disable given, no result file written"]
        return
    target = os.environ.get(ENV_RESULTS_DIR, "").strip()
    if target.lower() in ("-", "none", "off"):
        config.stash[_WRITTEN] = [f"{ENV_RESULTS_DIR}={target}, no result file written"]
        return
    results_dir = Path(target) if target else DEFAULT_RESULTS_DIR
    program = Path(sys.argv[0]).name
    argv = (["python", "-m", "pytest"] if program == "__main__.py" else [program]) + sys.argv[1:]
    paths = write_results(recorder, config.stash[_FLOORS], results_dir, argv)
    config.stash[_WRITTEN] = [f"results written to {path}" for path in paths]


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    recorder = config.stash.get(_RECORDER, None)
    if recorder is None or not recorder.cases:
        return
    terminalreporter.section("kkmgpu scaling (times in ms; ratio = time / floor measured in this run)")
    for line in summary_lines(recorder):
        terminalreporter.write_line(line)
    for line in config.stash.get(_WRITTEN, []):
        terminalreporter.write_line(f"kkmgpu bench: {line}")
