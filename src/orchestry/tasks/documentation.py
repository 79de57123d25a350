"""Documenting a Python function as a three-turn episode: ``writer`` drafts a docstring, ``reviewer`` critiques,
``editor`` returns the function with the final docstring.

The functions are the project's problems with their canonical solutions (``data/problems/*.jsonl``): the
entry point's signature and reference body, with the problem's own docstring removed (:func:`undocumented`).
The latest answer (the writer's, the editor's when finished; the reviewer writes no code) is scored by checks:

- ``unchanged`` (weight 0.25): the answer's code is the original function and nothing else, once docstrings
  are removed (AST equality: name, arguments, annotations, decorators and body; no other top-level
  statement, which could run before the doctests). With ``require_unchanged`` (default) a changed answer
  scores 0 on every part: its documentation describes other code.
- ``doctests`` (1.0): the share of the docstring's examples with an expected output that pass, run as
  doctests in the sandbox (the examples run in order in the program process, under the sandbox's limits;
  only the verdicts come back; the runner is appended after the answer's code). No example with an expected
  output scores 0; a changed answer's doctests are not run (0).
- ``params`` (0.5): the share of the parameters (from the AST) that the docstring's prose (the text outside
  the ``>>>`` examples and their outputs) describes: an entry ``name: ...`` / ``name (type): ...`` /
  ``name -- ...`` at the start of a line, ``:param name: ...``, or the name quoted as code (```name```)
  in a sentence (:func:`describes`); a function without parameters scores 1.
- ``returns`` (0.25): the prose describes the return value (``return``/``returns``/``yield``) when the
  function returns a value; 1 for a function that returns nothing.

Reward = the weighted sum (``api_grpo.documentation`` weights; max 2.0 by default). The optional LLM judge
scores the docstring's quality on top.
"""

from __future__ import annotations

import ast
import doctest
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from orchestry.analysis.code_ast import safe_parse, top_level_function
from orchestry.problems import Problem
from orchestry.rewards.code import extract_code
from orchestry.sandbox import Job
from orchestry.tasks.common import Turn, checked_result_line, part_weights, write_review_revise
from orchestry.tasks.text_checks import content_stems, stem

if TYPE_CHECKING:
    from orchestry.config import ApiGrpoDocumentationParams
    from orchestry.sandbox import Sandbox

WRITER_SYSTEM = "You are a Python programmer who writes clear, correct docstrings."
REVIEWER_SYSTEM = "You are a careful reviewer of Python documentation."
EDITOR_SYSTEM = "You are a Python programmer who finalises a function's docstring after a review."

_RUNNER_NAME = "_orchestry_doctests"
# appended after the answer's code, so it wins over any definition of the same name in the answer
DOCTEST_RUNNER = f"""

def {_RUNNER_NAME}(name):
    import doctest

    ok = {{}}

    class _Runner(doctest.DocTestRunner):
        def report_start(self, out, test, example):
            pass

        def report_success(self, out, test, example, got):
            ok[id(example)] = True

        def report_failure(self, out, test, example, got):
            ok[id(example)] = False

        def report_unexpected_exception(self, out, test, example, exc_info):
            ok[id(example)] = False

    fn = globals().get(name)
    examples = doctest.DocTestParser().get_examples(getattr(fn, "__doc__", None) or "")
    test = doctest.DocTest(examples, dict(globals()), name, None, 0, None)
    _Runner(verbose=False, optionflags=doctest.ELLIPSIS).run(test, out=lambda s: None, clear_globs=False)
    return [ok.get(id(e), False) for e in examples]
"""
_RETURNS = re.compile(r"\b(returns?|returned|yields?)\b", re.IGNORECASE)


def _function(tree: ast.Module | None, name: str) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    """The last top-level ``def name`` of ``tree`` (``None`` without a tree, e.g. code that does not parse)."""
    return top_level_function(tree, name) if tree is not None else None


