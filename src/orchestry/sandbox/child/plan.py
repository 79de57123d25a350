"""Calls an assert unit is certain to make, known before running it (sent to the program ahead of time)."""

from __future__ import annotations

from .bindings import _BUILTIN_NAMES
from .codec import Unplain, encode

_PLANS: dict[tuple[str, str], list | None] = {}


def _plan(setup: str, unit: str) -> list | None:
    """The program calls an assert unit is certain to make, in order, when that is known before running it.

    Plannable: the unit is imports/no-op names followed by one ``assert`` without a message; every call in its
    test is to a builtin or to a name the setup binds to another name (``candidate = f``), the latter with
    literal arguments only; nothing is evaluated conditionally (and/or, if-else, chained comparisons,
    comprehensions, lambdas). Returns [[function name, encoded args, encoded kwargs], ...] or None. The scorer
    sends planned calls ahead so that the program process runs them back to back (one round trip instead of
    one per call); the verdict is still computed by running the unit, which must make exactly these calls.
    """
    key = (setup, unit)
    if key in _PLANS:
        return _PLANS[key]
    import ast  # imported by the scorer at start-up, after forking the fork server (which need not carry it)

    conditional = (
        ast.BoolOp,
        ast.IfExp,
        ast.Lambda,
        ast.ListComp,
        ast.SetComp,
        ast.DictComp,
        ast.GeneratorExp,
        ast.NamedExpr,
        ast.Await,
        ast.Yield,
        ast.YieldFrom,
        ast.Starred,
    )
    plan = None
    try:
        aliases = {}
        for node in ast.parse(setup).body:
            if (
                isinstance(node, ast.Assign)
                and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)
                and isinstance(node.value, ast.Name)
            ):
                aliases[node.targets[0].id] = node.value.id
        body = ast.parse(unit).body
        ok = bool(body) and isinstance(body[-1], ast.Assert) and body[-1].msg is None
        ok = ok and all(
            isinstance(st, (ast.Import, ast.ImportFrom, ast.Pass))
            or (isinstance(st, ast.Expr) and isinstance(st.value, ast.Name))
            for st in body[:-1]
        )
        bound = {
            a.asname or a.name.split(".")[0]
            for st in body[:-1]
            if isinstance(st, (ast.Import, ast.ImportFrom))
            for a in st.names
        }
        calls: list = []
        if ok:
            for n in ast.walk(body[-1].test):
                if isinstance(n, conditional) or (isinstance(n, ast.Compare) and len(n.ops) > 1):
                    ok = False
                    break
                if not isinstance(n, ast.Call):
                    continue
                f = n.func
                if not isinstance(f, ast.Name) or f.id in bound or any(k.arg is None for k in n.keywords):
                    ok = False
                    break
                if f.id in aliases:
                    args = [encode(ast.literal_eval(x)) for x in n.args]
                    kwargs = [[k.arg, encode(ast.literal_eval(k.value))] for k in n.keywords]
                    calls.append(((n.lineno, n.col_offset), [aliases[f.id], args, kwargs]))
                elif f.id not in _BUILTIN_NAMES or f.id in aliases.values():
                    ok = False
                    break
        if ok:
            plan = [c for _, c in sorted(calls, key=lambda c: c[0])]
    except (SyntaxError, ValueError, TypeError, Unplain, RecursionError, MemoryError):
        plan = None
    if len(_PLANS) > 8192:
        _PLANS.clear()
    _PLANS[key] = plan
    return plan
