"""A plan someone sends you can compute the ops it names and nothing else (issue 24): every attack is built
from a real `opscope compile` output edited as an attacker would (plan.sha256 recomputed), and each is
refused with exit 2 and one line, imports nothing, loads nothing and stays within a memory bound."""
from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import threading
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from opscope.runtime import models
from opscope.runtime.errors import UsageError
from opscope.runtime.passes.plan_file import compile_to_file, load_plan, open_plan_session, read_plan

RSS_BOUND = 1 << 30           # a refused plan costs what starting opscope costs (~300 MB), never its claims
CANARY = 'import os\nopen(os.environ["CANARY_OUT"], "w").write("imported")\n'
CONSTRUCTOR = r'''
#include <stdio.h>
#include <stdlib.h>
__attribute__((constructor)) static void ran(void) {
    const char *p = getenv("CANARY_OUT");
    FILE *f = p ? fopen(p, "w") : NULL;
    if (f) { fputs("loaded", f); fclose(f); }
}
'''


@pytest.fixture(scope="module")
def gpt_plan(tmp_path_factory):
    """What `opscope compile demo:gpt -b numpy -o gpt.opsplan` writes."""
    path = tmp_path_factory.mktemp("plans") / "gpt.opsplan"
    compile_to_file(path, "demo:gpt", "numpy")
    return path


@pytest.fixture(scope="module")
def canary(tmp_path_factory):
    """A folder for PYTHONPATH holding package evil_canary, which writes CANARY_OUT when imported."""
    folder = tmp_path_factory.mktemp("canary")
    (folder / "evil_canary").mkdir()
    (folder / "evil_canary" / "__init__.py").write_text(CANARY)
    (folder / "evil_canary" / "chip.py").write_text("def create(description):\n    raise SystemExit(3)\n")
    return folder


