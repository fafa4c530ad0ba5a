"""pyproject.toml lists every package, so a regular (non-editable) wheel carries all the code."""

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_package_directory_is_listed():
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    package_dirs = setuptools["package-dir"]
    found = set()
    for name, folder in package_dirs.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            relative = init.parent.relative_to(ROOT / folder)
            found.add(".".join((name, *relative.parts)))
    assert sorted(found - set(setuptools["packages"])) == [], "add these to [tool.setuptools] packages"
