"""Choosing the graph without labels: ``affinity="search"`` (issue 28, docs/selection.md).

Every candidate graph (the three families of :mod:`kkmgpu.kernels.graphs` at each size of :data:`GRID`, all from
one neighbour search) is scored by the **spectral gap ratio** lambda_{k+1} / lambda_k of its normalised Laplacian
L = I - D^-1/2 A D^-1/2 (eigenvalues ascending, lambda_1 = 0). A small lambda_k says that k well-separated sets
exist, a large lambda_{k+1} that k + 1 do not (the higher-order Cheeger inequalities of Lee, Oveis Gharan and
Trevisan, JACM 2014, bound the k-way conductance by both), so a large ratio marks a graph on which the k-way
normalized cut is clear-cut. The ratio, rather than the gap lambda_{k+1} - lambda_k, is independent of how dense
a graph is (denser graphs have larger eigenvalues throughout).

A graph is **eligible** only if it has at most k connected components, each holding at least
:data:`MIN_COMPONENT_SHARE` n / k points. Without this, a sparse mutual-kNN graph that cuts off a few outliers
has lambda_k = 0 and wins with an infinite ratio, and its cut (0) puts those few points in clusters of their own.
Where no candidate is eligible, the one with the fewest components is taken (the first of equal ones).

``affinity="search"`` keeps the **default graph** (:data:`PRIOR`, ``objective="ncut"``'s default) unless it is not
eligible or another candidate's ratio is more than :data:`PRIOR_FACTOR` times its own: the search changes the
graph only on clear spectral evidence. ``n_neighbors="search"`` (one family, the sizes of
``graphcut.NEIGHBOR_GRID``) takes the candidate of largest ratio.

The rules (ratio, the component guard and its share 0.1, the grids, the prior and its factor) were chosen on the
**tuning half** of ``bench/bench_selection.py`` only (exact eigenvalues, one seed; docs/selection.md, rounds 1
and 2): ``affinity="search"`` 0.733 there (the ratio alone 0.729) against 0.723 for the best single fixed graph
(self_tuning, 10 neighbours, the default) and 0.711 for knn with 10; ``n_neighbors="search"`` by the ratio over
5 ... 30 neighbours 0.716 / 0.683 / 0.716 (knn / mutual_knn / self_tuning) against c-NNC's 0.601 / 0.651 / 0.606.
The validation half's figures are in docs/selection.md.
"""

from __future__ import annotations

import dataclasses
import math
import time

import numpy as np

from kkmgpu import _progress, _validation
from kkmgpu.backend.device import resolve_device
from kkmgpu.kernels import gemm as _gemm
from kkmgpu.kernels import graphs as _graphs
from kkmgpu.kernels import sparse_cuda as _products
from kkmgpu.methods import graph_scale as _scale
from kkmgpu.methods.graph_scale import graph_features
from kkmgpu.methods.graph_spectral import _components, spectral_embedding

