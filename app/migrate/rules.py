"""The CUDA API table (cuda_apis.toml) and the Finding every scanner produces."""
from __future__ import annotations

import fnmatch
import functools
import re
import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path

from opscope.runtime.errors import UsageError

TABLE = Path(__file__).with_name("cuda_apis.toml")
SEVERITIES = ("info", "warning", "error")
C_KINDS = ("call", "include", "identifier", "qualified", "member")
PY_KINDS = ("name", "device", "import", "method", "backend", "string", "keyword", "compare", "attribute")
_KEYWORD_API = re.compile(r"([\w.]+)\((\w+)=\)")      # a keyword row: "CALL(KEYWORD=)"


@dataclass(frozen=True)
class Rule:
    api: str
    category: str
    severity: str
    replacement: str
    kind: str = "name"
    rewrite: str | None = None      # None: reported and marked, not rewritten
    hip: str = ""                   # C rows: the HIP equivalent (a `*` stands for what the api's `*` matched)
    sycl: str = ""                  # C rows: the SYCL / oneAPI equivalent

    def portable(self, name: str) -> tuple[str, str]:
        """(HIP, SYCL) names for `name`, a match of this row's api."""
        hip = self.hip
        if "*" in self.api and "*" in hip and self.api.count("*") == 1:
            head, tail = self.api.split("*")
            if name.startswith(head) and name.endswith(tail):
                hip = hip.replace("*", name[len(head):len(name) - len(tail) or None], 1)
        return hip, self.sycl

    @property
    def resolved_by_apply(self) -> bool:
        """`migrate apply` takes care of it (rewrites it, or it is harmless and only marked)."""
        return self.rewrite is not None

    @property
    def rewritable(self) -> bool:
        return self.rewrite is not None and self.rewrite != "keep"


@dataclass
class Finding:
    file: str
    line: int                       # 1-based
    column: int                     # 1-based
    api: str
    category: str
    severity: str
    replacement: str
    language: str                   # python | c | none (skipped files have no findings)
    rewritable: bool = False       # `migrate apply` rewrites it
    resolved: bool = False         # nothing left to do after `migrate apply` (rewritten, or harmless)
    code: str = ""                  # the source line, stripped
    note: str = ""
    hip: str = ""                   # C/C++/CUDA findings: the portable equivalents
    sycl: str = ""

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class Table:
    python: dict[str, Rule] = field(default_factory=dict)        # exact api -> rule (kinds name/device)
    python_families: list[Rule] = field(default_factory=list)    # "x.y.*" rows, longest first
    imports: list[Rule] = field(default_factory=list)
    methods: dict[str, Rule] = field(default_factory=dict)
    strings: dict[str, Rule] = field(default_factory=dict)
    backends: dict[str, Rule] = field(default_factory=dict)
    keywords: dict[tuple[str, str], Rule] = field(default_factory=dict)   # (call, keyword) -> rule
    compares: dict[str, Rule] = field(default_factory=dict)      # "cuda" -> rule for `x == "cuda"`, `"cuda" in x`
    attributes: dict[str, Rule] = field(default_factory=dict)    # "is_cuda" -> rule for `x.is_cuda`
    c: list[Rule] = field(default_factory=list)                  # calls, longest pattern first
    c_other: dict[str, list[Rule]] = field(default_factory=dict)  # kind -> rows (include, identifier, ...)

    def python_rule(self, dotted: str) -> Rule | None:
        rule = self.python.get(dotted)
        if rule is not None:
            return rule
        for fam in self.python_families:
            if dotted.startswith(fam.api[:-1]):
                return fam
        return None

    def import_rule(self, module: str) -> Rule | None:
        for r in self.imports:
            if module == r.api or module.startswith(r.api + "."):
                return r
        return None

    @functools.lru_cache(maxsize=16384)
    def c_rule(self, name: str, kind: str = "call") -> Rule | None:
        for r in (self.c if kind == "call" else self.c_other.get(kind, ())):
            if r.api == name or ("*" in r.api and fnmatch.fnmatchcase(name, r.api) and api_shaped(name, r.api)):
                return r
        return None

    @functools.cached_property
    def c_initials(self) -> frozenset:
        """First letters of the identifier rows."""
        return frozenset(r.api[0] for r in self.c_other.get("identifier", ()))

    __hash__ = object.__hash__      # lru_cache on a method needs a hashable self


# The CUDA libraries' C prefixes. Their API names are camelCase after the prefix (cudaMalloc, cublasSgemm,
# curandCreateGenerator, ncclAllReduce), so a glob row `cuda*` must not take a user's `cuda_device` or
# `cuda_layer_norm` (apex's own functions): hipify renames neither, it has no such name in its table.
FAMILIES = ("cublasLt", "cublas", "cudnn", "cufft", "curand", "cusparse", "cusolver", "cuda", "nccl", "nvrtc",
            "nvtx", "cu")
# Enum and macro families of the UPPER_CASE names (CUBLAS_STATUS_SUCCESS, CUDNN_DATA_FLOAT): a glob `CUBLAS_*`
# must not take an include guard (CUBLAS_COMMON_H) or a user's macro.
UPPER_FAMILIES = ("CUBLAS_", "CUDNN_", "CURAND_", "CUSPARSE_", "CUSOLVER_", "CUFFT_")
_USER_UPPER = ("_H", "_HPP", "_H_", "_INCLUDED", "_CHECK", "_ERROR", "_GUARD")


