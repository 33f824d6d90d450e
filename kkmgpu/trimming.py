"""Kernel matrix trimming (papers/kernel-matrix-trimming.txt, Section 3) and kernel k-means on the trimmed matrix.

Every element (row i of the kernel matrix K) votes for the size of its own cluster: its row sorted in
descending order, d_i(1) >= d_i(2) >= ..., drops where its own cluster ends, and the numerical derivative

    r'_i(j) = sum_{h=1..H} (d_i(j - h) - d_i(j + h)) / (2 h)          (Section 3; H = 3)

is large there (the paper sorts ascending, r_i(x) = d_i(n + 1 - x); candidate size j counts the values at
or above position j). Row i votes for the sizes j whose r'_i(j) is among its top 10%. The votes are summed
over the elements, v*_j, and every size is scored by how close v*_j is to a whole multiple of j (Eq. 5):

    s_j = (1 - 1/j) max(exp(-|v*_j - floor(v*_j / j) j| / j), exp(-|v*_j - ceil(v*_j / j) j| / j))

with the nearest *non-zero* multiples, as the text says (floor and ceil at least 1). Ties at the row's
10% cut go to the smaller sizes, and a zero derivative (a flat stretch) casts no vote. On the noiseless
block matrix of the paper's Figure 3 (clusters of 43, 19, 10, 9, 6, 6) this gives the paper's estimate,
6 clusters of 43, 19, 10, 7, 7, 7 (tests/test_trimming.py). One addition: only sizes j <= max_size n
(default 0.5; 1 is the paper as written) are candidates, see DEFAULT_MAX_SIZE.

The winning size w = argmax_j s_j goes to every element that voted for it; their votes leave v*, and the
scoring repeats until no votes are left. Row i of K is then cut below its (w_i + 0.01 n)-th largest value
(K_hat), and K* = max(K_hat, K_hat^T) is the symmetric, sparse matrix kernel k-means runs on, in O(nnz)
per iteration. As a by-product the voting estimates the number of clusters and their sizes: a winning size
w taken by m elements counts round(m / w) clusters of size w.

Memory beyond K: the votes as one bit per (element, size), n^2 / 8 bytes (1/32 of a float32 K), row batches
of sorted rows and derivatives sized to the free memory, and, at the end, K_hat and K* in CSR (O(nnz), checked
against the free memory first); no second dense n x n array is made. ``fit(method="trimmed")`` frees K once
K_hat is built, so the sparse maximum also has K's memory. Measured on MNIST n = 20,000 (K 1.5 GiB):
0.8-1.2 GiB at the peak beyond K, K* 0.35-0.5 GiB (bench/README.md, "Kernel matrix trimming").
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from kkmgpu import _validation

from kkmgpu.engine import sparse as _sparse
from kkmgpu.backend.device import Backend, resolve_device

__all__ = ["TrimmedKernel", "trim_kernel_matrix", "size_scores", "sorted_row_derivative",
           "DEFAULT_VOTE_FRACTION", "DEFAULT_SLACK", "DEFAULT_H", "DEFAULT_MAX_SIZE"]

#: The paper's choices: the top 10% of each row's derivative vote, the cut-off is 0.01 n past the
#: estimated size, and the derivative sums the central differences of steps h = 1, 2, 3.
DEFAULT_VOTE_FRACTION = 0.1
DEFAULT_SLACK = 0.01
DEFAULT_H = 3
#: Not in the paper: only sizes j <= max_size n are candidates. On real kernel matrices (MNIST: RBF, the
#: neural kernel) the *low* tail of every sorted row is steep too, so with all sizes allowed every row votes
#: for sizes near n, a size near n wins the first round for nearly every element and K is kept whole
#: (measured: density 1.0 at n = 3000; bench/README.md, "Kernel matrix trimming"). max_size=1 is the paper
#: as written; the default 0.5 admits any cluster of at most half the points.
DEFAULT_MAX_SIZE = 0.5
#: The four defaults by the names fit takes them under (``trim_vote_fraction`` ...), for
#: :func:`kkmgpu._validation.check_trim_params`.
DEFAULTS = {"vote_fraction": DEFAULT_VOTE_FRACTION, "slack": DEFAULT_SLACK, "h": DEFAULT_H, "max_size": DEFAULT_MAX_SIZE}

#: Bytes of row-batch workspace per element of a batch row (sorted row, padded copy, derivative,
#: partition copy, masks and an int32 running count), for float32 rows; scaled by the item size.
_WORK_BYTES_PER_ENTRY = 40
#: At most this fraction of the free memory goes to one batch's workspace.
_BATCH_MEMORY_FRACTION = 0.25
#: ... and at most this many bytes (CPU: keeps batches cache- and RAM-friendly; GPU: few, large sorts).
_BATCH_MAX_BYTES = {"cpu": 512 * 2**20, "cuda": 4 * 2**30}


@dataclass(frozen=True, repr=False)
class TrimmedKernel:
    """What :func:`trim_kernel_matrix` returns.

    Attributes
    ----------
    K : sparse matrix of shape (n_samples, n_samples)
        The trimmed kernel matrix K* = max(K_hat, K_hat^T) in CSR (``scipy.sparse.csr_matrix`` on the CPU,
        ``cupyx.scipy.sparse.csr_matrix`` on a GPU), float32 or float64 as K (float16 K gives float32).
    n_clusters : int
        Estimated number of clusters: sum over winning sizes w of round(m_w / w), m_w the elements
        that took size w.
    cluster_sizes : ndarray of shape (n_clusters,)
        Estimated cluster sizes, largest first (each winning size w repeated round(m_w / w) times).
    row_sizes : ndarray of shape (n_samples,)
        w_i, the cluster size assigned to each element by the voting (n for an element that cast no
        votes: a constant row).
    thresholds : ndarray of shape (n_samples,)
        Row i keeps K[i, j] >= thresholds[i], the (w_i + ceil(slack n))-th largest value of the row.
    votes : ndarray of shape (n_samples,)
        v*: the number of elements voting for each size j = 1..n (index j - 1), before any removal.
    winners : ndarray of shape (n_rounds, 2)
        (winning size w, number of elements that took it), in the order the rounds chose them.
    nnz : int
        Stored entries of K*.
    density : float
        nnz / n^2, the paper's "reduction".
    vote_fraction, slack : float
    h : int
    max_size : float
        The parameters used.
    device : str
    timings : dict
        Seconds: "votes" (row sorts, derivatives, votes), "voting" (score rounds), "thresholds",
        "sparse" (K_hat and K*), "total".
    example_rows : ndarray of shape (n_examples, n_samples)
        A few rows of K sorted in descending order (for :meth:`plot`).
    example_index : ndarray of shape (n_examples,)
        Which rows those are.
    """

    K: object
    n_clusters: int
    cluster_sizes: np.ndarray
    row_sizes: np.ndarray
    thresholds: np.ndarray
    votes: np.ndarray
    winners: np.ndarray
    nnz: int
    density: float
    vote_fraction: float
    slack: float
    h: int
    max_size: float
    device: str
    timings: dict = field(default_factory=dict)
    example_rows: np.ndarray = None
    example_index: np.ndarray = None

    def __repr__(self) -> str:
        n = self.K.shape[0]
        return (f"TrimmedKernel(n_samples={n}, n_clusters={self.n_clusters}, "
                f"cluster_sizes={self.cluster_sizes.tolist()}, nnz={self.nnz}, density={self.density:.4g}, "
                f"device={self.device!r})")

    def plot(self, axes=None):
        """Sorted example rows with their cut-offs, and the vote histogram v* with the winning sizes.

        Parameters
        ----------
        axes : sequence of two matplotlib Axes, optional
            Drawn into a new 1 x 2 figure when omitted.

        Returns
        -------
        axes : the two Axes
        """
        try:
            import matplotlib.pyplot as plt
        except ImportError as exc:  # pragma: no cover - exercised only without matplotlib
            raise ImportError("TrimmedKernel.plot needs matplotlib: pip install kkmgpu[plot]") from exc
        if axes is None:
            _, axes = plt.subplots(1, 2, figsize=(10, 3.5))
        ax_rows, ax_votes = axes
        n = self.K.shape[0]
        sizes = np.arange(1, n + 1)
        for row, i in zip(self.example_rows, self.example_index):
            line, = ax_rows.plot(sizes, row, lw=1, label=f"row {i}: w={self.row_sizes[i]}")
            ax_rows.axhline(self.thresholds[i], color=line.get_color(), ls=":", lw=0.8)
        ax_rows.set_xlabel("position j (descending order) = candidate size")
        ax_rows.set_ylabel("kernel value")
        ax_rows.set_title("sorted rows and their cut-offs")
        ax_rows.legend(fontsize=7)
        ax_votes.bar(sizes, self.votes, width=1.0, color="0.6")
        for w, m in self.winners:
            ax_votes.axvline(w, color="C3", lw=0.8, alpha=0.6)
        ax_votes.set_xlabel("cluster size j")
        ax_votes.set_ylabel("votes v*_j")
        ax_votes.set_title(f"votes; {self.n_clusters} clusters estimated")
        return axes


# ------------------------------------------------------------------------------------ the paper's pieces


def size_scores(votes):
    """The suitability score s_j of every cluster size j = 1..len(votes) (paper's Eq. 5).

    Parameters
    ----------
    votes : array of shape (n_sizes,)
        v*_j, the number of votes for size j = index + 1 (NumPy or CuPy).

    Returns
    -------
    scores : float64 array of shape (n_sizes,)
        s_j = (1 - 1/j) max(exp(-|v - floor(v/j) j| / j), exp(-|v - ceil(v/j) j| / j)), where the
        multiples are the nearest *non-zero* ones, as the paper's text says ("the nearest integer,
        non-zero product of j"): floor and ceil are at least 1. (With a zero multiple, a size j far
        above its votes v would score (1 - 1/j) exp(-v/j), close to 1, for a handful of stray votes.)

    Examples
    --------
    >>> from kkmgpu.trimming import size_scores
    >>> [round(float(s), 4) for s in size_scores([5, 3, 3, 6])]  # 3 votes = 1 cluster of size 3
    [0.0, 0.3033, 0.6667, 0.4549]
    """
    xp = _namespace(votes)
    v = xp.asarray(votes, dtype=xp.float64)
    j = xp.arange(1, v.shape[0] + 1, dtype=xp.float64)
    below = xp.abs(v - xp.maximum(xp.floor(v / j), 1.0) * j) / j  # the nearest *non-zero* multiple
    above = xp.abs(v - xp.maximum(xp.ceil(v / j), 1.0) * j) / j
    return (1.0 - 1.0 / j) * xp.maximum(xp.exp(-below), xp.exp(-above))


def sorted_row_derivative(rows, h=DEFAULT_H):
    """r'_i(j) = sum_{t=1..h} (d_i(j - t) - d_i(j + t)) / (2 t) of rows sorted in descending order.

    Indices outside 1..n take the nearest end value (d(0) = d(1), d(n + 1) = d(n)).

    Parameters
    ----------
    rows : array of shape (m, n)
        Each row sorted in descending order (NumPy or CuPy).
    h : int
        Largest step of the central differences.

    Returns
    -------
    derivative : array of shape (m, n), the dtype of ``rows``

    Examples
    --------
    >>> import numpy as np
    >>> from kkmgpu.trimming import sorted_row_derivative
    >>> sorted_row_derivative(np.array([[1.0, 1.0, 1.0, 0.0, 0.0, 0.0]]), h=1)
    array([[0. , 0. , 0.5, 0.5, 0. , 0. ]])
    """
    xp = _namespace(rows)
    m, n = rows.shape
    padded = xp.concatenate([xp.repeat(rows[:, :1], h, axis=1), rows, xp.repeat(rows[:, -1:], h, axis=1)], axis=1)
    out = xp.zeros_like(rows)
    for t in range(1, h + 1):
        out += (padded[:, h - t:h - t + n] - padded[:, h + t:h + t + n]) * (1.0 / (2 * t))
    return out


def _namespace(a):
    from kkmgpu.backend.device import import_cupy, is_cupy_array

    return import_cupy() if is_cupy_array(a) else np


def _top_votes(D, m, xp):
    """Boolean (b, n): the m largest positive entries of every row of D; ties at the m-th value go to
    the smaller sizes (lower index), so the choice is the same on every backend."""
    b, n = D.shape
    m = min(m, n)
    tau = xp.partition(D, n - m, axis=1)[:, n - m:n - m + 1]  # the m-th largest of each row
    above = D > tau
    tied = D == tau
    need = m - above.sum(axis=1, dtype=xp.int32)
    rank = xp.cumsum(tied, axis=1, dtype=xp.int32)
    votes = above | (tied & (rank <= need[:, None]))
    votes &= D > 0  # a flat stretch of the row is no evidence of a cluster boundary
    return votes


def _batch_rows(n, itemsize, backend: Backend, batch_size):
    if batch_size is not None:
        return max(1, min(n, int(batch_size)))
    per_row = max(1, n) * _WORK_BYTES_PER_ENTRY * max(itemsize, 4) // 4
    available = backend.available_bytes()
    cap = _BATCH_MAX_BYTES[backend.kind]
    budget = cap if available is None else min(cap, int(available * _BATCH_MEMORY_FRACTION))
    return max(1, min(n, budget // per_row))


def _pack_rows(votes, xp):
    """Pack a boolean (b, n) into (b, ceil(n / 8)) uint8, bit j of a row = size j + 1 (big-endian bytes)."""
    b, n = votes.shape
    width = -(-n // 8) * 8
    if width != n:
        votes = xp.concatenate([votes, xp.zeros((b, width - n), dtype=bool)], axis=1)
    return xp.packbits(votes.ravel()).reshape(b, width // 8)


def _unpacked_vote_sums(bits, rows, n, xp, chunk):
    """Sum over ``rows`` of their vote vectors (length n), unpacking ``chunk`` rows at a time."""
    total = xp.zeros(n, dtype=xp.int64)
    for s in range(0, rows.shape[0], chunk):
        part = bits[rows[s:s + chunk]]
        unpacked = xp.unpackbits(part.ravel()).reshape(part.shape[0], -1)[:, :n]
        total += unpacked.sum(axis=0, dtype=xp.int64)
    return total


def _estimate_sizes(bits, votes, n, xp, chunk):
    """The voting rounds: winning size, its voters, their votes removed; until no vote is left."""
    remaining = votes.copy()
    row_sizes = xp.zeros(n, dtype=xp.int64)
    winners = []
    while True:
        scores = size_scores(remaining)
        scores = xp.where(remaining > 0, scores, -1.0)
        w = int(xp.argmax(scores)) + 1
        if float(scores[w - 1]) < 0:
            break
        byte, bit = (w - 1) >> 3, 7 - ((w - 1) & 7)
        voted = ((bits[:, byte] >> bit) & 1).astype(bool) & (row_sizes == 0)
        rows = xp.flatnonzero(voted)
        row_sizes[rows] = w
        remaining -= _unpacked_vote_sums(bits, rows, n, xp, chunk)
        winners.append((w, int(rows.shape[0])))
    row_sizes = xp.where(row_sizes == 0, n, row_sizes)  # no votes at all: a constant row keeps everything
    return row_sizes, np.asarray(winners, dtype=np.int64).reshape(-1, 2)


def _row_thresholds(K, cutoff, xp, batch):
    """thresholds[i] = the cutoff[i]-th largest value of row i of K, one partition per distinct cutoff."""
    n = K.shape[0]
    out = xp.empty(n, dtype=xp.float64)
    order = xp.argsort(cutoff)
    sorted_cut = cutoff[order]
    values = xp.unique(sorted_cut)
    starts = xp.searchsorted(sorted_cut, values, side="left")
    ends = xp.searchsorted(sorted_cut, values, side="right")
    for t, a, b in zip(values.tolist(), starts.tolist(), ends.tolist()):
        for s in range(a, b, batch):
            rows = order[s:min(b, s + batch)]
            out[rows] = xp.partition(K[rows], n - t, axis=1)[:, n - t]
    return out


def _trim(K, backend: Backend, **params) -> TrimmedKernel:
    """Section 3 on a validated, symmetric dense K already on ``backend`` (parameters already checked)."""
    return _finish_trim(_trim_rows(K, backend, **params), backend)


def _trim_rows(K, backend: Backend, *, vote_fraction=DEFAULT_VOTE_FRACTION, slack=DEFAULT_SLACK, h=DEFAULT_H,
               max_size=DEFAULT_MAX_SIZE, batch_size=None, verbose=False, n_examples=3) -> dict:
    """Everything that reads the dense K: the votes, the sizes, the thresholds and K_hat (in CSR).

    Returns the fields of :class:`TrimmedKernel` but K* (K_hat in its place, "K_hat"); :func:`_finish_trim`
    symmetrises it without K, so a caller that owns K frees it in between (``fit(method="trimmed")`` does).
    """
    xp = backend.xp
    t0 = backend.timer()
    n = K.shape[0]
    compute = np.dtype(np.float32) if K.dtype == np.float16 else np.dtype(K.dtype)
    m = max(1, int(math.ceil(vote_fraction * n)))
    largest = max(1, int(math.floor(max_size * n)))
    batch = _batch_rows(n, compute.itemsize, backend, batch_size)
    if verbose:
        print(f"[kkmgpu] trimming the {n} x {n} kernel matrix on {backend.name}: {m} votes per row, "
              f"h={h}, slack {slack:g} n, rows in batches of {batch}")
    bits = xp.empty((n, -(-n // 8)), dtype=xp.uint8)
    votes = xp.zeros(n, dtype=xp.int64)
    examples = np.unique(np.linspace(0, n - 1, min(n, n_examples)).astype(np.int64))
    example_rows = np.empty((examples.size, n), dtype=np.float64)
    for i0 in range(0, n, batch):
        i1 = min(n, i0 + batch)
        desc = xp.sort(K[i0:i1].astype(compute, copy=False), axis=1)[:, ::-1]
        for e, i in enumerate(examples):
            if i0 <= i < i1:
                example_rows[e] = backend.to_host(desc[i - i0])
        derivative = sorted_row_derivative(xp.ascontiguousarray(desc), h)
        if largest < n:
            derivative[:, largest:] = 0  # sizes above max_size n cast no vote
        row_votes = _top_votes(derivative, m, xp)
        del derivative
        votes += row_votes.sum(axis=0, dtype=xp.int64)
        bits[i0:i1] = _pack_rows(row_votes, xp)
        del desc, row_votes
    t_votes = backend.timer()
    unpack_chunk = max(1, batch * 4)
    row_sizes, winners = _estimate_sizes(bits, votes, n, xp, unpack_chunk)
    del bits
    t_voting = backend.timer()
    extra = int(math.ceil(slack * n))
    cutoff = xp.minimum(row_sizes + extra, n)
    thresholds = _row_thresholds(K, cutoff, xp, batch)
    t_thresholds = backend.timer()
    K_hat = _sparse.rows_above_threshold(K, thresholds, backend, batch, compute, int(cutoff.sum()))
    t_sparse = backend.timer()

    counts = np.rint(winners[:, 1] / np.maximum(winners[:, 0], 1)).astype(np.int64) if winners.size else \
        np.zeros(0, dtype=np.int64)
    sizes = np.repeat(winners[:, 0], counts) if winners.size else np.zeros(0, dtype=np.int64)
    sizes = np.sort(sizes)[::-1].copy()
    timings = {"votes": t_votes - t0, "voting": t_voting - t_votes, "thresholds": t_thresholds - t_voting,
               "sparse": t_sparse - t_thresholds, "total": t_sparse - t0}
    return dict(K_hat=K_hat, n_clusters=int(sizes.size), cluster_sizes=sizes, row_sizes=backend.to_host(row_sizes),
                thresholds=backend.to_host(thresholds), votes=backend.to_host(votes), winners=winners,
                vote_fraction=vote_fraction, slack=slack, h=h, max_size=max_size, device=backend.name,
                timings=timings, example_rows=example_rows, example_index=examples, verbose=verbose)


def _finish_trim(rows: dict, backend: Backend) -> TrimmedKernel:
    """K* = max(K_hat, K_hat^T) from :func:`_trim_rows`' fields (consumed), into a :class:`TrimmedKernel`."""
    t0 = backend.timer()
    verbose = rows.pop("verbose")
    K_star = _sparse.symmetrise(rows.pop("K_hat"), backend, "maximum", "K* = max(K_hat, K_hat^T)")
    timings = dict(rows.pop("timings"))
    seconds = backend.timer() - t0
    timings["sparse"] += seconds
    timings["total"] += seconds
    n, nnz = K_star.shape[0], int(K_star.nnz)
    if verbose:
        sizes = rows["cluster_sizes"]
        print(f"[kkmgpu] trimming: {len(rows['winners'])} voting rounds, {sizes.size} clusters estimated "
              f"(sizes {sizes[:12].tolist()}{' ...' if sizes.size > 12 else ''}), nnz {nnz} = "
              f"{nnz / n ** 2:.4f} n^2, {timings['total']:.2f} s")
    return TrimmedKernel(K=K_star, nnz=nnz, density=nnz / float(n) ** 2, timings=timings, **rows)


