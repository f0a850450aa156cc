"""`opscope migrate apply`: rewrite the Python findings that have a safe replacement.

The scanner already knows, per finding, which node to change and how (Hit.action); this module
turns those actions into libcst edits, so formatting and comments outside the edits survive.
Findings without a safe rewrite get a `# opscope-migrate: ...` line above their statement.
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass

import libcst as cst

from .python_scan import Hit, PyScan

MARK = "# opscope-migrate:"
IMPORT = "from opscope.app.migrate import compat"


@dataclass
class FileRewrite:
    path: str
    before: str
    after: str
    rewritten: int           # findings changed in the code
    marked: int              # findings left with a comment

    @property
    def changed(self) -> bool:
        return self.before != self.after

    def diff(self) -> str:
        return "".join(difflib.unified_diff(self.before.splitlines(keepends=True), self.after.splitlines(keepends=True),
                                            fromfile=f"a/{self.path}", tofile=f"b/{self.path}"))


def _compat(name: str, *args: cst.Arg) -> cst.Call:
    return cst.Call(func=cst.Attribute(cst.Name("compat"), cst.Name(name)), args=list(args))


def _device_call(index, name: str = "device") -> cst.Call:
    return _compat(name, cst.Arg(index)) if index is not None else _compat(name)


def _strip_commas(args: list[cst.Arg]) -> list[cst.Arg]:
    """The last argument must not keep a trailing comma it had as a middle one (libcst keeps them per arg)."""
    if args and args[-1].comma is not cst.MaybeSentinel.DEFAULT:
        args[-1] = args[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
    return args


def _drop_args(args, drop: set[int]) -> list[cst.Arg]:
    """`args` without the ones at the indices in `drop`. When the last goes, the last one left takes over its
    ending (no comma, or the trailing comma and the line break before `)`) but keeps its own end-of-line comment."""
    keep = [a for i, a in enumerate(args) if i not in drop]
    if not keep or len(args) - 1 not in drop:
        return keep
    new, last = keep[-1], args[-1]
    own = new.comma.whitespace_after if isinstance(new.comma, cst.Comma) else new.whitespace_after_arg
    if isinstance(last.comma, cst.Comma):
        keep[-1] = new.with_changes(comma=last.comma.with_changes(
            whitespace_after=_line_end(own, last.comma.whitespace_after)))
    else:
        keep[-1] = new.with_changes(comma=cst.MaybeSentinel.DEFAULT,
                                    whitespace_after_arg=_line_end(own, last.whitespace_after_arg))
    return keep


def _line_end(own, end):
    """`end`, the space before `)`, with the comment `own` had at the end of its line when both break the line."""
    if isinstance(own, cst.ParenthesizedWhitespace) and isinstance(end, cst.ParenthesizedWhitespace):
        return end.with_changes(first_line=own.first_line)
    return end


def _edit(action: tuple, node: cst.CSTNode) -> cst.CSTNode:
    kind = action[0]
    if kind == "compat":          # torch.cuda.synchronize -> compat.synchronize (the call's arguments stay)
        return cst.Attribute(cst.Name("compat"), cst.Name(action[1]))
    if kind == "device":          # torch.device("cuda", 1) -> compat.device(1)
        return _device_call(action[1])
    if kind == "device-keep":     # torch.device(device) -> compat.device(device): the arguments stay
        return node.with_changes(func=cst.Attribute(cst.Name("compat"), cst.Name("device")))
    if kind == "wrap-device":     # .to(self.gpu_id) -> .to(compat.device(self.gpu_id))
        return _compat("device", cst.Arg(node))
    if kind == "device-string":   # "cuda:1" -> compat.device_string(1): a string stays a string
        return _device_call(action[1], "device_string")
    if kind == "value":           # ProfilerActivity.CUDA -> compat.profiler_activity()
        return _compat(action[1])
    if kind == "accel":           # x == "cuda" / "cuda" in x / x.is_cuda -> compat.is_accelerator(x)
        name, side, negate = action[1], action[2], action[3]
        if side == "value":
            operand = node.value
        elif side == "left":
            operand = node.left
        else:
            operand = node.comparisons[0].comparator
        call = _compat(name, cst.Arg(operand.with_changes(lpar=[], rpar=[]) if hasattr(operand, "lpar") else operand))
        if negate:
            return cst.UnaryOperation(operator=cst.Not(), expression=call)
        return call.with_changes(lpar=node.lpar, rpar=node.rpar) if getattr(node, "lpar", None) else call
    if kind == "backend":         # "nccl" -> compat.distributed_backend()
        return _compat("distributed_backend")
    if kind == "to-device":       # x.cuda(i, non_blocking=True) -> x.to(compat.device(i), non_blocking=True)
        index, rest = None, []
        for a in node.args:
            if (a.keyword is None and index is None and a.star == "") or (a.keyword and a.keyword.value == "device"):
                index = a.value
            else:
                rest.append(a)
        first = cst.Arg(_device_call(index), comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")) if rest else
                        cst.MaybeSentinel.DEFAULT)
        return node.with_changes(func=node.func.with_changes(attr=cst.Name("to")), args=_strip_commas([first, *rest]))
    if kind == "call":            # torch.autocast("cuda", dtype=...) -> compat.autocast(dtype=...)
        name, where = action[1], action[2]
        drop = {i for i, a in enumerate(node.args)
                if (where == 0 and i == 0 and a.keyword is None) or (a.keyword and a.keyword.value == where)}
        return node.with_changes(func=cst.Attribute(cst.Name("compat"), cst.Name(name)),
                                 args=_drop_args(node.args, drop))
    raise ValueError(f"unknown rewrite {kind}")


class _Rewriter(cst.CSTTransformer):
    def __init__(self, hits: list[Hit], module: cst.Module):
        super().__init__()
        # NOTE: comments above a file's first statement belong to the module header, not to the statement
        self.first = module.body[0] if module.body else None
        self.header = {line.comment.value for line in module.header if line.comment}
        self.edits = {h.node: h.action for h in hits if h.action and h.action != ("drop",)}
        self.drops = {h.node for h in hits if h.action == ("drop",)}     # keyword arguments: their call edits them
        self.marks: dict[cst.CSTNode, list[str]] = {}
        for h in hits:
            if not h.action and h.stmt is not None and h.finding.note.find("follows that line") < 0:
                f = h.finding
                why = (f"{f.api} is a no-op off CUDA" if h.rule.rewrite == "keep"
                       else f"{f.api} {f.note}" if f.note.startswith("kept as")
                       else f"{f.api}: no automatic rewrite; instead: {f.replacement}")
                self.marks.setdefault(h.stmt, [])
                if why not in self.marks[h.stmt]:
                    self.marks[h.stmt].append(why)
        self.rewritten = 0
        self.marked = 0
        self.uses_compat = False

    def on_leave(self, original, updated):
        updated = super().on_leave(original, updated)
        if isinstance(original, cst.Call) and isinstance(updated, cst.Call):
            drop = {i for i, a in enumerate(original.args) if a in self.drops}
            if drop:
                updated = updated.with_changes(args=_drop_args(updated.args, drop))
                self.rewritten += len(drop)
        action = self.edits.get(original)
        if action and isinstance(updated, cst.CSTNode):
            updated = _edit(action, updated)
            self.rewritten += 1
            self.uses_compat = True
        if original in self.marks and hasattr(updated, "leading_lines"):
            have = {line.comment.value for line in updated.leading_lines if line.comment}
            if original is self.first:
                have |= self.header
            new = [cst.EmptyLine(comment=cst.Comment(f"{MARK} {why}")) for why in self.marks[original]
                   if f"{MARK} {why}" not in have]
            self.marked += len(self.marks[original])
            if new:
                updated = updated.with_changes(leading_lines=[*updated.leading_lines, *new])
        return updated


def _has_import(module: cst.Module) -> bool:
    return IMPORT in module.code or "import opscope.app.migrate.compat as compat" in module.code


def _add_import(module: cst.Module) -> cst.Module:
    """Put the compat import after the file's leading docstring, __future__ imports and imports."""
    body = list(module.body)
    at = 0
    for i, stmt in enumerate(body):
        if isinstance(stmt, cst.SimpleStatementLine) and all(
                isinstance(s, (cst.Import, cst.ImportFrom)) or (i == 0 and isinstance(s, cst.Expr)
                                                                and isinstance(s.value, (cst.SimpleString,
                                                                                         cst.ConcatenatedString)))
                for s in stmt.body):
            at = i + 1
        else:
            break
    line = cst.parse_statement(IMPORT + "\n")
    body.insert(at, line)
    return module.with_changes(body=body)


