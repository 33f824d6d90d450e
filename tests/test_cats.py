"""CATS (method="cats", papers/cats-centroid-approximation.txt) held to the equations and to exact kernel k-means.

- every point sampled (l >= the largest cluster): the same labels, n_iter and objective as the float64
  reference of tests/reference.py, for every kernel, with and without sample weights;
- one iteration with l < cluster sizes against Eq. 2 written out in float64 (alpha = M^+ L w / n_c);
- quality against the exact method on the shape sets and an MNIST sample (protocol in ``quality_run``);
- degenerate inputs, predict, the estimator, the CLI, parameter checks, memory (no n x n array) and the
  stopping rule.
"""

import contextlib
import re
import tracemalloc
import warnings

import numpy as np
import pytest
from conftest import shape_set
from reference import kernel_kmeans_objective, kernel_matrix, reference_kernel_kmeans
import synthetic
from synthetic import random_partition

import kkmgpu
from kkmgpu import datasets
from kkmgpu.backend import device as _backend
from kkmgpu.engine import sampled as _cats
from kkmgpu.cli import main
from kkmgpu.metrics import nmi


def host(a):
    return np.asarray(a.get() if hasattr(a, "get") else a)


def blobs(n, d, n_centers, seed, spread=3.0):
    return synthetic.blobs(n, d, n_centers, seed, spread)