FAMILIES = _graphs.GRAPHS
#: neighbours per point tried for each family (those below n)
GRID = (5, 10, 20)
#: an eligible graph's components each hold at least this share of n / k points
MIN_COMPONENT_SHARE = 0.1
#: ``affinity="search"`` keeps this graph (the default of ``objective="ncut"``) unless another's ratio is more than
#: PRIOR_FACTOR times its own (tuning half: 0.733 for factors 1.5 and above, 0.729 for 1.0, 0.730 for 1.2)
PRIOR = ("self_tuning", 10)
PRIOR_FACTOR = 1.5
CRITERION = "lambda_{k+1} / lambda_k of the normalised Laplacian (larger is better)"


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One candidate graph of a search and its label-free scores."""

    affinity: str
    n_neighbors: int
    components: int
    smallest_component: int
    eligible: bool
    lambda_k: float        # nan where not computed (ineligible)
    lambda_k1: float
    ratio: float           # lambda_{k+1} / lambda_k; inf with k components (lambda_k = 0); nan where not computed


@dataclasses.dataclass(frozen=True)
class GraphSearch:
    """The evidence of a graph search: every candidate, the criterion and the one chosen."""

    candidates: tuple
    chosen: Candidate
    criterion: str = CRITERION
    prior: tuple | None = None     # (affinity, n_neighbors) kept unless PRIOR_FACTOR times beaten; None: no prior

    def table(self) -> str:
        """The candidates as a plain-text table, the chosen one marked with '*'."""
        lines = [f"{'':1} {'affinity':<11} {'n_neighbors':>11} {'components':>10} {'lambda_k':>10} "
                 f"{'lambda_k+1':>10} {'ratio':>9}"]
        for c in self.candidates:
            mark = "*" if c == self.chosen else ("" if c.eligible else "-")
            lines.append(f"{mark:1} {c.affinity:<11} {c.n_neighbors:>11d} {c.components:>10d} {c.lambda_k:>10.4g} "
                         f"{c.lambda_k1:>10.4g} {c.ratio:>9.4g}")
        lines.append(f"criterion: {self.criterion}; '-': not eligible (more than k components, or one below "
                     f"{MIN_COMPONENT_SHARE:g} n / k points)")
        if self.prior is not None:
            lines.append(f"kept unless beaten by a factor of more than {PRIOR_FACTOR:g}: {self.prior[0]} with "
                         f"n_neighbors={self.prior[1]}")
        return "\n".join(lines)

    def plot(self, ax=None):
        """The criterion of each candidate against n_neighbors, one line per family, the chosen one circled (needs
        matplotlib). Returns the Axes."""
        from kkmgpu.plot import plot_graph_search

        return plot_graph_search(self, ax=ax)


def components(A, backend):
    """(number of connected components, size of the smallest) of the symmetric sparse graph A (on the host)."""
    if backend.is_gpu:  # the structure alone, as SciPy CSR
        from scipy.sparse import csr_matrix

        n = A.shape[0]
        A = csr_matrix((np.ones(int(A.nnz)), backend.to_host(A.indices), backend.to_host(A.indptr)), shape=(n, n))
    count, labels = _components(A)
    return int(count), int(np.bincount(labels).min())


def score(A, k, backend, rng, affinity, n_neighbors) -> Candidate:
    """The candidate's components and, where it is eligible, its ratio lambda_{k+1} / lambda_k (k + 1 top
    eigenvalues of D^-1/2 A D^-1/2 by :func:`kkmgpu.methods.graph_spectral.spectral_embedding`)."""
    n = A.shape[0]
    count, smallest = components(A, backend)
    eligible = count <= k and smallest >= MIN_COMPONENT_SHARE * n / k
    lam_k = lam_k1 = ratio = math.nan
    if eligible and k + 1 <= n - 1:
        A, _ = _scale.normalize_scale(A)
        d = _products.row_sums(A, backend)  # (graphcut imports this module)
        w = spectral_embedding(A, d, k + 1, backend, rng)[1]
        lam = np.clip(1.0 - np.asarray(w, dtype=np.float64), 0.0, None)  # ascending Laplacian eigenvalues
        lam_k, lam_k1 = float(lam[k - 1]), float(lam[k])
        # k components: lambda_k is 0 (the solver gives it to its tolerance, e.g. 3e-11), the groups are separate
        ratio = math.inf if count == k or lam_k <= 0 else lam_k1 / lam_k
    return Candidate(affinity, int(n_neighbors), count, smallest, bool(eligible), lam_k, lam_k1, ratio)


def choose(candidates, prior=None) -> Candidate:
    """The eligible candidate of largest ratio; else the one of fewest components (the first of equal ones). With
    ``prior`` (affinity, n_neighbors): that candidate where it is eligible and no ratio is more than PRIOR_FACTOR
    times its own."""
    eligible = [c for c in candidates if c.eligible and not math.isnan(c.ratio)]
    if not eligible:
        return min(candidates, key=lambda c: c.components)
    best = max(eligible, key=lambda c: c.ratio)
    kept = [c for c in eligible if (c.affinity, c.n_neighbors) == tuple(prior or ())]
    if kept and not best.ratio > PRIOR_FACTOR * kept[0].ratio:   # inf > 1.5 inf is False: a prior with k parts stays
        return kept[0]
    return best


def search_affinity(X, k, *, random_state, device, fit, families=FAMILIES, grid=GRID, prior=PRIOR, **kwargs):
    """``affinity="search"`` (and, with one family, no prior and ``graphcut.NEIGHBOR_GRID``,
    ``n_neighbors="search"``): score every graph of ``families`` x ``grid`` (sizes below n), then :func:`fit` on
    the one :func:`choose` picks. The neighbours are searched once, for the largest size (and the self-tuning
    scale), and every graph takes its own from them. The evidence is ``method_params["graph_search"]`` (a
    :class:`GraphSearch`), the time ``timings["graph_search"]``."""
    t0 = time.perf_counter()
    backend = resolve_device(device, (X,))
    with backend.activate():
        Xd = _validation.check_data(X, backend)
        n = Xd.shape[0]
        k = _validation.check_k(k, n)
        if n < 3:
            what = "affinity='search'" if len(families) > 1 else "n_neighbors='search'"
            raise ValueError(f"{what} needs at least 3 samples; got {n}.")
        sizes = [m for m in grid if m <= n - 1] or [n - 1]
        families = [f for f in families if f != "self_tuning" or n > _graphs.SCALE_NEIGHBOR]
        reach = min(max(sizes[-1], _graphs.SCALE_NEIGHBOR if "self_tuning" in families else 1), n - 1)
        features = graph_features(Xd, kwargs["dtype"], backend)[1]
        neighbors = _graphs.nearest_neighbors(features, reach, backend,
                                              kwargs.get("gemm_precision", _gemm.DEFAULT_PRECISION))
        rng = _validation.make_rng(random_state)
        candidates = []
        pairs = [(f, m) for f in families for m in sizes]
        for family, m in _progress.iterate(pairs, desc="graph search", unit="graph",
                                           enabled=kwargs.get("progress")):
            graph = _graphs.build_graph(features, m, family, backend, neighbors=neighbors,
                                        precision=kwargs.get("gemm_precision", _gemm.DEFAULT_PRECISION)).graph
            candidates.append(score(graph, k, backend, rng, family, m))
            if kwargs.get("verbose"):
                c = candidates[-1]
                print(f"[kkmgpu] affinity={family} n_neighbors={m}: {c.components} component(s), "
                      f"ratio {c.ratio:.4g}" + ("" if c.eligible else " (not eligible)"))
    prior = prior if prior is not None and any((c.affinity, c.n_neighbors) == prior for c in candidates) else None
    chosen = choose(candidates, prior)
    evidence = GraphSearch(tuple(candidates), chosen, prior=prior)
    kwargs = dict(kwargs, affinity=chosen.affinity)
    result = fit(X, k, n_neighbors=chosen.n_neighbors, random_state=rng, device=backend.name, neighbors=neighbors,
                 **kwargs)
    params = dict(result.method_params, graph_search=evidence)
    timings = dict(result.timings, graph_search=time.perf_counter() - t0)
    return dataclasses.replace(result, method_params=params, timings=timings)
