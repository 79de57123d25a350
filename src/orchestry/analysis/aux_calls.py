"""How the entry point of main's code uses the helper ``aux``: :func:`aux_uses` (calls and value references, the
context of each, whether a value is ignored, the signals scheme detection names a scheme from) and
:func:`is_wrapper_body` (a body that only returns aux's value).

Scoping follows Python's rules (:mod:`orchestry.analysis.code_ast`, whose docstring has them): a shadowed ``aux`` is
not the helper, and calls into main's other top-level functions are followed (depth <= 8, cycles cut). Nothing
here runs the code.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from orchestry.analysis.code_ast import _COMPS, _FUNCS, _choose_entry, _target_names, bound_names, safe_parse

_MAX_FOLLOW_DEPTH = 8


@dataclass(frozen=True)
class AuxCallInfo:
    """What the cooperation level of the reward and the scheme analysis need to know about ``main``.

    Attributes:
        parsed: main's code parses.
        entry_found: the entry point is defined at the top level of main's code.
        calls_aux: the entry point calls or references the helper ``aux`` (directly, in a nested function,
            lambda or comprehension, or through another top-level function of main's code that it calls).
        call_sites: number of aux call sites and value references reached (following main's own functions).
        is_wrapper: the entry point's body has a wrapper shape (``return aux(x)``, ``y = aux(x); return y``)
            or is empty (only a docstring / ``pass`` / ``...``); a shape only: combine with ``calls_aux``.
        ignored_lines: line numbers (in main's code) of aux calls whose value is ignored: a bare expression
            statement ``aux(x)``, or ``v = aux(x)`` with ``v`` never read in that function.
        redefines_aux: main's module binds ``aux`` itself (``def aux``, ``aux = ...``, ``import .. as aux``).
        signals: the evidence found (``try``, ``none_check``, ``or_default``, ``test``, ``filter``, ``loop``,
            ``passed``, ``multi``), for debugging and tests.
        scheme: one of :data:`orchestry.analysis.schemes.SCHEMES`, set by :func:`orchestry.analysis.schemes.aux_call_info`
            (``"none"`` as :func:`aux_uses` returns it).
    """

    parsed: bool = False
    entry_found: bool = False
    calls_aux: bool = False
    call_sites: int = 0
    is_wrapper: bool = False
    ignored_lines: tuple[int, ...] = ()
    redefines_aux: bool = False
    signals: frozenset[str] = frozenset()
    scheme: str = "none"

    @property
    def ignores_value(self) -> bool:
        """True when at least one aux call's value is ignored (the reward's -0.5 case)."""
        return bool(self.ignored_lines)


# ---------------------------------------------------------------------------------------------------------
# the wrapper shape
# ---------------------------------------------------------------------------------------------------------
def _docstring_free_body(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[ast.stmt]:
    """The body without its docstring, ``pass`` statements and bare ``...``."""
    out = []
    for i, stmt in enumerate(fn.body):
        if isinstance(stmt, ast.Pass):
            continue
        if (
            isinstance(stmt, ast.Expr)
            and isinstance(stmt.value, ast.Constant)
            and (stmt.value.value is Ellipsis or (i == 0 and isinstance(stmt.value.value, str)))
        ):
            continue
        out.append(stmt)
    return out


def _is_plain(expr: ast.AST) -> bool:
    """A pass-through argument: a name, constant, attribute or subscript of those (no computation)."""
    if isinstance(expr, (ast.Name, ast.Constant)):
        return True
    if isinstance(expr, ast.Starred):
        return _is_plain(expr.value)
    if isinstance(expr, ast.Attribute):
        return _is_plain(expr.value)
    if isinstance(expr, ast.Subscript):
        return _is_plain(expr.value) and _is_plain(expr.slice)
    if isinstance(expr, ast.Slice):
        return all(p is None or _is_plain(p) for p in (expr.lower, expr.upper, expr.step))
    if isinstance(expr, ast.Tuple):
        return all(_is_plain(e) for e in expr.elts)
    return False


def _is_plain_aux_call(expr: ast.AST | None, aux_name: str) -> bool:
    if isinstance(expr, ast.Await):
        expr = expr.value
    return (
        isinstance(expr, ast.Call)
        and isinstance(expr.func, ast.Name)
        and expr.func.id == aux_name
        and all(_is_plain(a) for a in expr.args)
        and all(_is_plain(k.value) for k in expr.keywords)
    )


def is_wrapper_body(fn: ast.FunctionDef | ast.AsyncFunctionDef, aux_name: str = "aux") -> bool:
    """True when ``fn`` only returns aux's value, or has an empty body (CoMLRL's ``is_wrapper_function``).

    Wrapper shapes (docstring, ``pass`` and ``...`` ignored): ``[]``; ``return aux(args)``; ``v = aux(args); return
    v`` (also annotated), with any number of copies between them: statements ``a = b`` that only rename a value
    (``r = aux(xs); r = r; return r``, ``y = xs; r = aux(y); s = r; return s``). A copy computes nothing, so it
    must not turn a wrapper into cooperation: MAGRPO after the warm start learned ``r = r`` for the extra bonus
    (reports/experiments/warm_start_default/reward_hole). ``args`` must be plain (see :func:`_is_plain`). Whether ``aux`` there is
    the helper (not shadowed) is the caller's concern.
    """
    body = _docstring_free_body(fn)
    if not body:
        return True
    holders: set[str] = set()  # names that hold aux's value at this point
    for stmt in body[:-1]:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
            target, value = stmt.targets[0], stmt.value
        elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
            target, value = stmt.target, stmt.value
        else:
            return False
        if not isinstance(target, ast.Name):
            return False
        if _is_plain_aux_call(value, aux_name):
            holders.add(target.id)
        elif isinstance(value, ast.Name) and value.id != aux_name:
            # a copy: the target holds aux's value exactly when the source does
            (holders.add if value.id in holders else holders.discard)(target.id)
        else:
            return False
    last = body[-1]
    if not isinstance(last, ast.Return) or last.value is None:
        return False
    return _is_plain_aux_call(last.value, aux_name) or (
        isinstance(last.value, ast.Name) and last.value.id in holders
    )


# ---------------------------------------------------------------------------------------------------------
# the per-function analysis
# ---------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Ctx:
    shadowed: bool = False  # `aux` in this scope is not the helper
    loop: bool = False  # evaluated repeatedly (loop body, comprehension, lambda passed to a call)
    in_try: bool = False  # inside the body of a try with a real except handler


@dataclass
class _Facts:
    calls: list[ast.Call] = field(default_factory=list)
    refs: list[ast.Name] = field(default_factory=list)  # aux used as a value (not called here)
    signals: set[str] = field(default_factory=set)
    tests: list[ast.expr] = field(default_factory=list)  # branch conditions, checked after taint analysis
    ors: list[ast.BoolOp] = field(default_factory=list)
    ignored: list[int] = field(default_factory=list)
    local_calls: list[tuple[str, bool]] = field(default_factory=list)  # (main's own function, repeated)


class _Analyser:
    """Collects aux uses in one function, honouring Python scopes (see module docstring)."""

    def __init__(self, aux_name: str, local_funcs: set[str]):
        self.aux = aux_name
        self.local_funcs = local_funcs
        self.facts = _Facts()
        self.func_shadow: set[str] = set()  # main's own function names shadowed in the current scope chain

    # -- entry --------------------------------------------------------------------------------------------
    def analyse(self, fn: ast.FunctionDef | ast.AsyncFunctionDef) -> _Facts:
        for d in fn.decorator_list:  # evaluated in the module scope: `@aux` wraps the entry point in aux
            self._expr(d, _Ctx())
        local = bound_names(fn)
        ctx = _Ctx(shadowed=self.aux in local)
        self.func_shadow = local & self.local_funcs
        self._stmts(fn.body, ctx)
        self._ignored_assignments(fn)
        return self.facts

    # -- statements -----------------------------------------------------------------------------------------
    def _stmts(self, stmts: Iterable[ast.stmt], ctx: _Ctx) -> None:
        for stmt in stmts:
            self._stmt(stmt, ctx)

    def _stmt(self, node: ast.stmt, ctx: _Ctx) -> None:
        if isinstance(node, _FUNCS):
            for d in node.decorator_list:
                self._expr(d, ctx)
            self._defaults(node.args, ctx)
            self._function_scope(node, ctx)
        elif isinstance(node, ast.ClassDef):
            for e in (*node.decorator_list, *node.bases, *(k.value for k in node.keywords)):
                self._expr(e, ctx)
            inner = replace(ctx, shadowed=ctx.shadowed or self.aux in bound_names(node))
            self._stmts(node.body, inner)
        elif isinstance(node, (ast.For, ast.AsyncFor)):
            self._expr(node.iter, ctx)
            self._expr(node.target, ctx)
            self._stmts(node.body, replace(ctx, loop=True))
            self._stmts(node.orelse, ctx)
        elif isinstance(node, ast.While):
            self.facts.tests.append(node.test)
            self._expr(node.test, replace(ctx, loop=True))
            self._stmts(node.body, replace(ctx, loop=True))
            self._stmts(node.orelse, ctx)
        elif isinstance(node, ast.If):
            self.facts.tests.append(node.test)
            self._expr(node.test, ctx)
            self._stmts(node.body, ctx)
            self._stmts(node.orelse, ctx)
        elif isinstance(node, (ast.Try, ast.TryStar)):
            catches = any(not _only_reraises(h) for h in node.handlers)
            self._stmts(node.body, replace(ctx, in_try=ctx.in_try or catches))
            for h in node.handlers:
                if h.type is not None:
                    self._expr(h.type, ctx)
                self._stmts(h.body, ctx)
            self._stmts(node.orelse, ctx)
            self._stmts(node.finalbody, ctx)
        elif isinstance(node, ast.Expr):
            value = node.value.value if isinstance(node.value, ast.Await) else node.value
            if self._is_aux_call(value, ctx):
                self.facts.ignored.append(node.lineno)
            self._expr(node.value, ctx)
        else:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.stmt):
                    self._stmt(child, ctx)
                elif isinstance(child, ast.expr):
                    self._expr(child, ctx)
                else:  # withitem, match_case, keyword, ...
                    self._other(child, ctx)

    def _other(self, node: ast.AST, ctx: _Ctx) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.stmt):
                self._stmt(child, ctx)
            elif isinstance(child, ast.expr):
                self._expr(child, ctx)
            else:
                self._other(child, ctx)

    def _defaults(self, args: ast.arguments, ctx: _Ctx) -> None:
        for d in (*args.defaults, *(d for d in args.kw_defaults if d is not None)):
            self._expr(d, ctx)

    def _function_scope(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda, ctx: _Ctx) -> None:
        local = bound_names(node)
        saved = self.func_shadow
        self.func_shadow = saved | (local & self.local_funcs)
        inner = _Ctx(
            shadowed=ctx.shadowed or self.aux in local, loop=ctx.loop and isinstance(node, ast.Lambda)
        )
        if isinstance(node, ast.Lambda):
            self._expr(node.body, inner)
        else:
            self._stmts(node.body, inner)
        self.func_shadow = saved

    # -- expressions ----------------------------------------------------------------------------------------
    def _is_aux_call(self, node: ast.AST, ctx: _Ctx) -> bool:
        return (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == self.aux
            and not ctx.shadowed
        )

    def _expr(self, node: ast.AST, ctx: _Ctx) -> None:
        if isinstance(node, ast.Call):
            self._call(node, ctx)
        elif isinstance(node, ast.Name):
            if node.id == self.aux and isinstance(node.ctx, ast.Load) and not ctx.shadowed:
                self.facts.refs.append(node)
            elif (
                node.id in self.local_funcs
                and node.id not in self.func_shadow
                and isinstance(node.ctx, ast.Load)
            ):  # main's own function used as a value: map(g, xs)
                self.facts.local_calls.append((node.id, True))
        elif isinstance(node, ast.Lambda):
            self._defaults(node.args, ctx)
            self._function_scope(node, ctx)
        elif isinstance(node, _COMPS):
            self._comprehension(node, ctx)
        elif isinstance(node, ast.IfExp):
            self.facts.tests.append(node.test)
            for child in (node.test, node.body, node.orelse):
                self._expr(child, ctx)
        elif isinstance(node, ast.BoolOp):
            if isinstance(node.op, ast.Or):
                self.facts.ors.append(node)
            for v in node.values:
                self._expr(v, ctx)
        else:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.expr):
                    self._expr(child, ctx)
                else:
                    self._other(child, ctx)

    def _call(self, node: ast.Call, ctx: _Ctx) -> None:
        func = node.func
        callee = func.id if isinstance(func, ast.Name) else None
        if callee == self.aux and not ctx.shadowed:
            self.facts.calls.append(node)
            if ctx.loop:
                self.facts.signals.add("loop")
            if ctx.in_try:
                self.facts.signals.add("try")
        elif callee in self.local_funcs and callee not in self.func_shadow:
            self.facts.local_calls.append((callee, ctx.loop))
        else:
            self._expr(func, ctx)
        values = [*node.args, *(k.value for k in node.keywords)]
        for v in values:
            inner = v.value if isinstance(v, ast.Starred) else v
            if isinstance(inner, ast.Name) and inner.id == self.aux and not ctx.shadowed:
                # aux passed as a value: map(aux, xs), sorted(xs, key=aux), filter(aux, xs)
                self.facts.refs.append(inner)
                self.facts.signals.add("filter" if callee == "filter" else "passed")
            elif isinstance(inner, ast.Lambda):
                # a lambda handed to another call is (usually) called repeatedly: sorted(key=...), map
                self._defaults(inner.args, ctx)
                self._function_scope(inner, replace(ctx, loop=True))
            else:
                self._expr(v, ctx)

    def _comprehension(self, node: ast.ListComp | ast.SetComp | ast.GeneratorExp | ast.DictComp, ctx: _Ctx):
        self._expr(node.generators[0].iter, ctx)  # evaluated once, in the enclosing scope
        local = bound_names(node)
        saved = self.func_shadow
        self.func_shadow = saved | (local & self.local_funcs)
        inner = _Ctx(shadowed=ctx.shadowed or self.aux in local, loop=True)
        for i, gen in enumerate(node.generators):
            if i > 0:
                self._expr(gen.iter, inner)
            for cond in gen.ifs:
                self.facts.tests.append(cond)
                self._expr(cond, inner)
        elts = (node.key, node.value) if isinstance(node, ast.DictComp) else (node.elt,)
        for e in elts:
            self._expr(e, inner)
        self.func_shadow = saved

    # -- after the walk -------------------------------------------------------------------------------------
    def _ignored_assignments(self, fn: ast.AST) -> None:
        """``v = aux(x)`` with ``v`` never read anywhere in ``fn`` also ignores aux's value (CoMLRL)."""
        call_ids = {id(c) for c in self.facts.calls}
        loads = {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
        for node in ast.walk(fn):
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                target, value = node.targets[0], node.value
            elif isinstance(node, ast.AnnAssign) and node.value is not None:
                target, value = node.target, node.value
            else:
                continue
            value = value.value if isinstance(value, ast.Await) else value
            if isinstance(target, ast.Name) and id(value) in call_ids and target.id not in loads:
                self.facts.ignored.append(node.lineno)


def _only_reraises(handler: ast.ExceptHandler) -> bool:
    body = [s for s in handler.body if not isinstance(s, ast.Pass)]
    return len(body) == 1 and isinstance(body[0], ast.Raise)


def _tainted_names(fn: ast.AST, call_ids: set[int]) -> set[str]:
    """Names assigned straight from an expression holding an aux call (``r = aux(x)``, ``n = len(aux(x))``).

    One step only, and not ``+=``: an accumulator (``total += aux(v)``) later tested is a coordinator's
    combination, not aux choosing a branch.
    """
    tainted: set[str] = set()
    for node in ast.walk(fn):
        if isinstance(node, ast.Assign):
            targets, value = [n for t in node.targets for n in _target_names(t)], node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = list(_target_names(node.target)), node.value
        elif isinstance(node, ast.NamedExpr):
            targets, value = [node.target.id], node.value
        else:
            continue
        if any(id(n) in call_ids for n in ast.walk(value)):
            tainted.update(targets)
    return tainted


def _mentions(expr: ast.AST, call_ids: set[int], tainted: set[str]) -> bool:
    for n in ast.walk(expr):
        if id(n) in call_ids:
            return True
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.id in tainted:
            return True
    return False


def _is_none(expr: ast.AST) -> bool:
    return isinstance(expr, ast.Constant) and expr.value is None


def _none_check(test: ast.AST, call_ids: set[int], tainted: set[str]) -> bool:
    """``test`` compares aux's result with ``None`` (``is``, ``is not``, ``==``, ``!=``)."""
    for n in ast.walk(test):
        if not isinstance(n, ast.Compare):
            continue
        operands = [n.left, *n.comparators]
        for i, op in enumerate(n.ops):
            if not isinstance(op, (ast.Is, ast.IsNot, ast.Eq, ast.NotEq)):
                continue
            a, b = operands[i], operands[i + 1]
            if (_is_none(b) and _mentions(a, call_ids, tainted)) or (
                _is_none(a) and _mentions(b, call_ids, tainted)
            ):
                return True
    return False


def _signals(fn: ast.AST, facts: _Facts) -> set[str]:
    signals = set(facts.signals)
    call_ids = {id(c) for c in facts.calls}
    if not call_ids:
        return signals
    tainted = _tainted_names(fn, call_ids)
    for test in facts.tests:
        if _none_check(test, call_ids, tainted):
            signals.add("none_check")
        elif _mentions(test, call_ids, tainted):
            signals.add("test")
    in_tests = {id(n) for test in facts.tests for n in ast.walk(test)}
    for boolop in facts.ors:
        if id(boolop) not in in_tests and any(_mentions(v, call_ids, tainted) for v in boolop.values[:-1]):
            signals.add("or_default")
    return signals


# ---------------------------------------------------------------------------------------------------------
# public API
# ---------------------------------------------------------------------------------------------------------
def aux_uses(main_code: str, entry_point: str | None = None, aux_name: str = "aux") -> AuxCallInfo:
    """Analyse how the entry point of ``main_code`` uses the helper ``aux_name``.

    Args:
        main_code: main's code (already extracted from the model's answer), one module.
        entry_point: the problem's function name; ``None`` takes the last top-level function not named
            ``aux_name``.
        aux_name: the helper's function name.

    Returns:
        An :class:`AuxCallInfo` whose ``scheme`` is left ``"none"`` (:func:`orchestry.analysis.schemes.aux_call_info`
        names the scheme from ``signals``); never raises (unparsable or pathological code gives
        ``parsed=False``).
    """
    tree = safe_parse(main_code)
    if tree is None:
        return AuxCallInfo()
    try:
        return _info(tree, entry_point, aux_name)
    except (RecursionError, MemoryError):
        return AuxCallInfo(parsed=True)


def _info(tree: ast.Module, entry_point: str | None, aux_name: str) -> AuxCallInfo:
    fn = _choose_entry(tree, entry_point, aux_name)
    if fn is None:
        return AuxCallInfo(parsed=True)
    redefines = aux_name in bound_names(tree)
    is_wrapper = is_wrapper_body(fn, aux_name)
    if redefines:
        return AuxCallInfo(parsed=True, entry_found=True, is_wrapper=is_wrapper, redefines_aux=True)
    funcs = {n.name: n for n in tree.body if isinstance(n, _FUNCS) and n.name not in (aux_name, fn.name)}

    signals: set[str] = set()
    sites = 0
    ignored: list[int] = []
    seen: set[str] = set()

    def visit(node, repeated: bool, depth: int) -> int:
        nonlocal sites
        facts = _Analyser(aux_name, set(funcs)).analyse(node)
        own = len(facts.calls) + len(facts.refs)
        sites += own
        signals.update(_signals(node, facts))
        if repeated and own:
            signals.add("loop")
        ignored.extend(facts.ignored)
        used = own
        counts: dict[str, int] = {}
        for name, _ in facts.local_calls:
            counts[name] = counts.get(name, 0) + 1
        for name, in_loop in facts.local_calls:
            if name in seen or depth >= _MAX_FOLLOW_DEPTH:
                continue
            seen.add(name)
            used += visit(funcs[name], repeated or in_loop or counts[name] > 1, depth + 1)
        return used

    seen.add(fn.name)
    visit(fn, False, 0)
    if sites >= 2:
        signals.add("multi")
    calls_aux = sites > 0
    return AuxCallInfo(
        parsed=True,
        entry_found=True,
        calls_aux=calls_aux,
        call_sites=sites,
        is_wrapper=is_wrapper,
        ignored_lines=tuple(sorted(set(ignored))),
        redefines_aux=False,
        signals=frozenset(signals),
    )
