"""One backend registry (runtime/registry.py): the built-ins are entry points like a vendor's package, their
declarations are checked, and no list of backend names exists anywhere else in the code (AST over every module
of runtime, profiler, debugger and app): the profiler, plans, the OpInfo worker and the CLI ask the registry."""
import ast
from pathlib import Path

import pytest

from opscope.runtime import registry

ROOT = Path(__file__).resolve().parent.parent
REGISTRY_FILES = {ROOT / "runtime" / "registry.py", ROOT / "runtime" / "builtin_backends.py"}
# python packages that share a backend's name (numpy, torch): versions and library lists, not backends
PACKAGES = {"python", "opscope", "torchvision", "transformers"}


def test_the_builtins_register_by_entry_point_and_declare_what_they_are():
    entries = registry.entries()
    assert {"numpy", "torch", "sim", "onnxruntime", "openvino", "xla"} <= set(entries)
    for name in ("numpy", "torch", "sim", "onnxruntime", "openvino", "xla"):
        e = entries[name]
        assert e.builtin and not e.problem and e.kind in registry.KINDS and e.clock in registry.CLOCKS, e
    assert set(registry.names("regions")) >= {"onnxruntime", "openvino", "xla"}
    assert entries["numpy"].own_kernels and not entries["onnxruntime"].own_kernels


@pytest.mark.parametrize("schema, why", [
    ([], "expected a table"),
    ({"x": {"type": "integer", "help": "h"}}, "type is 'integer'"),
    ({"x": {"type": int}}, "help is missing"),
    ({"x": {"type": int, "help": "h", "default": "one"}}, "default 'one'"),
    ({"x": {"type": str, "help": "h", "choices": ["a"], "default": "b"}}, "default 'b'"),
    ({"x": {"type": str, "help": "h", "min": 1}}, "expected a table with keys"),
])
def test_a_bad_option_schema_says_what_is_wrong(schema, why):
    with pytest.raises(ValueError, match=why.replace("(", r"\(")):
        registry.check_schema(schema)


def _names_in_lists(path: Path, names: set) -> list[str]:
    """Tuples, lists, sets and dict keys of string constants holding two or more backend names (`torch:cpu`
    counts as torch): a hand-kept list of backends."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        items = node.keys if isinstance(node, ast.Dict) else node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) \
            else []
        named = {i.value.split(":")[0] for i in items if isinstance(i, ast.Constant) and isinstance(i.value, str)}
        if len(named & names) >= 2 and not named & PACKAGES:
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {sorted(named & names)}")
    return found


def test_no_list_of_backend_names_outside_the_registry():
    names = set(registry.names())
    found = [hit for folder in ("runtime", "profiler", "debugger", "app") for p in sorted((ROOT / folder).rglob("*.py"))
             if p not in REGISTRY_FILES for hit in _names_in_lists(p, names)]
    assert found == [], "lists of backend names (derive them from runtime/registry.py):\n" + "\n".join(found)


def test_the_check_finds_a_list_it_is_shown(tmp_path):
    bad = tmp_path / "stats.py"
    bad.write_text('STACKS = ("onnxruntime", "openvino", "xla")\nX = {"numpy": 1, "torch:cpu": 2}\nok = ("numpy",)\n')
    global ROOT
    root, ROOT = ROOT, tmp_path
    try:
        assert len(_names_in_lists(bad, set(registry.names()))) == 2
    finally:
        ROOT = root
