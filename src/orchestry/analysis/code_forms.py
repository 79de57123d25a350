"""The template checks of the collapse metrics (docs/metrics.md) on model-written Python: :func:`chain_form` (the
problem generator's ``r = ...; return r`` shape) and :func:`normalized_solution` (a program up to local names,
comments, docstrings and formatting). Code is read by :mod:`orchestry.analysis.code_ast`; nothing here runs it.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from orchestry.analysis.code_ast import _FUNCS, _choose_entry, safe_parse


def _is_docstring(stmt: ast.stmt) -> bool:
    return (
        isinstance(stmt, ast.Expr)
        and isinstance(stmt.value, ast.Constant)
        and isinstance(stmt.value.value, str)
    )


def _assigned_name(stmt: ast.stmt, first: bool) -> str | None:
    """The one name ``stmt`` assigns (``r = ...``, ``r: T = ...``; also ``r += ...`` unless ``first``), else None."""
    annotated = isinstance(stmt, ast.AnnAssign) and stmt.value is not None
    augmented = isinstance(stmt, ast.AugAssign) and not first
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
        target = stmt.targets[0]
    elif annotated or augmented:
        target = stmt.target
    else:
        return None
    return target.id if isinstance(target, ast.Name) else None


def chain_form(code: object, entry_point: str | None = None, aux_name: str = "aux") -> bool:
    """Whether the entry point of ``code`` has the problem generator's one solution shape, the *chain form*::

        def f(xs):
            r = aux(xs)                # the argument, a call of aux or any expression
            r = [x * 2 for x in r]     # any number of further assignments to the same single name
            return r

    The body (a leading docstring skipped) is at least two statements; every statement but the last assigns one
    single name, the same throughout (``r = ...``, annotated ``r: T = ...``, or ``r += ...`` after the first);
    the last is ``return <that name>``. A policy that writes this shape on every task writes a template
    (:func:`orchestry.analysis.metrics.chain_form_rate`).

    Args:
        code: main's code (already extracted from the answer); anything that does not parse gives False.
        entry_point: the problem's function name (False when it is not defined at the top level); ``None`` takes
            the last top-level function not named ``aux_name``.
    """
    tree = safe_parse(code)
    fn = None if tree is None else _choose_entry(tree, entry_point, aux_name)
    if fn is None:
        return False
    body = fn.body[1:] if fn.body and _is_docstring(fn.body[0]) else fn.body
    if len(body) < 2:
        return False
    names = {_assigned_name(stmt, i == 0) for i, stmt in enumerate(body[:-1])}
    if len(names) != 1 or None in names:
        return False
    last = body[-1]
    return isinstance(last, ast.Return) and isinstance(last.value, ast.Name) and last.value.id in names


def _strip_docstrings(tree: ast.Module) -> None:
    for node in ast.walk(tree):
        if (
            isinstance(node, (ast.Module, ast.ClassDef, *_FUNCS))
            and node.body
            and _is_docstring(node.body[0])
        ):
            node.body = node.body[1:] or [ast.Pass()]


def _source_order(node: ast.AST) -> Iterator[ast.AST]:
    """``node`` and its descendants depth first in field order (the same order for ASTs equal up to names)."""
    stack = [node]
    while stack:
        n = stack.pop()
        yield n
        stack.extend(reversed(list(ast.iter_child_nodes(n))))


def _canonical_names(unit: ast.AST) -> None:
    """Rename, in place, the local variables and arguments of ``unit`` (an outermost function or lambda, nested
    scopes included) to ``v0, v1, ...`` in order of first appearance; function, class and imported names,
    ``global`` names and names the unit only reads (builtins, module names, ``aux``) are kept."""
    nodes = list(_source_order(unit))
    local: set[str] = set()
    kept: set[str] = set()
    for n in nodes:
        if isinstance(n, ast.arg):
            local.add(n.arg)
        elif isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del)):
            local.add(n.id)
        elif isinstance(n, (ast.ExceptHandler, ast.MatchAs, ast.MatchStar)) and n.name:
            local.add(n.name)
        elif isinstance(n, ast.MatchMapping) and n.rest:
            local.add(n.rest)
        if isinstance(n, (*_FUNCS, ast.ClassDef)):
            kept.add(n.name)
        elif isinstance(n, (ast.Import, ast.ImportFrom)):
            kept.update((a.asname or a.name).split(".")[0] for a in n.names)
        elif isinstance(n, ast.Global):
            kept.update(n.names)
    local -= kept
    new: dict[str, str] = {}

    def canon(name: str) -> str:
        if name not in local:
            return name
        return new.setdefault(name, f"v{len(new)}")

    for n in nodes:
        if isinstance(n, ast.arg):
            n.arg = canon(n.arg)
        elif isinstance(n, ast.Name):
            n.id = canon(n.id)
        elif isinstance(n, (ast.ExceptHandler, ast.MatchAs, ast.MatchStar)) and n.name:
            n.name = canon(n.name)
        elif isinstance(n, ast.MatchMapping) and n.rest:
            n.rest = canon(n.rest)
        elif isinstance(n, ast.Nonlocal):
            n.names = [canon(x) for x in n.names]


def _outermost_functions(tree: ast.AST) -> Iterator[ast.AST]:
    stack = list(ast.iter_child_nodes(tree))
    while stack:
        n = stack.pop()
        if isinstance(n, (*_FUNCS, ast.Lambda)):
            yield n
        else:
            stack.extend(ast.iter_child_nodes(n))


def normalized_solution(code: object) -> str:
    """``code`` with its form made canonical, so that two programs that differ only by local names, comments,
    docstrings or formatting give the same text: parsed, docstrings (module, class, function) removed, the local
    variables and arguments of each function (and each lambda outside a function) renamed ``v0, v1, ...`` in order
    of first appearance, numbering anew per function (function names kept), and unparsed (``ast.unparse``).

    Code that does not parse is returned stripped of surrounding whitespace (a non-string gives ``""``), so equal
    broken texts still compare equal; never raises.
    """
    if not isinstance(code, str):
        return ""
    tree = safe_parse(code)
    if tree is None:
        return code.strip()
    try:
        _strip_docstrings(tree)
        for unit in _outermost_functions(tree):
            _canonical_names(unit)
        return ast.unparse(tree)
    except (RecursionError, MemoryError, ValueError):
        return code.strip()
