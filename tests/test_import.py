"""``import kkmgpu`` is quiet, cheap, and leaves CuPy and numba alone."""

import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

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


def _package_modules() -> dict:
    """{dotted module name: path} for every module of the package, subpackages included."""
    modules = {}
    for path in sorted((REPO_ROOT / "kkmgpu").rglob("*.py")):
        parts = path.relative_to(REPO_ROOT).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def test_cupy_is_imported_in_one_module_only():
    """Only kkmgpu/backend/cupy_loader.py imports cupy or cupyx (statements or importlib), so CPU users never pay
    for it."""
    import ast

    offenders = []
    for name, path in _package_modules().items():
        if name == "kkmgpu.backend.cupy_loader":
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
            offenders += [f"{name}:{node.lineno} {imported}" for imported in names if imported.split(".")[0] in
                          ("cupy", "cupyx", "cupy (computed name)")]
    assert offenders == []


def _package_imports():
    """{module: kkmgpu modules it imports}, from every import statement in the package (function-level ones too),
    by dotted name. ``from kkmgpu.engine import lloyd`` imports the module ``kkmgpu.engine.lloyd``;
    ``from kkmgpu import fit`` imports the package's ``__init__`` (``kkmgpu``)."""
    import ast

    modules = _package_modules()
    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                    source = f"{base}.{node.module}" if node.module else base
                else:
                    source = node.module or ""
                if not source.startswith("kkmgpu"):
                    continue
                for alias in node.names:
                    edges.add(f"{source}.{alias.name}" if f"{source}.{alias.name}" in modules else source)
            elif isinstance(node, ast.Import):
                edges.update(a.name for a in node.names if a.name.startswith("kkmgpu"))
        graph[name] = {e for e in edges if e in modules and e != name}
    return graph


def test_no_import_circles_inside_the_package():
    """No module of kkmgpu imports, directly or through others, a module that imports it back (deferred
    imports inside functions count: they only hide a circle)."""
    graph = _package_imports()
    assert graph["kkmgpu._api"] >= {"kkmgpu.methods.exact", "kkmgpu._gamma_search"}  # the parse sees them
    assert "kkmgpu.bandwidth" in graph["kkmgpu._gamma_search"]
    assert "kkmgpu.kernels.kernel_kmeans_cpu" in graph["kkmgpu.backend.device"]
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


#: modules allowed past MAX_MODULE_LINES, each with its reason
LONG_MODULES = {
    "kkmgpu.engine.sampled": "CATS's one loop (sampling, Eq. 2's coefficients, assignment, stop) reads best whole",
}
MAX_MODULE_LINES = 500


def test_modules_stay_small():
    """No module of the package is over about 500 lines without a reason recorded above (issue 15)."""
    long = {name: len(path.read_text().splitlines()) for name, path in _package_modules().items()}
    long = {name: lines for name, lines in long.items() if lines > MAX_MODULE_LINES and name not in LONG_MODULES}
    assert long == {}


