"""The stand-in's cost ledger: what the operations that run would cost on a GPU, counted as they run.

Not a CuPy API. ``with cupy.cuda.standin_ledger() as ledger:`` counts, while the block runs:

``launches``
    kernel launches: every ``RawKernel`` / ``RawModule`` launch, and one per CuPy-level operation that gives a
    new device buffer or writes into one (ufuncs and operators, reductions, sorts, matrix products, gathers and
    scatters, copies, ``astype``, fills, ``zeros`` / ``ones`` / ``full`` / ``arange``, joins, linear algebra,
    sparse products). Views (basic slices, ``reshape`` / ``ravel`` of contiguous data, ``.T``), ``empty`` and
    metadata cost nothing. CuPy routines known to run several kernels count those (:data:`ROUTINES`).
``syncs``
    device-to-host synchronisations: ``.get()``, ``asnumpy``, ``.item()``, ``float()`` / ``int()`` / ``bool()`` /
    ``complex()`` of a device array, ``tolist``, printing one, pickling one, a sparse matrix's ``.get()``,
    explicit ``synchronize()`` calls, and the ones CuPy makes inside a routine to size its result (``nonzero`` /
    ``flatnonzero`` / ``argwhere``, boolean-mask indexing and assignment, ``bincount``, ``unique``, ``compress``,
    sparse results whose number of stored entries is data-dependent).
``h2d_copies``, ``h2d_bytes``, ``d2h_bytes``
    host-to-device copies (``asarray`` / ``array`` of host data, ``.set()``, NumPy arrays or lists used as
    indices or assigned values, SciPy matrices given to a device matrix) and their bytes; the bytes every
    synchronisation above brings back.
``read_bytes``, ``written_bytes``
    device memory traffic: an operation reads its device operands' bytes and writes its result's (a gather reads
    what it gathers and its index; a matrix product reads both operands and writes the product). A raw kernel
    reads each array argument behind a ``const`` pointer and reads and writes each other one (an upper bound:
    the kernel may touch less), except the arguments of :data:`ROW_GATHERS`, read only at the rows listed in
    another argument.
``flops``
    matrix-product flops (2 m n k per product, and 2 times the product of the index sizes for ``einsum``) by
    compute mode: ``"fp64"``, ``"fp32"``, ``"tf32"`` (float32 operands under the TF32 compute type, see
    ``cupy._core._routines_linalg``), ``"fp16"``, ``"int"``.

What it does not see: work inside library calls beyond their inputs and outputs (cuSOLVER's and ARPACK's
iterations count as one launch), host work between device calls, kernel occupancy, overlap of transfers and
kernels. ``bench/gpu_model.py`` turns the counts into a predicted H100 time.

``ledger.mark(label)`` records the counts so far; ``ledger.phases()`` gives the counts between marks.
"""
from __future__ import annotations

import contextlib
import functools
import os
import sys
import threading
from collections import Counter

#: CuPy routines that run several kernels and synchronise inside: name -> (launches, syncs) per call, read off
#: CuPy's sources (cupy/_core/_routines_indexing.pyx, cupy/_statistics/histogram.py, cupy/_manipulation/add_remove.py)
ROUTINES = {
    "nonzero": (3, 1),       # not_equal (non-bool input), scan, scatter of the indices; int(scan[-1]) syncs
    "flatnonzero": (3, 1),
    "argwhere": (3, 1),
    "compress": (4, 1),      # nonzero, then take
    "extract": (4, 1),
    "unique": (5, 1),        # sort, neighbour comparison, boolean-mask gather (syncs)
    "bincount": (5, 2),      # (x < 0).any() and int(x.max()) sync; zeros; the histogram kernel
    "mask_getitem": (3, 1),  # scan of the mask (int(scan[-1]) syncs), gather
    "mask_setitem": (3, 1),
}

