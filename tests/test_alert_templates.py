"""An alert message only substitutes known fields, checked when the rule file is read (issue 24).

Regression: `message = "{value / 'x'}"` loaded, then raised TypeError with a traceback the first time
the alert fired; `{x.__class__}`-style fields reached for attributes of the values.
"""
import pytest

from opscope.app.cli import main
from opscope.profiler.alerts import AlertEngine, load_rules
from opscope.profiler.alerts.rules import FIELDS
from opscope.runtime.errors import UsageError

RULE = '''[[alert]]
id = "x[/]y"
metric = "utilization"
condition = "value >= 0"
duration = 0
message = """{message}"""
'''

REFUSED = ["{value / 'x'}", "{x.__class__}", "{value.__class__}", "{device.__class__.__name__}", "{sample[0]}",
           "{device['name']}", "{value!r}", "{value:{width}}", "{pct(value / 2)}", "{len(device)}", "{}", "{0}",
           "{__import__}", "{voltage}", "at {value"]


@pytest.mark.parametrize("message", REFUSED)
def test_a_message_that_computes_or_reaches_is_refused_at_load_with_one_line(tmp_path, message, capsys):
    rules = tmp_path / "rules.toml"
    rules.write_text(RULE.format(message=message))
    with pytest.raises(UsageError, match=r"rules\.toml: alert 'x\[/\]y': message"):
        load_rules([rules])
    with pytest.raises(SystemExit) as e:            # the command: exit 2, one line, before any sample
        main(["monitor", "--rules", str(rules), "--duration", "0"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert str(rules) in err and "x[/]y" in err


@pytest.mark.parametrize("message, shown", [
    ("{device.name} at {value:.0%} for {held:.0f} s", "sim:chip at 50% for 0 s"),
    ("{ms(value)} vs {ms(median)}, {over_median:.1%} over; {sample.utilization:>6.2f}", "500.00 ms vs 400.00 ms, 25.0% over;   0.50"),
    ("{{literal}} {device.kind}", "{literal} npu"),
])
def test_known_fields_and_their_formats_are_substituted(tmp_path, message, shown):
    rules = tmp_path / "rules.toml"
    rules.write_text(RULE.format(message=message))
    engine = AlertEngine(load_rules([rules], bundled=False))
    fired = engine.observe(0.0, "sim:chip", {"utilization": 0.5},
                           device={"name": "sim:chip", "kind": "npu", "tdp": 0, "throttle_temperature": 0},
                           extra={"median": 0.4})
    assert [a["message"] for a in fired] == [shown]


def test_the_bundled_rules_use_only_known_fields():
    assert load_rules()                              # loads: every bundled message passes the same check
    assert {"value", "device.name", "over_median", "sample.temperature"} <= FIELDS
