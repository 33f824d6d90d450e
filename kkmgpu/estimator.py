"""A scikit-learn estimator over :func:`kkmgpu.fit` (same code, fitted attributes end in ``_``).

With scikit-learn installed (1.6 or newer) :class:`KernelKMeans` is a ``BaseEstimator`` and ``ClusterMixin``
and validates its input with scikit-learn's own helpers, so it passes scikit-learn's estimator checks (those
it does not are declared in ``tests/test_estimator.py`` with the reason). Without scikit-learn it keeps the
same methods and parameters on kkmgpu's own checks. ``import kkmgpu`` does not load this module (nor
scikit-learn, which would triple the import time) until ``kkmgpu.KernelKMeans`` is first used.
"""

from __future__ import annotations

import inspect

import numpy as np

from kkmgpu import _warn
from kkmgpu import _validation
from kkmgpu.kernels import spec as _kernel_spec

from kkmgpu.kernels import blocks as _kernels
from kkmgpu.kernels.gemm import DEFAULT_PRECISION

from kkmgpu.methods import registry as _methods

from kkmgpu.engine import sparse as _sparse
from kkmgpu._api import fit as _fit
from kkmgpu._api import predict as _predict
from kkmgpu.backend.device import is_cupy_array, resolve_device

try:
    from sklearn.base import BaseEstimator, ClusterMixin
    from sklearn.exceptions import NotFittedError
    from sklearn.utils.validation import _check_sample_weight, check_is_fitted, validate_data
except ImportError:  # scikit-learn missing or older than 1.6: the same protocol on kkmgpu's own checks
    class NotFittedError(ValueError, AttributeError):
        """Raised by predict and score before fit (scikit-learn's NotFittedError when it is installed)."""

    class BaseEstimator:
        @classmethod
        def _get_param_names(cls):
            return sorted(p.name for p in inspect.signature(cls.__init__).parameters.values()
                          if p.name != "self" and p.kind != p.VAR_KEYWORD)

        def get_params(self, deep=True):
            return {name: getattr(self, name) for name in self._get_param_names()}

        def set_params(self, **params):
            valid = self._get_param_names()
            for name, value in params.items():
                if name not in valid:
                    raise ValueError(f"Invalid parameter {name!r} for estimator {type(self).__name__}; "
                                     f"valid parameters are {valid}.")
                setattr(self, name, value)
            return self

        def __repr__(self):
            defaults = {p.name: p.default for p in inspect.signature(type(self).__init__).parameters.values()}
            changed = [f"{k}={v!r}" for k, v in self.get_params().items()
                       if not (v is defaults[k] or (type(v) is type(defaults[k]) and v == defaults[k]))]
            return f"{type(self).__name__}({', '.join(changed)})"

    class ClusterMixin:
        _estimator_type = "clusterer"

        def fit_predict(self, X, y=None, **kwargs):
            return self.fit(X, **kwargs).labels_

    def check_is_fitted(estimator):
        if not hasattr(estimator, "result_"):
            raise NotFittedError(f"This {type(estimator).__name__} instance is not fitted yet. Call 'fit' with "
                                 "appropriate arguments before using this estimator.")

    def validate_data(estimator, X, *, reset=True, skip_check_array=False, **_):
        if not (skip_check_array or _sparse.is_sparse(X)):
            X = _validation.as_array(X)
        if X.ndim == 2:
            if reset:
                estimator.n_features_in_ = X.shape[1]
            elif X.shape[1] != estimator.n_features_in_:
                raise ValueError(f"X has {X.shape[1]} features, but {type(estimator).__name__} is expecting "
                                 f"{estimator.n_features_in_} features as input.")
        return X

    def _check_sample_weight(sample_weight, X, **_):
        return _validation.check_sample_weight(sample_weight, X.shape[0])

__all__ = ["KernelKMeans"]

#: Parameters only one method uses, by that method. The estimator passes them to :func:`kkmgpu.fit` only with
#: their method, so one estimator can be cloned across methods (a grid over ``method``, scikit-learn's checks,
#: which set ``n_components=1`` on any estimator that has it); a value other than the default given with
#: another method is ignored with a UserWarning.
METHOD_PARAMS = _methods.method_params()  # the methods' own parameters, as they registered them (kkmgpu.methods.registry)