def _original(problem: Problem) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    """The problem's reference function (prompt + canonical solution), ``None`` if they do not define it."""
    return _function(safe_parse(problem.prompt + problem.canonical_solution), problem.entry_point)


def _strip_docstrings(node: ast.AST) -> ast.AST:
    """A copy of ``node`` without docstrings (in it and in nested functions/classes)."""
    node = ast.parse(ast.unparse(node)).body[0]
    for n in ast.walk(node):
        if (
            isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
            and ast.get_docstring(n) is not None
        ):
            n.body = n.body[1:] or [ast.Pass()]
    return node


def _is_docstring(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
    )


def code_fingerprint(node: ast.AST) -> str:
    """The function without docstrings, as an AST dump (no positions): equal iff the code is unchanged."""
    return ast.dump(_strip_docstrings(node), annotate_fields=True, include_attributes=False)


def undocumented(problem: Problem) -> str:
    """The problem's function (signature + canonical body) without its docstring, plus the problem's context.

    Raises:
        ValueError: no canonical solution, or prompt + solution does not define the entry point.
    """
    if not problem.canonical_solution.strip():
        raise ValueError(f"{problem.task_id}: no canonical solution to document")
    fn = _original(problem)
    if fn is None:
        raise ValueError(
            f"{problem.task_id}: prompt + canonical solution does not define {problem.entry_point}"
        )
    return ast.unparse(_strip_docstrings(fn))


def parameters(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    """Parameter names (positional, keyword-only, *args, **kwargs), ``self``/``cls`` left out."""
    a = fn.args
    names = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs]
    names += [x.arg for x in (a.vararg, a.kwarg) if x is not None]
    return [n for n in names if n not in ("self", "cls")]


def _is_generator(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """The function yields (outside nested functions)."""
    stack = list(fn.body)
    while stack:
        n = stack.pop()
        if isinstance(n, ast.Yield | ast.YieldFrom):
            return True
        if not isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | ast.ClassDef):
            stack.extend(ast.iter_child_nodes(n))
    return False


def returns_value(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """The function has a ``return <value>`` or a ``yield`` (outside nested functions)."""
    stack = list(fn.body)
    while stack:
        n = stack.pop()
        if isinstance(n, ast.Return) and n.value is not None or isinstance(n, ast.Yield | ast.YieldFrom):
            return True
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | ast.ClassDef):
            continue
        stack.extend(ast.iter_child_nodes(n))
    return False


def describes(text: str, name: str) -> bool:
    """``text`` (docstring prose) describes parameter ``name``: an entry ``name: ...`` / ``name (type): ...`` /
    ``name -- ...`` at the start of a line (Google, NumPy, plain styles), a Sphinx ``:param name: ...``, or the
    name quoted as code (```name```) in a sentence. A bare occurrence (``s[start:]``) is not a description."""
    n = re.escape(name)
    patterns = (
        rf"^[ \t]*[*`]*{n}[*`]*[ \t]*(?:\([^)\n]*\))?[ \t]*(?::|--|-|–)[ \t]*\S",
        rf":param[ \t]+(?:\w+[ \t]+)?{n}[ \t]*:[ \t]*\S",
        rf"``?{n}``?",
    )
    return any(re.search(p, text or "", re.MULTILINE) for p in patterns)


def prose(docstring: str) -> str:
    """The docstring without its doctest examples and their expected outputs."""
    parser = doctest.DocTestParser()
    try:
        pieces = parser.parse(docstring or "")
    except ValueError:  # malformed example (e.g. bad indentation): keep the text
        return docstring or ""
    return "".join(p for p in pieces if isinstance(p, str))


def checked_examples(docstring: str) -> tuple[int, list[int]]:
    """``(number of examples, indices of those with an expected output)``; a malformed docstring has none."""
    try:
        examples = doctest.DocTestParser().get_examples(docstring or "")
    except ValueError:
        return 0, []
    return len(examples), [i for i, e in enumerate(examples) if e.want.strip()]


