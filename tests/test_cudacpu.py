"""cudacpu, the CUDA-on-CPU harness (tests/cudacpu): each planted bug (tests/cuda_planted) is reported by the mode
meant to catch it, correct kernels give the NumPy float64 result in every mode, and the real kernels_cuda/*.cu build
with every instantiation kkmgpu asks for, with the parameter lists of their signatures.

Sanitizer cases run tests/cuda_planted/drive.py in a child process under the runner (python tests/cudacpu
--sanitize ...), which preloads the runtime; a machine without libasan / libtsan fails them with what to install.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

import cudacpu

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
PLANTED = TESTS / "cuda_planted"
RUNNER = TESTS / "cudacpu"
DRIVER = PLANTED / "drive.py"
sys.path.insert(0, str(PLANTED))
import drive  # noqa: E402  (the driver's cases double as in-process checks)

OPTIONS = ("-std=c++14",)
REFERENCE_NAMES = ("scale<float>", "scale<double>")


def _source(name):
    return (PLANTED / name).read_text()


def _module(name, name_expressions=(), **kw):
    """A plain build (whatever CUDACPU_SANITIZE this process has) of a planted source."""
    return cudacpu.Module(_source(name), name_expressions, OPTIONS, sanitize="", source_path=PLANTED / name, **kw)


def _real_sources():
    from kkmgpu.kernels import kernel_kmeans_cuda as _gpu_kernels
    from kkmgpu.kernels import knn_cuda as _knn_gpu
    from kkmgpu.kernels import sparse_cuda as _sparse_gpu
    from kkmgpu.kernels import tiled_cuda as _tiled_gpu
    return [(_gpu_kernels.cuda_source(), _gpu_kernels.name_expressions(), ROOT / "kernels_cuda" / "kernel_kmeans.cu"),
            (_gpu_kernels.cuda_source("tiled.cu"), _tiled_gpu.name_expressions(), ROOT / "kernels_cuda" / "tiled.cu"),
            (_gpu_kernels.cuda_source("knn.cu"), _knn_gpu.name_expressions(), ROOT / "kernels_cuda" / "knn.cu"),
            (_gpu_kernels.cuda_source("sparse.cu"), _sparse_gpu.name_expressions(),
             ROOT / "kernels_cuda" / "sparse.cu")]


def _child_env():
    """This process's environment without any sanitizer setting (the runner adds the child's own)."""
    drop = ("LD_PRELOAD", "ASAN_OPTIONS", "UBSAN_OPTIONS", "TSAN_OPTIONS")
    return {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("CUDACPU_")
            or k in ("CUDACPU_CACHE", "CUDACPU_CXX")}


def _require_runtime(name):
    """Fail (never skip) when the compiler has no sanitizer runtime: CI must have it."""
    try:
        return cudacpu.sanitizer_runtime(name)
    except cudacpu.CudaCpuError as exc:
        pytest.fail(str(exc))


@pytest.fixture(scope="session")
def prebuilt():
    """Every library the tests load or the child processes use, built two at a time (a cold cache costs a few
    seconds per build; a warm one nothing)."""
    jobs = [(_source(n), names, OPTIONS, "", PLANTED / n) for n, names in
            [("reference.cu", REFERENCE_NAMES), ("missing_barrier.cu", ()), ("racy_accumulate.cu", ()),
             ("divergent_barrier.cu", ()), ("oob_read.cu", ()), ("device_errors.cu", ())]]
    jobs += [(code, names, ("-std=c++14",), "", path) for code, names, path in _real_sources()]
    for sanitize, files in (("address,undefined", ("reference.cu", "oob_read.cu", "shared_overrun.cu",
                                                   "undefined_behaviour.cu")),
                            ("thread", ("reference.cu", "missing_barrier.cu", "racy_accumulate.cu"))):
        jobs += [(_source(n), REFERENCE_NAMES if n == "reference.cu" else (), OPTIONS, sanitize, PLANTED / n)
                 for n in files]

    def one(job):
        code, names, options, sanitize, path = job
        return cudacpu.build(code, names, options, sanitize, source_path=path)

    with ThreadPoolExecutor(max_workers=max(1, min(4, os.cpu_count() or 1))) as pool:
        return list(pool.map(one, jobs))


def run_case(case, sanitize=None, schedule=None, timeout=300):
    """tests/cuda_planted/drive.py CASE in a child process under the runner; (exit status, stdout + stderr)."""
    cmd = [sys.executable, str(RUNNER)]
    if sanitize:
        cmd += ["--sanitize", sanitize]
    if schedule:
        cmd += ["--schedule", schedule]
    cmd += ["--", sys.executable, str(DRIVER), case]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=_child_env(), cwd=ROOT)
    return proc.returncode, proc.stdout + proc.stderr


# ---- correct kernels: the CUDA model, against NumPy ----------------------------------------------------------------
@pytest.mark.parametrize("grid,block", [((3, 2, 2), (4, 3, 2)), ((5,), (7,)), ((1, 4), (2, 1, 8)), ((2, 1, 3), (33,))])
def test_thread_and_block_indices_in_x_y_z(prebuilt, grid, block):
    g, b = (tuple(grid) + (1, 1))[:3], (tuple(block) + (1, 1))[:3]
    out = np.full(int(np.prod(g)) * int(np.prod(b)) * 12, 7777, np.uint32)
    _module("reference.cu", REFERENCE_NAMES).get_function("write_indices")(grid, block, (out,))
    np.testing.assert_array_equal(out.reshape(-1, 12), drive.expected_indices(g, b))


@pytest.mark.parametrize("schedule,seed", [("forward", None), ("reverse", None), ("random", 1), ("random", 2)])
def test_block_reduction_with_barriers_and_atomics_every_schedule(prebuilt, schedule, seed):
    rng = np.random.default_rng(11)
    x = rng.normal(size=3000)
    total = np.zeros(1)
    f = _module("reference.cu", REFERENCE_NAMES).get_function("block_sums")
    f((5,), (256,), (x, total, np.int64(x.size)), shared_mem=256 * 8, schedule=schedule, seed=seed)
    np.testing.assert_allclose(total[0], x.sum(), rtol=1e-12, atol=1e-12)


def test_warp_shuffle_ballot_any_all_reduction(prebuilt):
    rng = np.random.default_rng(12)
    mod = _module("reference.cu", REFERENCE_NAMES)
    for n, threads in ((100, 128), (64, 64), (45, 96)):  # a last warp partly past n; all lanes present
        x = rng.random(n)
        out = np.zeros(threads // 32 * 5)
        mod.get_function("warp_stats")((1,), (threads,), (x, out, np.int32(n)), schedule="random", seed=n)
        np.testing.assert_allclose(out.reshape(-1, 5), drive.expected_warp_stats(x, threads // 32), rtol=1e-12,
                                   atol=1e-12)


def test_disjoint_warp_masks_and_partial_warps(prebuilt):
    out = np.zeros(64, np.int32)
    _module("device_errors.cu").get_function("half_warps")((1,), (64,), (out,), schedule="reverse")
    lane = np.arange(64) % 32
    np.testing.assert_array_equal(out, (lane ^ 1) + 100 * 16)


def test_static_shared_memory_and_syncthreads_count(prebuilt):
    rng = np.random.default_rng(13)
    labels = rng.integers(-3, 10, size=1000).astype(np.int32)
    counts, in_range = np.zeros(7, np.uint64), np.zeros(1, np.uint32)
    _module("reference.cu", REFERENCE_NAMES).get_function("histogram")(
        (4,), (256,), (labels, np.int64(labels.size), counts, np.int32(7), in_range), schedule="random", seed=5)
    ok = (labels >= 0) & (labels < 7)
    np.testing.assert_array_equal(counts, np.bincount(labels[ok], minlength=7))
    assert in_range[0] == ok.sum()


def test_shared_memory_is_garbage_at_every_block(prebuilt):
    """Uninitialised shared memory reads as 0xff bytes (NaN) in every block, never a previous block's values."""
    out = np.zeros(3 * 32)
    _module("device_errors.cu").get_function("read_uninitialised")((3,), (32,), (out,), shared_mem=32 * 8)
    assert np.isnan(out).all()


