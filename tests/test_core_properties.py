"""Properties of the core numerics that hand-made mutants showed no other test checks (issue 14, point 13).

Each test holds the library to an independent float64 reference written here (or in tests/reference.py), or
to scikit-learn:

- k-means++ seeding: the mean seeding cost over many seeds matches a reference weighted greedy k-means++,
  and a zero-weight point is never a seed;
- the empty-cluster refill (helper and full fit) when the farthest point is alone in its cluster and when a
  cluster holds only zero-weight points;
- float16 storage of kernels with negative values (sigmoid, polynomial with negative coef0);
- exact and CATS with the linear kernel unchanged when X is scaled by 1e+-7 and when clusters differ in scale
  by orders of magnitude (CATS's pseudoinverse cutoff is per cluster);
- limited and full one-step checks of the critical bandwidth agreeing on mirror-symmetric data with exact ties;
- the tiled engine's distance-kernel values at most 1 (exactly) for float32 duplicate points;
- Davies-Bouldin when two centroids coincide up to rounding, against scikit-learn.
"""

import math
import warnings

import numpy as np
import pytest
from reference import kernel_kmeans_objective, kernel_matrix

import kkmgpu
from kkmgpu.backend import device as _backend
from kkmgpu.kernels import spec as _kernel_spec
from kkmgpu.bandwidth import offgrid as _offgrid
from kkmgpu.engine.dense import DenseKernelOperator
from kkmgpu.engine.lloyd import kmeans_plus_plus, random_partition, refill_empty_clusters
from kkmgpu.engine.tiled import TiledKernelOperator
from synthetic import host, quiet_fit


def blobs(rng, sizes, d, spread=4.0, noise=1.0):
    centres = rng.normal(scale=spread, size=(len(sizes), d))
    y = np.repeat(np.arange(len(sizes)), sizes)
    return centres[y] + noise * rng.normal(size=(len(y), d)), y


# --------------------------------------------------------------------------- k-means++ seeding


def reference_kmeans_plus_plus(K, w, k, rng, n_local_trials=None):
    """Greedy weighted k-means++ (Arthur & Vassilvitskii; scikit-learn's greedy variant) in feature space.

    Seeds: the first drawn with probability w_i / sum w; each next one the best (lowest weighted potential) of
    ``n_local_trials`` candidates drawn with probability w_i D_i^2 / sum_j w_j D_j^2, D_i the feature-space
    distance to the nearest seed so far. Returns (seed indices, labels: each point to its nearest seed).
    """
    n = K.shape[0]
    diag = np.diag(K)
    D2 = np.maximum(diag[:, None] + diag[None, :] - 2.0 * K, 0.0)  # D2[i, j] = ||phi_i - phi_j||^2
    trials = 2 + int(math.log(k)) if n_local_trials is None else n_local_trials
    seeds = [int(rng.choice(n, p=w / w.sum()))]
    closest = D2[seeds[0]].copy()
    for _ in range(1, k):
        p = w * closest
        candidates = rng.choice(n, size=trials, p=p / p.sum())
        potentials = [float(w @ np.minimum(closest, D2[c])) for c in candidates]
        best = int(candidates[int(np.argmin(potentials))])
        seeds.append(best)
        closest = np.minimum(closest, D2[best])
    labels = np.argmin(D2[seeds], axis=0)
    labels[seeds] = np.arange(k)
    return np.array(seeds), labels


def seeding_costs(K, w, k, seeds, device):
    """Objectives (reference float64) of the library's and the reference's seeded partitions, one per seed."""
    backend = _backend.resolve_device(device)
    operator = DenseKernelOperator(backend.asarray(K), backend.asarray(w), backend)
    ours, theirs = [], []
    for s in range(seeds):
        labels = kmeans_plus_plus(operator, k, np.random.default_rng(s))
        ours.append(kernel_kmeans_objective(K, labels, w, k=k))
        _, ref_labels = reference_kmeans_plus_plus(K, w, k, np.random.default_rng(10_000 + s))
        theirs.append(kernel_kmeans_objective(K, ref_labels, w, k=k))
    return np.array(ours), np.array(theirs)


def test_kmeans_plus_plus_cost_matches_reference(device):
    """The mean seeding cost over many seeds equals the reference's, within 4 standard errors; weights matter:
    a small blob carries most of the weight, so an unweighted draw or a non-greedy one costs measurably more."""
    rng = np.random.default_rng(3)
    X, y = blobs(rng, [60, 60, 60, 6, 60], 2, spread=5.0)
    w = rng.uniform(0.5, 1.5, len(X))
    w[y == 3] = 40.0  # six heavy points: one seed belongs there
    K = kernel_matrix(X, kernel="rbf", gamma=0.05)
    seeds = 300
    ours, theirs = seeding_costs(K, w, 5, seeds, device)
    se = math.sqrt(ours.var(ddof=1) / seeds + theirs.var(ddof=1) / seeds)
    assert abs(ours.mean() - theirs.mean()) <= 4.0 * se, (ours.mean(), theirs.mean(), se)
    # the comparison can tell seedings apart: unweighted greedy seeding or a single trial costs more
    unweighted = np.array([kernel_kmeans_objective(
        K, reference_kmeans_plus_plus(K, np.ones_like(w), 5, np.random.default_rng(s))[1], w, k=5)
        for s in range(seeds)])
    single = np.array([kernel_kmeans_objective(
        K, reference_kmeans_plus_plus(K, w, 5, np.random.default_rng(s), n_local_trials=1)[1], w, k=5)
        for s in range(seeds)])
    assert unweighted.mean() - theirs.mean() > 8.0 * se
    assert single.mean() - theirs.mean() > 8.0 * se


