"""The run store's tables (DuckDB). Every tool reads runs through these names.

Times are integers in nanoseconds on the runner's monotonic clock (time.perf_counter_ns, or the
simulated device clock for sim backends). Shapes and dtypes are JSON text: '[[2,128,256]]'.
"""

SCHEMA_VERSION = 3     # 2: events gained phase, fwd_node, rank, world_size (training, multi-rank runs)
                       # 3: parent, clock (a compiler stack's per-op spans inside a region)

# Columns added to events after stores existed: name -> (type, default). A writer adds them to an older
# store (MIGRATIONS); a reader of a store it cannot upgrade reads them as their default.
ADDED_EVENT_COLUMNS = {
    "phase": ("VARCHAR", "'forward'"),      # forward | backward | optimizer
    "fwd_node": ("VARCHAR", "''"),          # the forward node a backward op differentiates
    "rank": ("INTEGER", "0"),               # this process's rank, and how many there are
    "world_size": ("INTEGER", "1"),
    # A compiler stack's per-op span inside a region (depth 1): `parent` is the region event's node, `clock`
    # the profiler its times came from ("onnxruntime profiler"); '' for an op opscope timed itself
    "parent": ("VARCHAR", "''"),
    "clock": ("VARCHAR", "''"),
}

DDL = [
    """CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT)""",
    """CREATE TABLE IF NOT EXISTS runs (
        run_id TEXT PRIMARY KEY,
        model TEXT, backend TEXT, device TEXT, engine TEXT,      -- engine: graph | eager | import
        description_hash TEXT, description TEXT,                 -- the backend description, JSON
        status TEXT,                                             -- running | ok | failed
        error TEXT,
        started_at DOUBLE, ended_at DOUBLE,                      -- wall clock, epoch seconds
        host TEXT, versions TEXT,                                -- JSON: python, torch, numpy, opscope
        steps INTEGER, warmup INTEGER,
        events BIGINT DEFAULT 0, dropped BIGINT DEFAULT 0,
        config TEXT,                                             -- JSON: flags, knobs, what advise changed
        parent_run TEXT,                                         -- the run an `advise --apply` started from
        source TEXT                                              -- imported file, for engine = import
    )""",
    """CREATE TABLE IF NOT EXISTS events (
        run_id TEXT, step INTEGER, seq INTEGER,
        op TEXT, node TEXT, module TEXT, source TEXT,
        backend TEXT, device TEXT, thread BIGINT, depth INTEGER,
        start_ns BIGINT, end_ns BIGINT,
        input_shapes TEXT, input_dtypes TEXT, output_shapes TEXT, output_dtypes TEXT,
        bytes BIGINT, flops BIGINT, fallback BOOLEAN, live_bytes BIGINT,
        phase VARCHAR DEFAULT 'forward', fwd_node VARCHAR DEFAULT '',
        rank INTEGER DEFAULT 0, world_size INTEGER DEFAULT 1
    )""",
    """CREATE TABLE IF NOT EXISTS memory (
        run_id TEXT, step INTEGER, seq INTEGER, t_ns BIGINT, backend TEXT,
        live_bytes BIGINT, alloc_bytes BIGINT, free_bytes BIGINT
    )""",
    """CREATE TABLE IF NOT EXISTS tensors (
        run_id TEXT, step INTEGER, seq INTEGER, slot TEXT,       -- slot: in0, in1, out0 ...
        shape TEXT, dtype TEXT, count BIGINT,
        min DOUBLE, max DOUBLE, mean DOUBLE, std DOUBLE, nan BIGINT, inf BIGINT,
        hist TEXT, hist_lo DOUBLE, hist_hi DOUBLE                -- hist: JSON list of bin counts
    )""",
    """CREATE TABLE IF NOT EXISTS hardware (
        run_id TEXT, t_ns BIGINT, cpu_percent DOUBLE, mem_bytes BIGINT,
        gpu_util DOUBLE, gpu_mem_bytes BIGINT, temperature_c DOUBLE, power_w DOUBLE
    )""",
    """CREATE TABLE IF NOT EXISTS stacks (
        run_id TEXT, t_ns BIGINT, dur_ns BIGINT, thread BIGINT, depth INTEGER, frame TEXT
    )""",
    """CREATE TABLE IF NOT EXISTS artifacts (
        run_id TEXT, kind TEXT, name TEXT, data BLOB           -- kind: speedscope | note | ...
    )""",
    *(f"CREATE TABLE IF NOT EXISTS {t} ({cols})" for t, cols in {
        # What an imported trace holds besides ops (profiler/importers/details.py). Spans are not ops, so no
        # op table counts them: user annotations (record_function, ProfilerStep#N), runtime calls
        # (cudaLaunchKernel), syncs. kind: the trace's category as written (user_annotation, cuda_runtime...).
        "spans": "run_id TEXT, kind TEXT, name TEXT, backend TEXT, device TEXT, thread BIGINT, depth INTEGER, "
                 "step INTEGER, start_ns BIGINT, end_ns BIGINT, args TEXT",
        # Arrows between two tracks (ac2g: a launch on the host -> its kernel on a stream; fwdbwd). to_step /
        # to_seq (from_step / from_seq): the event that starts where the arrow lands (leaves), NULL if none.
        "flows": "run_id TEXT, kind TEXT, flow_id TEXT, from_backend TEXT, from_device TEXT, from_thread BIGINT, "
                 "from_ns BIGINT, from_step INTEGER, from_seq INTEGER, to_backend TEXT, to_device TEXT, "
                 "to_thread BIGINT, to_ns BIGINT, to_step INTEGER, to_seq INTEGER",
        # A device op's launch configuration, keyed like tensors by the event's (step, seq); args: all of them
        "kernel_args": "run_id TEXT, step INTEGER, seq INTEGER, grid TEXT, block TEXT, registers INTEGER, "
                       "shared_memory BIGINT, blocks_per_sm DOUBLE, warps_per_sm DOUBLE, occupancy DOUBLE, "
                       "correlation BIGINT, args TEXT",
    }.items()),
]

# tables keyed by run_id that came after `delete_run` listed its own; it deletes from these too
IMPORT_TABLES = ("spans", "flows", "kernel_args")

EVENT_COLUMNS = ["run_id", "step", "seq", "op", "node", "module", "source", "backend", "device", "thread", "depth",
                 "start_ns", "end_ns", "input_shapes", "input_dtypes", "output_shapes", "output_dtypes", "bytes",
                 "flops", "fallback", "live_bytes", *ADDED_EVENT_COLUMNS]

MIGRATIONS = [f"ALTER TABLE events ADD COLUMN IF NOT EXISTS {name} {kind} DEFAULT {default}"
              for name, (kind, default) in ADDED_EVENT_COLUMNS.items()]

# column order of the tables above, without run_id (what the store's add_* methods take)
SPAN_COLUMNS = ["kind", "name", "backend", "device", "thread", "depth", "step", "start_ns", "end_ns", "args"]
FLOW_COLUMNS = ["kind", "flow_id", "from_backend", "from_device", "from_thread", "from_ns", "from_step", "from_seq",
                "to_backend", "to_device", "to_thread", "to_ns", "to_step", "to_seq"]
KERNEL_ARG_COLUMNS = ["step", "seq", "grid", "block", "registers", "shared_memory", "blocks_per_sm", "warps_per_sm",
                      "occupancy", "correlation", "args"]
