"""A description's `implementation = "pkg.module"` imports (runs) that module: only for a description
the user named on the command line or keeps in $OPSCOPE_HOME/backends/ -- never one a plan file or a
shared run names. The vendor module here writes a canary file when it is imported."""
import sys

import pytest

from opscope.runtime.backends import resolve
from opscope.runtime.errors import UsageError

VENDOR = '''
import os
open(os.environ["CANARY"], "a").write("imported\\n")
from opscope.runtime.backends import numpy_backend
def create(desc):
    return numpy_backend.create(desc, name=desc.name)
'''
CHIP = '[backend]\nname = "acme"\nimplementation = "acme_vendor.chip"\n'


@pytest.fixture
def vendor(tmp_path, monkeypatch):
    pkg = tmp_path / "site" / "acme_vendor"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "chip.py").write_text(VENDOR)
    canary = tmp_path / "canary"
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setenv("CANARY", str(canary))
    env = {"PYTHONPATH": str(tmp_path / "site"), "CANARY": str(canary)}
    chip = tmp_path / "shared" / "acme.toml"
    chip.parent.mkdir()
    chip.write_text(CHIP)
    yield chip, canary, env
    for name in ("acme_vendor.chip", "acme_vendor"):   # the next test imports it afresh (or not at all)
        sys.modules.pop(name, None)


@pytest.mark.multiprocess
def test_a_description_named_on_the_command_line_imports_its_module_but_a_plan_naming_it_does_not(
        vendor, tmp_path, cli):
    chip, canary, env = vendor
    plan = tmp_path / "acme.opsplan"
    r = cli("compile", "demo:mlp", "-b", chip, "-o", plan, env=env)
    assert r.returncode == 0, r.stderr
    assert canary.read_text() == "imported\n"            # the user named it: their module ran
    canary.unlink()
    r = cli("run", "demo:mlp", "--plan", plan, env=env)   # the plan names the file, the user did not
    assert r.returncode == 2, r.stderr
    line = r.stderr.strip()
    assert "\n" not in line and "Traceback" not in line
    # plan_file refuses a plan's description file itself now; either refusal leaves the module unimported
    assert "is not imported" in line or "a plan does not choose a description" in line
    assert not canary.exists()


def test_a_description_in_opscope_home_imports_its_module(vendor, opscope_home):
    chip, canary, _ = vendor
    (opscope_home / "backends").mkdir()
    (opscope_home / "backends" / "acme.toml").write_text(CHIP)
    b = resolve("sim:acme")                  # however the spec arrived: the file is the user's own
    assert b.name == "acme" and canary.read_text() == "imported\n"


def test_a_spec_from_elsewhere_is_refused_before_anything_is_imported(vendor):
    chip, canary, _ = vendor
    with pytest.raises(UsageError, match="is not imported"):
        resolve(str(chip))                   # not on this process's command line, not in the home folder
    with pytest.raises(UsageError, match="is not imported"):
        resolve(str(chip), trusted=False)    # what a reader of a plan or a run says
    assert not canary.exists()
    assert resolve(str(chip), trusted=True).name == "acme"   # the user's own script vouches for it
    assert canary.exists()


def test_a_trusted_description_passes_its_trust_to_its_fallbacks_and_an_untrusted_one_does_not(vendor, tmp_path):
    chip, canary, _ = vendor
    outer = tmp_path / "outer.toml"
    outer.write_text(f'[backend]\nname = "outer"\nimplementation = "numpy"\nfallback = "{chip}"\n')
    with pytest.raises(UsageError, match="is not imported"):
        resolve(str(outer), trusted=False)
    assert not canary.exists()
    assert resolve(str(outer), trusted=True).fallback.name == "acme"