def members_of(path: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(path) as z:
        return {i.filename: z.read(i) for i in z.infolist()}


def forge(src: Path, dst: Path, edit=None, *, replace=None, prefix: bytes = b"") -> Path:
    """What an attacker does: edit plan.json, recompute plan.sha256, write the archive (after `prefix`)."""
    members = members_of(src)
    doc = json.loads(members["plan.json"])
    if edit:
        edit(doc)
    body = json.dumps(doc).encode()
    members.update({"plan.json": body, "plan.sha256": hashlib.sha256(body).hexdigest().encode()}, **(replace or {}))
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in members.items():
            z.writestr(name, data)
    dst.write_bytes(prefix + buf.getvalue())
    return dst


def kernel_attack(target, arg):
    """Node 0 calls `target(arg)`; on torch:cpu (which calls node targets) so that, unfixed, it really runs."""
    from opscope.runtime.backends import resolve
    digest = resolve("torch:cpu").description.digest

    def edit(doc):
        doc["backend"] = {"spec": "torch:cpu", "name": "torch:cpu", "digest": digest}
        doc["placement"] = [[n, "torch:cpu"] for n, _ in doc["placement"]]
        node = doc["graph"]["nodes"][0]
        node["target"], node["args"] = target, {"$tuple": [arg]}
    return edit


# The child's peak RSS, measured from a small launcher. Linux counts the memory a child had before exec in
# its ru_maxrss, and a child vforked straight from pytest has pytest's memory then (2 GiB in a CI worker that
# had loaded onnxruntime/openvino/jax for other tests, while the refusing child itself peaked near 300 MB).
# The launcher (a bare python, ~10 MB) forks the real child, so its number is the child's own.
_LAUNCH = (
    "import os, sys\n"
    "pid = os.fork()\n"
    "if pid == 0:\n"
    "    os.execv(sys.executable, [sys.executable] + sys.argv[2:])\n"
    "_, status, usage = os.wait4(pid, 0)\n"
    "open(sys.argv[1], 'w').write(str(usage.ru_maxrss * 1024))\n"
    "sys.exit(os.waitstatus_to_exitcode(status) & 0xFF)\n"
)


def run_plan(plan, canary_dir: Path, out: Path, timeout=240) -> tuple[int, str, int]:
    """`opscope run demo:gpt --plan PLAN` in a child: (exit code, stderr, the child's peak RSS in bytes)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(canary_dir), os.environ.get("PYTHONPATH", "")]),
           "CANARY_OUT": str(out)}
    rss_file = out.with_suffix(".rss")
    with open(out.with_suffix(".err"), "w+") as err:
        p = subprocess.Popen([sys.executable, "-c", _LAUNCH, str(rss_file),
                              "-m", "opscope.app", "run", "demo:gpt", "--plan", str(plan)],
                             stdout=subprocess.DEVNULL, stderr=err, stdin=subprocess.DEVNULL, env=env,
                             start_new_session=True)
        # a hang fails the test instead of stalling the run (the whole group: launcher and child)
        timer = threading.Timer(timeout, lambda: os.killpg(p.pid, signal.SIGKILL))
        timer.start()
        try:
            code = p.wait()
        finally:
            timer.cancel()
        err.seek(0)
        rss = int(rss_file.read_text()) if rss_file.exists() else 0
        return code, err.read(), rss


def _cc(tmp: Path) -> Path | None:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None
    (tmp / "ctor.c").write_text(CONSTRUCTOR)
    so = tmp / "ctor.so"
    r = subprocess.run([cc, "-shared", "-fPIC", "-o", so, tmp / "ctor.c"], capture_output=True, timeout=60)
    return so if r.returncode == 0 else None


def _inflating(gpt_plan: Path) -> bytes:
    """constants/N.npy replaced by a member that inflates to 1 GiB of zeros (about 1 MB in the archive)."""
    raw = io.BytesIO()
    with zipfile.ZipFile(raw, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in members_of(gpt_plan).items():
            if not name.startswith("constants/"):
                z.writestr(name, data)
        name = next(n for n in members_of(gpt_plan) if n.startswith("constants/"))
        with z.open(name, "w", force_zip64=True) as f:
            head = io.BytesIO()
            np.lib.format.write_array_header_2_0(head, {"descr": "<f4", "fortran_order": False, "shape": (1 << 28,)})
            f.write(head.getvalue())
            chunk = bytes(16 << 20)
            for _ in range(64):
                f.write(chunk)
    return raw.getvalue()


def _attacks(gpt_plan: Path, tmp: Path) -> dict[str, Path]:
    a = {
        "attribute path to torch.ops.import_module":
            forge(gpt_plan, tmp / "import.opsplan", kernel_attack("import_module::__call__.__call__", "evil_canary")),
        "a huge slot count (2e27)":
            forge(gpt_plan, tmp / "slots.opsplan", lambda d: d["graph"].update(num_slots=2e27)),
    }
    bomb = tmp / "bomb.opsplan"
    bomb.write_bytes(_inflating(gpt_plan))
    a["a member that inflates to 1 GiB"] = bomb
    so = _cc(tmp)
    if so is not None:              # an ELF shared library in front of the zip, and load_library on the plan itself
        poly = tmp / "poly.opsplan"
        forge(gpt_plan, poly, kernel_attack("load_library::__call__.__call__", str(poly)), prefix=so.read_bytes())
        a["a polyglot ELF+zip that loads itself"] = poly
    fifo = tmp / "fifo.opsplan"
    os.mkfifo(fifo)
    a["a FIFO"] = fifo
    (tmp / "zero.opsplan").symlink_to("/dev/zero")
    a["a symlink to /dev/zero"] = tmp / "zero.opsplan"
    folder = tmp / "unpacked"
    folder.mkdir()
    with zipfile.ZipFile(gpt_plan) as z:
        z.extractall(folder)
    for npy in (folder / "constants").iterdir():
        npy.unlink()
        npy.symlink_to("/dev/zero")
    a["an unpacked plan folder with a member linked to /dev/zero"] = folder
    return a


@pytest.mark.multiprocess
@pytest.mark.timeout(600)
def test_hostile_plans_are_refused_from_the_cli_in_one_line_importing_nothing(gpt_plan, canary, tmp_path):
    attacks = _attacks(gpt_plan, tmp_path)
    outs = {what: tmp_path / f"canary{i}.out" for i, what in enumerate(attacks)}
    with ThreadPoolExecutor(3) as pool:            # each child is mostly start-up (torch, the model)
        done = dict(zip(attacks, pool.map(lambda w: run_plan(attacks[w], canary, outs[w]), attacks)))
    for what, (code, err, rss) in done.items():
        assert code == 2, f"{what}: exit {code}: {err[-600:]}"
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, f"{what}: {err[-600:]}"
        assert not outs[what].exists(), f"{what}: the plan ran code ({outs[what].read_text()})"
        assert rss < RSS_BOUND, f"{what}: the child's peak RSS was {rss >> 20} MiB"
    says = {w: e for w, (_, e, _) in done.items()}
    assert "import_module" in says["attribute path to torch.ops.import_module"] and \
        "node 'embedding'" in says["attribute path to torch.ops.import_module"]
    assert "byte 0" in says.get("a polyglot ELF+zip that loads itself", "byte 0")
    assert "is a FIFO" in says["a FIFO"] and "is a device" in says["a symlink to /dev/zero"]
    assert "is a folder" in says["an unpacked plan folder with a member linked to /dev/zero"]
    assert "bound" in says["a member that inflates to 1 GiB"]


@pytest.mark.parametrize("target", [
    "import_module::__call__.__call__",              # torch.ops.import_module: imports any module
    "load_library::__call__.__call__",               # torch.ops.load_library: loads a shared library
    "aten::__class__.__init__",                      # an attribute of a real namespace
    "aten::from_file.default",                       # a real ATen op, but not one opscope knows (it reads files)
    "aten::sub.Tensor",                              # a known op, but not the node's (embedding)
    "aten::embedding.__call__",                      # a known op's attribute, not an overload
    "opscope::fused.default",                        # opscope's internal ops are not kernels
    "torch.ops.aten.embedding.default",              # a Python path
    {"$nhwc": "import_module::__call__.__call__"},
    ["aten::embedding.default"],
    7,
])
def test_a_node_naming_anything_but_an_opscope_op_is_refused_naming_the_node(gpt_plan, canary, tmp_path,
                                                                              monkeypatch, target):
    monkeypatch.syspath_prepend(str(canary))
    monkeypatch.setenv("CANARY_OUT", str(tmp_path / "canary.out"))
    bad = forge(gpt_plan, tmp_path / "bad.opsplan", kernel_attack(target, "evil_canary"))
    model, inputs = models.load("demo:gpt")
    with pytest.raises(UsageError, match=r"node 'embedding'.*(not an op opscope knows|nhwc_args)") as e:
        load_plan(bad, model=model, inputs=inputs)
    assert "\n" not in str(e.value) and not (tmp_path / "canary.out").exists() and "evil_canary" not in sys.modules


def test_the_real_plan_still_loads_and_names_only_table_ops(gpt_plan):
    doc, _ = read_plan(gpt_plan)
    targets = {n["target"] for n in doc["graph"]["nodes"]}
    assert "aten::linear.default" in targets and all(t == "$fused" or t.startswith("aten::") for t in targets)
    model, inputs = models.load("demo:gpt")
    assert load_plan(gpt_plan, model=model, inputs=inputs).executor.run(*inputs)


@pytest.mark.parametrize("count", [2**31 - 1, 10**6, -1, True, "12"])
def test_a_slot_count_the_plan_does_not_declare_is_refused_before_allocating(gpt_plan, tmp_path, count):
    """The executor holds num_slots values: 2**31 - 1 of them is 16 GiB of pointers."""
    bad = forge(gpt_plan, tmp_path / "slots.opsplan", lambda d: d["graph"].update(num_slots=count))
    model, inputs = models.load("demo:gpt")
    with pytest.raises(UsageError, match="num_slots .* is not the .* slots or fewer it declares"):
        load_plan(bad, model=model, inputs=inputs)


@pytest.fixture(scope="module")
def gpt_unoptimized(tmp_path_factory):
    """demo:gpt compiled without passes: its position arange stays a node (folding makes it a constant)."""
    path = tmp_path_factory.mktemp("plans") / "gpt-none.opsplan"
    compile_to_file(path, "demo:gpt", "numpy", passes="none")
    return path


def _arange(doc):
    return next(n for n in doc["graph"]["nodes"] if n["op"] == "arange")


@pytest.mark.parametrize("edit,why", [
    (lambda n: n.update(args={"$tuple": [10**11]}), "would create something other than the int64\\[128\\]"),
    (lambda n: n.update(args={"$tuple": [10**11]}, output_meta=[[[10**11], "int64"]]), "more than this machine"),
    (lambda n: n.update(args={"$tuple": ["x"]}), "would create something other than"),
])
def test_a_creation_op_sized_by_its_arguments_must_make_what_the_plan_declares(gpt_unoptimized, tmp_path, edit, why):
    """arange(10**11) would allocate 800 GB however small the output the plan declares."""
    bad = forge(gpt_unoptimized, tmp_path / "arange.opsplan", lambda d: edit(_arange(d)))
    model, inputs = models.load("demo:gpt")
    with pytest.raises(UsageError, match=f"node arange \\(arange\\) .*{why}"):
        load_plan(bad, model=model, inputs=inputs)
    assert load_plan(gpt_unoptimized, model=model, inputs=inputs).executor.run(*inputs)


def test_a_zip_member_stored_as_a_symlink_is_refused(gpt_plan, tmp_path):
    members = members_of(gpt_plan)
    bad = tmp_path / "link.opsplan"
    with zipfile.ZipFile(bad, "w") as z:
        for name, data in members.items():
            info = zipfile.ZipInfo(name)
            if name.startswith("constants/"):
                info.external_attr = (stat.S_IFLNK | 0o777) << 16
                data = b"/dev/zero"
            z.writestr(info, data)
    with pytest.raises(UsageError, match="not a regular file"):
        read_plan(bad)


@pytest.mark.parametrize("name,why", [("../../etc/passwd", "not part of a plan"),
                                      ("constants/56.npy.pickle", "not part of a plan"),
                                      ("constants/9.npy", "does not name")])
def test_members_outside_the_format_are_refused(gpt_plan, tmp_path, name, why):
    bad = forge(gpt_plan, tmp_path / "extra.opsplan", replace={name: b"x"})
    with pytest.raises(UsageError, match=why):
        read_plan(bad)


def test_a_constant_whose_header_differs_from_its_declared_slot_is_refused(gpt_plan, tmp_path):
    name = next(n for n in members_of(gpt_plan) if n.startswith("constants/"))
    buf = io.BytesIO()
    np.save(buf, np.zeros((16, 16), np.float64))
    bad = forge(gpt_plan, tmp_path / "shape.opsplan", replace={name: buf.getvalue()})
    model, inputs = models.load("demo:gpt")
    with pytest.raises(UsageError, match=r"float64\[16, 16\], not the float32"):
        load_plan(bad, model=model, inputs=inputs)


def test_a_member_claiming_a_ratio_no_deflate_reaches_is_refused_unread(gpt_plan, tmp_path):
    data = bytearray(gpt_plan.read_bytes())
    at = data.find(b"PK\x01\x02")            # the first central-directory entry: plan.json, written first
    assert data[at + 46: at + 55] == b"plan.json"
    data[at + 24: at + 28] = (200 << 20).to_bytes(4, "little")      # its size: 200 MiB from ~15 KB
    bad = tmp_path / "ratio.opsplan"
    bad.write_bytes(bytes(data))
    with pytest.raises(UsageError, match="more than any real compression gives"):
        read_plan(bad)


# --- a plan never picks a description file or a module ------------------------------------------
def _vendor_description(folder: Path, name: str) -> Path:
    path = folder / f"{name}.toml"
    path.write_text(f'[backend]\nname = "{name}"\nimplementation = "evil_canary.chip"\nfallback = "numpy"\n')
    return path


def test_a_plan_naming_a_description_file_is_refused_until_the_user_passes_it(tmp_path, canary, monkeypatch):
    """compiled with -b chip.toml: running it without -b is refused with a line saying to pass -b."""
    chip = tmp_path / "chip.toml"
    chip.write_text((Path(__file__).parent.parent / "runtime/descriptions/npu-a1.toml").read_text()
                    .replace('name = "npu-a1"', 'name = "chip"'))
    plan = tmp_path / "mlp.opsplan"
    compile_to_file(plan, "demo:mlp", str(chip), passes="none")
    with pytest.raises(UsageError, match=r"does not choose a description file .*by itself: pass -b .*chip.toml"):
        open_plan_session(plan, "demo:mlp")
    assert open_plan_session(plan, "demo:mlp", str(chip)).run_host()      # the user chose it: it runs
    # an attacker's edit: a description file whose implementation is a module on the path
    monkeypatch.syspath_prepend(str(canary))
    monkeypatch.setenv("CANARY_OUT", str(tmp_path / "canary.out"))
    evil = _vendor_description(tmp_path, "evil")
    bad = forge(plan, tmp_path / "evil.opsplan", lambda d: d["backend"].update(spec=str(evil), name="evil"))
    with pytest.raises(UsageError, match="pass -b"):
        open_plan_session(bad, "demo:mlp")
    assert not (tmp_path / "canary.out").exists() and "evil_canary" not in sys.modules


def test_a_plan_naming_a_sim_description_that_imports_a_module_is_refused(tmp_path, canary, monkeypatch,
                                                                          opscope_home):
    monkeypatch.syspath_prepend(str(canary))
    monkeypatch.setenv("CANARY_OUT", str(tmp_path / "canary.out"))
    (opscope_home / "backends").mkdir(exist_ok=True)
    _vendor_description(opscope_home / "backends", "vendor")
    plan = tmp_path / "mlp.opsplan"
    compile_to_file(plan, "demo:mlp", "numpy", passes="none")
    bad = forge(plan, tmp_path / "vendor.opsplan", lambda d: d["backend"].update(spec="sim:vendor", name="vendor"))
    with pytest.raises(UsageError, match=r"imports module evil_canary.chip.*pass -b sim:vendor"):
        open_plan_session(bad, "demo:mlp")
    assert not (tmp_path / "canary.out").exists() and "evil_canary" not in sys.modules
