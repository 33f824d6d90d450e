"""Predicted H100 seconds from the CuPy stand-in's cost ledger, printed beside every GPU measurement on file.

    python bench/gpu_model.py              # about a minute on a 2-core CPU; no GPU needed
    python bench/gpu_model.py --json F     # also write the predictions and measurements to F
    python bench/gpu_model.py --at abe4a49 # the model run on the code a result file measured (here 2026-11-24's)

The measured cases (bench/results/*-nvidia-*.json: the 2026-11-24 H100 run, and every newer GPU result file of
the same naming, ``bench/gpu_session.sh quick`` included) run here at small n on the CuPy stand-in of tests/standin,
whose cost ledger (``cupy.cuda.standin_ledger``, docs/gpu-emulation.md, "Cost ledger") counts per operation the
kernel launches, bytes read and written in device memory and matrix-product flops by compute mode, and per run the
device-to-host synchronisations and host <-> device transfers. Those counts are taken to the measured n and turned
into seconds by the constants below; the table puts prediction and measurement side by side, so the model's
error is known.

Taking counts to the measured n. Each case runs at three small sizes of the same shape (d, k, l, moved fraction,
GEMM mode) and every count (per operation: launches, read and written bytes, flops per mode; per run: syncs,
transfers) is fitted by a polynomial in n of the case's degree (2 where work is n^2 d or n^2: the build, the dense
and tiled iterations; 1 for CATS, n k l d), then evaluated at the measured n (never below 0); launches, syncs and
copies are those of the largest small size (a note is printed where they differ between the sizes). What the small
sizes cannot show: more row tiles at large n (the tiled engine's 536-row tiles at 10^6 points; a few ms of launches
against 43 s), library heuristics that change with size (the sizes are chosen so that segment_sums fills the
device as at 70,000 points and the moved columns reach the tensor-core modes), and anything the ledger does not
see (host work, below).

Time of a phase = sum over operations (summed by name) of max(roofline, launches x LAUNCH_S), the roofline the larger of
flops / rate of the compute mode and (bytes read + written) / COPY_BPS; plus syncs x SYNC_S, host-to-device copies
x H2D_COPY_S, and transfer bytes / PCIE_BPS. Host work between device calls (NumPy on labels, Python) is invisible
to the ledger: where it dominates, the model predicts too little (CATS at 10^6 points sorted its labels on the host
on 2026-11-24, ~77 ms of its 105 ms).

End to end (MNIST-70k): the build, plus the fit's other set-up work (validation, centring, the initial cluster sums)
scaled linearly, plus the measured number of iterations, each costed at 70,000 points by its kind in a stand-in run
of the same call on 1,536 MNIST points: a full pass, or an incremental one after the same fraction of points moved.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import inspect
import io
import json
import os
import re
import sys
import time
import warnings
from pathlib import Path

import numpy as np

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
RESULTS_DIR = BENCH_DIR / "results"

# ----------------------------------------------------------------------------------------------- constants
#: the device modelled: an H100 80GB HBM3 (SXM, 132 SMs), the card of bench/results/2026-11-24-nvidia-h100-*
DEVICE = "NVIDIA H100 80GB HBM3"
#: matrix-product rates (flop/s) per compute mode. fp32: cuBLAS SGEMM as measured on 2026-11-24 (49-53 TFLOP/s at
#: the engine's shapes). tf32: half the bf16 tensor-core rate measured on the lent H100 machines (798 TFLOP/s, an
#: 8192^3 product on random data); the datasheet's dense TF32 is 495. fp64: FP64 tensor cores, taken at the
#: measured FP32 rate (datasheet 67). fp16: the measured bf16 rate. int: CUDA-core rate.
GEMM_FLOPS = {"fp32": 51e12, "tf32": 399e12, "fp64": 51e12, "fp16": 798e12, "int": 51e12}
#: device memory traffic (bytes read + written per second): the copy bandwidth measured on 2026-11-24 (2.99e12)
COPY_BPS = 2.99e12
#: seconds per kernel launch (CuPy's Python dispatch and the launch; a kernel shorter than this is launch-bound)
LAUNCH_S = 5e-6
#: seconds per device-to-host synchronisation (drained queue, round trip, the host waiting)
SYNC_S = 15e-6
#: seconds per host-to-device copy (pageable memory, staged), and transfer bandwidth over PCIe
H2D_COPY_S = 10e-6
PCIE_BPS = 25e9

K = 10
D = 784
CATS_L = 32
#: GEMM mode of the 2026-11-24 runs (plain FP32: TF32 was off by default then) and of result files that name none
LEGACY_MODE = "fp32"


# ----------------------------------------------------------------------------------------------- the stand-in

#: kkmgpu's modules before the layout of issue 15 (the 2026-11-24 code), for --at
_OLD_LAYOUT = {"engine.lloyd": "_lloyd", "engine.dense": "_lloyd", "engine.tiled": "_tiled",
               "kernels.blocks": "_kernels", "kernels.spec": "_kernels", "backend.device": "_backend",
               "kernels.gemm": None}


def kk(module: str):
    """``kkmgpu.<module>`` of the kkmgpu imported, in its own layout (the old flat one for --at an older commit)."""
    import importlib

    import kkmgpu

    if not (Path(kkmgpu.__file__).parent / "engine").is_dir():
        if _OLD_LAYOUT.get(module, module) is None:
            raise ImportError(f"kkmgpu.{module} did not exist yet")
        module = _OLD_LAYOUT.get(module, module)
    return importlib.import_module(f"kkmgpu.{module}")



def _standin():
    """The stand-in's ``cupy`` (it replaces any CuPy for this process: the ledger is the stand-in's)."""
    if os.environ.get("KKMGPU_GPU_MODEL_AT"):  # kkmgpu of another commit: no module of an editable install may leak in
        sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in type(f).__name__.lower()]
    for name in [m for m in sys.modules if m in ("cupy", "cupyx") or m.startswith(("cupy.", "cupyx."))]:
        del sys.modules[name]
    sys.path.insert(0, str(REPO_ROOT / "tests" / "standin"))
    sys.path.insert(0, str(BENCH_DIR))
    import cupy

    if not hasattr(cupy.cuda, "standin_ledger"):
        raise SystemExit("the CuPy stand-in of tests/standin has no cost ledger (cupy.cuda.standin_ledger)")
    return cupy


class Profile:
    """A ledger's counts as a flat {key: number}: ("total", field) for syncs and transfers, (operation, field) for
    each operation's launches, read / written bytes and flops per mode."""

    TOTALS = ("syncs", "h2d_copies", "h2d_bytes", "d2h_bytes")

    def __init__(self, values=None):
        self.values = dict(values or {})

    @classmethod
    def of(cls, ledger):
        values = {("total", f): float(getattr(ledger.counts, f)) for f in cls.TOTALS}
        for name, c in ledger.by_name.items():
            values[(name, "launches")] = float(c.launches)
            values[(name, "read")] = float(c.read_bytes)
            values[(name, "written")] = float(c.written_bytes)
            for mode, flops in c.flops.items():
                values[(name, f"flops:{mode}")] = float(flops)
        return cls(values)

    def _combine(self, other, sign):
        keys = set(self.values) | set(other.values)
        return Profile({k: self.values.get(k, 0.0) + sign * other.values.get(k, 0.0) for k in keys})

    def __add__(self, other):
        return self._combine(other, 1)

    def __sub__(self, other):
        return self._combine(other, -1)

    def __mul__(self, factor):
        return Profile({k: v * factor for k, v in self.values.items()})

    __rmul__ = __mul__

    def __truediv__(self, divisor):
        return self * (1.0 / divisor)

    def get(self, key):
        return self.values.get(key, 0.0)

    def scale_work(self, factor):
        """Bytes and flops times ``factor``; launches, syncs and copies as they are (work that grows as n)."""
        fixed = ("launches", "syncs", "h2d_copies")
        return Profile({k: v if k[1] in fixed else v * factor for k, v in self.values.items()})

    def operations(self):
        return sorted({name for name, _ in self.values if name != "total"})

    def count(self, field):
        return sum(v for (name, f), v in self.values.items() if f == field and name != "total")