@pytest.mark.parametrize("duplicates", [False, True], ids=["distinct", "fewer-distinct-than-k"])
def test_kmeans_plus_plus_never_seeds_a_zero_weight_point(device, duplicates):
    """Zero-weight points lie far from everything: as a seed one would make a cluster of zero-weight points only.
    With fewer distinct positive-weight points than k, the remaining seeds are positive-weight duplicates."""
    rng = np.random.default_rng(5)
    if duplicates:
        base = rng.normal(size=(3, 2))
        X = np.vstack([base[rng.integers(0, 3, 30)], 50.0 + rng.normal(size=(10, 2))])
        k = 5
    else:
        X = np.vstack([rng.normal(size=(40, 2)), 50.0 + rng.normal(size=(10, 2))])
        k = 4
    w = np.r_[rng.uniform(0.5, 2.0, len(X) - 10), np.zeros(10)]
    backend = _backend.resolve_device(device)
    K = kernel_matrix(X, kernel="linear")
    operator = DenseKernelOperator(backend.asarray(K), backend.asarray(w), backend)
    for s in range(40):
        labels = kmeans_plus_plus(operator, k, np.random.default_rng(s))
        positive_per_cluster = np.bincount(labels[w > 0], minlength=k)
        assert positive_per_cluster.min() > 0, (s, labels)


def test_random_partition_is_uniform_with_no_empty_cluster():
    """init="random": int32 labels in [0, k), every cluster present, each label about equally frequent."""
    rng = np.random.default_rng(59)
    for n, k in [(7, 7), (50, 1), (300, 6)]:
        counts = np.zeros(k)
        for _ in range(200):
            labels = random_partition(n, k, rng)
            assert labels.dtype == np.int32 and labels.shape == (n,)
            assert labels.min() == 0 and labels.max() == k - 1
            assert np.bincount(labels, minlength=k).min() >= 1
            counts += np.bincount(labels, minlength=k)
        expected = 200 * n / k
        assert np.all(np.abs(counts - expected) <= 5 * math.sqrt(expected) + 1e-9), counts


# --------------------------------------------------------------------------- empty-cluster refill


def reference_refill(labels, point_dist, weights, k):
    """Fill empty clusters (no positive-weight member) in increasing index, each with the positive-weight point
    of largest distance (first index on ties) whose cluster keeps a positive-weight point. Returns (labels,
    number of times the farthest remaining point was passed over because it was alone)."""
    labels = labels.copy()
    positive = weights > 0
    skipped_alone = 0
    for c in range(k):
        counts = np.bincount(labels[positive], minlength=k)
        if counts[c] > 0:
            continue
        order = np.flatnonzero(positive)
        order = order[np.argsort(-point_dist[order], kind="stable")]
        for p in order:
            if counts[labels[p]] >= 2:
                labels[p] = c
                point_dist[p] = 0.0
                break
            if point_dist[p] > 0:
                skipped_alone += 1
    return labels, skipped_alone


def test_refill_skips_a_farthest_point_that_is_alone():
    labels = np.array([0, 1, 1, 1, 1, 3], dtype=np.int32)
    dist = np.array([9.0, 1.0, 4.0, 2.0, 3.0, 8.0])
    w = np.ones(6)
    out = labels.copy()
    assert refill_empty_clusters(out, dist.copy(), w, 4) == 0
    # points 0 and 5 are farthest but alone; cluster 2 takes point 2 (farthest of cluster 1)
    np.testing.assert_array_equal(out, [0, 1, 2, 1, 1, 3])
    np.testing.assert_array_equal(out, reference_refill(labels, dist.copy(), w, 4)[0])


def test_refill_treats_a_cluster_of_zero_weight_points_as_empty():
    labels = np.array([0, 0, 0, 1, 1, 2, 2], dtype=np.int32)
    dist = np.array([1.0, 2.0, 3.0, 30.0, 20.0, 10.0, 0.5])
    w = np.array([1.0, 1.0, 1.0, 0.0, 0.0, 1.0, 1.0])
    out = labels.copy()
    assert refill_empty_clusters(out, dist.copy(), w, 3) == 0
    # cluster 1 has no weight: the farthest positive-weight point of a cluster keeping weight (5) goes there;
    # the zero-weight points 3 and 4, farther still, are never candidates
    np.testing.assert_array_equal(out, [0, 0, 0, 1, 1, 1, 2])
    np.testing.assert_array_equal(out, reference_refill(labels, dist.copy(), w, 3)[0])
    # two positive-weight points for three clusters: one stays empty, and nothing is taken from a lone point
    w2 = np.array([0.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.0])
    out2 = labels.copy()
    assert refill_empty_clusters(out2, dist.copy(), w2, 3) == 1
    np.testing.assert_array_equal(out2, labels)


