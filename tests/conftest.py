"""Shared fixtures: the backend/device parametrisation, the shared data folder, seeded data."""

import contextlib
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

# reference.py sits beside the tests and is imported as a plain module.
sys.path.insert(0, str(Path(__file__).resolve().parent))

SHARED_DATA_DIR = Path(__file__).resolve().parents[1] / ".." / "shared" / "data"
SHAPES_DIR = SHARED_DATA_DIR / "shapes"


# The stand-in is a package named `cupy`: collecting it (doctests) would import it as CuPy in every run.
collect_ignore = ["standin", "cudacpu"]

#: the opt-in switch (also ``--emulate-gpu``): without a GPU, run the ``cuda`` cases on the CuPy stand-in
EMULATE_ENV = "KKMGPU_EMULATE_GPU"
#: on a real GPU, turn CuPy's memory pool off (bench/gpu_session.sh sanitize, under compute-sanitizer)
NO_POOL_ENV = "KKMGPU_TEST_CUPY_NO_POOL"
STANDIN_DIR = Path(__file__).resolve().parent / "standin"
#: what the ``cuda`` cases run on in this session: "gpu" (real CuPy), "standin" or None (they skip)
GPU_MODE = None


def pytest_addoption(parser):
    parser.addoption(
        "--emulate-gpu", action="store_true", default=False,
        help=f"where CuPy sees no GPU, run the cuda cases on the strict CuPy stand-in (tests/standin) with the real "
             f"kernels_cuda/*.cu compiled for the CPU (tests/cudacpu); same as {EMULATE_ENV}=1",
    )


def _env_flag(name):
    return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no", "off")


def _real_gpu_visible():
    """True when a real CuPy imports and sees a CUDA device (asked in a child process, so that a CuPy without a
    GPU leaves nothing behind in this one)."""
    probe = "import cupy, sys; sys.exit(0 if cupy.cuda.runtime.getDeviceCount() > 0 else 1)"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    try:
        return subprocess.run([sys.executable, "-c", probe], capture_output=True, timeout=120, env=env).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def install_cupy_standin():
    """Make ``import cupy`` / ``import cupyx`` give the stand-in for the rest of this process."""
    for name in [m for m in sys.modules if m == "cupy" or m.startswith(("cupy.", "cupyx"))]:
        del sys.modules[name]
    if str(STANDIN_DIR) not in sys.path:
        sys.path.insert(0, str(STANDIN_DIR))
    backend = sys.modules.get("kkmgpu.backend.device")
    if backend is not None:
        backend.cuda_unavailable_reason.cache_clear()


def pytest_configure(config):
    global GPU_MODE
    config.addinivalue_line(
        "markers", "gpu: needs a usable CUDA GPU and CuPy (skipped with the reason otherwise)"
    )
    if config.getoption("--emulate-gpu") or _env_flag(EMULATE_ENV):
        if _real_gpu_visible():
            GPU_MODE = "gpu"
        else:
            install_cupy_standin()
            GPU_MODE = "standin"
    if _env_flag(NO_POOL_ENV) and GPU_MODE != "standin" and cuda_skip_reason() is None:
        import cupy  # tests may import CuPy; the library may not (tests/test_import.py)

        cupy.cuda.set_allocator(None)  # every array its own cudaMalloc, so memcheck sees its exact bounds


def pytest_report_header(config):
    if GPU_MODE == "standin":
        return "kkmgpu cuda cases: emulated (CuPy stand-in, kernels_cuda/*.cu compiled for the CPU)"
    if GPU_MODE == "gpu":
        return "kkmgpu cuda cases: real GPU (the emulation switch is ignored where CuPy sees a device)"
    return f"kkmgpu cuda cases: on a GPU when CuPy sees one, else skipped ({EMULATE_ENV}=1 or --emulate-gpu emulates)"


_CUDA_OUTCOMES = {}
#: skip reasons about data that the cpu case needs as much (the shared data folder, MNIST), not about the device
_DATA_SKIP = re.compile(r"\bnot found\b")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """With the GPU emulated or real (the switch on), a cuda case may not pass by being skipped: a skip of a
    gpu-marked test for a reason about the device (CUDA, CuPy, GPU) is reported as a failure naming the reason.
    Skips both cases share (the shared data folder not found) stay skips."""
    outcome = yield
    report = outcome.get_result()
    if GPU_MODE is not None and report.skipped and item.get_closest_marker("gpu") is not None:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        if _DATA_SKIP.search(reason) and "CUDA backend unusable" not in reason:
            return  # skipped for a reason the cpu case shares (shared data not found, ...), not for the device
        report.outcome = "failed"
        report.longrepr = (f"cuda case skipped while the GPU is {'emulated' if GPU_MODE == 'standin' else 'real'}: "
                           f"{reason}")


