"""A compiler stack's regions in a plan: `opscope compile -b onnxruntime` (openvino, xla) saves each
region's compiled program, so `run --plan` skips the stack's import (torch's ONNX exporter, OpenVINO's
converter, jax's tracing) and only loads it.

    rows, blobs = collect(plan)               # plan.json's "regions", and the members regions/<name>.bin
    rows = declared(doc, where)               # a plan's rows, every field checked (UsageError)
    arm(backend, rows, blobs, where)          # the stack's registry loads them as placement makes the regions

A row: {"region", "file", "bytes", "sha256", "members": [node names], "constants": digest, "stack":
version}. A saved program is used only for a region with the same members and the same folded
constants (the model's weights: a plan names them, so other weights of the same shapes compile the
region again), and only by the stack version that made it (another one: refused, --recompile). What a
stack accepts as a saved program is its own check (no ONNX external data, no custom calls): a plan is
still data -- see each backend's load_region.
"""
from __future__ import annotations

import hashlib
import re

from ..errors import UsageError
from ..regions import RegionProgram
from ..stack_registry import SavedRegion, StackRegistry, constants_digest

MAX_REGION = 2 << 30
_FILE = re.compile(r"^regions/(region\d{1,6})\.bin$")
_HEX = re.compile(r"^[0-9a-f]{64}$")


def collect(plan) -> tuple[list[dict], dict[str, bytes]]:
    registry = plan.backend.ops
    if not isinstance(registry, StackRegistry):
        return [], {}
    rows, files = [], {}
    for st in plan.steps:
        k = st.kernel
        blob = k.artifact() if isinstance(k, RegionProgram) else None
        if blob is None:
            continue
        name = f"regions/{k.region.name}.bin"
        rows.append({"region": k.region.name, "file": name, "bytes": len(blob),
                     "sha256": hashlib.sha256(blob).hexdigest(), "members": [m.name for m in k.region.members],
                     "constants": constants_digest(k.region), "stack": registry.version})
        files[name] = blob
    return rows, files


def declared(doc: dict, where: str) -> list[dict]:
    rows = doc.get("regions", [])
    if not isinstance(rows, list):
        raise UsageError(f"{where}: corrupted (regions is not a list); compile it again")
    seen = set()
    for i, r in enumerate(rows):
        ok = (isinstance(r, dict) and isinstance(r.get("file"), str) and _FILE.match(r["file"])
              and r.get("region") == _FILE.match(r["file"]).group(1) and r["file"] not in seen
              and isinstance(r.get("bytes"), int) and not isinstance(r["bytes"], bool) and 0 < r["bytes"] <= MAX_REGION
              and isinstance(r.get("sha256"), str) and _HEX.match(r["sha256"])
              and isinstance(r.get("constants"), str) and _HEX.match(r["constants"])
              and isinstance(r.get("stack"), str) and len(r["stack"]) <= 200
              and isinstance(r.get("members"), list) and all(isinstance(m, str) and len(m) <= 1000 for m in r["members"]))
        if not ok:
            raise UsageError(f"{where}: corrupted (regions[{i}] is not a saved region); compile it again")
        seen.add(r["file"])
    return rows


def splits(plan) -> list[dict]:
    """plan.json's "splits": the members the stack failed inside a region, and why (partition.py), so a run of
    the plan does not compile the regions that failed again."""
    registry = plan.backend.ops
    if not isinstance(registry, StackRegistry):
        return []
    return [{"node": n, "reason": why} for n, why in registry.refused.items()]


def declared_splits(doc: dict, where: str) -> dict[str, str]:
    rows = doc.get("splits", [])          # plans from before splits had none
    ok = isinstance(rows, list) and all(isinstance(r, dict) and isinstance(r.get("node"), str) and len(r["node"]) <= 1000
                                        and isinstance(r.get("reason"), str) and len(r["reason"]) <= 2000 for r in rows)
    if not ok:
        raise UsageError(f"{where}: corrupted (splits is not a list of nodes and reasons); compile it again")
    return {r["node"]: r["reason"] for r in rows}


def check_bytes(row: dict, data: bytes, where: str) -> None:
    if hashlib.sha256(data).hexdigest() != row["sha256"]:
        raise UsageError(f"{where}: corrupted ({row['file']} does not match its checksum); compile it again")


def arm(backend, rows: list[dict], files: dict, where: str, refused: dict[str, str] | None = None) -> None:
    """Hand the saved programs and the remembered splits to the stack's registry (refused when another stack
    version made them)."""
    registry = backend.ops
    if not isinstance(registry, StackRegistry):
        return
    registry.remembered = dict(refused or {})
    if not rows:
        return
    for r in rows:
        if r["stack"] != registry.version:
            raise UsageError(f"{where}: its regions were compiled by {r['stack'][:80]}, this is "
                             f"{registry.version or 'another version'}: recompile it (--recompile)")
    registry.saved = {r["region"]: SavedRegion(files[r["file"]], r["members"], r["constants"]) for r in rows}


def loaded(plan) -> dict:
    """How many regions came from the plan and how many were compiled again (weights changed, none saved)."""
    programs = [st.kernel for st in plan.steps if isinstance(st.kernel, RegionProgram)]
    if isinstance(plan.backend.ops, StackRegistry):
        plan.backend.ops.saved = {}
    return {"regions_loaded": sum(p.from_plan for p in programs),
            "regions_compiled": sum(not p.from_plan for p in programs)}