@pytest.mark.parametrize("dtype,name", [(np.float32, "scale<float>"), (np.float64, "scale<double>")])
def test_template_instantiated_by_name_expression(prebuilt, dtype, name):
    rng = np.random.default_rng(14)
    x = rng.normal(size=1001).astype(dtype)
    y = np.zeros_like(x)
    mod = _module("reference.cu", REFERENCE_NAMES)
    assert [p.cxx for p in mod.kernels[name]] == [f"{name[6:-1]}*", f"const {name[6:-1]}*", name[6:-1], "long long"]
    mod.get_function(name)((3,), (128,), (y, x, dtype(-2.5), np.int64(x.size)))
    np.testing.assert_allclose(y, -2.5 * x.astype(np.float64), rtol=1e-6 if dtype == np.float32 else 1e-15)


def test_get_function_wants_the_exact_name_expression(prebuilt):
    mod = _module("reference.cu", REFERENCE_NAMES)
    for wrong in ("scale<float >", "scale<int>", "scale", "no_such_kernel"):
        with pytest.raises(cudacpu.CudaCpuError, match=re.escape(repr(wrong)) + ".*not a kernel of this module"):
            mod.get_function(wrong)
    assert mod.get_function("block_sums").name == "block_sums"  # extern "C": its plain name