def test_refill_matches_reference_on_random_cases():
    rng = np.random.default_rng(11)
    alone_seen = 0
    for _ in range(300):
        n, k = int(rng.integers(4, 15)), int(rng.integers(2, 6))
        labels = rng.integers(0, k, n).astype(np.int32)
        dist = rng.choice([0.0, 1.0, 2.0, 3.0, 5.0], n) * rng.uniform(0.5, 1.0)  # ties included
        w = rng.choice([0.0, 1.0, 2.5], n, p=[0.3, 0.5, 0.2])
        if (w > 0).sum() < k:
            continue
        expected, skipped = reference_refill(labels, dist.copy(), w, k)
        alone_seen += skipped > 0
        out = labels.copy()
        assert refill_empty_clusters(out, dist.copy(), w, k) == 0
        np.testing.assert_array_equal(out, expected)
    assert alone_seen > 10  # the case "farthest point alone in its cluster" is exercised


def reference_weighted_lloyd(K, init, k, w, max_iter=100):
    """Float64 Lloyd iterations of Eq. 4 where a cluster without positive weight counts as empty (+inf)."""
    n = K.shape[0]
    diag = np.diag(K)
    labels = np.asarray(init).copy()
    events = 0
    for _ in range(max_iter):
        dist = np.full((n, k), np.inf)
        for c in range(k):
            members = np.flatnonzero(labels == c)
            n_c = w[members].sum()
            if n_c <= 0:
                continue
            S_c = K[:, members] @ w[members]
            dist[:, c] = diag - 2.0 * S_c / n_c + (w[members] @ S_c[members]) / n_c**2
        new = np.argmin(dist, axis=1)
        point_dist = dist[np.arange(n), new]
        new, skipped = reference_refill(new, point_dist, w, k)
        events += skipped
        if np.array_equal(new, labels):
            break
        labels = new
    return labels, events


@pytest.mark.parametrize("case", ["lone-outlier", "zero-weight-cluster"])
def test_fit_refills_empty_clusters_like_reference(device, case):
    """Full fits (float64, given initial labels) follow the reference through refills of both kinds."""
    rng = np.random.default_rng(17)
    X, _ = blobs(rng, [30, 30, 30], 2, spread=3.0)
    n, k = len(X) + 1, 4
    # a far outlier starts in cluster 2 with ten ordinary points, whose centre is then far from everything: the
    # first step leaves the outlier alone in cluster 2, farthest from its centre, while cluster 3 is empty
    X = np.vstack([X, [[500.0, 500.0]]])
    w = rng.uniform(0.5, 2.0, n)
    init = rng.integers(0, 2, n)
    init[rng.choice(n - 1, 10, replace=False)] = 2
    init[-1] = 2
    if case == "zero-weight-cluster":
        zero = rng.choice(n - 1, 5, replace=False)
        w[zero] = 0.0
        init[zero] = 3  # cluster 3 holds only zero-weight points: empty in the weighted sense
    K = kernel_matrix(X, kernel="linear")
    expected, events = reference_weighted_lloyd(K, init, k, w)
    result = quiet_fit(X, k, kernel="linear", init=init, sample_weight=w, dtype="float64", tol=0.0, device=device)
    np.testing.assert_array_equal(host(result.labels), expected)
    assert np.bincount(expected[w > 0], minlength=k).min() > 0
    if case == "lone-outlier":
        assert events > 0  # the reference passed over the lone outlier at least once


# --------------------------------------------------------------------------- float16 storage, negative kernels


