"""Validation at the API boundary: every check that names the value and the rule lives here."""

from __future__ import annotations

import math
import numbers

import numpy as np

from kkmgpu import _warn
from kkmgpu.kernels import gemm as _gemm
from kkmgpu.methods import registry as _methods
from kkmgpu.backend.device import Backend, check_fits, is_cupy_array, work_bytes
from kkmgpu.backend.magnitude import largest_magnitude

UPDATES = ("auto", "full", "incremental")
INIT_NAMES = ("k-means++", "random")
DTYPES = (np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.float16))


def check_dtype(dtype) -> np.dtype:
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise ValueError(f"dtype={dtype!r} is not valid; use 'float32', 'float64' or 'float16'.") from None
    if dt not in DTYPES:
        raise ValueError(f"dtype={dtype!r} is not valid; use 'float32', 'float64' or 'float16'.")
    return dt


def check_int(value, name, minimum=None, maximum=None) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name}={value!r} must be an integer.")
    value = int(value)
    if minimum is not None and value < minimum:
        raise ValueError(f"{name}={value} must be >= {minimum}.")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name}={value} must be <= {maximum}.")
    return value


def check_params(*, method, max_iter, tol, n_init, init, update="auto"):
    if not isinstance(method, str) or method not in _methods.METHODS:  # the registered methods (kkmgpu._api)
        raise ValueError(f"method={method!r} is not available; use one of {list(_methods.METHODS)}.")
    if update not in UPDATES:
        raise ValueError(f"update={update!r} is not valid; use one of {list(UPDATES)}.")
    max_iter = check_int(max_iter, "max_iter", minimum=1)
    if isinstance(tol, bool) or not isinstance(tol, numbers.Real) or not np.isfinite(tol) or tol < 0:
        raise ValueError(f"tol={tol!r} must be a finite number >= 0.")
    if isinstance(init, str):
        if init not in INIT_NAMES:
            raise ValueError(f"init={init!r} is not valid; use one of {list(INIT_NAMES)} or an array of labels.")
    if n_init != "auto":
        n_init = check_int(n_init, "n_init", minimum=1)
    return max_iter, float(tol), n_init


def as_array(X, name="X"):
    """NumPy or CuPy array from ``X``, numeric, not complex; what scikit-learn's ``check_array`` accepts.

    Array-likes become NumPy; a numeric object array and a pandas object with nullable columns (``Int64``,
    ``Float64``, ``boolean``) become float64, their missing values (``None``, ``pd.NA``) NaN, which
    :func:`check_data` then rejects as non-finite; a boolean array becomes 0/1 float32.
    """
    if not is_cupy_array(X):
        try:
            X = _pandas_to_numpy(X)
            X = np.asarray(X)
            if X.dtype == object:
                X = X.astype(np.float64)
        except (ValueError, TypeError) as exc:
            raise ValueError(f"{name} could not be converted to a numeric array: {exc}") from None
    if X.dtype.kind not in "biuf":
        raise ValueError(f"{name} has dtype {X.dtype}; a real numeric array is required.")
    if X.dtype.kind == "b":
        X = X.astype(np.float32)
    return X


def _pandas_to_numpy(X):
    """A pandas DataFrame or Series with extension (nullable) columns as float64 with NaN for pd.NA; anything
    else unchanged. Pandas is not imported: a pandas object is recognised by its module."""
    if not type(X).__module__.startswith("pandas") or not hasattr(X, "to_numpy"):
        return X
    dtypes = list(X.dtypes) if hasattr(X, "columns") else [X.dtype]
    if all(isinstance(dt, np.dtype) for dt in dtypes):
        return X
    return X.to_numpy(dtype=np.float64, na_value=np.nan)


