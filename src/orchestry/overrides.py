"""Human-in-the-loop reward override: a person's score replaces the automatic reward of one trajectory.

The reviewed file ``data/overrides.jsonl`` (tracked by git, a DVC dependency of ``train_api_grpo`` and ``train_orchestrator``) holds one
JSON object per line: ``{"id", "score", "note", "who", "when"}``, at most one line per id (setting an id again
replaces its line). ``orchestry override ID SCORE --note ...`` and ``orchestry review`` write it; every write
goes to a temporary file beside it, is fsynced and renamed over it, so a failed or refused command never loses
a line.

Ids name what a person saw, not where it sat in a report: an API-GRPO trajectory's id is ``ag-`` plus the
first 12 hex digits of the SHA-256 of (task, problem id, every turn's role and text); an orchestrator
episode's is ``oe-`` plus the same hash of (phase, method, problem id, every step's agent and text). A re-run
that replays the same answers (the response cache) meets the same ids, so the override applies again; a
trajectory whose text changed is a different trajectory and keeps its automatic reward.

Scores are in the reward's own units: 0 to the task's ``max_reward`` (recorded in ``summary.json``) for
API-GRPO trajectories, 0 to 4 (the level reward) for orchestrator episodes. A *verdict* is a shorthand:
``good`` = the maximum, ``bad`` = 0.

``train_orchestrator`` reads the file too (:func:`check_for_orchestrator`): a training episode with an
override gets the human score as its task reward r before the REINFORCE update (its step rewards, return and
reported reward follow); an evaluation episode cannot be overridden. A rerun meets the same episode ids up to
the first overridden one (the answers come from the response cache, the policy's samples are seeded); the
episodes after it differ once the update changed the policy, so overrides are best set from the start.

The API-GRPO stage reads the file (:func:`read_overrides`): a complete trajectory with an override gets the
human score as its reward and as its value (the judge is not mixed in), so the group advantages, the
behaviour library and every reported reward use it; the automatic total is kept beside it
(``reward.automatic_total``) and the row is marked (``reward.override``, ``overridden`` in ``rewards.csv``).
"""

from __future__ import annotations

import getpass
import hashlib
import json
import math
import os
import re
import subprocess
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

OVERRIDES_PATH = "data/overrides.jsonl"
API_GRPO_EPISODES = "reports/api_grpo/episodes.jsonl"
API_GRPO_SUMMARY = "reports/api_grpo/summary.json"
ORCHESTRATOR_TRANSCRIPTS = "reports/orchestrator/transcripts.jsonl"
ORCHESTRATOR_MAX_REWARD = 4.0  # the level reward (orchestry.rewards.code.RewardConfig().max_total)
VERDICTS = {"good": 1.0, "bad": 0.0}  # share of the maximum
MAX_NOTE = 2000


class OverrideError(ValueError):
    """A bad override (unknown id, score out of range, unreadable file): the message is one line."""


@dataclass(frozen=True)
class Override:
    """One human score: the trajectory/episode ``id``, ``score``, ``note``, ``who`` and ``when`` (UTC ISO)."""

    id: str
    score: float
    note: str = ""
    who: str = ""
    when: str = ""
    task: str = ""  # the API-GRPO task of the trajectory ("" in hand-written lines)

    def to_dict(self) -> dict:
        d = asdict(self)
        if not d["task"]:
            del d["task"]
        return d


@dataclass
class Reviewable:
    """Something a person can score: its id, kind, problem, max score, the turns and the automatic parts."""

    id: str
    kind: str  # "api_grpo" or "orchestrator"
    title: str
    task_id: str
    max_score: float
    automatic: float
    turns: list[tuple[str, str]] = field(default_factory=list)  # (role/agent, text)
    parts: dict = field(default_factory=dict)  # the automatic reward parts
    task: str = ""  # the API-GRPO task
    phase: str = ""  # an orchestrator episode's phase: train or eval


