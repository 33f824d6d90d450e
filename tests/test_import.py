"""``import kkmgpu`` is quiet, cheap, and leaves CuPy and numba alone."""

import subprocess
import sys
import time
from pathlib import Path

import kkmgpu

REPO_ROOT = Path(__file__).resolve().parents[1]

PUBLIC_NAMES = [
    "fit", "predict", "kernel_matrix", "KernelKMeans", "KernelKMeansResult", "metrics",
    "ConvergenceWarning", "DeviceUnavailableError", "InsufficientMemoryError",
]


def run_python(code):
    return subprocess.run(
        [sys.executable, "-W", "error", "-c", code],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=60,
    )


def test_import_prints_nothing():
    proc = run_python("import kkmgpu")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == ""
    assert proc.stderr == ""


def test_import_does_not_load_cupy_or_numba():
    proc = run_python(
        "import sys, kkmgpu\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('cupy', 'cupyx', 'numba')))"
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_import_is_fast():
    # A loose sanity bound (interpreter start included), not a benchmark.
    start = time.perf_counter()
    proc = run_python("import kkmgpu")
    assert proc.returncode == 0, proc.stderr
    assert time.perf_counter() - start < 5.0


def test_public_names():
    missing = [name for name in PUBLIC_NAMES if not hasattr(kkmgpu, name)]
    assert not missing
    assert set(PUBLIC_NAMES) - {"metrics"} <= set(kkmgpu.__all__)
    assert issubclass(kkmgpu.ConvergenceWarning, Warning)
    assert issubclass(kkmgpu.DeviceUnavailableError, RuntimeError)
    assert issubclass(kkmgpu.InsufficientMemoryError, MemoryError)
    assert isinstance(kkmgpu.__version__, str)


def test_cupy_is_imported_in_one_module_only():
    """Only kkmgpu/_cupy.py imports cupy or cupyx (statements or importlib), so CPU users never pay for it."""
    import ast

    offenders = []
    for path in sorted((REPO_ROOT / "kkmgpu").glob("*.py")):
        if path.name == "_cupy.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            elif (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None))
                  in ("import_module", "__import__") and node.args):
                arg = node.args[0]
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    names = [arg.value]
                elif "cupy" in ast.unparse(arg):  # e.g. f"{cupyx.__name__}.scipy.sparse"
                    names = ["cupy (computed name)"]
            offenders += [f"{path.name}:{node.lineno} {name}" for name in names if name.split(".")[0] in
                          ("cupy", "cupyx", "cupy (computed name)")]
    assert offenders == []


def _package_imports():
    """{module: kkmgpu modules it imports}, from every import statement in kkmgpu/*.py (function-level ones too)."""
    import ast

    modules = {p.stem: p for p in (REPO_ROOT / "kkmgpu").glob("*.py")}
    graph = {}
    for name, path in modules.items():
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                edges.update([node.module.split(".")[0]] if node.module else [a.name for a in node.names])
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("kkmgpu."):
                edges.add(node.module.split(".")[1])
            elif isinstance(node, ast.Import):
                edges.update(a.name.split(".")[1] for a in node.names if a.name.startswith("kkmgpu."))
        graph[name] = {e for e in edges if e in modules and e != name}
    return graph


def test_no_import_circles_inside_the_package():
    """No module of kkmgpu imports, directly or through others, a module that imports it back (deferred
    imports inside functions count: they only hide a circle)."""
    graph = _package_imports()
    assert graph["_api"] >= {"_lloyd", "bandwidth"} and "_cpu_kernels" in graph["_backend"]  # the parse sees them
    circles = []
    for start in sorted(graph):
        path, seen = [start], set()
        stack = [(start, iter(sorted(graph[start])))]
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                stack.pop()
                path.pop()
                continue
            if child == start:
                circles.append(" -> ".join(path + [start]))
            elif child not in seen and child not in path:
                seen.add(child)
                path.append(child)
                stack.append((child, iter(sorted(graph[child]))))
    assert circles == [], "import circles:\n" + "\n".join(sorted(set(circles)))