@pytest.mark.parametrize("kernel, params", [
    ("sigmoid", dict(gamma=0.3, coef0=-0.5)),
    ("sigmoid", dict(gamma=0.2, coef0=0.1)),
    ("polynomial", dict(gamma=0.5, coef0=-1.0, degree=3)),
    ("polynomial", dict(gamma=0.2, coef0=-0.5, degree=5)),
], ids=["sigmoid-neg", "sigmoid", "poly3-neg", "poly5-neg"])
def test_float16_storage_of_negative_kernels(device, kernel, params):
    rng = np.random.default_rng(23)
    X, y = blobs(rng, [40, 40, 40], 3, spread=1.5, noise=0.6)
    expected = kernel_matrix(X, kernel=kernel, **params)
    assert (expected < -0.05).mean() > 0.1  # a good share of negative values
    assert np.abs(expected).max() < 6e4  # float16 holds them (overflow is another test's matter)
    K = host(kkmgpu.kernel_matrix(X, kernel=kernel, dtype="float16", device=device, **params))
    assert K.dtype == np.float16
    # float16 keeps 11 significant bits: rounding to it errs by at most 2^-11 relative (2^-25 absolute in the
    # subnormal range); the float32 computation errs in the argument u = gamma <x, y> + coef0 by about
    # 8 eps32 (gamma |x| |y| + |coef0|), which the kernel's derivative carries into the value
    norms = np.linalg.norm(X, axis=1)
    u = params["gamma"] * (X @ X.T) + params["coef0"]
    u_error = 8 * np.finfo(np.float32).eps * (params["gamma"] * np.outer(norms, norms) + abs(params["coef0"]))
    slope = 1.0 if kernel == "sigmoid" else params["degree"] * (np.abs(u) + u_error) ** (params["degree"] - 1)
    # float16 storage holds K / 2^e with its largest value at most 1 (kkmgpu.kernels.spec's value_scale: GPU products
    # of float16 blocks return float16 sums), and values below float16's smallest normal number (2^-14) are not
    # kept to full subnormal precision there: the absolute floor is 2^-14 * 2^e in K's units, at most 2^-13 of
    # max |K| (below float16's 2^-11 relative rounding of the largest values)
    floor = 2.0 ** -14 * 2.0 ** max(0, math.ceil(math.log2(np.abs(expected).max())))
    tol = 2.0 ** -11 * np.abs(expected) + slope * u_error + floor
    assert np.all(np.abs(K.astype(np.float64) - expected) <= tol)
    kept = np.abs(expected) > floor
    assert np.array_equal(np.sign(K[kept]), np.sign(expected[kept]))
    # a fit on the float16 matrix reports the objective of its labels on the stored values, and its labels are
    # those of the float64 fit from the same start
    init = (y + (rng.random(len(y)) < 0.2)) % 3
    r16 = quiet_fit(X, 3, kernel=kernel, dtype="float16", init=init, tol=0.0, device=device, **params)
    r64 = quiet_fit(X, 3, kernel=kernel, dtype="float64", init=init, tol=0.0, device=device, **params)
    K16 = K.astype(np.float64)
    # (partial sums of float16 values run in float32 over blocks of 128 rows: ~1e-7 of the terms' magnitude)
    assert r16.objective == pytest.approx(kernel_kmeans_objective(K16, host(r16.labels), k=3), rel=1e-6,
                                          abs=1e-6 * np.abs(np.diag(K16)).sum())
    agree = (host(r16.labels) == host(r64.labels)).mean()
    assert agree >= 0.97


# --------------------------------------------------------------------------- scale invariance, linear kernel


def linear_scale_case(rng):
    """Four groups of very different scales: two of spread 1e-4 at +-1e-3 from the origin (their M_c have
    eigenvalues ~1e-5), one of spread 1 at 5e3 and one of spread 1e3 at 6e3 (eigenvalues ~1e9)."""
    parts = [np.array([1e-3, 0.0]) + 1e-4 * rng.normal(size=(20, 2)),
             np.array([-1e-3, 0.0]) + 1e-4 * rng.normal(size=(20, 2)),
             np.array([5e3, 0.0]) + 1.0 * rng.normal(size=(20, 2)),
             np.array([0.0, 6e3]) + 1e3 * rng.normal(size=(20, 2))]
    return np.vstack(parts), np.repeat([0, 1, 2, 3], 20)


@pytest.mark.parametrize("method", ["exact", "cats"])
@pytest.mark.parametrize("scale", [1e-7, 1.0, 1e7], ids=["1e-7", "1", "1e7"])
def test_linear_kernel_is_scale_invariant(device, method, scale):
    """Labels from the same start do not depend on a common scale of X; CATS sampling every member (l at least
    the largest cluster, theta=0) gives exact's labels, although M_c of the small cluster has eigenvalues
    ~1e12 times smaller than the large one's (the pseudoinverse cutoff is relative to each M_c)."""
    rng = np.random.default_rng(29)
    X, y = linear_scale_case(rng)
    init = y.copy()
    swap = rng.choice(40, 8, replace=False)  # a few points of the two small groups start in the other one
    init[swap] = 1 - init[swap]
    reference_labels = None
    extra = dict(n_samples_per_cluster=len(y), theta=0.0) if method == "cats" else {}
    result = quiet_fit(X * scale, 4, kernel="linear", init=init, dtype="float64", tol=0.0, device=device,
                       method=method, **extra)
    reference_labels = host(quiet_fit(X, 4, kernel="linear", init=init, dtype="float64", tol=0.0,
                                      device="cpu").labels)
    np.testing.assert_array_equal(host(result.labels), reference_labels)
    np.testing.assert_array_equal(reference_labels, y)  # plain k-means on these groups recovers them


# --------------------------------------------------------------------------- critical bandwidth, exact ties