def _digest(parts: Iterable[str]) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode("utf-8"))
        h.update(b"\x00")
    return h.hexdigest()[:12]


def trajectory_id(task: str, task_id: str, turns: Sequence[tuple[str, str]]) -> str:
    """Id of a complete API-GRPO trajectory: ``ag-`` + hash of task, problem id, every (role, text)."""
    return "ag-" + _digest([task, task_id, *(x for role, text in turns for x in (role, text))])


def orchestrator_episode_id(record: Mapping) -> str:
    """Id of an orchestrator episode (a ``transcripts.jsonl`` record): ``oe-`` + hash of phase, method,
    problem id, every step's (agent, text)."""
    steps = [(str(s.get("agent", "")), str(s.get("text", ""))) for s in record.get("steps", [])]
    head = [str(record.get(k, "")) for k in ("phase", "method", "episode", "task_id")]
    return "oe-" + _digest([*head, *(x for a, t in steps for x in (a, t))])


# ---- the file ---------------------------------------------------------------------------------------------------
def _json_lines(path: Path) -> list[tuple[int, Any]]:
    """``(line number, value)`` of each non-blank line of a JSONL file; a missing file has none.

    Raises:
        OverrideError: a line that is not JSON (the message names the file and line).
    """
    if not path.exists():
        return []
    out = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            try:
                out.append((n, json.loads(line)))
            except json.JSONDecodeError as e:
                raise OverrideError(f"{path}:{n}: not JSON ({e.msg})") from None
    return out


def read_overrides(path: str | Path = OVERRIDES_PATH) -> dict[str, Override]:
    """``{id: Override}`` from the file; a missing or empty file is no overrides.

    Raises:
        OverrideError: a line that is not a JSON object with a string ``id`` and a finite number ``score``
            (the message names the file and line), or an id twice.
    """
    p = Path(path)
    out: dict[str, Override] = {}
    for n, d in _json_lines(p):
        score = d.get("score") if isinstance(d, dict) else None
        if (
            not isinstance(d, dict)
            or not isinstance(d.get("id"), str)
            or isinstance(score, bool)
            or not isinstance(score, int | float)
            or not math.isfinite(score)
        ):
            raise OverrideError(f'{p}:{n}: need an object with a string "id" and a finite number "score"')
        if d["id"] in out:
            raise OverrideError(f"{p}:{n}: id {d['id']} appears twice")
        out[d["id"]] = Override(
            d["id"],
            float(score),
            str(d.get("note", "")),
            str(d.get("who", "")),
            str(d.get("when", "")),
            str(d.get("task", "")),
        )
    return out


