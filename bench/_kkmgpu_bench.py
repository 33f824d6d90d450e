"""Measurement and bookkeeping behind the kkmgpu benchmarks: floors, device identity, the result file.

Imported by conftest.py (the fixtures and hooks) and by the bench_*.py modules. Kept out of conftest.py so
that ``import`` never picks up another folder's conftest module.
"""

from __future__ import annotations

import copy
import datetime
import importlib.metadata
import json
import os
import platform
import re
import sys
import time
from pathlib import Path

import numpy as np

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
DEFAULT_RESULTS_DIR = BENCH_DIR / "results"
DEFAULT_MNIST_DIR = REPO_ROOT / ".." / "shared" / "data" / "mnist"
SCHEMA = "kkmgpu-bench/1"

ENV_MNIST_DIR = "KKMGPU_MNIST_DIR"
ENV_DEVICES = "KKMGPU_BENCH_DEVICES"
ENV_RESULTS_DIR = "KKMGPU_BENCH_RESULTS_DIR"

COPY_BYTES = 512 * 2**20  # per array: the copy reads 512 MiB and writes 512 MiB
BANDWIDTH_REPEATS = 7
GEMM_REPEATS = 3
MNIST_N_FEATURES = 784
HOST = "host"  # recorder key of cases that run on the host CPU whatever the device (tslearn); every file gets them


# --------------------------------------------------------------------------------------------
# extension points for bench modules other than bench_exact.py (bench_gpu_engine.py): their own
# benchmarks' floors, figures that compare cases (speed-ups), terminal lines and targets


class Extension:
    """What a bench module adds to the shared machinery; registered once by name (``register_extension``).

    - ``floor_derivers``: benchmark name -> ``fn(case, floors, device)`` that fills in that benchmark's
      floors and ratios in place (``derive_floors`` hands such cases to it);
    - ``run_deriver``: ``fn(recorder)``, called once every case of the run has its floors (speed-ups
      between cases of the same run, on different devices);
    - ``summary``: ``fn(recorder) -> list[str]``, more lines of the terminal summary;
    - ``targets``: dicts ``{target, case, quantity, rule, limit, stated_for, device_kind}`` reported in
      ``targets`` of the result files of devices of that kind ("cpu" or "cuda"; None: every device).
    """

    def __init__(self, floor_derivers=None, run_deriver=None, summary=None, targets=()):
        self.floor_derivers = dict(floor_derivers or {})
        self.run_deriver = run_deriver
        self.summary = summary
        self.targets = list(targets)


EXTENSIONS: dict[str, Extension] = {}


def register_extension(name: str, **parts) -> Extension:
    """Register (or replace) the extension ``name``; see :class:`Extension` for ``parts``."""
    EXTENSIONS[name] = extension = Extension(**parts)
    return extension


def _floor_deriver(benchmark: str):
    for extension in EXTENSIONS.values():
        if benchmark in extension.floor_derivers:
            return extension.floor_derivers[benchmark]
    return None


def _meets(value, rule: str, limit: float):
    if value is None:
        return None
    return {"<=": value <= limit, "<": value < limit, ">=": value >= limit, ">": value > limit}[rule]


# --------------------------------------------------------------------------------------------
# devices


def _cuda_unavailable_reason() -> str | None:
    if os.environ.get("KKMGPU_DEVICE", "").strip().lower() == "cpu":
        return "KKMGPU_DEVICE=cpu forces the CPU"
    try:
        from kkmgpu.backend import device as _backend
    except ImportError as exc:
        return f"kkmgpu.backend.device cannot be imported: {exc}"
    return _backend.cuda_unavailable_reason()


def available_devices() -> list[str]:
    """Devices to benchmark: "cpu" always, "cuda" where a GPU is usable; $KKMGPU_BENCH_DEVICES restricts them."""
    devices = ["cpu"]
    if _cuda_unavailable_reason() is None:
        devices.append("cuda")
    wanted = os.environ.get(ENV_DEVICES, "").strip()
    if wanted:
        names = [name.strip().lower() for name in wanted.split(",") if name.strip()]
        unknown = [name for name in names if name not in ("cpu", "cuda")]
        if unknown:
            raise ValueError(f"{ENV_DEVICES}={wanted!r}: unknown device(s) {unknown}; use cpu and/or cuda.")
        if "cuda" in names and "cuda" not in devices:
            raise ValueError(
                f"{ENV_DEVICES}={wanted!r} asks for cuda but no GPU is usable: {_cuda_unavailable_reason()}")
        devices = [name for name in devices if name in names]
    return devices


def synchronize(device: str) -> None:
    """Wait for the device's queued work (a no-op on the CPU)."""
    if device.startswith("cuda"):
        import cupy

        cupy.cuda.Device().synchronize()