def mirror_set(rng):
    """Cluster 1 is cluster 0 mirrored at x = 0, members in the same order; two zero-weight points on the mirror
    (in cluster 0) are exactly as near to both clusters at every bandwidth (ties go to the lowest index: they
    stay). Cluster 0 is a blob of 8 points top left and 4 bottom right: a fixed point at small bandwidths, not
    at large ones (the bottom-right points then join cluster 1), so the critical bandwidth is finite."""
    half = np.vstack([[-3.0, 3.0] + 0.3 * rng.normal(size=(8, 2)), [3.0, -3.0] + 0.3 * rng.normal(size=(4, 2))])
    tie = np.array([[0.0, 0.3], [0.0, -1.1]])
    X = np.vstack([half, tie, half * [-1.0, 1.0]])
    labels = np.r_[np.zeros(14, int), np.ones(12, int)]
    w = np.r_[np.ones(12), np.zeros(2), np.ones(12)]
    return X, labels, w


def tie_aware_moves(D, labels, w, sigma, rtol=1e-9):
    """Points one assignment step moves (float64, Eq. 2), exact ties resolved to the lowest index."""
    K = np.exp(-D / sigma)
    k = int(labels.max()) + 1
    Y = np.zeros((len(labels), k))
    Y[np.arange(len(labels)), labels] = w
    S = K @ Y
    sizes = Y.sum(0)
    dist = 1.0 - 2.0 * S / sizes + (Y * S).sum(0) / sizes**2
    best = dist.min(axis=1, keepdims=True)
    new = np.argmax(dist <= best + rtol * np.abs(best).max(), axis=1)  # first index within rounding of the min
    return np.flatnonzero(new != labels)


def test_limited_and_full_checks_agree_on_exact_ties(device, monkeypatch):
    monkeypatch.setattr(_offgrid, "LIMITED_CHECK_MAX_COST", 1e9)  # use limited checks even where they do not pay
    backend = _backend.resolve_device(device)
    for seed in range(3):
        rng = np.random.default_rng(40 + seed)
        X, labels, w = mirror_set(rng)
        D = ((X[:, None, :] - X[None, :, :]) ** 2).sum(-1)
        sigma = 1.0
        assert tie_aware_moves(D, labels, w, sigma).size == 0
        K = np.exp(-D / sigma)
        with_limited = kkmgpu.critical_bandwidth(K=K, labels=labels, sigma=sigma, sample_weight=w, depth=10,
                                                 device=device)
        without = kkmgpu.critical_bandwidth(K=K, labels=labels, sigma=sigma, sample_weight=w, depth=10,
                                            device=device, limit_checks=False)
        assert with_limited.n_limited_checks > 0
        assert (with_limited.lower, with_limited.upper) == (without.lower, without.upper)
        np.testing.assert_array_equal(with_limited.moved, without.moved)
        assert not set(host(with_limited.moved).tolist()) & {12, 13}  # the tied points never move
        # question by question: the limited check never reports a move the full check does not make
        question = _offgrid.OneStepQuestion(backend, backend.asarray(labels.astype(np.int32)),
                                            backend.asarray(w), 2, limited=True)
        for s in np.geomspace(sigma, 1000 * sigma, 40):
            Ks = backend.asarray(np.exp(-D / s))
            n_full, moved_full = question.full(Ks)
            expected = tie_aware_moves(D, labels, w, s)
            assert n_full == expected.size and set(expected.tolist()) == set(host(moved_full).tolist()
                                                                             if n_full else [])
            limited = question.limited_check(Ks)
            if limited is not None:
                assert set(host(limited).tolist()) <= set(expected.tolist())


def test_critical_bandwidth_does_not_hang_on_rounding(device, monkeypatch):
    """A GPU sums each cluster in its own order (atomics), so cluster sums that are equal in exact arithmetic
    differ in the last bits. Emulated here on every device: cluster sums perturbed by a few ulps must leave the
    critical bandwidth and the movers unchanged (a tied point moving on noise once gave 2.0 instead of 47)."""
    rng = np.random.default_rng(40)
    X, labels, w = mirror_set(rng)
    D = ((X[:, None, :] - X[None, :, :]) ** 2).sum(-1)
    K = np.exp(-D)
    clean = kkmgpu.critical_bandwidth(K=K, labels=labels, sigma=1.0, sample_weight=w, depth=10, device=device)
    original = DenseKernelOperator.cluster_sums
    noise = np.random.default_rng(41)

    def noisy(self, labels_d, k):
        S = original(self, labels_d, k)
        factor = 1.0 + 4e-16 * noise.choice([-1.0, 1.0], size=S.shape)
        return S * self.backend.asarray(factor)

    monkeypatch.setattr(_offgrid.DenseKernelOperator, "cluster_sums", noisy)
    perturbed = kkmgpu.critical_bandwidth(K=K, labels=labels, sigma=1.0, sample_weight=w, depth=10, device=device)
    assert (perturbed.lower, perturbed.upper) == (clean.lower, clean.upper)
    np.testing.assert_array_equal(host(perturbed.moved), host(clean.moved))
    assert not set(host(perturbed.moved).tolist()) & {12, 13}


# --------------------------------------------------------------------------- tiled engine, duplicates