#: counts taken at the largest size, not fitted: they do not grow with n at these sizes (one row tile), and a
#: data-dependent branch taken at one size only must not extrapolate to hundreds of launches
COUNTED = ("launches", "syncs", "h2d_copies")


def at_size(sizes, profiles, n, degree):
    """The profile at ``n``: every byte and flop count fitted by a polynomial of ``degree`` in n through
    ``profiles`` (one per size), evaluated at n, at least 0; launches, syncs and copies those of the largest size."""
    keys = set().union(*(p.values for p in profiles))
    x = np.asarray(sizes, dtype=np.float64) / max(sizes)
    out = {}
    for key in keys:
        y = [p.get(key) for p in profiles]
        if key[1] in COUNTED:
            out[key] = y[int(np.argmax(sizes))]
            continue
        coeffs = np.polyfit(x, y, min(degree, len(sizes) - 1))
        out[key] = max(0.0, float(np.polyval(coeffs, n / max(sizes))))
    return Profile(out)


def seconds(profile):
    """{component: predicted seconds} of a profile (see the module docstring)."""
    kernels = launch_bound = 0.0
    for name in profile.operations():
        flops = sum(v / GEMM_FLOPS[f.split(":", 1)[1]] for (op, f), v in profile.values.items()
                    if op == name and f.startswith("flops:"))
        roofline = max(flops, (profile.get((name, "read")) + profile.get((name, "written"))) / COPY_BPS)
        launches = profile.get((name, "launches")) * LAUNCH_S
        kernels += max(roofline, launches)
        launch_bound += max(0.0, launches - roofline)
    out = {"work": kernels - launch_bound, "launch-bound": launch_bound,
           "syncs": profile.get(("total", "syncs")) * SYNC_S,
           "transfers": profile.get(("total", "h2d_copies")) * H2D_COPY_S +
           (profile.get(("total", "h2d_bytes")) + profile.get(("total", "d2h_bytes"))) / PCIE_BPS}
    out["total"] = sum(out.values())
    return out