def test_launch_from_another_os_thread(prebuilt):
    """Shared memory is per OS thread: a launch from a second thread uses its own copy, correctly."""
    rng = np.random.default_rng(15)
    x = rng.normal(size=2000)
    totals = [np.zeros(1) for _ in range(2)]
    f = _module("reference.cu", REFERENCE_NAMES).get_function("block_sums")
    threads = [threading.Thread(target=f, args=((4,), (128,), (x, t, np.int64(x.size))),
                                kwargs=dict(shared_mem=128 * 8)) for t in totals]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for t in totals:
        np.testing.assert_allclose(t[0], x.sum(), rtol=1e-12)


# ---- planted bugs, each caught by its mode --------------------------------------------------------------------------
def test_missing_barrier_changes_results_between_schedules(prebuilt):
    rng = np.random.default_rng(16)
    x = rng.random(64)
    f = _module("missing_barrier.cu").get_function("rotate_double")
    results = {}
    for schedule, seed in (("forward", 0), ("reverse", 0), ("random", 3)):
        y = np.zeros_like(x)
        f((2,), (32,), (x, y), shared_mem=32 * 8, schedule=schedule, seed=seed)
        results[schedule] = y
    want = 2 * np.concatenate([np.roll(x[:32], -1), np.roll(x[32:], -1)])
    assert not np.allclose(results["reverse"], results["forward"])
    assert not np.allclose(results["random"], results["forward"])
    assert any(not np.allclose(r, want) for r in results.values())


def test_schedule_comes_from_the_environment(prebuilt, monkeypatch):
    x = np.random.default_rng(17).random(32)
    f = _module("missing_barrier.cu").get_function("rotate_double")
    explicit, from_env = np.zeros(32), np.zeros(32)
    f((1,), (32,), (x, explicit), shared_mem=256, schedule="random", seed=9)
    monkeypatch.setenv("CUDACPU_SCHEDULE", "random")
    monkeypatch.setenv("CUDACPU_SEED", "9")
    f((1,), (32,), (x, from_env), shared_mem=256)
    np.testing.assert_array_equal(from_env, explicit)
    monkeypatch.setenv("CUDACPU_SCHEDULE", "backwards")
    with pytest.raises(cudacpu.CudaCpuError, match="'backwards'.*forward.*reverse.*random"):
        f((1,), (32,), (x, from_env), shared_mem=256)


def test_missing_barrier_is_a_data_race_for_threadsanitizer(prebuilt):
    _require_runtime("tsan")
    rc, out = run_case("missing_barrier", sanitize="thread")
    assert rc == 66, out
    assert "WARNING: ThreadSanitizer: data race" in out
    assert re.search(r"rotate_double .*missing_barrier\.cu:13", out), out  # the write ...
    assert re.search(r"rotate_double .*missing_barrier\.cu:11", out), out  # ... and the neighbour's read


