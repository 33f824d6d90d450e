"""Compile the CUDA modules with NVRTC the way CuPy's RawModule does at run time, on a machine without a GPU.

nvcc (the other CI check) builds each ``.cu`` file as a whole; at run time CuPy hands the same source to NVRTC
with kkmgpu's options and asks for the template instantiations by name (``name_expressions``). This script does
exactly that through NVRTC's C API (ctypes; NVRTC from the ``nvidia-cuda-nvrtc`` wheel, no GPU needed), for every
module and every architecture we expect to meet, and checks that each name expression has a lowered (mangled)
name, so a template the launcher asks for but the source does not define fails here instead of on a lent GPU.

    python .ci/nvrtc_check.py            # exit 0: every module compiled and every name resolved
"""

from __future__ import annotations

import ctypes
import glob
import os
import site
import sys

from kkmgpu.kernels import kernel_kmeans_cuda as _gpu_kernels

from kkmgpu.kernels import knn_cuda as _knn_gpu
from kkmgpu.kernels import sparse_cuda as _sparse_gpu
from kkmgpu.kernels import tiled_cuda as _tiled_gpu

MODULES = {
    "kernel_kmeans.cu": _gpu_kernels.name_expressions(),
    "tiled.cu": _tiled_gpu.name_expressions(),
    "knn.cu": _knn_gpu.name_expressions(),
    "sparse.cu": _sparse_gpu.name_expressions(),
}
ARCHITECTURES = ("compute_80", "compute_90")  # A100; H100 / H200


def load_nvrtc() -> ctypes.CDLL:
    roots = site.getsitepackages() + [site.getusersitepackages()]
    candidates = [path for root in roots for path in glob.glob(os.path.join(root, "nvidia", "*", "lib", "libnvrtc.so*"))
                  if ".alt." not in path and "builtins" not in path]
    candidates += ["libnvrtc.so"]
    for path in candidates:
        try:
            # NVRTC dlopens its builtins library by name: load the one beside it first, globally
            for builtins in glob.glob(os.path.join(os.path.dirname(path), "libnvrtc-builtins.so*")):
                if ".alt." not in builtins:
                    ctypes.CDLL(builtins, mode=ctypes.RTLD_GLOBAL)
            return ctypes.CDLL(path)
        except OSError:
            continue
    raise SystemExit("NVRTC not found: pip install nvidia-cuda-nvrtc")


def check(nvrtc: ctypes.CDLL, name: str, source: str, expressions: list[str], arch: str) -> list[str]:
    """Problems found compiling ``source`` for ``arch`` (empty when it compiled and every name resolved)."""
    nvrtc.nvrtcGetErrorString.restype = ctypes.c_char_p
    program = ctypes.c_void_p()

    def call(function, *args):
        status = function(*args)
        if status != 0:
            raise RuntimeError(f"{function.__name__}: {nvrtc.nvrtcGetErrorString(status).decode()}")

    call(nvrtc.nvrtcCreateProgram, ctypes.byref(program), source.encode(), name.encode(), 0, None, None)
    try:
        for expression in expressions:
            call(nvrtc.nvrtcAddNameExpression, program, expression.encode())
        options = [*_gpu_kernels.NVRTC_OPTIONS, f"--gpu-architecture={arch}"]
        array = (ctypes.c_char_p * len(options))(*[o.encode() for o in options])
        status = nvrtc.nvrtcCompileProgram(program, len(options), array)
        size = ctypes.c_size_t()
        call(nvrtc.nvrtcGetProgramLogSize, program, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        call(nvrtc.nvrtcGetProgramLog, program, log)
        if status != 0:
            return [f"compile failed ({nvrtc.nvrtcGetErrorString(status).decode()}):\n{log.value.decode()}"]
        problems = []
        for expression in expressions:
            lowered = ctypes.c_char_p()
            if nvrtc.nvrtcGetLoweredName(program, expression.encode(), ctypes.byref(lowered)) != 0:
                problems.append(f"no lowered name for {expression!r}")
        ptx = ctypes.c_size_t()
        call(nvrtc.nvrtcGetPTXSize, program, ctypes.byref(ptx))
        print(f"NVRTC built {name} for {arch}: {len(expressions)} kernels, {ptx.value} bytes of PTX"
              + (f"; log: {log.value.decode().strip()}" if log.value.strip() else ""))
        return problems
    finally:
        nvrtc.nvrtcDestroyProgram(ctypes.byref(program))


def main() -> int:
    nvrtc = load_nvrtc()
    major, minor = ctypes.c_int(), ctypes.c_int()
    nvrtc.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
    print(f"NVRTC {major.value}.{minor.value}, options {' '.join(_gpu_kernels.NVRTC_OPTIONS)}")
    failures = []
    for name, expressions in MODULES.items():
        source = _gpu_kernels.cuda_source(name)
        for arch in ARCHITECTURES:
            failures += [f"{name} ({arch}): {problem}" for problem in check(nvrtc, name, source, expressions, arch)]
    for failure in failures:
        print(failure, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