#: raw kernels whose named pointer argument is read only at the rows listed in another argument:
#: kernel name -> {argument: argument with the row indices}; kernels_cuda/kernel_kmeans.cu's ``segment_sums``
#: and ``moved_sums`` read K[rows[p], :] for their entries p, not all of K. A new kernel that gathers rows must be
#: listed here, or the ledger counts all of its argument
ROW_GATHERS = {"segment_sums": {"K": "rows"}, "moved_sums": {"K": "rows"}}

_STANDIN_ROOT = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
_REPO_ROOT = os.path.dirname(os.path.dirname(_STANDIN_ROOT))
_LOCK = threading.Lock()

#: the ledgers counting now (operations are counted in every one of them)
ACTIVE: list = []

_FIELDS = ("launches", "syncs", "h2d_copies", "h2d_bytes", "d2h_bytes", "read_bytes", "written_bytes")


class Counts:
    """One set of counts (see the module docstring); ``+``, ``-``, ``* number`` and ``/ number`` work field by
    field (``flops`` per compute mode)."""

    __slots__ = _FIELDS + ("flops",)

    def __init__(self, flops=None, **values):
        for name in _FIELDS:
            setattr(self, name, values.pop(name, 0))
        if values:
            raise TypeError(f"unknown counts {sorted(values)}; the fields are {_FIELDS + ('flops',)}")
        self.flops = dict(flops or {})

    def copy(self) -> "Counts":
        return Counts(flops=self.flops, **{name: getattr(self, name) for name in _FIELDS})

    def _combine(self, other, sign):
        out = self.copy()
        for name in _FIELDS:
            setattr(out, name, getattr(self, name) + sign * getattr(other, name))
        for mode, value in other.flops.items():
            out.flops[mode] = out.flops.get(mode, 0) + sign * value
        return out

    def __add__(self, other):
        return self._combine(other, 1)

    def __sub__(self, other):
        return self._combine(other, -1)

    def __mul__(self, factor):
        return Counts(flops={m: v * factor for m, v in self.flops.items()},
                      **{name: getattr(self, name) * factor for name in _FIELDS})

    __rmul__ = __mul__

    def __truediv__(self, divisor):
        return self * (1.0 / divisor)

    @property
    def device_bytes(self):
        """Bytes read plus bytes written in device memory."""
        return self.read_bytes + self.written_bytes

    @property
    def total_flops(self):
        return sum(self.flops.values())

    def as_dict(self) -> dict:
        return {**{name: getattr(self, name) for name in _FIELDS}, "flops": dict(self.flops)}

    def __eq__(self, other):
        return isinstance(other, Counts) and self.as_dict() == other.as_dict()

    def __repr__(self):
        flops = ", ".join(f"{m} {v:.4g}" for m, v in sorted(self.flops.items()) if v)
        return (f"Counts(launches={self.launches:g}, syncs={self.syncs:g}, h2d={self.h2d_copies:g} copies / "
                f"{self.h2d_bytes:g} B, d2h={self.d2h_bytes:g} B, read={self.read_bytes:g} B, "
                f"written={self.written_bytes:g} B, flops={{{flops}}})")


class Ledger:
    """Counts of the operations run while it is active (:func:`ledger`), with where the syncs and transfers
    happened and which operations launched."""

    def __init__(self, trace: bool = False):
        self.counts = Counts()
        self.launch_names = Counter()   # operation or kernel name -> launches
        self.by_name = {}               # operation or kernel name -> Counts of its launches (bytes, flops)
        self.sync_sites = Counter()     # (kind, "file:line function") -> syncs
        self.h2d_sites = Counter()      # "file:line function" -> bytes copied to the device
        self.launch_sites = Counter() if trace else None
        self.notes = Counter()          # what the ledger could not model exactly
        self.marks = []                 # (label, Counts so far)

    def snapshot_by_name(self) -> dict:
        """{operation name: Counts of its launches so far} (a copy)."""
        return {name: counts.copy() for name, counts in self.by_name.items()}

    def snapshot(self) -> Counts:
        return self.counts.copy()

    def mark(self, label) -> Counts:
        """Record the counts so far under ``label``; returns them."""
        counts = self.snapshot()
        self.marks.append((label, counts))
        return counts

    def phases(self) -> list:
        """[(label, Counts between the previous mark (or the start) and this one)] for every mark."""
        out, previous = [], Counts()
        for label, counts in self.marks:
            out.append((label, counts - previous))
            previous = counts
        return out

    def report(self, top: int = 12) -> str:
        """A few lines: the counts, the most frequent launches and every sync site."""
        lines = [repr(self.counts)]
        lines += [f"  launches {count:6d}  {name}" for name, count in self.launch_names.most_common(top)]
        lines += [f"  syncs    {count:6d}  {kind} at {site}" for (kind, site), count in self.sync_sites.most_common()]
        lines += [f"  h2d      {count:6d} B  at {site}" for site, count in self.h2d_sites.most_common(top)]
        lines += [f"  note     {count:6d}  {what}" for what, count in self.notes.items()]
        return "\n".join(lines)


