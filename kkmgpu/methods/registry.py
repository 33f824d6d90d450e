"""The methods of :func:`kkmgpu.fit`, registered rather than branched on.

Each method declares its name, a one-line summary, the keyword arguments of ``fit`` that are its own, a
``check`` and a ``run``. ``fit`` validates what every method shares once, then hands over:

- ``check(method, ctx, values)`` is called for *every* registered method with the requested ``method`` and the
  values of all methods' own keywords: it resolves its own parameters when ``method`` is its name and
  returns them, and otherwise raises if one of its own was given (returning None);
- ``run(ctx, resolved)`` fits and returns a :class:`kkmgpu.KernelKMeansResult` (in internal units; ``fit``
  converts);
- ``predict(result, X_new, backend, dt, batch_size)`` labels new points (:func:`kkmgpu.predict`, after its
  shared checks).

The estimator (:class:`kkmgpu.KernelKMeans`) reads the same declarations to know which parameters belong to
which method. A new method is one module in ``kkmgpu/methods/`` with its check, runner and predictor and a
:func:`register` call at its end, imported by ``kkmgpu._api`` (the import order is the registration order, which
is the order of ``fit``'s documentation). This module is a leaf: it imports nothing from kkmgpu.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class Method:
    name: str
    summary: str
    params: tuple[str, ...]
    check: Callable[..., Any]
    run: Callable[..., Any]
    predict: Callable[..., Any]


#: name -> Method: the built-in methods in the order of ``fit``'s documentation, then others in registration order
#: (the order does not depend on which module happened to be imported first)
METHODS: dict[str, Method] = {}

#: the built-in methods' order
BUILT_IN = ("exact", "cats", "eigen", "trimmed", "approx")


def register(name: str, summary: str, params: tuple[str, ...], check, run, predict) -> Method:
    if name in METHODS:
        raise ValueError(f"method {name!r} is registered twice")
    owned = {p: m.name for m in METHODS.values() for p in m.params}
    for p in params:
        if p in owned:
            raise ValueError(f"parameter {p!r} of method {name!r} already belongs to method {owned[p]!r}")
    METHODS[name] = method = Method(name, summary, tuple(params), check, run, predict)
    rank = {m: i for i, m in enumerate(BUILT_IN)}
    ordered = sorted(METHODS.items(), key=lambda item: rank.get(item[0], len(BUILT_IN)))   # stable: others keep theirs
    METHODS.clear()
    METHODS.update(ordered)
    return method


def method_params() -> dict[str, tuple[str, ...]]:
    """{method: its own keyword arguments of fit}."""
    return {name: m.params for name, m in METHODS.items()}


def all_params() -> tuple[str, ...]:
    return tuple(p for m in METHODS.values() for p in m.params)


@dataclass
class FitContext:
    """What ``fit`` has validated for every method, handed to the method's check and run."""

    X: Any
    k: int
    n: int
    spec: Any
    backend: Any
    dt: Any
    precomputed: bool
    weights_h: Any
    init: Any
    n_init: int
    max_iter: int
    tol: float
    rng: Any
    verbose: bool
    keep_on_device: bool
    update: str
    t_start: float
    t_valid: float = 0.0
