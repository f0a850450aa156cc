"""Backend description files (TOML): parsing and validation with messages that name the
file, the key and what was expected (DESIGN.md: backend description file)."""
from __future__ import annotations

import hashlib
import json
import math
import re
import reprlib
from dataclasses import dataclass, field
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from . import registry
from .errors import UsageError, first_line

# section -> key -> (types, required, meaning)
_NUM = (int, float)
SCHEMA = {
    "backend": {
        "name": (str, True, "a unique backend name"),
        "implementation": (str, True, "a registered backend (`opscope backends` lists them), or a dotted module path"),
        "fallback": ((str, list), False, 'a backend spec for unsupported ops, or a list tried in order, '
                     'e.g. "numpy" or ["numpy", "torch:cpu"]'),
        "device": (str, False, "a torch device string, for implementation = \"torch\""),
        "summary": (str, False, "one line describing the chip"),
        "options": (dict, False, "a table of the backend's options ([backend.options]: what its implementation "
                                 "declares, `opscope backends --json` lists them)"),
    },
    "hardware": {
        "peak_flops": (dict, False, "a table of dtype = FLOP/s, e.g. { float32 = 5.0e13 }"),
        "memory_bandwidth": (_NUM, False, "bytes/s"),
        "memory_capacity": (_NUM, False, "bytes"),
        "launch_overhead": (_NUM, False, "seconds per kernel"),
        "host_bandwidth": (_NUM, False, "bytes/s for host<->device copies"),
        "kind": (str, False, "cpu, gpu, npu, dsp, ..."),
        "preferred_layout": (str, False, '"nchw" or "nhwc"'),
        "cores": (int, False, "compute units"),
    },
    "operators": {
        "supported": (list, False, "a list of op names"),
        "unsupported": (list, False, "a list of op names"),
        "low_precision": (list, False, "ops whose kernels compute in float16 (numerics what-if)"),
    },
    "tuning": {
        "threads": (list, False, "a list of thread counts to try"),
    },
    # a sim chip's thermal/power model (runtime/dist/thermal.py): throttling testable on a CPU
    "thermal": {
        "tdp": (_NUM, True, "watts at full load"),
        "throttle_temperature": (_NUM, True, "degrees C at which the chip throttles"),
        "throttle_slowdown": (_NUM, True, "how many times slower the chip runs when throttled (>= 1)"),
        "heating_rate": (_NUM, True, "degrees C per second of busy device time"),
        "ambient": (_NUM, False, "degrees C at rest (default 35)"),
        "cooling_rate": (_NUM, False, "degrees C per idle second (default 0)"),
    },
    # the links between chips of this kind, for `opscope simulate` (runtime/dist/simulate.py)
    "interconnect": {
        "bandwidth": (_NUM, True, "bytes/s per link"),
        "latency": (_NUM, True, "seconds per message hop"),
        "topology": (str, False, '"ring", "tree" or "all-to-all" (default "ring")'),
        # a second level (hierarchical): ranks_per_node chips on the link above, nodes joined by this one
        "ranks_per_node": (int, False, "chips per node on the link above (then the inter_node_* keys)"),
        "inter_node_bandwidth": (_NUM, False, "bytes/s of a node's link to the other nodes"),
        "inter_node_latency": (_NUM, False, "seconds per message between nodes"),
        "inter_node_topology": (str, False, '"ring", "tree" or "all-to-all" between nodes (default "ring")'),
    },
    # pass name -> true/false: which graph passes a plan for this backend runs (runtime/passes)
    "passes": {},
}
from .passes.catalog import PASSES as _PASSES  # noqa: E402 -- names only, nothing imported behind it
SCHEMA["passes"] = {name: (bool, False, f"true to run the {name} pass ({doc}), false to skip it")
                    for name, doc in _PASSES.items()}
_TOPOLOGIES = ("ring", "tree", "all-to-all")
_SIM_REQUIRED = ("peak_flops", "memory_bandwidth")
_MODULE_PATH = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)+$")
_BIG = 1e300                         # past any real chip; keeps sums and products finite
MAX_BYTES = 1 << 20                  # a description is a page of TOML; more is not one
_SHOW = reprlib.Repr()
_SHOW.maxstring = _SHOW.maxother = 60


@dataclass
class Description:
    name: str
    implementation: str
    fallbacks: list = field(default_factory=list)   # backend specs, tried in order
    device: str | None = None
    summary: str = ""
    peak_flops: dict = field(default_factory=dict)
    memory_bandwidth: float = 0.0
    memory_capacity: float = 0.0
    launch_overhead: float = 0.0
    host_bandwidth: float = 0.0
    kind: str = "cpu"
    preferred_layout: str = "nchw"
    cores: int = 0
    supported: list | None = None
    unsupported: list = field(default_factory=list)
    low_precision: list = field(default_factory=list)
    tuning: dict = field(default_factory=dict)
    thermal: dict = field(default_factory=dict)        # [thermal]: sim chips' throttling model
    interconnect: dict = field(default_factory=dict)   # [interconnect]: bandwidth, latency, topology
    passes: dict = field(default_factory=dict)         # [passes]: pass name -> on/off
    options: dict = field(default_factory=dict)        # [backend.options]: a stack's device, providers, ...
    path: str = ""
    digest: str = ""

    @property
    def fallback(self) -> str | None:
        """The first fallback (where a single one is expected)."""
        return self.fallbacks[0] if self.fallbacks else None

    def peak(self, dtype: str) -> float:
        """Peak FLOP/s for a dtype; dtypes the chip does not list run at its float32 rate."""
        return float(self.peak_flops.get(dtype) or self.peak_flops.get("float32") or 0.0)

    def as_dict(self) -> dict:
        return {k: v for k, v in vars(self).items() if k != "path"}