def test_non_atomic_accumulation_across_blocks(prebuilt):
    """Blocks run one after another: a plain run adds correctly, only ThreadSanitizer sees the race."""
    rng = np.random.default_rng(18)
    x = rng.random(200)
    total = np.zeros(1)
    _module("racy_accumulate.cu").get_function("racy_total")((4,), (64,), (x, total, np.int64(x.size)))
    np.testing.assert_allclose(total[0], x.sum(), rtol=1e-12)
    _require_runtime("tsan")
    rc, out = run_case("racy", sanitize="thread")
    assert rc == 66, out
    assert "WARNING: ThreadSanitizer: data race" in out
    assert re.search(r"racy_total .*racy_accumulate\.cu:12", out), out
    assert not re.search(r"racy_accumulate\.cu:(7|8)\b", out), "a race on static __shared__ memory: false report"


def test_out_of_bounds_read_is_reported_by_addresssanitizer(prebuilt):
    x = np.random.default_rng(19).random(64).astype(np.float32)
    _module("oob_read.cu").get_function("shift_left")((1,), (64,), (x, np.zeros_like(x), np.int32(64)))  # silent
    _require_runtime("asan")
    rc, out = run_case("oob", sanitize="address,undefined")
    assert rc != 0 and "NOT CAUGHT" not in out, out
    assert "ERROR: AddressSanitizer: heap-buffer-overflow" in out, out
    assert re.search(r"#0 .* in shift_left .*oob_read\.cu:7", out), out


def test_shared_memory_past_the_launch_size_is_poisoned(prebuilt):
    _require_runtime("asan")
    rc, out = run_case("shared_overrun", sanitize="address,undefined")
    assert rc != 0 and "NOT CAUGHT" not in out, out
    assert "ERROR: AddressSanitizer: use-after-poison" in out, out
    assert re.search(r"#0 .* in bucket_sums .*shared_overrun\.cu:8", out), out


@pytest.mark.parametrize("case,message,line", [
    ("overflow", "signed integer overflow", 8),
    ("misaligned", "load of misaligned address .* which requires 8 byte alignment", 16)])
def test_undefined_behaviour_is_reported_by_ubsan(prebuilt, case, message, line):
    _require_runtime("asan")
    rc, out = run_case(case, sanitize="address,undefined")
    assert rc != 0 and "NOT CAUGHT" not in out, out
    assert re.search(rf"undefined_behaviour\.cu:{line}:\d+: runtime error: {message}", out), out


@pytest.mark.parametrize("schedule", ["forward", "reverse", "random"])
def test_divergent_barrier_is_an_error(prebuilt, schedule):
    x = np.random.default_rng(20).random(64).astype(np.float32)
    f = _module("divergent_barrier.cu").get_function("half_barrier")
    with pytest.raises(cudacpu.CudaCpuError) as info:
        f((2,), (32,), (x, np.zeros_like(x), np.int32(64)), shared_mem=32 * 4, schedule=schedule, seed=4)
    msg = str(info.value)
    assert re.search(r"block \(0,0,0\) thread \((\d+),0,0\)", msg), msg
    assert "divergent barrier" in msg and "divergent_barrier.cu:9" in msg, msg


def test_device_side_errors_name_block_thread_and_line(prebuilt):
    mod = _module("device_errors.cu")
    x = np.zeros(64, np.int32)
    cases = [
        ("two_barriers", (x,), r"block \(0,0,0\) thread \(\d+,0,0\): reached __syncthreads at device_errors\.cu:\d "
                               r"while 1 threads of its block wait at the one at device_errors\.cu:\d"),
        ("trap_one", (x,), r"block \(1,0,0\) thread \(3,0,0\): __trap\(\) called"),
        ("bad_shuffle", (x,), r"warp shuffle with mask 0x0000ffff reads lane 20"),
        ("warp_deadlock", (x,), r"deadlock: 31 threads wait at __syncthreads at device_errors\.cu:37, 1 at a warp"),
        ("checked", (np.array([1] * 40 + [-1] * 24, np.int32), np.int32(64)),
         r"block \(1,0,0\) thread \(8,0,0\): device-side assert\(x\[i\] >= 0\) failed at .*device_errors\.cu:17"),
    ]
    for name, args, pattern in cases:
        with pytest.raises(cudacpu.CudaCpuError, match=pattern):
            mod.get_function(name)((2,), (32,), args)


