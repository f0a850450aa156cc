"""C, C++ and CUDA sources: blank out comments and literals, then find CUDA calls by name.

Blanking keeps every character's line and column, so a match in the blanked text is a position
in the real file, and nothing inside a comment or a string can match.
"""
from __future__ import annotations

import re

from .rules import Finding, Table

SUFFIXES = (".c", ".cc", ".cpp", ".cxx", ".h", ".hh", ".hpp", ".cu", ".cuh")

_NOISE = re.compile(
    r'//[^\n]*'                          # line comment
    r'|/\*.*?(?:\*/|\Z)'                 # block comment (an unclosed one runs to the end)
    r'|R"([^(\s]*)\(.*?\)\1"'            # C++ raw string
    r'|"(?:\\.|[^"\\\n])*"?'             # string literal
    r"|'(?:\\.|[^'\\\n])*'?",            # char literal
    re.S)
# a call to something in a CUDA family: cudaMalloc(, cuLaunchKernel(, cublasSgemm(, ncclAllReduce( ...
_CALL = re.compile(r"\b((?:cuda|cu|cublas|cublasLt|cudnn|nccl|cufft|curand|cusparse|cusolver|nvrtc|nvtx)[A-Z]\w*)\s*\(")
_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*[<"]([^>"\n]+)[>"]', re.M)
_WORD = re.compile(r"\b[A-Za-z_]\w*\b")
_QUALIFIED = re.compile(r"\b(?:torch|at|c10)(?:::\w+)+")
_MEMBER = re.compile(r"(?:\.|->)\s*(\w+)\s*\(")
# kernel<<<grid, block>>>(...) or kernel<T><<<...>>>(...)
_LAUNCH = re.compile(r"\b(\w+)\s*(?:<[^<>;()]*>)?\s*<<<")
_NOT_NEWLINE = re.compile(r"[^\n]")
_GLOBAL = re.compile(r"\b__global__\b(?:[^;{(]*?)\b(\w+)\s*\(", re.S)
_DEFINE = re.compile(r"^[ \t]*#[ \t]*define[ \t]+(\w+)", re.M)
# TORCH_LIBRARY_IMPL(ns, KEY, m): a device registration only when KEY is a CUDA dispatch key
_LIBRARY_IMPL = re.compile(r"\bTORCH_LIBRARY_IMPL\s*\(\s*\w+\s*,\s*(\w+)")


def defined_here(code: str) -> set[str]:
    """Macros the file defines itself (#define NAME: include guards, checking macros): the user's names, never
    an API to flag or rename, whatever they look like (CUBLAS_COMMON_H, cudaCheck)."""
    return {m.group(1) for m in _DEFINE.finditer(code)}


def not_cuda_registrations(code: str) -> set[int]:
    """Positions of TORCH_LIBRARY_IMPL(ns, KEY, m) whose KEY is no CUDA key (CPU, Meta, Autograd...)."""
    return {m.start() for m in _LIBRARY_IMPL.finditer(code) if "CUDA" not in m.group(1)}


def blank(text: str) -> str:
    """The text with comments and string/char literals replaced by spaces (newlines kept)."""
    return _NOISE.sub(lambda m: _NOT_NEWLINE.sub(" ", m.group(0)), text)


def scan_c(path: str, text: str, table: Table) -> list[Finding]:
    code = blank(text)
    lines = text.splitlines()
    starts = _line_starts(code)
    found: list[Finding] = []

    seen: set[int] = not_cuda_registrations(code)
    own = defined_here(code)

    def add(pos: int, api: str, pattern: str, kind: str = "call") -> bool:
        if pattern in own:
            return False
        rule = table.c_rule(pattern, kind)
        if rule is None or pos in seen:
            return False
        seen.add(pos)
        line = _line_of(starts, pos)
        col = pos - starts[line - 1] + 1
        hip, sycl = rule.portable(pattern)
        # `migrate apply` takes care of a name with a single HIP spelling (renames it, or it is HIP already)
        clean = _hip_name(table, pattern, kind if kind in ("include", "identifier") else "call")
        found.append(Finding(path, line, col, api, rule.category, rule.severity, rule.replacement, "c",
                             rewritable=clean is not None and clean != pattern, resolved=clean is not None,
                             code=lines[line - 1].strip() if line <= len(lines) else "", hip=hip, sycl=sycl))
        return True

    for m in _INCLUDE.finditer(text):              # the raw text: blanking empties "header.h"
        add(m.start(1), f"#include {m.group(1)}", m.group(1), "include")
    for m in _CALL.finditer(code):
        add(m.start(1), m.group(1), m.group(1))
    for m in _QUALIFIED.finditer(code):
        name = m.group(0)
        for cut in range(name.count("::"), 0, -1):     # torch::cuda::is_available -> torch::cuda::* ...
            prefix = name if cut == name.count("::") else "::".join(name.split("::")[:cut + 1])
            if add(m.start(), name, prefix, "qualified"):
                break
        for i in range(m.start(), m.end()):
            seen.add(i)                              # its words are not identifiers of their own
    for m in _MEMBER.finditer(code):
        add(m.start(1), f".{m.group(1)}()", m.group(1), "member")
    for m in _WORD.finditer(code):
        word = m.group(0)
        if word[0] in table.c_initials and m.start() not in seen:   # cheap: most words start with no row's letter
            add(m.start(), word, word, "identifier")
    for m in _LAUNCH.finditer(code):
        add(m.start(1), f"{m.group(1)}<<<>>>", "<<<>>>")
    for m in _GLOBAL.finditer(code):
        add(m.start(1), f"__global__ {m.group(1)}", "__global__")
    found.sort(key=lambda f: (f.line, f.column))
    return found


def _hip_name(table, name, kind):
    from .c_rewrite import hip_name
    if name == "<<<>>>":
        return name                  # a kernel launch HIP accepts as written (hipify keeps it too)
    return hip_name(table, name, kind)


def _line_starts(text: str) -> list[int]:
    starts = [0]
    starts.extend(m.end() for m in re.finditer("\n", text))
    return starts


def _line_of(starts: list[int], pos: int) -> int:
    import bisect
    return bisect.bisect_right(starts, pos)
