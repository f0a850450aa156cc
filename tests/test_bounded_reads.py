"""Files from folders a user points at are read the one bounded way (runtime/safe_read.py; issue 33, items 2
and 3): an elastic checkpoint and a shared run folder that hang, inflate or overflow are one line and exit 2,
in bounded memory, and the reader itself is fuzzed."""
import io
import json
import os
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import duckdb
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from opscope.runtime import safe_read
from opscope.runtime.dist.elastic import CHECKPOINT, read_checkpoint, write_checkpoint
from opscope.runtime.errors import UsageError

CLI = [sys.executable, "-m", "opscope.app"]
HYBRID = "torch:cpu=0.5,torch:cpu=0.5"
GiB = 1 << 30

# NOTE: a small launcher forks the command: Linux keeps a process's peak RSS across exec, so a child forked
# straight from pytest would report pytest's own peak. wait4's usage covers the command and every process it
# waited for (its ranks), so the peak is the whole job's
_LAUNCHER = ("import os, sys\n"
             "pid = os.fork()\n"
             "if pid == 0:\n"
             "    os.dup2(os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT), 1)\n"
             "    os.dup2(os.open(sys.argv[2], os.O_WRONLY | os.O_CREAT), 2)\n"
             "    os.execv(sys.executable, [sys.executable, '-m', 'opscope.app', *sys.argv[3:]])\n"
             "_, status, usage = os.wait4(pid, 0)\n"
             "print(os.waitstatus_to_exitcode(status), usage.ru_maxrss)\n")


def _opscope(tmp_path: Path, *args, timeout=240, **env) -> tuple[int, str, str, int]:
    """`opscope ARGS` in a process of its own -> (exit code, stdout, stderr, peak RSS in bytes)."""
    out, err = tmp_path / "out", tmp_path / "err"
    for f in (out, err):
        f.unlink(missing_ok=True)
    r = subprocess.run([sys.executable, "-c", _LAUNCHER, str(out), str(err), *map(str, args)], capture_output=True,
                       text=True, timeout=timeout, env={**os.environ, "OMP_NUM_THREADS": "1",
                                                        "OPSCOPE_HOME": str(tmp_path / "home"), **env})
    code, maxrss_kib = map(int, r.stdout.split())
    return code, out.read_text(), err.read_text(), maxrss_kib * 1024


def _one_line(code: int, err: str, *words) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, (code, err[-3000:])
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]


# --- elastic checkpoints ----------------------------------------------------------------------------------
def _train(tmp_path: Path, folder: Path, timeout: int):
    return _opscope(tmp_path, "train", "demo:mlp", "--hybrid", HYBRID, "--steps", "6", "--elastic",
                    "--checkpoint-dir", folder, timeout=timeout)


def _mlp_params() -> dict:
    from opscope.runtime import models
    model, _ = models.load_train("demo:mlp")
    return {k: v.detach().numpy() for k, v in model.named_parameters()}


def _meta(**change) -> dict:
    return {"model": "demo:mlp", "hybrid": HYBRID, "steps": 6, "step": 2, "world_size": 2, "resumes": 0,
            "events": [], **change}


@pytest.mark.multiprocess
def test_a_fifo_named_checkpoint_npz_is_one_line_not_a_hang(tmp_path):
    folder = tmp_path / "ck"
    folder.mkdir()
    os.mkfifo(folder / CHECKPOINT)          # no writer: a plain open() for reading blocks for ever
    code, _, err, peak = _train(tmp_path, folder, timeout=120)
    _one_line(code, err, f"--checkpoint-dir {folder}: {CHECKPOINT}", "is a FIFO", "delete it or pass another folder")
    assert peak < GiB, f"peak memory {peak >> 20} MiB"


