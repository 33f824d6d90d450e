"""CUDA on the CPU, for tests: build CUDA C++ kernel source with the system C++ compiler and launch it from Python.

The real ``kernels_cuda/*.cu`` compile unmodified: ``cuda_cpu.h`` maps the CUDA keywords, indices, barriers, warp
intrinsics, atomics and intrinsics to C++, and this module builds the source plus the template instantiations
(the same name expressions CuPy's ``RawModule`` gets) into a shared library (``g++``), loads it with ctypes and
launches kernels, checking every argument against the kernel's parameter list::

    mod = Module(code, name_expressions=("segment_sums<float>",), options=("-std=c++14",))   # like cupy.RawModule
    mod.get_function("segment_sums<float>")(grid, block, args, shared_mem=0)

Model
-----
The blocks of a launch run one after another (x fastest, then y, then z) on the calling OS thread. The threads of a
block are user-level fibers, switched only at ``__syncthreads`` (``_count``/``_and``/``_or``) and at the warp
intrinsics (``__shfl*_sync``, ``__ballot_sync``, ``__any_sync``, ``__all_sync``, ``__syncwarp``); between those
points a thread runs alone, in an order set by the schedule. ``__shared__`` and ``extern __shared__`` memory
belongs to the block (filled with 0xff bytes, i.e. NaN or -1, before each block); bytes of ``extern __shared__``
past the launch's ``shared_mem`` are poisoned under AddressSanitizer. Device-side errors raise
:class:`CudaCpuError` naming block, thread and source line: a ``__syncthreads`` that part of the block never
reaches (a thread returned, or waits at another one), a deadlock, a warp intrinsic whose mask excludes the caller
or reads an absent lane, ``assert``, ``__trap``. The source is compiled as NVRTC compiles it for CuPy
(``__CUDACC_RTC__``, ``__CUDA_ARCH__`` 900). Not a GPU: no speed, occupancy or memory-model claims, libm rather
than CUDA's math, no FMA contraction (tests keep tolerances), atomics in program order.

Under ThreadSanitizer every block runs on an OS thread of its own and every CUDA thread of the grid has a tsan
context of its own for the whole launch, so that nothing but the kernel's atomics orders two blocks: a launch
may have at most 7936 threads in all (GCC 12's runtime holds 8128 contexts); larger ones are refused. Run the
real kernels under it on small problems (``tests/cuda_planted/drive.py real``), not whole test suites.

Arguments
---------
Pointer parameters take NumPy arrays, or objects whose ``_host`` attribute is one (the CuPy stand-in's device
arrays): C-contiguous, aligned, native byte order, writeable unless the pointee is const, and of the pointee's
exact dtype (``float16`` storage may reach an ``unsigned short*``: the bits). Scalar parameters take NumPy scalars
of the parameter's exact type (``np.int64`` for ``long long``, ``np.float64`` for ``double``, ...): CuPy would
pass any other as its own bytes, silently.

Environment
-----------
``CUDACPU_SANITIZE``
    ``address,undefined`` (AddressSanitizer + UndefinedBehaviorSanitizer: out-of-bounds, misalignment,
    overflow), ``undefined`` or ``thread`` (ThreadSanitizer: races within a block and between blocks; small
    grids: every block runs on an OS thread of its own). The process must have the runtime preloaded: use the
    runner below.
``CUDACPU_SCHEDULE``
    ``forward`` (default), ``reverse`` or ``random``: the order in which a block's threads run between barriers;
    a missing barrier changes results between them. The ``schedule=`` argument of a launch wins.
``CUDACPU_SEED``
    seed of the ``random`` schedule (default 0; the ``seed=`` argument of a launch wins).
``CUDACPU_LENIENT``
    ``1``: a thread that has returned counts as arrived at ``__syncthreads`` (what current GPUs tend to do; the
    CUDA programming guide leaves it undefined) instead of an error.
``CUDACPU_CACHE``
    where built libraries are kept (default ``$XDG_CACHE_HOME/cudacpu`` or ``~/.cache/cudacpu``), one folder per
    hash of the source, the launcher, the headers, the flags and the compiler; builds are atomic renames, so
    concurrent test processes are safe and a session pays each build once.
``CUDACPU_CXX``
    the C++ compiler (default ``g++``).
``CUDACPU_SOURCE_DIRS``
    extra folders (``os.pathsep``-separated) searched for the file a source text came from, so that reports
    name it (``kernels_cuda`` and ``tests/cuda_planted`` always are).

Runner
------
``python tests/cudacpu [--sanitize address,undefined|undefined|thread] [--schedule forward|reverse|random]
[--seed N] [--lenient] -- COMMAND ...`` (or ``PYTHONPATH=tests python -m cudacpu ...``) sets the variables above,
preloads the sanitizer runtime (``LD_PRELOAD`` of ``g++ -print-file-name=libasan.so`` / ``libtsan.so``), sets
``ASAN_OPTIONS`` / ``UBSAN_OPTIONS`` / ``TSAN_OPTIONS`` (halt on the first error with a nonzero exit status,
symbolised reports, no leak check) and execs the command, e.g.::

    KKMGPU_EMULATE_GPU=1 python tests/cudacpu --sanitize address,undefined -- python -m pytest tests/test_twins.py -k cuda
    KKMGPU_EMULATE_GPU=1 python tests/cudacpu --schedule random --seed 3 -- python -m pytest tests/test_tiled.py -k cuda
"""
from __future__ import annotations

