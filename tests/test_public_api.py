"""The public API, name by name and signature by signature, against the snapshot in ``tests/public_api.json``.

A restructure (issue 15: modules moved into subpackages, methods registered instead of branched) must leave every
public name importable from where it was, with the same signature; a deliberate API change updates the snapshot in
the same commit:

    python tests/test_public_api.py --update

Public means: ``kkmgpu.__all__`` and the ``__all__`` of each public module below, plus, for a class, its public
methods and properties (their signatures) and its base classes, and, for a dataclass, its fields.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import json
import re
import sys
from pathlib import Path

import pytest

SNAPSHOT = Path(__file__).with_name("public_api.json")
MODULES = ("kkmgpu", "kkmgpu.metrics", "kkmgpu.datasets", "kkmgpu.bandwidth", "kkmgpu.trimming", "kkmgpu.dask",
           "kkmgpu.compare", "kkmgpu.estimator", "kkmgpu.cli", "kkmgpu.demo")
_ADDRESS = re.compile(r" at 0x[0-9a-f]+")


def _signature(obj) -> str:
    try:
        return _ADDRESS.sub("", str(inspect.signature(obj)))
    except (TypeError, ValueError):  # a builtin without a signature
        return "(?)"


def _describe(obj) -> dict:
    if inspect.ismodule(obj):
        return {"kind": "module", "name": obj.__name__}
    if inspect.isclass(obj):
        entry = {"kind": "class", "bases": [f"{b.__module__}.{b.__qualname__}" for b in obj.__bases__]}
        if dataclasses.is_dataclass(obj):  # results: their public fields (the private state may move freely)
            entry["fields"] = [f.name for f in dataclasses.fields(obj) if not f.name.startswith("_")]
        else:
            entry["signature"] = _signature(obj)
        members = {}
        for name, value in sorted(vars(obj).items()):
            if name.startswith("_") and name != "__call__":
                continue
            if isinstance(value, property):
                members[name] = "property"
            elif isinstance(value, (staticmethod, classmethod)):
                members[name] = f"{type(value).__name__} {_signature(value.__func__)}"
            elif inspect.isfunction(value):
                members[name] = _signature(value)
        entry["members"] = members
        return entry
    if callable(obj):
        return {"kind": "function", "signature": _signature(obj)}
    return {"kind": type(obj).__name__}


def current_api() -> dict:
    api = {}
    for module_name in MODULES:
        module = importlib.import_module(module_name)
        api[module_name] = {name: _describe(getattr(module, name)) for name in sorted(module.__all__)}
    return api


def test_public_api_matches_the_snapshot():
    expected = json.loads(SNAPSHOT.read_text())
    got = current_api()
    problems = []
    for module_name in sorted(set(expected) | set(got)):
        want, have = expected.get(module_name, {}), got.get(module_name, {})
        for name in sorted(set(want) - set(have)):
            problems.append(f"{module_name}.{name}: removed")
        for name in sorted(set(have) - set(want)):
            problems.append(f"{module_name}.{name}: added (not in the snapshot)")
        for name in sorted(set(want) & set(have)):
            if want[name] != have[name]:
                problems.append(f"{module_name}.{name}: was {want[name]}, is {have[name]}")
    assert not problems, ("the public API changed (run `python tests/test_public_api.py --update` if on purpose):\n"
                          + "\n".join(problems))


def test_the_snapshot_covers_every_public_module_and_top_level_name():
    snapshot = json.loads(SNAPSHOT.read_text())
    assert set(snapshot) == set(MODULES)
    import kkmgpu

    assert set(snapshot["kkmgpu"]) == set(kkmgpu.__all__)
    assert snapshot["kkmgpu"]["fit"]["kind"] == "function" and "device=" in snapshot["kkmgpu"]["fit"]["signature"]


if __name__ == "__main__":
    if sys.argv[1:] != ["--update"]:
        sys.exit(f"usage: python {sys.argv[0]} --update   (rewrites {SNAPSHOT.name} from the installed kkmgpu)")
    SNAPSHOT.write_text(json.dumps(current_api(), indent=1, sort_keys=True) + "\n")
    print(f"wrote {SNAPSHOT}")
else:
    pytest.importorskip("dask", reason="kkmgpu.dask's public names need dask (the test extra installs it)")