class KernelKMeans(ClusterMixin, BaseEstimator):
    """Kernel k-means clustering.

    Parameters are those of :func:`kkmgpu.fit` (``n_clusters`` is its ``k``). The class follows
    scikit-learn's estimator conventions, so it works with ``sklearn.base.clone``, in a ``Pipeline``
    and in model selection (``score`` is minus the objective, as for ``KMeans``: comparable across seeds and
    restarts, not across ``gamma``, ``n_neighbors`` or ``n_clusters``, see :meth:`score`); without scikit-learn
    installed it keeps the same methods on kkmgpu's own input checks.

    Parameters that only one method uses (``engine``: "exact"; ``n_samples_per_cluster``,
    ``window``, ``theta``, ``rcond``, ``exact_objective``: "cats"; ``n_components``: "eigen";
    ``trim_*``: "trimmed"; ``n_landmarks``, ``landmarks``: "approx") are ignored by the other methods, with a ``UserWarning`` when set to
    anything but their default (:func:`kkmgpu.fit` raises instead).

    ``objective="ncut"`` or ``"ratio_association"`` clusters the ``affinity`` graph with ``n_neighbors``
    neighbours instead (see :func:`kkmgpu.fit`): ``inertia_`` is then the normalized cut (or the negated ratio
    association) and ``predict`` places new points through their neighbours among the training points.
    ``method="landmark"`` with ``objective="ncut"`` takes ``n_landmarks`` and ``landmark_neighbors`` (the landmark
    route of :func:`kkmgpu.fit`; ``score`` is then minus the cut of X's rows on their own graph through the landmarks).

    Attributes
    ----------
    labels_ : ndarray of shape (n_samples,)
    inertia_ : float
        Kernel k-means objective of ``labels_`` (for method="cats": the exact objective when
        ``exact_objective=True``, else CATS's approximate distortion; for method="eigen": the
        objective on K itself; for method="approx": its approximate objective, an upper bound of the exact one).
    n_iter_ : int
    result_ : KernelKMeansResult
        Everything :func:`kkmgpu.fit` returned (timings, objective history, device, ...).
    n_features_in_ : int
    feature_names_in_ : ndarray of shape (n_features_in_,)
        Column names, when X was a DataFrame with string column names (scikit-learn installed).

    Examples
    --------
    >>> import kkmgpu
    >>> X, y = kkmgpu.datasets.make_two_circles(300, random_state=0)
    >>> model = kkmgpu.KernelKMeans(2, gamma=5.0, n_init=10, random_state=0, device="cpu").fit(X)
    >>> sorted(set(model.labels_.tolist()))
    [0, 1]
    >>> round(model.score(X), 3), round(-model.inertia_, 3)  # minus the objective, as KMeans.score
    (-229.797, -229.797)
    """

    def __init__(self, n_clusters=8, *, kernel="rbf", gamma=None, degree=3, coef0=None, kernel_params=None,
                 method="exact", device="auto", dtype="float32", init="auto", n_init="auto",
                 max_iter=300, tol=1e-6, random_state=None, verbose=False, update="auto",
                 n_samples_per_cluster=None, window=None, theta=None, rcond=None, exact_objective=False,
                 n_components=None, engine="auto", gemm_precision=DEFAULT_PRECISION, trim_vote_fraction=None,
                 trim_slack=None, trim_h=None, trim_max_size=None, n_landmarks=None, landmarks="uniform",
                 objective="kernel_kmeans", affinity="self_tuning", n_neighbors=10, graph_shift="auto", progress=False,
                 tf32=None, landmark_neighbors=None):
        self.n_clusters = n_clusters
        self.kernel = kernel
        self.gamma = gamma
        self.degree = degree
        self.coef0 = coef0
        self.kernel_params = kernel_params
        self.method = method
        self.device = device
        self.dtype = dtype
        self.init = init
        self.n_init = n_init
        self.max_iter = max_iter
        self.tol = tol
        self.random_state = random_state
        self.verbose = verbose
        self.progress = progress
        self.update = update
        self.n_samples_per_cluster = n_samples_per_cluster
        self.window = window
        self.theta = theta
        self.rcond = rcond
        self.exact_objective = exact_objective
        self.n_components = n_components
        self.engine = engine
        self.gemm_precision = gemm_precision
        self.tf32 = tf32
        self.trim_vote_fraction = trim_vote_fraction
        self.trim_slack = trim_slack
        self.trim_h = trim_h
        self.trim_max_size = trim_max_size
        self.n_landmarks = n_landmarks
        self.landmarks = landmarks
        self.objective = objective
        self.affinity = affinity
        self.n_neighbors = n_neighbors
        self.graph_shift = graph_shift
        self.landmark_neighbors = landmark_neighbors

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        # tags are read on unvalidated parameters: an unknown kernel is fit's error to raise, not this one's
        tags.input_tags.pairwise = (isinstance(self.kernel, str) and self.kernel.lower() == "precomputed") or (
            self.objective in ("ncut", "ratio_association") and self.affinity == "precomputed")
        return tags

    def _check_X(self, X, reset):
        """X validated (scikit-learn's rules: array-likes, complex, empty, 1-D) and n_features_in_ set or checked.

        Device (CuPy) arrays and sparse kernels keep their type: only their number of features is checked here,
        kkmgpu's validation does the rest on the device.
        """
        if is_cupy_array(X) or _sparse.is_sparse(X):
            return validate_data(self, X, reset=reset, skip_check_array=True)
        return validate_data(self, X, reset=reset, dtype="numeric")

    def _fit_kwargs(self):
        """kkmgpu.fit's keyword arguments: the method's own parameters, the others' dropped (see the class doc)."""
        kwargs = {name: value for name, value in self.get_params().items() if name != "n_clusters"}
        if not isinstance(self.method, str) or self.method not in METHOD_PARAMS:
            return kwargs  # an unknown method is kkmgpu.fit's error to raise
        defaults = {p.name: p.default for p in inspect.signature(type(self).__init__).parameters.values()}
        ignored = []
        for method, names in METHOD_PARAMS.items():
            for name in names if method != self.method else ():
                value = kwargs.pop(name)
                if not (value is defaults[name] or (type(value) is type(defaults[name]) and value == defaults[name])):
                    ignored.append(f"{name}={value!r} (method={method!r} only)")
        if ignored:
            _warn.warn(f"{', '.join(ignored)} ignored with method={self.method!r}.", UserWarning)
        return kwargs

    def fit(self, X, y=None, sample_weight=None):
        """Cluster X.

        Parameters
        ----------
        X : array of shape (n_samples, n_features), or (n_samples, n_samples) for kernel="precomputed"
            NumPy or CuPy array, DataFrame or array-like; a sparse matrix as a precomputed kernel.
        y : ignored
        sample_weight : array of shape (n_samples,), optional
            Non-negative weights, not all zero.

        Returns
        -------
        self
        """
        X = self._check_X(X, reset=True)
        if sample_weight is not None and not (is_cupy_array(X) or is_cupy_array(sample_weight)):
            sample_weight = _check_sample_weight(sample_weight, X, dtype=np.float64, ensure_non_negative=True)
        self.result_ = _fit(X, self.n_clusters, sample_weight=sample_weight, **self._fit_kwargs())
        self.labels_ = self.result_.labels
        self.inertia_ = (self.result_.exact_objective if self.result_.exact_objective is not None
                         else self.result_.objective)
        self.n_iter_ = self.result_.n_iter
        return self

    def predict(self, X):
        """Nearest cluster (in feature space) of each row of X.

        Parameters
        ----------
        X : array of shape (n_new, n_features), or (n_new, n_train) for kernel="precomputed"

        Returns
        -------
        labels : ndarray of shape (n_new,), int32
        """
        check_is_fitted(self)
        return _predict(self.result_, self._check_X(X, reset=False))

    def score(self, X, y=None, sample_weight=None):
        """Minus the objective of X in the fitted clusters (higher is better, as ``KMeans.score``).

        Each row of X goes to its cluster by :meth:`predict`. For kernel k-means the score is
        -sum_i w_i ||phi(x_i) - m_{c_i}||^2 with m_c the exact feature-space mean of the fitted cluster c
        (the training points of ``labels_`` with their ``sample_weight``). On the training data of a
        converged fit this is ``-inertia_`` (for method="cats" with ``exact_objective=True``; its
        ``inertia_`` is otherwise CATS's approximate distortion). Costs one kernel pass between X and the
        training points, plus for methods other than "exact" one over the training points (the exact means'
        norms, as ``exact_objective=True``).

        With ``objective="ncut"`` or ``"ratio_association"`` the score is minus the normalized cut (for the
        ratio association: the association itself) of the graph of the rows of X, built as the fit built its
        graph (the same ``affinity`` and ``n_neighbors``, among the rows of X alone, centred as the training
        points), under the labels :meth:`predict` gives them; on the training data, ``-inertia_``.

        The score compares fits with the same kernel and graph (seeds, ``init``, ``n_init``, ``method``). It is
        **not comparable across** ``gamma``, ``kernel``, ``degree``, ``n_neighbors``, ``affinity`` or
        ``n_clusters``, which change the space the objective is measured in: the RBF objective shrinks with gamma,
        so ``GridSearchCV`` over gamma without ``scoring=`` picks the smallest gamma whatever the data. Pass a
        scorer there (``scoring=make_scorer(adjusted_rand_score)`` with labels), or let kkmgpu choose
        (``gamma="search"``, ``n_neighbors="search"``); docs/exact.md, "Model selection", has a worked example.

        Parameters
        ----------
        X : array of shape (n_new, n_features)
        y : ignored
        sample_weight : array of shape (n_new,), optional
            Weights of the rows of X (default 1); not with the graph objectives, whose weights are the degrees.

        Returns
        -------
        score : float

        Raises
        ------
        ValueError
            With kernel="precomputed" or affinity="precomputed": the objective needs k(x, x) of the scored points
            (their affinities among themselves), which their rows to the training points do not hold. With a graph
            objective: ``sample_weight`` given, or X with too few rows for the graph's ``n_neighbors``.
        """
        check_is_fitted(self)
        X = self._check_X(X, reset=False)
        result = self.result_
        if result.method == "landmark":  # the cut of X's rows on their own graph through the fit's landmarks
            from kkmgpu.methods import landmark_cut

            return -landmark_cut.score_rows(result, X, sample_weight)
        if result._graph_state is not None:
            return -_graph_objective_of_rows(result, X, sample_weight)
        if result.kernel == "precomputed":
            raise ValueError("score is not available with kernel='precomputed': the objective needs k(x, x) of the "
                             "scored points, which their (n_samples, n_train) kernel to the training points "
                             "does not hold.")
        labels = _predict(result, X)
        if is_cupy_array(X) or is_cupy_array(sample_weight):
            weights = _validation.check_sample_weight(sample_weight, X.shape[0])
        else:
            weights = _check_sample_weight(sample_weight, X, dtype=np.float64, ensure_non_negative=True)
        return -_objective_in_fitted_clusters(result, X, labels, np.asarray(weights, dtype=np.float64))


