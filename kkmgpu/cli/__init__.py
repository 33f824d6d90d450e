"""The ``kkmgpu`` command line: ``kkmgpu demo``, ``kkmgpu fit DATA -k K`` and ``kkmgpu compare``.

Run ``kkmgpu --help`` (or ``python -m kkmgpu --help``) for the options.
"""

from kkmgpu.cli.commands import main

__all__ = ["main"]
