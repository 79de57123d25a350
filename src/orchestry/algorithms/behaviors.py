"""The behaviour library of API-GRPO: what separates the best trajectories from the worst, as prompt guidelines.

Every m episodes (docs/algorithms.md, section 4):

1. pool every complete trajectory of the episodes so far with its group-relative advantage
   ``A = R - mean_group R`` (so a hard problem's trajectories are compared with each other, not with an
   easy problem's);
2. *top* = the ``top_fraction`` of the pool with the highest A > 0, *bottom* = as many with the lowest A < 0
   (groups whose trajectories all scored the same carry no signal and drop out);
3. the deterministic extractor (always on) compares measurable features of top and bottom
   (:meth:`orchestry.tasks.common.Task.features`: cooperation scheme of main's code via
   :func:`orchestry.analysis.schemes.detect_scheme`, answer and code length, fences, prose after the code,
   truncation, aux definition and use, test-passing structure): for a 0/1 feature the effect is the
   difference of rates, for a count the difference of means in pooled standard deviations;
4. features with a large enough effect (a 0/1 rate difference of at least 0.25 and of at least two
   trajectories' worth, i.e. ``2 / n`` with n per side; a count's difference of at least 0.8 pooled
   standard deviations) and a guideline template become guidelines for their agent, strongest first (``outcome_*`` features -- syntax ok, tests passed -- are reported, never turned into
   guidelines: they restate the reward);
5. optionally the LLM judge reads top and bottom transcripts and proposes guidelines too.

The guidelines are injected into the agents' prompts (``Problem.helper_prompt(behaviors=...)`` etc.).

Transfer (:func:`read_library`, :class:`TransferredLibrary`): a library another run wrote, of this task or of
another, can be the starting library of a run (``api_grpo.init_behaviors``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class FeatureContrast:
    """One feature's means in the top and bottom trajectories and the effect size (see module docstring)."""

    name: str
    top: float
    bottom: float
    effect: float
    binary: bool

    def to_dict(self) -> dict:
        return {"feature": self.name, "top": self.top, "bottom": self.bottom, "effect": self.effect,
                "binary": self.binary}  # fmt: skip


@dataclass
class Guideline:
    """A guideline for one agent, where it came from (``features`` or ``judge``) and its evidence."""

    role: str
    text: str
    source: str
    feature: str = ""
    effect: float = 0.0

    def to_dict(self) -> dict:
        return {"role": self.role, "text": self.text, "source": self.source, "feature": self.feature,
                "effect": self.effect}  # fmt: skip


@dataclass
class LibraryUpdate:
    """One refresh of the library: sizes, the feature report, and the guidelines per role."""

    after_episode: int
    pool: int
    top: int
    bottom: int
    contrasts: list[FeatureContrast] = field(default_factory=list)
    guidelines: list[Guideline] = field(default_factory=list)
    note: str = ""

    def behaviors(self) -> dict[str, str]:
        """``{role: "- guideline\\n- guideline"}`` ready for prompt injection."""
        out: dict[str, list[str]] = {}
        for g in self.guidelines:
            out.setdefault(g.role, []).append(f"- {g.text}")
        return {r: "\n".join(lines) for r, lines in out.items()}

    def to_dict(self) -> dict:
        return {
            "after_episode": self.after_episode,
            "pool": self.pool,
            "top": self.top,
            "bottom": self.bottom,
            "note": self.note,
            "features": [c.to_dict() for c in self.contrasts],
            "guidelines": [g.to_dict() for g in self.guidelines],
            "behaviors": self.behaviors(),
        }


def split_top_bottom(advantages: Sequence[float], top_fraction: float) -> tuple[list[int], list[int]]:
    """Indices of the top and bottom trajectories by advantage (see module docstring, step 2).

    ``n = max(1, round(top_fraction * len(advantages)))`` on each side, only A > 0 on top and A < 0 at the
    bottom, best first / worst first; ties keep input order.
    """
    n = max(1, round(top_fraction * len(advantages))) if advantages else 0
    order = sorted(range(len(advantages)), key=lambda i: -advantages[i])
    top = [i for i in order if advantages[i] > 0][:n]
    bottom = [i for i in reversed(order) if advantages[i] < 0][:n]
    return top, bottom