import ctypes
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
import uuid
from collections import namedtuple
from pathlib import Path

import numpy as np

__all__ = ["Module", "Function", "Param", "CudaCpuError", "build", "cache_dir", "sanitizer_environment",
           "sanitizer_runtime", "normalize_sanitize", "SCHEDULES"]

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
HEADERS = ("cuda_cpu.h", "cuda_cpu_host.h")
SCHEDULES = {"forward": 0, "reverse": 1, "random": 2}
#: (parameter dtype, array dtype) pairs a kernel may legitimately read through the other type: same width, the bits
_REINTERPRET = {("uint16", "float16")}
DEFAULT_MAX_DYNAMIC_SHARED = 48 * 1024
#: the opt-in limit (H100 / H200: 227 KiB), as in the stand-in's device properties
MAX_DYNAMIC_SHARED = 227 * 1024
_SANITIZERS = ("address", "undefined", "thread")
#: where the source texts of the project live, so that a report names the .cu file a text came from
_SOURCE_DIRS = (ROOT / "kernels_cuda", HERE.parent / "cuda_planted")


class CudaCpuError(RuntimeError):
    """A kernel that cudacpu cannot build, a launch it refuses, or an error on the (emulated) device."""


Param = namedtuple("Param", "pointer const dtype cxx name")
Param.__doc__ = """A kernel parameter: pointer?, const pointee?, NumPy dtype name ("?" if none), C++ type, name."""


# ---- environment ---------------------------------------------------------------------------------------------------
def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no", "off")


def cache_dir() -> Path:
    """Where built libraries are kept (``CUDACPU_CACHE``, else the user's cache folder): read at every build."""
    if os.environ.get("CUDACPU_CACHE"):
        return Path(os.environ["CUDACPU_CACHE"])
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    try:
        (base / "cudacpu").mkdir(parents=True, exist_ok=True)
        return base / "cudacpu"
    except OSError:
        # never a folder shared between users: this process loads the libraries it finds there
        return Path(tempfile.gettempdir()) / f"cudacpu-{os.getuid()}"


def normalize_sanitize(value: str | None) -> str:
    """``"address,undefined"``-style text in a fixed order ("" for none); raises on unknown or clashing names."""
    names = {s.strip() for s in (value or "").replace("+", ",").split(",") if s.strip()}
    unknown = names - set(_SANITIZERS)
    if unknown:
        raise CudaCpuError(f"CUDACPU_SANITIZE={value!r}: unknown sanitizer(s) {sorted(unknown)}; use address, "
                           "undefined (together: address,undefined) or thread")
    if "thread" in names and "address" in names:
        raise CudaCpuError(f"CUDACPU_SANITIZE={value!r}: ThreadSanitizer and AddressSanitizer cannot share a "
                           "process; run them separately")
    return ",".join(s for s in _SANITIZERS if s in names)


def _cxx() -> str:
    return os.environ.get("CUDACPU_CXX", "g++")


