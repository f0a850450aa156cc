"""Alert rules as data and `opscope monitor`: a sim chip's thermal model, a live multi-rank run."""
import json
import sys
import textwrap

import pytest

from opscope.profiler.alerts import AlertEngine, load_rules
from opscope.runtime.errors import UsageError

WARM = textwrap.dedent("""
    [backend]
    name = "warm"
    implementation = "sim"
    [hardware]
    peak_flops = { float32 = 1.0e10 }
    memory_bandwidth = 1.0e10
    [thermal]
    tdp = 300
    throttle_temperature = 90
    throttle_slowdown = 3
    heating_rate = 50
    ambient = 40
""")
HOT_RULE = textwrap.dedent("""
    [[alert]]
    id = "hot-test"
    metric = "temperature"
    condition = "value > 60"
    duration = 0.3
    severity = "critical"
    message = "{device.name} at {value:.0f} C above 60 C for {held:.1f} s"
""")


def _rules(tmp_path, text=HOT_RULE):
    path = tmp_path / "rules.toml"
    path.write_text(text)
    return path


def test_engine_fires_after_the_duration_once_per_episode(tmp_path):
    engine = AlertEngine(load_rules([_rules(tmp_path)], bundled=False))
    hot = {"temperature": 70.0}
    assert engine.observe(0.0, "chip", hot) == []
    assert engine.observe(0.2, "chip", hot) == []                      # held 0.2 s < 0.3 s
    [alert] = engine.observe(0.4, "chip", hot, {"name": "chip"})
    assert alert["rule"] == "hot-test" and alert["message"] == "chip at 70 C above 60 C for 0.4 s"
    assert engine.observe(0.8, "chip", hot) == []                      # once per episode
    assert engine.observe(1.0, "chip", {"temperature": 50.0}) == []    # cools: re-armed
    engine.observe(1.1, "chip", hot)
    assert len(engine.observe(1.5, "chip", hot)) == 1


@pytest.mark.parametrize("text, why", [
    ('[[alert]]\nid = "x"\nmetric = "warmth"\ncondition = "value > 1"\nmessage = "m"', "unknown metric 'warmth'"),
    ('[[alert]]\nid = "x"\nmetric = "power"\ncondition = "__import__(1)"\nmessage = "m"', "alert 'x'"),
    ('[[alert]]\nid = "x"\nmetric = "power"\ncondition = "voltage > 1"\nmessage = "m"', "unknown name 'voltage'"),
    ('[[alert]]\nid = "x"\nmetric = "power"\ncondition = "value > 1"\nmessage = "m"\nseverity = "dire"', "severity"),
    ('[[alert]]\nid = "x"\nmetric = "power"\nmessage = "m"', "condition is missing"),
    ('[alert]\nid = 1', "expected [[alert]]")])
def test_bad_rule_files_name_the_file_and_the_rule(tmp_path, text, why):
    with pytest.raises(UsageError, match=None) as e:
        load_rules([_rules(tmp_path, text)])
    assert why in str(e.value) and str(tmp_path) in str(e.value)


def test_bundled_rules_load():
    ids = {r.id for r in load_rules()}
    assert {"chip-hot", "chip-throttled", "power-over-tdp", "memory-high", "rank-slow", "events-dropped"} <= ids


# cli_process: the --exec hook's output goes to the command's own stderr (a file descriptor)
@pytest.mark.cli_process
@pytest.mark.multiprocess
def test_monitor_fires_on_a_sim_chips_temperature_and_hands_it_on(cli, tmp_path):
    chip = tmp_path / "warm.toml"
    chip.write_text(WARM)
    got = tmp_path / "got.json"
    hook = f"{sys.executable} -c \"import sys; open({str(got)!r}, 'a').write(sys.stdin.read() + chr(10))\""
    r = cli("monitor", "--device", chip, "--rules", _rules(tmp_path), "--interval", "0.1", "--duration", "1.5",
            "--exec", hook, "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    hot = [a for a in doc["alerts"] if a["rule"] == "hot-test"]
    assert len(hot) == 1 and hot[0]["subject"] == "sim:warm" and hot[0]["value"] > 60
    assert "sim:warm at" in hot[0]["message"] and "above 60 C" in hot[0]["message"]
    assert any(a["rule"] == "chip-throttled" for a in doc["alerts"])   # the bundled rule: 90 C reached
    assert doc["last"]["sim:warm"]["temperature"] > 90
    handed = [json.loads(line) for line in got.read_text().splitlines()]
    assert [a["rule"] for a in handed] == [a["rule"] for a in doc["alerts"]]


def test_a_sim_chip_heats_by_the_time_that_passed_not_by_the_polls_interval(tmp_path):
    """A loaded host polls late: the chip must have heated for the seconds the alert rules count (a rule's
    duration is on the monitor's clock), not for one nominal interval per poll."""
    import time

    from opscope.profiler.alerts.watch import SimChip
    chip = tmp_path / "warm.toml"
    chip.write_text(WARM)            # 50 C per second of busy time from 40 C, at load 1
    sim = SimChip(str(chip))
    [(_, first, _, _)] = sim.poll(0.1)
    time.sleep(0.5)                   # a poll 0.5 s late, asked for 0.1 s
    [(_, later, _, _)] = sim.poll(0.1)
    assert later["temperature"] - first["temperature"] >= 50 * 0.5 * 0.9


def test_monitor_on_a_run_names_the_slow_rank_and_stores_the_alert(cli):
    from opscope.profiler.store import RunStore
    store = RunStore()
    run_id = store.create_run(model="demo:mlp", backend="hybrid:a=0.5,b=0.5", engine="dist")
    steps = [{"step": i, "device_seconds": [0.010, 0.010 if i < 2 else 0.020]} for i in range(4)]
    store.update_run(run_id, config={"dist": {"backends": ["sim:a", "sim:b"], "steps": steps}})
    store.finish_run(run_id, "ok")
    r = cli("monitor", "--run", run_id, "--interval", "0.05", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    slow = [a for a in doc["alerts"] if a["rule"] == "rank-slow"]
    assert len(slow) == 1 and slow[0]["subject"] == "rank 1 (sim:b)" and "33.3% slower" in slow[0]["message"]
    assert doc["run_id"] == run_id
    kept = store.get_run(run_id)["config"]["alerts"]
    assert [a["rule"] for a in kept] == ["rank-slow"]


def test_monitor_bad_input_is_one_line_exit_2(cli, tmp_path):
    for args, why in ((["--interval", "0"], "--interval"), (["--rules", tmp_path / "none.toml"], "does not exist"),
                      (["--run", "nope"], "unknown run"), (["--device", "sim:nope"], "unknown sim backend")):
        r = cli("monitor", "--duration", "0", *args)
        assert r.returncode == 2 and why in r.stderr and "Traceback" not in r.stderr, (args, r.stderr)