def contrast(
    top: Sequence[Mapping[str, float]], bottom: Sequence[Mapping[str, float]]
) -> list[FeatureContrast]:
    """Effect of every feature present in both groups, largest ``|effect|`` first.

    Binary (all values 0/1): ``mean_top - mean_bottom``. Otherwise the difference of means divided by the
    pooled standard deviation (0 when both groups are constant and equal; +-inf capped at +-10).
    """
    names = (
        sorted(set().union(*[set(f) for f in top]) & set().union(*[set(f) for f in bottom]))
        if top and bottom
        else []
    )
    out = []
    for name in names:
        a = [float(f.get(name, 0.0)) for f in top]
        b = [float(f.get(name, 0.0)) for f in bottom]
        ma, mb = sum(a) / len(a), sum(b) / len(b)
        binary = all(v in (0.0, 1.0) for v in a + b)
        if binary:
            effect = ma - mb
        else:
            va = sum((x - ma) ** 2 for x in a) / max(1, len(a) - 1)
            vb = sum((x - mb) ** 2 for x in b) / max(1, len(b) - 1)
            sd = math.sqrt((va + vb) / 2)
            effect = (ma - mb) / sd if sd > 0 else (0.0 if ma == mb else math.copysign(10.0, ma - mb))
            effect = max(-10.0, min(10.0, effect))
        out.append(FeatureContrast(name, ma, mb, effect, binary))
    out.sort(key=lambda c: (-abs(c.effect), c.name))
    return out


def guidelines_from_contrasts(
    contrasts: Sequence[FeatureContrast],
    guides: Mapping[str, tuple[str, str | None, str | None]],
    max_per_role: int,
    min_effect_binary: float = 0.25,
    min_effect_numeric: float = 0.8,
) -> list[Guideline]:
    """Turn strong contrasts into guidelines via ``guides[feature] = (role, if higher in top, if lower)``.

    A 0/1 feature needs ``|rate difference| >= min_effect_binary``, a count ``|standardised difference| >=
    min_effect_numeric`` (0.8: a "large" effect). ``{top}``/``{bottom}`` in a template are the feature's
    means. ``outcome_*`` features are skipped. At most ``max_per_role`` per role, strongest first.
    """
    out: list[Guideline] = []
    per_role: dict[str, int] = {}
    for c in contrasts:
        if c.name.startswith("outcome_") or c.name not in guides:
            continue
        if abs(c.effect) < (min_effect_binary if c.binary else min_effect_numeric):
            continue
        role, higher, lower = guides[c.name]
        template = higher if c.effect > 0 else lower
        if not template or per_role.get(role, 0) >= max_per_role:
            continue
        text = template.format(top=c.top, bottom=c.bottom)
        if any(g.text == text for g in out):
            continue
        per_role[role] = per_role.get(role, 0) + 1
        out.append(Guideline(role, text, "features", c.name, c.effect))
    return out


def extract_behaviors(
    features: Sequence[Mapping[str, float]],
    advantages: Sequence[float],
    guides: Mapping[str, tuple[str, str | None, str | None]],
    after_episode: int,
    top_fraction: float = 0.2,
    max_per_role: int = 3,
) -> LibraryUpdate:
    """The deterministic extractor: steps 2-4 of the module docstring over a pool of trajectories.

    Args:
        features: one feature dict per trajectory of the pool.
        advantages: their group-relative advantages (same order).
        guides: the task's guideline templates (``Task.feature_guides``).

    Returns:
        A :class:`LibraryUpdate` (no guidelines and a ``note`` when top or bottom is empty).
    """
    if len(features) != len(advantages):
        raise ValueError(f"{len(features)} feature dicts for {len(advantages)} advantages")
    top, bottom = split_top_bottom(advantages, top_fraction)
    update = LibraryUpdate(after_episode, len(features), len(top), len(bottom))
    if not top or not bottom:
        update.note = "no contrast: every group's trajectories scored the same"
        return update
    update.contrasts = contrast([features[i] for i in top], [features[i] for i in bottom])
    # a 0/1 difference must be carried by at least two trajectories (with 3 per side: 2/3), not one
    min_binary = max(0.25, 2 / min(len(top), len(bottom)) - 1e-9)
    update.guidelines = guidelines_from_contrasts(update.contrasts, guides, max_per_role, min_binary)
    if not update.guidelines:
        update.note = "no feature separated top from bottom strongly enough"
    return update


