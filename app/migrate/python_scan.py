"""Python sources: find CUDA-specific code with libcst, and say how each finding is rewritten.

Names are resolved through the file's imports (`import torch.distributed as dist` makes
`dist.init_process_group` the table's `torch.distributed.init_process_group`), and variables that
hold a CUDA device (`dev = "cuda"`, `device = f"cuda:{rank}"`) are followed to where the device
is used (`.to(dev)`, `device=dev`) through Python's scopes: a parameter or a local that is also
called `device` is another variable. A device string stays a string after `apply`
(`compat.device_string()`), so code that compares or splits it keeps working. Keyword arguments count only in a call whose resolved name has
them in the table (`DDP(model, device_ids=[rank])` after `from torch.nn.parallel import
DistributedDataParallel as DDP`). Only code is looked at: comments, docstrings and strings that
are not in a device position (`print("use cuda")`) never match.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from .rules import Finding, Rule, Table

_DEVICE = re.compile(r"cuda(?::(\d+))?")
_DEVICE_KWARGS = ("device", "map_location")
_DEVICE_NAME = re.compile(r"dev|type|accel", re.I)   # what a variable compared with "cuda" is called
_DEVICE_ARG_KWARGS = ("device_type", "device", "type")   # where a `device` row's call takes its device
DIST_CALLS = ("torch.distributed.init_process_group", "torch.distributed.new_group")
# NOTE: an int is a device only where a device goes (`.to(i)`, `device=i`, `torch.device(i)`) and only when the
# variable says so: assigned an int and called like one (`self.gpu_id = int(os.environ["LOCAL_RANK"])`,
# `device = 0`), or named like a rank (`rank`, `local_rank`, `gpu`) -- `.to(n)` with any other int-valued name is
# left alone, since compat.device would refuse a dtype that looked like one.
_INT_DEVICE_NAME = re.compile(r"gpu|rank|device|dev_id|devid", re.I)
_RANK_NAME = re.compile(r"(local_)?rank|gpu|gpu_id|device_id|local_gpu", re.I)
BUILD_FILES = ("setup.py",)


@dataclass
class Hit:
    """A finding plus what `migrate apply` needs: the node to change, how, and its statement."""

    finding: Finding
    rule: Rule
    node: cst.CSTNode
    stmt: cst.CSTNode | None
    action: tuple = ()              # ("compat", name) | ("to-device",) | ("device", index) | ("call", name, drop)
                                    # | ("device-string", index) | ("backend",) | ("drop",) this keyword argument
                                    # | ("accel", name, operand, negate) | ("value", name) | () nothing to change


@dataclass
class PyScan:
    module: cst.Module
    hits: list[Hit] = field(default_factory=list)

    @property
    def findings(self) -> list[Finding]:
        return [h.finding for h in self.hits]


def dotted(node) -> str | None:
    """`a.b.c` for a chain of names, else None."""
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        base = dotted(node.value)
        return f"{base}.{node.attr.value}" if base else None
    return None


def module_name(node) -> str:
    return dotted(node) or ""


def cuda_device(expr) -> tuple[bool, cst.BaseExpression | None]:
    """(True, index expression or None) when `expr` is a CUDA device string in any spelling."""
    if isinstance(expr, (cst.SimpleString, cst.ConcatenatedString)):
        value = expr.evaluated_value
        if isinstance(value, bytes):
            return False, None
        m = _DEVICE.fullmatch(value) if isinstance(value, str) else None
        if m:
            return True, (cst.Integer(m.group(1)) if m.group(1) else None)
        return False, None
    if isinstance(expr, cst.FormattedString):
        parts = expr.parts
        texts = [p for p in parts if isinstance(p, cst.FormattedStringText)]
        exprs = [p for p in parts if isinstance(p, cst.FormattedStringExpression)]
        if len(parts) == 1 and texts:
            m = _DEVICE.fullmatch(texts[0].value)
            return (True, cst.Integer(m.group(1)) if m.group(1) else None) if m else (False, None)
        if len(parts) == 2 and isinstance(parts[0], cst.FormattedStringText) and parts[0].value == "cuda:" and exprs \
                and exprs[0].format_spec is None and exprs[0].conversion is None:
            return True, exprs[0].expression
        return False, None
    if isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute) and expr.func.attr.value == "format" \
            and isinstance(expr.func.value, cst.SimpleString) and expr.func.value.evaluated_value == "cuda:{}" \
            and len(expr.args) == 1 and expr.args[0].keyword is None:      # 'cuda:{}'.format(args.gpu)
        return True, expr.args[0].value
    if isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, cst.Add) \
            and isinstance(expr.left, cst.SimpleString) and expr.left.evaluated_value == "cuda:":
        return True, expr.right
    return False, None


class _Scanner(cst.CSTVisitor):
    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self, path: str, table: Table, lines: list[str]):
        super().__init__()
        self.path, self.table, self.lines = path, table, lines
        self.aliases: dict[str, str] = {}
        self.hits: list[Hit] = []
        self.stmts: list[cst.CSTNode] = []
        self.seen: set[int] = set()
        self.skip_names: set[int] = set()
        # NOTE: plain names are followed through scopes (by the node that assigned them); dotted names
        # (`args.device`, `self.device`) have no scope and are followed by name.
        self.device_vars: dict[str, int] = {}          # dotted name -> line of the assignment
        self.device_nodes: dict[int, int] = {}         # id(assigning Name/Param) -> line of the assignment
        self.var_edges: list[tuple[cst.CSTNode, cst.CSTNode, int]] = []  # (target, source expression, line)
        self.keep_tests: list[tuple] = []              # (if statement, ids in its test) for is_available checks
        self.scopes: list[_Scope] = []                 # the module's, then each function/class/lambda's
        self.name_scope: dict[int, _Scope] = {}
        self.comparisons: list[tuple] = []             # candidate `x == "cuda"` checks
        self.uses: list[tuple[cst.CSTNode, cst.CSTNode | None]] = []
        self.device_calls: list[tuple[cst.Call, Rule, str, int | str | None, cst.CSTNode | None]] = []
        self.int_vars: set[str] = set()                # dotted names assigned an int (`gpu_id = int(...)`)

    # ---------------------------------------------------------------- plumbing
    def on_visit(self, node) -> bool:
        if isinstance(node, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
            self.stmts.append(node)
        if isinstance(node, cst.Name):
            self.name_scope[id(node)] = self.scopes[-1]
        elif isinstance(node, _SCOPES):
            self.scopes.append(_Scope(self.scopes[-1] if self.scopes else None, isinstance(node, cst.ClassDef)))
        elif isinstance(node, (cst.Global, cst.Nonlocal)):
            for n in node.names:
                self.scopes[-1].outer.add(n.name.value)
        return super().on_visit(node)

    def on_leave(self, node) -> None:
        super().on_leave(node)
        if self.stmts and self.stmts[-1] is node:
            self.stmts.pop()
        if isinstance(node, _SCOPES) and not isinstance(node, cst.Module):
            self.scopes.pop()

    def qualify(self, name: str) -> str:
        head, _, rest = name.partition(".")
        full = self.aliases.get(head, head)
        return f"{full}.{rest}" if rest else full

    def hit(self, node, rule: Rule, api: str, action: tuple = (), *, at=None, note: str = "", stmt=None) -> None:
        if id(node) in self.seen:
            return
        self.seen.add(id(node))
        pos = self.get_metadata(PositionProvider, at if at is not None else node).start
        code = self.lines[pos.line - 1].strip() if pos.line <= len(self.lines) else ""
        f = Finding(self.path, pos.line, pos.column + 1, api, rule.category, rule.severity, rule.replacement,
                    "python", rewritable=rule.rewritable, resolved=rule.resolved_by_apply, code=code, note=note)
        self.hits.append(Hit(f, rule, node, stmt if stmt is not None else (self.stmts[-1] if self.stmts else None),
                             action if rule.rewritable else ()))

    def holds_device(self, expr) -> int | None:
        """The line where the device variable `expr` (a name or a dotted name) got a CUDA device, or None."""
        if isinstance(expr, cst.Name):
            for line in self._referents(expr):
                return line
            return None
        name = dotted(expr)
        return self.device_vars.get(name) if name else None

    def _referents(self, expr: cst.Name):
        """Lines where the variable `expr` refers to got a CUDA device: the assignments of its name in the
        scope that owns it (Python's rule: the innermost function that assigns the name, class bodies
        skipped, `global`/`nonlocal` followed outwards)."""
        scope = self.name_scope.get(id(expr))
        name = expr.value
        first = scope
        while scope is not None:
            if name in scope.assigned and name not in scope.outer and not (scope.is_class and scope is not first):
                for node_id in scope.assigned[name]:
                    line = self.device_nodes.get(node_id)
                    if line is not None:
                        yield line
                return
            scope = scope.parent

    def line_of(self, node) -> int:
        return self.get_metadata(PositionProvider, node).start.line

    # ---------------------------------------------------------------- imports
    def visit_Import(self, node: cst.Import) -> bool:
        for a in node.names:
            full = module_name(a.name)
            local = a.asname.name.value if a.asname and isinstance(a.asname.name, cst.Name) else full.split(".")[0]
            self.aliases[local] = full if a.asname else local
            self._import_rule(full, a.name)
        return False

    def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
        if node.relative or node.module is None:
            return False
        mod = module_name(node.module)
        if self._import_rule(mod, node.module):
            return False
        if isinstance(node.names, cst.ImportStar):
            return False
        for a in node.names:
            name = module_name(a.name)
            local = a.asname.name.value if a.asname and isinstance(a.asname.name, cst.Name) else name
            self.aliases[local] = f"{mod}.{name}"
            if self._import_rule(f"{mod}.{name}", a.name):
                break
        return False

    def _import_rule(self, module: str, node) -> bool:
        rule = self.table.import_rule(module)
        if rule is not None:
            self.hit(node, rule, f"import {module}")
        return rule is not None

    # ---------------------------------------------------------------- names: torch.cuda.*, cudnn flags, ...
    def visit_Attribute(self, node: cst.Attribute) -> bool:
        rule = self.table.attributes.get(node.attr.value)
        if rule is not None and not self._is_module(node.value):
            name = rule.rewrite.split(":", 1)[1] if rule.rewrite else ""
            self.hit(node, rule, f".{node.attr.value}", ("accel", name, "value", False), at=node.attr)
            return True
        name = dotted(node)
        if name is None:
            return True
        self._name_rule(node, self.qualify(name))
        return False                  # the chain's inner parts (torch.cuda) are not findings of their own

    def visit_Name(self, node: cst.Name) -> None:
        if id(node) in self.skip_names or node.value not in self.aliases:
            return
        self._name_rule(node, self.aliases[node.value])

    def _name_rule(self, node, full: str) -> None:
        rule = self.table.python_rule(full)
        if rule is None or rule.kind != "name":
            return
        action = ()
        if rule.rewrite and rule.rewrite.startswith("compat:"):
            action = ("compat", rule.rewrite.split(":", 1)[1])
        elif rule.rewrite and rule.rewrite.startswith("call:"):
            action = ("value", rule.rewrite.split(":", 1)[1])
        self.hit(node, rule, full, action)

    def _is_module(self, expr) -> bool:
        base = dotted(expr)
        return bool(base) and self.qualify(base).split(".")[0] in ("torch", "numba", "cupy")

    # ---------------------------------------------------------------- device comparisons
    def visit_Comparison(self, node: cst.Comparison) -> None:
        """`x == "cuda"`, `x != "cuda"`, `"cuda" in x`, `"cuda" not in x`: True on CUDA only."""
        if len(node.comparisons) != 1:
            return
        op, right = node.comparisons[0].operator, node.comparisons[0].comparator
        for word, rule in self.table.compares.items():
            side = None
            if isinstance(op, (cst.Equal, cst.NotEqual)):
                side = "right" if _is_word(node.left, word) else "left" if _is_word(right, word) else None
            elif isinstance(op, (cst.In, cst.NotIn)) and _is_word(node.left, word):
                side = "right"
            other = right if side == "right" else node.left if side == "left" else None
            if other is None or isinstance(other, (cst.SimpleString, cst.ConcatenatedString, cst.List, cst.Tuple,
                                                   cst.Set, cst.FormattedString)):
                continue
            negate = isinstance(op, (cst.NotEqual, cst.NotIn))
            # decided in finish(), once device variables are known: `"cuda" in os.environ["NOTE"]` is no device check
            self.comparisons.append((node, rule, other, side, negate, self.stmts[-1] if self.stmts else None))

    # ---------------------------------------------------------------- `if torch.cuda.is_available(): ... elif ...`
    def visit_If(self, node: cst.If) -> None:
        """A CUDA check whose branch keeps CUDA-only calls, or that has branches for other accelerators, stays
        a CUDA check: rewriting it would send XPU/NPU machines into the CUDA branch."""
        ids = {id(n) for n in _walk(node.test)}
        body = self.get_metadata(PositionProvider, node.body)
        self.keep_tests.append((node, ids, isinstance(node.orelse, cst.If), body))

    def visit_Arg(self, node: cst.Arg) -> None:
        if node.keyword is not None:
            self.skip_names.add(id(node.keyword))

    def visit_For(self, node: cst.For) -> None:
        for t in _names(node.target):
            self._assign(t)

    def visit_WithItem(self, node: cst.WithItem) -> None:
        if node.asname is not None:
            for t in _names(node.asname.name):
                self._assign(t)

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        self._assign(node.target)

    def visit_Param(self, node: cst.Param) -> None:
        self.skip_names.add(id(node.name))
        self.scopes[-1].assigned.setdefault(node.name.value, []).append(id(node))
        if node.default is not None and self._device_context(node.default, assignment=True):
            self.device_nodes.setdefault(id(node), self.line_of(node))

    def visit_FunctionDef(self, node) -> None:
        self.skip_names.add(id(node.name))

    def visit_ClassDef(self, node) -> None:
        self.skip_names.add(id(node.name))

    # ---------------------------------------------------------------- calls
    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        name = dotted(func)
        full = self.qualify(name) if name else None
        # x.cuda(...) on anything that is not a module (`torch.cuda` is a module, not a call)
        if isinstance(func, cst.Attribute) and func.attr.value in self.table.methods:
            base = dotted(func.value)
            if not (base and self.qualify(base).split(".")[0] in ("torch", "numba", "cupy")):
                rule = self.table.methods[func.attr.value]
                self.hit(node, rule, f".{func.attr.value}()", ("to-device",), at=func.attr)
        rule = self.table.python_rule(full) if full else None
        device_where = None
        if rule is not None and rule.kind == "device":
            where, arg = _device_arg(node)
            device_where = where
            if arg is not None:
                ok, _ = cuda_device(arg)
                stmt = self.stmts[-1] if self.stmts else None
                if ok:
                    self.device_calls.append((node, rule, full, where, stmt))
                elif dotted(arg):
                    self.device_calls.append((node, rule, full, where, stmt))   # decided once variables are known
                    self.uses.append((arg, None))                              # (not a finding of its own)
                elif isinstance(arg, cst.Integer) and rule.rewrite == "device":   # torch.device(0)
                    self.device_calls.append((node, rule, full, where, stmt))
                else:
                    self._device_context(arg)
        # process-group backend strings
        for i, a in enumerate(node.args):
            kw = a.keyword.value if a.keyword else None
            if (kw == "backend" or (kw is None and i == 0 and full in DIST_CALLS)
                    or (kw == "default" and name and name.endswith("add_argument"))) \
                    and isinstance(a.value, cst.SimpleString) and a.value.evaluated_value in self.table.backends:
                r = self.table.backends[a.value.evaluated_value]
                self.hit(a.value, r, f'{full or "call"}(backend="{a.value.evaluated_value}")', ("backend",))
            if kw is not None and (full, kw) in self.table.keywords:     # DDP(model, device_ids=[rank])
                r = self.table.keywords[full, kw]
                self.hit(a, r, f"{full}({kw}={_source(a.value)})", ("drop",))
            if kw in _DEVICE_KWARGS and kw != device_where:
                self._device_context(a.value)
            elif kw is None and isinstance(func, cst.Attribute) and func.attr.value == "to":
                self._device_context(a.value)

    # ---------------------------------------------------------------- device variables
    def visit_Assign(self, node: cst.Assign) -> None:
        self._assigned([t.target for t in node.targets], node.value)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        if node.value is not None:
            self._assigned([node.target], node.value)

    def _assigned(self, targets, value) -> None:
        for t in targets:
            self._assign(t)
        if isinstance(value, cst.SimpleString) and value.evaluated_value in self.table.backends:
            r = self.table.backends[value.evaluated_value]       # backend = "nccl", later init_process_group(backend)
            self.hit(value, r, f'{_source(targets[0])} = "{value.evaluated_value}"', ("backend",))
            return
        holds = self._device_context(value, assignment=True)
        if _is_int(value):
            self.int_vars.update(n for n in map(dotted, targets) if n and _INT_DEVICE_NAME.search(n.rsplit(".", 1)[-1]))
        for t in targets:
            if not dotted(t):
                continue
            if holds:
                self._mark_device(t, self.line_of(value))
            elif dotted(value):
                self.var_edges.append((t, value, self.line_of(value)))

    def _assign(self, target) -> None:
        """Note that the current scope assigns `target` (a Name), so uses resolve to it."""
        if isinstance(target, cst.Name):
            self.scopes[-1].assigned.setdefault(target.value, []).append(id(target))

    def _mark_device(self, target, line: int) -> bool:
        """Remember that `target` (the assigned Name, or a dotted name) holds a CUDA device; True if new."""
        if isinstance(target, cst.Name):
            if id(target) in self.device_nodes:
                return False
            self.device_nodes[id(target)] = line
            return True
        name = dotted(target)
        if name in self.device_vars:
            return False
        self.device_vars[name] = line
        return True

    def _device_context(self, expr, assignment=False) -> bool:
        """Report CUDA device strings in a device position; True when `expr` holds a CUDA device."""
        ok, index = cuda_device(expr)
        if ok:
            rule = self.table.strings.get("cuda")
            if rule is not None:
                self.hit(expr, rule, f"device {_source(expr)}", ("device-string", index))
            return True
        if isinstance(expr, cst.IfExp):
            a = self._device_context(expr.body, assignment)
            b = self._device_context(expr.orelse, assignment)
            return a or b
        if isinstance(expr, cst.BooleanOperation):
            a = self._device_context(expr.left, assignment)
            b = self._device_context(expr.right, assignment)
            return a or b
        if isinstance(expr, cst.Call):
            name = dotted(expr.func)
            if name and self.qualify(name) == "torch.device":
                _, arg = _device_arg(expr)
                return arg is not None and cuda_device(arg)[0]
            return False
        if not assignment and isinstance(expr, cst.Integer):          # .to(0), device=0
            rule = self.table.strings.get("<int>")
            if rule is not None:
                self.hit(expr, rule, f"device {expr.value}", ("wrap-device",))
        elif not assignment and dotted(expr):
            self.uses.append((expr, self.stmts[-1] if self.stmts else None))
        return False

    def is_int_device(self, expr) -> bool:
        """`expr` (a name) holds an int that is used as a device: see _INT_DEVICE_NAME."""
        if isinstance(expr, cst.Integer):
            return True
        name = dotted(expr)
        if not name:
            return False
        return name in self.int_vars or bool(_RANK_NAME.fullmatch(name.rsplit(".", 1)[-1]))

    def leave_Module(self, node) -> None:
        self.finish()              # positions are only available while the wrapper visits

    def finish(self) -> None:
        """Follow `a = b` copies of device variables, then report the uses and device-arg calls."""
        changed = True
        while changed:
            changed = False
            for t, src, line in self.var_edges:
                if self.holds_device(src) is not None and self._mark_device(t, line):
                    changed = True
        rule = self.table.strings.get("cuda")
        int_rule = self.table.strings.get("<int>")
        for expr, stmt in self.uses:
            line = self.holds_device(expr)
            if stmt is not None and rule is not None and line is not None:
                self.hit(expr, rule, f"device variable {dotted(expr)}", (),
                         note=f"holds a CUDA device (line {line}); follows that line's rewrite", stmt=stmt)
            elif stmt is not None and int_rule is not None and line is None and self.is_int_device(expr):
                self.hit(expr, int_rule, f"device {dotted(expr)} (an int: accelerator i)", ("wrap-device",), stmt=stmt)
        for node, r, other, side, negate, stmt in self.comparisons:
            name = dotted(other)
            if name and (self.holds_device(other) is not None or _DEVICE_NAME.search(name.rsplit(".", 1)[-1])):
                call = r.rewrite.split(":", 1)[1] if r.rewrite else ""
                self.hit(node, r, _source(node), ("accel", call, side, negate), stmt=stmt)
        for node, r, full, where, stmt in self.device_calls:
            _, arg = _device_arg(node)
            literal = cuda_device(arg)[0]
            held = dotted(arg) and self.holds_device(arg) is not None
            if literal or held or (r.rewrite == "device" and (isinstance(arg, cst.Integer) or self.is_int_device(arg))):
                if r.rewrite == "device" and not literal:
                    # torch.device(device): the argument stays, compat.device maps it only when it names CUDA
                    plain = len(node.args) <= 2 and all(a.keyword is None and a.star == "" for a in node.args)
                    action = ("device-keep",) if plain else ()
                elif r.rewrite == "device":
                    action = ("device", _device_index(node))
                else:
                    action = ("call", r.rewrite.split(":", 1)[1] if r.rewrite else "", where)
                self.hit(node, r, f"{full}({_source(arg)})", action, at=node.func, stmt=stmt)
        self._keep_cuda_checks()
        self.hits.sort(key=lambda h: (h.finding.line, h.finding.column))

    def _keep_cuda_checks(self) -> None:
        """Un-rewrite `torch.cuda.is_available()` in an `if` that has `elif` branches (for other accelerators)
        or whose branch keeps calls `apply` cannot rewrite."""
        for node, ids, has_elif, body in self.keep_tests:
            inside = [h for h in self.hits if _within(h.finding, body)]
            stuck = [h.finding.api for h in inside if not h.rule.rewritable and h.rule.rewrite != "keep"]
            if not (has_elif or stuck):
                continue
            why = ("its elif branches serve other accelerators" if has_elif
                   else f"its branch keeps {stuck[0]}, which apply cannot rewrite")
            for h in self.hits:
                if id(h.node) in ids and h.action:
                    h.action = ()
                    h.finding.rewritable = False
                    h.finding.resolved = True        # nothing to do: the branches already handle it
                    h.finding.note = f"kept as a CUDA check: {why}"


class _Scope:
    """A Python scope: the names it assigns (name -> ids of the assigning nodes)."""

    __slots__ = ("parent", "is_class", "assigned", "outer")

    def __init__(self, parent, is_class: bool):
        self.parent, self.is_class = parent, is_class
        self.assigned: dict[str, list[int]] = {}
        self.outer: set[str] = set()          # global / nonlocal names


_SCOPES = (cst.Module, cst.FunctionDef, cst.ClassDef, cst.Lambda)


def _names(target):
    """The Names a target binds (`a`, `a, b`, `(a, [b, c])`)."""
    if isinstance(target, cst.Name):
        yield target
    elif isinstance(target, (cst.Tuple, cst.List)):
        for el in target.elements:
            yield from _names(el.value)


def _is_word(expr, word: str) -> bool:
    return isinstance(expr, cst.SimpleString) and expr.evaluated_value == word


def _walk(node):
    yield node
    for child in node.children:
        yield from _walk(child)


def _within(f, body) -> bool:
    return (body.start.line, body.start.column) <= (f.line, f.column - 1) <= (body.end.line, body.end.column)


def _device_arg(call: cst.Call):
    """(position or keyword, expression) of the device argument of torch.device/autocast/GradScaler."""
    for i, a in enumerate(call.args):
        if a.keyword is None and i == 0 and a.star == "":
            return 0, a.value
        if a.keyword is not None and a.keyword.value in _DEVICE_ARG_KWARGS:
            return a.keyword.value, a.value
    return None, None


def _device_index(call: cst.Call):
    """The index expression of `torch.device("cuda", i)` / `torch.device("cuda:1")`, or None."""
    where, arg = _device_arg(call)
    _, index = cuda_device(arg)
    for i, a in enumerate(call.args):
        if (a.keyword is None and i == 1) or (a.keyword is not None and a.keyword.value == "index"):
            index = a.value
    return index


def _is_int(expr) -> bool:
    """An int literal or an `int(...)` call."""
    if isinstance(expr, cst.Integer):
        return True
    return isinstance(expr, cst.Call) and isinstance(expr.func, cst.Name) and expr.func.value == "int"


def is_build_file(path: str) -> bool:
    """setup.py: its findings are suggestions, never edits -- a build must not need opscope to run."""
    return path.replace("\\", "/").rsplit("/", 1)[-1] in BUILD_FILES


def _source(node) -> str:
    return cst.Module(body=[]).code_for_node(node)


def scan_python(path: str, source: bytes | str, table: Table) -> PyScan | Finding:
    """The findings of one file, or a parse-error Finding."""
    try:
        module = cst.parse_module(source)
    except cst.ParserSyntaxError as e:
        line, col, msg = e.raw_line, e.raw_column + 1, (str(e).strip().splitlines() or ["syntax error"])[0]
        try:       # Python's own parser names the place users know from tracebacks
            compile(source, path, "exec", flags=0x400, dont_inherit=True)
            msg = f"libcst cannot parse this file: {msg}"
        except SyntaxError as py:
            line, col, msg = py.lineno or line, py.offset or col, py.msg
        except ValueError:
            pass
        return Finding(path, line, col, "parse-error", "parse-error", "error",
                       "fix the syntax error; the file was not scanned", "python", note=msg)
    except (UnicodeDecodeError, SyntaxError, ValueError) as e:   # bad encoding cookie, undecodable bytes
        return Finding(path, 1, 1, "parse-error", "parse-error", "error",
                       "fix the file's encoding; the file was not scanned", "python", note=str(e).splitlines()[0])
    text = module.code
    scanner = _Scanner(path, table, text.splitlines())
    MetadataWrapper(module, unsafe_skip_copy=True).visit(scanner)
    if is_build_file(path):
        for h in scanner.hits:
            if h.action:
                h.action = ()
                h.finding.rewritable = h.finding.resolved = False
                h.finding.note = "a build file: not rewritten, a build must not need opscope"
    return PyScan(module, scanner.hits)
