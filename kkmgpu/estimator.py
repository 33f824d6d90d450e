"""A scikit-learn-style estimator over :func:`kkmgpu.fit` (same code, fitted attributes end in ``_``)."""

from __future__ import annotations

import inspect

from ._api import fit as _fit
from ._api import predict as _predict

__all__ = ["KernelKMeans"]


class KernelKMeans:
    """Kernel k-means clustering.

    Parameters are those of :func:`kkmgpu.fit` (``n_clusters`` is its ``k``). The class follows
    scikit-learn's estimator conventions, so it works with ``sklearn.base.clone``, in a
    ``Pipeline`` and in model selection, without requiring scikit-learn itself.

    Attributes
    ----------
    labels_ : ndarray of shape (n_samples,)
    inertia_ : float
        Kernel k-means objective of ``labels_`` (for method="cats": the exact objective when
        ``exact_objective=True``, else CATS's approximate distortion; for method="eigen": the
        objective on K itself).
    n_iter_ : int
    result_ : KernelKMeansResult
        Everything :func:`kkmgpu.fit` returned (timings, objective history, device, ...).
    n_features_in_ : int

    Examples
    --------
    >>> import kkmgpu
    >>> X, y = kkmgpu.datasets.make_two_circles(300, random_state=0)
    >>> model = kkmgpu.KernelKMeans(2, gamma=5.0, n_init=10, random_state=0, device="cpu").fit(X)
    >>> sorted(set(model.labels_.tolist()))
    [0, 1]
    """

    def __init__(self, n_clusters=8, *, kernel="rbf", gamma=None, degree=3, coef0=None, kernel_params=None,
                 method="exact", device="auto", dtype="float32", init="k-means++", n_init="auto",
                 max_iter=300, tol=1e-6, random_state=None, verbose=False, update="auto",
                 n_samples_per_cluster=None, window=None, theta=None, rcond=None, exact_objective=False,
                 n_components=None, engine="auto", tf32=False, trim_vote_fraction=None, trim_slack=None,
                 trim_h=None, trim_max_size=None):
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
        self.update = update
        self.n_samples_per_cluster = n_samples_per_cluster
        self.window = window
        self.theta = theta
        self.rcond = rcond
        self.exact_objective = exact_objective
        self.n_components = n_components
        self.engine = engine
        self.tf32 = tf32
        self.trim_vote_fraction = trim_vote_fraction
        self.trim_slack = trim_slack
        self.trim_h = trim_h
        self.trim_max_size = trim_max_size

    @classmethod
    def _get_param_names(cls):
        return sorted(p.name for p in inspect.signature(cls.__init__).parameters.values()
                      if p.name != "self" and p.kind != p.VAR_KEYWORD)

    def get_params(self, deep=True):
        """Parameters of this estimator (scikit-learn protocol)."""
        return {name: getattr(self, name) for name in self._get_param_names()}

    def set_params(self, **params):
        """Set parameters (scikit-learn protocol); unknown names raise ValueError."""
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
                   if not (v is defaults.get(k) or (type(v) is type(defaults.get(k)) and v == defaults.get(k)))]
        return f"{type(self).__name__}({', '.join(changed)})"

    def __sklearn_tags__(self):
        from sklearn.utils import Tags, InputTags, TargetTags  # only called by scikit-learn itself
        return Tags(estimator_type="clusterer", target_tags=TargetTags(required=False),
                    input_tags=InputTags(pairwise=self.kernel == "precomputed"))

    _estimator_type = "clusterer"

    def fit(self, X, y=None, sample_weight=None):
        """Fit on X (n_samples, n_features), or on a kernel matrix with kernel="precomputed"."""
        self.result_ = _fit(X, self.n_clusters, kernel=self.kernel, gamma=self.gamma, degree=self.degree,
                            coef0=self.coef0, kernel_params=self.kernel_params, method=self.method,
                            device=self.device, dtype=self.dtype, init=self.init, n_init=self.n_init,
                            max_iter=self.max_iter, tol=self.tol, sample_weight=sample_weight,
                            random_state=self.random_state, verbose=self.verbose, update=self.update,
                            n_samples_per_cluster=self.n_samples_per_cluster, window=self.window,
                            theta=self.theta, rcond=self.rcond, exact_objective=self.exact_objective,
                            n_components=self.n_components, engine=self.engine, tf32=self.tf32,
                            trim_vote_fraction=self.trim_vote_fraction, trim_slack=self.trim_slack,
                            trim_h=self.trim_h, trim_max_size=self.trim_max_size)
        self.labels_ = self.result_.labels
        self.inertia_ = (self.result_.exact_objective if self.result_.exact_objective is not None
                         else self.result_.objective)
        self.n_iter_ = self.result_.n_iter
        self.n_features_in_ = X.shape[1] if hasattr(X, "shape") else len(X[0])
        return self

    def fit_predict(self, X, y=None, sample_weight=None):
        """Fit and return ``labels_``."""
        return self.fit(X, sample_weight=sample_weight).labels_

    def predict(self, X):
        """Nearest cluster (in feature space) of each row of X."""
        if not hasattr(self, "result_"):
            raise AttributeError(f"This {type(self).__name__} instance is not fitted yet; call fit first.")
        return _predict(self.result_, X)