def to_host(a):
    """``a`` as a NumPy array."""
    return a.get() if hasattr(a, "get") and not isinstance(a, np.ndarray) else np.asarray(a)


# --------------------------------------------------------------------------------------------
# MNIST


def mnist_repeated(n, seed=0, noise=0.05):
    """MNIST: all 70,000, a random subset of n, or (n > 70,000) MNIST repeated with Gaussian pixel noise (clipped
    to [0, 1]; the copies filled in place, no concatenation)."""
    import kkmgpu

    X, y = kkmgpu.datasets.load_mnist()
    X = X.astype(np.float32)       # load_mnist's pixels are in [0, 1] already
    if n < X.shape[0]:
        index = np.random.default_rng(seed).choice(X.shape[0], size=n, replace=False)
        return X[index], y[index]
    if n == X.shape[0]:
        return X, y
    rng = np.random.default_rng(seed)
    reps = -(-n // X.shape[0])
    out = np.empty((reps * X.shape[0], X.shape[1]), dtype=np.float32)
    for r in range(reps):
        block = out[r * X.shape[0]:(r + 1) * X.shape[0]]
        block[:] = X
        if r:
            block += rng.normal(scale=noise, size=X.shape).astype(np.float32)
            np.clip(block, 0, 1, out=block)
    return out[:n], np.tile(y, reps)[:n]


def status_gib(field: str) -> float:
    """A /proc/self/status memory field (VmRSS, VmHWM) in GiB (Linux)."""
    with open("/proc/self/status") as f:
        line = next(line for line in f if line.startswith(field + ":"))
    return int(line.split()[1]) / 2**20


def reset_peak() -> bool:
    """Start a new resident high-water mark (Linux: VmHWM reset through clear_refs); False where not allowed."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def mnist_dir() -> Path:
    """$KKMGPU_MNIST_DIR, else ../shared/data/mnist next to the repository."""
    env = os.environ.get(ENV_MNIST_DIR, "").strip()
    return Path(env) if env else DEFAULT_MNIST_DIR.resolve()



def mnist_sample(mnist, n: int, seed: int = 0):
    """A seeded uniform subset of n MNIST points, in file order."""
    X, y = mnist
    index = np.sort(np.random.default_rng(seed).choice(X.shape[0], size=n, replace=False))
    return np.ascontiguousarray(X[index]), y[index]


# --------------------------------------------------------------------------------------------
# floors: bandwidths and GEMM rates measured on the device in this run


def _best_seconds(fn, repeats: int, min_total: float = 0.25, max_repeats: int = 200) -> float:
    """Best wall time of ``fn`` over at least ``repeats`` calls and at least ``min_total`` seconds."""
    best, total, count = float("inf"), 0.0, 0
    while count < repeats or (total < min_total and count < max_repeats):
        t0 = time.perf_counter()
        fn()
        seconds = time.perf_counter() - t0
        best, total, count = min(best, seconds), total + seconds, count + 1
    return best


def _numba_parallel_copy():
    """A numba prange copy (one contiguous slab per thread), the way kkmgpu's CPU twins stream memory."""
    try:
        import numba
    except ImportError:
        return None

    @numba.njit(parallel=True, cache=False)
    def parallel_copy(dst, src):
        n_threads = numba.get_num_threads()
        size = src.size
        for t in numba.prange(n_threads):
            lo = size * t // n_threads
            hi = size * (t + 1) // n_threads
            dst[lo:hi] = src[lo:hi]

    return parallel_copy


def _measure_cpu_floors() -> dict:
    n = COPY_BYTES // 4
    src = np.ones(n, dtype=np.float32)
    dst = np.zeros(n, dtype=np.float32)  # touched, so no page faults are timed
    methods = {}
    t = _best_seconds(lambda: np.copyto(dst, src), BANDWIDTH_REPEATS)
    methods["numpy.copyto"] = 2 * src.nbytes / t
    parallel_copy = _numba_parallel_copy()
    if parallel_copy is not None:
        parallel_copy(dst, src)  # compile
        t = _best_seconds(lambda: parallel_copy(dst, src), BANDWIDTH_REPEATS)
        methods["numba.prange copy"] = 2 * src.nbytes / t
    # informative: a read-only stream (BLAS sgemv over a 512 MiB matrix) and first-touch writes
    matrix = src.reshape(16384, -1)
    vector = np.ones(matrix.shape[1], dtype=np.float32)
    matrix @ vector
    t_read = _best_seconds(lambda: matrix @ vector, BANDWIDTH_REPEATS)
    t_write = _best_seconds(lambda: dst.fill(1.0), BANDWIDTH_REPEATS)
    del dst

    def first_touch():
        fresh = np.empty(n, dtype=np.float32)
        fresh.fill(1.0)

    t_first = _best_seconds(first_touch, 3, min_total=0.0)
    return {
        # the largest measured copy rate gives the strictest (smallest) floor
        "copy_bandwidth_Bps": max(methods.values()),
        "copy_bandwidth_methods_Bps": methods,
        "copy_bytes": 2 * src.nbytes,
        "write_bandwidth_Bps": src.nbytes / t_write,
        "read_bandwidth_Bps": src.nbytes / t_read,
        "first_touch_write_bandwidth_Bps": src.nbytes / t_first,
        "method": (f"best of {BANDWIDTH_REPEATS}: numpy.copyto and a numba prange copy of a {COPY_BYTES >> 20} MiB "
                   "float32 array (bandwidth = bytes read + bytes written over time); write = ndarray.fill; "
                   "read = float32 sgemv over the same bytes (information only)"),
    }


def _cuda_best_seconds(cupy, fn, repeats: int) -> float:
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    fn()
    cupy.cuda.Device().synchronize()
    best = float("inf")
    for _ in range(repeats):
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        best = min(best, cupy.cuda.get_elapsed_time(start, stop) / 1e3)
    return best


def _measure_cuda_floors(nbytes: int | None = None) -> dict:
    import cupy

    nbytes = nbytes or 2 * COPY_BYTES  # 1 GiB per array, well past any cache
    src = cupy.ones(nbytes // 4, dtype=cupy.float32)
    dst = cupy.zeros_like(src)
    methods = {"cupy.copyto": 2 * nbytes / _cuda_best_seconds(
        cupy, lambda: cupy.copyto(dst, src), 2 * BANDWIDTH_REPEATS)}
    if hasattr(dst.data, "copy_from_device_async"):  # CuPy's; the stand-in of tests/standin has no raw copy
        methods["cudaMemcpyAsync D2D"] = 2 * nbytes / _cuda_best_seconds(
            cupy, lambda: dst.data.copy_from_device_async(src.data, nbytes), 2 * BANDWIDTH_REPEATS)
    t_write = _cuda_best_seconds(cupy, lambda: dst.fill(1.0), 2 * BANDWIDTH_REPEATS)
    t_read = _cuda_best_seconds(cupy, lambda: src.sum(), 2 * BANDWIDTH_REPEATS)
    del src, dst
    cupy.get_default_memory_pool().free_all_blocks()
    return {
        "copy_bandwidth_Bps": max(methods.values()),
        "copy_bandwidth_methods_Bps": methods,
        "copy_bytes": 2 * nbytes,
        "write_bandwidth_Bps": nbytes / t_write,
        "read_bandwidth_Bps": nbytes / t_read,
        "method": (f"best of {2 * BANDWIDTH_REPEATS}, CUDA events: cudaMemcpyAsync device-to-device and cupy.copyto "
                   f"of a {nbytes >> 20} MiB float32 array (bytes read + bytes written over time); write = fill; "
                   "read = cupy.sum (information only)"),
    }


class Floors:
    """Per-device floor measurements of one run.

    The bandwidths are measured when a benchmark first asks for them and again when the run ends
    (``measure``); every figure derived from them uses the largest rate seen in the run, so the floors
    are the strictest the run supports (on shared or virtual machines the rate of a large copy can vary
    by where the buffers land). GEMM rates are measured once per problem size.
    """

    def __init__(self, copy_bytes: int | None = None):
        self._samples: dict[str, list[dict]] = {}
        self._gemm: dict[tuple, float] = {}
        self._copy_bytes = copy_bytes  # per array on a GPU (default 1 GiB); smaller only for smoke runs

    def measure(self, device: str) -> dict:
        sample = (_measure_cuda_floors(self._copy_bytes) if device.startswith("cuda")
                  else _measure_cpu_floors())
        sample["measured_at"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        self._samples.setdefault(device, []).append(sample)
        return sample

    def bandwidths(self, device: str) -> dict:
        """The best of every rate measured so far on ``device`` (measuring once if none was)."""
        if device not in self._samples:
            self.measure(device)
        samples = self._samples[device]
        best = {key: max(sample[key] for sample in samples)
                for key in samples[0] if key.endswith("_Bps") and not isinstance(samples[0][key], dict)}
        methods: dict[str, float] = {}
        for sample in samples:
            for method, rate in sample["copy_bandwidth_methods_Bps"].items():
                methods[method] = max(methods.get(method, 0.0), rate)
        best["copy_bandwidth_methods_Bps"] = methods
        return best

    def copy_bandwidth(self, device: str) -> float:
        return self.bandwidths(device)["copy_bandwidth_Bps"]

    def write_bandwidth(self, device: str) -> float:
        return self.bandwidths(device)["write_bandwidth_Bps"]

    def gemm_rate(self, device: str, n: int, d: int = MNIST_N_FEATURES) -> float:
        """float32 flop/s of X @ X.T for X of shape (n, d), best of a few, with the device's own library."""
        key = (device, n, d)
        if key not in self._gemm:
            rng = np.random.default_rng(0)
            X = rng.random((n, d), dtype=np.float32)
            flops = 2.0 * n * n * d
            if device.startswith("cuda"):
                import cupy

                Xd = cupy.asarray(X)
                seconds = _cuda_best_seconds(cupy, lambda: Xd @ Xd.T, GEMM_REPEATS + 2)
                del Xd
                cupy.get_default_memory_pool().free_all_blocks()
            else:
                X @ X.T
                seconds = _best_seconds(lambda: X @ X.T, GEMM_REPEATS, min_total=1.0)
            self._gemm[key] = flops / seconds
        return self._gemm[key]

    def as_dict(self, device: str) -> dict:
        if device not in self._samples:
            return {}
        out = self.bandwidths(device)
        out["rule"] = ("every floor uses the largest rate of the samples below (strictest floor); "
                       "copy bandwidth = max over the copy methods")
        out["samples"] = self._samples[device]
        gemm = {f"n={n},d={d}": rate for (dev, n, d), rate in sorted(self._gemm.items()) if dev == device}
        if gemm:
            out["gemm_float32_flops"] = gemm
        return out


def gemm_mode_seconds(backend, A, B, mode: str, repeats: int = 3) -> float:
    """Best time of ``A @ B.T`` as GEMM precision mode ``mode`` runs it (:mod:`kkmgpu.kernels.gemm`): the operands
    are prepared (for "3xtf32": split and stacked) before the clock starts, so the time is the one GEMM call, the
    floor of any kernel built on that product. CUDA events on a GPU, the host clock on the CPU. Where the working
    tree has no precision modes, "fp32" is the plain product and the TF32 modes raise ValueError."""
    xp = backend.xp
    try:
        from kkmgpu.kernels import gemm as _gemm
    except ImportError:
        _gemm = None
    if _gemm is not None and hasattr(_gemm, "left_operand"):
        left, right = _gemm.left_operand(A, mode, xp), _gemm.right_operand(B, mode, xp)
        out = xp.empty((A.shape[0], B.shape[0]), dtype=A.dtype)

        def run():
            _gemm.gemm(left, right, backend, mode, out=out)
    elif mode == "fp32":
        out = xp.empty((A.shape[0], B.shape[0]), dtype=A.dtype)

        def run():
            xp.matmul(A, B.T, out=out)
    else:
        raise ValueError(f"GEMM mode {mode!r} needs kkmgpu.kernels.gemm, which this working tree lacks")
    if backend.is_gpu:
        import cupy

        return _cuda_best_seconds(cupy, run, repeats)
    run()
    return _best_seconds(run, repeats, min_total=0.0)


def derive_floors(case: dict, floors: Floors, device: str) -> None:
    """Fill in a case's floors and ratios (in place) from the run's floor measurements.

    - ``exact_iterations``: floor = bytes(K) / copy bandwidth (ARCHITECTURE.md memory floor of one iteration);
    - ``kernel_build``: floor = max(2 n^2 d / GEMM rate, bytes(K) / write bandwidth);
    - ``fit_end_to_end``: floor = kernel build floor + n_iter x iteration floor.

    Benchmarks of other modules go to the floor deriver their module registered (``register_extension``).
    """
    deriver = _floor_deriver(case["benchmark"])
    if deriver is not None:
        deriver(case, floors, device)
        return
    bandwidths = floors.bandwidths(device)
    bytes_k, n, d = case["bytes_K"], case["n"], case["d"]
    iteration_floor = bytes_k / bandwidths["copy_bandwidth_Bps"]
    gemm_rate = floors.gemm_rate(device, n, d)
    gemm_floor = 2.0 * n * n * d / gemm_rate
    write_floor = bytes_k / bandwidths["write_bandwidth_Bps"]
    build_floor = max(gemm_floor, write_floor)
    times = case["time_s"]
    benchmark = case["benchmark"]
    if benchmark == "exact_iterations":
        case["floor_s"] = iteration_floor
        case["floor_inputs"] = {"bytes_K": bytes_k, "copy_bandwidth_Bps": bandwidths["copy_bandwidth_Bps"]}
        case["floor_by_copy_method_s"] = {method: bytes_k / rate for method, rate
                                          in bandwidths["copy_bandwidth_methods_Bps"].items()}
        case["ratio"] = times["per_iteration_best"] / iteration_floor
        case["ratio_median"] = times["per_iteration_median"] / iteration_floor
        marginal = times.get("per_iteration_marginal_wall")
        case["ratio_marginal_wall"] = None if marginal is None else marginal / iteration_floor
        if times.get("same_K_gemv") is not None:
            case["ratio_to_same_K_gemv"] = times["per_iteration_best"] / times["same_K_gemv"]
    elif benchmark == "kernel_build":
        case["floor_s"] = build_floor
        case["floor_parts_s"] = {"gemm": gemm_floor, "write": write_floor}
        case["floor_inputs"] = {"gemm_float32_flops": gemm_rate, "flops": 2.0 * n * n * d,
                                "write_bandwidth_Bps": bandwidths["write_bandwidth_Bps"]}
        case["ratio"] = times["best"] / build_floor
        case["ratio_median"] = times["median"] / build_floor
    elif benchmark == "fit_end_to_end":
        floor = build_floor + case["n_iter"] * iteration_floor
        case["floor_s"] = floor
        case["floor_parts_s"] = {"kernel_build": build_floor, "iterations": case["n_iter"] * iteration_floor}
        case["ratio"] = times["best"] / floor
        case["ratio_median"] = times["median"] / floor


# --------------------------------------------------------------------------------------------
# the result file


def _version(module_name: str, dist_names=()) -> str | None:
    module = sys.modules.get(module_name)
    if module is not None and getattr(module, "__version__", None):
        return str(module.__version__)
    for dist in dist_names or (module_name,):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _cupy_version() -> str | None:
    if "cupy" in sys.modules:
        return sys.modules["cupy"].__version__
    names = [dist.metadata["Name"] for dist in importlib.metadata.distributions()
             if (dist.metadata["Name"] or "").lower().startswith("cupy")]
    return _version("cupy", names) if names else None


def versions() -> dict:
    try:
        import kkmgpu

        kkmgpu_version = getattr(kkmgpu, "__version__", None) or _version("kkmgpu")
        kkmgpu_path = str(Path(kkmgpu.__file__).resolve().parent)
    except ImportError:
        kkmgpu_version, kkmgpu_path = None, None
    return {
        "python": platform.python_version(),
        "numpy": np.__version__,
        "numba": _version("numba"),
        "cupy": _cupy_version(),
        "kkmgpu": kkmgpu_version,
        "kkmgpu_path": kkmgpu_path,
        "scipy": _version("scipy"),
        "tslearn": _version("tslearn"),
        "pytest_benchmark": _version("pytest_benchmark", ("pytest-benchmark",)),
    }


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown cpu"


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def host_info() -> dict:
    info = {"cpu_model": cpu_model(), "cpu_count": cpu_count(), "platform": platform.platform()}
    try:
        info["memory_bytes"] = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        pass
    try:
        import numba

        info["numba_threads"] = numba.get_num_threads()
        info["numba_threading_layer"] = numba.config.THREADING_LAYER
    except ImportError:
        pass
    try:
        from threadpoolctl import threadpool_info

        info["threadpools"] = [{key: pool.get(key) for key in ("internal_api", "version", "num_threads",
                                                                 "threading_layer", "architecture")}
                               for pool in threadpool_info()]
    except ImportError:
        pass
    return info


def gpu_info() -> dict:
    import cupy

    device = cupy.cuda.Device()
    props = cupy.cuda.runtime.getDeviceProperties(device.id)
    name = props["name"]
    return {
        "name": name.decode() if isinstance(name, bytes) else str(name),
        "index": device.id,
        "memory_bytes": int(props["totalGlobalMem"]),
        "compute_capability": device.compute_capability,
        "multiprocessors": int(props["multiProcessorCount"]),
        "cuda_runtime": cupy.cuda.runtime.runtimeGetVersion(),
        "cuda_driver": cupy.cuda.runtime.driverGetVersion(),
    }


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def device_identity(device: str) -> dict:
    """Slug for the file name and a readable name: "cpu-amd-epyc-2core" or the GPU's name."""
    if device.startswith("cuda"):
        gpu = gpu_info()
        return {"slug": _slug(gpu["name"]), "name": gpu["name"], "kind": "cuda", "gpu": gpu}
    model, cores = cpu_model(), cpu_count()
    return {"slug": f"cpu-{_slug(model)}-{cores}core", "name": f"{model} ({cores} cores)", "kind": "cpu", "gpu": None}


class ForeignCpu:
    """CPU seconds that other processes used on this machine since ``start()`` (Linux /proc; None elsewhere).

    The benchmarks share the machine's cores with whatever else runs; this says how much did.
    """

    def __init__(self):
        self._start = self._sample()

    @staticmethod
    def _sample():
        try:
            with open("/proc/stat") as fh:
                fields = fh.readline().split()[1:]
            busy = sum(int(v) for v in fields[:8]) - int(fields[3]) - int(fields[4])  # minus idle, iowait
            ticks = os.sysconf("SC_CLK_TCK")
        except (OSError, ValueError, IndexError, AttributeError):
            return None
        own = os.times()
        return busy / ticks, own.user + own.system + own.children_user + own.children_system, time.monotonic()

    def seconds(self) -> dict | None:
        end = self._sample()
        if self._start is None or end is None:
            return None
        machine = end[0] - self._start[0]
        own = end[1] - self._start[1]
        wall = end[2] - self._start[2]
        foreign = max(machine - own, 0.0)
        return {"wall_s": wall, "own_cpu_s": own, "other_processes_cpu_s": foreign,
                "other_processes_cores": foreign / wall if wall > 0 else None}


def _load_average():
    try:
        return list(os.getloadavg())
    except (AttributeError, OSError):
        return None


class Recorder:
    """Cases recorded by the benchmarks of this session, grouped by device, written at session finish."""

    def __init__(self):
        self.started = datetime.datetime.now(datetime.timezone.utc)
        self.run_id = self.started.strftime("%Y-%m-%dT%H:%M:%SZ")
        self.cases: dict[str, list[dict]] = {}
        self.load_average_start = _load_average()
        self.foreign_cpu = ForeignCpu()
        self.finalized = False

    def add(self, device: str, case: dict) -> dict:
        case = {"id": case_id(case), "run_id": self.run_id, **case}
        self.cases.setdefault(device, []).append(case)
        return case

    def finalize(self, floors: Floors) -> None:
        """Measure each device's bandwidths once more, then derive every case's floors and ratios."""
        if self.finalized:
            return
        for device, cases in self.cases.items():
            if device == HOST:
                continue
            floors.measure(device)
            for case in cases:
                derive_floors(case, floors, device)
        for extension in EXTENSIONS.values():
            if extension.run_deriver is not None:
                extension.run_deriver(self)
        self.finalized = True


def case_id(case: dict) -> str:
    return f"{case['benchmark']}-n{case['n']}"


TARGETS = (
    # (benchmark, n, quantity, rule, limit): the targets on a 2-core CPU, reported, never asserted
    ("exact_iterations", 10000, "ratio", "<=", 2.0,
     "per-iteration time within 2x the memory floor at n = 10k"),
    ("tslearn_iterations", 5000, "speedup", ">=", 5.0,
     "at n = 5k at least 5x faster per iteration than tslearn.clustering.KernelKMeans"),
)


def _speedups(cases: list[dict]) -> None:
    """speedup = tslearn per-iteration time / kkmgpu per-iteration time at the same n (in place)."""
    exact = {case["n"]: case for case in cases if case["benchmark"] == "exact_iterations"}
    for case in cases:
        if case["benchmark"] != "tslearn_iterations":
            continue
        ours = exact.get(case["n"])
        if ours is None:
            case.pop("speedup", None)
            continue
        theirs = case["time_s"]
        mine = ours["time_s"]
        case["speedup"] = theirs["per_iteration_marginal"] / mine["per_iteration_best"]
        case["speedup_fit_over_n_iter"] = theirs["per_iteration_fit_over_n_iter"] / mine["per_iteration_best"]
        case["speedup_vs"] = {"id": ours["id"], "run_id": ours["run_id"],
                              "per_iteration_best": mine["per_iteration_best"],
                              "same_run": ours["run_id"] == case["run_id"]}


def _targets(identity: dict, cases: list[dict]) -> list[dict]:
    out = []
    by_id = {case["id"]: case for case in cases}
    for benchmark, n, quantity, rule, limit, text in TARGETS:
        case = by_id.get(f"{benchmark}-n{n}")
        value = None if case is None else case.get(quantity)
        met = None if value is None else (value <= limit if rule == "<=" else value >= limit)
        out.append({"target": text, "case": f"{benchmark}-n{n}", "quantity": quantity, "value": value,
                    "rule": rule, "limit": limit, "met": met,
                    "stated_for": "a 2-core CPU", "this_device": identity["name"]})
    for extension in EXTENSIONS.values():
        for target in extension.targets:
            if target.get("device_kind") not in (None, identity["kind"]):
                continue
            case = by_id.get(target["case"])
            value = None if case is None else case.get(target["quantity"])
            out.append({"target": target["target"], "case": target["case"], "quantity": target["quantity"],
                        "value": value, "rule": target["rule"], "limit": target["limit"],
                        "met": _meets(value, target["rule"], target["limit"]),
                        "stated_for": target.get("stated_for"), "this_device": identity["name"]})
    return out


def _write_device_file(recorder: Recorder, device: str, cases: list[dict], results_dir: Path,
                       floors: Floors, argv: list[str]) -> Path:
    identity = device_identity(device)
    path = results_dir / f"{datetime.date.today().isoformat()}-{identity['slug']}.json"
    run = {
        "run_id": recorder.run_id,
        "started": recorder.started.isoformat(timespec="seconds"),
        "finished": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": argv,
        # other processes on the machine skew every figure: the 1/5/15-minute load at start and end
        "load_average_start": recorder.load_average_start,
        "load_average_end": _load_average(),
        "cpu_use_during_run": recorder.foreign_cpu.seconds(),
        "versions": versions(),
        "host": host_info(),
        "floors": floors.as_dict(device),
    }
    old_runs, old_cases = [], []
    if path.exists():
        try:
            old = json.loads(path.read_text())
            if old.get("schema") == SCHEMA:
                old_runs, old_cases = old.get("runs", []), old.get("cases", [])
        except (OSError, ValueError):
            pass
    cases = copy.deepcopy(cases)
    new_ids = {case["id"] for case in cases}
    merged = [case for case in old_cases if case.get("id") not in new_ids] + cases
    merged.sort(key=lambda case: (case["n"], case["benchmark"]))
    _speedups(merged)
    used_runs = {case["run_id"] for case in merged}
    runs = [r for r in old_runs if r.get("run_id") in used_runs and r.get("run_id") != run["run_id"]] + [run]
    document = {
        "schema": SCHEMA,
        "device": identity["slug"],
        "device_name": identity["name"],
        "device_kind": identity["kind"],
        "cpu_model": run["host"]["cpu_model"],
        "gpu_name": identity["gpu"]["name"] if identity["gpu"] else None,
        "gpu": identity["gpu"],
        "versions": run["versions"],
        "targets": _targets(identity, merged),
        "runs": runs,
        "cases": merged,
    }
    results_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2, default=_json_default) + "\n")
    return path


def _json_default(value):
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def git_state(repo_root: Path = Path(__file__).resolve().parents[1]):
    """The commit of the working tree, and whether kkmgpu/ differs from it (None outside a git checkout)."""
    import subprocess

    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo_root, capture_output=True, text=True,
                                check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "kkmgpu"], cwd=repo_root,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return {"commit": commit, "kkmgpu_modified": bool(dirty)}