def test_lenient_mode_counts_returned_threads_as_arrived(prebuilt, monkeypatch):
    x = np.random.default_rng(21).random(32).astype(np.float32)
    y = np.zeros_like(x)
    monkeypatch.setenv("CUDACPU_LENIENT", "1")
    _module("divergent_barrier.cu").get_function("half_barrier")((1,), (32,), (x, y, np.int32(32)),
                                                                 shared_mem=32 * 4)
    np.testing.assert_array_equal(y[:16], np.roll(x[:16], -1))


# ---- arguments and launch configuration ------------------------------------------------------------------------------
def test_wrong_argument_types_are_refused_at_launch(prebuilt):
    mod = _module("reference.cu", REFERENCE_NAMES)
    f, g = mod.get_function("scale<float>"), mod.get_function("block_sums")
    x32, y32 = np.ones(8, np.float32), np.zeros(8, np.float32)
    n = np.int64(8)
    cases = [
        (f, (y32, np.ones(8), np.float32(2), n), r"argument 1 \(x: const float\*\) reads float32 elements; the array "
                                                 r"is float64"),
        (f, (y32, x32, np.float64(2), n), r"argument 2 \(a: float\) takes numpy\.float32, got numpy\.float64"),
        (f, (y32, x32, np.float32(2), np.int32(8)), r"argument 3 \(n: long long\) takes numpy\.int64, got "
                                                    r"numpy\.int32"),
        (f, (y32, x32, 2.0, n), r"argument 2 \(a: float\) takes numpy\.float32, got float 2\.0"),
        (f, (y32, x32, np.float32(2)), r"takes 4 arguments"),
        (f, (np.zeros(16, np.float32)[::2], x32, np.float32(2), n), r"argument 0 \(y: float\*\).*not C-contiguous"),
        (f, (y32, [1.0] * 8, np.float32(2), n), r"argument 1 \(x: const float\*\) takes a device array, got "
                                                r"builtins\.list"),
        (g, (np.ones(8), np.zeros(1).astype(">f8"), np.int64(8)), r"argument 1 \(total: double\*\).*byte order"),
    ]
    for fn, args, pattern in cases:
        with pytest.raises(cudacpu.CudaCpuError, match=pattern):
            fn((1,), (32,), args)
    readonly = np.zeros(8, np.float32)
    readonly.flags.writeable = False
    with pytest.raises(cudacpu.CudaCpuError, match=r"argument 0 \(y: float\*\): the array is read-only"):
        f((1,), (32,), (readonly, x32, np.float32(2), n))
    frozen = np.ones(8, np.float32)
    frozen.flags.writeable = False  # fine for a const pointee
    f((1,), (32,), (y32, frozen, np.float32(2), n))
    np.testing.assert_array_equal(y32, 2)


def test_standin_device_arrays_pass_through_host_attribute(prebuilt):
    class DeviceArray:  # what the CuPy stand-in's ndarray looks like to the harness
        def __init__(self, a):
            self._host = a
    y, x = DeviceArray(np.zeros(50)), DeviceArray(np.arange(50.0))
    _module("reference.cu", REFERENCE_NAMES).get_function("scale<double>")((1,), (64,), (y, x, np.float64(3),
                                                                                        np.int64(50)))
    np.testing.assert_array_equal(y._host, 3 * np.arange(50.0))


