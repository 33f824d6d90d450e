"""The committed comparison run: kkmgpu's methods against scikit-learn's and tslearn's (``kkmgpu.compare``).

    python bench/compare.py                 # everything; 31 minutes on the 2-core reference CPU under load
    python bench/compare.py --quick --out /tmp/compare   # a smoke run: about 1-2 minutes on the 2-core CPU
                                                         # (2 min 20 s under load: CATS on mnist-500 took 100 s)

Writes ``bench/results/<date>-<device>-compare.{md,csv,json}`` and ``-compare-*.png`` (the file stem is the
date and the device slug of ``_kkmgpu_bench.device_identity``; ``--out`` / ``--prefix`` override them). The
JSON records the machine, the versions and the load average at the start and end of the run: wall times on
a shared machine are inflated by whatever else runs. ``kkmgpu compare`` runs the same code.
"""

from __future__ import annotations

import argparse
import datetime
import sys
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
if str(BENCH_DIR.parent) not in sys.path:  # run from a checkout without kkmgpu installed
    sys.path.insert(1, str(BENCH_DIR.parent))

from kkmgpu import compare  # noqa: E402
from kkmgpu.backend.device import resolve_device  # noqa: E402

sys.path.insert(0, str(BENCH_DIR))
import _kkmgpu_bench  # noqa: E402


def default_prefix(device="auto", date=None):
    """``<YYYY-MM-DD>-<device slug>-compare``, e.g. ``2026-11-22-cpu-amd-epyc-2core-compare``."""
    date = date or datetime.date.today().isoformat()
    name = resolve_device(device).name
    return f"{date}-{_kkmgpu_bench.device_identity(name)['slug']}-compare"


def main(argv=None):
    """Run the comparison with the benchmark defaults (outputs into bench/results); returns 0."""
    parser = compare.add_arguments(argparse.ArgumentParser(prog="bench/compare.py", description=__doc__.splitlines()[0]))
    parser.set_defaults(out=_kkmgpu_bench.DEFAULT_RESULTS_DIR, prefix=None)
    args = parser.parse_args(argv)
    if args.prefix is None:
        args.prefix = default_prefix(args.device)
    report = compare.run_comparison(dataset_names=args.datasets, method_names=args.methods,
                                    scenarios=args.scenarios, quick=args.quick, seeds=args.seeds,
                                    device=args.device, data_dir=args.data_dir, verbose=not args.quiet)
    report["argv"] = ["bench/compare.py", *(sys.argv[1:] if argv is None else argv)]
    report["environment"]["host"] = _kkmgpu_bench.host_info()
    for path in compare.write_outputs(report, args.out, args.prefix, plots=args.plots, verbose=not args.quiet):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
