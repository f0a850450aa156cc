"""A read-only SQL console over one run's tables: an SQL string is hostile input like any other.

    from opscope.profiler.sql import query
    out = query(run_id, "SELECT op, count(*) FROM events GROUP BY op")
    out["columns"], out["rows"], out["truncated"]

The query runs on the store's read-only connection (no file or network access, no extension installed or
loaded, store.py's _READ_ONLY), with the configuration then locked so the query cannot change it back. Each
table that has a run_id is seen as a temporary view of this run's rows, without the run_id column. One
statement, SELECT (WITH ... SELECT) or EXPLAIN only; at most `max_rows` rows come back (the query is wrapped in
a LIMIT, so a billion-row result is never built) and it is interrupted after `seconds`. Rows are fetched a few at a
time and counted as JSON as they come: once the next row would pass `max_bytes` (a few rows of huge cells,
repeat('x', 1e7)) no more are fetched and the answer says `truncated` with `truncated_by` "bytes".

query_in_child() runs the same query in a child process (the web console): DuckDB shares one instance, and its
settings, between the connections of a process, so in a process that also writes the store (`profile --web`'s
collector) a query would share the writer's settings (file access on) and lock them for the writer. The child
has its own instance, and is killed if the interrupt does not stop it.
"""
from __future__ import annotations

import json
import subprocess
import sys
import threading

from opscope.runtime.errors import UsageError

MAX_ROWS = 10_000
SECONDS = 10.0
MAX_ANSWER = 32 * 1024 ** 2     # bytes of JSON a child sends back: rows are bounded, a cell is not (repeat('x', 1e9))
_ALLOWED = ("SELECT", "EXPLAIN")
_ROOM = 64 * 1024                 # of MAX_ANSWER, for the answer's other fields (run, tables, ...)
_TOO_BIG = (f"sql: the answer is over {MAX_ANSWER // 1024 ** 2} MB of text; select fewer or shorter columns "
            f"(left(x, 100)), or fewer rows (a LIMIT)")


def query(run_id: str, sql: str, store=None, max_rows: int = MAX_ROWS, seconds: float = SECONDS,
          max_bytes: int = MAX_ANSWER) -> dict:
    """{columns, rows, truncated, truncated_by, tables} of `sql` over the run's tables; bad SQL raises UsageError
    (exit 2), and so does a first row over `max_bytes` of JSON (nothing could be shown)."""
    import duckdb

    from opscope.profiler.store import RunStore
    store = store or RunStore()
    run = store.get_run(run_id)
    with store.connect(read_only=True) as con:
        statement = _one_select(con, sql)
        tables = _views(con, run["run_id"])
        con.execute("SET lock_configuration = true")     # NOTE: after the views: nothing can undo the settings
        timer = threading.Timer(seconds, con.interrupt)
        timer.start()
        try:
            text = statement.query.rstrip().rstrip(";")
            if str(statement.type).endswith("SELECT"):
                text = f"SELECT * FROM ({text}) LIMIT {int(max_rows) + 1}"
            cur = con.execute(text)
            columns = [d[0] for d in cur.description or []]
            rows, cut = _bounded_rows(cur, int(max_rows), max_bytes - len(json.dumps(columns)) - _ROOM)
        except duckdb.InterruptException:
            raise UsageError(f"sql: the query ran past {seconds:g} s and was stopped; "
                             f"narrow it (a WHERE, a LIMIT) or ask for less") from None
        except duckdb.Error as e:
            raise UsageError(f"sql: {_one_line(e)}") from None
        finally:
            timer.cancel()
            con.interrupt()         # NOTE: a timer that fired after the last row must not hit the next query
    if cut == "bytes" and not rows:
        raise UsageError(_TOO_BIG)
    return {"run": run["run_id"], "columns": columns, "rows": rows, "truncated": cut is not None,
            "truncated_by": cut, "max_rows": max_rows, "max_bytes": max_bytes, "tables": tables}


