"""Plots of what kkmgpu chose and why (matplotlib, optional: ``pip install kkmgpu[plot]``).

- :func:`plot_graph_search`: the evidence of ``affinity="search"`` (``result.method_params["graph_search"]``):
  each candidate graph's criterion against its n_neighbors, one line per family, the chosen graph circled and
  the ineligible ones marked on the axis.

The bandwidth search has its own (``result.method_params["bandwidth_search"].plot()``, :mod:`kkmgpu.bandwidth`)
and a fit's objective per iteration is ``result.plot_objective()``.
"""

from __future__ import annotations

import math

__all__ = ["plot_graph_search"]


def _axes(ax):
    if ax is not None:
        return ax
    try:
        import matplotlib.pyplot as plt
    except ImportError as exc:  # pragma: no cover - exercised only without matplotlib
        raise ImportError("kkmgpu.plot needs matplotlib: pip install kkmgpu[plot]") from exc
    return plt.subplots(figsize=(6, 4))[1]


def plot_graph_search(search, ax=None):
    """Draw a :class:`kkmgpu.methods.graph_search.GraphSearch` (or a fit result that holds one): lambda_{k+1} /
    lambda_k per candidate, log scale, one line per graph family; the chosen candidate circled; ineligible ones
    (more than k components, or a component too small) as crosses at the bottom; candidates with k separate
    components (an infinite ratio) as triangles at the top. Returns the Axes."""
    search = getattr(search, "method_params", {}).get("graph_search", search)
    ax = _axes(ax)
    finite = [c.ratio for c in search.candidates if c.eligible and math.isfinite(c.ratio) and c.ratio > 0]
    low, high = (min(finite) / 1.5, max(finite) * 1.5) if finite else (0.5, 2.0)
    for family in dict.fromkeys(c.affinity for c in search.candidates):
        rows = [c for c in search.candidates if c.affinity == family]
        shown = [(c.n_neighbors, c.ratio) for c in rows if c.eligible and math.isfinite(c.ratio)]
        line, = ax.plot([m for m, _ in shown], [r for _, r in shown], marker="o", label=family)
        top = [c.n_neighbors for c in rows if c.eligible and c.ratio == math.inf]
        ax.plot(top, [high] * len(top), marker="^", linestyle="none", color=line.get_color())
        out = [c.n_neighbors for c in rows if not c.eligible]
        ax.plot(out, [low] * len(out), marker="x", linestyle="none", color=line.get_color())
    chosen = search.chosen
    y = high if chosen.ratio == math.inf else (chosen.ratio if chosen.eligible else low)
    ax.plot([chosen.n_neighbors], [y], marker="o", markersize=14, markerfacecolor="none", color="black",
            linestyle="none", label=f"chosen: {chosen.affinity}, {chosen.n_neighbors}")
    ax.set_yscale("log")
    ax.set_ylim(low / 1.2, high * 1.2)
    ax.set_xlabel("n_neighbors")
    ax.set_ylabel("lambda_{k+1} / lambda_k")
    families = list(dict.fromkeys(c.affinity for c in search.candidates))
    what = "affinity='search'" if len(families) > 1 else f"n_neighbors='search', {families[0]}"
    ax.set_title(f"{what} (x: not eligible; ^: k separate components)")
    ax.legend(fontsize="small")
    return ax
