"""Trace import: torch.profiler (Kineto) traces, ONNX Runtime profiles, and files that are neither."""
import json
import os
import random
from collections import Counter

import pytest
import torch

from opscope.profiler.importers import import_trace
from opscope.profiler.importers.names import op_for_aten_name
from opscope.profiler.store import RunStore, StoreError


class TinyNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(16, 32), torch.nn.Linear(32, 4)
        self.norm = torch.nn.LayerNorm(32)

    def forward(self, x):
        return torch.softmax(self.fc2(torch.nn.functional.gelu(self.norm(self.fc1(x)))), dim=-1)


def torch_profiler_trace(path, steps=1, schedule=False):
    """Profile TinyNet with torch.profiler, export its Chrome trace; -> key_averages() counts by name."""
    torch.manual_seed(0)
    model, x = TinyNet(), torch.randn(8, 16)
    # a schedule records `steps` active steps after one warm-up step, each marked ProfilerStep#N
    kw = {"schedule": torch.profiler.schedule(wait=0, warmup=1, active=steps, repeat=1)} if schedule else {}
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True, **kw) as prof:
        for _ in range(steps + 1 if schedule else steps):
            model(x)
            if schedule:
                prof.step()
    prof.export_chrome_trace(str(path))
    return {k.key: k.count for k in prof.key_averages()}


def cpu_op_names(path):
    return {e["name"] for e in json.load(open(path))["traceEvents"] if e.get("cat") == "cpu_op"}


def test_torch_profiler_trace_imports_into_the_same_per_op_table_as_key_averages(tmp_path, cli):
    trace = tmp_path / "torch_trace.json"
    averages = torch_profiler_trace(trace, steps=2)
    r = cli("trace", "import", trace, "--json")
    assert r.returncode == 0, r.stderr
    rid = json.loads(r.stdout)["run_id"]
    store = RunStore()
    run = store.get_run(rid)
    assert run["engine"] == "import" and run["source"] == str(trace.resolve()) and run["status"] == "ok"
    # what a torch.profiler trace does not know is NULL in the store, not 0; FLOPs come from the recorded
    # shapes of the matmul family, once per nest (on aten::linear, not again on the addmm inside it)
    n, live = store.query("SELECT count(*), count(live_bytes) FROM events WHERE run_id = ?", [rid])[0]
    assert n > 0 and live == 0
    flops = store.query("SELECT node, flops FROM events WHERE run_id = ? AND flops IS NOT NULL", [rid])
    assert sorted(flops) == sorted([("aten::linear", 2 * 8 * 16 * 32 + 8 * 32), ("aten::linear", 2 * 8 * 32 * 4 + 8 * 4)] * 2)

    names = cpu_op_names(trace)
    want = {k: c for k, c in averages.items() if k in names}
    assert "aten::linear" in want and want["aten::linear"] == 4
    # by node: the ATen names, exactly as torch.profiler counts them
    assert {r["key"]: r["count"] for r in store.op_stats(rid, by="node")} == want
    # by op: opscope names (aten::linear -> linear), ATen names kept where opscope has no op
    by_op = Counter()
    for k, c in want.items():
        by_op[op_for_aten_name(k)] += c
    got = {r["key"]: r["count"] for r in store.op_stats(rid)}
    assert set(got) == set(by_op) and all(got[k] <= by_op[k] for k in got)
    assert got["linear"] == 4 and got["layer_norm"] == 2
    # an op nested in one of its own group is not a second call (issue 27): aten::softmax + its inner
    # aten::_softmax are one softmax call each
    assert got["softmax"] == want["aten::softmax"] < by_op["softmax"]

    # nesting gives depth, so self time is below total time for ops that call others
    lin = next(r for r in store.op_stats(rid, by="node") if r["key"] == "aten::linear")
    assert 0 <= lin["self_ns"] < lin["total_ns"]
    ev = store.events_frame(rid, columns=["node", "depth", "input_shapes", "input_dtypes"])
    i = ev["node"].tolist().index("aten::linear")
    assert ev["depth"][i] == 0 and json.loads(ev["input_shapes"][i])[0] == [8, 16]
    assert json.loads(ev["input_dtypes"][i])[0] == "float32"
    assert max(ev["depth"].tolist()) >= 2                   # linear > addmm-like children > ...


