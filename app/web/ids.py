"""Component ids, in one place so pages, callbacks, tests and assets/timeline.js agree."""

URL = "url"                          # dcc.Location of the shell (query string: ?run=ID&b=ID)
NAV = "nav"                          # the page links in the header; their hrefs keep ?run=
RUN_BADGE = "run-badge"              # header: which run, its status, events arrived / dropped
LIVE_TICK = "live-tick"              # dcc.Interval: polls while a run streams
PAGE_ERROR = "page-error"            # the shell's one line for a server failure no page element could show
RUN_ID = "run-id"                    # dcc.Store: the run this page shows (an id, never data)

# runs
RUNS_TABLE = "runs-table"
RUNS_ACTIONS = "runs-actions"
RUNS_STEPS = "runs-steps"            # the picked run's steps: count, time per step, slowest step

# timeline
TL_GRAPH = "timeline-graph"
TL_DETAILS = "timeline-details"
TL_STEP = "timeline-step"
TL_INFO = "timeline-info"
TL_FIND = "timeline-find"
TL_VIEW = "timeline-view"            # dcc.Store: what the canvas shows: {run, stamp, step, find}; timeline.js follows it
TL_PICKED = "timeline-picked"        # dcc.Store: the clicked span [key0, key1, us] (timeline.js sets it)
TL_FORWARD = "timeline-forward"      # the details' "backward of NODE" link: a click selects the forward op
TL_FORWARD_TARGET = "timeline-forward-target"   # dcc.Store: that op's {key, start, end} on the canvas's axis

# operators
OPS_GROUP = "ops-group"
OPS_TABLE = "ops-table"
OPS_ROOFLINE = "ops-roofline"
OPS_DETAIL = "ops-detail"
OPS_FIND = "ops-find"                # the detail's link to the timeline, searching for the op

# memory
MEM_GRAPH = "memory-graph"
MEM_TABLE = "memory-table"

# compare
CMP_A = "compare-a"
CMP_B = "compare-b"
CMP_SUMMARY = "compare-summary"
CMP_GRAPH = "compare-graph"
CMP_TABLE = "compare-table"
CMP_ERROR = "compare-error"
CMP_SHOWN = "compare-shown"          # the two runs the page's layout already drew (compare.layout)
CMP_URL = "compare-url"              # a clientside callback writes the picked runs into the address bar

# tensors
TEN_TABLE = "tensors-table"
TEN_STATS = "tensors-stats"
TEN_HIST = "tensors-hist"
TEN_FIRST_BAD = "tensors-first-bad"

# hardware
HW_GRAPH = "hardware-graph"

# advisor
ADV_LIST = "advisor-list"
RUN_STATUS = "run-status"            # dcc.Store: {run, status, events, dropped} of the shown run; pages listen

# header: the alert banner (the most severe alert of the shown run, or of the live run)
ALERT_BANNER = "alert-banner"

# ranks
RANKS_SUMMARY = "ranks-summary"      # world size, the slow rank, per-rank totals
RANKS_GRAPH = "ranks-graph"          # per rank and step: compute / overlap / communication / idle, stacked

# optimize
OPT_CHART = "optimize-chart"         # per cycle: estimated vs measured gain
OPT_CYCLES = "optimize-cycles"       # per cycle: the pass, why it was kept or not, a link to its run

# sql (app/pages/sql.py)
SQL_TEXT = "sql-text"                # the query
SQL_RUN = "sql-run"                  # its button
SQL_OUT = "sql-out"                  # one line, then the rows
SQL_GRID = "sql-grid"
SQL_TABLES = "sql-tables"            # the tables a query can read, with their columns

# flame graph (app/pages/flame.py)
FLAME_KIND = "flame-kind"            # Python stacks or op nesting
FLAME_STEP = "flame-step"
FLAME_DATA = "flame-data"            # dcc.Store: the merged call tree, drawn by assets/flame.js
FLAME_GRAPH = "flame-graph"          # where the canvas goes
FLAME_TABLE = "flame-table"          # the heaviest frames by self time

# timeline tools (app/pages/timeline_tools.py)
TL_AREA = "timeline-area"            # dcc.Store: {run, t0, t1, tracks} of an area selection (assets/timeline_tools.js)
TL_AREA_OUT = "timeline-area-out"    # its summary table

# memory: allocations paired with frees (app/pages/lifetimes.py)
MEM_LIFETIMES = "memory-lifetimes"
MEM_SITES = "memory-sites"           # peak and leaks by call site