def test_launch_configuration_and_shared_memory_limits(prebuilt):
    mod = _module("device_errors.cu")
    out = np.zeros(2048)
    f = mod.get_function("read_uninitialised")
    with pytest.raises(cudacpu.CudaCpuError, match=r"refused: invalid launch configuration.*1024 threads"):
        f((1,), (2048,), (out,))
    with pytest.raises(cudacpu.CudaCpuError, match=r"block \(0, 32\) has a dimension outside"):
        f((1,), (0, 32), (out,))
    with pytest.raises(cudacpu.CudaCpuError, match=r"60000 bytes of dynamic shared memory exceed the kernel's "
                                                   r"limit of 49152"):
        f((1,), (32,), (out,), shared_mem=60000)
    f.max_dynamic_shared_size_bytes = 100_000
    mod.get_function("read_uninitialised")((1,), (32,), (out,), shared_mem=60000)  # an attribute of the kernel
    with pytest.raises(cudacpu.CudaCpuError, match=r"max_dynamic_shared_size_bytes=300000 is outside"):
        f.max_dynamic_shared_size_bytes = 300_000


def test_two_modules_keep_their_own_kernels(tmp_path):
    """Same kernel name in two libraries: each module launches its own (-fvisibility=hidden -fno-gnu-unique)."""
    template = 'extern "C" __global__ void fill(int* x) {{ x[threadIdx.x] = {}; }}'
    a, b = (cudacpu.Module(template.format(v), sanitize="") for v in (1, 2))
    xa, xb = np.zeros(4, np.int32), np.zeros(4, np.int32)
    a.get_function("fill")((1,), (4,), (xa,))
    b.get_function("fill")((1,), (4,), (xb,))
    assert (xa == 1).all() and (xb == 2).all()