def pytest_runtest_logreport(report):
    if "gpu" in report.keywords and (report.when == "call" or report.outcome != "passed"):
        _CUDA_OUTCOMES.setdefault(report.nodeid, report.outcome)


def skip_reason(report):
    """The reason a skipped test report gives, without pytest's "Skipped: " prefix."""
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    return reason[len("Skipped: "):] if reason.startswith("Skipped: ") else reason


def pytest_terminal_summary(terminalreporter):
    # Why tests were skipped, one line per reason with its count (pytest's -rs repeats a reason per test function).
    skipped = [r for r in terminalreporter.stats.get("skipped", []) if r.longrepr is not None]
    if skipped:
        counts = {}
        for report in skipped:
            reason = skip_reason(report)
            counts[reason] = counts.get(reason, 0) + 1
        terminalreporter.write_sep("=", f"{len(skipped)} skipped, by reason")
        for reason, count in sorted(counts.items(), key=lambda item: (-item[1], item[0])):
            terminalreporter.write_line(f"{count:6d}  {reason}")
    if _CUDA_OUTCOMES:
        counts = {}
        for outcome in _CUDA_OUTCOMES.values():
            counts[outcome] = counts.get(outcome, 0) + 1
        where = {"standin": "on the CuPy stand-in", "gpu": "on the GPU"}.get(
            GPU_MODE, "on the GPU" if counts.get("passed") or counts.get("failed") else "(no GPU: skipped)")
        terminalreporter.write_line(
            f"kkmgpu cuda cases {where}: " + ", ".join(f"{v} {k}" for k, v in sorted(counts.items())))


def cuda_skip_reason():
    """None when the CUDA backend is usable, else why not (used as the skip reason)."""
    if os.environ.get("KKMGPU_DEVICE", "").strip().lower() == "cpu":
        return "KKMGPU_DEVICE=cpu forces the CPU for this run"
    try:
        from kkmgpu.backend import device as _backend
    except ImportError as exc:  # pragma: no cover - the package is a hard requirement of the suite
        return f"kkmgpu.backend.device cannot be imported: {exc}"
    reason = _backend.cuda_unavailable_reason()
    if reason is None:
        return None
    return f"CUDA backend unusable: {reason} ({EMULATE_ENV}=1 or --emulate-gpu runs it on the CPU stand-in)"



def require_cuda():
    """Skip the calling test, with the reason, unless the CUDA backend (a GPU or the stand-in) is usable."""
    reason = cuda_skip_reason()
    if reason is not None:
        pytest.skip(reason)


def gpu_usable():
    return cuda_skip_reason() is None


def host(a):
    """A NumPy copy of a NumPy or CuPy array."""
    return np.asarray(a.get() if hasattr(a, "get") else a)


def use_device(device):
    """The device string, after skipping the test where it is "cuda" and no GPU (or stand-in) is usable."""
    if device == "cuda":
        require_cuda()
    return device


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


#: n, d, k of the SIPU shape sets (the project's data README)
SHAPE_TABLE = {
    "aggregation": (788, 2, 7),
    "compound": (399, 2, 6),
    "flame": (240, 2, 2),
    "jain": (373, 2, 2),
    "r15": (600, 2, 15),
}


@contextlib.contextmanager
def modelled_free_memory(nbytes):
    """A real GPU as kkmgpu sees one with ``nbytes`` free, without filling it: ``Backend.available_bytes`` patched
    to ``nbytes`` less what CuPy's pool has handed out since (the stand-in's accounting: every live array charged),
    so that the memory guards and tile sizes decide as on such a device. A constant patch does not: the arrays a
    fit allocates before a later check would not count (on the H100, 2026-11-26, the CATS split of all points
    still fitted a device made too small for it)."""
    from kkmgpu.backend import device as _backend

    pool = _backend.import_cupy().get_default_memory_pool()
    start = pool.used_bytes()
    with pytest.MonkeyPatch.context() as m:
        m.setattr(_backend.Backend, "available_bytes",
                  lambda self: max(0, int(nbytes) - (pool.used_bytes() - start)))
        yield


