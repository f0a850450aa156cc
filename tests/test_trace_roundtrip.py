"""A torch.profiler trace survives `opscope trace import` then `opscope trace export`, field by field (issue 38):
process and thread metadata, pids and tids, Python frame names, memory events' Addr / Total Reserved / Total
Allocated, and ops' args (Input Strides, Concrete Inputs, scalar inputs, External id, Sequence number)."""
import json
from collections import Counter

import pytest

from torch_traces import record_training


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    return record_training(tmp_path_factory.mktemp("roundtrip") / "train.json", steps=2)


def _by_kind(doc):
    ev = doc["traceEvents"]
    return {"meta": [e for e in ev if e.get("ph") == "M"],
            "ops": [e for e in ev if e.get("ph") == "X" and e.get("cat") == "cpu_op"],
            "frames": [e for e in ev if e.get("ph") == "X" and e.get("cat") == "python_function"],
            "memory": [e for e in ev if e.get("name") == "[memory]"],
            "annotations": [e for e in ev if e.get("ph") == "X" and e.get("cat") == "user_annotation"]}


def _key(e):
    return e["name"], e["tid"], round(float(e["ts"]) * 1000)


def test_an_imported_torch_profiler_trace_exports_field_by_field_as_it_came(trace, cli, tmp_path):
    r = cli("trace", "import", trace, "--json")
    assert r.returncode == 0, r.stderr
    rid = json.loads(r.stdout)["run_id"]
    out = tmp_path / "again.json"
    r = cli("trace", "export", rid, "-o", str(out), "--json")
    assert r.returncode == 0, r.stderr
    a, b = (_by_kind(json.loads(open(p).read())) for p in (trace, out))

    # process and thread names, labels and sort indexes: the metadata events as written
    canon = (lambda es: sorted(json.dumps(e, sort_keys=True) for e in es))
    assert a["meta"] and canon(a["meta"]) == canon(b["meta"])
    assert {e["name"] for e in a["meta"]} >= {"process_name", "thread_name"}

    # every op: same pid, tid, start, duration and args (strides, concrete and scalar inputs, ids)
    ours = {}
    for e in b["ops"]:
        ours.setdefault(_key(e), []).append(e)
    assert len(a["ops"]) == len(b["ops"]) > 100
    scalars = 0
    for e in a["ops"]:
        got = ours[_key(e)].pop(0)
        assert (got["pid"], got["tid"], round(got["dur"] * 1000)) == (e["pid"], e["tid"], round(e["dur"] * 1000)), e
        assert got["args"] == e["args"], e["name"]
        scalars += "Scalar" in e["args"].get("Input type", [])
    assert scalars > 0            # the trace has scalar inputs (AdamW's lr, add's alpha): they came back
    assert any("Sequence number" in e["args"] for e in a["ops"])
    assert all({"External id", "Input Strides", "Concrete Inputs"} <= set(e["args"]) for e in b["ops"]
               if "Input Dims" in e["args"])

    # Python frames: every name (path, line, function) on its thread and pid, at its time
    frames = (lambda es: Counter((e["name"], e["pid"], e["tid"], round(e["ts"] * 1000)) for e in es))
    assert a["frames"] and frames(a["frames"]) == frames(b["frames"])

    # memory events: Addr pairs an allocation with its free; Total Reserved and Total Allocated as written
    mem = (lambda es: sorted((round(e["ts"] * 1000), e["pid"], e["tid"], json.dumps(e["args"], sort_keys=True))
                             for e in es))
    assert a["memory"] and mem(a["memory"]) == mem(b["memory"])
    assert all({"Addr", "Total Reserved", "Total Allocated"} <= set(e["args"]) for e in b["memory"])

    # record_function annotations keep their pid and args too
    note = (lambda es: sorted((e["name"], e["pid"], e["tid"], json.dumps(e.get("args"), sort_keys=True)) for e in es))
    assert note(a["annotations"]) == note(b["annotations"])


def test_the_export_imports_again_to_the_same_ops(trace, cli, tmp_path):
    rid = json.loads(cli("trace", "import", trace, "--json").stdout)["run_id"]
    out = tmp_path / "again.json"
    assert cli("trace", "export", rid, "-o", str(out)).returncode == 0
    r = cli("trace", "import", str(out), "--json")
    assert r.returncode == 0, r.stderr
    again = json.loads(r.stdout)["run_id"]
    from opscope.profiler.store import RunStore
    store = RunStore()
    q = "SELECT node, thread, start_ns, end_ns, input_shapes FROM events WHERE run_id = ? ORDER BY ALL"
    assert store.query(q, [rid]) == store.query(q, [again])


