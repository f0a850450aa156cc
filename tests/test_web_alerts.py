"""The header's alert banner: the most severe alert of the shown run (or of the live run) with its message, on
every page; in Chromium, an alert that `opscope monitor` fired on a sim chip's temperature."""
import json
import shutil

import pytest

from opscope.app.web import components as ui
from opscope.app.web.server import create_app, start_in_thread
from opscope.profiler.store import RunStore

from test_alerts import HOT_RULE, WARM
from test_web_ranks import _callback, text_of
from test_web_security import a_run

PAGES = ["/", "/timeline", "/operators", "/memory", "/ranks", "/compare", "/tensors", "/hardware", "/advisor",
         "/optimize"]


def _banner(app, rid):
    body = _callback(app, "alert-banner", {"run": rid, "status": "ok", "events": 6, "dropped": 0})
    return json.loads(body)["response"]["alert-banner"]["children"]


def _alert(rule, severity, message, t=1.0):
    return {"time": t, "rule": rule, "severity": severity, "metric": "temperature", "subject": "sim:warm",
            "value": 70.0, "message": message}


def test_the_banner_shows_the_most_severe_alert_and_counts_the_rest(opscope_home):
    store = RunStore()
    rid = a_run(store)
    store.update_run(rid, config={"alerts": [_alert("power-over-tdp", "warning", "power 310 W over TDP", 0.5),
                                             _alert("hot-test", "critical", "sim:warm at 70 C above 60 C", 1.0),
                                             _alert("memory-high", "info", "memory at 91%", 2.0)]})
    shown = _banner(create_app(store=store), rid)
    text = text_of(shown)
    assert text.startswith("criticalhot-testsim:warm at 70 C above 60 C") and "+2 more alerts" in text
    assert shown["props"]["className"] == "alert alert-critical"
    assert "power 310 W over TDP" in shown["props"]["title"]          # every alert on hover


def test_no_alerts_no_banner_and_the_live_runs_alerts_show_on_any_run(opscope_home):
    store = RunStore()
    quiet, live = a_run(store), a_run(store)
    store.update_run(live, config={"alerts": [_alert("hot-test", "critical", "chip too hot")]})
    assert _banner(create_app(store=store), quiet) is None
    shown = _banner(create_app(store=store, live=live), quiet)       # `profile --web`: the live run's alerts
    assert "chip too hot" in text_of(shown) and f"live run {live}" in text_of(shown)


def test_the_worst_alert_is_the_latest_of_the_worst_severity():
    alerts = [_alert("a", "warning", "w", 5.0), _alert("b", "critical", "c1", 1.0), _alert("c", "critical", "c2", 2.0)]
    assert ui.most_severe(alerts)["rule"] == "c" and ui.most_severe([]) is None
    assert ui.alert_banner([]) is None


@pytest.mark.browser
@pytest.mark.multiprocess
@pytest.mark.slow
def test_in_a_browser_a_sim_chips_temperature_alert_shows_in_the_banner_of_every_page(cli, tmp_path):
    if not shutil.which("chromium") or not shutil.which("chromedriver"):
        pytest.skip("needs chromium and chromedriver")
    from test_web_browser import wait_text

    from opscope.app.web.browser import headless_chromium
    store = RunStore()
    rid = store.create_run(model="demo:mlp", backend="torch:cpu", device="cpu")     # a run still running
    (tmp_path / "warm.toml").write_text(WARM)
    (tmp_path / "hot.toml").write_text(HOT_RULE)
    # NOTE: a 0.5 s interval heats the chip past 60 C at the first poll (40 C + 50 C/s x 0.5 s), so the next poll,
    # 0.5 s on at the least, sees the rule's 0.3 s held whatever the load; at 0.1 s a first poll slowed past 1.5 s
    # by a loaded host left one more poll, which saw the condition start, and none to see it held.
    r = cli("monitor", "--run", rid, "--device", tmp_path / "warm.toml", "--rules", tmp_path / "hot.toml",
            "--interval", "0.5", "--duration", "1.5", "--json")
    assert r.returncode == 0, r.stderr
    store.finish_run(rid, "ok")
    fired = json.loads(r.stdout)["alerts"]
    assert any(a["rule"] == "hot-test" for a in fired)
    worst = ui.most_severe(fired)          # hot-test, or the bundled chip-throttled once the chip passed 90 C
    assert worst["severity"] == "critical" and worst["metric"] == "temperature" and worst["subject"] == "sim:warm"
    srv, url = start_in_thread(create_app(store=store))
    driver = headless_chromium(str(tmp_path / "chrome"))
    try:
        for page in PAGES:
            driver.get(f"{url}{page}?run={rid}")
            wait_text(driver, "alert-banner", worst["message"])
            banner = driver.execute_script("return document.getElementById('alert-banner').innerText")
            assert "critical" in banner and worst["rule"] in banner and "sim:warm" in banner, (page, banner)
            if len(fired) > 1:
                assert f"+{len(fired) - 1} more alert" in banner, banner
        severe = [e["message"] for e in driver.get_log("browser") if e.get("level") == "SEVERE"]
        assert not severe, severe
    finally:
        driver.quit()
        srv.shutdown()


def test_the_callbacks_on_a_status_take_the_row_its_lookup_read_and_a_new_lookup_reads_alerts_again(opscope_home):
    """The header's lookup (RUN_STATUS) reads the run's row; the badge, the banner and the page's callbacks that fire
    on that status take that row instead of each opening the store again (each open held the store's process lock,
    so a first visit's callbacks queued behind each other). An alert written after it shows with the next lookup."""
    store = RunStore()
    rid = a_run(store)
    app = create_app(store=store)
    status = json.loads(_callback(app, "run-status.data", f"?run={rid}"))["response"]["run-status"]["data"]
    assert status["run"] == rid
    reads = []
    real = store.get_run
    store.get_run = lambda *a, **k: reads.append(a) or real(*a, **k)
    assert _banner_for(app, status) is None and f'"{rid[:12]}"' in _callback(app, "run-badge", status)
    assert reads == []                                        # both took the lookup's row
    store.update_run(rid, config={"alerts": [_alert("hot-test", "critical", "chip too hot")]})
    status = json.loads(_callback(app, "run-status.data", f"?run={rid}"))["response"]["run-status"]["data"]
    assert "chip too hot" in text_of(_banner_for(app, status))
    other = {**status, "events": status["events"] + 1}      # a status the live poll made: no row looked up for it
    reads.clear()
    assert "chip too hot" in text_of(_banner_for(app, other)) and reads


def _banner_for(app, status):
    return json.loads(_callback(app, "alert-banner", status))["response"]["alert-banner"]["children"]