def test_every_subpackage_is_installed():
    """pyproject.toml lists every subpackage of kkmgpu: a package missing there is left out of the wheel and
    fails at import on an installed copy (the editable install would not show it)."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    listed = set(tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    on_disk = {".".join(p.parent.relative_to(REPO_ROOT).parts) for p in (REPO_ROOT / "kkmgpu").rglob("__init__.py")}
    assert on_disk <= listed


def test_methods_are_registered_with_their_own_parameters():
    """fit, the estimator and the CLI read one registry: every method's own parameters are keywords of fit and of
    KernelKMeans, no parameter has two owners, and the CLI offers exactly the registered methods."""
    import inspect

    from kkmgpu.cli import commands as cli

    from kkmgpu.methods import registry as _methods
    from kkmgpu.estimator import METHOD_PARAMS

    assert list(_methods.METHODS) == ["exact", "cats", "eigen", "trimmed", "approx"]
    assert METHOD_PARAMS == _methods.method_params()
    fit_keywords = set(inspect.signature(kkmgpu.fit).parameters)
    estimator_keywords = set(inspect.signature(kkmgpu.KernelKMeans).parameters)
    owned = _methods.all_params()
    assert len(owned) == len(set(owned))
    assert set(owned) <= fit_keywords and set(owned) <= estimator_keywords
    fit_parser = cli._build_parser()._subparsers._group_actions[0].choices["fit"]
    method_action = next(a for a in fit_parser._actions if "--method" in a.option_strings)
    assert tuple(method_action.choices) == (*_methods.METHODS, "landmark")   # landmark: objective='ncut' only


def test_a_registered_method_is_reached_through_fit(monkeypatch):
    """A new method is a check, a runner and its registration: fit validates what all share, then hands over."""
    import dataclasses

    from kkmgpu.methods import registry as _methods

    calls = []

    def check(method, ctx, values):
        return {"engine": "dense", "tf32": False} if method == "twice-exact" else None

    def run(ctx, params):
        calls.append((ctx.n, ctx.k, params))
        return dataclasses.replace(_methods.METHODS["exact"].run(ctx, params), method="twice-exact")

    monkeypatch.setitem(_methods.METHODS, "twice-exact", _methods.Method("twice-exact", "a test method", (), check, run,
                                                                         _methods.METHODS["exact"].predict))
    X, _ = kkmgpu.datasets.make_two_circles(120, random_state=0)
    result = kkmgpu.fit(X, 2, gamma=5.0, method="twice-exact", device="cpu", random_state=0)
    reference = kkmgpu.fit(X, 2, gamma=5.0, device="cpu", random_state=0)
    assert calls == [(120, 2, {"engine": "dense", "tf32": False})] and result.method == "twice-exact"
    np.testing.assert_array_equal(result.labels, reference.labels)
    np.testing.assert_array_equal(kkmgpu.predict(result, X[:30]), reference.labels[:30])  # its predict too
    with pytest.raises(ValueError, match=r"method='nope' is not available; use one of \['exact', 'cats'"):
        kkmgpu.fit(X, 2, method="nope", device="cpu")


HEAVY_DEPENDENCIES = ("numba", "scipy", "sklearn", "dask", "cupy", "cupyx")


def test_import_loads_no_heavy_dependency():
    """``import kkmgpu`` loads none of numba, SciPy, scikit-learn, dask or CuPy (issue 27 point 7): the public
    names resolve on first use (PEP 562), so the import itself stays cheap."""
    proc = run_python(
        "import sys, kkmgpu\n"
        f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY_DEPENDENCIES!r})))"
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_lazy_names_resolve_to_their_definitions():
    """Every name of ``kkmgpu.__all__`` resolves in a fresh interpreter, by attribute and by ``from kkmgpu import``,
    to the object its defining module holds; ``dir`` lists them; an unknown name is still an AttributeError."""
    proc = run_python(
        "import importlib, inspect, kkmgpu\n"
        "from kkmgpu import fit, KernelKMeans, metrics, datasets\n"
        "assert fit is kkmgpu.fit and KernelKMeans is kkmgpu.KernelKMeans\n"
        "assert inspect.ismodule(metrics) and metrics is importlib.import_module('kkmgpu.metrics')\n"
        "assert datasets is importlib.import_module('kkmgpu.datasets')\n"
        "assert set(kkmgpu.__all__) <= set(dir(kkmgpu))\n"
        "for name in kkmgpu.__all__:\n"
        "    value = getattr(kkmgpu, name)\n"
        "    home = getattr(value, '__module__', None)\n"
        "    if home is not None and not inspect.ismodule(value):\n"
        "        assert getattr(importlib.import_module(home), value.__name__) is value, name\n"
        "ns = {}\n"
        "exec('from kkmgpu import *', ns)\n"
        "assert set(kkmgpu.__all__) <= set(ns), set(kkmgpu.__all__) - set(ns)\n"
        "try:\n"
        "    kkmgpu.no_such_name\n"
        "except AttributeError as error:\n"
        "    assert 'no_such_name' in str(error)\n"
        "else:\n"
        "    raise AssertionError('kkmgpu.no_such_name resolved')\n"
        "print('ok')"
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"
