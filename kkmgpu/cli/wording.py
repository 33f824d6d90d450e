"""The command line's wording, shared by ``kkmgpu fit`` and the demo."""

import os

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
