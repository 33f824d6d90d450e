"""What a new user meets on a fresh install (issue 27 point 7): the README's list of extras."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _extras():
    """The optional-dependency groups that pyproject.toml declares."""
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    section = text.split("[project.optional-dependencies]", 1)[1].split("\n[", 1)[0]
    return re.findall(r"^([A-Za-z0-9_-]+)\s*=", section, re.MULTILINE)


def test_readme_lists_every_extra():
    extras = _extras()
    assert {"progress", "plot", "test"} <= set(extras)
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    listing = " ".join(readme.split("Extras:", 1)[1].split("\n\n", 1)[0].split())
    missing = [name for name in extras if f"`{name}`" not in listing]
    assert not missing, f"README's extras list lacks {missing}"
