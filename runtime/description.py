"""Backend description files (TOML): parsing and validation with messages that name the
file, the key and what was expected (DESIGN.md: backend description file)."""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from .errors import UsageError

# section -> key -> (types, required, meaning)
_NUM = (int, float)
SCHEMA = {
    "backend": {
        "name": (str, True, "a unique backend name"),
        "implementation": (str, True, '"sim", "numpy", "torch", or a dotted module path'),
        "fallback": (str, False, "a backend spec for unsupported ops, e.g. \"numpy\""),
        "device": (str, False, "a torch device string, for implementation = \"torch\""),
        "summary": (str, False, "one line describing the chip"),
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
}
_IMPLS = ("sim", "numpy", "torch")
_SIM_REQUIRED = ("peak_flops", "memory_bandwidth")


@dataclass
class Description:
    name: str
    implementation: str
    fallback: str | None = None
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
    path: str = ""
    digest: str = ""

    def peak(self, dtype: str) -> float:
        """Peak FLOP/s for a dtype; dtypes the chip does not list run at its float32 rate."""
        return float(self.peak_flops.get(dtype) or self.peak_flops.get("float32") or 0.0)

    def as_dict(self) -> dict:
        return {k: v for k, v in vars(self).items() if k != "path"}


def load(path: str | Path) -> Description:
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"backend description {path} does not exist: give a path to a .toml file")
    raw = path.read_bytes()
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise UsageError(f"{path}: not valid TOML ({e}); see DESIGN.md for the description format")
    return parse(data, str(path), hashlib.sha256(raw).hexdigest()[:16])


def parse(data: dict, where: str, digest: str = "") -> Description:
    def bad(key, what):
        raise UsageError(f"{where}: {key}: {what}")

    for section, body in data.items():
        if section not in SCHEMA:
            bad(f"[{section}]", f"unknown section; expected one of {', '.join('[' + s + ']' for s in SCHEMA)}")
        if not isinstance(body, dict):
            bad(section, "expected a table")
        for key, value in body.items():
            if key not in SCHEMA[section]:
                bad(f"{section}.{key}", f"unknown key; expected one of {', '.join(SCHEMA[section])}")
            types, _, meaning = SCHEMA[section][key]
            if isinstance(value, bool) or not isinstance(value, types):
                bad(f"{section}.{key}", f"expected {meaning}, got {type(value).__name__} {value!r}")
    for section, keys in SCHEMA.items():
        for key, (_, required, meaning) in keys.items():
            if required and key not in data.get(section, {}):
                bad(f"{section}.{key}", f"missing; expected {meaning}")
    b, hw, ops = data["backend"], data.get("hardware", {}), data.get("operators", {})
    impl = b["implementation"]
    if impl not in _IMPLS and "." not in impl:
        bad("backend.implementation", f'expected {SCHEMA["backend"]["implementation"][2]}, got {impl!r}')
    if impl == "sim":
        for key in _SIM_REQUIRED:
            if key not in hw:
                bad(f"hardware.{key}", f"missing; a sim backend needs it ({SCHEMA['hardware'][key][2]})")
    for dtype, value in hw.get("peak_flops", {}).items():
        if isinstance(value, bool) or not isinstance(value, _NUM) or value <= 0:
            bad(f"hardware.peak_flops.{dtype}", f"expected a positive FLOP/s number, got {value!r}")
    for key in ("memory_bandwidth", "memory_capacity", "host_bandwidth"):
        if key in hw and hw[key] <= 0:
            bad(f"hardware.{key}", f"expected a positive number of {SCHEMA['hardware'][key][2]}, got {hw[key]!r}")
    for key in ("launch_overhead", "cores"):
        if key in hw and hw[key] < 0:
            bad(f"hardware.{key}", f"expected {SCHEMA['hardware'][key][2]}, >= 0, got {hw[key]!r}")
    for n in data.get("tuning", {}).get("threads", []):
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            bad("tuning.threads", f"expected thread counts (positive integers), got {n!r}")
    if "supported" in ops and "unsupported" in ops:
        bad("operators", "give supported or unsupported, not both")
    from .ops import OPS
    for key in ("supported", "unsupported", "low_precision"):
        for op in ops.get(key, []):
            if not isinstance(op, str):
                bad(f"operators.{key}", f"expected op names (strings), got {op!r}")
            if op not in OPS:
                bad(f"operators.{key}", f"unknown op {op!r}; `opscope ops` lists the op names")
    if not digest:
        digest = hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return Description(
        name=b["name"], implementation=impl, fallback=b.get("fallback"), device=b.get("device"),
        summary=b.get("summary", ""), peak_flops=dict(hw.get("peak_flops", {})),
        memory_bandwidth=float(hw.get("memory_bandwidth", 0.0)), memory_capacity=float(hw.get("memory_capacity", 0.0)),
        launch_overhead=float(hw.get("launch_overhead", 0.0)), host_bandwidth=float(hw.get("host_bandwidth", 0.0)),
        kind=hw.get("kind", "npu" if impl == "sim" else "cpu"), preferred_layout=hw.get("preferred_layout", "nchw"),
        cores=int(hw.get("cores", 0)), supported=ops.get("supported"), unsupported=list(ops.get("unsupported", [])),
        low_precision=list(ops.get("low_precision", [])), tuning=dict(data.get("tuning", {})), path=where, digest=digest)