class ScriptRun:
    """One invocation of a bench script: its metadata and the cases it merges into its result file.

    The file is ``<results_dir>/<YYYY-MM-DD>-<device slug>-<topic>.json`` (results_dir: the argument, else
    ``$KKMGPU_BENCH_RESULTS_DIR``, else ``bench/results``); it is rewritten after every case, so a long run that
    is cut off keeps what it measured. A case replaces an earlier one with the same id (said on stderr once per
    case: a second run of the same command the same day replaces the first's figures); runs whose cases are all
    replaced are dropped. ``$KKMGPU_BENCH_TAG`` appends ``-<tag>`` to the file name, for a run kept beside
    another of the same day. Subclasses add per-case fields (:meth:`case_extra`), end-of-run metadata
    (:meth:`meta_extra`) and document fields (``document_extra``).
    """

    def __init__(self, device, argv, *, script: str, topic: str, schema: str, results_dir=None,
                 document_extra: dict | None = None, versions_extra: dict | None = None):
        self.device, self.schema = device, schema
        self.ident = device_identity(device)
        target = results_dir or os.environ.get("KKMGPU_BENCH_RESULTS_DIR", "").strip()
        folder = Path(target) if target else Path(__file__).resolve().parent / "results"
        tag = re.sub(r"[^A-Za-z0-9._-]+", "-", os.environ.get("KKMGPU_BENCH_TAG", "").strip()).strip("-")
        name = f"{datetime.date.today().isoformat()}-{self.ident['slug']}-{topic}" + (f"-{tag}" if tag else "")
        self.path = folder / f"{name}.json"
        self.replaced = set()   # ids of other runs' cases this run has replaced (said once each)
        started = datetime.datetime.now(datetime.timezone.utc)
        self.run_id = started.strftime("%Y-%m-%dT%H:%M:%SZ")
        self.document_extra = dict(document_extra or {})
        self.meta = {"run_id": self.run_id, "started": started.isoformat(timespec="seconds"),
                     "command": ["python", script, *argv], "versions": {**versions(), **(versions_extra or {})},
                     "host": host_info(), "load_average_start": list(os.getloadavg()), "git": git_state()}
        self.cases = []

    def case_extra(self) -> dict:
        return {}

    def meta_extra(self) -> dict:
        return {}

    def add(self, case):
        case = {"id": case["id"], "run_id": self.run_id, "device": self.device, **self.case_extra(), **case}
        self.cases = [c for c in self.cases if c["id"] != case["id"]] + [case]
        self.write()
        return case

    def write(self):
        document = {"schema": self.schema, "device": self.ident["slug"], "device_name": self.ident["name"],
                    "device_kind": self.ident["kind"], "gpu": self.ident["gpu"], "runs": [], "cases": []}
        if self.path.exists():
            try:
                old = json.loads(self.path.read_text())
                if old.get("schema") == self.schema:
                    document["runs"], document["cases"] = old.get("runs", []), old.get("cases", [])
            except (OSError, ValueError):
                pass
        ids = {c["id"] for c in self.cases}
        replaced = sorted(c["id"] for c in document["cases"] if c["id"] in ids and c.get("run_id") != self.run_id
                          and c["id"] not in self.replaced)
        if replaced:
            self.replaced.update(replaced)
            print(f"bench: {self.path.name}: this run replaces the earlier case(s) {', '.join(replaced)} of the same "
                  "id (set KKMGPU_BENCH_TAG to write a file of its own)", file=sys.stderr, flush=True)
        cases = sorted([c for c in document["cases"] if c["id"] not in ids] + self.cases, key=lambda c: c["id"])
        meta = dict(self.meta, finished=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                    load_average_end=list(os.getloadavg()), **self.meta_extra())
        used = {c["run_id"] for c in cases}
        runs = [r for r in document["runs"] if r["run_id"] in used and r["run_id"] != self.run_id] + [meta]
        document.update(versions=meta["versions"], runs=runs, cases=cases, **self.document_extra)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(document, indent=1, default=_json_default) + "\n")