def check_data(X, backend: Backend, *, name="X", square=False, kernel_rows=False):
    """Validate a 2-D finite array on ``backend``; returns it on the device (dtype unchanged).

    A sparse matrix (scipy.sparse or cupyx.scipy.sparse, CSR/CSC/COO) is accepted only as a square
    kernel matrix (``square=True``), or with ``kernel_rows=True`` as rows of one (predict's kernel between new
    and training points, any shape), and comes back as canonical CSR on the device.
    """
    from kkmgpu.engine import sparse as _sparse

    if _sparse.is_sparse(X):
        return _check_sparse_kernel(X, backend, name, square, kernel_rows)
    X = as_array(X, name)
    if X.ndim != 2:
        raise ValueError(f"{name} must be 2-D (n_samples, n_features); got ndim={X.ndim} with shape {X.shape}.")
    n, d = X.shape
    if n < 1 or d < 1:
        raise ValueError(f"{name} has shape {X.shape}; at least one sample and one feature are required.")
    if square and n != d:
        raise ValueError(f"{name} must be a square kernel matrix (n_samples, n_samples); got shape {X.shape}.")
    if backend.is_gpu and not is_cupy_array(X):  # the copy to the device is the run's first large allocation
        check_fits(X.nbytes, backend, f"{name} ({n} x {d} {X.dtype.name}) on the device",
                   advice="Pass fewer points, or use a device with more free memory.")
    X = backend.asarray(X)
    if X.dtype.kind == "f" and not all_finite(X, backend):
        raise ValueError(f"{name} contains NaN or infinity (missing values such as None or pd.NA count as NaN); "
                         "every value must be finite.")
    return X


def _check_sparse_kernel(X, backend: Backend, name, square, kernel_rows=False):
    from kkmgpu.engine import sparse as _sparse

    if not (square or kernel_rows):
        raise TypeError(f"{name} is a sparse {type(X).__name__}; sparse input is accepted only as a kernel matrix "
                        "(kernel='precomputed'). Pass dense features otherwise.")
    if kernel_rows and not square:
        if X.ndim != 2 or min(X.shape) < 1:
            raise ValueError(f"{name} must be kernel rows (n_new, n_train) with at least one of each; got shape "
                             f"{X.shape}.")
    elif X.ndim != 2 or X.shape[0] != X.shape[1] or X.shape[0] < 1:
        raise ValueError(f"{name} must be a square kernel matrix (n_samples, n_samples); got shape {X.shape}.")
    if X.dtype.kind not in "biuf":
        raise ValueError(f"{name} has dtype {X.dtype}; a real numeric sparse matrix is required.")
    dtype = None if X.dtype.kind == "f" else np.float64
    X = _sparse.to_backend_csr(X, backend, dtype=dtype)
    if not _sparse.all_finite_sparse(X, backend):
        raise ValueError(f"{name} contains NaN or infinity; every value must be finite.")
    return X