# ---- the build cache ---------------------------------------------------------------------------------------------------
def test_build_cache_builds_each_source_once(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDACPU_CACHE", str(tmp_path))
    compiled = []
    real = cudacpu._compile
    monkeypatch.setattr(cudacpu, "_compile", lambda cmd, cwd: compiled.append(cmd) or real(cmd, cwd))
    code = 'extern "C" __global__ void twice(float* x) { x[threadIdx.x] *= 2; }\n'
    first = cudacpu.Module(code, sanitize="")
    assert len(compiled) == 1
    second = cudacpu.Module(code, sanitize="")
    assert len(compiled) == 1 and second.path == first.path  # no compiler run for the same source
    cudacpu.Module(code, options=("-std=c++14", "-DVARIANT=1"), sanitize="")  # other flags: another library
    assert len(compiled) == 2
    cudacpu.Module(code + "// another text\n", sanitize="")
    assert len(compiled) == 3
    assert sorted(p.name for p in first.path.parent.iterdir()) == sorted(
        ["kernels.so", "launcher.cpp", "source.cu", "cuda_cpu.h", "cuda_cpu_host.h"])  # no temporaries left


def test_concurrent_builds_of_one_source_are_safe(tmp_path):
    """Two processes building the same source into an empty cache both end with the same, loadable library."""
    code = 'extern "C" __global__ void inc(int* x) { x[threadIdx.x] += 1; }\n'
    script = ("import sys, numpy as np; sys.path.insert(0, sys.argv[1]); import cudacpu\n"
              "m = cudacpu.Module(sys.argv[2], sanitize=''); x = np.zeros(3, np.int32)\n"
              "m.get_function('inc')((1,), (3,), (x,)); print(m.path, x.sum())\n")
    env = dict(_child_env(), CUDACPU_CACHE=str(tmp_path))
    procs = [subprocess.Popen([sys.executable, "-c", script, str(TESTS), code], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env) for _ in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    assert len({o.split()[0] for o, _ in outs}) == 1 and all(o.split()[1] == "3" for o, _ in outs), outs


def test_compile_errors_are_reported_with_the_compiler_output(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDACPU_CACHE", str(tmp_path))
    with pytest.raises(cudacpu.CudaCpuError, match=r"(?s)could not build.*not_declared"):
        cudacpu.Module('extern "C" __global__ void k(int* x) { x[0] = not_declared; }', sanitize="")
    with pytest.raises(cudacpu.CudaCpuError, match="name expression.*not a C\\+\\+ template-id"):
        cudacpu.Module("", ['k"; system("x'], sanitize="")


# ---- the project's kernels ---------------------------------------------------------------------------------------------
_CXX_DTYPES = {"float": "float32", "double": "float64", "int": "int32", "long long": "int64",
               "unsigned long long": "uint64", "unsigned short": "uint16", "unsigned int": "uint32", "bool": "bool"}


def _cu_kernels(src):
    """{kernel: (template parameter names, parameter texts)} from the source, parsed here independently of cudacpu."""
    src = re.sub(r"//[^\n]*|/\*.*?\*/", " ", src, flags=re.S)
    out = {}
    for m in re.finditer(r"(template\s*<([^>]*)>\s*)?__global__\s+void\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?(\w+)"
                         r"\s*\(([^)]*)\)\s*\{", src):
        tparams = [p.split()[-1] for p in m.group(2).split(",")] if m.group(2) else []
        out[m.group(3)] = (tparams, [" ".join(p.split()) for p in m.group(4).split(",")])
    return out


def _expected_params(texts, tparams, targs):
    """(pointer, const, dtype) of each parameter, template arguments substituted."""
    subst = dict(zip(tparams, targs))
    params = []
    for text in texts:
        words = [subst.get(w, w) for w in re.findall(r"[A-Za-z_]\w*|\*", text.replace("__restrict__", ""))][:-1]
        pointer, const = "*" in words, words[0] == "const"
        base = " ".join(w for w in words if w not in ("const", "*"))
        params.append((pointer, const and pointer, _CXX_DTYPES[base]))
    return params


def test_real_kernels_build_with_every_name_expression_and_their_signatures(prebuilt):
    for code, names, path in _real_sources():
        mod = cudacpu.Module(code, names, ("-std=c++14",), sanitize="")
        assert sorted(mod.kernels) == sorted(names), path
        parsed = _cu_kernels(code)
        for name in names:
            base, targs = name.split("<", 1) if "<" in name else (name, None)  # segment_reduce: no template
            tparams, texts = parsed[base]
            want = _expected_params(texts, tparams, [] if targs is None else [a.strip() for a in targs[:-1].split(",")])
            got = [(p.pointer, p.const, p.dtype) for p in mod.kernels[name]]
            assert got == want, f"{path.name} {name}: registered {got}, the signature says {want}"
            assert [p.name for p in mod.kernels[name]] == [t.split()[-1] for t in texts]


@pytest.mark.parametrize("schedule", ["forward", "random"])
def test_real_kernels_against_float64_numpy(prebuilt, schedule, monkeypatch):
    monkeypatch.setenv("CUDACPU_SCHEDULE", schedule)
    monkeypatch.delenv("CUDACPU_SANITIZE", raising=False)
    checks = drive.Checks()
    drive.real_case(checks)
    assert not checks.failures, "\n".join(checks.failures)


# ---- every mode on the correct kernels, the runner -------------------------------------------------------------------
@pytest.mark.parametrize("sanitize,schedule", [("address,undefined", None), ("thread", None), (None, "reverse"),
                                               ("thread", "random")])
def test_correct_kernels_are_clean_in_every_mode(prebuilt, sanitize, schedule):
    if sanitize:
        _require_runtime("tsan" if sanitize == "thread" else "asan")
    rc, out = run_case("reference", sanitize=sanitize, schedule=schedule)
    assert rc == 0 and out.splitlines()[-1] == "OK", out
    assert "Sanitizer" not in out, out


def test_sanitized_library_without_runtime_says_how_to_run(prebuilt):
    if cudacpu._runtime_loaded("__asan_init"):
        pytest.skip("this process runs under AddressSanitizer")
    with pytest.raises(cudacpu.CudaCpuError, match=r"runtime is not loaded.*python tests/cudacpu --sanitize "
                                                   r"address,undefined"):
        cudacpu.Module(_source("oob_read.cu"), (), OPTIONS, sanitize="address,undefined",
                       source_path=PLANTED / "oob_read.cu")


def test_runner_sets_preload_and_options():
    asan, tsan = _require_runtime("asan"), _require_runtime("tsan")
    run = lambda *a: subprocess.run([sys.executable, str(RUNNER), *a], capture_output=True, text=True,  # noqa: E731
                                    env=_child_env(), timeout=60)
    out = run("--print-env", "--sanitize", "address,undefined", "--schedule", "random", "--seed", "4").stdout
    assert f"LD_PRELOAD={asan}" in out and "CUDACPU_SANITIZE=address,undefined" in out, out
    assert re.search(r"ASAN_OPTIONS=.*detect_leaks=0.*halt_on_error=1", out), out
    assert re.search(r"UBSAN_OPTIONS=.*halt_on_error=1.*print_stacktrace=1", out), out
    assert "CUDACPU_SCHEDULE=random" in out and "CUDACPU_SEED=4" in out, out
    out = run("--print-env", "--sanitize", "thread").stdout
    assert f"LD_PRELOAD={tsan}" in out and re.search(r"TSAN_OPTIONS=.*halt_on_error=1", out), out
    bad = run("--sanitize", "address,thread", "--", "true")
    assert bad.returncode == 2 and "cannot share a process" in bad.stderr
    bad = run("--sanitize", "memory", "--", "true")
    assert bad.returncode == 2 and "unknown sanitizer" in bad.stderr
    assert run("--", sys.executable, "-c", "import os, sys; sys.exit(7 if 'CUDACPU_SANITIZE' not in os.environ "
               "else 0)").returncode == 7  # exec'ed: the command's own exit status


# ---- issue 27: assign_labels' per-cluster counts made non-atomic ------------------------------------------------------
def _assign_labels_text(source):
    match = re.search(r"template <typename T>\n__global__ void assign_labels\(.*?\n}\n", source, re.S)
    assert match, "assign_labels not found"
    return match.group(0)


def test_planted_racy_counts_is_the_real_assign_labels_but_one_line():
    """racy_counts.cu must stay a copy of kernels_cuda/kernel_kmeans.cu's assign_labels with only the count's atomic
    removed, so that what TSan reports on it is what it would report on that mutant of the real kernel."""
    from kkmgpu.kernels import kernel_kmeans_cuda as _gpu_kernels
    real = _assign_labels_text(_gpu_kernels.cuda_source())
    planted = _assign_labels_text(_source("racy_counts.cu"))
    lines = [(a, b) for a, b in zip(real.splitlines(), planted.splitlines()) if a != b]
    assert len(real.splitlines()) == len(planted.splitlines()), "racy_counts.cu is out of date with kernel_kmeans.cu"
    assert [(a.strip(), b.split("//")[0].strip()) for a, b in lines] == [
        ("atomicAdd(&stats[1 + best], 1ULL);", "stats[1 + best] += 1ULL;")], lines


@pytest.mark.parametrize("schedule,seed", [("forward", None), ("reverse", None), ("random", 3)])
def test_non_atomic_cluster_counts_are_right_in_plain_runs(prebuilt, schedule, seed):
    """Blocks one after another, threads switching only at barriers: no schedule loses a count of the planted
    assign_labels (so the schedules cannot see this race; ThreadSanitizer, below, must)."""
    rng = np.random.default_rng(22)
    n, k = 1000, 3
    S, diag, inv, offset, labels = drive.racy_counts_inputs(rng, n, k)
    new, dist, stats = np.empty(n, np.int32), np.empty(n), np.zeros(1 + k, np.uint64)
    _module("racy_counts.cu", ("assign_labels<double>",)).get_function("assign_labels<double>")(
        (4,), (64,), (S, diag, inv, offset, labels, new, dist, stats, np.int64(n), np.int32(k)), schedule=schedule,
        seed=seed)
    d = diag[:, None] - 2 * S * inv + offset
    np.testing.assert_array_equal(new, d.argmin(1))
    np.testing.assert_array_equal(stats, [(new != labels).sum(), *np.bincount(new, minlength=k)])


def test_non_atomic_cluster_counts_are_a_data_race_for_threadsanitizer(prebuilt):
    _require_runtime("tsan")
    rc, out = run_case("racy_counts", sanitize="thread")
    assert rc == 66, out
    assert "WARNING: ThreadSanitizer: data race" in out
    assert re.search(r"assign_labels.*racy_counts\.cu:28", out), out
    assert not re.search(r"racy_counts\.cu:27\b", out), "the atomic move count reported as a race"