def write_results(recorder: Recorder, floors: Floors, results_dir: Path, argv: list[str]) -> list[Path]:
    """Write (or merge into) one result file per benchmarked device; host-side cases go into every file."""
    recorder.finalize(floors)
    host_cases = recorder.cases.get(HOST, [])
    devices = [device for device in recorder.cases if device != HOST] or ["cpu"]
    return [_write_device_file(recorder, device, recorder.cases.get(device, []) + host_cases, results_dir,
                               floors, argv)
            for device in devices]


def _ms(seconds) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:9.2f}"


def _x(value) -> str:
    return "-" if value is None else f"{value:7.2f}"


def _busy(case) -> str:
    use = case and case.get("cpu_use_during_case")
    return "-" if not use or use.get("other_processes_cores") is None else f"{use['other_processes_cores']:.2f}"


def summary_lines(recorder: Recorder) -> list[str]:
    """A table of the session's cases for the terminal (times in ms, ratios to the floors)."""
    lines = []
    host = {case["n"]: case for case in recorder.cases.get(HOST, [])}
    scaling = ("exact_iterations", "kernel_build", "fit_end_to_end")  # bench_exact.py's; others: EXTENSIONS
    for device, cases in recorder.cases.items():
        if device == HOST:
            continue
        by_n: dict[int, dict] = {}
        for case in cases:
            if case["benchmark"] in scaling:
                by_n.setdefault(case["n"], {})[case["benchmark"]] = case
        if not by_n:
            continue
        lines.append(f"device {device}: per-iteration (exact_iterations), kernel build, end-to-end fit")
        lines.append(f"{'n':>6} {'iter ms':>9} {'floor ms':>9} {'ratio':>7} {'marg ms':>9} "
                     f"{'build ms':>9} {'floor ms':>9} {'ratio':>7} {'fit ms':>9} {'ratio':>7} "
                     f"{'tslearn ms':>10} {'speedup':>7} {'busy':>5}")
        for n in sorted(by_n):
            it = by_n[n].get("exact_iterations")
            kb = by_n[n].get("kernel_build")
            fe = by_n[n].get("fit_end_to_end")
            ts = host.get(n)
            speedup = None
            if it is not None and ts is not None:
                speedup = ts["time_s"]["per_iteration_marginal"] / it["time_s"]["per_iteration_best"]
            lines.append(" ".join([
                f"{n:>6}",
                _ms(it and it["time_s"]["per_iteration_best"]), _ms(it and it["floor_s"]), _x(it and it["ratio"]),
                _ms(it and it["time_s"]["per_iteration_marginal_wall"]),
                _ms(kb and kb["time_s"]["best"]), _ms(kb and kb["floor_s"]), _x(kb and kb["ratio"]),
                _ms(fe and fe["time_s"]["best"]), _x(fe and fe["ratio"]),
                f"{_ms(ts and ts['time_s']['per_iteration_marginal']):>10}", _x(speedup),
                f"{_busy(it):>5}",
            ]))
    if lines:
        lines.append("busy = cores used by other processes during the iteration case (0 = machine to itself)")
    for extension in EXTENSIONS.values():
        if extension.summary is not None:
            lines.extend(extension.summary(recorder))
    return lines
