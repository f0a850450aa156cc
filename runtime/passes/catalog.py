"""The names of opscope's passes, in pipeline order, with one line each.

Kept free of imports so the description parser (which validates a description's `[passes]`
table) and `--help` can read it without loading the passes themselves.
"""
PASSES = {
    "dce": "remove dead code and no-ops (same-shape views, casts to the same dtype)",
    "fold": "fold ops whose inputs are all constants into constants",
    "cse": "share one node among identical computations (common-subexpression elimination)",
    "layout": "run convolutions and their neighbours in the description's preferred_layout, fewest transposes",
    "fuse": "fuse chains of pointwise ops (and a following reduction) into one kernel",
    "memplan": "liveness-based buffer reuse: outputs take the buffer of an input that dies there",
}
NAMES = tuple(PASSES)