def load(path: str | Path) -> Description:
    path = Path(path)
    if not path.is_file():
        what = "is not a regular file" if path.exists() else "does not exist"
        raise UsageError(f"backend description {path} {what}: give a path to a .toml file")
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_BYTES + 1)
    except OSError as e:
        raise UsageError(f"{path}: cannot read the backend description ({e.strerror or e})")
    if len(raw) > MAX_BYTES:
        raise UsageError(f"{path}: larger than {MAX_BYTES} bytes; a backend description is a short TOML file")
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise UsageError(f"{path}: not valid TOML ({first_line(e)}); see docs/describe-a-chip.md for the format")
    except RecursionError:           # tomllib recurses once per nesting level
        raise UsageError(f"{path}: not valid TOML (arrays or tables nested too deeply); "
                         "see docs/describe-a-chip.md for the format")
    return parse(data, str(path), hashlib.sha256(raw).hexdigest()[:16])


def device_problem(device: str) -> str | None:
    """Why no torch backend can ever run on `device` (a bad string, or `meta`), else None."""
    import torch
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError) as e:
        return f"not a torch device string ({first_line(e)})"
    if dev.type == "meta":
        return "meta tensors have shapes but no data: nothing can run there"
    if dev.type != "cpu" and not hasattr(torch, dev.type):
        return f"torch has no {dev.type} device support"
    return None


def parse(data: dict, where: str, digest: str = "") -> Description:
    def bad(key, what):
        raise UsageError(f"{where}: {key}: {what}")

    def positive(key, value, meaning, *, zero_ok=False):
        # NOTE: NaN compares False with everything, so `value <= 0` alone lets it through; and
        # TOML integers have no bound in tomllib (10**400 is no float: isfinite raises).
        if isinstance(value, bool) or not isinstance(value, _NUM) or abs(value) > _BIG or \
                not math.isfinite(value) or value < 0 or (value == 0 and not zero_ok):
            bad(key, f"expected {meaning} as a {'finite number >= 0' if zero_ok else 'positive finite number'}, "
                     f"got {_SHOW.repr(value)}")

    for section, body in data.items():
        if section not in SCHEMA:
            bad(f"[{section}]", f"unknown section; expected one of {', '.join('[' + s + ']' for s in SCHEMA)}")
        if not isinstance(body, dict):
            bad(section, "expected a table")
        for key, value in body.items():
            if key not in SCHEMA[section]:
                bad(f"{section}.{key}", f"unknown key; expected one of {', '.join(SCHEMA[section])}")
            types, _, meaning = SCHEMA[section][key]
            if (isinstance(value, bool) and types is not bool) or not isinstance(value, types):
                bad(f"{section}.{key}", f"expected {meaning}, got {type(value).__name__} {_SHOW.repr(value)}")
    for section, keys in SCHEMA.items():
        for key, (_, required, meaning) in keys.items():
            if required and key not in data.get(section, {}) and (section in data or section in ("backend",)):
                bad(f"{section}.{key}", f"missing; expected {meaning}")
    b, hw, ops = data["backend"], data.get("hardware", {}), data.get("operators", {})
    impl = b["implementation"]
    entry = registry.get(impl)
    if entry is None and not _MODULE_PATH.match(impl):
        bad("backend.implementation", f"expected {SCHEMA['backend']['implementation'][2]}: one of "
                                      f"{', '.join(registry.names())}, got {_SHOW.repr(impl)}")
    if not b["name"].strip():
        bad("backend.name", "expected a unique backend name, got an empty string")
    fallbacks = _fallbacks(b, impl, bad)
    if "device" in b and entry is not None and entry.kind == "regions":
        bad("backend.device", f'is a torch device, for implementation = "torch"; a {impl} backend takes its '
                              'device in [backend.options] device')
    if "device" in b and (why := device_problem(b["device"])):
        bad("backend.device", f"{_SHOW.repr(b['device'])}: {why}")
    if impl == "sim":
        for key in _SIM_REQUIRED:
            if key not in hw:
                bad(f"hardware.{key}", f"missing; a sim backend needs it ({SCHEMA['hardware'][key][2]})")
    from .dtypes import ITEMSIZE
    for dtype, value in hw.get("peak_flops", {}).items():
        if dtype not in ITEMSIZE:
            bad(f"hardware.peak_flops.{dtype}", f"unknown dtype; expected one of {', '.join(ITEMSIZE)}")
        positive(f"hardware.peak_flops.{dtype}", value, "FLOP/s")
    for key in ("memory_bandwidth", "memory_capacity", "host_bandwidth"):
        if key in hw:
            positive(f"hardware.{key}", hw[key], SCHEMA["hardware"][key][2])
    for key in ("launch_overhead", "cores"):
        if key in hw:
            positive(f"hardware.{key}", hw[key], SCHEMA["hardware"][key][2], zero_ok=True)
    if hw.get("preferred_layout", "nchw") not in ("nchw", "nhwc"):
        bad("hardware.preferred_layout", f'expected "nchw" or "nhwc", got {_SHOW.repr(hw["preferred_layout"])}')
    for n in data.get("tuning", {}).get("threads", []):
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= 4096:
            bad("tuning.threads", f"expected thread counts (positive integers up to 4096), got {_SHOW.repr(n)}")
    _check_tables(data, positive, bad)
    options = _check_options(b.get("options", {}), entry, impl, bad)
    if "supported" in ops and "unsupported" in ops:
        bad("operators", "give supported or unsupported, not both")
    from .ops import OPS
    for key in ("supported", "unsupported", "low_precision"):
        for op in ops.get(key, []):
            if not isinstance(op, str):
                bad(f"operators.{key}", f"expected op names (strings), got {_SHOW.repr(op)}")
            if op not in OPS:
                bad(f"operators.{key}", f"unknown op {_SHOW.repr(op)}; `opscope ops` lists the op names")
    if not digest:
        digest = hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return Description(
        name=b["name"], implementation=impl, fallbacks=fallbacks, device=b.get("device"),
        summary=b.get("summary", ""), peak_flops=dict(hw.get("peak_flops", {})),
        memory_bandwidth=float(hw.get("memory_bandwidth", 0.0)), memory_capacity=float(hw.get("memory_capacity", 0.0)),
        launch_overhead=float(hw.get("launch_overhead", 0.0)), host_bandwidth=float(hw.get("host_bandwidth", 0.0)),
        kind=hw.get("kind", "npu" if impl == "sim" else "cpu"), preferred_layout=hw.get("preferred_layout", "nchw"),
        cores=int(hw.get("cores", 0)), supported=ops.get("supported"), unsupported=list(ops.get("unsupported", [])),
        low_precision=list(ops.get("low_precision", [])), tuning=dict(data.get("tuning", {})), path=where, digest=digest,
        thermal=dict(data.get("thermal", {})), interconnect=dict(data.get("interconnect", {})),
        passes=dict(data.get("passes", {})), options=options)