def _graph_objective_of_rows(result, X, sample_weight) -> float:
    """The graph objective (ncut, or minus the ratio association) of the rows of X under their predicted labels, on
    the graph the fit would build from X: its affinity and n_neighbors, features centred on the training mean."""
    from kkmgpu.kernels import graphs as _graphs
    from kkmgpu.methods import graphcut

    state = result._graph_state
    if state.graph is None:
        raise ValueError("score is not available with affinity='precomputed': the graph objective of the scored "
                         "points needs their affinities among themselves, which their rows to the training points "
                         "do not hold. Pass scoring= to the model selection (see KernelKMeans.score).")
    if sample_weight is not None:
        raise ValueError("sample_weight does not apply to the graph objectives' score: the normalized cut weights "
                         "every point by its degree, the ratio association by 1.")
    graph = state.graph
    reach = max(graph.n_neighbors, graph.scale_neighbor) if graph.kind == "self_tuning" else graph.n_neighbors
    if X.shape[0] <= reach:
        scale = f" (local scale: neighbour {graph.scale_neighbor})" if graph.kind == "self_tuning" else ""
        raise ValueError(f"score builds the {graph.kind!r} graph of the scored points with n_neighbors="
                         f"{graph.n_neighbors}{scale}; X has {X.shape[0]} rows, it needs at least {reach + 1}.")
    labels = _predict(result, X)
    backend = resolve_device(result.device)
    with backend.activate():
        Xd = _validation.check_data(X, backend)
        features = graphcut.graph_features(Xd, state.features.dtype, backend, center=state.center)[1]
        A = _graphs.build_graph(features, graph.n_neighbors, graph.kind, backend, scale_neighbor=graph.scale_neighbor,
                                precision=graph.precision).graph
        return graphcut.graph_objective(A, graphcut.degrees(A, backend), labels, result.n_clusters, state.objective,
                                        backend)