def sanitizer_runtime(name: str) -> Path:
    """The shared runtime of a sanitizer (``"asan"``, ``"tsan"``) that the compiler links against; raises
    :class:`CudaCpuError` with what to install when the compiler has none."""
    cxx = _cxx()
    try:
        out = subprocess.run([cxx, f"-print-file-name=lib{name}.so"], capture_output=True, text=True,
                             env=_clean_env()).stdout.strip()
    except OSError as exc:
        raise CudaCpuError(f"the C++ compiler {cxx!r} could not be run: {exc}") from exc
    path = Path(out)
    if not path.is_absolute() or not path.exists():
        raise CudaCpuError(f"{cxx} has no lib{name}.so (-print-file-name=lib{name}.so gives {out!r}): the "
                           f"{'AddressSanitizer' if name == 'asan' else 'ThreadSanitizer'} runtime is missing; "
                           "install the compiler's sanitizer runtimes (Debian/Ubuntu, GCC 12: apt-get install "
                           "libgcc-12-dev libasan8 libtsan2 libubsan1)")
    return path


def sanitizer_environment(sanitize: str, base: dict | None = None) -> dict:
    """The environment a process needs to load ``sanitize`` builds: CUDACPU_SANITIZE, LD_PRELOAD of the runtime and
    the sanitizer options (halt on the first error with a nonzero exit status, symbolised reports, no leak check).
    Options already in ``base`` come after ours, so they win."""
    env = dict(os.environ if base is None else base)
    sanitize = normalize_sanitize(sanitize)
    env["CUDACPU_SANITIZE"] = sanitize
    names = set(sanitize.split(",")) - {""}

    def options(var, ours):
        env[var] = ":".join([ours, env[var]]) if env.get(var) else ours

    preload = []
    if "address" in names:
        preload.append(str(sanitizer_runtime("asan")))
        # allocator_may_return_null: NumPy's MemoryError tests ask for absurd sizes on purpose
        options("ASAN_OPTIONS", "detect_leaks=0:halt_on_error=1:abort_on_error=0:exitcode=1:symbolize=1:"
                                "allocator_may_return_null=1:detect_stack_use_after_return=0:print_summary=1")
    if "undefined" in names:
        options("UBSAN_OPTIONS", "halt_on_error=1:abort_on_error=0:exitcode=1:print_stacktrace=1:symbolize=1:"
                                 "report_error_type=1")
    if "thread" in names:
        preload.append(str(sanitizer_runtime("tsan")))
        # ignore_noninstrumented_modules: only the kernels are instrumented; NumPy's and Python's memcpy calls
        # through the interceptors are not what is under test. die_after_fork=0: pytest may spawn processes.
        options("TSAN_OPTIONS", "halt_on_error=1:abort_on_error=0:exitcode=66:symbolize=1:"
                                "ignore_noninstrumented_modules=1:report_signal_unsafe=0:die_after_fork=0")
    if preload:
        rest = [p for p in env.get("LD_PRELOAD", "").replace(":", " ").split() if p not in preload]
        env["LD_PRELOAD"] = " ".join(preload + rest)
    return env


def _clean_env() -> dict:
    """The environment for the compiler: no sanitizer runtime preloaded into g++ itself."""
    return {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}