@pytest.mark.multiprocess
@pytest.mark.slow
def test_a_small_checkpoint_that_inflates_to_2_gib_is_refused_before_its_data_is_read(tmp_path):
    """One parameter's .npy claims 2 GiB (and holds it, deflated to a few MB): its header is compared with the
    model's parameter before a byte of its data is read; reading first reached 2.3 GB and kept inflating."""
    folder = tmp_path / "ck"
    folder.mkdir()
    params = _mlp_params()
    write_checkpoint(str(folder), _meta(), params, {})
    path = folder / CHECKPOINT
    name = next(iter(params))
    n = (2 * GiB - 4096) // 4
    rebuilt = folder / "rebuilt.npz"
    with zipfile.ZipFile(path) as old, zipfile.ZipFile(rebuilt, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as z:
        for info in old.infolist():
            if info.filename != f"param/{name}.npy":
                z.writestr(info.filename, old.read(info))
                continue
            with z.open(info.filename, "w", force_zip64=True) as f:
                np.lib.format.write_array_header_2_0(f, {"descr": "<f4", "fortran_order": False, "shape": (n,)})
                zeros = bytes(64 << 20)
                for _ in range(n * 4 // len(zeros)):
                    f.write(zeros)
                f.write(bytes(n * 4 % len(zeros)))
    os.replace(rebuilt, path)
    assert path.stat().st_size < 16 << 20          # 10 MB at compresslevel 1
    code, _, err, peak = _train(tmp_path, folder, timeout=400)
    _one_line(code, err, f"--checkpoint-dir {folder}: {CHECKPOINT}", f"holds parameter {name} as [{n}] float32",
              "the model's is")
    assert peak < GiB, f"peak memory {peak >> 20} MiB"


def _npz_with_member(path: Path, name: str, raw: bytes) -> None:
    with zipfile.ZipFile(path, "a", zipfile.ZIP_DEFLATED) as z:
        z.writestr(name, raw)


def test_a_100_mb_npy_header_is_one_line(tmp_path):
    path = Path(write_checkpoint(str(tmp_path), _meta(), _mlp_params(), {}))
    header = b"{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }" + b" " * (100 << 20) + b"\n"
    _npz_with_member(path, "param/big.npy", b"\x93NUMPY\x02\x00" + struct.pack("<I", len(header)) + header)
    assert path.stat().st_size < 4 << 20          # the model's 1.6 MB and the header, deflated
    with pytest.raises(UsageError) as e:
        read_checkpoint(str(tmp_path))
    assert "\n" not in str(e.value) and f"holds a .npy header of {len(header)} bytes" in str(e.value)


@pytest.mark.multiprocess
@pytest.mark.parametrize("meta,says", [
    (_meta(step=10 ** 30), "step = 1000000000000000000000000000000, expected an integer 0..1000000000"),
    (_meta(world_size=10 ** 30), "world_size = 1000000000000000000000000000000, expected an integer 1..65536"),
    (_meta(step=100), "is after step 100, past this job's --steps 6"),
])
def test_a_meta_step_out_of_range_is_one_line_exit_2(tmp_path, meta, says):
    """A meta step of 10**30 was accepted (exit 0, then the parameters were compared with 6 eager steps)."""
    folder = tmp_path / "ck"
    folder.mkdir()
    write_checkpoint(str(folder), meta, _mlp_params(), {})
    code, _, err, peak = _train(tmp_path, folder, timeout=200)
    _one_line(code, err, f"--checkpoint-dir {folder}: {CHECKPOINT}", says)
    assert peak < GiB, f"peak memory {peak >> 20} MiB"


def test_a_checkpoint_reads_its_arrays_only_once_their_headers_match_the_model(tmp_path):
    params = _mlp_params()
    fortran = {k: np.asfortranarray(v) for k, v in params.items()}
    write_checkpoint(str(tmp_path), _meta(), fortran, {"7": np.arange(3, dtype=np.float32)})
    ck = read_checkpoint(str(tmp_path))
    got = ck.load("param", params)
    assert all(np.array_equal(got[k], params[k]) for k in params)
    assert np.array_equal(ck.state["7"], np.arange(3, dtype=np.float32))
    other = {**params, next(iter(params)): np.zeros((3, 3), np.float32)}
    with pytest.raises(UsageError, match=r"as \[\d+(, \d+)*\] float32; the model's is \[3, 3\] float32"):
        ck.load("param", other)


# --- shared run folders -------------------------------------------------------------------------------------
def _job(root: Path) -> Path:
    from test_shared_runs import _fake_job
    return _fake_job(root)


def _copy_parquet(src: Path, dst: Path, select: str) -> None:
    con = duckdb.connect(":memory:")
    con.execute(f"COPY ({select.replace('SRC', 'read_parquet(?)')}) TO '{dst}.tmp' (FORMAT parquet)", [str(src)])
    con.close()
    os.replace(f"{dst}.tmp", dst)


def _ten_million_rows(job: Path) -> str:
    f = job / "rank-1" / "step-1.parquet"
    _copy_parquet(f, f, "SELECT s.* FROM SRC s, range(2500000)")        # its 4 events, 2,500,000 times
    assert f.stat().st_size < 2 << 20
    return "declare more than"


def _deep_run_json(job: Path) -> str:
    (job / "run.json").write_text("[" * 100_000 + "]" * 100_000)
    return "run.json nests deeper than 64 levels"


def _steps(value: str):
    def spoil(job: Path) -> str:
        doc = json.loads((job / "run.json").read_text())
        (job / "run.json").write_text(json.dumps(doc)[:-1] + f', "steps": {value}}}')
        return "steps = "
    spoil.__name__ = f"steps_{value}"
    return spoil


def _int64_times(job: Path) -> str:
    f = job / "rank-0" / "step-0.parquet"
    _copy_parquet(f, f, "SELECT * REPLACE (9223372036854775807::BIGINT AS start_ns, "
                        "-9223372036854775807::BIGINT AS end_ns) FROM SRC")
    return "outside -2**62 < start <= end < 2**62"


def _fifo_rank_file(job: Path) -> str:
    (job / "rank-1.json").unlink()
    os.mkfifo(job / "rank-1.json")
    return "rank-1.json is a FIFO"


@pytest.mark.multiprocess
@pytest.mark.parametrize("spoil", [_ten_million_rows, _deep_run_json, _steps("1000000000000000000000000000000"),
                                   _steps("1e30"), _int64_times, _fifo_rank_file], ids=lambda f: f.__name__)
def test_a_hostile_shared_folder_is_one_line_in_bounded_memory(tmp_path, monkeypatch, spoil):
    """Each was an exit 1 with a traceback or DuckDB's error, or an 'ok' run that broke show and compare
    (INT64 times), or 3 GB of memory (10,000,000 rows from 50 KB)."""
    says = spoil(_job(tmp_path / "shared"))
    code, out, err, peak = _opscope(tmp_path, "trace", "import", tmp_path / "shared", timeout=300)
    _one_line(code, err, str(tmp_path / "shared"), says)
    assert peak < GiB, f"peak memory {peak >> 20} MiB"
    from opscope.profiler.store import RunStore
    monkeypatch.setenv("OPSCOPE_HOME", str(tmp_path / "home"))
    assert RunStore().list_runs() == []


def test_times_at_the_edge_of_the_bound_import_and_show(tmp_path, monkeypatch):
    """The bound is not a cut at typical values: times near +-2**62 ns import, and a run's span still fits."""
    from opscope.profiler.shared import import_shared
    from opscope.profiler.store import RunStore
    monkeypatch.setenv("OPSCOPE_HOME", str(tmp_path / "home"))
    job = _job(tmp_path / "shared")
    f = job / "rank-0" / "step-0.parquet"
    _copy_parquet(f, f, f"SELECT * REPLACE ({-(2 ** 62) + 1}::BIGINT AS start_ns, end_ns AS end_ns) FROM SRC")
    g = job / "rank-1" / "step-0.parquet"
    _copy_parquet(g, g, f"SELECT * REPLACE (start_ns AS start_ns, {2 ** 62 - 1}::BIGINT AS end_ns) FROM SRC")
    store = RunStore()
    rid = import_shared(tmp_path / "shared", store)[0]
    assert store.query("SELECT max(end_ns) - min(start_ns) FROM events WHERE run_id = ?", [rid])[0][0] == 2 ** 63 - 2


# --- the reader, fuzzed -----------------------------------------------------------------------------------
def _depth(doc) -> int:
    if isinstance(doc, list):
        return 1 + max(map(_depth, doc), default=0)
    if isinstance(doc, dict):
        return 1 + max(map(_depth, doc.values()), default=0)
    return 0


_json = st.recursive(st.none() | st.booleans() | st.integers() | st.text(alphabet='[]{}"\\ab\n'),
                     lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(alphabet='[]{}"\\x'), kids,
                                                                                max_size=3), max_leaves=30)


@settings(max_examples=300, deadline=None)
@given(_json)
def test_json_depth_is_the_nesting_of_any_document(doc):
    text = json.dumps(doc).encode()
    assert safe_read.json_depth(text) == _depth(doc)
    assert safe_read.parse_json(text, "f", "do x", max_depth=64) == doc


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300) | st.integers(0, 20_000).map(lambda d: b"[" * d + b"]" * d)
       | st.integers(0, 20_000).map(lambda d: b'{"a":' * d + b"1" + b"}" * d))
