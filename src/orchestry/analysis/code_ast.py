"""Reading model-written Python on its AST: a parse that never raises, top-level definitions, the names a scope
binds and the entry point of main's code.

The reward (:mod:`orchestry.rewards.code`), the tasks (:mod:`orchestry.tasks`) and scheme detection
(:mod:`orchestry.analysis.schemes`) read models' code through this module and the two built on it, so all of them
see the same definitions and calls: :mod:`orchestry.analysis.aux_calls` (how an entry point calls or references a
helper function, ``aux``, and whether its body only wraps it) and :mod:`orchestry.analysis.code_forms` (the
template checks of the collapse metrics: the problem generator's chain form and programs compared up to names).
Nothing here runs the code.

Scoping: a name ``aux`` bound inside the entry point (parameter, assignment, loop/with/except target, import,
nested ``def``/``class``) makes every ``aux`` of that scope local (Python decides per scope, not per line),
so those calls are *not* calls to the helper; the same holds inside nested functions, lambdas and
comprehensions that bind ``aux`` themselves, while nested scopes that do not bind it see the enclosing one.
Calls from the entry point into other functions defined at the top level of main's code are followed
(depth <= 8, cycles cut): aux used there counts as used by the entry point, and such a function called in
a loop, twice, or passed as a value makes its aux calls repeated.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator

_FUNCS = (ast.FunctionDef, ast.AsyncFunctionDef)
_COMPS = (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)
_SCOPES = (*_FUNCS, ast.Lambda, ast.ClassDef, *_COMPS)


# ---------------------------------------------------------------------------------------------------------
# parsing helpers
# ---------------------------------------------------------------------------------------------------------
def safe_parse(code: object) -> ast.Module | None:
    """``ast.parse`` that returns ``None`` instead of raising (syntax errors, null bytes, deep nesting)."""
    if not isinstance(code, str):
        return None
    try:
        return ast.parse(code)
    except (SyntaxError, ValueError, MemoryError, RecursionError, OverflowError):
        return None


def top_level_function(tree: ast.Module, name: str) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    """The last top-level ``def name`` of ``tree`` (the one that wins at run time), else ``None``."""
    found = None
    for node in tree.body:
        if isinstance(node, _FUNCS) and node.name == name:
            found = node
    return found


def _target_names(target: ast.AST) -> Iterator[str]:
    for node in ast.walk(target):
        if isinstance(node, ast.Name):
            yield node.id
        elif isinstance(node, ast.Starred) and isinstance(node.value, ast.Name):
            yield node.value.id


def _walk_scope(nodes: Iterable[ast.AST]) -> Iterator[ast.AST]:
    """Walk statements/expressions without entering nested scopes (their headers are still yielded)."""
    stack = list(nodes)[::-1]
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, _SCOPES):
            continue
        stack.extend(reversed(list(ast.iter_child_nodes(node))))


def bound_names(scope: ast.AST) -> set[str]:
    """Names local to ``scope`` (a module, function, lambda, class or comprehension) by Python's rules.

    ``global``/``nonlocal`` declarations are removed. Walrus targets inside comprehensions are ignored.
    """
    names: set[str] = set()
    declared: set[str] = set()
    if isinstance(scope, (*_FUNCS, ast.Lambda)):
        a = scope.args
        for arg in (*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg):
            if arg is not None:
                names.add(arg.arg)
        body: list[ast.AST] = [scope.body] if isinstance(scope, ast.Lambda) else list(scope.body)
    elif isinstance(scope, _COMPS):
        for gen in scope.generators:
            names.update(_target_names(gen.target))
        return names
    else:
        body = list(getattr(scope, "body", []))
    for node in _walk_scope(body):
        if isinstance(node, (*_FUNCS, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            names.add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                names.add((alias.asname or alias.name).split(".")[0])
        elif isinstance(node, (ast.ExceptHandler, ast.MatchAs, ast.MatchStar)) and node.name:
            names.add(node.name)
        elif isinstance(node, ast.MatchMapping) and node.rest:
            names.add(node.rest)
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            declared.update(node.names)
    return names - declared


def _choose_entry(tree: ast.Module, entry_point: str | None, aux_name: str):
    if entry_point:
        return top_level_function(tree, entry_point)
    funcs = [n for n in tree.body if isinstance(n, _FUNCS) and n.name != aux_name]
    return funcs[-1] if funcs else None