# ---- source analysis -------------------------------------------------------------------------------------------------
def _strip_comments(code: str) -> str:
    """The source with comments blanked out (string literals kept), line structure intact."""
    def blank(m):
        s = m.group(0)
        return s if s[0] in "\"'" else re.sub(r"[^\n]", " ", s)
    return re.sub(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', blank, code, flags=re.S)


_EXTERN_SHARED = re.compile(
    r"extern\s+__shared__\s+(?:__align__\s*\(\s*(\d+)\s*\)\s+)?([A-Za-z_][\w:\s]*?)\s+"
    r"(?:__align__\s*\(\s*(\d+)\s*\)\s+)?(\w+)\s*\[\s*\]")


def _dynamic_shared(code: str) -> list[tuple[str, str, str]]:
    """The ``extern __shared__ T name[];`` declarations of the source: [(T, name, alignas text)], one per name."""
    out = {}
    for align1, typ, align2, name in _EXTERN_SHARED.findall(_strip_comments(code)):
        align = align1 or align2
        out.setdefault(name, (" ".join(typ.split()), name, f"alignas({align})" if align else "alignas(256)"))
    return list(out.values())


_GLOBAL = re.compile(r"__global__\s+void\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?(\w+)\s*\(")


def _split_top(text: str) -> list[str]:
    """Split at the commas outside (), <>, [] and {}."""
    parts, depth, cur = [], 0, []
    for ch in text:
        if ch in "(<[{":
            depth += 1
        elif ch in ")>]}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if "".join(cur).strip():
        parts.append("".join(cur))
    return parts


def kernel_signatures(code: str) -> dict[str, list[list[str]]]:
    """``__global__`` functions of the source: {name: [parameter texts of each definition]} (for messages and
    tests: a light parser, not a C++ one)."""
    src = _strip_comments(code)
    found: dict[str, list[list[str]]] = {}
    for m in _GLOBAL.finditer(src):
        depth, i = 1, m.end()
        while i < len(src) and depth:
            depth += {"(": 1, ")": -1}.get(src[i], 0)
            i += 1
        params = [" ".join(p.split()) for p in _split_top(src[m.end():i - 1])]
        if params == ["void"]:
            params = []
        found.setdefault(m.group(1), [])
        if params not in found[m.group(1)]:
            found[m.group(1)].append(params)
    return found


def _param_name(text: str) -> str | None:
    m = re.search(r"(\w+)\s*(?:\[\s*\d*\s*\])?\s*(?:=.*)?$", text)
    return m.group(1) if m else None


def _base_name(expression: str) -> str:
    return expression.split("<", 1)[0].strip().lstrip("&").split("::")[-1].strip()


def _extern_c_kernels(code: str) -> list[str]:
    """Kernels CuPy finds by their plain name (``extern "C"``), which need no name expression."""
    src = _strip_comments(code)
    return re.findall(r'extern\s+"C"\s+__global__\s+void\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?(\w+)\s*\(', src)


_ORIGINS: dict[str, Path] = {}
_ORIGINS_LOCK = threading.Lock()


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _find_origin(code: str) -> Path | None:
    """The .cu file (under kernels_cuda, tests/cuda_planted, CUDACPU_SOURCE_DIRS) whose text is ``code``."""
    key = _digest(code)
    with _ORIGINS_LOCK:
        if key not in _ORIGINS:  # (re)scan on a miss: a few small files
            dirs = list(_SOURCE_DIRS) + [Path(p) for p in os.environ.get("CUDACPU_SOURCE_DIRS", "").split(os.pathsep)
                                         if p]
            for d in dirs:
                for f in sorted(d.glob("*.cu")) + sorted(d.glob("*.cuh")) if d.is_dir() else []:
                    try:
                        _ORIGINS.setdefault(_digest(f.read_text()), f.resolve())
                    except OSError:
                        pass
        return _ORIGINS.get(key)


# ---- build -------------------------------------------------------------------------------------------------------------
_COMPILER_ID: dict[str, str] = {}


def _compiler_identity(cxx: str) -> str:
    """Path, size and mtime of the compiler binary: a new compiler is a new cache key (no subprocess)."""
    if cxx not in _COMPILER_ID:
        found = shutil.which(cxx)
        if found is None:
            raise CudaCpuError(f"the C++ compiler {cxx!r} (CUDACPU_CXX) is not on PATH; cudacpu builds CUDA source "
                               "for the CPU with it")
        real = os.path.realpath(found)
        st = os.stat(real)
        _COMPILER_ID[cxx] = f"{real}:{st.st_size}:{st.st_mtime_ns}"
    return _COMPILER_ID[cxx]


def _options(options) -> tuple[str, list[str]]:
    """(C++ standard, -I/-D flags) from NVRTC options; the others (architecture, fast math, ...) mean nothing here."""
    std, flags = "c++14", []
    for o in options:
        o = str(o)
        if o.startswith(("-std=", "--std=")):
            std = o.split("=", 1)[1]
        elif o.startswith(("-I", "-D")) and len(o) > 2:
            flags.append(o)
        elif o.startswith(("--include-path=", "--define-macro=")):
            flags.append(("-I" if o.startswith("--include") else "-D") + o.split("=", 1)[1])
    return std, flags


def _c_string(s: str) -> str:
    return json.dumps(s)  # a valid C string literal for the printable ASCII of name expressions


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}")
    tmp.write_text(text)
    os.replace(tmp, path)


def _compile(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """Runs the compiler (a seam for the tests: a cached build must not get here)."""
    return subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, env=_clean_env())


_HEADER_TEXT = {h: (HERE / h).read_text() for h in HEADERS}
_BUILD_LOCKS: dict[str, threading.Lock] = {}