def test_parse_json_returns_or_says_one_line(data):
    try:
        safe_read.parse_json(data, "file x", "do y")
    except UsageError as e:
        assert "\n" not in str(e) and str(e).startswith("file x ") and str(e).endswith("; do y")


_header = st.fixed_dictionaries({"descr": st.sampled_from(["<f4", "<i8", "|u1", "|O", "<f8", "x", 3]),
                                 "fortran_order": st.sampled_from([False, True, 0, None]),
                                 "shape": st.one_of(st.tuples(), st.lists(st.integers(-3, 2 ** 64), max_size=4)
                                                    .map(tuple), st.integers(), st.text(max_size=5))})


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_header, st.sampled_from([(1, 0), (2, 0), (3, 0), (9, 9)]), st.binary(max_size=40), st.integers(0, 200))
def test_npy_header_returns_a_checked_shape_or_says_one_line(header, version, junk, cut):
    text = repr(header).encode() + b" \n"
    width = 2 if version == (1, 0) else 4
    raw = b"\x93NUMPY" + bytes(version) + len(text).to_bytes(width, "little") + text + junk
    for data in (raw, raw[:cut]):
        try:
            shape, dtype, fortran = safe_read.npy_header(io.BytesIO(data), "entry e", "do z")
        except UsageError as e:
            assert "\n" not in str(e) and str(e).startswith("entry e ") and str(e).endswith("; do z")
            continue
        assert not dtype.hasobject and isinstance(fortran, bool)
        assert all(type(n) is int and 0 <= n < 2 ** 63 for n in shape)
        if data == raw and version != (9, 9):
            assert shape == header["shape"] and dtype == np.dtype(header["descr"])


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.integers(-2 ** 70, 2 ** 70), st.floats(allow_nan=True), st.booleans(), st.none(),
                 st.text(max_size=3), st.lists(st.integers(), max_size=2)))
