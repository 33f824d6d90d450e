"""The README and docs/*.md: every ```python block runs as written, on its own; the quick-start commands are the
ones CI runs; links between the pages resolve; no page points into the developers' shared folder.

A block runs in a fresh namespace, in a temporary working directory, with matplotlib on its Agg backend. A block
that imports a package missing here is skipped with that package's name; a block after the line
``<!-- docs-test: gpu -->`` is a ``cuda`` case: it runs on a GPU or on the emulated one (KKMGPU_EMULATE_GPU=1)
and is skipped with the reason otherwise.
"""

import ast
import importlib.util
import re
import shlex
from pathlib import Path

import pytest

from conftest import cuda_skip_reason

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
GPU_MARKER = "<!-- docs-test: gpu -->"
FENCE = re.compile(r"^```(\w*)\s*$")

#: what pip installs for a module a block imports, for the skip reason
EXTRA_OF = {"sklearn": "scikit-learn", "dask": "dask[array]", "distributed": "distributed",
            "dask_cuda": "dask-cuda", "cupy": "cupy-cuda12x", "matplotlib": "matplotlib", "mlxtend": "mlxtend"}

DEMO_COMMAND = 'pip install ".[demo]" && kkmgpu demo'
TEST_COMMAND = 'pip install ".[test]" && python -m pytest'


def code_blocks(path, language):
    """(first line number, text, preceding marker line) of every fenced block of the given language in a page."""
    blocks, lines = [], path.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if match and match.group(1):
            start, body = i, []
            i += 1
            while i < len(lines) and not lines[i].startswith("```"):
                body.append(lines[i])
                i += 1
            previous = next((lines[j].strip() for j in range(start - 1, -1, -1) if lines[j].strip()), "")
            if match.group(1) == language:
                blocks.append((start + 1, "\n".join(body) + "\n", previous))
        i += 1
    return blocks


def imported_modules(code):
    """Top-level names of the modules a block imports."""
    names = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def python_block_params():
    params = []
    for path in PAGES:
        for line, code, previous in code_blocks(path, "python"):
            name = f"{path.relative_to(ROOT)}:{line}"
            missing = sorted(m for m in imported_modules(code) if importlib.util.find_spec(m) is None)
            marks = []
            if missing:
                packages = ", ".join(EXTRA_OF.get(m, m) for m in missing)
                marks.append(pytest.mark.skip(reason=f"{name} needs the optional package(s) {packages}"))
            elif previous == GPU_MARKER:
                marks.append(pytest.mark.gpu)
            params.append(pytest.param(code, previous == GPU_MARKER, id=name, marks=marks))
    return params


@pytest.mark.parametrize(("code", "needs_gpu"), python_block_params())
def test_python_block_runs(code, needs_gpu, tmp_path, monkeypatch):
    if needs_gpu:
        reason = cuda_skip_reason()
        if reason is not None:
            pytest.skip(reason)
    monkeypatch.chdir(tmp_path)  # a block that writes files writes them here
    plt = None
    if importlib.util.find_spec("matplotlib") is not None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    try:
        exec(compile(code, "<docs block>", "exec"), {"__name__": "__main__"})
    finally:
        if plt is not None:
            plt.close("all")


def test_every_page_has_been_read():
    assert (ROOT / "README.md") in PAGES and len(PAGES) > 10
    assert sum(len(code_blocks(p, "python")) for p in PAGES) >= 15


def test_readme_is_a_front_page():
    assert len((ROOT / "README.md").read_text(encoding="utf-8").splitlines()) <= 210


def test_quick_start_commands_are_the_ones_ci_runs():
    bash = [code.strip() for _, code, _ in code_blocks(ROOT / "README.md", "bash")]
    assert DEMO_COMMAND in bash and TEST_COMMAND in bash
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert TEST_COMMAND in ci  # .ci/run: readme_tests() { pip install ".[test]" && python -m pytest; }
    # the demo command parses (and its output folder option exists)
    from kkmgpu.cli.commands import _build_parser

    args = _build_parser().parse_args(shlex.split(DEMO_COMMAND.split("&&")[1])[1:])
    assert args.command == "demo"


def test_relative_links_resolve():
    broken = []
    for path in PAGES:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", path.read_text(encoding="utf-8")):
            if "://" not in target and not (path.parent / target).exists():
                broken.append(f"{path.relative_to(ROOT)} -> {target}")
    assert broken == []


def test_no_page_points_into_the_shared_folder():
    offending = [f"{p.relative_to(ROOT)}:{n}" for p in PAGES
                 for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if "../shared" in line]
    assert offending == []


def test_every_registered_method_is_documented():
    """The methods fit offers come from one registry (kkmgpu.methods.registry); each is named in fit's docstring, in the
    user guide and in the README, so a new method cannot land undocumented."""
    import kkmgpu
    from kkmgpu.methods import registry as _methods

    doc_line = next(line for line in kkmgpu.fit.__doc__.splitlines() if line.strip().startswith("method :"))
    guide = (ROOT / "docs" / "exact.md").read_text()
    readme = (ROOT / "README.md").read_text()
    assert len(_methods.METHODS) >= 4
    for name in _methods.METHODS:
        assert f'"{name}"' in doc_line, (name, doc_line)
        assert f'method="{name}"' in guide or f"method='{name}'" in guide, name
        assert f'"{name}"' in readme, name