def build(code: str, name_expressions=(), options=(), sanitize: str | None = None, *,
          source_path: str | os.PathLike | None = None) -> Path:
    """The shared library of ``code`` with the kernels ``name_expressions`` (plus every ``extern "C"`` kernel),
    built once per content hash (see ``CUDACPU_CACHE``). ``sanitize`` defaults to ``CUDACPU_SANITIZE``;
    ``source_path`` names the file in reports (found by content under the project's source folders otherwise)."""
    sanitize = normalize_sanitize(os.environ.get("CUDACPU_SANITIZE", "") if sanitize is None else sanitize)
    if isinstance(name_expressions, str):
        raise CudaCpuError("name_expressions must be a sequence of strings, not one string")
    exprs = [str(e) for e in name_expressions]
    for e in exprs:
        if not e.strip() or any(c in e for c in '"\\\n;{}'):
            raise CudaCpuError(f"name expression {e!r} is not a C++ template-id")
    origin = Path(source_path).resolve() if source_path is not None else _find_origin(code)
    std, user_flags = _options(options)
    cxx = _cxx()
    src_name = origin.name if origin is not None else "source.cu"
    if not src_name.endswith((".cu", ".cuh", ".h", ".cpp")):
        src_name += ".cu"

    launcher = [f"// built by tests/cudacpu from {origin if origin else 'a source text'}", '#include "cuda_cpu.h"']
    launcher += [f"CUDACPU_DYNAMIC_SHARED({t}, {name}, {align})" for t, name, align in _dynamic_shared(code)]
    launcher += [f'#include "{src_name}"', '#include "cuda_cpu_host.h"']
    launcher += [f"CUDACPU_KERNEL({_c_string(e)}, {e})" for e in dict.fromkeys([*exprs, *_extern_c_kernels(code)])]
    launcher = "\n".join(launcher) + "\n"
    flags = [f"-std={std}", "-O1", "-g", "-fPIC", "-shared", "-ffp-contract=off", "-fno-fast-math",
             "-fno-omit-frame-pointer", "-fvisibility=hidden", "-fno-gnu-unique", "-fno-extern-tls-init",
             "-Wno-attributes"]
    if origin is not None:
        flags.append(f"-I{origin.parent}")  # the source's own #include "..." resolve beside it
    flags += user_flags
    names = set(sanitize.split(",")) - {""}
    if "address" in names:
        flags += ["-fsanitize=address", "-fsanitize-address-use-after-scope"]
    if "undefined" in names:
        # halt at the first report, and float -> int conversions out of range (C++ UB; the device saturates)
        flags += ["-fsanitize=undefined,float-cast-overflow", "-fno-sanitize-recover=all"]
    if "thread" in names:
        flags += ["-fsanitize=thread"]
    # reports and debug info name the original file, at its own line numbers
    source_text = (f"#line 1 {_c_string(str(origin))}\n" if origin is not None else "") + code
    key = _digest("\0".join([*(_HEADER_TEXT[h] for h in HEADERS), launcher, source_text, *flags,
                             _compiler_identity(cxx)]))[:24]
    out_dir = cache_dir() / key
    lib = out_dir / "kernels.so"
    if lib.exists():
        return lib
    with _BUILD_LOCKS.setdefault(key, threading.Lock()):  # one build per key in this process; others: atomic rename
        if lib.exists():
            return lib
        out_dir.mkdir(parents=True, exist_ok=True)
        for h in HEADERS:
            _write_atomic(out_dir / h, _HEADER_TEXT[h])
        _write_atomic(out_dir / src_name, source_text)
        _write_atomic(out_dir / "launcher.cpp", launcher)
        tmp = out_dir / f".kernels.{os.getpid()}.{uuid.uuid4().hex[:8]}.so"
        # the headers are copied beside the launcher (hashed above): the build reads exactly what the key says
        cmd = [cxx, *flags, f"-I{out_dir}", "-o", str(tmp), "launcher.cpp", "-ldl", "-lpthread"]
        proc = _compile(cmd, out_dir)
        if proc.returncode:
            tmp.unlink(missing_ok=True)
            what = origin if origin is not None else out_dir / src_name
            raise CudaCpuError(f"{cxx} could not build {what} for the CPU (cudacpu; command: {' '.join(cmd)} in "
                               f"{out_dir}):\n{proc.stderr[-8000:]}")
        os.replace(tmp, lib)
    return lib


