"""pyproject.toml lists opscope's packages by hand (its four folders are mapped into the `opscope` namespace, which
setuptools' find cannot do); a folder left off the list installs nowhere, and only an installed copy -- the image,
a wheel -- finds out (the container's `profile` died on `No module named 'opscope.runtime.autoplace'`)."""
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_code_folder_with_an_init_is_a_listed_package():
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(tool["packages"])
    found = set()
    for package, folder in tool["package-dir"].items():
        for init in (ROOT / folder).rglob("__init__.py"):
            if "node_modules" not in init.parts and "__pycache__" not in init.parts:
                rel = init.parent.relative_to(ROOT / folder)
                found.add(".".join((package, *rel.parts)))
    assert found - listed == set(), "add these to [tool.setuptools] packages in pyproject.toml"