def rewrite(path: str, scan: PyScan) -> FileRewrite:
    before = scan.module.code
    rw = _Rewriter(scan.hits, scan.module)
    module = scan.module.visit(rw)
    if rw.uses_compat and not _has_import(module):
        module = _add_import(module)
    return FileRewrite(path, before, module.code, rw.rewritten, rw.marked)


def verify(fr: FileRewrite) -> tuple[str | None, list]:
    """(what is wrong with the rewritten file or None, the findings it still has).

    A rewrite is refused when its result does not parse, or when scanning the result would rewrite
    again (apply must be idempotent: a second run changes nothing)."""
    from .python_scan import scan_python
    from .rules import Finding, default_table
    try:
        compile(fr.after, fr.path, "exec", flags=0x400, dont_inherit=True)   # parse only
    except (SyntaxError, ValueError) as e:
        return f"the rewritten file does not parse ({getattr(e, 'msg', e)} at line {getattr(e, 'lineno', '?')})", []
    again = scan_python(fr.path, fr.after, default_table())
    if isinstance(again, Finding):
        return f"the rewritten file does not parse ({again.note})", []
    twice = [h.finding for h in again.hits if h.action]
    if twice:
        f = twice[0]
        return f"a second apply would rewrite {f.api} at line {f.line} again (a bug in opscope: please report it)", []
    return None, again.findings