# ---- loading, launching ----------------------------------------------------------------------------------------------
_LIBS: dict[str, ctypes.CDLL] = {}
_LIBS_LOCK = threading.Lock()
_TSAN_POOL = None  # address of the first ThreadSanitizer module's pool of tsan contexts, shared with the others


def _runtime_loaded(symbol: str) -> bool:
    try:
        return hasattr(ctypes.CDLL(None), symbol)
    except OSError:
        return False


def _load(path: Path, sanitize: str) -> ctypes.CDLL:
    names = set(sanitize.split(",")) - {""}
    for name, symbol, lib in (("address", "__asan_init", "asan"), ("thread", "__tsan_init", "tsan")):
        if name in names and not _runtime_loaded(symbol):
            raise CudaCpuError(
                f"CUDACPU_SANITIZE={sanitize}: the {lib} runtime is not loaded in this process, and a {name}-"
                f"sanitized library cannot load without it. Run the command under the runner: python tests/cudacpu "
                f"--sanitize {sanitize} -- <command> (it sets LD_PRELOAD=lib{lib}.so and the options)")
    with _LIBS_LOCK:
        if str(path) not in _LIBS:
            lib = ctypes.CDLL(str(path))
            lib.cudacpu_kernel_name.restype = ctypes.c_char_p
            lib.cudacpu_kernel_params.restype = ctypes.c_char_p
            lib.cudacpu_tsan_pool.restype = ctypes.c_void_p
            lib.cudacpu_use_tsan_pool.argtypes = [ctypes.c_void_p]
            lib.cudacpu_launch.restype = ctypes.c_int
            lib.cudacpu_launch.argtypes = [
                ctypes.c_int, ctypes.POINTER(ctypes.c_uint), ctypes.POINTER(ctypes.c_uint), ctypes.c_ulonglong,
                ctypes.c_ulonglong, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, ctypes.c_int, ctypes.c_ulonglong,
                ctypes.c_int, ctypes.c_char_p, ctypes.c_ulonglong]
            if lib.cudacpu_sanitizers() & 2:  # ThreadSanitizer: one pool of contexts per process
                global _TSAN_POOL
                if _TSAN_POOL is None:
                    _TSAN_POOL = lib.cudacpu_tsan_pool()
                else:
                    lib.cudacpu_use_tsan_pool(_TSAN_POOL)
            _LIBS[str(path)] = lib
        return _LIBS[str(path)]


def _symbolize(lib: Path, text: str) -> str:
    """Replace the ``@0x<offset>@`` code addresses of a device-side message by file:line (addr2line)."""
    offsets = list(dict.fromkeys(re.findall(r"@(0x[0-9a-f]+)@", text)))
    if not offsets:
        return text
    where = {}
    tool = shutil.which("addr2line")
    if tool:
        try:
            out = subprocess.run([tool, "-e", str(lib), "-C", *offsets], capture_output=True, text=True,
                                 timeout=30, env=_clean_env()).stdout.splitlines()
            for off, line in zip(offsets, out):
                if not line.startswith("??"):
                    file, _, num = line.partition(":")
                    where[off] = f"{Path(file).name}:{num.split()[0] if num else '?'}"
        except (OSError, subprocess.TimeoutExpired):
            pass
    return re.sub(r"@(0x[0-9a-f]+)@", lambda m: where.get(m.group(1), f"{lib.name}+{m.group(1)}"), text)


