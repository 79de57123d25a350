"""Research synthesis as a three-turn episode: two researchers take notes on their share of a bundle of source
passages, a synthesiser answers the question from the notes and the passages, citing passage ids.

Data: ``data/tasks/research_bundles.jsonl`` (``api_grpo.research.bundles_path``; built by
:mod:`orchestry.tasks.research_data`): per bundle a question and 3-5 short passages ``P1``.. with their source
and licence. The last ``test_bundles`` bundles are the evaluation's, the others the training episodes'.
``researcher_a`` reads the first half of the passages (rounded up), ``researcher_b`` the rest.

The latest answer (a researcher's notes until the synthesiser has answered) is scored by checks; each part
0-1, weighted (``api_grpo.research`` weights; max 3.5 by default):

- ``cited`` (1.0): the share of claims (sentences or lines of at least 3 words) that cite at least one passage
  of the bundle, as ``[P2]`` or ``[P1, P3]``;
- ``valid`` (1.0): the share of the citations that name a passage of the bundle (an invented ``[P9]`` counts
  against it); no citation at all scores 0;
- ``coverage`` (1.0): the share of the bundle's passages cited at least once;
- ``length`` (0.5): the answer has 1 to ``max_words`` words.

The optional LLM judge scores faithfulness to the cited passages and completeness on top.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from orchestry.tasks.common import Turn, checked_result_line, finished, next_message, part_weights
from orchestry.tasks.text_checks import content_stems, copied_share, is_real_sentence, support

if TYPE_CHECKING:
    from orchestry.config import ApiGrpoResearchParams
    from orchestry.sandbox import Sandbox

RESEARCHER_SYSTEM = "You are a researcher who takes short, exact notes from sources and cites them."
SYNTHESISER_SYSTEM = "You are a writer who answers questions only from the given sources, citing them."
_CITATION = re.compile(r"\[([^\[\]]{1,60})\]")
_ID = re.compile(r"\bP\d+\b")
_SENTENCES = re.compile(r"(?<=[.!?])\s+|\n+")


class BundleError(ValueError):
    """The bundles file is missing or malformed (the message names the file and line)."""


@dataclass(frozen=True)
class Bundle:
    """One question and its passages ``((id, text), ...)``; ``prompt`` is what the judge sees."""

    task_id: str
    question: str
    passages: tuple[tuple[str, str], ...]

    @property
    def prompt(self) -> str:
        return f"Question: {self.question}\n\n" + render(self.passages)

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(i for i, _ in self.passages)


def render(passages: Sequence[tuple[str, str]]) -> str:
    return "\n\n".join(f"[{i}]\n{text}" for i, text in passages)


def read_bundles(path: str | Path) -> list[Bundle]:
    """Bundles from a JSONL file (``id``, ``question``, ``passages``: 3-5 of ``{id, text, source, license}``).

    Raises:
        BundleError: missing file, bad JSON, a missing field, a passage without a licence or source, fewer than 3
            or more than 5 passages, repeated passage or bundle ids.
    """
    p = Path(path)
    if not p.exists():
        raise BundleError(f"{p}: no such bundles file (python -m orchestry.tasks.research_data writes it)")
    out, seen = [], set()
    for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
            bid, question, passages = d["id"], d["question"], d["passages"]
            items = tuple((q["id"], q["text"]) for q in passages)
            for q in passages:
                if not q.get("license") or not q.get("source"):
                    raise BundleError(f"{p}:{n}: passage {q['id']} has no license or source")
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise BundleError(f"{p}:{n}: need id, question and passages with id and text ({e})") from None
        if not 3 <= len(items) <= 5:
            raise BundleError(f"{p}:{n}: {len(items)} passages; a bundle has 3 to 5")
        if len({i for i, _ in items}) != len(items) or bid in seen:
            raise BundleError(f"{p}:{n}: repeated passage id or bundle id {bid}")
        seen.add(bid)
        out.append(Bundle(f"Research/{bid}", question, items))
    return out


def claims(text: str) -> list[str]:
    """Sentences or lines of at least 3 words (citations and list markers kept)."""
    return [s.strip() for s in _SENTENCES.split(text or "") if len(s.split()) >= 3]


def supported(claim: str, passages: Mapping[str, str], support_min: float = 0.5) -> bool:
    """``claim`` is a real sentence once its citations are removed, cites passages of the bundle, and at least
    ``support_min`` of its content words (3+ distinct) occur in those passages; a claim copied verbatim (8-word
    runs covering 80 % of it) is a quote, not a synthesis, and is not supported."""
    cited = [passages[i] for i in cited_ids(claim) if i in passages]
    text = _CITATION.sub(" ", claim)
    if not cited or len(content_stems(text)) < 3 or not is_real_sentence(text, 4):
        return False
    if copied_share(text, cited, 8) > 0.8:
        return False
    return support(text, " ".join(cited)) >= support_min


def cited_ids(text: str) -> list[str]:
    """Every passage id inside square brackets, in order (``[P1, P3]`` gives P1, P3)."""
    return [i for m in _CITATION.finditer(text or "") for i in _ID.findall(m.group(1))]


class ResearchSynthesis:
    """Researchers -> synthesiser (three turns); reward: citation checks and length (max 3.5 by default)."""

    name = "research_synthesis"
    roles = ("researcher_a", "researcher_b", "synthesiser")
    reward_parts = ("cited", "valid", "coverage", "length")
    judge_criteria = (
        "QUALITY: is every statement of the final answer supported by the passage it cites (faithfulness), "
        "and does the answer cover what the passages say about the question (completeness)?\n"
        "COLLABORATION: does the synthesiser use both researchers' notes?\n"
        "EFFICIENCY: is the work done with few, short, focused answers?\n"
    )

    def __init__(self, params: ApiGrpoResearchParams | None = None, root: str | Path = "."):
        if params is None:
            from orchestry.config import ApiGrpoResearchParams

            params = ApiGrpoResearchParams()
        self.params, self.root = params, Path(root)
        self.weights = part_weights(params, self.reward_parts)
        self.max_reward = sum(self.weights.values())
        self.feature_guides: dict[str, tuple[str, str | None, str | None]] = {
            "researcher_a_citations": ("researcher_a", "Cite the passage id of every note, like [P1].", None),
            "researcher_b_citations": ("researcher_b", "Cite the passage id of every note, like [P3].", None),
            "synthesiser_words": (
                "synthesiser",
                "Write a fuller answer (top episodes: about {top:.0f} words, others {bottom:.0f}).",
                "Answer more briefly (top episodes: about {top:.0f} words, others {bottom:.0f}).",
            ),
            "synthesiser_uncited_claims": (
                "synthesiser",
                None,
                "End every sentence with the id of the passage that supports it, like [P2].",
            ),
            "synthesiser_invented_ids": ("synthesiser", None, "Cite only the passage ids given."),
        }

    def items(self, train: Sequence, test: Sequence) -> tuple[list[Bundle], list[Bundle]]:
        """The bundles file's bundles: all but the last ``test_bundles`` for training, those for evaluation.

        Raises:
            BundleError: see :func:`read_bundles`; fewer bundles than ``test_bundles + 1``.
        """
        path = Path(self.params.bundles_path)
        bundles = read_bundles(path if path.is_absolute() else self.root / path)
        k = self.params.test_bundles
        if len(bundles) <= k:
            raise BundleError(f"{path}: {len(bundles)} bundles; need more than test_bundles={k}")
        return bundles[:-k], bundles[-k:]

    def _halves(self, b: Bundle) -> tuple[tuple, tuple]:
        h = (len(b.passages) + 1) // 2
        return b.passages[:h], b.passages[h:]

    def messages(
        self, problem: Bundle, turns: Sequence[Turn], behaviors: Mapping[str, str]
    ) -> tuple[str, str]:
        """``(system, user)`` for the next agent.

        Raises:
            ValueError: the episode is already finished.
        """
        first, second = self._halves(problem)
        if len(turns) < 2:
            mine = first if not turns else second
            user = (
                f"Question: {problem.question}\n\nSources:\n{render(mine)}\n\nWrite short notes on what these "
                "sources say about the question. End each note with the id of its source in brackets, like "
                f"[{mine[0][0]}]."
            )
            return next_message(self, turns, behaviors, RESEARCHER_SYSTEM, user)
        if len(turns) == 2:
            user = (
                f"Question: {problem.question}\n\nSources:\n{render(problem.passages)}\n\n"
                f"Notes of researcher A:\n{turns[0].text.strip()}\n\nNotes of researcher B:\n{turns[1].text.strip()}"
                f"\n\nAnswer the question in at most {self.params.max_words} words, using only the sources. End "
                "every sentence with the ids of the sources that support it, like [P1] or [P1, P2]."
            )
            return next_message(self, turns, behaviors, SYNTHESISER_SYSTEM, user)
        raise finished(self, turns)

    def check(self, bundle: Bundle, answer: str) -> dict:
        """The checked parts of one answer (each 0-1), the weighted ``total`` and ``reasons``.

        A claim (a sentence of real prose once its citations are removed) counts as cited only when the
        passages it cites support it (:func:`supported`); citations outside such claims earn nothing; an answer
        mostly copied from the prompt or the passages (``copy_max``) scores 0.
        """
        ids = set(bundle.ids)
        passages = dict(bundle.passages)
        cs = claims(answer)
        ok = [c for c in cs if supported(c, passages, self.params.support_min)]
        cites = cited_ids(answer)
        good_cites = [i for c in ok for i in cited_ids(c) if i in ids]
        invented = sorted({c for c in cites if c not in ids})
        words = len((answer or "").split())
        copied = copied_share(answer, [bundle.prompt, bundle.question, *passages.values()], 8)
        parts = {
            "cited": len(ok) / len(cs) if cs else 0.0,
            "valid": len(good_cites) / len(cites) if cites else 0.0,
            "coverage": len(set(good_cites)) / len(ids),
            "length": float(1 <= words <= self.params.max_words and bool(ok)),
        }
        reasons = []
        if cs and len(ok) < len(cs):
            unsupported = [c for c in cs if set(cited_ids(c)) & ids and c not in ok]
            reasons.append(
                f"cited: {len(cs) - len(ok)} of {len(cs)} claims cite no passage that supports them"
                + (f" (unsupported: {unsupported[0][:60]!r})" if unsupported else "")
            )
        if not cs:
            reasons.append("cited: no claim (a sentence of prose)")
        if invented:
            reasons.append("valid: no such passage " + ", ".join(invented))
        if not cites:
            reasons.append("valid: no citation")
        elif sum(c in ids for c in cites) > len(good_cites):
            unbacked = sum(c in ids for c in cites) - len(good_cites)
            reasons.append(f"valid: {unbacked} of {len(cites)} citations back no supported claim")
        if parts["coverage"] < 1:
            reasons.append(
                "coverage: not cited by a supported claim "
                + ", ".join(i for i in bundle.ids if i not in good_cites)
            )
        if not parts["length"]:
            reasons.append(f"length: {words} words, at most {self.params.max_words}, and a supported claim")
        total = sum(self.weights[k] * v for k, v in parts.items())
        if copied > self.params.copy_max:
            reasons.append(f"copied: {copied:.0%} of the answer repeats the prompt or the passages")
            total = 0.0
        return {
            **parts, "total": total, "claims": len(cs), "supported": len(ok), "copied": copied, "words": words,
            "reasons": reasons,
        }  # fmt: skip

    def score(
        self,
        problems: Sequence[Bundle],
        transcripts: Sequence[Sequence[Turn]],
        sandbox: Sandbox | None = None,
    ) -> list[dict]:
        """Checked parts of the latest answer; no code runs."""
        return [self.check(b, t[-1].text if t else "") for b, t in zip(problems, transcripts, strict=True)]

    def result_line(self, reward: Mapping) -> str:
        return checked_result_line(reward, self.reward_parts, self.max_reward)

    def features(self, problem: Bundle, turns: Sequence[Turn], reward: Mapping) -> dict[str, float]:
        a, b, s = turns[0], turns[1], turns[2]
        ids = set(problem.ids)
        cites = cited_ids(s.text)
        return {
            "researcher_a_citations": float(bool(cited_ids(a.text))),
            "researcher_b_citations": float(bool(cited_ids(b.text))),
            "synthesiser_words": float(len(s.text.split())),
            "synthesiser_uncited_claims": float(
                sum(1 for c in claims(s.text) if not set(cited_ids(c)) & ids)
            ),
            "synthesiser_invented_ids": float(any(c not in ids for c in cites)),
            "synthesiser_truncated": float(s.truncated),
            "outcome_coverage": float(reward.get("coverage", 0)),
        }
