"""Cooperation schemes: how ``main``'s code uses the helper ``aux`` (detected on the AST of main's code).

The MAGRPO paper (arXiv 2508.04652, "LLM Collaboration with Multi-Agent Reinforcement Learning", section on
emergent cooperation in code generation) names four schemes the trained helper/main pairs fall into; the
authors' reward code (CoMLRL experiments, ``rewards/code_utils.py``) detects the related *wrapper* and
*ignored return value* cases with regular expressions. This module does all of it on the AST, with Python's
scoping rules, so that ``return aux(x) + 1``, ``aux`` shadowed by a parameter, or ``map(aux, xs)`` are seen
for what they are.

Schemes (one label per ``main`` sample):

* ``fallback`` -- main tries aux and falls back to its own logic: an aux call inside the body of a ``try``
  with an ``except`` handler that does more than re-raise; aux's result (directly or through a variable)
  compared with ``None`` (``r = aux(x); if r is None: ...``); or ``aux(x) or <own logic>``.
* ``strategy_filter`` -- aux's result chooses a branch: aux's result (directly, or through a variable
  assigned from an expression containing the call -- one step, ``+=`` accumulators excluded) in the test of
  ``if`` / ``elif`` / ``x if .. else y`` / ``while`` / a comprehension's ``if``, or ``filter(aux, xs)``.
* ``coordinator`` -- main calls aux repeatedly and combines the results: an aux call inside a loop body or a
  comprehension, inside a lambda passed to another call (``sorted(xs, key=lambda v: aux(v))``), aux passed as
  a value to another call (``map(aux, xs)``, ``sorted(xs, key=aux)``), or two or more aux call sites.
* ``decorator`` -- main calls aux once and adds pre/post-processing (any other use of aux).
* ``wrapper`` -- main only returns aux's value: the body (docstring, ``pass`` and ``...`` aside) is exactly
  ``return aux(args)`` or ``v = aux(args); return v``, where every argument is a plain name, constant,
  attribute or subscript (no computation: ``return aux(sorted(x))`` pre-processes, so it is a decorator).
* ``none`` -- aux is never called or referenced by the entry point, the code does not parse, the entry point
  is not defined, or ``aux`` is rebound in main's module (a redefinition overrides the helper at run time,
  so calls to it are calls to main's own copy, not to the helper).

Precedence when several apply (most specific evidence of *using* aux's result first):
``fallback > strategy_filter > coordinator > decorator > wrapper > none``. The wrapper shape has a single
call with no branch, loop or ``try``, so it never competes with the first three; it is checked before
decorator.

The code is read by :mod:`orchestry.analysis.aux_calls` (:mod:`orchestry.analysis.code_ast` has the scoping rules): it finds the entry point's
aux calls and the evidence around them (``signals``); this module names the scheme from that evidence.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from orchestry.analysis.aux_calls import AuxCallInfo, aux_uses

SCHEMES = ("fallback", "decorator", "coordinator", "strategy_filter", "wrapper", "none")
PRECEDENCE = ("fallback", "strategy_filter", "coordinator", "decorator", "wrapper", "none")

_FALLBACK_SIGNALS = frozenset({"try", "none_check", "or_default"})
_STRATEGY_SIGNALS = frozenset({"test", "filter"})
_COORDINATOR_SIGNALS = frozenset({"loop", "passed"})


def aux_call_info(main_code: str, entry_point: str | None = None, aux_name: str = "aux") -> AuxCallInfo:
    """How the entry point of ``main_code`` uses the helper ``aux_name`` (:func:`orchestry.analysis.aux_calls.aux_uses`,
    the same arguments), with its cooperation scheme (see the module docstring).

    Returns:
        An :class:`~orchestry.analysis.aux_calls.AuxCallInfo`; never raises (unparsable or pathological code gives
        ``parsed=False`` or ``scheme="none"``).
    """
    info = aux_uses(main_code, entry_point, aux_name)
    if not info.calls_aux:
        return info  # scheme "none"
    return replace(info, scheme=_scheme(info.signals, info.calls_aux, info.is_wrapper))


def _scheme(signals: set[str], calls_aux: bool, wrapper: bool) -> str:
    if not calls_aux:
        return "none"
    if signals & _FALLBACK_SIGNALS:
        return "fallback"
    if signals & _STRATEGY_SIGNALS:
        return "strategy_filter"
    if signals & _COORDINATOR_SIGNALS or "multi" in signals:
        return "coordinator"
    if wrapper:
        return "wrapper"
    return "decorator"


def detect_scheme(main_code: str, entry_point: str | None = None, aux_name: str = "aux") -> str:
    """The cooperation scheme of ``main_code`` (one of :data:`SCHEMES`); see the module docstring.

    Precedence: ``fallback > strategy_filter > coordinator > decorator > wrapper > none``.
    Unparsable code, a missing entry point or a redefined ``aux`` give ``"none"``. Never raises.
    """
    return aux_call_info(main_code, entry_point, aux_name).scheme


def scheme_distribution(labels: Iterable[str]) -> dict[str, float]:
    """Share of each scheme among ``labels`` (every key of :data:`SCHEMES` present, shares sum to 1).

    Unknown labels count as ``"none"``. An empty input gives 0.0 for every scheme.
    """
    counts = dict.fromkeys(SCHEMES, 0)
    n = 0
    for label in labels:
        counts[label if label in counts else "none"] += 1
        n += 1
    return {k: (v / n if n else 0.0) for k, v in counts.items()}