class Module:
    """A CUDA source built for the CPU, like ``cupy.RawModule(code=..., options=..., name_expressions=...)``.

    Parameters
    ----------
    code : str
        CUDA C++ source.
    name_expressions : sequence of str
        The template instantiations to build, as CuPy gets them (``"segment_sums<float>"``); ``get_function``
        finds a kernel by the exact same string. ``extern "C"`` kernels are found by their plain name.
    options : sequence of str
        NVRTC options; ``-std=``, ``-I`` and ``-D`` are honoured, the others ignored.
    sanitize : str, optional
        ``"address,undefined"``, ``"undefined"``, ``"thread"`` or ``""``; default ``CUDACPU_SANITIZE``.
    source_path : path, optional
        The file the code comes from, named in reports (found by content when omitted).
    """

    def __init__(self, code: str, name_expressions=(), options=(), sanitize: str | None = None, *,
                 source_path=None):
        self.sanitize = normalize_sanitize(os.environ.get("CUDACPU_SANITIZE", "") if sanitize is None else sanitize)
        self.path = build(code, name_expressions, options, self.sanitize, source_path=source_path)
        self._lib = _load(self.path, self.sanitize)
        signatures = kernel_signatures(code)
        self.kernels: dict[str, tuple[Param, ...]] = {}
        self._index: dict[str, int] = {}
        for i in range(self._lib.cudacpu_kernel_count()):
            name = self._lib.cudacpu_kernel_name(i).decode()
            raw = self._lib.cudacpu_kernel_params(i).decode()
            fields = [p.split("|", 3) for p in raw.split(";")] if raw else []
            texts = next((s for s in signatures.get(_base_name(name), []) if len(s) == len(fields)), None)
            self.kernels[name] = tuple(
                Param(p == "1", c == "1", d, cxx, _param_name(texts[j]) if texts else None)
                for j, (p, c, d, cxx) in enumerate(fields))
            self._index.setdefault(name, i)
        self._attrs: dict[str, dict] = {name: {"max_dynamic_shared_size_bytes": DEFAULT_MAX_DYNAMIC_SHARED}
                                        for name in self.kernels}

    def get_function(self, name: str) -> "Function":
        """The kernel registered as ``name`` (exactly a name expression, or an ``extern "C"`` kernel's name)."""
        if name not in self._index:
            raise CudaCpuError(f"{name!r} is not a kernel of this module; it has {sorted(self._index)} (CuPy looks "
                               "a template up by the exact name-expression string)")
        return Function(self, name)

    def __repr__(self):
        return f"<cudacpu.Module {self.path} kernels={sorted(self.kernels)} sanitize={self.sanitize!r}>"


def _dims(value, what: str, name: str) -> tuple[int, int, int]:
    items = tuple(value) if isinstance(value, (tuple, list)) else (value,)
    if not 1 <= len(items) <= 3 or not all(isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))
                                           for v in items):
        raise CudaCpuError(f"{name}: {what} {value!r} must be an int or a tuple of 1 to 3 ints")
    dims = tuple(int(v) for v in items) + (1,) * (3 - len(items))
    if not all(1 <= v < 2 ** 32 for v in dims):
        raise CudaCpuError(f"{name}: {what} {value!r} has a dimension outside 1 .. 2^32-1")
    return dims


def _host_view(a):
    """The NumPy array behind an argument (a NumPy array, or a stand-in device array with ``_host``), else None."""
    if isinstance(a, np.ndarray):
        return a
    inner = getattr(a, "_host", None)
    return inner if isinstance(inner, np.ndarray) else None