# ----------------------------------------------------------------------------------------------- cases


class Cases:
    """The measured cases run on the stand-in at small n, each a function of the size giving a :class:`Profile`,
    and their fits (``model(kind, mode)``: n -> Profile)."""

    def __init__(self, cp):
        import kkmgpu
        from kkmgpu import datasets

        self.cp, self.kkmgpu = cp, kkmgpu
        self.backend = kk("backend.device").resolve_device("cuda")
        X, _ = datasets.load_mnist(n_samples=9600, random_state=0)
        self.mnist = np.ascontiguousarray(X, dtype=np.float32)
        self.models = {}
        self.notes = []
        self.default_mode = self._default_mode()

    def _default_mode(self):
        try:
            gemm = kk("kernels.gemm")

            return gemm.DEFAULT_PRECISION if "gemm_precision" in inspect.signature(self.kkmgpu.fit).parameters \
                else LEGACY_MODE
        except ImportError:
            return LEGACY_MODE

    def mode_kw(self, fn, mode):
        if "gemm_precision" in inspect.signature(fn).parameters:
            return {"gemm_precision": mode}
        if mode != LEGACY_MODE:
            raise ValueError(f"this kkmgpu has no gemm_precision: mode {mode} cannot run")
        return {}

    def ledger(self):
        return self.cp.cuda.standin_ledger()

    def fit(self, *args, **kwargs):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return self.kkmgpu.fit(*args, device="cuda", **kwargs)

    def model(self, kind, mode=None):
        """n -> Profile for a case kind (fitted on first use)."""
        key = (kind, mode)
        if key not in self.models:
            sizes, degree, run = getattr(self, f"case_{kind}")(mode)
            profiles = [run(n) for n in sizes]
            for field in COUNTED:
                counts = [p.count(field) if field == "launches" else p.get(("total", field)) for p in profiles]
                if len(set(counts)) > 1:
                    self.notes.append(f"{kind} ({mode}): {field} at n = {', '.join(map(str, sizes))}: "
                                      f"{', '.join(f'{c:g}' for c in counts)} (the largest size's taken)")
            self.models[key] = lambda n, s=sizes, p=profiles, d=degree: at_size(s, p, n, d)
        return self.models[key]

    # -- the dense engine (MNIST, float32, rbf) ---------------------------------------------------------------

    def _K(self, n, mode=LEGACY_MODE):
        Xd = self.cp.asarray(self.mnist[:n])
        return self.kkmgpu.kernel_matrix(Xd, kernel="rbf", device="cuda", dtype="float32",
                                         **self.mode_kw(self.kkmgpu.kernel_matrix, mode))

    def case_build(self, mode):
        """kernel_matrix(X) with X on the device (bench_gpu_engine test_kernel_build, bench_quick engine-build)."""
        def run(n):
            Xd = self.cp.asarray(self.mnist[:n])
            with self.ledger() as led:
                self.kkmgpu.kernel_matrix(Xd, kernel="rbf", device="cuda", dtype="float32",
                                          **self.mode_kw(self.kkmgpu.kernel_matrix, mode))
            return Profile.of(led)
        return (512, 1024, 1536), 2, run

    def _operator(self, n):
        return kk("engine.dense").DenseKernelOperator(self._K(n), self.cp.ones(n, dtype=np.float64), self.backend)

    def case_dense(self, mode):
        """One full iteration, labels fixed (bench_gpu_engine test_iteration, bench_quick engine-iteration-full):
        sizes where segment_sums' pieces fill the device as at 70k (its partial sums a constant size)."""
        def run(n):
            op, labels = self._operator(n), self.cp.asarray(_partition(n))
            with self.ledger() as led:
                _rest_of_iteration(op, op.cluster_sums(labels, K), labels, self.cp)
            return Profile.of(led)
        return (1536, 2048, 2560), 2, run

    def case_incremental(self, fraction):
        """One incremental iteration after ``fraction`` of the points moved (bench_quick engine-iteration-
        incremental-*): update of S, totals, assignment."""
        def run(n):
            op, labels_h = self._operator(n), _partition(n)
            labels = self.cp.asarray(labels_h)
            new = self.cp.asarray(_moved(labels_h, fraction))
            S = self.cp.zeros((n, K), dtype=np.float64)  # the update adds to S: its values do not change the counts
            kw = {"n_moved": max(1, int(round(fraction * n)))} if getattr(op, "takes_moved_count", False) else {}
            with self.ledger() as led:
                _rest_of_iteration(op, op.update_cluster_sums(S, labels, new, **kw), new, self.cp)
            return Profile.of(led)
        return (1000, 2000, 3000), 2, run

    def incremental(self, n, moved):
        """An incremental iteration at n after ``moved`` points moved: linear in the moved count between the
        fitted fractions 1% and 10%."""
        low, high = self.model("incremental", 0.01)(n), self.model("incremental", 0.1)(n)
        t = (moved / n - 0.01) / (0.1 - 0.01)
        return low + (high - low) * t

    # -- the tiled engine (bench_tiled case_scaling, bench_quick tiled-pass) ----------------------------------

    def _tiled(self, n, mode):
        TiledKernelOperator = kk("engine.tiled").TiledKernelOperator
        blocks, kspec = kk("kernels.blocks"), kk("kernels.spec")
        Xd = self.cp.asarray(self.mnist[:n])
        kw = {"precision": mode} if "precision" in inspect.signature(kspec.resolve_kernel).parameters else {}
        spec = kspec.with_center(kspec.resolve_kernel("rbf", X=Xd, xp=self.cp, **kw), Xd, self.cp)
        A = blocks.prepare_features(Xd, spec, self.backend, np.float32)
        op_kw = {"tf32": mode == "tf32"} if "tf32" in inspect.signature(TiledKernelOperator).parameters else {}
        return TiledKernelOperator(A, spec, self.cp.ones(n, dtype=np.float64), self.backend, **op_kw)

    def case_tiled(self, mode):
        def run(n):
            op, labels = self._tiled(n, mode), self.cp.asarray(_partition(n))
            with self.ledger() as led:
                _rest_of_iteration(op, op.cluster_sums(labels, K), labels, self.cp)
            return Profile.of(led)
        return (300, 600, 900), 2, run

    def case_tiled_incremental(self, mode):
        """update_cluster_sums after 1% of the points moved (bench_tiled's incremental_1pct_seconds), at sizes where
        the moved columns (n / 100) are at least 32, so that the products take the tensor-core modes as at 10^6."""
        def run(n):
            op, labels_h = self._tiled(n, mode), _partition(n)
            labels = self.cp.asarray(labels_h)
            S = self.cp.zeros((n, K), dtype=np.float64)  # the update adds to S: its values do not change the counts
            new = self.cp.asarray(_moved(labels_h, 0.01))
            kw = {"n_moved": max(1, int(round(0.01 * n)))} if getattr(op, "takes_moved_count", False) else {}
            with self.ledger() as led:
                op.update_cluster_sums(S, labels, new, **kw)
            return Profile.of(led)
        return (3200, 6400, 9600), 2, run

    # -- CATS (bench_cats time_cats_iterations, bench_quick cats) ---------------------------------------------

    def case_cats(self, mode):
        """One CATS iteration at l = 32 on a 784-dimensional mixture: fits of 2 and 3 iterations from the same
        random partition, differenced."""
        def run(n):
            X = self.cp.asarray(_mixture(n))
            init = _partition(n)
            profiles = []
            for max_iter in (2, 3):
                with self.ledger() as led:
                    self.fit(X, K, method="cats", n_samples_per_cluster=CATS_L, init=init, theta=0.0,
                             max_iter=max_iter, random_state=0, **self.mode_kw(self.kkmgpu.fit, mode))
                profiles.append(Profile.of(led))
            return profiles[1] - profiles[0]
        return (1000, 2000, 3000), 1, run

    # -- end to end (MNIST, bench_gpu_engine test_fit_end_to_end, bench_quick engine-e2e-warm) ----------------

    def e2e_plan(self, n=1536):
        """(set-up profile at n, [("full" | "incremental", moved fraction) per iteration], n_iter) of the measured
        call on n MNIST points in the library's default GEMM mode: the kinds read off verbose=True and fit's update
        rule, the set-up = the run minus its iterations' profiles (the build included)."""
        lloyd = kk("engine.lloyd")
        key = ("e2e", self.default_mode)
        if key in self.models:
            return self.models[key]
        mode = self.default_mode
        Xd = self.cp.asarray(self.mnist[:n])
        out = io.StringIO()
        with self.ledger() as led, contextlib.redirect_stdout(out):
            r = self.fit(Xd, K, kernel="rbf", init="random", random_state=0, n_init=1, max_iter=300, tol=1e-6,
                         dtype="float32", verbose=True, **self.mode_kw(self.kkmgpu.fit, mode))
        moved = [int(m) for m in re.findall(r"iteration \d+: objective \S+, (\d+) points moved", out.getvalue())]
        kinds, since_full = [], 0
        refresh = getattr(lloyd, "FULL_REFRESH_EVERY", 16)
        for m in moved:
            if 2.0 * m / n < 1.0 and since_full < refresh:
                kinds.append(("incremental", m / n))
                since_full += 1
            else:
                kinds.append(("full", m / n))
                since_full = 0
        iterations = Profile()
        for kind, fraction in kinds:
            iterations = iterations + (self.model("dense")(n) if kind == "full" else
                                       self.incremental(n, fraction * n))
        self.models[key] = (Profile.of(led) - iterations, kinds, r.n_iter)
        return self.models[key]

    def e2e(self, N, mode, n_iter):
        """Phases at N: (build, other set-up, iterations) profiles. The set-up holds the first cluster sums (a full
        pass at N) and work on X, which grows as n (validation, centring, the final checks)."""
        n = 1536
        setup, kinds, _ = self.e2e_plan(n)
        build, dense = self.model("build", mode), self.model("dense")
        other = dense(N) + (setup - self.model("build", self.default_mode)(n) - dense(n)).scale_work(N / n)
        per = Profile()
        for kind, fraction in kinds:
            per = per + (self.model("dense")(N) if kind == "full" else self.incremental(N, fraction * N))
        return {"build": build(N), "set-up": other, "iterations": per * (n_iter / max(1, len(kinds)))}


