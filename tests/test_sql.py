"""`opscope sql RUN "..."` (issue 38, item 5): a query over one run's tables returns its rows; an SQL string is
hostile input, so writing, reading files, attaching, installing, a query that never ends and a billion-row
result are each refused or bounded, in one line, never a traceback."""
import json

import pytest

from opscope.profiler.store import RunStore

from test_web_totals import ev, make_run


@pytest.fixture
def two_runs(opscope_home):
    store = RunStore()
    mine = make_run(store, [ev(0, "linear", 0, 1000), ev(1, "relu", 1000, 1500), ev(2, "linear", 1500, 2500)])
    other = make_run(store, [ev(0, "gelu", 0, 10)])
    return mine, other


def test_a_query_sees_only_its_runs_rows(cli, two_runs):
    mine, _other = two_runs
    r = cli("sql", mine, "SELECT op, count(*) AS n, sum(end_ns - start_ns) AS ns FROM events GROUP BY op ORDER BY op",
            "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["columns"] == ["op", "n", "ns"] and doc["rows"] == [["linear", 2, 2000], ["relu", 1, 500]]
    assert doc["truncated"] is False and "events" in doc["tables"]
    text = cli("sql", mine, "SELECT op FROM events WHERE op = 'relu'")
    assert text.returncode == 0 and "relu" in text.stdout


@pytest.mark.parametrize("sql, says", [
    ("COPY (SELECT 1) TO '/tmp/opscope-sql-test.csv'", "COPY is refused"),
    ("ATTACH '/tmp/opscope-sql-test.db'", "ATTACH is refused"),
    ("SELECT * FROM read_csv('/etc/passwd')", "file system operations are disabled"),
    ("INSTALL httpfs", "is refused"),
    ("LOAD httpfs", "is refused"),
    ("SET enable_external_access = true", "is refused"),
    ("SELECT 1; SELECT 2", "one statement"),
    ("DELETE FROM events", "is refused"),
    ("SELECT count(*) FROM range(100000000000)", "ran past 1 s"),
])
def test_hostile_sql_is_refused_in_one_line(cli, two_runs, sql, says):
    r = cli("sql", two_runs[0], sql, "--timeout", "1")
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0] and "Traceback" not in r.stderr


def test_a_billion_row_result_is_cut_at_max_rows(cli, two_runs):
    r = cli("sql", two_runs[0], "SELECT * FROM range(1000000000)", "--max-rows", "5", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["rows"] == [[0], [1], [2], [3], [4]] and doc["truncated"] is True


def test_rows_stop_once_their_json_reaches_the_bound_while_they_are_fetched(cli, two_runs):
    from opscope.profiler.sql import query
    from opscope.runtime.errors import UsageError
    # 1,000 rows of ~1 kB each: ~20 fit in 20 kB; each kept row is one of the query's first rows, in order
    out = query(two_runs[0], "SELECT i, repeat('x', 1000) AS x FROM range(1000) t(i)", max_bytes=20_000 + 64 * 1024)
    n = len(out["rows"])
    assert out["truncated"] is True and out["truncated_by"] == "bytes" and 10 <= n < 1000
    assert [r[0] for r in out["rows"]] == list(range(n)) and len(json.dumps(out["rows"])) <= 20_000
    small = query(two_runs[0], "SELECT i FROM range(10) t(i)", max_bytes=20_000 + 64 * 1024)
    assert small["truncated"] is False and small["truncated_by"] is None and len(small["rows"]) == 10
    with pytest.raises(UsageError, match="the answer is over 32 MB"):     # not even the first row fits: refused
        query(two_runs[0], "SELECT repeat('x', 100000) AS x", max_bytes=80_000)
    # the CLI at its real bound (32 MB): 40 rows of 1 MB are cut, printed with a note saying why
    r = cli("sql", two_runs[0], "SELECT i, repeat('x', 1000000) AS x FROM range(40) t(i)", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["truncated_by"] == "bytes" and 20 <= len(doc["rows"]) < 40 and len(r.stdout) < 33 * 1024 ** 2


def test_bad_limits_and_unknown_runs_are_one_line(cli, two_runs):
    for args in (("--max-rows", "0"), ("--timeout", "0"), ("--timeout", "601")):
        r = cli("sql", two_runs[0], "SELECT 1", *args)
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    r = cli("sql", "nope", "SELECT 1")
    assert r.returncode == 2 and "unknown run" in r.stderr
