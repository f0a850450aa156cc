"""MkDocs hook: lets mkdocstrings find `opscope.runtime` and friends by reading source, not importing it.

The code folders are mapped into the `opscope` namespace by setuptools' package-dir (runtime/ is
opscope.runtime), which a source reader cannot follow; so the build gets a folder `build/api-src/opscope/`
whose entries link to the real folders, and mkdocs.yml points mkdocstrings at it (`paths`).
"""
from pathlib import Path

ROOT = Path(__file__).resolve().parent
PACKAGES = ("runtime", "profiler", "debugger", "app")


def _link_tree() -> None:
    namespace = ROOT / "build" / "api-src" / "opscope"
    namespace.mkdir(parents=True, exist_ok=True)
    for name in PACKAGES:
        link = namespace / name
        if not link.is_symlink():
            link.symlink_to(ROOT / name, target_is_directory=True)


_link_tree()            # at import: before mkdocstrings' handler reads its search paths