_WRAPPERS = ("list", "sorted", "tuple", "set", "dict")
_SECTION = re.compile(r"^\s*([A-Z][A-Za-z ]*?)\s*:?\s*$")
_ARGS_HEADERS = (
    "args",
    "arguments",
    "parameters",
    "params",
    "keyword args",
    "keyword arguments",
    "other parameters",
)
_KINDS = (  # the kind of value a return sentence states, by the first of these words it uses
    ("bool", r"true|false|bool|boolean|whether"),
    ("number", r"int|integer|float|number|count|sum|total|length|index|average|mean|product|maximum|minimum|"
               r"max|min|digit|numeric|amount"),
    ("str", r"str|string|text|word|character|char"),
    ("list", r"list|array|sequence"),
    ("dict", r"dict|dictionary|mapping"),
    ("tuple", r"tuple|pair|triple"),
    ("none", r"none|nothing"),
)  # fmt: skip
_KIND_WORD = re.compile(r"\b(" + "|".join(w for _, w in _KINDS) + r")s?\b", re.IGNORECASE)


def calls_function(source: str, name: str) -> bool:
    """A doctest example's source is a call of ``name`` (``name(...)``, or ``list(name(...))`` and the like
    for ``list``/``sorted``/``tuple``/``set``/``dict``): an example that does not call the documented function
    (``>>> 1 + 1``) documents nothing."""
    tree = safe_parse(source)
    if tree is None or len(tree.body) != 1 or not isinstance(tree.body[0], ast.Expr):
        return False
    node = tree.body[0].value
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in _WRAPPERS
        and len(node.args) == 1
    ):
        node = node.args[0]
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == name


def calling_examples(docstring: str, name: str) -> tuple[int, list[int]]:
    """``(examples with an expected output, indices of those that call name and expect more than "...")``."""
    try:
        examples = doctest.DocTestParser().get_examples(docstring or "")
    except ValueError:
        return 0, []
    wanted = [i for i, e in enumerate(examples) if e.want.strip()]
    calling = [
        i
        for i in wanted
        if calls_function(examples[i].source, name) and examples[i].want.strip().strip(".").strip()
    ]
    return len(wanted), calling


def documented_names(text: str) -> list[str]:
    """Parameter names the prose documents as entries: ``name: ...`` / ``name (type): ...`` lines of an
    ``Args:``/``Parameters`` section (Google, NumPy) and Sphinx ``:param name:``."""
    names, in_args = [], False
    lines = (text or "").splitlines()
    for k, line in enumerate(lines):
        stripped = line.strip()
        nxt = lines[k + 1].strip() if k + 1 < len(lines) else ""
        header = _SECTION.match(line)
        if header and (stripped.endswith(":") or set(nxt) == {"-"}):
            in_args = header.group(1).strip().lower() in _ARGS_HEADERS
            continue
        if not stripped or set(stripped) == {"-"}:
            continue
        if in_args:
            m = re.match(r"^\s*\**([A-Za-z_]\w*)\**\s*(?:\([^)\n]*\))?\s*(?::|--|–)", line)
            if m:
                names.append(m.group(1))
    names += re.findall(r":param[ \t]+(?:[\w\[\], ]+[ \t]+)?([A-Za-z_]\w*)[ \t]*:", text or "")
    return list(dict.fromkeys(names))


def stated_kind(text: str) -> str | None:
    """The kind of value the return sentence states (``bool``, ``number``, ``str``, ``list``, ``dict``,
    ``tuple``, ``none``): the first kind word after ``return``/``returns``; None when it states none."""
    m = _RETURNS.search(text or "")
    if m is None:
        return None
    rest = re.split(r"[.!?](?:\s|$)|\n\s*\n", text[m.end() :].lstrip(" :\n\t"), maxsplit=1)[0]
    w = _KIND_WORD.search(rest)
    if w is None:
        return None
    word = w.group(1).lower()
    return next(k for k, pat in _KINDS if re.fullmatch(pat, word))


