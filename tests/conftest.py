"""Shared fixtures: the backend/device parametrisation, the shared data folder, seeded data."""

import os
import sys
from pathlib import Path

import numpy as np
import pytest

# reference.py sits beside the tests and is imported as a plain module.
sys.path.insert(0, str(Path(__file__).resolve().parent))

SHARED_DATA_DIR = Path(__file__).resolve().parents[1] / ".." / "shared" / "data"
SHAPES_DIR = SHARED_DATA_DIR / "shapes"


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "gpu: needs a usable CUDA GPU and CuPy (skipped with the reason otherwise)"
    )


def cuda_skip_reason():
    """None when the CUDA backend is usable, else why not (used as the skip reason)."""
    if os.environ.get("KKMGPU_DEVICE", "").strip().lower() == "cpu":
        return "KKMGPU_DEVICE=cpu forces the CPU for this run"
    try:
        from kkmgpu import _backend
    except ImportError as exc:  # pragma: no cover - the package is a hard requirement of the suite
        return f"kkmgpu._backend cannot be imported: {exc}"
    reason = _backend.cuda_unavailable_reason()
    return None if reason is None else f"CUDA backend unusable: {reason}"


def gpu_usable():
    return cuda_skip_reason() is None


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


@pytest.fixture(params=DEVICES)
def device(request):
    """The device string passed to ``kkmgpu.fit``; the cuda case skips where no GPU is usable."""
    if request.param == "cuda":
        reason = cuda_skip_reason()
        if reason is not None:
            pytest.skip(reason)
    return request.param


@pytest.fixture
def backend(device):
    """Alias of :func:`device` for tests that read better with it."""
    return device


@pytest.fixture(scope="session")
def shared_data_dir():
    if not SHARED_DATA_DIR.is_dir():
        pytest.skip(f"shared data folder not found at {SHARED_DATA_DIR.resolve()}")
    return SHARED_DATA_DIR.resolve()


def shape_csv_paths():
    """Every shapes csv, for parametrisation at collection time (empty when the folder is missing)."""
    return sorted(SHAPES_DIR.glob("*.csv")) if SHAPES_DIR.is_dir() else []


def load_labelled_csv(path):
    """(X float64, y int64 0-based) from a csv with header x1..xd,label and labels 1..k."""
    table = np.loadtxt(path, delimiter=",", skiprows=1, dtype=np.float64, ndmin=2)
    X, y = table[:, :-1], table[:, -1].astype(np.int64)
    return X, y - y.min()


@pytest.fixture
def rng(request):
    """A NumPy generator seeded from the test's node id, so every test gets its own fixed stream."""
    seed = sum(map(ord, request.node.nodeid)) % (2**32)
    return np.random.default_rng(seed)
