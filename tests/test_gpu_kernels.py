"""GPU traces (issue 27), on HTA-style traces written here in Kineto's format: kernels grouped by their names and by
HTA's categories (compute, communication, memory copy / set), with shares of the step that cannot pass 100 % when
streams overlap; a folder with 2 of a 128-rank job's traces imports the ranks present with a warning; a time past
int64 nanoseconds is refused with exit 2."""
import json

import pytest

from opscope.profiler import stats
from opscope.profiler.importers import import_trace
from opscope.profiler.store import RunStore

HOST, T0 = 4242, 1_700_000_000_000      # host pid/tid; us
SGEMM = "ampere_sgemm_128x64_tn"
NCCL = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"


def _x(cat, name, ts, dur, args=None, pid=HOST, tid=HOST):
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": T0 + ts, "dur": dur, "args": args or {}}


def hta_trace(rank=None, world=None, steps=2) -> dict:
    """Per step: a host op launching, on streams 7 and 8 of GPU 0, two sgemms that overlap each other, an
    all-reduce (NCCL), a copy and a memset."""
    ev, corr = [], 100
    for s in range(steps):
        base = s * 1000
        ev.append(_x("user_annotation", f"ProfilerStep#{s}", base, 1000, {"External id": s}))
        ev.append(_x("cpu_op", "aten::mm", base + 10, 100, {"External id": 10 + s}))
        for stream, gpu_ts, dur, name, cat, extra in (
                (7, 120, 300, SGEMM, "kernel", {}), (8, 220, 300, SGEMM, "kernel", {}),
                (8, 600, 200, NCCL, "kernel", {}),
                (7, 450, 40, "Memcpy HtoD (Pageable -> Device)", "gpu_memcpy", {"bytes": 1 << 20}),
                (7, 500, 10, "Memset (Device)", "gpu_memset", {"bytes": 4096})):
            corr += 1
            ev.append(_x("cuda_runtime", "cudaLaunchKernel", base + 20, 5, {"correlation": corr, "External id": 10}))
            ev.append(_x(cat, name, base + gpu_ts, dur, {"device": 0, "stream": stream, "correlation": corr,
                                                       "External id": 10 + s, **extra}, pid=0, tid=stream))
            ev.append({"ph": "s", "id": corr, "pid": HOST, "tid": HOST, "ts": T0 + base + 20, "cat": "ac2g",
                       "name": "ac2g"})
            ev.append({"ph": "f", "id": corr, "pid": 0, "tid": stream, "ts": T0 + base + gpu_ts, "cat": "ac2g",
                       "name": "ac2g", "bp": "e"})
    doc = {"schemaVersion": 1, "traceEvents": ev, "displayTimeUnit": "ms"}
    if rank is not None:
        doc["distributedInfo"] = {"backend": "nccl", "rank": rank, "world_size": world}
        doc["baseTimeNanoseconds"] = 1_700_000_000_000_000_000
    return doc


def _write(path, doc):
    path.write_text(json.dumps(doc))
    return path


def test_kernels_by_name_and_by_category_never_pass_the_step(tmp_path):
    store = RunStore()
    rid = import_trace(_write(tmp_path / "gpu.json", hta_trace()), store)
    with store.connect(read_only=True) as con:
        t = stats.run_times(con, rid)
        by_name = {r["key"]: r for r in stats.op_breakdown(con, rid, "name", times=t) if r["kind"] == "device"}
        by_op = {r["key"]: r for r in stats.op_breakdown(con, rid, "op", times=t) if r["kind"] == "device"}
        by_cat = {r["key"]: r for r in stats.op_breakdown(con, rid, "category", times=t)}
    # every kernel under its own name, not one "kernel" row
    assert {SGEMM, NCCL, "Memcpy HtoD (Pageable -> Device)", "Memset (Device)"} <= set(by_name)
    # the two sgemms of a step overlap by 200 us on two streams: 400 us of the step, not 600
    assert by_name[SGEMM]["count"] == 4 and by_name[SGEMM]["total_ns"] == 2 * 400_000
    assert by_op["kernel"]["total_ns"] <= t["device_ns"]
    for rows in (by_name, by_op, by_cat):
        assert all(r["total_pct"] is None or r["total_pct"] <= 100.0 + 1e-9 for r in rows.values())
        assert all(r["self_pct"] is None or r["self_pct"] <= 100.0 + 1e-9 for r in rows.values())
    # HTA's categories
    assert {"compute", "communication", "memory copy", "memory set", "host"} <= set(by_cat)
    assert by_cat["communication"]["total_ns"] == 2 * 200_000
    assert by_cat["memory copy"]["total_ns"] == 2 * 40_000 and by_cat["memory set"]["total_ns"] == 2 * 10_000
    assert by_cat["compute"]["total_ns"] == 2 * 400_000


def test_a_folder_with_2_of_128_ranks_imports_them_with_a_warning(tmp_path, cli):
    folder = tmp_path / "ranks"
    folder.mkdir()
    for rank in (0, 5):
        _write(folder / f"rank{rank}.json", hta_trace(rank, 128))
    r = cli("trace", "import", folder, "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    warned = [ln for ln in r.stderr.splitlines() if ln.startswith("opscope: warning:")]
    assert len(warned) == 1 and "2 of 128 ranks imported" in warned[0] and "1, 2, 3" in warned[0], r.stderr
    assert doc["warnings"] and "Traceback" not in r.stderr
    run = RunStore().get_run(doc["run_id"])
    assert run["config"]["ranks_missing"][:3] == [1, 2, 3] and len(run["config"]["ranks_missing"]) == 126
    ev = RunStore().events_frame(doc["run_id"], columns=["rank"])
    assert set(ev["rank"].tolist()) == {0, 5}


@pytest.mark.parametrize("cat", ["cpu_op", "kernel", "user_annotation"])
def test_a_time_past_int64_nanoseconds_is_refused_with_exit_2(tmp_path, cli, cat):
    doc = hta_trace()
    bad = next(e for e in doc["traceEvents"] if e.get("cat") == cat)
    bad["ts"] = 9.222e18
    r = cli("trace", "import", _write(tmp_path / "far.json", doc))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "9.222e+18" in r.stderr and bad["name"][:20] in r.stderr and "Traceback" not in r.stderr
    assert RunStore().list_runs() == []


def test_transfers_show_bytes_and_gb_per_s_not_gflops(tmp_path):
    from opscope.app.web.server import create_app
    from test_web_security import _callback_body, _server_callbacks
    store = RunStore()
    rid = import_trace(_write(tmp_path / "gpu.json", hta_trace()), store)
    app = create_app(store=store)
    _server_callbacks(app)
    key = next(k for k in app.callback_map if k.startswith("..ops-table.rowData"))
    cb = app.callback_map[key]
    run = store.get_run(rid)
    body = _callback_body(key, cb, [{"run": rid, "status": "ok", "events": run["events"], "dropped": 0}, "name", None])
    rows = {r["key"]: r for r in app.server.test_client().post("/_dash-update-component", json=body)
            .get_json()["response"]["ops-table"]["rowData"]}
    copy = rows["Memcpy HtoD (Pageable -> Device)"]
    assert copy["gflops"] is None and copy["bytes_text"] == "2.0 MiB"
    assert copy["gbps"] == pytest.approx(2 * (1 << 20) / 80_000)          # bytes / ns = GB/s: 2 MiB in 80 us