def trim_kernel_matrix(K, *, vote_fraction=DEFAULT_VOTE_FRACTION, slack=DEFAULT_SLACK, h=DEFAULT_H,
                       max_size=DEFAULT_MAX_SIZE, device="auto", batch_size=None, verbose=False) -> TrimmedKernel:
    """Trim a kernel matrix by cluster-size voting (papers/kernel-matrix-trimming.txt, Section 3).

    Each row is sorted, votes for the cluster sizes where its sorted values drop most (the top
    ``vote_fraction`` of the numerical derivative with steps 1..``h``), sizes are won by the score of
    Eq. 5 round after round, and row i is cut below its (w_i + ceil(``slack`` n))-th largest value;
    the result is symmetrised as K* = max(K_hat, K_hat^T) and returned in CSR.

    Parameters
    ----------
    K : array of shape (n_samples, n_samples)
        A dense symmetric kernel matrix (NumPy or CuPy, float16/32/64). It is read, never modified.
    vote_fraction : float in (0, 1], default=0.1
        Each row votes for the ceil(vote_fraction n) sizes with the largest positive derivative.
    slack : float in [0, 1], default=0.01
        Row i keeps its w_i + ceil(slack n) largest values (the paper's guard against underestimated sizes).
    h : int >= 1, default=3
        The derivative sums central differences of steps 1..h.
    max_size : float in (0, 1], default=0.5
        Only sizes j <= max_size n are candidates (not in the paper, whose rule is max_size=1: on real kernel
        matrices the steep low tail of every sorted row then wins, and K stays whole; see the module notes).
    device : {"auto", "cpu", "cuda", "cuda:N"}, default="auto"
        Where the work runs ("auto": where K lives, else the GPU when usable).
    batch_size : int, optional
        Rows sorted per batch; default from the free memory (at most a quarter of it, and 512 MiB on the
        CPU, 4 GiB on a GPU).
    verbose : bool, default=False
        Print the batch size, the number of voting rounds and the result.

    Returns
    -------
    TrimmedKernel
        ``K`` (CSR), ``n_clusters``, ``cluster_sizes``, ``row_sizes``, ``thresholds``, ``votes``, ``density``,
        ``timings``, and :meth:`TrimmedKernel.plot`.

    Raises
    ------
    ValueError
        If K is not a finite, square, symmetric matrix, or a parameter is out of its range.
    TypeError
        If K is sparse (trimming needs every value of a row) or not numeric.

    Examples
    --------
    >>> import numpy as np, kkmgpu
    >>> rng = np.random.default_rng(0)
    >>> labels = np.repeat([0, 1, 2], [30, 20, 10])
    >>> K = np.where(labels[:, None] == labels[None, :], 0.9, 0.1) + rng.uniform(0, 0.05, (60, 60))
    >>> K = (K + K.T) / 2
    >>> trimmed = kkmgpu.trim_kernel_matrix(K, device="cpu")
    >>> trimmed.n_clusters, trimmed.cluster_sizes.tolist()
    (3, [30, 20, 10])
    """
    if _sparse.is_sparse(K):
        raise TypeError("trim_kernel_matrix needs a dense kernel matrix (every value of a row is sorted); "
                        f"got a sparse {type(K).__name__}.")
    vote_fraction, slack, h, max_size = _validation.check_trim_values(vote_fraction, slack, h, max_size)
    backend = resolve_device(device, (K,))
    with backend.activate():
        K = _validation.check_data(K, backend, name="K", square=True)
        if K.dtype.kind != "f":
            K = backend.asarray(K, dtype=np.float64)
        _validation.check_symmetric(K, backend, name="K")
        return _trim(K, backend, vote_fraction=vote_fraction, slack=slack, h=h, max_size=max_size,
                    batch_size=None if batch_size is None else _validation.check_int(batch_size, "batch_size",
                                                                                      minimum=1),
                    verbose=verbose)


# ------------------------------------------------------------------------------ fit and predict on K*