@pytest.mark.parametrize("kernel", ["rbf", "laplacian"])
def test_tiled_distance_kernel_at_most_one_for_float32_duplicates(device, kernel):
    """Duplicate points far from the origin: ||x||^2 + ||y||^2 - 2 <x, y> rounds to either sign in float32.
    Every kernel value the tiled engine forms (rows for seeding, full and incremental cluster sums with one
    point per cluster, so S is K itself) stays <= 1 exactly, and within float32 rounding of the reference."""
    rng = np.random.default_rng(31)
    base = rng.normal(size=(8, 5)) + 3.0
    X = np.vstack([base[rng.integers(0, 8, 60)], rng.normal(size=(20, 5)) + 3.0]).astype(np.float32)
    n = len(X)
    backend = _backend.resolve_device(device)
    spec = _kernel_spec.resolve_kernel(kernel, gamma=1.0, X=X)  # not centred: the rounding is largest off-centre
    A = backend.asarray(X)
    op = TiledKernelOperator(A, spec, backend.asarray(np.ones(n)), backend, tile_rows=7)
    ref = kernel_matrix(X.astype(np.float64), kernel=kernel, gamma=1.0)
    gram_rounding = 8 * np.finfo(np.float32).eps * float((X.astype(np.float64) ** 2).sum(1).max())
    atol = (gram_rounding if kernel == "rbf" else math.sqrt(gram_rounding)) + 1e-6
    rows = op.rows(np.arange(n))
    S = host(op.cluster_sums(backend.asarray(np.arange(n, dtype=np.int32)), n))
    shifted = np.roll(np.arange(n, dtype=np.int32), 1)
    S_inc = host(op.cluster_sums(backend.asarray(shifted), n))
    S_inc = host(op.update_cluster_sums(backend.asarray(S_inc), backend.asarray(shifted),
                                        backend.asarray(np.arange(n, dtype=np.int32))))
    duplicate = (ref == 1.0) & ~np.eye(n, dtype=bool)
    assert duplicate.sum() > 100
    for got in (rows, S, S_inc):
        assert np.all(got <= 1.0), float(got.max() - 1.0)
        np.testing.assert_allclose(got, ref, rtol=0, atol=atol)
        np.testing.assert_array_equal(np.diag(got), 1.0)


# --------------------------------------------------------------------------- Davies-Bouldin


def test_davies_bouldin_with_centroids_coinciding_up_to_rounding(device):
    """Two clusters share a centroid (one mirror-symmetric inside the other); the data mean is not representable,
    so after centring their computed centroids differ by ~1e-16. scikit-learn counts the pair as coinciding."""
    sk_metrics = pytest.importorskip("sklearn.metrics", reason="scikit-learn is needed for the reference score")
    rng = np.random.default_rng(0)
    for _ in range(5):
        c = rng.normal(size=2) * 3 + 0.1
        a = rng.normal(size=(20, 2))
        X = np.vstack([c + 0.3 * a, c - 0.3 * a, c + 2 * a, c - 2 * a, c + 20 + 0.5 * rng.normal(size=(20, 2))])
        y = np.repeat([0, 1, 2], [40, 40, 20])
        expected = sk_metrics.davies_bouldin_score(X, y)
        assert 0.01 < expected < 1.0
        assert kkmgpu.metrics.davies_bouldin(X, y, device=device) == pytest.approx(expected, rel=1e-9)
    # a genuinely small but representable gap between centroids is still a gap
    X = np.array([[0.0, 0.0], [0.0, 2.0], [1e-6, 0.0], [1e-6, 2.0], [9.0, 0.0], [9.0, 2.0]])
    y = np.array([0, 0, 1, 1, 2, 2])
    # spreads 1, gaps 1e-6 and ~9: (2e6 + 2e6 + max ratio of cluster 2) / 3, written out (scikit-learn's GEMM-form
    # centroid distances lose five digits of the 1e-6 gap here)
    far = 2.0 / math.hypot(9.0 - 1e-6, 0.0)
    assert kkmgpu.metrics.davies_bouldin(X, y, device=device) == pytest.approx((4e6 + far) / 3, rel=1e-9)


# --------------------------------------------------------------------------- survivors of the mutation run
# (docs/mutation-testing.md): properties the suite did not pin down


def weighted_sse(X, labels, w):
    """sum_i w_i ||x_i - m_c||^2 with m_c the weighted mean of cluster c (clusters without weight add 0)."""
    total = 0.0
    for c in np.unique(labels):
        members = labels == c
        if w[members].sum() == 0:
            continue
        m = (w[members, None] * X[members]).sum(0) / w[members].sum()
        total += float((w[members] * ((X[members] - m) ** 2).sum(1)).sum())
    return total


def test_objective_with_singletons_and_weightless_clusters():
    """Singleton clusters (weight <= 1 and > 1) contribute 0; a cluster of zero-weight points contributes 0."""
    rng = np.random.default_rng(51)
    X = rng.normal(size=(30, 3))
    labels = rng.integers(0, 3, 30)
    labels[[4, 9]] = [3, 4]           # two singletons
    labels[[11, 12, 13]] = 5          # a cluster of zero-weight points
    w = rng.uniform(0.3, 0.9, 30)
    w[9] = 2.5
    w[[11, 12, 13]] = 0.0
    K = X @ X.T
    assert kkmgpu.metrics.kernel_kmeans_objective(K, labels, w) == pytest.approx(weighted_sse(X, labels, w),
                                                                                 rel=1e-10)