def _partition(n, seed=0):
    return kk("engine.lloyd").random_partition(n, K, np.random.default_rng(seed))


def _moved(labels_h, fraction, seed=1):
    """``labels_h`` with ``fraction`` of the points moved to the next cluster (as bench_tiled and bench_quick)."""
    n = labels_h.shape[0]
    moved = np.random.default_rng(seed).choice(n, max(1, int(round(fraction * n))), replace=False)
    new = labels_h.copy()
    new[moved] = (new[moved] + 1) % K
    return new


def _mixture(n, seed=0):
    """bench_cats.gaussian_mixture: K blobs in D dimensions, float32."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(scale=0.5, size=(K, D)).astype(np.float32)
    return centres[rng.integers(0, K, n)] + rng.standard_normal((n, D), dtype=np.float32)


def _rest_of_iteration(op, S, labels, xp):
    """What a Lloyd iteration does after its cluster sums: the totals, the assignment, its transfer to the host
    (the loop's own functions, in the form the working tree has: bench_quick.rest_of_iteration's rule)."""
    lloyd = kk("engine.lloyd")
    if hasattr(lloyd, "_device_totals"):
        totals = lloyd._device_totals(op, S, labels, K, xp)
        step = lloyd._assign(op, S, totals, labels, K, None)
        return lloyd._fetch(op.backend, totals, step, K)
    sizes, within, _ = lloyd._totals(op, S, labels, K, xp)
    if not hasattr(lloyd, "_assign"):  # the 2026-11-24 loop called the operator's twin itself
        return op.backend.ops.assign_labels(S, op.diag, sizes, within, labels)
    return lloyd._assign(op, S, sizes, within, labels, np.empty(K, dtype=np.int64))


# ----------------------------------------------------------------------------------------------- measurements


def measurements(paths):
    """Every GPU measurement the model covers, from result files: dicts with source, case, n, mode, seconds and
    what the prediction needs (moved points, iterations)."""
    out = []
    for path in paths:
        doc = json.loads(Path(path).read_text())
        source = Path(path).name.replace(".json", "")
        for case in doc.get("cases", []):
            for m in _extract(case):
                out.append({"source": source, **m})
    return out


def _extract(case):
    cid, n = str(case.get("id", "")), case.get("n")
    mode = case.get("gemm_precision") or ("tf32" if case.get("tf32") else LEGACY_MODE)
    best = (case.get("time_s") or {}).get("best")
    if case.get("implementation") == "kkmgpu":  # bench_gpu_engine (2026-11-24)
        if case.get("benchmark") == "engine_kernel_build":
            yield dict(case="build", n=n, mode=mode, seconds=best)
        elif case.get("benchmark") == "engine_iteration":
            yield dict(case="dense", n=n, mode=mode, seconds=best)
        elif case.get("benchmark") == "engine_fit_end_to_end":
            yield dict(case="e2e", n=n, mode=mode, seconds=best, n_iter=case.get("n_iter"),
                       timings=case.get("timings_best_round"))
    if re.fullmatch(r"(scaling|big)-n\d+(-tf32)?", cid) and "iteration_seconds_best" in case:  # bench_tiled
        yield dict(case="tiled", n=n, mode=mode, seconds=case["iteration_seconds_best"])
        yield dict(case="tiled_incremental", n=n, mode=mode, seconds=case.get("incremental_1pct_seconds"))
    if cid.startswith("scaling-cats-") and case.get("l") == CATS_L and case.get("d") == D:  # bench_cats scaling
        yield dict(case="cats", n=n, mode=mode, seconds=case.get("per_iteration_best_s"))
    if case.get("seconds") is not None and n:  # bench_quick (gpu_session.sh quick)
        if cid.startswith("engine-build-"):
            yield dict(case="build", n=n, mode=mode, seconds=case["seconds"])
        elif cid == "engine-iteration-full":
            yield dict(case="dense", n=n, mode=mode, seconds=case["seconds"])
        elif cid.startswith("engine-iteration-incremental-"):
            yield dict(case="incremental", n=n, mode=mode, seconds=case["seconds"], moved=case.get("moved"))
        elif cid.startswith("engine-e2e-warm-"):
            yield dict(case="e2e", n=n, mode=mode, seconds=case["seconds"], n_iter=case.get("n_iter"),
                       timings=case.get("timings"))
        elif cid.startswith("tiled-pass-"):
            yield dict(case="tiled", n=n, mode=mode, seconds=case["seconds"])
            yield dict(case="tiled_incremental", n=n, mode=mode, seconds=case.get("incremental_1pct_s"))
        elif cid.startswith("cats-") and case.get("l") == CATS_L:
            yield dict(case="cats", n=n, mode=mode, seconds=case["seconds"])


#: issue 26's targets (point 7), predicted in the library's default mode: (case, n, extra, target seconds)
TARGETS = [("e2e", 70_000, {"n_iter": 95}, 0.25), ("build", 70_000, {}, None), ("dense", 70_000, {}, None),
           ("incremental", 70_000, {"moved": 70}, None), ("incremental", 70_000, {"moved": 700}, None),
           ("incremental", 70_000, {"moved": 7_000}, None), ("tiled", 200_000, {}, None),
           ("tiled", 1_000_000, {}, 12.0), ("tiled_incremental", 1_000_000, {}, None),
           ("cats", 1_000_000, {}, 0.030)]

LABELS = {"build": "kernel build", "dense": "dense iteration (full)", "incremental": "dense iteration, incremental",
          "e2e": "exact end to end", "tiled": "tiled iteration", "tiled_incremental": "tiled update, 1% moved",
          "cats": f"CATS iteration, l={CATS_L}"}
ORDER = list(LABELS)


def predict(cases, m):
    """{phase: seconds components} predicted for measurement ``m``."""
    kind, n, mode = m["case"], m["n"], m["mode"]
    if kind == "e2e":
        return {phase: seconds(p) for phase, p in cases.e2e(n, mode, m.get("n_iter") or 95).items()}
    if kind == "incremental":
        return {"iteration": seconds(cases.incremental(n, m.get("moved") or n // 100))}
    if kind == "dense":
        return {"iteration": seconds(cases.model("dense")(n))}
    return {kind: seconds(cases.model(kind, mode)(n))}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", default=str(RESULTS_DIR), help="folder of *-nvidia-*.json result files")
    parser.add_argument("--json", help="write predictions and measurements here")
    parser.add_argument("--at", metavar="COMMIT", help="run the model on this commit's kkmgpu (git archive into a "
                        "temporary folder, with this tree's stand-in and model): the code the measurements ran")
    args = parser.parse_args(argv)
    if args.at:
        return _run_at(args)
    t0 = time.perf_counter()
    paths = sorted(glob.glob(os.path.join(args.results, "*-nvidia-*.json")))
    found = [m for m in measurements(paths) if m["seconds"] and m["n"]]
    cp = _standin()
    cases = Cases(cp)
    print(f"gpu_model: {DEVICE}; GEMM {', '.join(f'{m} {r / 1e12:g}' for m, r in GEMM_FLOPS.items())} TFLOP/s; "
          f"memory {COPY_BPS / 1e12:g} TB/s; launch {LAUNCH_S * 1e6:g} us; sync {SYNC_S * 1e6:g} us; "
          f"H2D copy {H2D_COPY_S * 1e6:g} us + {PCIE_BPS / 1e9:g} GB/s")
    print(f"{len(found)} measurements in {len(paths)} result files; the library's default GEMM mode now: "
          f"{cases.default_mode}\n")
    header = f"{'case':31s} {'n':>9s} {'mode':>6s} {'measured':>10s} {'predicted':>10s} {'meas/pred':>9s}  " \
             "predicted parts (work / launch-bound / syncs / transfers)"
    rows = []
    for source in sorted({m["source"] for m in found}):
        print(f"== {source}\n{header}")
        for m in sorted((m for m in found if m["source"] == source), key=lambda m: (ORDER.index(m["case"]), m["n"])):
            try:
                phases = predict(cases, m)
            except Exception as exc:  # the working tree's internals moved: say so, go on
                print(f"{LABELS[m['case']]:31s} {m['n']:9,d} {m['mode']:>6s} {_s(m['seconds'])}  not modelled: "
                      f"{type(exc).__name__}: {exc}")
                continue
            total = sum(p["total"] for p in phases.values())
            parts = "; ".join(f"{phase} {_s(p['total']).strip()} = " + " / ".join(
                _s(p[c]).strip() for c in ("work", "launch-bound", "syncs", "transfers"))
                for phase, p in phases.items())
            print(f"{LABELS[m['case']]:31s} {m['n']:9,d} {m['mode']:>6s} {_s(m['seconds'])} {_s(total)} "
                  f"{m['seconds'] / total:9.2f}  {parts}")
            if m.get("timings"):
                print(f"{'':31s} {'':9s} {'':6s} measured phases: " + ", ".join(
                    f"{phase} {_s(v).strip()}" for phase, v in m["timings"].items() if phase != "total"))
            rows.append({**m, "predicted_s": total, "phases": phases})
        print()
    print(f"== predictions for the working tree in its default GEMM mode ({cases.default_mode}), beside issue 26's "
          f"targets\n{header.replace('measured', '  target').replace('meas/pred', 'targ/pred')}")
    for kind, n, extra, target in TARGETS:
        m = {"case": kind, "n": n, "mode": cases.default_mode, **extra}
        try:
            phases = predict(cases, m)
        except Exception as exc:
            print(f"{LABELS[kind]:31s} {n:9,d} {m['mode']:>6s} not modelled: {type(exc).__name__}: {exc}")
            continue
        total = sum(p["total"] for p in phases.values())
        what = ("dense incremental" if kind == "incremental" else LABELS[kind]) + \
            (f", {extra['moved']:,d} moved" if "moved" in extra else "")
        print(f"{what:31s} {n:9,d} {m['mode']:>6s} {_s(target)} {_s(total)} "
              f"{'' if target is None else f'{target / total:9.2f}':9s}  " + "; ".join(
                  f"{phase} " + " / ".join(_s(p[c]).strip() for c in ("work", "launch-bound", "syncs", "transfers"))
                  for phase, p in phases.items()))
        rows.append({**m, "target_s": target, "predicted_s": total, "phases": phases})
    print()
    e2e = [k for k in cases.models if k[0] == "e2e"]
    for key in e2e:
        _, kinds, n_iter = cases.models[key]
        full = sum(1 for kind, _ in kinds if kind == "full")
        print(f"end to end ({key[1]}): the stand-in's run on 1,536 MNIST points took {n_iter} iterations ({full} full "
              f"passes, {len(kinds) - full} incremental); each costed at the measured n, scaled to its n_iter")
    for note in cases.notes:
        print(f"note: {note}")
    print(f"[gpu_model: {time.perf_counter() - t0:.0f} s on this machine]")
    if args.json:
        Path(args.json).write_text(json.dumps({"constants": {
            "device": DEVICE, "gemm_flops": GEMM_FLOPS, "copy_bps": COPY_BPS, "launch_s": LAUNCH_S, "sync_s": SYNC_S,
            "h2d_copy_s": H2D_COPY_S, "pcie_bps": PCIE_BPS}, "rows": rows}, indent=1) + "\n")


def _run_at(args):
    """This script, this tree's stand-in, and the kkmgpu of ``args.at`` (exported with git archive)."""
    import shutil
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory(prefix="gpu-model-") as tmp:
        archive = subprocess.run(["git", "-C", str(REPO_ROOT), "archive", args.at], capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", tmp], input=archive.stdout, check=True)
        shutil.rmtree(os.path.join(tmp, "tests", "standin"), ignore_errors=True)
        shutil.copytree(REPO_ROOT / "tests" / "standin", os.path.join(tmp, "tests", "standin"))
        shutil.copy(__file__, os.path.join(tmp, "bench", "gpu_model.py"))
        package_sources = os.path.join(tmp, "kkmgpu", "kernels_cuda")  # as the wheel installs them
        if not os.path.exists(package_sources):
            os.symlink(os.path.join(tmp, "kernels_cuda"), package_sources)
        env = {**os.environ, "PYTHONPATH": tmp, "KKMGPU_GPU_MODEL_AT": args.at}
        mnist = (REPO_ROOT.parent / "shared" / "data" / "mnist").resolve()  # the default folder, seen from here
        if mnist.is_dir():
            env.setdefault("KKMGPU_MNIST_DIR", str(mnist))
        command = [sys.executable, os.path.join(tmp, "bench", "gpu_model.py"), "--results", args.results]
        print(f"gpu_model at {args.at}: kkmgpu from {tmp}", flush=True)
        return subprocess.run(command + (["--json", args.json] if args.json else []), env=env, cwd=tmp).returncode


def _s(value):
    if value is None:
        return f"{'-':>10s}"
    return f"{value * 1e3:8.2f}ms" if value < 1 else f"{value:9.2f}s"


if __name__ == "__main__":
    sys.exit(main())
