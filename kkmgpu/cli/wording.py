"""The command line's wording, shared by ``kkmgpu fit`` and the demo: numbers, device notes, and library messages
and warnings rewritten in the command line's own syntax."""

import contextlib
import os
import re
import sys
import warnings

import numpy as np

import kkmgpu


def format_number(value):
    """A number as the command line prints it: floats to 6 significant digits."""
    return f"{value:.6g}" if isinstance(value, (float, np.floating)) else str(value)


def device_note(requested, used):
    """Why the computation ran where it did, when that is not simply what was asked for."""
    if used != "cpu" or requested == "cpu":
        return ""
    if os.environ.get("KKMGPU_DEVICE", "").strip().lower() == "cpu":
        return " (KKMGPU_DEVICE=cpu forces the CPU)"
    reason = kkmgpu.cuda_unavailable_reason()
    return f" (fell back to the CPU: {reason})" if reason else " (fell back to the CPU)"


#: ``kkmgpu.fit``'s parameters and the ``kkmgpu fit`` options that set them, for messages written in Python syntax
FLAGS = {
    "n_clusters": "-k", "kernel": "--kernel", "gamma": "--gamma", "degree": "--degree", "coef0": "--coef0",
    "device": "--device", "dtype": "--dtype", "gemm_precision": "--gemm-precision", "init": "--init",
    "n_init": "--n-init", "max_iter": "--max-iter", "tol": "--tol", "random_state": "--seed", "method": "--method",
    "engine": "--engine", "sample_weight": "--sample-weight", "n_components": "--n-components",
    "n_landmarks": "--n-landmarks", "landmarks": "--landmarks", "objective": "--objective",
    "affinity": "--affinity", "n_neighbors": "--n-neighbors", "n_samples_per_cluster": "--samples-per-cluster",
}

# name=value with the value quoted, or a bare number or word; not part of a longer name or an attribute (a.name=)
_ASSIGNMENT = re.compile(r"(?<![\w.])(" + "|".join(sorted(FLAGS, key=len, reverse=True)) +
                         r")=(?:'([^']*)'|\"([^\"]*)\"|([\w.+-]*\w))")


# a parameter named alone; only names with an underscore, which are Python identifiers, never English words
_IDENTIFIER = re.compile(r"(?<![\w.=-])(" + "|".join(sorted((n for n in FLAGS if "_" in n), key=len, reverse=True))
                         + r")(?![\w=])")


def cli_text(message):
    """A library message in the command line's words: ``device='cpu'`` becomes ``--device cpu``.

    Only the parameters that ``kkmgpu fit`` has an option for are rewritten (:data:`FLAGS`): ``name=value``
    everywhere, and a name alone where it has an underscore (``sample_weight``, never the word "kernel"); any
    other name is left as the library wrote it.

    >>> cli_text("device='cuda' was requested but no GPU is usable. Use device='cpu'.")
    '--device cuda was requested but no GPU is usable. Use --device cpu.'
    >>> cli_text("n_init=5 ignored; increase max_iter (tf32=True)")
    '--n-init 5 ignored; increase --max-iter (tf32=True)'
    """
    def flag(match):
        value = next(group for group in match.groups()[1:] if group is not None)
        return f"{FLAGS[match.group(1)]} {value}"

    text = _ASSIGNMENT.sub(flag, str(message))
    return _IDENTIFIER.sub(lambda match: FLAGS[match.group(1)], text)


def format_warning(message, category=UserWarning):
    """One short line for a warning shown by the command line: ``kkmgpu: warning: <message>``."""
    return f"kkmgpu: warning: {' '.join(cli_text(message).split())}"


@contextlib.contextmanager
def short_warnings(stream=None):
    """Show the warnings raised inside the block as :func:`format_warning` lines (on stderr by default), each
    text once, instead of Python's ``file:line: Category: message`` and the source line."""
    shown = set()

    def show(message, category, filename, lineno, file=None, line=None):
        text = format_warning(message, category)
        if text not in shown:
            shown.add(text)
            print(text, file=stream if stream is not None else sys.stderr, flush=True)

    with warnings.catch_warnings():
        warnings.simplefilter("always")  # deduplicated above by text, whatever line raised it
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        warnings.filterwarnings("ignore", category=PendingDeprecationWarning)
        warnings.showwarning = show
        yield