def test_torch_profiler_schedule_steps_become_steps(tmp_path):
    trace = tmp_path / "sched.json"
    averages = torch_profiler_trace(trace, steps=3, schedule=True)
    rid = import_trace(trace)
    store = RunStore()
    ev = store.events_frame(rid, columns=["step", "node"])
    assert sorted(set(ev["step"].tolist())) == [0, 1, 2]
    per_step = Counter(s for s, n in zip(ev["step"].tolist(), ev["node"].tolist()) if n == "aten::linear")
    assert per_step == {0: 2, 1: 2, 2: 2}
    names = cpu_op_names(trace) - {n for n in averages if n.startswith("ProfilerStep#")}
    assert Counter(ev["node"].tolist()) == {k: c for k, c in averages.items() if k in names}


ORT_PROFILE = [
    {"cat": "Session", "pid": 4242, "tid": 4242, "dur": 900, "ts": 3, "ph": "X", "name": "model_loading_uri",
     "args": {}},
    {"cat": "Session", "pid": 4242, "tid": 4242, "dur": 1500, "ts": 910, "ph": "X", "name": "session_initialization",
     "args": {}},
]


def _ort_node(ts, name, op, dur, provider="CPUExecutionProvider"):
    args = {"op_name": op}
    kernel = {"thread_scheduling_stats": "", "output_size": "512", "parameter_size": "2176", "activation_size": "256",
              "node_index": "0", "input_type_shape": [{"float": [8, 16]}, {"float": [32, 16]}, {"float": [32]}],
              "output_type_shape": [{"float": [8, 32]}], "exec_plan_index": "0", "op_name": op, "provider": provider}
    return [{"cat": "Node", "pid": 4242, "tid": 4250, "dur": 0, "ts": ts, "ph": "X", "name": f"{name}_fence_before",
             "args": args},
            {"cat": "Node", "pid": 4242, "tid": 4250, "dur": dur, "ts": ts + 1, "ph": "X", "name": f"{name}_kernel_time",
             "args": kernel},
            {"cat": "Node", "pid": 4242, "tid": 4250, "dur": 0, "ts": ts + dur + 1, "ph": "X",
             "name": f"{name}_fence_after", "args": args}]


def ort_profile(runs=2):
    events = list(ORT_PROFILE)
    t = 3000
    for _ in range(runs):
        start = t
        for name, op, dur in [("/fc1/Gemm", "Gemm", 40), ("/act/Gelu", "Gelu", 12), ("/fc2/Gemm", "Gemm", 20),
                              ("/fused/FusedMatMul", "FusedMatMul", 9)]:
            events += _ort_node(t, name, op, dur)
            t += dur + 5
        events.append({"cat": "Session", "pid": 4242, "tid": 4242, "dur": t - start, "ts": start, "ph": "X",
                       "name": "SequentialExecutor::Execute", "args": {}})
        events.append({"cat": "Session", "pid": 4242, "tid": 4242, "dur": t - start + 2, "ts": start - 1, "ph": "X",
                       "name": "model_run", "args": {}})
        t += 100
    return events


