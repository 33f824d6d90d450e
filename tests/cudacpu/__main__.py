"""Run a command with cudacpu's sanitizer / schedule settings (see the package docstring).

    python tests/cudacpu --sanitize address,undefined -- python -m pytest -q tests/test_twins.py -k cuda
    python tests/cudacpu --sanitize thread -- python tests/cuda_planted/drive.py real
    python tests/cudacpu --schedule random --seed 7 -- python -m pytest -q tests/test_tiled.py -k cuda
    PYTHONPATH=tests python -m cudacpu --print-env --sanitize thread

Exit status: the command's (it is exec'ed); 2 when the settings are wrong or a sanitizer runtime is missing.
"""
from __future__ import annotations

import argparse
import os
import platform
import shutil
import sys

if not __package__:  # python tests/cudacpu: make the package importable by its name
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from cudacpu import SCHEDULES, CudaCpuError, normalize_sanitize, sanitizer_environment  # noqa: E402


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python tests/cudacpu", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sanitize", default="", metavar="LIST",
                   help="address,undefined | undefined | thread (CUDACPU_SANITIZE, runtime preloaded)")
    p.add_argument("--schedule", choices=list(SCHEDULES), help="CUDACPU_SCHEDULE: thread order between barriers")
    p.add_argument("--seed", type=int, help="CUDACPU_SEED: seed of the random schedule")
    p.add_argument("--lenient", action="store_true",
                   help="CUDACPU_LENIENT=1: a returned thread counts as arrived at __syncthreads")
    p.add_argument("--print-env", action="store_true", help="print the variables set, then run the command if any")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")
    return p


def _tsan_aslr_prefix() -> list[str]:
    """GCC 12's ThreadSanitizer predates the high ASLR entropy of recent kernels (vm.mmap_rnd_bits > 28 breaks its
    memory layout: "FATAL: ThreadSanitizer: unexpected memory mapping"): run the command without ASLR there."""
    try:
        with open("/proc/sys/vm/mmap_rnd_bits") as fh:
            bits = int(fh.read())
    except (OSError, ValueError):
        return []
    setarch = shutil.which("setarch")
    return [setarch, platform.machine(), "-R"] if bits > 28 and setarch else []


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    try:
        sanitize = normalize_sanitize(args.sanitize)
        env = sanitizer_environment(sanitize) if sanitize else dict(os.environ)
    except CudaCpuError as exc:
        print(f"cudacpu: {exc}", file=sys.stderr)
        return 2
    if not sanitize:
        env.pop("CUDACPU_SANITIZE", None)
    if args.schedule:
        env["CUDACPU_SCHEDULE"] = args.schedule
    if args.seed is not None:
        env["CUDACPU_SEED"] = str(args.seed)
    if args.lenient:
        env["CUDACPU_LENIENT"] = "1"
    if args.print_env:
        for k in ("CUDACPU_SANITIZE", "CUDACPU_SCHEDULE", "CUDACPU_SEED", "CUDACPU_LENIENT", "LD_PRELOAD",
                  "ASAN_OPTIONS", "UBSAN_OPTIONS", "TSAN_OPTIONS"):
            if k in env and env.get(k) != os.environ.get(k):
                print(f"{k}={env[k]}")
        if not command:
            return 0
    if not command:
        print("cudacpu: no command given (python tests/cudacpu [options] -- COMMAND ...)", file=sys.stderr)
        return 2
    if "thread" in sanitize:
        command = _tsan_aslr_prefix() + command
    sys.stdout.flush()
    try:
        os.execvpe(command[0], command, env)
    except OSError as exc:
        print(f"cudacpu: cannot run {command[0]!r}: {exc}", file=sys.stderr)
        return 127


if __name__ == "__main__":
    sys.exit(main())
