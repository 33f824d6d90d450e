"""Warnings attributed to the caller's line, however deep in kkmgpu they are raised."""

from __future__ import annotations

import contextlib
import contextvars
import os
import sys
import warnings

_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep

# the warnings given during the enclosing fit (see collect), by key
_GIVEN = contextvars.ContextVar("kkmgpu_given", default=None)


def warn(message, category=UserWarning):
    """``warnings.warn`` with the stacklevel of the first frame outside the kkmgpu package.

    A fixed stacklevel points inside the library as soon as a call path gains or loses a frame; counting the
    frames here keeps the reported file and line the user's for every path (fit, the estimator, dask, ...).
    """
    frame, level = sys._getframe(1), 2
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level)


def fewer_distinct(n_distinct, k, category):
    """The warning for fewer distinct clusters than k, whichever method found them (one text for all)."""
    warn(f"Number of distinct clusters ({n_distinct}) found smaller than n_clusters ({k}): their centres coincide "
         "in feature space. Possibly due to duplicate points in X, or to a kernel that does not separate the points "
         "(numerically constant on these data, e.g. an rbf or laplacian gamma far too small: see "
         "UninformativeKernelWarning).", category)
    given = _GIVEN.get()
    if given is not None:
        given.add("fewer_distinct")


@contextlib.contextmanager
def collect():
    """Yields the set of keys of the warnings given inside the block (this thread or task only)."""
    given = set()
    token = _GIVEN.set(given)
    try:
        yield given
    finally:
        _GIVEN.reset(token)