@contextlib.contextmanager
def free_device_memory(nbytes, fill=True):
    """The GPU with ``nbytes`` free: the emulated device shrunk to what is in use plus ``nbytes`` (the CuPy
    stand-in); a real GPU's rest taken by a ballast array (``fill``), or, without ``fill``,
    :func:`modelled_free_memory`. A ballast leaves ``nbytes`` to CuPy's pool only where ``nbytes`` dwarfs what
    the driver and the libraries take outside it (kernel modules loaded at first launch, cuBLAS/cuSOLVER
    workspaces: megabytes; on the H100, 2026-11-26, a ballast leaving 6 MiB ran out at the fit's second array, 2.3
    MiB free then), so checks of a few MiB take the model."""
    from kkmgpu.backend.device import import_cupy

    cp = import_cupy()
    pool = cp.get_default_memory_pool()
    pool.free_all_blocks()
    if hasattr(cp.cuda, "standin_device_memory"):
        with cp.cuda.standin_device_memory(pool.used_bytes() + int(nbytes)):
            yield
        return
    if not fill:
        with modelled_free_memory(nbytes):
            yield
        pool.free_all_blocks()
        return
    ballast = cp.empty(max(0, cp.cuda.runtime.memGetInfo()[0] - int(nbytes)), dtype=cp.uint8)
    try:
        yield
    finally:
        del ballast
        pool.free_all_blocks()


def have_shape_sets():
    return all((SHAPES_DIR / f"{name}.csv").is_file() for name in SHAPE_TABLE)


def shape_set(name):
    """(X float64, y int64 0-based) of a shape set: the real file when the shared data folder holds it, else a
    generated look-alike of the same n, d and k (Gaussian clusters of unequal sizes on a circle, seeded by the
    name), so that a fresh clone runs the same tests on data of the same shape instead of skipping them."""
    path = SHAPES_DIR / f"{name}.csv"
    if path.is_file():
        return load_labelled_csv(path)
    n, d, k = SHAPE_TABLE[name]
    rng = np.random.default_rng(sum(map(ord, name)))
    sizes = rng.multinomial(n - 10 * k, rng.dirichlet(np.full(k, 4.0))) + 10
    angles = 2 * np.pi * np.arange(k) / k + rng.uniform(0, 0.3, k)
    centres = 10 * np.column_stack([np.cos(angles), np.sin(angles)])
    spreads = rng.uniform(0.8, 1.6, k)
    X = np.concatenate([c + s * rng.standard_normal((m, d)) for c, s, m in zip(centres, spreads, sizes)])
    y = np.repeat(np.arange(k), sizes)
    order = rng.permutation(n)
    return X[order], y[order].astype(np.int64)


def write_shape_csv(path, X, y):
    header = ",".join(f"x{j + 1}" for j in range(X.shape[1])) + ",label"
    np.savetxt(path, np.column_stack([X, y + 1]), delimiter=",", header=header, comments="", fmt="%.10g")


@pytest.fixture(scope="session")
def shared_data_dir(tmp_path_factory):
    """The shared data folder when it holds the shape sets, else a temporary one with generated look-alikes in
    ``shapes/`` (see :func:`shape_set`)."""
    if have_shape_sets():
        return SHARED_DATA_DIR.resolve()
    root = tmp_path_factory.mktemp("generated-data")
    (root / "shapes").mkdir()
    for name in SHAPE_TABLE:
        write_shape_csv(root / "shapes" / f"{name}.csv", *shape_set(name))
    return root


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


@pytest.fixture
def knn_search_modes(monkeypatch):
    """The GEMM precision mode of every exact neighbour search (kkmgpu.kernels.knn_exact.search, spied on) run while
    the test runs, in order: what a graph fit's neighbour search really ran, to hold method_params["gemm_mode"] to."""
    from kkmgpu.kernels import knn_exact

    ran, search = [], knn_exact.search

    def spy(*args, report=None, **kwargs):
        report = {} if report is None else report
        out = search(*args, report=report, **kwargs)
        ran.append(report["mode"])
        return out

    monkeypatch.setattr(knn_exact, "search", spy)
    return ran