def _objective_in_fitted_clusters(result, X, labels, weights) -> float:
    """sum_i w_i ||phi(x_i) - m_{labels_i}||^2, m_c the exact weighted mean of the fitted cluster c, in tiles.

    ||phi(x) - m_c||^2 = k(x, x) - 2 S_c(x) / W_c + C_c / W_c^2 with S_c(x) = sum_{j in c} w_j k(x, x_j),
    W_c = sum_{j in c} w_j and C_c = sum_{i, j in c} w_i w_j k(x_i, x_j) (papers' Eq. 4).
    """
    backend = resolve_device(result.device)
    spec = result._spec
    dt = _kernel_spec.compute_dtype(np.dtype(result.dtype))
    k = result.n_clusters
    with backend.activate():
        xp = backend.xp
        train = backend.asarray(result._train_features, dtype=dt)
        train_labels = backend.asarray(result._train_labels, dtype=np.int32)
        train_weights = backend.asarray(result._train_weights, dtype=np.float64)
        b_sq = (train * train).sum(axis=1) if spec.name in ("rbf", "laplacian") else None
        right = _kernels.columns_operand(train, spec, backend, "the training points' GEMM operand")
        clusters = xp.arange(k, dtype=xp.int32)
        step = _kernels.tile_rows(train.shape[0], dt.itemsize, backend=backend)

        def cluster_sums(A):  # S (rows of A, k), float64, in row tiles
            return xp.concatenate([backend.ops.block_cluster_sums(
                _kernels.kernel_block(A[i0:i0 + step], train, spec, backend, b_sq=b_sq, right=right), train_labels,
                train_weights, k) for i0 in range(0, A.shape[0], step)])

        def own(S, lab):  # S[i, lab_i]
            return (S * (lab[:, None] == clusters[None, :])).sum(axis=1)

        # W_c and C_c in the fit's own units (its weights and kernel values may be divided by powers of two)
        one_hot = (train_labels[:, None] == clusters[None, :]).astype(xp.float64)
        sizes = train_weights @ one_hot
        if result.method == "exact":  # the fit's own totals, those its predict uses
            within = backend.asarray(np.asarray(result._within, dtype=np.float64))
        else:
            within = xp.zeros(k, dtype=xp.float64)
            for i0 in range(0, train.shape[0], step):
                S = cluster_sums(train[i0:i0 + step])
                within += (train_weights[i0:i0 + step] * own(S, train_labels[i0:i0 + step])) @ one_hot[i0:i0 + step]
        A = _kernels.prepare_features(X, spec, backend, dt)
        lab = backend.asarray(labels, dtype=np.int32)
        W = sizes[lab]
        dist = (_kernels.kernel_diagonal(A, spec, backend) - 2.0 * own(cluster_sums(A), lab) / W
                + within[lab] / (W * W))
        return float(backend.asarray(weights) @ dist) * getattr(spec, "value_scale", 1.0)
