"""`migrate apply` for C, C++ and CUDA: CUDA names become HIP names, from the table (cuda_apis.toml), as hipify does.

    fr = rewrite_c("kernel.cu", text, default_table())
    fr.after        # the HIP source: cudaMalloc -> hipMalloc, <cuda_runtime.h> -> <hip/hip_runtime.h>, ...
    fr.unmapped     # Findings for what has no HIP name: left as written, never guessed

Only whole identifiers in code change (comments and strings are blanked first, c_scan.blank), so the text
around them -- kernel launches `<<<...>>>` (HIP accepts them), `dim3`, formatting -- stays byte for byte. A CUDA
call with any name in it that has no HIP equivalent is left whole, so no call comes out half rewritten.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from .c_scan import _INCLUDE, _WORD, blank, defined_here
from .rewrite import FileRewrite
from .rules import Finding, Table

# a name from a CUDA family: cudaMalloc, cublasSgemm_v2, CUBLAS_OP_N, curandState, __shfl_down_sync ...
_CUDA_WORD = re.compile(r"(?:cuda|cu|cublas(?:Lt)?|cudnn|nccl|cufft|curand|cusparse|cusolver|nvrtc|nvtx)[A-Z0-9]\w*"
                        r"|(?:CUDA|CUBLAS|CUDNN|CURAND|CUFFT|CUSPARSE|CUSOLVER)_\w+|__(?:nv_|shfl|any_sync|all_sync|"
                        r"ballot_sync|activemask|CUDA)\w*|__DRIVER_TYPES_H__|nv_bfloat\w*|curandState\w*"
                        r"|CU[a-z]\w*")                # the driver API's types: CUresult, CUdeviceptr, CUstream
_CLEAN = re.compile(r"[A-Za-z_][\w:./]*")
# what needs HIP's runtime header in scope: kernel syntax and the built-in variables
_KERNEL_SYNTAX = re.compile(r"\b(?:__global__|__device__|__shared__|__constant__|__host__|__syncthreads|threadIdx"
                            r"|blockIdx|blockDim|gridDim|dim3)\b|<<<")
RUNTIME_HEADER = "hip/hip_runtime.h"
_IDENT = re.compile(r"[A-Za-z_]\w*")


def hip_name(table: Table, name: str, kind: str) -> str | None:
    """The HIP spelling of `name` (kind: call, identifier or include), or None when the table has no single name
    for it (no row, or a row whose hip field is advice, not a name)."""
    kinds = ("call", "identifier") if kind == "call" else ("identifier", "call") if kind == "identifier" else (kind,)
    for k in kinds:
        rule = table.c_rule(name, k)
        if rule is not None:
            hip = rule.portable(name)[0].split(" (", 1)[0].strip()
            if kind == "include":
                return hip if _CLEAN.fullmatch(hip) and "*" not in hip else None
            if kind == "qualified":          # at::DeviceType::CUDA: portable when HIP keeps the very name
                return hip if hip == name else None
            return hip if _IDENT.fullmatch(hip) else None
    return None


@dataclass
class CRewrite(FileRewrite):
    unmapped: list[Finding] = field(default_factory=list)


_LAUNCH = re.compile(r"\b([A-Za-z_][\w:]*)\s*(<[^<>;()]*>)?\s*<<<")
# `extern __shared__ float s[];`: the size comes from the launch; HIP-CPU needs HIP_DYNAMIC_SHARED(float, s)
_EXTERN_SHARED = re.compile(r"\bextern\s+__shared__\s+((?:[\w:]+\s*\**\s+)+?\**)\s*(\w+)\s*\[\s*\]\s*;")


def launches(code: str) -> list[tuple[int, int, str]]:
    """Edits turning `k<T><<<grid, block[, shared, stream]>>>(args)` into
    `hipLaunchKernelGGL(HIP_KERNEL_NAME(k<T>), grid, block, shared, stream, args)`: the form a compiler without
    CUDA's launch syntax takes (g++ with HIP-CPU). `code` is the blanked text."""
    edits = []
    for m in _LAUNCH.finditer(code):
        close = code.find(">>>", m.end())
        paren = code.find("(", close + 3) if close >= 0 else -1
        if close < 0 or paren < 0 or code[close + 3:paren].strip():
            continue
        config = _split_top(code[m.end():close])
        if not 2 <= len(config) <= 4:
            continue
        config += ["0"] * (4 - len(config))
        name = m.group(1) + (m.group(2) or "")
        kernel = f"HIP_KERNEL_NAME({name})" if m.group(2) else name
        end = _call_end(code, paren)
        empty = not code[paren + 1:end - 1].strip()
        head = f"hipLaunchKernelGGL({kernel}, {', '.join(c.strip() for c in config)}" + ("" if empty else ", ")
        edits.append((m.start(), paren + 1, head))
    return edits