def all_finite(X, backend: Backend, block_bytes=2**26) -> bool:
    """True if every entry of the 2-D array X is finite (one host sync).

    Row blocks of at most ``block_bytes`` of X, and of WORK_FRACTION of the free memory, bound the boolean
    temporary (X may take most of the device).
    """
    xp = backend.xp
    row = max(1, X.shape[1] * X.dtype.itemsize)
    step = max(1, work_bytes(block_bytes, backend, minimum=row) // row)
    finite = True
    for i in range(0, X.shape[0], step):
        finite = finite & xp.isfinite(X[i:i + step]).all()
    return bool(finite)


def check_symmetric(K, backend: Backend, rtol=None, block=None, name="X"):
    """Raise ValueError unless K equals K.T within a tolerance for its dtype; returns max |K|.

    Compares the tiles above the diagonal with the transposed tiles below it, so no n x n temporary
    is made; the maxima stay on the device until one host synchronisation per tile row.
    """
    from kkmgpu.engine import sparse as _sparse

    if _sparse.is_sparse(K):
        return _sparse.check_symmetric_sparse(K, backend, rtol, name=name)
    xp = backend.xp
    if rtol is None:
        rtol = {np.dtype(np.float16): 2e-3, np.dtype(np.float32): 1e-5}.get(np.dtype(K.dtype), 1e-10)
    if block is None:
        block = 8192 if backend.is_gpu else 1024  # cache-sized tiles on the CPU, few launches on a GPU
        # one block x block temporary beside K: within WORK_FRACTION of the free memory (K may take most of it)
        itemsize = np.dtype(K.dtype).itemsize
        block = max(1, min(block, math.isqrt(work_bytes(block * block * itemsize, backend) // itemsize)))
    n = K.shape[0]
    # max |K| of row blocks from their bits (no temporary; a GPU's flush of subnormals to zero cannot hide them)
    max_abs = max((largest_magnitude(K[i:i + block]) for i in range(0, n, block)), default=0.0)
    scale = max_abs or 1.0
    for i0 in range(0, n, block):
        i1 = min(n, i0 + block)
        diff = 0.0
        for j0 in range(i0, n, block):
            j1 = min(n, j0 + block)
            tile = K[i0:i1, j0:j1] - K[j0:j1, i0:i1].T
            xp.abs(tile, out=tile)
            diff = xp.maximum(diff, tile.max())
        diff = float(diff)
        if diff > rtol * scale:
            raise ValueError(f"{name} is not a symmetric kernel matrix (max |K - K.T| = {diff:.3g} > "
                             f"{rtol:g} * max|K|); kernel k-means needs a symmetric kernel.")
    return max_abs


#: Rows of X on which a callable kernel's symmetry is checked (evenly spaced: no random draws).
CALLABLE_SYMMETRY_ROWS = 256


def check_callable_symmetric(X, spec, backend: Backend, dtype, n_rows=CALLABLE_SYMMETRY_ROWS):
    """Raise ValueError unless a callable kernel gives a symmetric matrix on up to ``n_rows`` evenly spaced rows
    of X (in the compute ``dtype``), with :func:`check_symmetric`'s tolerance: a precomputed K and a callable's
    K are held to the same rule, at O(n_rows^2 d) cost and without the n x n matrix (CATS and the tiled engine
    never form it)."""
    from kkmgpu.kernels import blocks as _kernels

    n = X.shape[0]
    m = min(n, n_rows)
    rows = backend.asarray(np.unique(np.linspace(0, n - 1, m).round().astype(np.int64)))
    A = _kernels.prepare_features(X[rows], spec, backend, dtype)
    block = _kernels.kernel_block(A, A, spec, backend)
    check_symmetric(block, backend, name=f"the kernel callable's matrix on {int(rows.shape[0])} rows of X")


def check_k(k, n):
    if isinstance(k, bool) or not isinstance(k, numbers.Integral):
        raise TypeError(f"k={k!r} must be an integer number of clusters.")
    k = int(k)
    if k < 1:
        raise ValueError(f"k={k} must be >= 1.")
    if k > n:
        raise ValueError(f"n_samples={n} should be >= k={k}.")
    return k


def check_sample_weight(sample_weight, n):
    """Host float64 weights (n,), all finite and >= 0 with a positive sum; ones when None."""
    if sample_weight is None:
        return np.ones(n, dtype=np.float64)
    w = sample_weight.get() if is_cupy_array(sample_weight) else np.asarray(sample_weight)
    if w.ndim != 1 or w.shape[0] != n:
        raise ValueError(f"sample_weight has shape {w.shape}; expected ({n},), one weight per sample.")
    if w.dtype.kind not in "biuf":
        raise ValueError(f"sample_weight has dtype {w.dtype}; real numbers are required.")
    w = w.astype(np.float64)
    if not np.isfinite(w).all():
        raise ValueError("sample_weight contains NaN or infinity; weights must be finite.")
    if (w < 0).any():
        raise ValueError(f"sample_weight has negative values (min {w.min():g}); weights must be >= 0.")
    if w.sum() <= 0:
        raise ValueError("sample_weight sums to 0; at least one weight must be positive.")
    return w


def normalize_weights(w):
    """(w / scale, scale) with ``scale`` the power of two at or below max(w): the largest weight in [1, 2).

    The clustering does not depend on a common scale of the weights; normalised weights keep every sum
    in range (weights of 1e38 or 1e-50 give the labels of weights of 1). Dividing by a power of two is
    exact, so ordinary weights (largest in [1, 2), e.g. all ones) are unchanged.
    """
    top = float(w.max())
    if top <= 0 or 1.0 <= top < 2.0:
        return w, 1.0
    scale = 2.0 ** math.floor(math.log2(top))
    return w / scale, scale


def check_init(init, n, k, n_init):
    """Resolve init and n_init. Returns (init, n_init) with init a string or host int32 labels."""
    if isinstance(init, str):
        if n_init == "auto":
            n_init = 10 if init == "random" else 1
        return init, n_init
    labels = init.get() if is_cupy_array(init) else np.asarray(init)
    if labels.ndim != 1 or labels.shape[0] != n:
        raise ValueError(f"init labels have shape {labels.shape}; expected ({n},), one label per sample.")
    if labels.dtype.kind not in "biu":
        if labels.dtype.kind == "f" and np.isfinite(labels).all() and (labels == np.round(labels)).all():
            labels = labels.astype(np.int64)
        else:
            raise ValueError(f"init labels have dtype {labels.dtype}; integer labels in [0, {k}) are required.")
    if n and (labels.min() < 0 or labels.max() >= k):
        raise ValueError(f"init labels must lie in [0, k={k}); got values in [{labels.min()}, {labels.max()}].")
    if n_init != "auto" and n_init > 1:
        _warn.warn(f"n_init={n_init} ignored: explicit initial labels give one deterministic run.", UserWarning)
    return labels.astype(np.int32), 1


def make_rng(random_state) -> np.random.Generator:
    if random_state is None or isinstance(random_state, (numbers.Integral, np.random.SeedSequence)):
        if isinstance(random_state, numbers.Integral) and random_state < 0:
            raise ValueError(f"random_state={random_state} must be >= 0.")
        return np.random.default_rng(random_state)
    if isinstance(random_state, np.random.Generator):
        return random_state
    if isinstance(random_state, np.random.RandomState):
        return np.random.default_rng(random_state.randint(0, 2**31 - 1))
    raise TypeError(f"random_state={random_state!r} must be None, an int, a numpy Generator or RandomState.")


def check_cats_params(method, *, n_samples_per_cluster, window, theta, rcond, exact_objective, n, k, dtype):
    """Resolve CATS's parameters; they are errors with any other method."""
    given = {name: value for name, value in (("n_samples_per_cluster", n_samples_per_cluster),
                                             ("window", window), ("theta", theta), ("rcond", rcond))
             if value is not None}
    if method != "cats":
        if given:
            raise ValueError(f"{', '.join(given)} {'applies' if len(given) == 1 else 'apply'} only to method='cats' "
                             f"(method={method!r}).")
        return None
    from kkmgpu.engine.sampled import default_samples_per_cluster

    l = default_samples_per_cluster(n, k) if n_samples_per_cluster is None else \
        check_int(n_samples_per_cluster, "n_samples_per_cluster", minimum=1)
    window = 5 if window is None else check_int(window, "window", minimum=2)
    if theta is None:
        theta = 1e-6
    if isinstance(theta, bool) or not isinstance(theta, numbers.Real) or not np.isfinite(theta) or theta < 0:
        raise ValueError(f"theta={theta!r} must be a finite number >= 0.")
    if rcond is None:
        rcond = 1e-12 if dtype == np.float64 else 1e-6
    if isinstance(rcond, bool) or not isinstance(rcond, numbers.Real) or not (0 <= rcond < 1):
        raise ValueError(f"rcond={rcond!r} must be a number in [0, 1).")
    if not isinstance(exact_objective, bool):
        raise TypeError(f"exact_objective={exact_objective!r} must be True or False.")
    return {"l": l, "window": window, "theta": float(theta), "rcond": float(rcond)}


def check_trim_params(method, *, vote_fraction, slack, h, max_size=None, defaults):
    """Resolve the trimming parameters (method="trimmed" only; errors with any other method); ``defaults``:
    :data:`kkmgpu.trimming.DEFAULTS`."""
    given = [name for name, value in (("trim_vote_fraction", vote_fraction), ("trim_slack", slack),
                                      ("trim_h", h), ("trim_max_size", max_size)) if value is not None]
    if method != "trimmed":
        if given:
            raise ValueError(f"{', '.join(given)} {'applies' if len(given) == 1 else 'apply'} only to method='trimmed' "
                             f"(method={method!r}).")
        return None
    vote_fraction, slack, h, max_size = check_trim_values(
        defaults["vote_fraction"] if vote_fraction is None else vote_fraction,
        defaults["slack"] if slack is None else slack, defaults["h"] if h is None else h,
        defaults["max_size"] if max_size is None else max_size, prefix="trim_")
    return {"vote_fraction": vote_fraction, "slack": slack, "h": h, "max_size": max_size}


def check_trim_values(vote_fraction, slack, h, max_size, prefix=""):
    """Validated (vote_fraction, slack, h, max_size); messages name the arguments with ``prefix`` (fit's "trim_")."""
    if isinstance(vote_fraction, bool) or not isinstance(vote_fraction, numbers.Real) \
            or not (0 < vote_fraction <= 1):
        raise ValueError(f"{prefix}vote_fraction={vote_fraction!r} must be a number in (0, 1] (the paper's 0.1: "
                         "each row votes with the top 10% of its derivative).")
    if isinstance(slack, bool) or not isinstance(slack, numbers.Real) or not (0 <= slack <= 1):
        raise ValueError(f"{prefix}slack={slack!r} must be a number in [0, 1] (the paper's 0.01: rows are cut at "
                         "their (w_i + slack n)-th largest value).")
    h = check_int(h, f"{prefix}h", minimum=1)
    if isinstance(max_size, bool) or not isinstance(max_size, numbers.Real) or not (0 < max_size <= 1):
        raise ValueError(f"{prefix}max_size={max_size!r} must be a number in (0, 1]: the largest candidate "
                         "cluster size as a fraction of n (1 = every size, as the paper).")
    return float(vote_fraction), float(slack), h, float(max_size)


def check_eigen_params(method, *, n_components, n, dtype):
    """Validate ``n_components`` (method="eigen" only): None or an integer in [1, n_samples]."""
    if method != "eigen":
        if n_components is not None:
            raise ValueError(f"n_components={n_components!r} only applies to method='eigen' (method={method!r}).")
        return None
    if dtype == np.float16:
        raise ValueError("dtype='float16' is not supported by method='eigen'; the eigendecomposition needs "
                         "'float32' or 'float64'.")
    if n_components is not None:
        n_components = check_int(n_components, "n_components", minimum=1)
        if n_components > n:
            raise ValueError(f"n_components={n_components} must be <= n_samples={n} (K has n_samples eigenpairs).")
    return n_components


ENGINES = ("auto", "dense", "tiled")


def check_engine(engine, *, method, precomputed):
    """Validate ``engine`` (the exact method's kernel engine)."""
    if not isinstance(engine, str) or engine not in ENGINES:
        raise ValueError(f"engine={engine!r} is not valid; use one of {list(ENGINES)}.")
    if engine != "auto" and method != "exact":
        raise ValueError(f"engine={engine!r} only applies to method='exact' (method={method!r}).")
    if engine == "tiled" and precomputed:
        raise ValueError("engine='tiled' recomputes kernel tiles from the features, and kernel='precomputed' has "
                         "none; use engine='dense' or 'auto'.")
    return engine


def check_gemm_precision(gemm_precision, tf32=None) -> str:
    """The GEMM precision mode from ``gemm_precision`` and the deprecated ``tf32`` (None: not given).

    ``tf32=True`` means ``gemm_precision="tf32"`` and ``tf32=False`` leaves ``gemm_precision`` as it is, each
    with a FutureWarning; ``tf32=True`` beside another explicit mode is a ValueError.
    """
    gemm_precision = _gemm.check_precision(gemm_precision)
    if tf32 is None:
        return gemm_precision
    if not isinstance(tf32, bool):
        raise TypeError(f"tf32={tf32!r} must be True or False (or None); it is deprecated: use gemm_precision, one "
                        f"of {', '.join(map(repr, _gemm.PRECISIONS))}.")
    if tf32 and gemm_precision not in ("tf32", _gemm.DEFAULT_PRECISION):
        raise ValueError(f"tf32=True and gemm_precision={gemm_precision!r} disagree; pass gemm_precision alone "
                         "(tf32 is deprecated).")
    chosen = "tf32" if tf32 else gemm_precision
    _warn.warn(f"tf32={tf32!r} is deprecated; use gemm_precision={chosen!r} (one of "
               f"{', '.join(map(repr, _gemm.PRECISIONS))}; default {_gemm.DEFAULT_PRECISION!r}).", FutureWarning)
    return chosen


def gemm_mode_ran(gemm_precision, spec, backend: Backend, dtype, n: int, d: int, subject=None):
    """The GEMM mode a fit's kernel products run in (None without products: precomputed or callable kernels); a
    UserWarning when an explicit mode other than the default has no effect there (``subject``: what the warning
    names as having no products, by default ``kernel=<spec's name>``)."""
    from kkmgpu.kernels.blocks import gemm_mode

    compute = np.dtype(np.float32) if np.dtype(dtype) == np.float16 else np.dtype(dtype)
    mode = gemm_mode(spec, backend, compute, (n, n, d))
    if gemm_precision == _gemm.DEFAULT_PRECISION or mode == gemm_precision:
        return mode
    if mode is None:
        why = f"{subject or f'kernel={spec.name!r}'} has no kernel products of features"
    elif not backend.is_gpu:
        why = ("the CPU computes IEEE float32 GEMMs; the modes apply to NVIDIA GPUs with tensor cores (Ampere or "
               "newer)")
    elif compute == np.float64:
        why = "dtype='float64' takes FP64 GEMMs; the modes apply to float32 operands"
    else:
        why = (f"a product with a side below {_gemm.MIN_TENSOR_CORE_SIDE} (here n={n}, d={d}) is memory-bound and "
               "runs in plain float32")
    _warn.warn(f"gemm_precision={gemm_precision!r} has no effect: {why}.", UserWarning)
    return mode
