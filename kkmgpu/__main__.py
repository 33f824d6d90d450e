"""``python -m kkmgpu``: the same command line as the ``kkmgpu`` console script."""

from kkmgpu.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
