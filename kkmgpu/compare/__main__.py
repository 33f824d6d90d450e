"""``python -m kkmgpu.compare``: the same as ``kkmgpu compare``."""

from __future__ import annotations

import argparse
import sys

import kkmgpu.compare
from kkmgpu.compare.cli import add_arguments, run_from_args


def main(argv=None):
    """``python -m kkmgpu.compare``: the same as ``kkmgpu compare``."""
    parser = add_arguments(argparse.ArgumentParser(prog="kkmgpu compare",
                                                   description=kkmgpu.compare.__doc__.splitlines()[0]))
    return run_from_args(parser.parse_args(argv))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