def test_metric_inputs_are_checked_with_messages():
    with pytest.raises(ValueError, match=r"K must be \(n, n\) and labels \(n,\); got \(4, 3\)"):
        kkmgpu.metrics.kernel_kmeans_objective(np.ones((4, 3)), np.zeros(4, int))
    with pytest.raises(ValueError, match="labels"):
        kkmgpu.metrics.kernel_kmeans_objective(np.eye(4), np.zeros(3, int))
    for f in (kkmgpu.metrics.nmi, kkmgpu.metrics.ari, kkmgpu.metrics._nmi_numpy, kkmgpu.metrics._ari_numpy):
        with pytest.raises(ValueError, match="must be 1-D; got shapes"):
            f(np.zeros(4, int), np.zeros((4, 1), int))
        with pytest.raises(ValueError, match="must be 1-D; got shapes"):
            f(np.zeros((4, 1), int), np.zeros(4, int))
        with pytest.raises(ValueError, match="different lengths 4 and 3"):
            f(np.zeros(4, int), np.zeros(3, int))
    with pytest.raises(ValueError, match="K must be"):
        kkmgpu.metrics.kernel_kmeans_objective(np.ones(4), np.zeros(4, int))


def test_nmi_fallback_with_singleton_classes_and_empty_labelings():
    sk_metrics = pytest.importorskip("sklearn.metrics", reason="scikit-learn is needed for the reference score")
    rng = np.random.default_rng(53)
    a = rng.integers(0, 4, 40)
    b = rng.integers(0, 5, 40)
    a[[3, 7]] = [10, 11]  # classes of one member
    b[[5]] = [12]
    assert kkmgpu.metrics._nmi_numpy(a, b) == pytest.approx(sk_metrics.normalized_mutual_info_score(a, b),
                                                             rel=1e-12)
    empty = np.array([], dtype=int)
    assert kkmgpu.metrics._nmi_numpy(empty, empty) == sk_metrics.normalized_mutual_info_score(empty, empty)


QUALITY = ("silhouette", "calinski_harabasz", "davies_bouldin")


@pytest.mark.parametrize("name", QUALITY)
def test_quality_default_device_and_messages(name):
    """The default device ("auto") works (KKMGPU_DEVICE=cpu or a GPU: the same value); an undefined number of
    clusters gets a message naming the index."""
    ours = getattr(kkmgpu.metrics, name)
    rng = np.random.default_rng(55)
    X, y = blobs(rng, [20, 25, 30], 3)
    assert ours(X, y) == pytest.approx(ours(X, y, device="cpu"), rel=1e-9)
    words = {"silhouette": "the silhouette", "calinski_harabasz": "the Calinski-Harabasz index",
             "davies_bouldin": "the Davies-Bouldin index"}[name]
    with pytest.raises(ValueError, match=f"^{words} is defined for 2 <= number of clusters"):
        ours(X, np.zeros(len(X), int), device="cpu")


@pytest.mark.parametrize("scale", [2.0 ** -60, 1e-6, 1.0, 1e6])
def test_quality_indices_are_scale_invariant(device, scale):
    """Distances below 1 (small data) and above: silhouette and Davies-Bouldin do not change with the units,
    Calinski-Harabasz neither (a ratio of dispersions); at 2^-60 the within-dispersion (~1e-35) is still far
    above the centroids' rounding level (~1e-64), so it is not taken for the W_k = 0 case. (scikit-learn's
    Davies-Bouldin, and so ours, returns 0 once every spread is below 1e-8 in absolute terms.)"""
    sk_metrics = pytest.importorskip("sklearn.metrics", reason="scikit-learn is needed for the reference score")
    rng = np.random.default_rng(57)
    X, y = blobs(rng, [30, 20, 25], 2, spread=1.0, noise=0.4)
    for name, theirs in (("silhouette", sk_metrics.silhouette_score),
                         ("calinski_harabasz", sk_metrics.calinski_harabasz_score),
                         ("davies_bouldin", sk_metrics.davies_bouldin_score)):
        expected = theirs(X * scale, y)  # Davies-Bouldin's "spreads all close to 0" is absolute (atol 1e-8)
        if name != "davies_bouldin" or scale > 1e-8:
            assert expected == pytest.approx(theirs(X, y), rel=1e-9)
        assert getattr(kkmgpu.metrics, name)(X * scale, y, device=device) == pytest.approx(expected, rel=1e-9)


