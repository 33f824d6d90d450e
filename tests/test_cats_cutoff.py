"""CATS's pseudoinverse cutoff (engine/sampled.py, Eq. 2's M_c^+): an eigenvalue of M_c is dropped when
|lambda| <= rcond times the largest |eigenvalue| of the same M_c (issue 27 point 8).

The stack below has one spectrum at three scales and with either sign of its largest eigenvalue, with an
eigenvalue on each side of the cutoff: an absolute cutoff (rcond alone), a reference shared by the stack (its
largest eigenvalue over all clusters) or the largest signed eigenvalue instead of |lambda| each keep or drop a
component that the float64 reference below does not.
"""

import numpy as np
import pytest

from kkmgpu.backend import device as _backend
from kkmgpu.engine import sampled as _cats

RCOND = 1e-6


def host(a):
    return np.asarray(a.get() if hasattr(a, "get") else a)


def stack(l, seed):
    """M (m, l, l), rhs (m, l) and the float64 pseudoinverse solution x_c = sum_{kept i} v_i (v_i . rhs_c) /
    lambda_i, from known eigenpairs: spectrum (s, 0.3 |s|, 3 rcond |s|, 0.5 rcond |s|, 0, ...) for s in
    1, 1e-12, 1e6 and -1 (the largest |lambda| negative)."""
    rng = np.random.default_rng(seed)
    scales = (1.0, 1e-12, 1e6, -1.0)
    Ms, rhss, xs = [], [], []
    for s in scales:
        V = np.linalg.qr(rng.normal(size=(l, l)))[0]
        lam = np.zeros(l)
        lam[:4] = (s, 0.3 * abs(s), 3 * RCOND * abs(s), 0.5 * RCOND * abs(s))
        coeffs = rng.uniform(0.5, 1.5, size=l) * abs(s)    # every eigenvector in the right-hand side
        kept = np.abs(lam) > RCOND * np.abs(lam).max()
        Ms.append((V * lam) @ V.T)
        rhss.append(V @ coeffs)
        xs.append(V[:, kept] @ (coeffs[kept] / lam[kept]))
    return np.stack(Ms), np.stack(rhss), np.stack(xs)


def test_pinv_cutoff_is_relative_to_each_clusters_largest_magnitude(device):
    M_h, rhs_h, expected = stack(12, seed=71)
    backend = _backend.resolve_device(device)
    with backend.activate():
        M, rhs = backend.asarray(M_h), backend.asarray(rhs_h)
        for solve in (_cats._pinv_solve, _cats._solve_coefficients):
            x = host(solve(M, rhs, RCOND, backend))
            for c in range(len(M_h)):
                np.testing.assert_allclose(x[c], expected[c], rtol=0, atol=1e-7 * np.abs(expected[c]).max(),
                                           err_msg=f"cluster {c}")