@pytest.mark.multiprocess
def test_onnx_op_names_map_to_ops_the_registry_has_and_an_ort_import_needs_no_torch(tmp_path):
    import subprocess
    import sys
    from opscope.profiler.importers.names import ONNX_OPS
    from opscope.runtime.ops import registry
    assert sorted(set(ONNX_OPS.values()) - set(registry.OPS)) == []
    path = tmp_path / "onnxruntime_profile.json"
    path.write_text(json.dumps(ort_profile(runs=2)))
    code = ("import json, sys\n"
            "from opscope.profiler.importers import import_trace\n"
            f"import_trace({str(path)!r})\n"
            "print(json.dumps('torch' in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env=dict(os.environ, OPSCOPE_HOME=str(tmp_path / "home")))
    assert json.loads(out.stdout.strip().splitlines()[-1]) is False


def test_onnxruntime_profile_imports_kernel_times_per_step(tmp_path, cli):
    path = tmp_path / "onnxruntime_profile__2024.json"
    path.write_text(json.dumps(ort_profile(runs=2)))
    r = cli("trace", "import", path)
    assert r.returncode == 0, r.stderr
    rid = r.stdout.strip()
    store = RunStore()
    assert store.get_run(rid)["backend"] == "CPUExecutionProvider"
    got = {r["key"]: (r["count"], r["total_ns"]) for r in store.op_stats(rid)}
    assert got == {"linear": (4, 120_000), "gelu": (2, 24_000), "FusedMatMul": (2, 18_000)}
    ev = store.events_frame(rid, columns=["step", "node", "thread", "output_shapes"])
    assert Counter(ev["step"].tolist()) == {0: 4, 1: 4}
    assert set(ev["thread"].tolist()) == {4250} and "/fc1/Gemm" in ev["node"].tolist()
    assert json.loads(ev["output_shapes"][0]) == [[8, 32]]


# --- files that are not traces: exit 2, one line, the store untouched ------------------------------
def opscope_main(capsys, *args):
    """The CLI's own main, in this process (a subprocess per bad file costs seconds of imports)."""
    from opscope.app.cli import main
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        main([str(a) for a in args])
    out, err = capsys.readouterr()
    return e.value.code, out, err


def _store_snapshot(store):
    return [(r["run_id"], r["events"], r["status"]) for r in store.list_runs()], \
        store.query("SELECT count(*) FROM events")[0][0]


@pytest.mark.parametrize("name,content", [
    ("garbage.json", random.Random(0).randbytes(4096)),   # fixed seed: the same test id in every xdist worker
    ("truncated.json", None),                  # a real torch.profiler trace, cut in half
    ("empty.json", b""),
    ("object.json", b'{"hello": "world"}'),
    ("numbers.json", b"[1, 2, 3]"),
    ("bad_ts.json", json.dumps({"traceEvents": [{"ph": "X", "name": "aten::add", "ts": "soon", "dur": 1,
                                                  "pid": 1, "tid": 1}]}).encode()),
    ("no_ops.json", json.dumps({"traceEvents": [{"ph": "M", "name": "process_name", "pid": 1, "args": {}}]}).encode()),
    ("bad.json.gz", b"\x1f\x8b\x08\x00garbage"),
], ids=lambda v: v if isinstance(v, str) else "bytes")
def test_bad_trace_files_exit_2_with_one_line_and_leave_the_store_alone(tmp_path, capsys, name, content):
    good = tmp_path / "good.json"
    torch_profiler_trace(good)
    store = RunStore()
    first = import_trace(good, store=store)
    before = _store_snapshot(store)
    bad = tmp_path / name
    if content is None:
        data = good.read_bytes()
        content = data[: len(data) // 2]
    bad.write_bytes(content)
    code, out, err = opscope_main(capsys, "trace", "import", bad)
    assert code == 2, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("opscope: error:") and str(bad) in lines[0], err
    assert out == ""
    assert _store_snapshot(store) == before
    assert store.get_run(first)["events"] == before[0][0][1]


def test_files_over_the_size_limit_are_refused_before_reading(tmp_path, capsys, monkeypatch):
    trace = tmp_path / "big.json"
    torch_profiler_trace(trace)
    size = trace.stat().st_size
    code, _, err = opscope_main(capsys, "trace", "import", trace, "--max-bytes", size - 1)
    assert code == 2 and "over the import limit" in err and len(err.strip().splitlines()) == 1
    monkeypatch.setenv("OPSCOPE_IMPORT_MAX_BYTES", str(size // 2))
    code, _, err = opscope_main(capsys, "trace", "import", trace)
    assert code == 2 and "OPSCOPE_IMPORT_MAX_BYTES" in err
    assert RunStore().list_runs() == []
    code, out, err = opscope_main(capsys, "trace", "import", trace, "--max-bytes", size)
    assert code == 0 and RunStore().get_run(out.strip())["events"] > 0, err


class DiskFullStore(RunStore):
    """A store whose event write fails halfway: the import must not leave a run behind."""

    def add_event_columns(self, run_id, cols, **kw):
        half = {k: v[: len(v) // 2] for k, v in cols.items()}
        super().add_event_columns(run_id, half, **kw)
        raise OSError("No space left on device")


def test_a_failed_write_removes_the_partial_run(tmp_path):
    trace = tmp_path / "t.json"
    torch_profiler_trace(trace)
    store = DiskFullStore()
    with pytest.raises(StoreError, match="no space left on device"):    # one line for the user, exit 1
        import_trace(trace, store=store)
    assert store.list_runs() == [] and store.query("SELECT count(*) FROM events")[0][0] == 0


class StacksFailStore(RunStore):
    """A store whose stack write fails while the events are being written beside it (on a second connection)."""

    def add_stack_columns(self, run_id, cols, **kw):
        raise OSError("No space left on device")


def test_a_failed_details_write_waits_for_the_events_and_removes_them_too(tmp_path):
    trace = tmp_path / "t.json"
    torch.manual_seed(0)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], with_stack=True) as prof:
        TinyNet()(torch.randn(8, 16))
    prof.export_chrome_trace(str(trace))
    store = StacksFailStore()
    with pytest.raises(StoreError, match="no space left on device"):
        import_trace(trace, store=store)
    assert store.list_runs() == []
    assert [store.query(f"SELECT count(*) FROM {t}")[0][0] for t in ("events", "stacks", "spans")] == [0, 0, 0]


# --- GPU activity: a torch.profiler trace recorded with ProfilerActivity.CUDA, written by hand --------
# (no GPU here). The layout is Kineto's: host events on pid = the process, tid = the thread; GPU events
# on pid = the device, tid = the stream; a launch (cuda_runtime) and what it launched share
# args.correlation, and carry the External id of the cpu_op around the launch; ac2g flows link them.
T0_US = 1_700_000_000_000       # Kineto writes absolute microseconds with 3 decimals
HOST, STREAM = 4242, 7
SGEMM = "ampere_sgemm_32x32_sliced1x4_tn"
_GELU_FN = ("at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&, at::native::GeluType)::{lambda()#2}::"
            "operator()() const::{lambda()#2}::operator()() const::{lambda(float)#1}")
GELU = (f"void at::native::vectorized_elementwise_kernel<4, {_GELU_FN}, at::detail::Array<char*, 2> >"
        f"(int, {_GELU_FN}, at::detail::Array<char*, 2>)")
SOFTMAX = ("void (anonymous namespace)::softmax_warp_forward<float, float, float, 5, false, false>"
           "(float*, float const*, int, int, int, bool const*, int, bool)")
HTOD, DTOH, MEMSET = "Memcpy HtoD (Pageable -> Device)", "Memcpy DtoH (Device -> Pageable)", "Memset (Device)"

# what the import must make of the GPU side: (op, node, launching op, step, start us, dur us, bytes)
GPU_ROWS = [
    ("memcpy", HTOD, "aten::copy_", 0, 30, 8, 4096),
    ("kernel", SGEMM, "aten::addmm", 0, 95, 30, None),
    ("kernel", GELU, "aten::gelu", 0, 190, 4.5, None),
    ("kernel", SOFTMAX, "aten::_softmax", 0, 402.5, 7.5, None),   # launched in step 1, runs in step 2's window
    ("kernel", SGEMM, "aten::addmm", 1, 445, 30, None),
    ("memset", MEMSET, "aten::zero_", 1, 535, 1.5, 512),
    ("memcpy", DTOH, "aten::copy_", 1, 600, 1.25, 128),
]


def _x(cat, name, ts, dur, args, pid=HOST, tid=HOST):
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": T0_US + ts, "dur": dur, "args": args}


def _op(name, ext, ts, dur, dims=None):
    args = {"External id": ext, "Record function id": 0, "Ev Idx": ext - 1}
    if dims:
        args.update({"Input Dims": dims, "Input type": ["float"] * len(dims)})
    return _x("cpu_op", name, ts, dur, args)


def _launched(api, ts, dur, corr, ext, cat, name, gpu_ts, gpu_dur, **extra):
    """A launch on the host, the GPU work it queued on stream 7 of device 0, and the ac2g flow between them."""
    gpu_args = {"External id": ext, "queued": 0, "device": 0, "context": 1, "stream": STREAM, "correlation": corr}
    if cat == "kernel":
        gpu_args.update({"registers per thread": 32, "shared memory": 0, "blocks per SM": 0.5, "warps per SM": 4.0,
                         "grid": [66, 1, 1], "block": [128, 1, 1], "est. achieved occupancy %": 6})
    return [_x("cuda_runtime", api, ts, dur, {"cbid": 211, "correlation": corr, "External id": ext}),
            _x(cat, name, gpu_ts, gpu_dur, dict(gpu_args, **extra), pid=0, tid=STREAM),
            {"ph": "s", "id": corr, "pid": HOST, "tid": HOST, "ts": T0_US + ts, "cat": "ac2g", "name": "ac2g"},
            {"ph": "f", "id": corr, "pid": 0, "tid": STREAM, "ts": T0_US + gpu_ts, "cat": "ac2g", "name": "ac2g",
             "bp": "e"}]


def kineto_gpu_trace() -> dict:
    events = [
        {"name": "process_name", "ph": "M", "ts": T0_US, "pid": HOST, "tid": 0, "args": {"name": "python3"}},
        {"name": "thread_name", "ph": "M", "ts": T0_US, "pid": HOST, "tid": HOST,
         "args": {"name": f"thread {HOST} (python3)"}},
        {"name": "process_name", "ph": "M", "ts": T0_US, "pid": 0, "tid": 0, "args": {"name": "python3"}},
        {"name": "process_labels", "ph": "M", "ts": T0_US, "pid": 0, "tid": 0, "args": {"labels": "GPU 0"}},
        {"name": "thread_name", "ph": "M", "ts": T0_US, "pid": 0, "tid": STREAM, "args": {"name": "stream 7 "}},
        # step 1: copy the input in, linear, gelu, softmax, synchronize
        _x("user_annotation", "ProfilerStep#1", 0, 400, {"External id": 1, "Record function id": 0, "Ev Idx": 0}),
        _op("aten::to", 9, 5, 50), _op("aten::copy_", 10, 10, 40, [[8, 16], [8, 16]]),
        *_launched("cudaMemcpyAsync", 20, 25, 100, 10, "gpu_memcpy", HTOD, 30, 8, bytes=4096,
                   **{"memory bandwidth (GB/s)": 0.512}),
        _op("aten::linear", 11, 60, 100, [[8, 16], [32, 16], [32]]), _op("aten::t", 12, 62, 4, [[32, 16]]),
        _op("aten::addmm", 13, 70, 80, [[32], [8, 16], [16, 32]]),
        *_launched("cudaLaunchKernel", 80, 10, 101, 13, "kernel", SGEMM, 95, 30),
        _op("aten::gelu", 14, 170, 30, [[8, 32]]),
        *_launched("cudaLaunchKernel", 175, 10, 102, 14, "kernel", GELU, 190, 4.5),
        _op("aten::softmax", 15, 370, 29, [[8, 4]]), _op("aten::_softmax", 16, 375, 23, [[8, 4]]),
        *_launched("cudaLaunchKernel", 385, 10, 103, 16, "kernel", SOFTMAX, 402.5, 7.5),
        _x("cuda_runtime", "cudaStreamSynchronize", 399.25, 0.5, {"cbid": 131, "correlation": 104, "External id": 0}),
        _x("cuda_sync", "Stream Sync", 399.25, 11, {"cuda_sync_kind": "stream_synchronize", "stream": STREAM,
                                                   "device": 0, "correlation": 104}, pid=0, tid=STREAM),
        # step 2: linear, zero a buffer, copy the result out
        _x("user_annotation", "ProfilerStep#2", 400, 400, {"External id": 20, "Record function id": 0, "Ev Idx": 19}),
        _op("aten::linear", 21, 410, 90, [[8, 16], [32, 16], [32]]), _op("aten::t", 22, 412, 4, [[32, 16]]),
        _op("aten::addmm", 23, 420, 70, [[32], [8, 16], [16, 32]]),
        *_launched("cudaLaunchKernel", 430, 10, 201, 23, "kernel", SGEMM, 445, 30),
        _op("aten::zero_", 24, 510, 30, [[128]]),
        *_launched("cudaMemsetAsync", 515, 15, 202, 24, "gpu_memset", MEMSET, 535, 1.5, bytes=512,
                   **{"memory bandwidth (GB/s)": 0.341}),
        _op("aten::copy_", 25, 550, 150, [[8, 4], [8, 4]]),
        *_launched("cudaMemcpyAsync", 560, 130, 203, 25, "gpu_memcpy", DTOH, 600, 1.25, bytes=128,
                   **{"memory bandwidth (GB/s)": 0.102}),
        # the GPU timeline's copies of the step spans: not steps of their own
        _x("gpu_user_annotation", "ProfilerStep#1", 30, 380, {"External id": 1, "device": 0, "stream": STREAM},
           pid=0, tid=STREAM),
        _x("gpu_user_annotation", "ProfilerStep#2", 445, 156.25, {"External id": 20, "device": 0, "stream": STREAM},
           pid=0, tid=STREAM),
        {"name": "Record Window End", "ph": "i", "s": "g", "pid": "", "tid": "", "ts": T0_US + 800.5},
    ]
    return {"schemaVersion": 1,
            "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 85045379072,
                                  "computeMajor": 9, "computeMinor": 0, "maxThreadsPerBlock": 1024,
                                  "maxThreadsPerMultiprocessor": 2048, "regsPerBlock": 65536, "warpSize": 32,
                                  "sharedMemPerBlock": 49152, "numSms": 132}],
            "traceEvents": events, "traceName": "host_4242.1700000000000.pt.trace.json", "displayTimeUnit": "ms"}


def _write(tmp_path, name, doc):
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return path


def _ns(us):
    return T0_US * 1000 + round(us * 1000)


EVENT_COLS = ["step", "op", "node", "module", "backend", "device", "thread", "start_ns", "end_ns", "bytes"]


def _rows(store, rid):
    ev = store.events_frame(rid, columns=EVENT_COLS)
    return [dict(zip(EVENT_COLS, r)) for r in zip(*(ev[c].tolist() for c in EVENT_COLS))]


def test_kineto_gpu_kernels_and_copies_import_on_their_own_track(tmp_path):
    doc = kineto_gpu_trace()
    rid = import_trace(_write(tmp_path, "gpu.pt.trace.json", doc))
    store = RunStore()
    rows = _rows(store, rid)
    gpu = [r for r in rows if r["backend"] == "cuda"]
    # one track per device and stream, next to the host thread's
    assert {(r["backend"], r["device"], r["thread"]) for r in rows} == {("torch:cpu", "cpu", HOST),
                                                                       ("cuda", "cuda:0", STREAM)}
    got = sorted((r["op"], r["node"], r["module"], r["step"], r["start_ns"], r["end_ns"], r["bytes"] or None)
                 for r in gpu)
    assert got == sorted((op, node, module, step, _ns(ts), _ns(ts + dur), nbytes)
                         for op, node, module, step, ts, dur, nbytes in GPU_ROWS)

    # the host side is what it was: every cpu_op once, nothing else (no cudaLaunchKernel, no Stream Sync)
    cpu_ops = Counter(e["name"] for e in doc["traceEvents"] if e.get("cat") == "cpu_op")
    assert Counter(r["node"] for r in rows if r["backend"] == "torch:cpu") == cpu_ops
    assert {r["step"] for r in rows} == {0, 1}
    by_node = {r["key"]: r["count"] for r in store.op_stats(rid, by="node")}
    assert by_node == dict(cpu_ops + Counter(node for _, node, *_ in GPU_ROWS))

    run = store.get_run(rid)
    assert run["steps"] == 2                         # the GPU copies of ProfilerStep#N add no steps
    assert run["config"]["imported"] == {"cpu_op": 13, "kernel": 4, "gpu_memcpy": 2, "gpu_memset": 1}
    # every kind in the file is kept somewhere or listed as dropped: here only the global "Record Window End"
    assert run["config"]["import"]["kinds_kept"] == {"cpu_op": 13, "kernel": 4, "gpu_memcpy": 2, "gpu_memset": 1,
                                                     "user_annotation": 2, "cuda_runtime": 8, "cuda_sync": 1,
                                                     "gpu_user_annotation": 2, "ac2g": 14, "ph:M": 5}
    assert run["config"]["import"]["kinds_dropped"] == run["config"]["skipped"] == {"ph:i": 1}


def test_kineto_gpu_trace_keeps_launches_flows_kernel_args_and_stream_names(tmp_path):
    doc = kineto_gpu_trace()
    rid = import_trace(_write(tmp_path, "gpu.pt.trace.json", doc))
    store = RunStore()
    ev = _rows(store, rid)
    # launches (cudaLaunchKernel, cudaMemcpyAsync...) and the sync are spans on the host thread, not ops
    sp = store.spans_frame(rid)
    spans = sorted(zip(sp["kind"].tolist(), sp["name"].tolist(), sp["backend"].tolist(), sp["thread"].tolist()))
    assert spans.count(("cuda_runtime", "cudaLaunchKernel", "torch:cpu", HOST)) == 4
    assert ("cuda_sync", "Stream Sync", "cuda", STREAM) in spans
    assert ("gpu_user_annotation", "ProfilerStep#1", "cuda", STREAM) in spans
    assert ("user_annotation", "ProfilerStep#2", "torch:cpu", HOST) in spans
    # every ac2g arrow: from its launch on the host thread to the GPU event it queued, on stream 7
    fl = store.flows_frame(rid)
    assert len(fl["kind"]) == 7 and set(fl["kind"].tolist()) == {"ac2g"}
    by_start = {(r["step"], r["start_ns"]): r for r in ev}
    for i in range(7):
        assert (fl["from_backend"][i], fl["from_thread"][i]) == ("torch:cpu", HOST)
        assert (fl["to_backend"][i], fl["to_device"][i], fl["to_thread"][i]) == ("cuda", "cuda:0", STREAM)
        kernel = by_start[(fl["to_step"][i], fl["to_ns"][i])]
        assert kernel["backend"] == "cuda" and fl["from_ns"][i] < fl["to_ns"][i]
    # kernels carry their launch configuration, keyed like the events by (step, seq)
    assert len(store.kernel_args_frame(rid)["grid"]) == 7            # kernels, copies and the memset
    ka = store.query("SELECT grid, block, registers, shared_memory, occupancy, args FROM kernel_args "
                     "WHERE run_id = ? AND grid IS NOT NULL", [rid])
    assert len(ka) == 4
    grid, block, registers, smem, occupancy, args = ka[0]
    assert (json.loads(grid), json.loads(block), registers, smem, occupancy) == ([66, 1, 1], [128, 1, 1], 32, 0, 6)
    assert json.loads(args)["warps per SM"] == 4.0
    names = store.query("SELECT e.node FROM kernel_args k JOIN events e ON e.run_id = k.run_id AND e.step = k.step "
                        "AND e.seq = k.seq WHERE k.run_id = ? AND k.grid IS NOT NULL", [rid])
    assert sorted(n for n, in names) == sorted([SGEMM, GELU, SOFTMAX, SGEMM])
    # streams are named as streams
    tracks = store.get_run(rid)["config"]["import"]["tracks"]
    assert {"backend": "cuda", "device": "cuda:0", "thread": STREAM, "kind": "stream", "name": f"stream {STREAM}"} \
        in tracks
    assert any(t["kind"] == "thread" and t["thread"] == HOST for t in tracks)


def test_back_to_back_kernels_on_one_stream_stay_on_one_lane(tmp_path):
    """Kineto writes microseconds with 3 decimals; converted to ns, a kernel can start 1 ns before the
    previous one on its stream ended. A stream runs one kernel at a time: no depth lanes, ever."""
    doc = kineto_gpu_trace()
    kernels = [e for e in doc["traceEvents"] if e.get("cat") == "kernel"]
    base = kernels[0]
    for k in range(1, 40):        # 40 more kernels, each overlapping its predecessor by 1 ns
        doc["traceEvents"].append(dict(base, ts=base["ts"] + 100 + k * 2.5 - 0.001 * k, dur=2.5,
                                       args=dict(base["args"], correlation=9000 + k)))
    rid = import_trace(_write(tmp_path, "overlap.json", doc))
    store = RunStore()
    ev = store.events_frame(rid, columns=["backend", "depth", "start_ns", "end_ns"])
    gpu = [i for i, b in enumerate(ev["backend"].tolist()) if b == "cuda"]
    starts = sorted((ev["start_ns"][i], ev["end_ns"][i]) for i in gpu)
    assert any(b[0] < a[1] for a, b in zip(starts, starts[1:]))          # they do overlap after the rounding
    assert {int(ev["depth"][i]) for i in gpu} == {0}
    assert store.query("SELECT max(depth) FROM events WHERE run_id = ? AND backend = 'cuda'", [rid])[0][0] == 0


def _slow(doc):
    """The same trace with one time written as a string: the column parser hands it to the event-by-event one."""
    doc = json.loads(json.dumps(doc))
    sync = next(e for e in doc["traceEvents"] if e.get("name") == "cudaStreamSynchronize")
    sync["ts"] = str(sync["ts"])
    return doc


def test_kineto_gpu_trace_imports_the_same_with_either_parser(tmp_path):
    from opscope.profiler.importers import kineto
    doc = kineto_gpu_trace()
    kineto.parse_columns(doc["traceEvents"], None)                  # the fast one takes the trace as it is
    with pytest.raises(kineto.Irregular):
        kineto.parse_columns(_slow(doc)["traceEvents"], None)       # and leaves this one to the other
    store = RunStore()
    fast = import_trace(_write(tmp_path, "fast.json", doc))
    slow = import_trace(_write(tmp_path, "slow.json", _slow(doc)))
    assert _rows(store, fast) == _rows(store, slow)
    assert store.get_run(fast)["config"] == store.get_run(slow)["config"]
    assert store.op_stats(fast, by="node") == store.op_stats(slow, by="node")


@pytest.mark.parametrize("parser", ["columns", "events"])
def test_kernels_find_their_launching_op_without_external_ids(tmp_path, parser):
    """Writers that leave out External id: correlation -> the launch -> the innermost cpu_op around it."""
    doc = kineto_gpu_trace()
    for e in doc["traceEvents"]:
        if e.get("cat") != "cpu_op" and isinstance(e.get("args"), dict):
            e["args"].pop("External id", None)
    doc = _slow(doc) if parser == "events" else doc
    rid = import_trace(_write(tmp_path, "no_external_ids.json", doc))
    got = sorted((r["node"], r["start_ns"], r["module"], r["step"]) for r in _rows(RunStore(), rid)
                 if r["backend"] == "cuda")
    assert got == sorted((node, _ns(ts), module, step) for _, node, module, step, ts, _, _ in GPU_ROWS)


def test_a_gpu_only_trace_imports_its_kernels(tmp_path):
    """torch.profiler with ProfilerActivity.CUDA alone: no cpu_op at all, still a Kineto trace."""
    doc = kineto_gpu_trace()
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("cat") != "cpu_op"]
    rid = import_trace(_write(tmp_path, "gpu_only.json", doc))
    rows = _rows(RunStore(), rid)
    assert {r["backend"] for r in rows} == {"cuda"}
    got = sorted((r["node"], r["start_ns"], r["step"]) for r in rows)
    assert got == sorted((node, _ns(ts), step) for _, node, _, step, ts, _, _ in GPU_ROWS)


def test_odd_otherdata_and_categories_are_a_usage_error_or_import_not_a_traceback(tmp_path):
    from opscope.runtime.errors import UsageError
    ev = {"ph": "X", "name": "a", "ts": 1, "dur": 1}
    bad_t0 = tmp_path / "t0.json"
    bad_t0.write_text(json.dumps({"traceEvents": [ev], "otherData": {"opscope": 1, "t0_ns": "abc"}}))
    with pytest.raises(UsageError, match="t0_ns"):
        import_trace(bad_t0, store=RunStore())
    list_cat = tmp_path / "cat.json"           # a category that is a list: imported as written
    list_cat.write_text(json.dumps({"traceEvents": [dict(ev, cat=["x"])]}))
    store = RunStore()
    assert store.get_run(import_trace(list_cat, store=store))["events"] == 1


@pytest.mark.multiprocess
def test_the_written_out_aten_table_is_the_registrys(tmp_path):
    """profiler/importers/aten_table.py is generated from the op registry; a fresh process (no ops a test
    defined) must generate the same text, or the import names ops differently from the runtime."""
    import subprocess
    import sys
    from pathlib import Path

    import opscope.profiler.importers.aten_table as table
    fresh = subprocess.run([sys.executable, "-c", "from opscope.profiler.importers import names; "
                            "print(names.aten_table_source(), end='')"], capture_output=True, text=True, check=True)
    assert fresh.stdout == Path(table.__file__).read_text(), \
        "aten_table.py is stale: regenerate it with the command in its docstring"
    assert table.ATEN["aten.linear"] == "linear" and len(table.ATEN) > 300


@pytest.mark.multiprocess
@pytest.mark.slow
def test_an_import_needs_no_torch_and_leaves_no_cyclic_garbage(tmp_path, layer_trace):
    """A torch.profiler trace with Python stacks and memory, imported in a fresh process with the garbage
    collector off: torch is never imported (1.2 s), and nothing is left in a reference cycle -- a cycle
    holding the parse's events cost a full collection over all of them (3 s of a 1M-event import)."""
    import subprocess
    import sys
    trace = layer_trace(8)
    code = ("import gc, json, sys\n"
            "from opscope.profiler.importers import import_trace\n"
            "gc.collect(); gc.disable()\n"
            f"rid = import_trace({str(trace)!r})\n"
            "print(json.dumps({'torch': 'torch' in sys.modules, 'garbage': gc.collect()}))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env=dict(os.environ, OPSCOPE_HOME=str(tmp_path / "home")))
    got = json.loads(out.stdout.strip().splitlines()[-1])
    events = len(json.loads(trace.read_text())["traceEvents"])
    assert got["torch"] is False
    assert events > 2000 and got["garbage"] < 1000, got


def test_an_import_that_fails_while_writing_leaves_no_run_behind(tmp_path, monkeypatch):
    """The run is created, then its events, stacks and spans are written on one open store: a failure in
    the middle (here the spans' write) removes the run and whatever of it was written, and is told."""
    from opscope.profiler.importers import details
    trace = tmp_path / "trace.json"
    torch_profiler_trace(trace, steps=2, schedule=True)
    store = RunStore()

    def broken(*args, **kwargs):
        raise OSError("no space left on device")
    monkeypatch.setattr(details.Details, "write", broken)
    with pytest.raises(StoreError, match="no space left on device"):     # the store's one line for it
        import_trace(trace, store=store)
    assert store.list_runs() == []
    assert store.query("SELECT count(*) FROM events")[0][0] == 0
