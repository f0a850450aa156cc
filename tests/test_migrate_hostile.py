"""`opscope migrate scan` / `apply --write` on a tree someone handed you (issue 24): a tarball can hold links to
your files (`train.py.orig -> ~/.bash_aliases` made apply write train.py's text there, which the next shell
ran), a link to /dev/zero (read 5.4 GB in 15 s) and a FIFO (hung for ever). Nothing outside the tree is
touched, every odd entry is skipped with a line saying why (also in --json), and it finishes at once.
"""
import json
import os

import pytest

from opscope.app.migrate.files import Skip, read_source, write_source
from test_trace_import import opscope_main

CUDA = "import torch\nx = torch.zeros(2).cuda()\n"


@pytest.fixture
def hostile(tmp_path):
    """(tree, outside): a tree with a FIFO, links to /dev/zero and /dev/urandom, a link out of the tree, a
    FILE.orig link to a canary outside, a linked folder, a hard link to a file outside, and two honest files."""
    tree, outside = tmp_path / "tree", tmp_path / "outside"
    (tree / "pkg").mkdir(parents=True)
    outside.mkdir()
    (outside / "canary").write_text("canary\n")
    (outside / "victim.py").write_text(CUDA)
    (outside / "hard.py").write_text(CUDA)
    (outside / "deep").mkdir()
    (outside / "deep" / "far.py").write_text(CUDA)
    (tree / "train.py").write_text(CUDA)
    (tree / "train.py.orig").symlink_to(outside / "canary")       # the backup name, pointing outside
    (tree / "linked.py").symlink_to(outside / "victim.py")         # a source file that is a link out
    (tree / "inside.py").symlink_to(tree / "pkg" / "ok.py")        # a link inside the tree: not followed either
    (tree / "zero.py").symlink_to("/dev/zero")
    (tree / "pkg" / "rand.cu").symlink_to("/dev/urandom")
    (tree / "outdir").symlink_to(outside / "deep")
    os.mkfifo(tree / "fifo.py")
    os.link(outside / "hard.py", tree / "hard.py")                  # same file, two names
    (tree / "pkg" / "ok.py").write_text(CUDA)
    (tree / "pkg" / "new.py").write_text(CUDA)
    (tree / "pkg" / "new.py.orig").symlink_to(outside / "aliases")  # dangling: the issue's ~/.bash_aliases
    (tree / "pkg" / "big.py").write_text(CUDA + "#" * 4096 + "\n")
    return tree, outside


def _outside_state(outside):
    return {p.relative_to(outside).as_posix(): p.read_bytes() for p in sorted(outside.rglob("*")) if p.is_file()}


SKIPPED = {"fifo.py": "a FIFO", "zero.py": "/dev/zero (outside the tree)", "pkg/rand.cu": "/dev/urandom (outside",
           "linked.py": "victim.py (outside the tree)", "inside.py": "(inside the tree)",
           "outdir": "deep (outside the tree)", "pkg/big.py": "over the size limit"}


@pytest.mark.timeout(60)
def test_scan_skips_links_fifos_devices_and_big_files_with_a_line_each(hostile, capsys):
    tree, outside = hostile
    before = _outside_state(outside)
    code, out, err = opscope_main(capsys, "migrate", "scan", tree, "--json", "--max-size", "1KiB")
    assert code == 0, err
    doc = json.loads(out)
    skipped = {s["file"]: s["reason"] for s in doc["skipped"]}
    for name, why in SKIPPED.items():
        assert why in skipped.get(name, ""), (name, skipped)
    # only the regular files were read: their findings, none from the files the links lead to
    assert sorted({f["file"] for f in doc["findings"]}) == ["hard.py", "pkg/new.py", "pkg/ok.py", "train.py"]
    code, out, err = opscope_main(capsys, "migrate", "scan", tree, "--max-size", "1KiB")
    assert code == 0
    for name in SKIPPED:
        assert sum(line.startswith(f"skipped {name}:") for line in out.splitlines()) == 1, out
    assert _outside_state(outside) == before