def _split_top(text: str) -> list[str]:
    """`text` split at the commas outside brackets."""
    parts, depth, at = [], 0, 0
    for i, c in enumerate(text):
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif c == "," and depth == 0:
            parts.append(text[at:i])
            at = i + 1
    parts.append(text[at:])
    return parts


def rewrite_c(path: str, text: str, table: Table, launch: str = "keep") -> CRewrite:
    """`launch`: keep the `<<<...>>>` syntax (hipcc takes it, as hipify leaves it) or "ggl" (hipLaunchKernelGGL and
    HIP_DYNAMIC_SHARED: the forms HIP-CPU's g++ route takes)."""
    code = blank(text)
    edits: list[tuple[int, int, str]] = []        # (start, end, new text) in `text`
    unmapped: list[Finding] = []
    lines = text.splitlines()
    starts = [0] + [m.end() for m in re.finditer("\n", text)]

    def where(pos: int) -> tuple[int, int]:
        import bisect
        line = bisect.bisect_right(starts, pos)
        return line, pos - starts[line - 1] + 1

    def report(pos: int, api: str, why: str) -> None:
        line, col = where(pos)
        unmapped.append(Finding(path, line, col, api, "unmapped", "warning", why, "c",
                                code=lines[line - 1].strip() if line <= len(lines) else "",
                                note="not rewritten: left as written"))

    headers = []                                   # spans of #include names: their words are not identifiers
    has_runtime = False
    for m in _INCLUDE.finditer(text):
        header = m.group(1)
        headers.append((m.start(1), m.end(1)))
        has_runtime |= RUNTIME_HEADER in (header, hip_name(table, header, "include"))
        if table.c_rule(header, "include") is None:
            continue
        hip = hip_name(table, header, "include")
        if hip is None:
            report(m.start(1), f"#include {header}", "no single HIP header for it")
        elif hip != header:
            edits.append((m.start(1), m.end(1), hip))

    words = []                                     # (start, end, name, HIP name or None)
    own = defined_here(code)                       # the file's own macros (guards, checks) keep their names
    for m in _WORD.finditer(code):
        name = m.group(0)
        if not _CUDA_WORD.fullmatch(name) or name in own or any(hs <= m.start() < he for hs, he in headers):
            continue
        call = code[m.end():m.end() + 64].lstrip().startswith("(")
        words.append((m.start(), m.end(), name, hip_name(table, name, "call" if call else "identifier"), call))
    # a CUDA call that holds a name with no HIP equivalent (its own, or one in its arguments) stays whole
    missing = [w[0] for w in words if w[3] is None]
    frozen = []
    for start, end, name, hip, call in words:
        if call:
            close = _call_end(code, end)
            if any(start <= pos < close for pos in missing):
                frozen.append((start, close))
    for start, end, name, hip, call in words:
        if hip is None:
            report(start, name + ("()" if call else ""), "no HIP name in opscope's table")
        elif hip != name and not any(fs <= start < fe for fs, fe in frozen):
            edits.append((start, end, hip))
    uses_runtime = any(hip and hip.startswith("hip") for _, _, _, hip, _ in words) or _KERNEL_SYNTAX.search(code)
    if uses_runtime and not has_runtime:
        # as hipify does: CUDA compilers include the runtime implicitly, HIP's need it named in every unit using it
        first = re.search(r"\S", code)
        at = 0 if first is None else code.rfind("\n", 0, first.start()) + 1
        edits.append((at, at, f'#include "{RUNTIME_HEADER}"\n'))
    if launch == "ggl":
        for s_, e_, head in launches(code):
            # the launch's own text is taken from the rewritten source: names inside its <<<...>>> keep their edits
            config = [(a, b, n) for a, b, n in edits if s_ <= a < e_]
            edits = [x for x in edits if not s_ <= x[0] < e_]
            edits.append((s_, e_, _apply(text, s_, e_, head, config)))
        for m in _EXTERN_SHARED.finditer(code):
            edits.append((m.start(), m.end(), f"HIP_DYNAMIC_SHARED({' '.join(m.group(1).split())}, {m.group(2)})"))
    out, at = [], 0
    for s, e, new in sorted(edits):
        if s < at:
            continue
        out.append(text[at:s])
        out.append(new)
        at = e
    out.append(text[at:])
    after = "".join(out)
    return CRewrite(path, text, after, len(edits), 0, unmapped)


def _apply(text: str, s: int, e: int, head: str, inner: list) -> str:
    """`head` with the names it copied from text[s:e] renamed by the edits that fell inside that span."""
    for a, b, new in sorted(inner, reverse=True):
        old = text[a:b]
        head = head.replace(old, new)
    return head


def _call_end(code: str, name_end: int) -> int:
    """The position after the `)` closing the call whose name ends at `name_end` (the end of the text if unclosed)."""
    i = code.find("(", name_end)
    depth = 0
    for j in range(i, len(code)):
        c = code[j]
        if c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                return j + 1
    return len(code)