@contextlib.contextmanager
def ledger(trace: bool = False):
    """Count the stand-in's GPU costs inside the block (see the module docstring); ``trace`` also records where
    every launch came from (``launch_sites``)."""
    current = Ledger(trace)
    with _LOCK:
        ACTIVE.append(current)
    try:
        yield current
    finally:
        with _LOCK:
            ACTIVE.remove(current)


@functools.lru_cache(maxsize=None)
def _where(filename: str):
    """(inside the stand-in?, the path as reports show it: relative to the repository when inside it)."""
    path = os.path.realpath(filename)
    shown = os.path.relpath(path, _REPO_ROOT) if path.startswith(_REPO_ROOT + os.sep) else filename
    return path.startswith(_STANDIN_ROOT + os.sep), shown


def _site() -> str:
    """The first caller outside the stand-in and its caller: "path:line function < path:line function"."""
    frame = sys._getframe(2)
    while frame is not None and _where(frame.f_code.co_filename)[0]:
        frame = frame.f_back
    parts = []
    while frame is not None and len(parts) < 2:
        parts.append(f"{_where(frame.f_code.co_filename)[1]}:{frame.f_lineno} {frame.f_code.co_name}")
        frame = frame.f_back
    return " < ".join(parts) or "?"


def launch(name: str, read=0, written=0, flops=0, mode=None, launches=1, syncs=0) -> None:
    """``launches`` kernel launches of operation ``name`` (and ``syncs`` synchronisations inside it)."""
    with _LOCK:
        site = _site() if syncs or any(led.launch_sites is not None for led in ACTIVE) else None
        for led in ACTIVE:
            c = led.counts
            c.launches += launches
            c.read_bytes += read
            c.written_bytes += written
            if flops:
                c.flops[mode] = c.flops.get(mode, 0) + flops
            led.launch_names[name] += launches
            own = led.by_name.get(name)
            if own is None:
                own = led.by_name[name] = Counts()
            own.launches += launches
            own.read_bytes += read
            own.written_bytes += written
            if flops:
                own.flops[mode] = own.flops.get(mode, 0) + flops
            if syncs:
                c.syncs += syncs
                c.d2h_bytes += 8 * syncs  # a count or a flag
                led.sync_sites[(name, site)] += syncs
            if led.launch_sites is not None:
                led.launch_sites[(name, site)] += launches


def d2h(kind: str, nbytes) -> None:
    """A synchronisation of kind ``kind`` that brings ``nbytes`` back to the host."""
    with _LOCK:
        site = _site()
        for led in ACTIVE:
            led.counts.syncs += 1
            led.counts.d2h_bytes += int(nbytes)
            led.sync_sites[(kind, site)] += 1


def h2d(nbytes) -> None:
    """A copy of ``nbytes`` host bytes to the device."""
    with _LOCK:
        site = _site()
        for led in ACTIVE:
            led.counts.h2d_copies += 1
            led.counts.h2d_bytes += int(nbytes)
            led.h2d_sites[site] += int(nbytes)


def note(what: str) -> None:
    """Something the ledger counted by a coarser rule than usual (shown in the report)."""
    with _LOCK:
        for led in ACTIVE:
            led.notes[what] += 1
