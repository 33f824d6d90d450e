"""The comparison's methods, how each tool is run (:func:`methods`): kkmgpu's routes, scikit-learn's
clusterers and tslearn's KernelKMeans; each gets the data, k and a :class:`Context` and returns labels.

>>> [m.name for m in methods()][:3]
['kkmgpu-exact', 'kkmgpu-eigen', 'kkmgpu-cats']
"""

from __future__ import annotations

import importlib
import warnings
from dataclasses import dataclass, field

import numpy as np

import kkmgpu
from kkmgpu.compare.data import Unavailable

N_INIT = 10


@dataclass
class Context:
    """What every method of one run gets: the shared RBF gamma, the seed, the device for kkmgpu."""

    gamma: float
    seed: int
    device: str = "auto"
    n_init: int = N_INIT


@dataclass
class Method:
    """A clustering method: ``run(X, k, ctx)`` returns labels; ``unavailable()`` returns None or why not."""

    name: str
    family: str
    description: str
    run: object
    unavailable: object = None
    notes: list = field(default_factory=list)

    def why_unavailable(self):
        return None if self.unavailable is None else self.unavailable()


def _needs(module):
    def check():
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # tslearn warns at import when h5py is missing
                importlib.import_module(module)
        except ImportError as exc:
            return f"{module.split('.')[0]} is not installed ({exc})"
        return None
    return check


def _kkmgpu_fit(X, k, ctx, **options):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", kkmgpu.ConvergenceWarning)
        result = kkmgpu.fit(X, k, kernel="rbf", device=ctx.device, random_state=ctx.seed, **options)
    return np.asarray(result.labels)


def _has_method(name):
    from kkmgpu.methods import registry as _methods
    if name in _methods.METHODS:
        return None
    return f"not available: this kkmgpu has no method={name!r}"


def _has_search():
    if hasattr(kkmgpu, "search_bandwidth"):
        return None
    return "not available: this kkmgpu has no bandwidth search (kkmgpu.search_bandwidth)"


def _run_search(X, k, ctx):
    """Off-the-grid bandwidth search: fit(gamma="search") where fit takes it, else search_bandwidth's labels."""
    try:
        return _kkmgpu_fit(X, k, ctx, gamma="search", n_init=1)
    except (TypeError, ValueError) as exc:
        if "gamma" not in str(exc):
            raise
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", kkmgpu.ConvergenceWarning)
        found = kkmgpu.search_bandwidth(X, k, device=ctx.device, random_state=ctx.seed)
    best = getattr(found, "best", None)
    labels = getattr(best, "labels", getattr(found, "labels", None))
    if labels is None:
        raise Unavailable("kkmgpu.search_bandwidth returned no labels")
    return np.asarray(labels)


def _sklearn(name):
    return importlib.import_module(name)


def _run_kmeans(X, k, ctx):
    return _sklearn("sklearn.cluster").KMeans(k, n_init=ctx.n_init, random_state=ctx.seed).fit(X).labels_


def _run_agglomerative(X, k, ctx):
    return _sklearn("sklearn.cluster").AgglomerativeClustering(k, linkage="ward").fit(X).labels_


def _run_spectral(X, k, ctx):
    model = _sklearn("sklearn.cluster").SpectralClustering(
        k, affinity="rbf", gamma=ctx.gamma, assign_labels="kmeans", n_init=ctx.n_init, random_state=ctx.seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "Graph is not fully connected"
        return model.fit(X).labels_


def _gmm_covariance(d):
    return "full" if d <= 50 else "diag"


def _run_gmm(X, k, ctx):
    model = _sklearn("sklearn.mixture").GaussianMixture(
        k, covariance_type=_gmm_covariance(X.shape[1]), n_init=3, random_state=ctx.seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ConvergenceWarning of EM
        return model.fit(X).predict(X)


def _run_tslearn(X, k, ctx):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        KernelKMeans = importlib.import_module("tslearn.clustering").KernelKMeans
        model = KernelKMeans(n_clusters=k, kernel="rbf", kernel_params={"gamma": ctx.gamma}, n_init=ctx.n_init,
                             max_iter=300, tol=1e-6, random_state=ctx.seed)
        model.fit(X)
    if getattr(model, "labels_", None) is None:
        raise RuntimeError("tslearn found an empty cluster in every attempt")
    return model.labels_


def methods():
    """Every method of the comparison, in table order (unavailable ones included; see ``why_unavailable``)."""
    return [
        Method("kkmgpu-exact", "kkmgpu", f"fit(method='exact'), rbf, k-means++, n_init={N_INIT}",
               lambda X, k, ctx: _kkmgpu_fit(X, k, ctx, gamma=ctx.gamma, n_init=ctx.n_init)),
        Method("kkmgpu-eigen", "kkmgpu", f"fit(method='eigen') (Algorithm 16; all eigenpairs up to n=4096, "
               f"else the top 128), rbf, n_init={N_INIT}",
               lambda X, k, ctx: _kkmgpu_fit(X, k, ctx, gamma=ctx.gamma, n_init=ctx.n_init, method="eigen")),
        Method("kkmgpu-cats", "kkmgpu", f"fit(method='cats'), l = ceil(sqrt(n / k)), rbf, n_init={N_INIT}",
               lambda X, k, ctx: _kkmgpu_fit(X, k, ctx, gamma=ctx.gamma, n_init=ctx.n_init, method="cats")),
        Method("kkmgpu-trimmed", "kkmgpu", f"fit(method='trimmed') (kernel matrix trimming), rbf, n_init={N_INIT}",
               lambda X, k, ctx: _kkmgpu_fit(X, k, ctx, gamma=ctx.gamma, n_init=ctx.n_init, method="trimmed"),
               unavailable=lambda: _has_method("trimmed")),
        Method("kkmgpu-search", "kkmgpu", "Off-the-grid bandwidth search (gamma chosen by the search, not 'scale')",
               _run_search, unavailable=_has_search),
        Method("sklearn-kmeans", "scikit-learn", f"KMeans(n_init={N_INIT})", _run_kmeans,
               unavailable=_needs("sklearn.cluster")),
        Method("sklearn-agglomerative", "scikit-learn", "AgglomerativeClustering(linkage='ward')",
               _run_agglomerative, unavailable=_needs("sklearn.cluster")),
        Method("sklearn-spectral", "scikit-learn",
               f"SpectralClustering(affinity='rbf', gamma shared, assign_labels='kmeans', n_init={N_INIT}) (NJW)",
               _run_spectral, unavailable=_needs("sklearn.cluster")),
        Method("sklearn-gmm", "scikit-learn", "GaussianMixture(covariance_type='full' for d <= 50 else 'diag', "
               "n_init=3)", _run_gmm, unavailable=_needs("sklearn.mixture")),
        Method("tslearn-kernelkmeans", "tslearn",
               f"tslearn KernelKMeans(kernel='rbf', gamma shared, n_init={N_INIT}, max_iter=300)",
               _run_tslearn, unavailable=_needs("tslearn.clustering")),
    ]