# The driver API (cu* with nothing more to go by) is these groups; a kernel library's own `cuWelfordOnlineSum` or
# `cuApplyLayerNorm` (apex) is none of them, and hipify leaves it alone too.
DRIVER_GROUPS = ("Init", "Driver", "Device", "Ctx", "DevicePrimaryCtx", "Module", "Mem", "Launch", "Func", "Stream",
                 "Event", "GetError", "Link", "Tex", "Surf", "Array", "Mipmapped", "Graph", "Occupancy", "Pointer",
                 "Ipc", "Profiler", "GetProcAddress", "Library", "Kernel", "Memcpy", "Memset",
                 "Signal", "Wait", "Import", "Destroy", "External", "Flush", "Coredump", "Tensor",
                 "Multicast", "Green", "Log", "Checkpoint", "UserObject")


def api_shaped(name: str, pattern: str) -> bool:
    """Does `name`, which the glob `pattern` matched, have the shape of that library's API names?"""
    head = pattern.split("*", 1)[0]
    if pattern == "cu*":                         # the driver API: a known group after the prefix
        return name[2:].startswith(DRIVER_GROUPS)
    if head in FAMILIES:                         # cuda*, cublas*_t: camelCase after the prefix
        rest = name[len(head):]
        return bool(rest) and (rest[0].isupper() or rest[0].isdigit())
    if head in UPPER_FAMILIES:                   # CUBLAS_*: not a guard or a user's checking macro
        return not name.endswith(_USER_UPPER)
    return True


def load_table(path: str | Path | None = None) -> Table:
    path = Path(path or TABLE)
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise UsageError(f"CUDA API table {path}: {e}")
    table = Table()
    for section in ("python", "c"):
        for i, row in enumerate(data.get(section, [])):
            where = f"{path}: [[{section}]] row {i + 1}"
            missing = [k for k in ("api", "category", "severity", "replacement") if k not in row]
            if missing:
                raise UsageError(f"{where}: missing key {missing[0]!r}")
            if row["severity"] not in SEVERITIES:
                raise UsageError(f"{where}: severity must be one of {', '.join(SEVERITIES)}, got {row['severity']!r}")
            kind = row.get("kind", "name" if section == "python" else "call")
            kinds = PY_KINDS if section == "python" else C_KINDS
            if kind not in kinds:
                raise UsageError(f"{where}: kind must be one of {', '.join(kinds)}, got {kind!r}")
            rule = Rule(row["api"], row["category"], row["severity"], row["replacement"], kind, row.get("rewrite"),
                        row.get("hip", ""), row.get("sycl", ""))
            if section == "c" and kind == "call":
                table.c.append(rule)
            elif section == "c":
                table.c_other.setdefault(kind, []).append(rule)
            elif kind == "import":
                table.imports.append(rule)
            elif kind == "method":
                table.methods[rule.api] = rule
            elif kind == "string":
                table.strings[rule.api] = rule
            elif kind == "backend":
                table.backends[rule.api] = rule
            elif kind == "compare":
                table.compares[rule.api] = rule
            elif kind == "attribute":
                table.attributes[rule.api] = rule
            elif kind == "keyword":
                m = _KEYWORD_API.fullmatch(rule.api)
                if m is None:
                    raise UsageError(f"{where}: a keyword row's api is CALL(KEYWORD=), e.g. "
                                     f"\"torch.nn.parallel.DistributedDataParallel(device_ids=)\", got {rule.api!r}")
                if rule.rewrite not in (None, "drop", "keep"):
                    raise UsageError(f"{where}: a keyword row's rewrite is drop or keep, got {rule.rewrite!r}")
                table.keywords[m.group(1), m.group(2)] = rule
            elif rule.api.endswith(".*"):
                table.python_families.append(rule)
            else:
                table.python[rule.api] = rule
    _renames(table, data.get("c_names", {}), path)
    # the most specific row wins: longer patterns are tried first
    table.python_families.sort(key=lambda r: -len(r.api))
    table.imports.sort(key=lambda r: -len(r.api))
    for rows in (table.c, *table.c_other.values()):
        rows.sort(key=lambda r: (-len(r.api.rstrip("*")), r.api.endswith("*")))
    return table


def _renames(table: Table, names: dict, path) -> None:
    """[c_names] rows: a CUDA name and its HIP name, overriding a family row's `*` rule. A header (`x.h`) is an
    include row; any other name is both a call and an identifier row, so it wins however it is used."""
    for api, hip in names.items():
        if not isinstance(hip, str):
            raise UsageError(f"{path}: [c_names] {api} must be a HIP name in quotes, got {hip!r}")
        kinds = ("include",) if api.endswith(".h") else ("call", "identifier")
        for kind in kinds:
            rows = table.c if kind == "call" else table.c_other.setdefault(kind, [])
            base = next((r for r in rows if fnmatch.fnmatchcase(api.replace("*", "X"), r.api)), None)
            rule = Rule(api, base.category if base else "other", base.severity if base else "info",
                        f"{hip} (HIP)" if base is None else base.replacement, kind, None, hip, base.sycl if base else "")
            rows.append(rule)


@functools.lru_cache(maxsize=1)
def default_table() -> Table:
    return load_table()