def _check_options(options: dict, entry, impl: str, bad) -> dict:
    """[backend.options]: what the implementation's registry entry declares (its schema, its defaults filled in);
    a module named by path checks its own."""
    if entry is None:
        return dict(options)
    options = registry.check_options(options, entry, bad)
    if (check := entry.hook("check")) is not None and entry.builtin:
        check(options, bad)
    return options


def _check_tables(data: dict, positive, bad) -> None:
    """[thermal] and [interconnect]: numbers in range, a known topology."""
    for key, value in data.get("thermal", {}).items():
        positive(f"thermal.{key}", value, SCHEMA["thermal"][key][2], zero_ok=key in ("cooling_rate", "ambient"))
    if data.get("thermal", {}).get("throttle_slowdown", 1) < 1:
        bad("thermal.throttle_slowdown", "expected a slowdown >= 1 (2 = twice as slow when throttled)")
    ic = data.get("interconnect", {})
    for key in ("bandwidth", "latency", "ranks_per_node", "inter_node_bandwidth", "inter_node_latency"):
        if key in ic:
            positive(f"interconnect.{key}", ic[key], SCHEMA["interconnect"][key][2], zero_ok=key.endswith("latency"))
    for key in ("topology", "inter_node_topology"):
        if ic.get(key, "ring") not in _TOPOLOGIES:
            bad(f"interconnect.{key}", f"expected one of {', '.join(_TOPOLOGIES)}, got {_SHOW.repr(ic[key])}")
    levels = [k for k in ("ranks_per_node", "inter_node_bandwidth", "inter_node_latency") if k in ic]
    if levels and len(levels) < 3:
        bad("interconnect." + next(k for k in ("ranks_per_node", "inter_node_bandwidth", "inter_node_latency")
                                   if k not in ic), "missing; a second level needs ranks_per_node, "
                                                    "inter_node_bandwidth and inter_node_latency")


def _fallbacks(b: dict, impl: str, bad) -> list[str]:
    """backend.fallback as a list; a sim chip falls back to numpy unless it says otherwise
    (`fallback = []`: no fallback, unsupported ops are an error)."""
    given = b.get("fallback", ["numpy"] if impl == "sim" else [])
    specs = [given] if isinstance(given, str) else given
    for spec in specs:
        if not isinstance(spec, str) or not spec.strip():
            bad("backend.fallback", f"expected backend specs such as \"numpy\" or \"torch:cpu\", got {_SHOW.repr(spec)}")
    dup = next((s for i, s in enumerate(specs) if s in specs[:i]), None)
    if dup is not None:
        bad("backend.fallback", f"{_SHOW.repr(dup)} is listed twice")
    return [s.strip() for s in specs]