def write_overrides(path: str | Path, overrides: Iterable[Override]) -> None:
    """Rewrite the file atomically: a temporary file beside it, fsynced, renamed over it."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=p.name + ".", suffix=".tmp", dir=p.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            for o in overrides:
                f.write(json.dumps(o.to_dict(), ensure_ascii=False) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def who_am_i() -> str:
    """The reviewer's name: ``$ORCHESTRY_REVIEWER``, else git's ``user.name``, else the login name."""
    if os.environ.get("ORCHESTRY_REVIEWER"):
        return os.environ["ORCHESTRY_REVIEWER"]

    try:
        name = subprocess.run(
            ["git", "config", "user.name"], capture_output=True, text=True, timeout=5, check=False
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        name = ""
    if name:
        return name
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"


# ---- what can be reviewed ---------------------------------------------------------------------------------------
def load_reviewables(root: str | Path = ".") -> dict[str, Reviewable]:
    """Every complete API-GRPO trajectory and orchestrator episode in the reports under ``root``, by id.

    API-GRPO: ``reports/api_grpo/episodes.jsonl`` (the max score from ``summary.json``'s ``max_reward``, else
    the episode's own record); orchestrator: ``reports/orchestrator/transcripts.jsonl``. Missing files
    contribute nothing.
    """
    root = Path(root)
    items: dict[str, Reviewable] = {}
    summary_max = None
    if (root / API_GRPO_SUMMARY).exists():
        try:
            summary_max = json.loads((root / API_GRPO_SUMMARY).read_text()).get("max_reward")
        except json.JSONDecodeError:
            summary_max = None
    for _, rec in _json_lines(root / API_GRPO_EPISODES):
        max_score = float(rec.get("max_reward") or summary_max or 0.0)
        for t in rec.get("trajectories", []):
            turns = [(x.get("role", ""), x.get("text", "")) for x in t.get("turns", [])]
            tid = t.get("id") or trajectory_id(rec.get("task", ""), rec.get("task_id", ""), turns)
            reward = dict(t.get("reward") or {})
            automatic = reward.get("automatic_total", reward.get("total", 0.0))
            items[tid] = Reviewable(
                tid,
                "api_grpo",
                f"API-GRPO {rec.get('task', '')} {rec.get('phase', '')} episode {rec.get('episode', '')}, "
                f"trajectory {t.get('index', '')}" + (" (selected)" if t.get("selected") else ""),
                str(rec.get("task_id", "")),
                max_score,
                float(automatic),
                turns,
                {k: v for k, v in reward.items() if k not in ("override",)},
                str(rec.get("task", "")),
            )
    for _, rec in _json_lines(root / ORCHESTRATOR_TRANSCRIPTS):
        oid = orchestrator_episode_id(rec)
        steps = [(s.get("agent", ""), s.get("text", "")) for s in rec.get("steps", [])]
        items[oid] = Reviewable(
            oid,
            "orchestrator",
            f"orchestrator {rec.get('method', '')} {rec.get('phase', '')} episode {rec.get('episode', '')} "
            f"({rec.get('agents', '')})",
            str(rec.get("task_id", "")),
            ORCHESTRATOR_MAX_REWARD,
            float(rec.get("reward", 0.0)),
            steps,
            dict(rec.get("level_reward") or {}),
            phase=str(rec.get("phase", "")),
        )
    return items


def parse_score(value: str, max_score: float) -> float:
    """A score from the command line: a number, or a verdict (``good`` = ``max_score``, ``bad`` = 0).

    Raises:
        OverrideError: neither a finite number nor a verdict.
    """
    v = value.strip().lower()
    if v in VERDICTS:
        return VERDICTS[v] * max_score
    try:
        x = float(v)
    except ValueError:
        x = math.nan
    if not math.isfinite(x):
        raise OverrideError(f"score {value!r} is neither a number nor a verdict ({', '.join(VERDICTS)})")
    return x


def set_override(
    path: str | Path,
    item_id: str,
    score: str | float,
    note: str = "",
    root: str | Path = ".",
    who: str | None = None,
    when: str | None = None,
    items: Mapping[str, Reviewable] | None = None,
) -> Override:
    """Check and record one override (replacing an earlier one for the same id); returns it.

    Raises:
        OverrideError: unknown id (not in the reports under ``root``), score out of ``[0, max]`` or not a
            number/verdict, a note longer than ``MAX_NOTE``, or an unreadable overrides file. The file is then
            unchanged.
    """
    items = load_reviewables(root) if items is None else items
    if item_id not in items:
        where = f"{API_GRPO_EPISODES} or {ORCHESTRATOR_TRANSCRIPTS} under {Path(root).resolve()}"
        raise OverrideError(
            f"unknown id {item_id!r}: no trajectory or episode with it in {where} ({len(items)} ids)"
        )
    item = items[item_id]
    if item.kind == "orchestrator" and item.phase != "train":
        raise OverrideError(
            f"{item_id} is an orchestrator evaluation episode: train_orchestrator applies human scores to its "
            "training episodes only (phase train)"
        )
    x = parse_score(str(score), item.max_score)
    if not 0.0 <= x <= item.max_score:
        raise OverrideError(f"score {x:g} out of range [0, {item.max_score:g}] for {item_id} ({item.kind})")
    if len(note) > MAX_NOTE:
        raise OverrideError(f"note of {len(note)} characters; at most {MAX_NOTE}")
    current = read_overrides(path)
    o = Override(
        item_id,
        x,
        note,
        who if who is not None else who_am_i(),
        when or datetime.now(UTC).replace(microsecond=0).isoformat(),
        item.task,
    )
    current[item_id] = o
    write_overrides(path, current.values())
    return o


_ID = re.compile(r"^ag-[0-9a-f]{12}$")


def check_for_stage(overrides: Mapping[str, Override], task: str, max_reward: float) -> dict[str, Override]:
    """The overrides the API-GRPO stage can apply to ``task``, checked before any work.

    Lines of another task (their ``task`` field) and orchestrator episodes (``oe-``, applied by
    ``train_orchestrator``: :func:`check_for_orchestrator`) are left out: their ids can never match. Every other
    line must have an ``ag-`` id (``ag-`` + 12 hex digits) and a score in ``[0, max_reward]``.

    Raises:
        OverrideError: one line naming every bad id: ids that are no trajectory id, scores out of range (with
            the range and the task).
    """
    mine = {
        i: o for i, o in overrides.items() if (not o.task or o.task == task) and not i.startswith("oe-")
    }  # orchestrator episodes are train_orchestrator's (check_for_orchestrator)
    malformed = sorted(i for i in mine if not _ID.match(i))
    out_of_range = sorted(
        f"{i} ({o.score:g})" for i, o in mine.items() if _ID.match(i) and not 0.0 <= o.score <= max_reward
    )
    problems = []
    if malformed:
        problems.append("unknown ids (not ag- + 12 hex digits): " + ", ".join(malformed))
    if out_of_range:
        problems.append(
            f"scores out of range [0, {max_reward:g}] for task {task}: " + ", ".join(out_of_range)
        )
    if problems:
        raise OverrideError("; ".join(problems))
    return mine


_OE_ID = re.compile(r"^oe-[0-9a-f]{12}$")


def check_for_orchestrator(
    overrides: Mapping[str, Override], low: float = 0.0, high: float = ORCHESTRATOR_MAX_REWARD
) -> dict[str, Override]:
    """The orchestrator-episode overrides (ids starting ``oe-``) ``train_orchestrator`` applies, checked before
    any work: each id ``oe-`` + 12 hex digits, each score in ``[low, high]`` (the range of its task reward:
    ``[0, 4]`` for the level reward, between ``failure_penalty`` and ``success_bonus`` for ``binary``).

    Raises:
        OverrideError: one line naming every malformed id and every score out of range.
    """
    mine = {i: o for i, o in overrides.items() if i.startswith("oe-")}
    malformed = sorted(i for i in mine if not _OE_ID.match(i))
    out_of_range = sorted(
        f"{i} ({o.score:g})" for i, o in mine.items() if _OE_ID.match(i) and not low <= o.score <= high
    )
    problems = []
    if malformed:
        problems.append("unknown orchestrator ids (not oe- + 12 hex digits): " + ", ".join(malformed))
    if out_of_range:
        problems.append(
            f"scores out of the orchestrator's task reward range [{low:g}, {high:g}]: "
            + ", ".join(out_of_range)
        )
    if problems:
        raise OverrideError("; ".join(problems))
    return mine


def apply_override(reward: Mapping, override: Override | None) -> dict:
    """``reward`` with the human score as ``total`` (the automatic one kept as ``automatic_total``) and the
    override recorded under ``override``; unchanged (a copy) without an override."""
    out = dict(reward)
    if override is None:
        return out
    out["automatic_total"] = reward.get("total", 0.0)
    out["total"] = override.score
    out["override"] = {
        "score": override.score,
        "note": override.note,
        "who": override.who,
        "when": override.when,
    }
    return out
