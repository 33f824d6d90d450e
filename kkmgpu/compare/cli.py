"""The options of ``kkmgpu compare`` (:func:`add_arguments`, also used by ``bench/compare.py``) and the run
from parsed arguments (:func:`run_from_args`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kkmgpu.compare.contestants import methods
from kkmgpu.compare.data import DEFAULT_DATASETS, GENERATED, QUICK_DATASETS
from kkmgpu.compare.report import write_outputs
from kkmgpu.compare.runner import run_comparison


def add_arguments(parser):
    """The options of ``kkmgpu compare`` (also used by ``bench/compare.py``)."""
    parser.add_argument("--out", type=Path, default=Path("."), metavar="DIR",
                        help="folder for the .md, .csv, .json and .png outputs (default: the working directory)")
    parser.add_argument("--prefix", default="compare", help="file name stem of the outputs (default: compare)")
    parser.add_argument("--quick", action="store_true",
                        help=f"small data sets ({', '.join(QUICK_DATASETS)}; circles and spirals are generated, so "
                             "every installation has them), small scenarios, one seed")
    parser.add_argument("--datasets", type=_name_list, default=None, metavar="A,B,...",
                        help="comma-separated data sets (default: " + ", ".join(DEFAULT_DATASETS) + "; also "
                             + ", ".join(GENERATED) + " and mnist-N)")
    parser.add_argument("--methods", type=_name_list, default=None, metavar="A,B,...",
                        help="comma-separated methods (default: all): " + ", ".join(m.name for m in methods()))
    parser.add_argument("--no-scenarios", dest="scenarios", action="store_false",
                        help="skip the growing-n and growing-d scenarios")
    parser.add_argument("--seeds", type=int, default=None, metavar="S",
                        help="seeds per scenario point (default: 3, 1 with --quick)")
    parser.add_argument("--data-dir", type=Path, default=None, metavar="DIR",
                        help="the data folder with shapes/, uci/ and mnist/, the only one looked in (default: "
                             "$KKMGPU_DATA_DIR, then shared/data beside a source checkout); sets whose files are "
                             "missing are skipped and listed at the end")
    parser.add_argument("--no-plots", dest="plots", action="store_false", help="write no PNG plots")
    parser.add_argument("--device", default="auto", metavar="auto|cpu|cuda|cuda:N",
                        help="where kkmgpu's methods and the metrics run (default: auto)")
    parser.add_argument("--quiet", action="store_true", help="no per-run lines")
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                        help="a progress bar over the runs (default: on when stderr is a terminal)")
    return parser


def _progress_default(flag):
    """``--progress`` / ``--no-progress`` as given, otherwise on exactly when stderr is a terminal."""
    return bool(sys.stderr.isatty()) if flag is None else bool(flag)


def _name_list(text):
    return [part.strip() for part in text.split(",") if part.strip()]


def run_from_args(args):
    """Run the comparison from parsed arguments and write the outputs; returns the exit status 0."""
    verbose = not args.quiet
    report = run_comparison(dataset_names=args.datasets, method_names=args.methods, scenarios=args.scenarios,
                            quick=args.quick, seeds=args.seeds, device=args.device, data_dir=args.data_dir,
                            verbose=verbose, progress=_progress_default(args.progress))
    report["argv"] = sys.argv[1:]
    paths = write_outputs(report, args.out, args.prefix, plots=args.plots, verbose=verbose)
    for path in paths:
        print(f"wrote {path}")
    ran = sorted({row["dataset"] for row in report["rows"] if row["section"] == "datasets"})
    skipped = [item for item in report["skipped"] if item.startswith("data set ")]
    if skipped:
        print(f"ran {len(ran)} data set(s) ({', '.join(ran) or 'none'}); skipped {len(skipped)}:")
        for item in skipped:
            print(f"  {item}")
    return 0