def test_a_tampered_extras_artifact_is_read_as_hostile_and_the_export_still_works(trace, cli, tmp_path,
                                                                                   monkeypatch):
    import zlib

    from opscope.profiler.importers.extras import KIND, Extras
    from opscope.profiler.lifetimes import lifetimes
    from opscope.profiler.store import RunStore
    rid = json.loads(cli("trace", "import", trace, "--json").stdout)["run_id"]
    store = RunStore()
    (name, blob), = [(n, b) for _k, n, b in store.artifacts(rid, KIND)]
    memory = Extras.load(store, rid).memory()
    assert memory and lifetimes(store, store.get_run(rid)) is not None     # the kept [memory] args pair
    doc = json.loads(zlib.decompress(blob))
    doc["args"][:0] = [["aten::mm", "x", 1, 0, "{}"], ["[memory]", 1, 1.5, 0, "{}"], [1, 2], "row",
                       ["[memory]", 1, 2, 0, "not json"], ["[memory]", 1, 3, 0, "[1]"], ["aten::mm", 1, 4, 0, 7]]
    doc["pids"] += [["a", 1], [1], 5]
    doc["meta"] += [1, "x"]
    doc["frames"]["f (x.py:1)"] = 3
    bad = {"wrong rows": zlib.compress(json.dumps(doc).encode()), "not zlib": b"garbage",
           "not an object": zlib.compress(b"[1, 2]"), "a bomb": zlib.compress(b" " * 5_000_000)}
    for what, data in bad.items():
        if what == "a bomb":          # bigger than the import's limit once decompressed: not read
            monkeypatch.setenv("OPSCOPE_IMPORT_MAX_BYTES", "1000000")
        with store.connect() as con:
            con.execute("UPDATE artifacts SET data = ? WHERE run_id = ? AND kind = ?", [data, rid, KIND])
        x = Extras.load(store, rid)
        assert (x is not None) == (what == "wrong rows"), what
        if x is not None:
            assert x.memory() == memory and all(type(p) is int for p in x._pids.values())
        lifetimes(store, store.get_run(rid))
        out = tmp_path / "again.json"
        r = cli("trace", "export", rid, "-o", str(out), "--json")
        assert r.returncode == 0 and "Traceback" not in r.stderr, (what, r.stderr)
        ops = [e for e in json.loads(out.read_text())["traceEvents"] if e.get("cat") == "cpu_op"]
        assert ops and all(type(e["pid"]) is int and type(e["tid"]) is int for e in ops), what


def test_the_flame_tree_of_a_recorded_trace_never_gives_a_share_over_100(trace, cli):
    """The flame graph's invariants over a trace torch.profiler recorded (its Python stacks and its op nesting),
    not over hand-made spans: a child never outgrows its parent, self times are never negative and add up to the
    whole, and no share of the heaviest table passes 100 %."""
    from opscope.app.pages.flame import heaviest_table
    from opscope.profiler.flame import flame_tree, heaviest
    from opscope.profiler.store import RunStore
    rid = json.loads(cli("trace", "import", trace, "--json").stdout)["run_id"]
    for kind in ("stacks", "ops"):
        t = flame_tree(RunStore(), rid, kind)
        assert t["root_total"] > 0 and len(t["name"]) > 10 and t["left_out"] == 0, kind
        for i, up in enumerate(t["parent"]):
            assert t["self"][i] >= 0
            if up >= 0:
                assert t["total"][i] <= t["total"][up] * (1 + 1e-9), (kind, t["name"][i])
        assert sum(t["self"]) == pytest.approx(t["root_total"], rel=1e-6), kind
        assert all(r["total"] <= t["root_total"] * (1 + 1e-9) for r in heaviest(t)), kind
        grid = heaviest_table(t, kind, "wall clock").children[1]
        rows = grid.rowData if hasattr(grid, "rowData") else grid.children.rowData
        assert rows and all(r["self_pct"] <= 100 and r["total_pct"] <= 100 for r in rows), kind


def test_a_recorded_trace_with_ids_and_args_past_int64_imports_and_exports_its_other_events_as_they_came(
        trace, cli, tmp_path):
    """The trace extras keep what orjson can write (int64): a recorded trace with one op's thread id, another's
    arg and a metadata event's pid past int64 (a trace may write any JSON number) imports and exports, the
    events the change did not touch field by field as recorded, the touched ones as the store has them."""
    doc = json.loads(open(trace).read())
    ops = [e for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "cpu_op"]
    far_tid, far_arg = ops[len(ops) // 3], ops[2 * len(ops) // 3]
    far_tid["tid"] = 2 ** 64 + 5
    far_arg["args"]["Record function id"] = 2 ** 70
    doc["traceEvents"].append({"ph": "M", "name": "process_name", "pid": 2 ** 70, "tid": 0, "args": {"name": "far"}})
    path = tmp_path / "far.json"
    path.write_text(json.dumps(doc))
    r = cli("trace", "import", str(path), "--json")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    rid = json.loads(r.stdout)["run_id"]
    out = tmp_path / "again.json"
    r = cli("trace", "export", rid, "-o", str(out), "--json")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    b = _by_kind(json.loads(out.read_text()))
    ours = {}
    for e in b["ops"]:
        ours.setdefault(_key(e), []).append(e)
    assert len(b["ops"]) == len(ops)
    for e in ops:
        if e is far_tid or e is far_arg:       # exported, from the store's columns
            assert any(k[0] == e["name"] and k[2] == round(e["ts"] * 1000) for k in ours)
            continue
        got = ours[_key(e)].pop(0)
        assert (got["pid"], got["args"]) == (e["pid"], e["args"]), e["name"]
    assert all(type(e["pid"]) is int and -2 ** 63 <= e["pid"] < 2 ** 63 for e in b["ops"])
    # Kineto's own metadata names a pid "Spans"; what is a number is one the store and the exporter can hold
    assert not [e for e in b["meta"] if type(e["pid"]) is int and not -2 ** 63 <= e["pid"] < 2 ** 63]