@pytest.mark.timeout(60)
def test_apply_write_touches_nothing_outside_the_tree_and_says_what_it_left(hostile, capsys):
    tree, outside = hostile
    before = _outside_state(outside)
    code, out, err = opscope_main(capsys, "migrate", "apply", tree, "--write", "--json", "--max-size", "1KiB")
    assert code == 0, err
    doc = json.loads(out)
    assert _outside_state(outside) == before          # canary, victim, the hard link's other name, far.py
    assert not os.path.lexists(outside / "aliases")
    assert (tree / "pkg" / "new.py").read_text() == CUDA
    skipped = {s["file"]: s["reason"] for s in doc["skipped"]}
    assert "its backup train.py.orig is a symbolic link; not written" in skipped["train.py"]
    assert "its backup new.py.orig is a symbolic link" in skipped["pkg/new.py"]
    for name in SKIPPED:
        assert name in skipped, (name, skipped)
    assert sorted(f["file"] for f in doc["files"]) == ["hard.py", "pkg/ok.py"]
    # train.py is left as it was; ok.py is rewritten with a real backup beside it
    assert (tree / "train.py").read_text() == CUDA and os.readlink(tree / "train.py.orig") == str(outside / "canary")
    assert "compat.device()" in (tree / "pkg" / "ok.py").read_text()
    backup = tree / "pkg" / "ok.py.orig"
    assert not backup.is_symlink() and backup.read_text() == CUDA
    # the hard link: this tree's name holds the rewrite, the other name (outside) its original text
    assert "compat.device()" in (tree / "hard.py").read_text() and (outside / "hard.py").read_text() == CUDA
    assert os.readlink(tree / "linked.py") == str(outside / "victim.py")
    # a second apply finds nothing more to write and keeps the first backup
    code, out, err = opscope_main(capsys, "migrate", "apply", tree, "--write", "--max-size", "1KiB")
    assert code == 0 and "skipped train.py: its backup" in out, out
    assert backup.read_text() == CUDA and _outside_state(outside) == before


@pytest.mark.timeout(60)
def test_apply_diff_leaves_out_the_file_write_would_leave_alone(hostile, capsys):
    tree, _ = hostile
    code, out, err = opscope_main(capsys, "migrate", "apply", tree)
    assert code == 0
    assert "+++ b/pkg/ok.py" in out and "train.py" not in out.split("skipped")[0]
    assert "skipped train.py: its backup train.py.orig is a symbolic link" in err


def test_a_link_swapped_in_after_the_scan_is_replaced_not_written_through(tmp_path):
    """Between the scan and the write the name may change: the write renames a new file over the name, so a
    link put there is replaced (its target keeps its text) and a FILE.orig link refuses the write."""
    outside = tmp_path / "canary"
    outside.write_text("canary\n")
    target = tmp_path / "t.py"
    target.write_text(CUDA)
    write_source(target, b"new\n", 1 << 20)
    assert target.read_text() == "new\n" and (tmp_path / "t.py.orig").read_text() == CUDA
    os.unlink(target)
    target.symlink_to(outside)
    with pytest.raises(Skip, match="symbolic link"):
        write_source(target, b"evil\n", 1 << 20)
    other = tmp_path / "u.py"
    other.write_text(CUDA)
    (tmp_path / "u.py.orig").symlink_to(outside)
    with pytest.raises(Skip, match="its backup u.py.orig is a symbolic link"):
        write_source(other, b"evil\n", 1 << 20)
    assert outside.read_text() == "canary\n" and other.read_text() == CUDA


@pytest.mark.timeout(30)
def test_reads_never_follow_a_link_never_block_and_stay_bounded(tmp_path):
    fifo = tmp_path / "f.py"
    os.mkfifo(fifo)
    link = tmp_path / "z.py"
    link.symlink_to("/dev/zero")
    for path, why in ((fifo, "a FIFO"), (link, "symbolic link"), ("/dev/zero", "a device")):
        with pytest.raises(Skip, match=why):
            read_source(path, 1024)
    # the path the user names may be a link (their choice): followed, but a device is still refused
    with pytest.raises(Skip, match="a device"):
        read_source(link, 1024, follow=True)
    big = tmp_path / "big.py"
    big.write_bytes(b"#" * 2048)
    with pytest.raises(Skip, match="over the size limit"):
        read_source(big, 1024)