def test_quality_indices_on_degenerate_clusters(device):
    """Clusters of identical points, coinciding centroids, a gap of exactly 1, a within-dispersion of exactly 1."""
    sk_metrics = pytest.importorskip("sklearn.metrics", reason="scikit-learn is needed for the reference score")
    cases = {
        # two clusters on the same point, a third elsewhere: a = b = 0 for the first two (s = 0)
        "stacked": (np.array([[1.0, 2.0]] * 6 + [[5.0, 5.0]] * 3), np.array([0, 0, 0, 1, 1, 1, 2, 2, 2])),
        # every cluster a repeated point: W_k = 0 (Calinski-Harabasz 1.0 by convention), spreads 0 (DB 0)
        "points": (np.array([[0.0], [0.0], [3.0], [3.0], [7.0]]), np.array([0, 0, 1, 1, 2])),
        # two clusters sharing their centroid: Davies-Bouldin 0
        "same-centroid": (np.array([[-1.0], [1.0], [-3.0], [3.0]]), np.array([0, 0, 1, 1])),
        # centroids exactly 1 apart
        "unit-gap": (np.array([[0.0, -1.0], [0.0, 1.0], [1.0, -2.0], [1.0, 2.0]]), np.array([0, 0, 1, 1])),
        # W_k exactly 1.0
        "unit-within": (np.array([[0.0], [1.0], [0.0], [1.0], [5.0], [5.0]]), np.array([0, 0, 0, 0, 1, 1])),
    }
    for case, (X, y) in cases.items():
        assert kkmgpu.metrics.silhouette(X, y, device=device) == pytest.approx(
            sk_metrics.silhouette_score(X, y), abs=1e-12), case
        assert kkmgpu.metrics.calinski_harabasz(X, y, device=device) == pytest.approx(
            sk_metrics.calinski_harabasz_score(X, y), rel=1e-12), case
        assert kkmgpu.metrics.davies_bouldin(X, y, device=device) == pytest.approx(
            sk_metrics.davies_bouldin_score(X, y), rel=1e-12, abs=1e-12), case


@pytest.mark.parametrize("scale", [2.0 ** -20, 1.0, 2.0 ** 20], ids=["2^-20", "1", "2^20"])  # exact scalings
def test_davies_bouldin_resolves_gaps_just_above_rounding(device, scale):
    """Clusters 2^-40 apart (spread 1, 25 points each) are distinct: the rounding bound of their centroids is
    ~1e-14 of the data's magnitude, at any scale. Written out: scikit-learn's GEMM-form distances lose the gap."""
    gap = 2.0 ** -40
    pair = np.array([[0.0, -1.0], [0.0, 1.0]])
    X = np.vstack([np.tile(pair, (25, 1)), np.tile(pair + [gap, 0.0], (25, 1)), np.tile(pair + [9.0, 0.0], (25, 1))])
    y = np.repeat([0, 1, 2], 50)
    expected = (2.0 / gap + 2.0 / gap + 2.0 / (9.0 - gap)) / 3.0
    assert kkmgpu.metrics.davies_bouldin(X * scale, y, device=device) == pytest.approx(expected, rel=1e-3)


def test_distinct_cluster_count_and_stop_reasons(device, capsys):
    """The Lloyd driver's bookkeeping: clusters whose centres coincide (duplicate points) are counted once in the
    warning; each stopping rule names itself in stop_reason and in the verbose log."""
    rng = np.random.default_rng(61)
    points = np.array([[1.0, 2.0], [6.0, 1.0], [2.0, 7.0]])
    X = points[np.repeat([0, 1, 2], 10)]
    init = np.r_[np.repeat([0, 1, 2], 10)]
    init[[1, 11]] = [3, 4]  # clusters 3 and 4 hold duplicates of points in clusters 0 and 1
    with pytest.warns(kkmgpu.ConvergenceWarning, match=r"Number of distinct clusters \(3\) found smaller than "
                                                       r"n_clusters \(5\)"):
        kkmgpu.fit(X, 5, kernel="linear", init=init, dtype="float64", device=device)
    Xb, y = blobs(rng, [30, 30, 30], 2, spread=6.0, noise=0.3)
    with warnings.catch_warnings():
        warnings.simplefilter("error", kkmgpu.ConvergenceWarning)  # three distinct centres: no warning
        r = kkmgpu.fit(Xb, 3, kernel="linear", init=y, dtype="float64", tol=0.0, device=device, verbose=True)
    assert r.stop_reason == "no point moved" and r.converged
    out = capsys.readouterr().out
    assert "[kkmgpu] iteration 0: objective" in out and "no point changed cluster, converged" in out
    start = (y + (rng.random(len(y)) < 0.3)) % 3
    r = quiet_fit(Xb, 3, kernel="linear", init=start, dtype="float64", tol=0.0, max_iter=1, device=device)
    assert r.stop_reason == "max_iter" and not r.converged and r.n_iter == 1
    r = quiet_fit(Xb, 3, kernel="linear", init=start, dtype="float64", tol=0.999, device=device, verbose=True)
    assert r.stop_reason == "relative objective change <= tol" and r.converged
    out = capsys.readouterr().out
    assert "points moved" in out and "relative objective change <= tol=0.999, converged" in out