# ---- behaviour transfer: a library learned on another run (``api_grpo.init_behaviors``) ------------------------
class LibraryError(ValueError):
    """A library to transfer (``api_grpo.init_behaviors``) is missing or malformed; the message names the key
    and the path."""


@dataclass
class TransferredLibrary:
    """A ``learned_behaviors.json`` read for transfer: the path, the task it says it came from (``""`` when the
    file does not say), its version there, and ``{role: "- guideline\\n- ..."}`` as written."""

    path: str
    task: str
    version: int | None
    behaviors: dict[str, str]

    def mapped(self, roles: Sequence[str], source_roles: Sequence[str] = ()) -> tuple[dict[str, str], dict]:
        """The guidelines for an agent team with ``roles`` (turn order), and how they were placed.

        A role this team has keeps its guidelines. Otherwise, when the source task's roles are known
        (``source_roles``, turn order), the role at the same relative position takes them: the first agent's go
        to the first agent, the last agent's to the last, a middle one's to ``round(i (m - 1) / (n - 1))``
        (n source roles, m roles here); several sources on one role are joined in the source's turn order.
        Anything else is unused.

        Returns:
            ``(behaviors, {"roles": {source role: role here}, "unused_roles": [...]})``.
        """
        placed: dict[str, str] = {}
        unused: list[str] = []
        n, m = len(source_roles), len(roles)
        order = sorted(self.behaviors, key=lambda r: list(source_roles).index(r) if r in source_roles else n)
        for r in order:
            if r in roles:
                placed[r] = r
            elif r in source_roles and m:
                i = list(source_roles).index(r)
                placed[r] = roles[0 if n == 1 else round(i * (m - 1) / (n - 1))]
            else:
                unused.append(r)
        out: dict[str, list[str]] = {}
        for src, dst in placed.items():
            if self.behaviors[src].strip():
                out.setdefault(dst, []).append(self.behaviors[src].strip())
        return {r: "\n".join(v) for r, v in out.items()}, {"roles": placed, "unused_roles": unused}


def read_library(
    path: str | Path, shown: str | None = None, key: str = "api_grpo.init_behaviors"
) -> TransferredLibrary:
    """Read a behaviour library to transfer (a ``learned_behaviors.json`` of any task).

    Only ``behaviors`` is required: a mapping of role to guideline text (the ``- ...`` lines an API-GRPO run
    writes). ``task`` (a string) and ``version`` (an integer) are read when present.

    Args:
        path: the file to open; shown: the path as the user wrote it (for messages and the summary).

    Raises:
        LibraryError: one line naming ``key`` and the path: not found, unreadable, not JSON, or not a library.
    """
    shown = str(path) if shown is None else shown
    where = f"{key}: {shown}"
    p = Path(path)
    if not p.is_file():
        raise LibraryError(f"{where}: no such file (copy the learned_behaviors.json to transfer there)")
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise LibraryError(f"{where}: cannot be read: {e}") from None
    except json.JSONDecodeError as e:
        raise LibraryError(f"{where}: not JSON ({e.msg} at line {e.lineno})") from None
    if not isinstance(data, dict):
        raise LibraryError(f"{where}: not a behaviour library (a JSON object), got {type(data).__name__}")
    beh = data.get("behaviors")
    if not isinstance(beh, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in beh.items()
    ):
        raise LibraryError(
            f"{where}: not a behaviour library: 'behaviors' must map each role to its guideline text"
        )
    task = data.get("task", "")
    if not isinstance(task, str):
        raise LibraryError(f"{where}: 'task' must be a task name, got {task!r}")
    version = data.get("version")
    if version is not None and (isinstance(version, bool) or not isinstance(version, int)):
        raise LibraryError(f"{where}: 'version' must be an integer, got {version!r}")
    return TransferredLibrary(shown, task, version, dict(beh))