class Function:
    """A kernel of a :class:`Module`: ``f(grid, block, args, shared_mem=0)`` like a CuPy ``Function``."""

    def __init__(self, module: Module, name: str):
        self.module, self.name = module, name
        self.params = module.kernels[name]
        self._index = module._index[name]

    # an attribute of the kernel in its module (CUDA's cuFuncSetAttribute): every Function of it sees it
    @property
    def max_dynamic_shared_size_bytes(self) -> int:
        return self.module._attrs[self.name]["max_dynamic_shared_size_bytes"]

    @max_dynamic_shared_size_bytes.setter
    def max_dynamic_shared_size_bytes(self, value):
        value = int(value)
        if not 0 <= value <= MAX_DYNAMIC_SHARED:
            raise CudaCpuError(f"{self.name}: max_dynamic_shared_size_bytes={value} is outside 0 .. "
                               f"{MAX_DYNAMIC_SHARED} (the device's opt-in limit) (cudaErrorInvalidValue)")
        self.module._attrs[self.name]["max_dynamic_shared_size_bytes"] = value

    def _describe(self, i: int) -> str:
        p = self.params[i]
        return f"argument {i} ({p.name + ': ' if p.name else ''}{p.cxx})"

    def _pack(self, args):
        if not isinstance(args, (tuple, list)):
            raise CudaCpuError(f"{self.name}: args must be a tuple, got {type(args).__name__}")
        if len(args) != len(self.params):
            raise CudaCpuError(f"{self.name} takes {len(self.params)} arguments "
                               f"({', '.join(p.cxx for p in self.params)}), got {len(args)}")
        argv = (ctypes.c_void_p * max(1, len(args)))()
        keep = []
        for i, (a, p) in enumerate(zip(args, self.params)):
            if p.pointer:
                arr = _host_view(a)
                if arr is None:
                    raise CudaCpuError(f"{self.name} {self._describe(i)} takes a device array, got "
                                       f"{type(a).__module__}.{type(a).__name__}")
                if p.dtype == "?":
                    raise CudaCpuError(f"{self.name} {self._describe(i)}: cudacpu passes arrays of NumPy types only")
                if p.dtype != "void" and arr.dtype.name != p.dtype and (p.dtype, arr.dtype.name) not in _REINTERPRET:
                    raise CudaCpuError(f"{self.name} {self._describe(i)} reads {p.dtype} elements; the array is "
                                       f"{arr.dtype.name}")
                if not arr.flags.c_contiguous:
                    raise CudaCpuError(f"{self.name} {self._describe(i)}: the array (shape {arr.shape}, strides "
                                       f"{arr.strides}) is not C-contiguous; a kernel gets a bare pointer")
                if not arr.dtype.isnative:
                    raise CudaCpuError(f"{self.name} {self._describe(i)}: the array's byte order is not native")
                if not arr.flags.aligned:
                    raise CudaCpuError(f"{self.name} {self._describe(i)}: the array's data is not aligned to its "
                                       f"{arr.dtype.alignment}-byte elements")
                if not p.const and not arr.flags.writeable:
                    raise CudaCpuError(f"{self.name} {self._describe(i)}: the array is read-only and the pointee is "
                                       "not const (the kernel may write it)")
                ptr = ctypes.c_void_p(arr.ctypes.data)
                keep.append((arr, ptr))
                argv[i] = ctypes.addressof(ptr)
            else:
                if not isinstance(a, np.generic):
                    raise CudaCpuError(f"{self.name} {self._describe(i)} takes numpy.{p.dtype}, got "
                                       f"{type(a).__name__} {a!r}: pass a NumPy scalar of the parameter's type "
                                       "(CuPy would pass another one's bytes as they are)")
                if p.dtype == "?" or a.dtype.name != p.dtype:
                    raise CudaCpuError(f"{self.name} {self._describe(i)} takes numpy.{p.dtype}, got "
                                       f"numpy.{a.dtype.name} ({a!r})")
                buf = np.array(a)
                keep.append(buf)
                argv[i] = buf.ctypes.data
        return argv, keep

    def __call__(self, grid, block, args, *, shared_mem: int = 0, stream=None, schedule: str | None = None,
                 seed: int | None = None):
        """Launch on ``grid`` x ``block`` with ``args`` (see the module docstring for the argument rules).

        ``schedule`` / ``seed`` override ``CUDACPU_SCHEDULE`` / ``CUDACPU_SEED``; ``stream`` is accepted and
        ignored (launches are synchronous). Raises :class:`CudaCpuError` for a refused launch or a device-side
        error."""
        g, b = _dims(grid, "grid", self.name), _dims(block, "block", self.name)
        shared_mem = int(shared_mem)
        if shared_mem < 0:
            raise CudaCpuError(f"{self.name}: shared_mem={shared_mem} is negative")
        sched = schedule or os.environ.get("CUDACPU_SCHEDULE", "").strip() or "forward"
        if sched not in SCHEDULES:
            raise CudaCpuError(f"schedule {sched!r} (CUDACPU_SCHEDULE or schedule=) is not one of {list(SCHEDULES)}")
        if seed is None:
            try:
                seed = int(os.environ.get("CUDACPU_SEED", "0") or 0)
            except ValueError:
                raise CudaCpuError(f"CUDACPU_SEED={os.environ['CUDACPU_SEED']!r} is not an integer") from None
        argv, keep = self._pack(args)
        err = ctypes.create_string_buffer(2048)
        rc = self.module._lib.cudacpu_launch(
            self._index, (ctypes.c_uint * 3)(*g), (ctypes.c_uint * 3)(*b), shared_mem,
            self.max_dynamic_shared_size_bytes, argv, len(self.params), SCHEDULES[sched], int(seed) % 2 ** 64,
            0 if _env_flag("CUDACPU_LENIENT") else 1, err, len(err))
        del keep
        if rc:
            what = "refused" if rc == 1 else f"failed (schedule {sched}{f', seed {seed}' if sched == 'random' else ''})"
            msg = _symbolize(self.module.path, err.value.decode(errors="replace"))
            raise CudaCpuError(f"{self.name}<<<{g}, {b}, {shared_mem}>>> {what}: {msg}")

    def __repr__(self):
        return f"<cudacpu.Function {self.name}({', '.join(p.cxx for p in self.params)})>"