def test_checked_int_passes_only_integers_in_range(value):
    try:
        got = safe_read.checked_int(value, "run.json", "steps", 1, safe_read.MAX_STEPS)
    except UsageError as e:
        assert "\n" not in str(e) and "steps = " in str(e)
        assert isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= safe_read.MAX_STEPS
        return
    assert got == value and type(value) is int and 1 <= value <= safe_read.MAX_STEPS


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(size=st.integers(0, 5000), limit=st.integers(0, 5000))
def test_read_bounded_reads_at_most_the_limit(tmp_path, size, limit):
    path = tmp_path / "f"
    path.write_bytes(b"x" * size)
    try:
        assert safe_read.read_bounded(path, limit, "f", "do") == b"x" * size and size <= limit
    except UsageError as e:
        assert size > limit and f"is {size} bytes" in str(e)


def test_only_regular_files_are_opened(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path, kind in ((fifo, "a FIFO"), ("/dev/zero", "a device"), (tmp_path, "a folder"),
                       (tmp_path / "none", "does not exist")):
        with pytest.raises(UsageError, match=kind):
            safe_read.read_bounded(path, 10, f"thing {path}", "give a file")
        assert safe_read.read_small_json(path, 10) is None


_SMALL = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.ones(3, np.float64)}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(edits=st.lists(st.tuples(st.integers(0, 4000), st.binary(min_size=1, max_size=8)), max_size=4),
       cut=st.one_of(st.none(), st.integers(0, 4000)))
def test_a_damaged_checkpoint_reads_whole_or_says_one_line(tmp_path, edits, cut):
    """Bytes overwritten anywhere (headers, zip directory, meta, data) or the file cut short: the reader gives
    the arrays the headers promise, or one CheckpointError line -- never another exception."""
    folder = tmp_path / "fuzz"
    folder.mkdir(exist_ok=True)
    path = Path(write_checkpoint(str(folder), _meta(), _SMALL, {"3": np.zeros(2, np.float32)}))
    data = bytearray(path.read_bytes())
    for at, raw in edits:
        data[at % len(data): at % len(data) + len(raw)] = raw
    path.write_bytes(bytes(data[:cut]) if cut is not None else bytes(data))
    try:
        ck = read_checkpoint(str(folder))
        if ck is not None:
            got = ck.load("param", _SMALL)
            assert all(got[k].shape == v.shape and got[k].dtype == v.dtype for k, v in _SMALL.items())
            ck.load("state")
    except UsageError as e:
        assert "\n" not in str(e) and f"--checkpoint-dir {folder}" in str(e), str(e)