def _bounded_rows(cur, max_rows: int, max_bytes: int) -> tuple[list, str | None]:
    """Rows while both bounds hold, and which bound cut them ("rows", "bytes" or None). Each row is counted as the
    JSON the child sends; rows are fetched in batches sized to what the bytes left allow, so a result of huge cells
    is fetched a row at a time and nothing past the bound is kept."""
    rows, size, batch = [], 2, 1          # the first row says how wide rows are
    while True:
        got = cur.fetchmany(batch)
        if not got:
            return rows, None
        for r in got:
            if len(rows) == max_rows:
                return rows, "rows"
            n = len(json.dumps(list(r), default=str)) + 2        # the row and its ", "
            if size + n > max_bytes:
                return rows, "bytes"
            rows.append(list(r))
            size += n
        mean = size / max(len(rows), 1)
        batch = int(max(1, min(2048, max_rows + 1 - len(rows), (max_bytes - size) / mean / 4)))


def _one_select(con, sql: str):
    import duckdb
    try:
        statements = con.extract_statements(sql)
    except duckdb.Error as e:
        raise UsageError(f"sql: {_one_line(e)}") from None
    if len(statements) != 1:
        raise UsageError(f"sql: give one statement, not {len(statements)}")
    kind = str(statements[0].type).rsplit(".", 1)[-1]
    if kind not in _ALLOWED:
        raise UsageError(f"sql: {kind} is refused: the console is read-only (SELECT, WITH ... SELECT or EXPLAIN)")
    return statements[0]


def _views(con, run_id: str) -> list[str]:
    """A temporary view per table with a run_id: that table, this run's rows (the name the user writes)."""
    db = con.execute("SELECT current_database()").fetchone()[0]
    names = [r[0] for r in con.execute(
        """SELECT table_name FROM information_schema.columns WHERE column_name = 'run_id'
           AND table_schema = 'main' AND table_catalog = current_database() ORDER BY 1""").fetchall()]
    for name in names:
        q = '"' + name.replace('"', '""') + '"'
        d = '"' + db.replace('"', '""') + '"'
        r = "'" + run_id.replace("'", "''") + "'"       # a view cannot take a parameter; the store's own id
        con.execute(f"CREATE TEMP VIEW {q} AS SELECT * EXCLUDE (run_id) FROM {d}.main.{q} WHERE run_id = {r}")
    return names


def _one_line(e: Exception) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    return text if len(text) <= 300 else text[:297] + "..."


def query_in_child(run_id: str, sql: str, store_path, max_rows: int = MAX_ROWS, seconds: float = SECONDS) -> dict:
    """query() in a child process of its own: the same answer, or UsageError with the same one line."""
    import duckdb
    with duckdb.connect(":memory:") as con:     # what is not one SELECT is refused here, without a process
        _one_select(con, sql)
    job = json.dumps({"run": run_id, "sql": sql, "store": str(store_path), "max_rows": int(max_rows),
                      "seconds": float(seconds)})
    try:
        done = subprocess.run([sys.executable, "-m", "opscope.profiler.sql"], input=job, capture_output=True,
                              text=True, timeout=seconds + 30)        # startup and the store's lock wait, then kill
    except subprocess.TimeoutExpired:
        raise UsageError(f"sql: the query ran past {seconds:g} s and was stopped; "
                         f"narrow it (a WHERE, a LIMIT) or ask for less") from None
    try:
        answer = json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise UsageError(f"sql: the query's process ended without an answer (exit {done.returncode}): "
                         f"{_one_line(Exception(done.stderr[-300:]))}") from None
    if "error" in answer:
        raise UsageError(answer["error"])
    return answer


def _child() -> int:
    """`python -m opscope.profiler.sql`: one job as JSON on stdin, one answer as JSON on stdout."""
    from opscope.profiler.store import RunStore
    from opscope.runtime.errors import OpscopeError
    job = json.loads(sys.stdin.read())
    try:
        out = query(job["run"], job["sql"], store=RunStore(job["store"]), max_rows=job["max_rows"],
                    seconds=job["seconds"])
    except OpscopeError as e:
        out = {"error": str(e)}
    text = json.dumps(out, default=str)      # a date, a decimal, a blob: as text
    if len(text) > MAX_ANSWER:               # NOTE: query() bounds the rows; this is the rest (a huge column name)
        text = json.dumps({"error": _TOO_BIG})
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(_child())