def quiet_fit(X, k, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", kkmgpu.ConvergenceWarning)
        return kkmgpu.fit(X, k, **kwargs)


def assert_sane(result, k, n):
    """What every CATS result must satisfy, whatever the input: finite numbers, labels in range."""
    labels = host(result.labels)
    assert labels.shape == (n,)
    assert labels.min() >= 0 and labels.max() < k
    assert np.isfinite(result.objective)
    history = np.asarray(result.objective_history)
    assert history.size == result.n_iter and np.all(np.isfinite(history))
    assert np.all(np.isfinite(host(result._cats_state.alpha)))
    assert np.all(np.isfinite(result._cats_state.offsets))
    if result.exact_objective is not None:
        assert np.isfinite(result.exact_objective)


def rbf_callable(A, B, gamma=0.3):
    """exp(-gamma ||a - b||^2) written with array methods only, so it runs on NumPy and CuPy arrays."""
    sq = (A * A).sum(axis=1)[:, None] + (B * B).sum(axis=1)[None, :] - 2.0 * (A @ B.T)
    return np.exp(-gamma * np.maximum(sq, 0.0))


# --------------------------------------------------------------------------- every point sampled

KERNEL_CASES = {
    "rbf": dict(kernel="rbf"),
    "polynomial": dict(kernel="polynomial", gamma=0.2, degree=2, coef0=1.0),
    "sigmoid": dict(kernel="sigmoid", gamma=0.05, coef0=0.5),
    "linear": dict(kernel="linear"),
    "laplacian": dict(kernel="laplacian"),
    "precomputed": dict(kernel="precomputed"),
    "callable": dict(kernel=rbf_callable, kernel_params={"gamma": 0.3}),
}


def reference_K(X, case):
    """The float64 kernel matrix of a KERNEL_CASES entry, from tests/reference.py (or the callable itself)."""
    name = case["kernel"]
    if callable(name):
        return rbf_callable(X, X, **case["kernel_params"])
    if name == "precomputed":
        return kernel_matrix(X, kernel="rbf")
    return kernel_matrix(X, kernel=name, gamma=case.get("gamma"), degree=case.get("degree", 3),
                         coef0=case.get("coef0"))


@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
@pytest.mark.parametrize("name", list(KERNEL_CASES))
def test_every_point_sampled_gives_the_exact_labels(name, weighted, device):
    """With l >= every cluster size M_c = L_c restricted to S_c = C: alpha = w / n_c, the exact centroid."""
    X, _ = blobs(120, 3, 4, seed=1)
    n, k = X.shape[0], 4
    case = KERNEL_CASES[name]
    K = reference_K(X, case)
    data = K if name == "precomputed" else X
    weights = np.random.default_rng(2).uniform(0.2, 3.0, n) if weighted else None
    init = random_partition(n, k, 3)
    ref = reference_kernel_kmeans(K, init, k, sample_weight=weights, tol=0.0)
    assert ref.n_iter >= 3  # the start is far from the fixed point: several steps are compared
    common = dict(init=init, dtype="float64", sample_weight=weights, device=device, max_iter=100)
    exact = kkmgpu.fit(data, k, tol=0.0, **common, **case)
    cats = kkmgpu.fit(data, k, method="cats", n_samples_per_cluster=n, theta=0.0, exact_objective=True,
                      **common, **case)
    np.testing.assert_array_equal(host(cats.labels), ref.labels)
    np.testing.assert_array_equal(host(cats.labels), host(exact.labels))
    assert cats.n_iter == ref.n_iter == exact.n_iter
    assert cats.stop_reason == "no point moved" and cats.converged
    # the last step moved nothing: its approximate distortion is the exact objective of the labels
    assert cats.objective == pytest.approx(ref.objective, rel=1e-8)
    assert cats.exact_objective == pytest.approx(ref.objective, rel=1e-8)
    assert cats.exact_objective == pytest.approx(exact.objective, rel=1e-8)
    np.testing.assert_allclose(cats.cluster_sizes, exact.cluster_sizes, rtol=1e-12)


def test_l_equal_to_the_largest_cluster_is_enough(device):
    """The bound itself: l = the largest cluster size met along the run (no padding, no sampling there)."""
    X, _ = blobs(150, 2, 3, seed=4)
    init = random_partition(150, 3, 5)
    K = kernel_matrix(X, kernel="rbf")
    ref = reference_kernel_kmeans(K, init, 3, tol=0.0)
    largest = max(np.bincount(labels, minlength=3).max() for labels in ref.history_labels)
    cats = kkmgpu.fit(X, 3, method="cats", n_samples_per_cluster=int(largest), theta=0.0, init=init,
                      dtype="float64", device=device)
    np.testing.assert_array_equal(host(cats.labels), ref.labels)
    assert cats.n_iter == ref.n_iter


def test_linear_kernel_in_2d_is_exact_with_singular_M(device):
    """Linear kernel in 2-D: M_c (l x l, l = 20) has rank 2, yet the span of the samples is the whole
    plane, so the pseudoinverse gives the exact centroid and CATS is plain k-means."""
    X, _ = blobs(300, 2, 5, seed=6)
    init = random_partition(300, 5, 7)
    exact = kkmgpu.fit(X, 5, kernel="linear", init=init, tol=0.0, dtype="float64", device=device)
    cats = kkmgpu.fit(X, 5, kernel="linear", method="cats", n_samples_per_cluster=20, theta=0.0, init=init,
                      dtype="float64", device=device, random_state=0)
    eig = np.linalg.eigvalsh(X[cats._cats_state.index[0]] @ X[cats._cats_state.index[0]].T)
    assert (np.abs(eig) > 1e-9 * np.abs(eig).max()).sum() == 2  # M really is singular
    assert_sane(cats, 5, 300)
    np.testing.assert_array_equal(host(cats.labels), host(exact.labels))
    assert cats.objective == pytest.approx(exact.objective, rel=1e-9)


# --------------------------------------------------------------------------- Eq. 2, one iteration


@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
def test_one_iteration_follows_equation_2(weighted, device):
    """alpha_c = M_c^+ L_c w_c / n_c and the assignment argmin_c K_ii - 2 K(i, S_c) alpha_c + alpha_c^T M_c alpha_c,
    recomputed in float64 from the sampled indices the fit reports."""
    X, _ = blobs(200, 3, 3, seed=8, spread=2.0)
    n, k, l = 200, 3, 7
    gamma = 0.5
    weights = np.random.default_rng(9).uniform(0.2, 3.0, n) if weighted else np.ones(n)
    init = random_partition(n, k, 10)
    result = quiet_fit(X, k, method="cats", n_samples_per_cluster=l, gamma=gamma, init=init, max_iter=1,
                       dtype="float64", sample_weight=weights if weighted else None, device=device,
                       random_state=11)
    state = result._cats_state
    K = kernel_matrix(X, kernel="rbf", gamma=gamma)
    dist = np.empty((n, k))
    for c in range(k):
        members = np.flatnonzero(init == c)
        S = state.index[c]
        assert len(set(S.tolist())) == l and set(S.tolist()) <= set(members.tolist())  # l distinct members
        M = K[np.ix_(S, S)]
        alpha = np.linalg.pinv(M, rcond=1e-12, hermitian=True) @ (K[np.ix_(S, members)] @ weights[members])
        alpha /= weights[members].sum()
        np.testing.assert_allclose(host(state.alpha)[c], alpha, rtol=1e-6, atol=1e-9 * np.abs(alpha).max())
        assert state.offsets[c] == pytest.approx(alpha @ M @ alpha, rel=1e-9)
        dist[:, c] = np.diag(K) - 2.0 * K[:, S] @ alpha + alpha @ M @ alpha
    labels = dist.argmin(axis=1)
    np.testing.assert_array_equal(host(result.labels), labels)
    assert result.objective == pytest.approx(float(weights @ dist[np.arange(n), labels]), rel=1e-10)
    assert result.n_iter == 1 and result.stop_reason == "max_iter" and not result.converged


@pytest.mark.parametrize("name", ["rbf", "polynomial", "laplacian", "linear"])
def test_exact_objective_never_exceeds_the_approximate_distortion(name, device):
    """For a PSD kernel the exact centroid minimises the within-cluster distortion, so the exact objective of
    the final labels is at most CATS's last approximate distortion (which used approximate centroids)."""
    X, _ = blobs(400, 4, 6, seed=12)
    case = KERNEL_CASES[name]
    for seed in range(3):
        result = quiet_fit(X, 6, method="cats", n_samples_per_cluster=5, exact_objective=True, init="random",
                           n_init=1, random_state=seed, dtype="float64", device=device, **case)
        assert result.exact_objective <= result.objective * (1 + 1e-9)
        ref = kernel_kmeans_objective(reference_K(X, case), host(result.labels), k=6)
        assert result.exact_objective == pytest.approx(ref, rel=1e-9)


# --------------------------------------------------------------------------- quality against exact

def kmeans_plus_plus_partition(K, k, rng):
    """Plain D^2 seeding on a float64 kernel matrix (d(i, j)^2 = K_ii + K_jj - 2 K_ij), points to the nearest seed."""
    diag = np.diag(K)
    n = K.shape[0]
    seeds = [int(rng.integers(n))]
    closest = np.maximum(diag + diag[seeds[0]] - 2.0 * K[seeds[0]], 0.0)
    for _ in range(1, k):
        p = closest / closest.sum() if closest.sum() > 0 else np.full(n, 1.0 / n)
        seeds.append(int(rng.choice(n, p=p)))
        closest = np.minimum(closest, np.maximum(diag + diag[seeds[-1]] - 2.0 * K[seeds[-1]], 0.0))
    labels = np.argmin(diag[None, :] + diag[seeds][:, None] - 2.0 * K[seeds], axis=0)
    labels[seeds] = np.arange(k)
    return labels


def quality_run(X, k, seed, device, n_starts=5):
    """The protocol of the quality tests (and of bench/bench_cats.py quality, protocol "same-starts"):

    ``n_starts`` k-means++ partitions (rbf, default gamma, drawn from the float64 kernel with seed ``seed``);
    the exact method (float32, tol 1e-6) and CATS (defaults: l = ceil(sqrt(n/k)), window 5, theta 1e-6,
    random_state = seed) each run from every one of them and keep their lowest own objective (CATS: the
    approximate distortion), as n_init does. Returns (exact objective of CATS's partition / exact's objective,
    NMI(CATS labels, exact labels)).
    """
    rng = np.random.default_rng(seed)
    K = kernel_matrix(X, kernel="rbf")
    starts = [kmeans_plus_plus_partition(K, k, rng) for _ in range(n_starts)]
    exact = min((quiet_fit(X, k, init=s, device=device) for s in starts), key=lambda r: r.objective)
    cats = min((quiet_fit(X, k, init=s, method="cats", random_state=seed, exact_objective=True, device=device)
                for s in starts), key=lambda r: r.objective)
    return cats.exact_objective / exact.objective, nmi(host(exact.labels), host(cats.labels))


def standardized_shape_set(name):
    X, y = shape_set(name)  # the real set, or a generated look-alike where the shared data is missing
    return (X - X.mean(axis=0)) / X.std(axis=0), int(y.max()) + 1


QUALITY_SEEDS = (0, 1, 2)
# NMI(CATS, exact) >= 0.9 holds on every seed on these sets (bench/bench_cats.py quality: seeds 0-9 too).
# On flame the two methods often end in different partitions of the same objective (two nearly equal
# minima): NMI 0.13-1.0 over seeds 0-9; there only the objective is held to 1% plus a majority rule below.
AGREEING_SETS = ("aggregation", "compound", "jain", "r15")


@pytest.mark.parametrize("name", datasets.SHAPE_SETS)
def test_shape_sets_distortion_within_one_percent_of_exact(name, device):
    X, k = standardized_shape_set(name)
    results = [quality_run(X, k, seed, device) for seed in QUALITY_SEEDS]
    ratios = [r for r, _ in results]
    nmis = [m for _, m in results]
    # Within 1% but for a rare tail: the variance rule (theta > 0) can stop a start early at a worse partition. On
    # compound, over seeds 0-24: 24 within 0.16% and NMI >= 0.96, seed 0 at 2.1% and NMI 0.85 (one of its five
    # starts stopped by the rule); so one seed of three may be in that tail, not further.
    assert sorted(ratios)[-2] <= 1.01 and max(ratios) <= 1.03, ratios
    assert min(ratios) >= 0.97, ratios  # CATS may find a better minimum, but not implausibly better
    if name in AGREEING_SETS:
        assert sorted(nmis)[1] >= 0.9 and min(nmis) >= 0.8, nmis
    else:
        assert sum(m >= 0.85 for m in nmis) >= 2, nmis


@pytest.fixture(scope="module")
def mnist_2000():
    try:
        return datasets.load_mnist(n_samples=2000, random_state=0)
    except FileNotFoundError:
        # A fresh clone: 1000 "images" of 64 pixels in [0, 1] around 10 random prototypes. (scikit-learn's digits
        # would be real, but CATS at the default l runs all 300 iterations on them: minutes per case.)
        rng = np.random.default_rng(0)
        prototypes = rng.uniform(0, 1, (10, 64))
        y = rng.integers(0, 10, 1000)
        return np.clip(prototypes[y] + rng.uniform(-0.25, 0.25, (1000, 64)), 0, 1).astype(np.float32), y


def test_mnist_sample_distortion_within_one_percent_of_exact(mnist_2000, device):
    """MNIST 2000 (pixels / 255, k = 10, rbf, default gamma, l = 15). The distortion is within 1%, but the
    agreement is only 0.6-0.85 NMI: sampling noise at l = 15 leaves CATS in a neighbouring partition
    (exact runs from two different k-means++ starts agree about as little, 0.68-0.88 on MNIST 3000)."""
    X, y = mnist_2000
    results = [quality_run(X, 10, seed, device, n_starts=3) for seed in (0, 1)]
    ratios = [r for r, _ in results]
    nmis = [m for _, m in results]
    assert max(ratios) <= 1.01 and min(ratios) >= 0.98, ratios
    assert min(nmis) >= 0.6, nmis


# --------------------------------------------------------------------------- degenerate inputs


@pytest.mark.parametrize("name", ["rbf", "polynomial", "sigmoid", "linear", "laplacian", "precomputed"])
def test_one_sample_per_cluster(name, device):
    X, _ = blobs(150, 3, 4, seed=13)
    case = KERNEL_CASES[name]
    data = kernel_matrix(X, kernel="rbf") if name == "precomputed" else X
    result = quiet_fit(data, 4, method="cats", n_samples_per_cluster=1, random_state=0, exact_objective=True,
                       device=device, **case)
    assert_sane(result, 4, 150)
    assert result._cats_state.index.shape == (4, 1)
    np.testing.assert_array_equal(kkmgpu.predict(result, data), host(result.labels))


def test_duplicate_points(device):
    """20 distinct points, each 10 times: sampled sets hold duplicates, so M_c is singular."""
    base, _ = blobs(20, 2, 4, seed=14)
    X = np.repeat(base, 10, axis=0)
    for l in (1, 8, 40):
        result = quiet_fit(X, 4, method="cats", n_samples_per_cluster=l, random_state=1, exact_objective=True,
                           device=device)
        assert_sane(result, 4, 200)
        labels = host(result.labels)
        assert all(len(set(labels[i:i + 10])) == 1 for i in range(0, 200, 10))  # copies stay together


@pytest.mark.parametrize("name", ["rbf", "linear", "polynomial"])
def test_all_points_identical(name, device):
    X = np.full((60, 3), 2.5)
    for l in (1, 5, 60):
        result = quiet_fit(X, 3, kernel=name, method="cats", n_samples_per_cluster=l, random_state=2,
                           exact_objective=True, device=device)
        assert_sane(result, 3, 60)
        assert np.bincount(host(result.labels), minlength=3).min() >= 1  # empty clusters are refilled
        scale = float(kkmgpu.kernel_matrix(X[:1], kernel=name, device="cpu")[0, 0])  # K_ii, the same for all
        assert abs(result.exact_objective) <= 1e-6 * 60 * scale
        assert abs(result.objective) <= 1e-5 * 60 * scale


def test_cluster_smaller_than_l(device):
    """A 3-point cluster with l = 20: all three are used, the padding of the sample carries alpha = 0, and the
    approximate centroid of the cluster is its exact one (alpha = 1/3 each)."""
    X, _ = blobs(200, 2, 2, seed=15, spread=1.0)
    X = np.vstack([X, [[40.0, 40.0], [40.1, 40.0], [40.0, 40.1]]])
    init = np.r_[random_partition(200, 2, 16), [2, 2, 2]]
    result = quiet_fit(X, 3, method="cats", n_samples_per_cluster=20, gamma=0.05, init=init, max_iter=1,
                       dtype="float64", device=device, random_state=3)
    assert_sane(result, 3, 203)
    state = result._cats_state
    assert state.index.shape == (3, 20)
    assert set(state.index[2].tolist()) == {200, 201, 202}
    assert len(set(state.index[0].tolist())) == 20  # the large clusters are sampled without repetition
    alpha = host(state.alpha)[2]
    first = [state.index[2].tolist().index(i) for i in (200, 201, 202)]
    sampled = np.zeros(20, dtype=bool)
    sampled[first] = True
    assert np.all(alpha[~sampled] == 0.0)
    np.testing.assert_allclose(alpha[sampled], 1.0 / 3.0, rtol=1e-6)
    full = quiet_fit(X, 3, method="cats", n_samples_per_cluster=20, gamma=0.05, init=init, random_state=3,
                     exact_objective=True, device=device)
    assert_sane(full, 3, 203)


def test_zero_weights_are_never_sampled(device):
    X, _ = blobs(160, 2, 4, seed=16)
    weights = np.random.default_rng(17).uniform(0.5, 2.0, 160)
    weights[::3] = 0.0
    result = quiet_fit(X, 4, method="cats", n_samples_per_cluster=6, sample_weight=weights, random_state=4,
                       exact_objective=True, device=device)
    assert_sane(result, 4, 160)
    state = result._cats_state
    used = state.index[host(state.alpha) != 0]
    assert np.all(weights[used] > 0)
    ref = kernel_kmeans_objective(kernel_matrix(X, kernel="rbf"), host(result.labels), weights, k=4)
    assert result.exact_objective == pytest.approx(ref, rel=1e-5)


def test_float16_storage(device):
    X, _ = blobs(200, 3, 3, seed=18)
    for data, kernel in ((X, "rbf"), (kernel_matrix(X, kernel="rbf"), "precomputed")):
        result = quiet_fit(data, 3, kernel=kernel, method="cats", dtype="float16", random_state=5,
                           exact_objective=True, device=device)
        assert_sane(result, 3, 200)
        assert result.dtype == "float16"


# --------------------------------------------------------------------------- predict, n_init, estimator, CLI


@pytest.mark.parametrize("name", ["rbf", "polynomial", "laplacian", "precomputed", "callable"])
def test_predict_on_training_points_reproduces_labels(name, device):
    X, _ = blobs(300, 3, 5, seed=19)
    case = KERNEL_CASES[name]
    K = reference_K(X, case)
    data = K if name == "precomputed" else X
    result = quiet_fit(data, 5, method="cats", random_state=6, device=device, **case)
    np.testing.assert_array_equal(kkmgpu.predict(result, data), host(result.labels))
    np.testing.assert_array_equal(kkmgpu.predict(result, data, batch_size=37), host(result.labels))
    new, _ = blobs(50, 3, 5, seed=19)  # same centres, new draws
    new_data = reference_K(np.vstack([X, new]), case)[300:, :300] if name == "precomputed" else new
    labels = kkmgpu.predict(result, new_data)
    assert labels.shape == (50,) and labels.dtype == np.int32 and labels.min() >= 0 and labels.max() < 5


def test_n_init_keeps_the_lowest_distortion_and_seeds_reproduce(device):
    X, _ = blobs(300, 3, 5, seed=20)
    a = quiet_fit(X, 5, method="cats", init="random", n_init=4, random_state=7, device=device)
    b = quiet_fit(X, 5, method="cats", init="random", n_init=4, random_state=7, device=device)
    assert a.n_init == 4 and len(a.objectives) == 4
    assert a.objective == a.objectives.min()
    np.testing.assert_array_equal(host(a.labels), host(b.labels))
    np.testing.assert_array_equal(a.objective_history, b.objective_history)
    assert a.method == "cats" and a.method_params["l"] == int(np.ceil(np.sqrt(300 / 5)))


def test_estimator(device):
    from sklearn.base import clone

    X, _ = blobs(240, 3, 4, seed=21)
    est = kkmgpu.KernelKMeans(4, method="cats", n_samples_per_cluster=9, window=4, theta=1e-5,
                              exact_objective=True, random_state=8, device=device, dtype="float64")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", kkmgpu.ConvergenceWarning)
        assert est.fit(X) is est
    result = quiet_fit(X, 4, method="cats", n_samples_per_cluster=9, window=4, theta=1e-5, exact_objective=True,
                       random_state=8, device=device, dtype="float64")
    np.testing.assert_array_equal(host(est.labels_), host(result.labels))
    assert est.inertia_ == pytest.approx(result.exact_objective, rel=1e-12)
    assert est.result_.method_params == {"l": 9, "window": 4, "theta": 1e-5, "rcond": 1e-12,
                                         "gemm_precision": "3xtf32", "gemm_mode": "fp64"}
    np.testing.assert_array_equal(est.predict(X), host(est.labels_))
    params = clone(est).get_params()
    assert params["method"] == "cats" and params["n_samples_per_cluster"] == 9 and params["theta"] == 1e-5
    without = kkmgpu.KernelKMeans(4, method="cats", random_state=8, device=device)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", kkmgpu.ConvergenceWarning)
        without.fit(X)
    assert without.result_.exact_objective is None and without.inertia_ == without.result_.objective


def test_cli_fit_method_cats(tmp_path, capsys):
    rng = np.random.default_rng(22)
    y = np.repeat(np.arange(3), 50)
    X = np.array([[0.0, 0.0], [5.0, 5.0], [-5.0, 5.0]])[y] + 0.3 * rng.standard_normal((150, 2))
    path = tmp_path / "points.csv"
    np.savetxt(path, np.column_stack([X, y + 1]), delimiter=",", header="x1,x2,label", comments="")
    out = tmp_path / "labels.csv"
    code = main(["fit", str(path), "-k", "3", "--method", "cats", "--samples-per-cluster", "6", "--device", "cpu",
                 "--seed", "0", "--labels-last-column", "-o", str(out)])
    text = capsys.readouterr().out
    assert code == 0, text
    labels = np.loadtxt(out, dtype=np.int64)
    assert labels.shape == (150,) and labels.min() >= 0 and labels.max() < 3
    assert re.search(r"^method\s+cats \(l=6, stopped: .+\)$", text, re.MULTILINE), text
    assert re.search(r"^objective\s+\S+ \(approximate distortion\)$", text, re.MULTILINE), text
    assert re.search(r"^exact objective\s+\S+$", text, re.MULTILINE), text
    assert re.search(r"^NMI / ARI\s+1\.0000 / 1\.0000", text, re.MULTILINE), text  # well separated blobs


def test_cli_rejects_samples_per_cluster_for_exact(tmp_path, capsys):
    path = tmp_path / "points.csv"
    np.savetxt(path, blobs(30, 2, 2, seed=23)[0], delimiter=",")
    assert main(["fit", str(path), "-k", "2", "--samples-per-cluster", "4", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "--samples-per-cluster" in err and "method" in err   # in the command line's words


# --------------------------------------------------------------------------- parameters


@pytest.mark.parametrize(
    ("params", "error", "pattern"),
    [
        (dict(n_samples_per_cluster=0), ValueError, r"n_samples_per_cluster=0"),
        (dict(n_samples_per_cluster=-3), ValueError, r"n_samples_per_cluster=-3"),
        (dict(n_samples_per_cluster=2.5), TypeError, r"n_samples_per_cluster=2\.5"),
        (dict(n_samples_per_cluster=True), TypeError, r"n_samples_per_cluster=True"),
        (dict(window=1), ValueError, r"window=1"),
        (dict(window=3.0), TypeError, r"window=3\.0"),
        (dict(theta=-1e-3), ValueError, r"theta=-0\.001"),
        (dict(theta=float("nan")), ValueError, r"theta=nan"),
        (dict(theta="small"), ValueError, r"theta='small'"),
        (dict(rcond=1), ValueError, r"rcond=1"),
        (dict(rcond=-0.1), ValueError, r"rcond=-0\.1"),
        (dict(exact_objective="yes"), TypeError, r"exact_objective='yes'"),
        (dict(method="exact", n_samples_per_cluster=10), ValueError, r"n_samples_per_cluster.*method='exact'"),
        (dict(method="exact", window=4, theta=0.1), ValueError, r"window, theta.*method='exact'"),
        (dict(method="exact", rcond=1e-3), ValueError, r"rcond.*method='exact'"),
        (dict(method="catz"), ValueError, r"method='catz'"),
    ],
)
def test_bad_parameters_name_the_value(params, error, pattern):
    X, _ = blobs(40, 2, 2, seed=24)
    params = {"method": "cats", **params}
    with pytest.raises(error, match=pattern):
        kkmgpu.fit(X, 2, device="cpu", **params)


# --------------------------------------------------------------------------- memory


def test_no_n_by_n_array(monkeypatch):
    """With less free memory than one float32 n x n matrix the exact method refuses and CATS still runs."""
    n = 3000
    X, _ = blobs(n, 4, 5, seed=25)
    monkeypatch.setattr(_backend.Backend, "available_bytes", lambda self: n * n * 4 - 1)
    with pytest.raises(kkmgpu.InsufficientMemoryError):
        kkmgpu.fit(X, 5, device="cpu", random_state=0, engine="dense")
    result = quiet_fit(X, 5, method="cats", device="cpu", random_state=0, exact_objective=True, n_init=2)
    assert_sane(result, 5, n)


def test_peak_memory_is_far_below_n_squared():
    """tracemalloc sees NumPy's allocations: a whole CATS fit (k-means++ seeding, iterations, predict) peaks
    far below one float32 n x n matrix (400 MB at n = 10000; the n x (k l) block in float32 and float64 is
    about 30 MB); the exact objective (tiles of 2048 rows of one cluster) stays below half of it."""
    n = 10000
    X, _ = blobs(n, 5, 4, seed=26)
    quiet_fit(X[:100], 4, method="cats", device="cpu", random_state=0)  # compile numba outside the trace
    tracemalloc.start()
    try:
        result = quiet_fit(X, 4, method="cats", device="cpu", random_state=0, n_init=2)
        kkmgpu.predict(result, X)
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        with_exact = quiet_fit(X, 4, method="cats", device="cpu", random_state=0, exact_objective=True)
        _, peak_exact = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert_sane(with_exact, 4, n)
    assert peak < n * n * 4 / 8, peak
    assert peak_exact < n * n * 4 / 2, peak_exact


def test_recomputed_and_tiled_blocks_give_the_same_run(monkeypatch, device):
    """The n x (k l) block kept between the two passes, or recomputed (no room), in one tile or many: one run."""
    X, _ = blobs(500, 3, 4, seed=27)
    init = random_partition(500, 4, 28)
    kwargs = dict(method="cats", n_samples_per_cluster=8, init=init, random_state=9, dtype="float64",
                  device=device, max_iter=30)
    cached = quiet_fit(X, 4, **kwargs)
    monkeypatch.setattr(_cats, "CACHE_FRACTION", 0.0)
    recomputed = quiet_fit(X, 4, **kwargs)
    monkeypatch.setattr(_cats._kernels, "tile_rows", lambda n_cols, itemsize, tile_bytes=None, backend=None: 37)
    tiled = quiet_fit(X, 4, **kwargs)
    monkeypatch.setattr(_cats, "ONE_SQUARE_MAX_BYTES", 0)  # M_c one cluster at a time, not one (kl)^2 block
    per_cluster = quiet_fit(X, 4, **kwargs)
    for other in (recomputed, tiled, per_cluster):
        np.testing.assert_array_equal(host(other.labels), host(cached.labels))
        np.testing.assert_allclose(other.objective_history, cached.objective_history, rtol=1e-12)


# --------------------------------------------------------------------------- stopping rule


def test_huge_theta_stops_at_the_window(device):
    X, _ = blobs(600, 3, 8, seed=29)
    for window in (2, 3, 6):
        result = kkmgpu.fit(X, 8, method="cats", n_samples_per_cluster=3, window=window, theta=1e30,
                            init=random_partition(600, 8, 30), random_state=10, device=device)
        assert result.n_iter == window
        assert result.converged
        assert result.stop_reason == f"variance of the last {window} distortions <= theta"


def test_stopping_rule_is_the_first_window_whose_variance_is_small(device):
    X, _ = blobs(800, 3, 6, seed=31)
    for theta, window in ((1e-4, 3), (1e-6, 5), (1e-8, 4)):
        result = quiet_fit(X, 6, method="cats", n_samples_per_cluster=4, window=window, theta=theta,
                           init=random_partition(800, 6, 32), random_state=11, device=device, max_iter=200)
        h = np.asarray(result.objective_history)
        small = [t for t in range(window, h.size + 1)
                 if h[t - window:t].var() <= theta * h[t - window:t].mean() ** 2]
        if result.stop_reason.startswith("variance"):
            assert small and small[0] == h.size == result.n_iter
        else:  # stopped earlier because no point moved, or ran out of iterations
            assert not small or small[0] == h.size
            assert result.stop_reason in ("no point moved", "max_iter")


def test_max_iter_without_stopping_warns(device):
    X, _ = blobs(400, 3, 5, seed=33)
    with pytest.warns(kkmgpu.ConvergenceWarning, match="max_iter=4"):
        result = kkmgpu.fit(X, 5, method="cats", n_samples_per_cluster=3, theta=0.0, max_iter=4,
                            init=random_partition(400, 5, 34), random_state=12, device=device)
    assert result.n_iter == 4 and not result.converged and result.stop_reason == "max_iter"


# --------------------------------------------------------------------------- backends


@pytest.mark.gpu
def test_cuda_run_matches_cpu_run():
    """Sampling draws on the host, so a float64 run is the same on both backends from the same seed."""
    from conftest import require_cuda

    require_cuda()
    X, _ = blobs(2000, 8, 6, seed=35)
    kwargs = dict(method="cats", init="k-means++", n_init=2, random_state=13, dtype="float64", exact_objective=True)
    cpu = quiet_fit(X, 6, device="cpu", **kwargs)
    gpu = quiet_fit(X, 6, device="cuda", **kwargs)
    np.testing.assert_array_equal(host(gpu.labels), host(cpu.labels))
    assert gpu.n_iter == cpu.n_iter
    assert gpu.exact_objective == pytest.approx(cpu.exact_objective, rel=1e-9)
    np.testing.assert_array_equal(kkmgpu.predict(gpu, X), host(cpu.labels))


def test_per_cluster_eigh_route_equals_the_batched_one():
    """On a GPU, M_c larger than cuSOLVER's batched-Jacobi limit are decomposed one by one: same pairs."""
    class GpuLikeBackend:  # takes the GPU branch of _batched_eigh with NumPy arrays
        xp = np
        is_gpu = True

    rng = np.random.default_rng(31)
    l = _cats.GPU_BATCHED_EIGH_MAX + 13
    A = rng.normal(size=(4, l, l))
    M = A + A.transpose(0, 2, 1)
    w, V = _cats._batched_eigh(M, GpuLikeBackend())
    np.testing.assert_allclose(w, np.linalg.eigh(M)[0], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(np.einsum("kij,kj->kij", V, w), M @ V, atol=1e-10)


# --------------------------------------------------------------------------- the work sized by the clusters


def record_samples(monkeypatch):
    """Wrap _cats._sample: per iteration (the largest positive-weight cluster, l asked for, the stack's shape, the
    samples per cluster); checks that the per-cluster counts it is given are those of the labels."""
    calls = []
    original = _cats._sample

    def recording(labels, positive, counts, l, seed, backend):
        index, mask = original(labels, positive, counts, l, seed, backend)
        labels_h, positive_h = host(labels), host(positive)
        np.testing.assert_array_equal(counts, np.bincount(labels_h[positive_h], minlength=counts.shape[0]))
        calls.append((int(counts.max()), l, index.shape, mask.sum(axis=1)))
        return index, mask

    monkeypatch.setattr(_cats, "_sample", recording)
    return calls


@pytest.mark.parametrize("l", [4, 60, 5000])
def test_sample_stack_is_min_of_l_and_the_largest_cluster(l, monkeypatch, device):
    """M_c stack (k, L, L) with L = min(l, the largest cluster of that iteration), every iteration; a cluster holds
    min(l, n_c) distinct samples."""
    X, _ = blobs(300, 2, 4, seed=40)
    weights = np.random.default_rng(41).uniform(0.5, 2.0, 300)
    weights[::7] = 0.0  # zero-weight members are never sampled, so they do not count in the largest cluster
    calls = record_samples(monkeypatch)
    result = quiet_fit(X, 4, method="cats", n_samples_per_cluster=l, init=random_partition(300, 4, 42),
                       sample_weight=weights, random_state=0, device=device, max_iter=20, theta=0.0)
    assert len(calls) == result.n_iter >= 2
    for largest, asked, shape, per_cluster in calls:
        assert asked == l and shape == (4, min(l, largest))
        assert per_cluster.max() == min(l, largest)
    assert result._cats_state.index.shape[1] <= min(l, 300)
    assert_sane(result, 4, 300)


def test_huge_l_is_capped_and_equals_l_equal_to_n(device):
    """l = 10**9 (and beyond int64) samples every cluster in full, as l = n does: the same run."""
    X, _ = blobs(400, 3, 5, seed=43)
    kwargs = dict(method="cats", init="k-means++", random_state=1, device=device, exact_objective=True)
    at_n = quiet_fit(X, 5, n_samples_per_cluster=400, **kwargs)
    for l in (10**9, 10**30):
        huge = quiet_fit(X, 5, n_samples_per_cluster=l, **kwargs)
        np.testing.assert_array_equal(host(huge.labels), host(at_n.labels))
        np.testing.assert_array_equal(huge.objective_history, at_n.objective_history)
        assert huge._cats_state.index.shape == at_n._cats_state.index.shape
        assert huge._cats_state.index.shape[1] <= 400 - 4  # the largest cluster, never l
        assert huge.method_params["l"] == l
        assert huge.exact_objective == pytest.approx(at_n.exact_objective, rel=1e-12)


@contextlib.contextmanager
def small_device(device, nbytes, monkeypatch):
    """The device with ``nbytes`` free: the CuPy stand-in's emulated GPU shrunk to it (every array charged), a
    real GPU's free memory as kkmgpu reads it modelled the same way (conftest.free_device_memory without fill), or
    (the CPU) the free memory kkmgpu reads patched to it."""
    if device == "cuda":
        from conftest import free_device_memory

        with free_device_memory(nbytes, fill=False):
            yield
        return
    with monkeypatch.context() as m:
        m.setattr(_backend.Backend, "available_bytes", lambda self: nbytes)
        yield


def test_memory_guard_names_n_samples_per_cluster(monkeypatch, device):
    """On a device of 2 MiB, l = n (stack 2 x ~300 x ~300 float64, several copies) is refused before anything is
    allocated, with kkmgpu's InsufficientMemoryError naming l and the default; the default l runs, with the
    labels it has on a large device."""
    X, _ = blobs(600, 2, 2, seed=44, spread=4.0)
    kwargs = dict(method="cats", init=random_partition(600, 2, 45), random_state=2, device=device,
                  dtype="float32", max_iter=50)
    roomy = quiet_fit(X, 2, **kwargs)
    with small_device(device, 2 * 2**20, monkeypatch):
        with pytest.raises(kkmgpu.InsufficientMemoryError,
                           match=r"n_samples_per_cluster=600 .*smaller n_samples_per_cluster \(the default is "
                                 r"ceil\(sqrt\(n / k\)\) = 18\)"):
            quiet_fit(X, 2, n_samples_per_cluster=600, **kwargs)
        tight = quiet_fit(X, 2, **kwargs)
    np.testing.assert_array_equal(host(tight.labels), host(roomy.labels))
    np.testing.assert_array_equal(tight.objective_history, roomy.objective_history)


def test_block_cache_follows_the_free_memory(device, monkeypatch):
    """The n x (k L) block is kept between the two passes when it takes at most CACHE_FRACTION of the free memory
    the iteration's own arrays leave, with no fixed cap: kept on a roomy device, recomputed on one where it does not
    fit beside them, and the run is the same either way: the same labels, and the same bits where the tiles are the
    same. The tiles follow the free memory too (one of 1,500 rows against six of 273 on the CPU), and a GPU's float64
    products add in an order that follows their shapes (cuBLAS; an H100 gave 483.6504991136198 against
    483.65049911361984): across tilings the distortions agree within (n + k L) eps, a bound on the relative rounding
    of the sums behind each (Lw over n rows, each row's projection over k L columns)."""
    X, _ = blobs(1500, 3, 4, seed=61)
    plans = []
    original = _cats.iteration_plan
    rows = {}

    def recording(n, k, width, itemsize, backend, l):
        step, cache = original(n, k, width, itemsize, backend, l)
        plans.append(cache)
        rows["k L"] = k * width
        return rows.get("tile", step), cache

    monkeypatch.setattr(_cats, "iteration_plan", recording)
    kwargs = dict(method="cats", n_samples_per_cluster=80, init=random_partition(1500, 4, 62), random_state=1,
                  device=device, dtype="float32", max_iter=3)  # block: 1500 x 4 x 80 float32 = 1.9 MB
    with small_device(device, 64 * 2**20, monkeypatch):
        roomy = quiet_fit(X, 4, **kwargs)
    assert plans and all(plans)
    plans.clear()
    rows["tile"] = 200  # fewer than either device's own tiles take (4 MiB: 273 rows on the CPU, 263 emulated)
    with small_device(device, 4 * 2**20, monkeypatch):
        tight = quiet_fit(X, 4, **kwargs)
    assert plans and not any(plans)
    plans.clear()
    with small_device(device, 64 * 2**20, monkeypatch):
        same_tiles = quiet_fit(X, 4, **kwargs)
    assert plans and all(plans)
    assert tight.method_params.get("gemm_mode") == same_tiles.method_params.get("gemm_mode") == \
        roomy.method_params.get("gemm_mode")  # the same products in each (a 3xTF32 split fits all three)
    np.testing.assert_array_equal(host(tight.labels), host(same_tiles.labels))
    np.testing.assert_array_equal(tight.objective_history, same_tiles.objective_history)
    np.testing.assert_array_equal(host(tight.labels), host(roomy.labels))
    bound = (1500 + rows["k L"]) * np.finfo(np.float64).eps
    np.testing.assert_allclose(tight.objective_history, roomy.objective_history, rtol=bound, atol=0)


@pytest.mark.parametrize(("free", "cached"), [(80e9, True), (40e9, True), (16e9, False)])
def test_the_million_point_block_is_cached_where_it_fits(free, cached, monkeypatch):
    """n = 1,000,000, k = 10, l = 317 in float32: the 12.7 GB block (which the former 4 GiB cap recomputed every
    iteration) is kept on a device with 80 or 40 GB free, recomputed with 16 GB."""
    monkeypatch.setattr(_backend.Backend, "available_bytes", lambda self: int(free))
    step, cache = _cats.iteration_plan(10**6, 10, 317, 4, _backend.Backend("cpu"), 317)
    assert cache == cached
    assert 10**6 * 10 * 317 * 4 > 12.6e9


@pytest.mark.gpu
def test_all_points_are_split_once_per_fit_or_run_fp32_where_the_split_does_not_fit(monkeypatch):
    """3xTF32 on a GPU: all points' split operand ([L | H | H], n x 3 d float32) is prepared once per fit where it
    fits beside the iteration's arrays; on a device where it does not, the blocks run fp32 (a split per block pays
    only from SPLIT_PER_BLOCK_MIN_COLUMNS columns on; with that bound lowered to k l they split per block), and the
    fit records the mode that ran. Every way gives the float64 run's labels and an exact objective within float32
    rounding of the float64 objective of those labels (the emulated device charges every buffer: the guard holds)."""
    from conftest import require_cuda
    from kkmgpu.engine import source as _source
    from kkmgpu.kernels import gemm as _gemm

    require_cuda()
    n, d, k, l = 600, 40, 4, 12
    X, _ = blobs(n, d, k, seed=63, spread=4.0)
    kwargs = dict(method="cats", n_samples_per_cluster=l, init=random_partition(n, k, 64), random_state=3,
                  device="cuda", exact_objective=True, max_iter=20)
    expected = quiet_fit(X, k, dtype="float64", **kwargs)
    split_rows = []
    real_split = _gemm.tf32_split
    monkeypatch.setattr(_gemm, "tf32_split", lambda xp, A: split_rows.append(A.shape[0]) or real_split(xp, A))
    runs = {"prepared": quiet_fit(X, k, **kwargs)}
    splits = {"prepared": sum(split_rows)}
    with small_device("cuda", int(2.5 * 12 * n * d), monkeypatch):  # the operand (12 n d bytes) does not fit
        split_rows.clear()
        runs["fp32"] = quiet_fit(X, k, **kwargs)
        splits["fp32"] = sum(split_rows)
        monkeypatch.setattr(_source, "SPLIT_PER_BLOCK_MIN_COLUMNS", k * l)
        split_rows.clear()
        runs["per block"] = quiet_fit(X, k, **kwargs)
        splits["per block"] = sum(split_rows)
    assert {way: r.method_params["gemm_mode"] for way, r in runs.items()} == \
        {"prepared": "3xtf32", "fp32": "fp32", "per block": "3xtf32"}
    assert splits["prepared"] == n and splits["fp32"] == 0  # once per fit; never
    assert splits["per block"] >= n * runs["per block"].n_iter  # every row in every iteration
    reference = kernel_kmeans_objective(kernel_matrix(X, kernel="rbf"), host(expected.labels), k=k)
    for way, result in runs.items():
        np.testing.assert_array_equal(host(result.labels), host(expected.labels), err_msg=way)
        assert result.exact_objective == pytest.approx(reference, rel=1e-5), way


def test_device_sampling_draws_distinct_members(device):
    """sample_members: each cluster gets min(width, n_c) distinct positive-weight members (in increasing order,
    padding repeats the first; a cluster without positive-weight members gets a row of 0), the same on every device
    for the same seed, and the positive-weight members' inclusion frequencies over 2000 seeds are width / n_c within
    4.5 standard errors (uniform sampling without replacement)."""
    from kkmgpu.engine.sampling import sample_members

    backend = _backend.resolve_device(device)
    cpu = _backend.Backend("cpu")
    rng = np.random.default_rng(63)
    n, k = 90, 5
    labels = rng.integers(0, 4, n).astype(np.int32)  # cluster 4 is empty ...
    weights = rng.uniform(0.5, 2.0, n)
    weights[::6] = 0.0
    labels[:3] = 4
    weights[:3] = 0.0                                 # ... of positive-weight points
    positive = weights > 0
    counts = np.bincount(labels[positive], minlength=k)
    hits = np.zeros(n)
    seeds = 2000
    with backend.activate():
        labels_d, positive_d = backend.asarray(labels), backend.asarray(positive)
        for s in range(seeds):
            width = (1, 7, int(counts.max()) + 2)[s % 3]
            index_h, mask = sample_members(labels, positive, counts, width, s * 7919, cpu)
            if s < 60:
                index_d, mask_d = sample_members(labels_d, positive_d, counts, width, s * 7919, backend)
                np.testing.assert_array_equal(host(index_d), index_h)
                np.testing.assert_array_equal(mask_d, mask)
            assert index_h.shape == (k, width)
            for c in range(k):
                row = index_h[c]
                assert mask[c].sum() == min(width, counts[c])
                drawn = row[mask[c]]
                assert np.all(labels[drawn] == c) and np.all(positive[drawn])
                assert np.all(np.diff(drawn) > 0)  # distinct, increasing
                assert np.all(row[~mask[c]] == (row[0] if counts[c] else 0))
            if width == 7:
                hits[index_h[mask]] += 1
    trials = len(range(1, seeds, 3))  # the draws of width 7
    p = np.where(positive, np.minimum(1.0, 7 / np.maximum(counts[labels], 1)), 0.0)
    assert np.all(np.abs(hits - trials * p) <= 4.5 * np.sqrt(trials * p * (1 - p)) + 1e-9), (hits, trials * p)


# --------------------------------------------------------------------------- when CATS is exact kernel k-means


def test_every_point_sampled_is_exact_whatever_rcond_and_dtype(device):
    """A cluster sampled in full gets its exact centroid (alpha = w / n_c), not M^+ L w / n through the
    eigenvalue cutoff: with l >= the largest cluster and theta = 0, float32 storage and even rcond = 0.5 give
    the labels and n_iter of method="exact" with tol = 0 from the same initial labels."""
    X, _ = blobs(240, 3, 4, seed=46, spread=2.0)
    init = random_partition(240, 4, 47)
    exact = kkmgpu.fit(X, 4, init=init, tol=0.0, device=device, max_iter=100)
    assert exact.n_iter >= 4
    for rcond in (None, 0.5):
        cats = kkmgpu.fit(X, 4, method="cats", n_samples_per_cluster=240, theta=0.0, rcond=rcond, init=init,
                          device=device, max_iter=100, exact_objective=True)
        np.testing.assert_array_equal(host(cats.labels), host(exact.labels))
        assert cats.n_iter == exact.n_iter and cats.stop_reason == "no point moved"
        assert cats.exact_objective == pytest.approx(exact.objective, rel=1e-5)


def test_theta_above_zero_can_stop_before_the_exact_labels(device):
    """Why the condition names theta = 0: the variance rule may stop CATS while points still move, even with
    every point sampled (here theta = 1e30 stops at the window, 2 iterations, where exact needs more)."""
    X, _ = blobs(240, 3, 4, seed=46, spread=2.0)
    init = random_partition(240, 4, 47)
    exact = kkmgpu.fit(X, 4, init=init, tol=0.0, device=device, max_iter=100)
    early = kkmgpu.fit(X, 4, method="cats", n_samples_per_cluster=240, theta=1e30, window=2, init=init,
                       device=device, max_iter=100)
    assert early.n_iter == 2 < exact.n_iter
    assert not np.array_equal(host(early.labels), host(exact.labels))


# --------------------------------------------------------------------------- the batched solve for large M_c


def psd_stack(m, l, rank, seed):
    """m symmetric PSD l x l matrices Phi^T Phi of the given rank, and right-hand sides Phi^T mu in their range
    (what L_c w_c / n_c is: the samples' inner products with a centroid); eigenvalues spread over about 1e3."""
    rng = np.random.default_rng(seed)
    Phi = rng.normal(size=(m, rank, l)) * np.logspace(0, -1.5, rank)[None, :, None]
    mu = rng.normal(size=(m, rank))
    return np.einsum("kri,krj->kij", Phi, Phi), np.einsum("kri,kr->ki", Phi, mu), Phi, mu


@pytest.mark.parametrize("rank", [10, 30])
def test_regularized_solve_gives_the_pseudoinverse_centroid(rank, device):
    """For M = Phi^T Phi and rhs = Phi^T mu, both routes give the centroid Phi x = mu (mu lies in the samples'
    span), and the same offsets x^T M x and projections M x that the assignment reads. The regularized route
    scales a component by 1 / (1 + (eps / lambda)^2): here at most 1e-6 off (eps = 1e-6 lambda_max, lambda >=
    1e-3 lambda_max)."""
    backend = _backend.resolve_device(device)
    M_h, rhs_h, Phi, mu = psd_stack(5, 50, rank, seed=48)
    with backend.activate():
        M, rhs = backend.asarray(M_h), backend.asarray(rhs_h)
        pinv = host(_cats._pinv_solve(M, rhs, 1e-6, backend))
        reg = host(_cats._regularized_solve(M, rhs, 1e-6, backend))
    for x in (pinv, reg):
        centroid = np.einsum("kri,ki->kr", Phi, x)
        np.testing.assert_allclose(centroid, mu, rtol=0, atol=1e-5 * np.abs(mu).max())
    np.testing.assert_allclose(np.einsum("kij,kj->ki", M_h, reg), np.einsum("kij,kj->ki", M_h, pinv),
                               rtol=0, atol=1e-5 * np.abs(rhs_h).max())
    np.testing.assert_allclose(np.einsum("ki,kij,kj->k", reg, M_h, reg), np.einsum("ki,kij,kj->k", pinv, M_h, pinv),
                               rtol=1e-5)


def test_regularized_solve_drops_what_the_cutoff_drops(device):
    """An indefinite M (eigenvalues 1, -0.5, 1e-9, 0, ...): components with |lambda| above the cutoff are inverted
    (either sign); those below it are not (a plain inverse would make the 1e-9 one 1e-9 / 1e-9 = 1), and add
    nothing to M x or x^T M x, the quantities the assignment reads."""
    backend = _backend.resolve_device(device)
    rng = np.random.default_rng(49)
    l = 40
    V = np.linalg.qr(rng.normal(size=(l, l)))[0]
    lam = np.zeros(l)
    lam[:3] = (1.0, -0.5, 1e-9)
    M_h = (V * lam) @ V.T
    rhs_h = V @ np.r_[1.0, 2.0, 1e-9, rng.normal(size=l - 3) * 1e-12]
    with backend.activate():
        M, rhs = backend.asarray(M_h[None]), backend.asarray(rhs_h[None])
        x = host(_cats._regularized_solve(M, rhs, 1e-6, backend))[0]
        p = host(_cats._pinv_solve(M, rhs, 1e-6, backend))[0]
    for solution in (x, p):
        coeffs = V.T @ solution
        np.testing.assert_allclose(coeffs[:2], [1.0, -4.0], rtol=1e-6)
        assert np.abs(coeffs[2:]).max() < 1e-3
        np.testing.assert_allclose(M_h @ solution, V[:, :2] @ [1.0, 2.0], rtol=0, atol=1e-10)
        assert solution @ M_h @ solution == pytest.approx(1.0 - 0.5 * 16.0, rel=1e-6)


@pytest.mark.gpu
@pytest.mark.parametrize(("name", "rtol", "moved"), [("rbf", 1e-3, 0), ("precomputed", 1e-3, 0), ("sigmoid", 1e-2, 5)])
def test_gpu_batched_solve_gives_the_eigh_route_run(name, rtol, moved, monkeypatch):
    """On a GPU with M_c above 32 x 32: the one batched regularized solve and the per-cluster eigendecomposition
    give the same run (same seeds, same samples). The approximate distortions differ by the soft cutoff
    (components of M_c near rcond x its largest eigenvalue; on the stand-in 1.6e-4 relative for rbf in float32 here
    at the default gamma of the per-feature variance, 1e-5 at the earlier X.var() rule's, up to 0.9% over other
    seeds: the history is held to 1e-3, labels, n_iter and the exact objective exactly); for the sigmoid kernel,
    whose M_c are indefinite, a point near a boundary may
    land elsewhere (1 of 900 here, the run one iteration longer): at most ``moved`` labels differ, then n_iter by
    at most one and the exact objectives by 1e-4."""
    from conftest import require_cuda

    require_cuda()
    X, _ = blobs(900, 3, 4, seed=50, spread=2.0)
    case = KERNEL_CASES[name]
    data = kernel_matrix(X, kernel="rbf") if name == "precomputed" else X
    kwargs = dict(method="cats", n_samples_per_cluster=45, init=random_partition(900, 4, 51), random_state=3,
                  device="cuda", max_iter=15, exact_objective=True, **case)
    monkeypatch.setattr(_cats, "GPU_LARGE_M_SOLVER", "eigh")
    calls = record_samples(monkeypatch)
    loop = quiet_fit(data, 4, **kwargs)
    assert min(shape[1] for _, _, shape, _ in calls) > _cats.GPU_BATCHED_EIGH_MAX  # the per-cluster route ran
    monkeypatch.setattr(_cats, "GPU_LARGE_M_SOLVER", "regularized")
    batched = quiet_fit(data, 4, **kwargs)
    different = int((host(batched.labels) != host(loop.labels)).sum())
    assert different <= moved
    if different == 0:
        assert batched.n_iter == loop.n_iter
        assert batched.exact_objective == pytest.approx(loop.exact_objective, rel=1e-9)
    assert abs(batched.n_iter - loop.n_iter) <= 1
    assert batched.exact_objective == pytest.approx(loop.exact_objective, rel=1e-4)
    common = min(batched.n_iter, loop.n_iter)
    np.testing.assert_allclose(batched.objective_history[:common], loop.objective_history[:common], rtol=rtol)


@pytest.mark.parametrize("l", [_cats.GPU_BATCHED_EIGH_MAX + 1, _cats.GPU_REGULARIZED_MIN - 1,
                               _cats.GPU_REGULARIZED_MIN, 300])
def test_solve_route_follows_the_measured_crossover(l):
    """On a GPU: one batched eigendecomposition up to 32 x 32, one per cluster below GPU_REGULARIZED_MIN (128, where
    the 2026-11-24 H100 measurement has the batched regularized solve faster), the batched solve from there on;
    the CPU always decomposes in one batch. The forced routes override the crossover."""
    class GpuLike:
        is_gpu = True

    class CpuLike:
        is_gpu = False

    expected = "regularized" if l >= _cats.GPU_REGULARIZED_MIN else "eigh per cluster"
    assert _cats.solve_route(l, GpuLike()) == expected
    assert _cats.solve_route(_cats.GPU_BATCHED_EIGH_MAX, GpuLike()) == "batched eigh"
    assert _cats.solve_route(l, CpuLike()) == "batched eigh"
    for forced, route in (("eigh", "eigh per cluster"), ("regularized", "regularized")):
        previous, _cats.GPU_LARGE_M_SOLVER = _cats.GPU_LARGE_M_SOLVER, forced
        try:
            assert _cats.solve_route(l, GpuLike()) == route
        finally:
            _cats.GPU_LARGE_M_SOLVER = previous


@pytest.mark.parametrize("l", [_cats.GPU_REGULARIZED_MIN, 200])
def test_both_solves_match_the_float64_pseudoinverse(l, device):
    """At the sizes where the regularized solve is the GPU default, both routes against NumPy's float64
    pseudoinverse (eigenvalues below rcond x the largest dropped) on PSD stacks of rank l / 4 whose right-hand sides
    lie in their range (as L_c w_c / n_c does): the projections M x and offsets x^T M x the assignment reads agree
    to 1e-6 of their scale (the soft cutoff scales a kept component by 1 / (1 + (eps / lambda)^2) <= 1e-6 off)."""
    backend = _backend.resolve_device(device)
    M_h, rhs_h, _, _ = psd_stack(3, l, l // 4, seed=l)
    x_ref = np.stack([np.linalg.pinv(M_h[c], rcond=1e-6, hermitian=True) @ rhs_h[c] for c in range(3)])
    with backend.activate():
        M, rhs = backend.asarray(M_h), backend.asarray(rhs_h)
        routes = {"eigh": host(_cats._pinv_solve(M, rhs, 1e-6, backend)),
                  "regularized": host(_cats._regularized_solve(M, rhs, 1e-6, backend))}
    projection = np.einsum("kij,kj->ki", M_h, x_ref)
    offsets = np.einsum("ki,kij,kj->k", x_ref, M_h, x_ref)
    for route, x in routes.items():
        np.testing.assert_allclose(np.einsum("kij,kj->ki", M_h, x), projection, rtol=0,
                                   atol=1e-6 * np.abs(projection).max(), err_msg=route)
        np.testing.assert_allclose(np.einsum("ki,kij,kj->k", x, M_h, x), offsets, rtol=1e-6, err_msg=route)


# --------------------------------------------------------------------------- progress hook


def test_callback_reports_every_iteration(monkeypatch, device):
    """The progress hook of run_restarts / cats: one report per iteration, in order, with the run's distortions."""
    reports = []
    original = _cats.run_restarts
    def spy(*args, callback=None, **kw):  # fit passes its own callback (the progress bar): keep it working
        def both(report):
            reports.append(report)
            if callback is not None:
                callback(report)
        return original(*args, callback=both, **kw)

    monkeypatch.setattr(_cats, "run_restarts", spy)
    X, _ = blobs(200, 2, 3, seed=52)
    result = quiet_fit(X, 3, method="cats", n_samples_per_cluster=10, init="random", n_init=2, max_iter=30,
                       random_state=4, device=device)
    per_restart = [[r for r in reports if r["restart"] == restart] for restart in (0, 1)]
    assert len(reports) == sum(len(p) for p in per_restart)
    for p in per_restart:
        assert [r["iteration"] for r in p] == list(range(1, len(p) + 1))
        assert all(r["max_iter"] == 30 and r["samples_per_cluster"] == 10 for r in p)
    best = per_restart[int(np.argmin(result.objectives))]
    np.testing.assert_array_equal([r["distortion"] for r in best], result.objective_history)
    assert (best[-1]["moved"] == 0) == (result.stop_reason == "no point moved")