def output_kind(want: str) -> str | None:
    """The kind of a doctest's expected output (a Python literal), None when it is not a literal."""
    try:
        v = ast.literal_eval(want.strip())
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None
    for kind, types in (("bool", bool), ("none", type(None)), ("number", int | float), ("str", str),
                        ("list", list), ("dict", dict), ("tuple", tuple)):  # fmt: skip
        if isinstance(v, types):
            return kind
    return None


def code_vocabulary(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    """Stems of the words of the function: its name and the names/attributes its body uses, parameters left
    out (naming a parameter does not say what the function does)."""
    params = set(parameters(fn))
    idents = {fn.name}
    for n in ast.walk(fn):
        if isinstance(n, ast.Name) and n.id not in params:
            idents.add(n.id)
        elif isinstance(n, ast.Attribute):
            idents.add(n.attr)
    out = set()
    for ident in idents:
        for part in re.split(r"_+|(?<=[a-z])(?=[A-Z])", ident):
            if len(part) >= 3:
                out.add(stem(part))
                if part.lower().startswith("is") and len(part) > 4:  # isupper -> upper
                    out.add(stem(part[2:]))
    return out


_SYNONYMS = {"largest": "max", "maximum": "max", "biggest": "max", "highest": "max", "smallest": "min",
             "minimum": "min", "lowest": "min", "length": "len", "number": "len", "total": "sum",
             "sorted": "sort", "order": "sort", "reverse": "reversed", "count": "len", "string": "str",
             "integer": "int", "absolute": "abs", "round": "round", "multiplied": "mult", "twice": "mult"}  # fmt: skip


def summary_relevant(text: str, fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """The prose, quoted code and ``Args`` entries left out, shares a content word (stemmed, a few synonyms
    such as largest/max) with the code (:func:`code_vocabulary`): "Deletes all files." says nothing about
    ``count_upper``."""
    kept, in_args = [], False
    for line in (text or "").splitlines():  # the Args entries name parameters; they say nothing of the code
        header = _SECTION.match(line)
        if header and line.strip().endswith(":"):
            in_args = header.group(1).strip().lower() in _ARGS_HEADERS
            continue
        if not in_args:
            kept.append(line)
    first = re.sub(r"`[^`]*`", " ", "\n".join(kept))  # quoted code (a parameter's name) is not a description
    said = content_stems(first)
    said |= {stem(v) for k, v in _SYNONYMS.items() if stem(k) in said}
    return bool(said & code_vocabulary(fn))


class Documentation:
    """Writer -> reviewer -> editor (three turns); reward: checked documentation parts (max 2.0 by default)."""

    name = "documentation"
    roles = ("writer", "reviewer", "editor")
    reward_parts = ("unchanged", "doctests", "params", "returns")
    judge_criteria = (
        "QUALITY: is the final docstring correct, clear and complete (every parameter, the return value, "
        "examples that hold)?\n"
        "COLLABORATION: does each agent build on the previous answer (the editor applying the review)?\n"
        "EFFICIENCY: is the work done with few, short, focused answers?\n"
    )

    def __init__(self, params: ApiGrpoDocumentationParams | None = None):
        if params is None:
            from orchestry.config import ApiGrpoDocumentationParams

            params = ApiGrpoDocumentationParams()
        self.params = params
        self.weights = part_weights(params, self.reward_parts)
        self.max_reward = sum(self.weights.values())
        self._memo: dict[tuple[str, str], dict] = {}
        self.feature_guides: dict[str, tuple[str, str | None, str | None]] = {
            "writer_examples": (
                "writer",
                "Include doctest examples (top episodes: about {top:.0f}, others {bottom:.0f}).",
                "Use fewer doctest examples (top episodes: about {top:.0f}, others {bottom:.0f}).",
            ),
            "editor_examples": (
                "editor",
                "Keep or add doctest examples (top episodes: about {top:.0f}, others {bottom:.0f}).",
                "Keep only a few doctest examples (top episodes: about {top:.0f}, others {bottom:.0f}).",
            ),
            "editor_has_args_section": ("editor", "Describe each parameter in an Args: section.", None),
            "editor_has_returns_section": ("editor", "Describe the result in a Returns: section.", None),
            "editor_fenced": ("editor", "Put the function in one ```python block.", None),
            "editor_prose_after_code": (
                "editor",
                None,
                "Stop after the code block: no explanation after it.",
            ),
            "reviewer_names_parameter": (
                "reviewer",
                "Name the parameters whose description is missing or wrong.",
                None,
            ),
            "reviewer_writes_code": (
                "reviewer",
                "Show the corrected docstring.",
                "Describe the problems in words; leave the rewriting to the editor.",
            ),
            "reviewer_chars": (
                "reviewer",
                "Give a detailed review (top episodes: about {top:.0f} characters, others {bottom:.0f}).",
                "Keep the review brief (top episodes: about {top:.0f} characters, others {bottom:.0f}).",
            ),
        }

    # ---- items -------------------------------------------------------------------------------------------------
    def items(self, train: Sequence[Problem], test: Sequence[Problem]) -> tuple[list[Problem], list[Problem]]:
        """The problems whose canonical solution defines the entry point (the others cannot be documented).

        Raises:
            ValueError: no train problem has one.
        """

        def usable(ps: Sequence[Problem]) -> list[Problem]:
            out = []
            for p in ps:
                try:
                    undocumented(p)
                except ValueError:
                    continue
                out.append(p)
            return out

        tr, te = usable(train), usable(test)
        if not tr:
            raise ValueError("documentation: no train problem has a canonical solution to document")
        return tr, te

    # ---- prompts -----------------------------------------------------------------------------------------------
    def messages(
        self, problem: Problem, turns: Sequence[Turn], behaviors: Mapping[str, str]
    ) -> tuple[str, str]:
        """``(system, user)`` for the next agent of ``writer -> reviewer -> editor``.

        Raises:
            ValueError: the episode is already finished.
        """
        code = undocumented(problem)
        ask = (
            "Return the complete function, code unchanged, in one ```python block, with a docstring that "
            "describes every parameter and the return value and gives doctest examples (>>> lines with "
            "their exact output)."
        )

        def review(draft: str) -> tuple[str, str]:
            return REVIEWER_SYSTEM, (
                f"Review the docstring of this function. Point out parameters or the return value left "
                f"undescribed, examples whose output is wrong, and any change to the code. Be brief.\n\n"
                f"Original code:\n```python\n{code}\n```\nDocumented version:\n```python\n{draft}\n```"
            )

        def edit(draft: str, review: str) -> tuple[str, str]:
            return EDITOR_SYSTEM, (
                f"Original code:\n```python\n{code}\n```\nDraft with docstring:\n```python\n{draft}\n```\n"
                f"Review:\n{review}\n\nApply the review. {ask}"
            )

        write = (WRITER_SYSTEM, f"Write a docstring for this Python function.\n```python\n{code}\n```\n{ask}")
        return write_review_revise(self, turns, behaviors, write, review, edit)

    # ---- reward ------------------------------------------------------------------------------------------------
    def _static(self, problem: Problem, answer: str) -> tuple[dict, Job | None]:
        """Parts known without running code, and the doctest job (or None)."""
        code = extract_code(answer)[0] if answer else ""
        tree = safe_parse(code) if code else None
        fn = _function(tree, problem.entry_point)
        zero = dict.fromkeys(self.reward_parts, 0.0)
        if fn is None:
            return (
                {
                    **zero,
                    "examples": 0,
                    "doctests_passed": 0,
                    "reasons": ["no function " + problem.entry_point],
                },
                None,
            )
        original = _original(problem)
        body = [n for n in tree.body if not _is_docstring(n)] if tree is not None else []
        # the answer is the function and nothing else (no other code that could run before the doctests)
        unchanged = (
            original is not None
            and len(body) == 1
            and body[0] is fn
            and code_fingerprint(fn) == code_fingerprint(original)
        )
        doc = ast.get_docstring(fn, clean=True) or ""
        text = prose(doc)
        names = parameters(fn)
        described = [n for n in names if describes(text, n)]
        bare = {n.lstrip("*") for n in names}
        phantom = [n for n in documented_names(text) if n not in bare]
        params = len(described) / (len(names) + len(phantom)) if names or phantom else 1.0
        states_return = bool(_RETURNS.search(text))
        wanted, checked = calling_examples(doc, problem.entry_point)
        examples = doctest.DocTestParser().get_examples(doc) if wanted else []
        kinds = [output_kind(examples[i].want) for i in checked]
        relevant = summary_relevant(text, fn)
        reasons = []
        if not unchanged:
            reasons.append(
                "unchanged: the answer's code differs from the original function (doctests not run)"
            )
        if not doc:
            reasons.append("no docstring")
        if names and len(described) < len(names):
            reasons.append("params: not described " + ", ".join(n for n in names if n not in described))
        if phantom:
            reasons.append("params: no such parameter " + ", ".join(phantom))
        if returns_value(fn) and not states_return:
            reasons.append("returns: the return value is not described")
        if not checked:
            reasons.append(
                f"doctests: no example calls {problem.entry_point} with an expected output"
                + (f" ({wanted} example(s) that do not)" if wanted else "")
            )
        elif len(checked) < wanted:
            reasons.append(f"doctests: {wanted - len(checked)} example(s) do not call {problem.entry_point}")
        if doc and not relevant:
            reasons.append("relevant: the summary shares no word with the code (name, parameters, body)")
        parts = {"unchanged": float(unchanged), "doctests": 0.0, "params": params, "returns": 0.0}
        info = {
            **parts, "examples": len(checked), "doctests_passed": 0, "reasons": reasons,
            "relevant": float(relevant), "consistent": 1.0,
            "_wanted": wanted, "_kinds": kinds, "_states_return": states_return,
            "_stated": stated_kind(text), "_returns_value": returns_value(fn), "_generator": _is_generator(fn),
        }  # fmt: skip
        job = None
        if checked and unchanged:  # doctests describe the original code: a changed answer's are not run
            program = (problem.context + "\n" if problem.context else "") + code + DOCTEST_RUNNER
            asserts = tuple(f"assert {_RUNNER_NAME}({problem.entry_point!r})[{i}] is True" for i in checked)
            job = Job(program=program, asserts=asserts)
        return info, job

    def _finish(self, info: dict, passed: Sequence[bool] = ()) -> dict:
        """The parts that need the doctests' verdicts (``passed``, one per calling example), the gates, the
        total. ``returns``: the prose states the return and what it states agrees with the expected outputs of
        the examples that pass (a function that returns nothing: 1)."""
        wanted, kinds = info.pop("_wanted", 0), info.pop("_kinds", [])
        states, stated = info.pop("_states_return", False), info.pop("_stated", None)
        returns_value_, generator = info.pop("_returns_value", True), info.pop("_generator", False)
        info.setdefault("relevant", 0.0)
        info.setdefault("consistent", 0.0)
        info["doctests_passed"] = sum(passed)
        info["doctests"] = sum(passed) / wanted if wanted else 0.0
        seen = {k for k, ok in zip(kinds, passed, strict=False) if ok and k is not None}
        contradicts = stated is not None and not generator and bool(seen) and seen != {stated}
        if not returns_value_ or (states and any(passed) and not contradicts):
            info["returns"] = 1.0
        elif states and not any(passed):
            info["reasons"].append("returns: no passing example shows the return value")
        if contradicts:
            info["consistent"] = 0.0
            info["reasons"].append(
                f"consistent: the docstring says it returns a {stated}, the examples show {', '.join(sorted(seen))}"
            )
        if self.params.require_consistent and not (info["consistent"] and info["relevant"]):
            for k in ("doctests", "params", "returns"):
                info[k] = 0.0
        if self.params.require_unchanged and not info["unchanged"]:
            for k in self.reward_parts:
                info[k] = 0.0
        info["total"] = sum(self.weights[k] * info[k] for k in self.reward_parts)
        return info

    def score(
        self, problems: Sequence[Problem], transcripts: Sequence[Sequence[Turn]], sandbox: Sandbox
    ) -> list[dict]:
        """Checked parts of the latest function (the writer's, or the editor's when finished); the doctests run
        in ``sandbox``, one job per answer. Memoised per (task_id, answer)."""
        answers = [(t[2].text if len(t) >= 3 else t[0].text) if t else "" for t in transcripts]
        keys = [(p.task_id, a) for p, a in zip(problems, answers, strict=True)]
        todo: dict[tuple[str, str], tuple[Problem, str]] = {}
        for k, p, a in zip(keys, problems, answers, strict=True):
            if k not in self._memo:
                todo[k] = (p, a)
        pending = []
        for k, (p, a) in todo.items():
            info, job = self._static(p, a)
            if job is None:
                self._memo[k] = self._finish(info)
            else:
                pending.append((k, info, job))
        if pending:
            results = sandbox.run_batch([job for _, _, job in pending])
            for (k, info, _), res in zip(pending, results, strict=True):
                passed = [o.passed for o in res.outcomes]
                if res.error:
                    info["reasons"].append(f"doctests: {res.error[:200]}")
                elif res.passed < res.total:
                    failed = [i + 1 for i, o in enumerate(res.outcomes) if not o.passed]
                    info["reasons"].append(f"doctests: {res.passed}/{res.total} pass (failing: {failed[:5]})")
                self._memo[k] = self._finish(info, passed)
        return [dict(self._memo[k], reasons=list(self._memo[k]["reasons"])) for k in keys]

    def result_line(self, reward: Mapping) -> str:
        """What the judge is told about the checked reward."""
        return checked_result_line(reward, self.reward_parts, self.max_reward)

    def features(self, problem: Problem, turns: Sequence[Turn], reward: Mapping) -> dict[str, float]:
        """Examples and sections of the docstrings, fences and prose of the editor, what the review mentions."""
        writer, reviewer, editor = turns[0], turns[1], turns[2]

        def doc_of(text: str) -> str:
            fn = _function(safe_parse(extract_code(text)[0]), problem.entry_point)
            return (ast.get_docstring(fn) or "") if fn is not None else ""

        w_doc, e_doc = doc_of(writer.text), doc_of(editor.text)
        fences = editor.text.count("```")
        after = editor.text.rsplit("```", 1)[-1] if fences >= 2 else ""
        fn = _original(problem)
        names = parameters(fn) if fn is not None else []
        return {
            "writer_examples": float(checked_examples(w_doc)[0]),
            "editor_examples": float(checked_examples(e_doc)[0]),
            "editor_has_args_section": float(bool(re.search(r"^\s*(Args|Parameters)\s*:?\s*$", e_doc, re.M))),
            "editor_has_returns_section": float(bool(re.search(r"^\s*Returns?\s*:?\s*$", e_doc, re.M))),
            "editor_fenced": float(fences >= 2),
            "editor_prose_after_code": float(len(after.strip()) > 40),
            "reviewer_names_parameter": float(
                any(re.search(rf"\b{re.escape(n)}\b", reviewer.text) for n in names)
            ),
            "reviewer_writes_code": float("```" in reviewer.text),
            "reviewer_chars": float(len(reviewer.text)),
            "writer_truncated": float(writer.truncated),
            "editor_truncated": float(editor.truncated),
            "outcome_unchanged": float(reward.get("unchanged", 0)),
            "outcome_doctests": float(reward.get("doctests", 0)),
        }
