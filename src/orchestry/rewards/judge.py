"""LLM judge for the API-GRPO value estimator: quality, collaboration and efficiency of a transcript, 0-10.

The judge sees the problem, every agent's answer (with its token count) and the executable result, and must
answer three lines ``QUALITY: <0-10>``, ``COLLABORATION: <0-10>``, ``EFFICIENCY: <0-10>``. Parsing follows
the MAPPA coach recipe (arXiv 2601.23228; docs/algorithms.md, "LLM judge"): a regex per score, clamped to
[0, 10]; on a bad format ask once more; then take the first numbers found in the answer; a score still
missing, or an API failure, becomes the neutral 5.0 and is counted. Judge calls go through the same cached,
costed, budgeted client as the agents (tag ``judge``), so a budget stop raised during judging propagates.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from orchestry.llm.backends import ChatRequest
from orchestry.llm.cost import BudgetExceeded

log = logging.getLogger("orchestry.rewards.judge")

CRITERIA = ("quality", "collaboration", "efficiency")
NEUTRAL = 5.0
JUDGE_SYSTEM = "You are a strict, fair judge of multi-agent programming transcripts."
_SCORE = {c: re.compile(rf"{c}\s*[:=]\s*\**\s*(-?\d+(?:\.\d+)?)", re.IGNORECASE) for c in CRITERIA}
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
RETRY_PROMPT = "Answer with exactly three lines and nothing else:\nQUALITY: <0-10>\nCOLLABORATION: <0-10>\nEFFICIENCY: <0-10>"


@dataclass
class JudgeScore:
    """Scores 0-10 per criterion, their weighted mean ``combined`` (0-10) and how they were obtained.

    ``how``: ``"format"`` (regex), ``"retry"`` (regex after asking again), ``"numbers"`` (first numbers),
    ``"neutral"`` (some score defaulted to 5.0), ``"error"`` (API failure: all 5.0).
    """

    quality: float
    collaboration: float
    efficiency: float
    combined: float
    how: str
    raw: str = ""

    def to_dict(self) -> dict:
        return {
            "quality": self.quality,
            "collaboration": self.collaboration,
            "efficiency": self.efficiency,
            "combined": self.combined,
            "how": self.how,
        }


def _clamp(x: float) -> float:
    return min(10.0, max(0.0, x))


def parse_scores(text: str) -> dict[str, float] | None:
    """The three scores from ``QUALITY: n`` style lines (clamped to [0, 10]), or ``None`` if any is missing."""
    out = {}
    for c, pattern in _SCORE.items():
        m = pattern.search(text or "")
        if m is None:
            return None
        out[c] = _clamp(float(m.group(1)))
    return out


def first_numbers(text: str) -> dict[str, float | None]:
    """Fallback: the first three numbers of ``text`` in criteria order (``None`` where missing)."""
    nums = [_clamp(float(x)) for x in _NUMBER.findall(text or "")][: len(CRITERIA)]
    return {c: (nums[i] if i < len(nums) else None) for i, c in enumerate(CRITERIA)}


CODE_CRITERIA = (
    "QUALITY: is the final code correct, clear and complete?\n"
    "COLLABORATION: does each agent build on the others' work (and use what they provide)?\n"
    "EFFICIENCY: is the work done with few, short, focused answers?\n"
)


def judge_prompt(
    problem_prompt: str,
    transcript: Sequence[tuple[str, str, int]],
    result: str,
    criteria: str | None = None,
) -> str:
    """The judge's user message. ``transcript``: ``(role, answer, completion tokens)`` per turn; ``criteria``:
    what each of the three scores means, one ``NAME: question`` line each (``None``: the code tasks')."""
    parts = [f"Problem given to the agents:\n{problem_prompt.strip()}\n"]
    for role, text, tokens in transcript:
        parts.append(f"--- {role} ({tokens} tokens) ---\n{text.strip()[:3000]}\n")
    parts.append(f"--- executable result ---\n{result}\n")
    parts.append(
        "Score the transcript from 0 (worst) to 10 (best) on:\n" + (criteria or CODE_CRITERIA) + RETRY_PROMPT
    )
    return "\n".join(parts)


class Judge:
    """Score transcripts with an LLM through a cached, costed client (:class:`orchestry.llm.cache.CachedChat`).

    Args:
        client: object with ``complete_batch([ChatRequest]) -> [ChatResult]``.
        weights: per-criterion weights of ``combined`` (normalised to sum 1; all zero means equal weights).
        max_tokens: tokens per judge answer; temperature: sampling temperature (``None``: backend default).
    """

    def __init__(
        self,
        client,
        weights: Mapping[str, float] | None = None,
        max_tokens: int = 64,
        temperature: float | None = 0.0,
    ):
        self.client, self.max_tokens, self.temperature = client, max_tokens, temperature
        w = {c: float((weights or {}).get(c, 1.0)) for c in CRITERIA}
        total = sum(w.values())
        self.weights = {c: (v / total if total > 0 else 1 / len(CRITERIA)) for c, v in w.items()}
        self.failures = 0  # scores that fell back to the neutral 5.0
        self.calls = 0

    def _combined(self, s: Mapping[str, float]) -> float:
        return sum(self.weights[c] * s[c] for c in CRITERIA)

    def _request(self, prompt: str, tags: tuple[str, ...], retry_of: str | None = None) -> ChatRequest:
        msgs: tuple = (("user", prompt),)
        if retry_of is not None:
            msgs += (("assistant", retry_of or "(no answer)"), ("user", RETRY_PROMPT))
        return ChatRequest(msgs, JUDGE_SYSTEM, 0, self.max_tokens, self.temperature, None, tags)

    def score(
        self, prompts: Sequence[str], tags: Sequence[tuple[str, ...]] | None = None
    ) -> list[JudgeScore]:
        """Judge each prompt (see :func:`judge_prompt`); one batched call, plus one for the retries.

        Raises:
            BudgetExceeded: from the client (other API errors give neutral scores, counted in ``failures``).
        """
        tags = list(tags or [("judge",)] * len(prompts))
        try:
            first = self.client.complete_batch(
                [self._request(p, t) for p, t in zip(prompts, tags, strict=True)]
            )
        except BudgetExceeded:
            raise
        except Exception as e:  # API failure: neutral scores
            log.warning("judge call failed (%s): neutral %.1f for %d transcripts", e, NEUTRAL, len(prompts))
            self.failures += len(prompts)
            return [JudgeScore(NEUTRAL, NEUTRAL, NEUTRAL, NEUTRAL, "error") for _ in prompts]
        self.calls += len(prompts)
        out: list[JudgeScore | None] = [None] * len(prompts)
        retry = []
        for i, res in enumerate(first):
            s = parse_scores(res.text)
            if s is not None:
                out[i] = JudgeScore(**s, combined=self._combined(s), how="format", raw=res.text)
            else:
                retry.append(i)
        if retry:
            try:
                second = self.client.complete_batch(
                    [self._request(prompts[i], tags[i], retry_of=first[i].text) for i in retry]
                )
                self.calls += len(retry)
            except BudgetExceeded:
                raise
            except Exception as e:
                log.warning("judge retry failed (%s)", e)
                second = [None] * len(retry)
            for i, res in zip(retry, second, strict=True):
                s = parse_scores(res.text) if res is not None else None
                if s is not None:
                    out[i] = JudgeScore(**s, combined=self._combined(s), how="retry", raw=res.text)
                    continue
                text = first[i].text + "\n" + (res.text if res is not None else "")
                nums = first_numbers(text)
                how = "numbers"
                if any(v is None for v in nums.values()):
                    self.failures += 1
                    how = "neutral"
                filled = {c: (NEUTRAL if v is None else v) for c, v in nums.items()}
                out[i] = JudgeScore(**filled, combined=self._combined(filled), how=how, raw=text)
        return out  # type: ignore[return-value]

    def guidelines(
        self,
        roles: Sequence[str],
        top: Sequence[str],
        bottom: Sequence[str],
        max_per_role: int,
        tags=("judge",),
    ) -> dict[str, list[str]]:
        """Ask the judge for up to ``max_per_role`` guidelines per role that separate ``top`` from ``bottom``
        transcripts (rendered text). Lines ``<role>: <guideline>`` are kept; anything else is ignored.

        Raises:
            BudgetExceeded: from the client (other API errors give no guidelines).
        """
        prompt = (
            "Below are transcripts of agents ("
            + ", ".join(roles)
            + ") solving programming problems together.\n"
            "TOP transcripts scored well; BOTTOM ones scored badly on the same problems.\n\n"
            + "\n".join(f"=== TOP {i + 1} ===\n{t[:2500]}" for i, t in enumerate(top))
            + "\n"
            + "\n".join(f"=== BOTTOM {i + 1} ===\n{t[:2500]}" for i, t in enumerate(bottom))
            + f"\n\nWrite at most {max_per_role} short, general guidelines per agent that would make the agents "
            "behave like the TOP transcripts. One guideline per line, formatted `<agent>: <guideline>`, "
            "with <agent> one of: " + ", ".join(roles) + "."
        )
        try:
            res = self.client.complete_batch(
                [ChatRequest((("user", prompt),), JUDGE_SYSTEM, 0, 400, 0.0, None, tags)]
            )
        except BudgetExceeded:
            raise
        except Exception as e:
            log.warning("judge guideline extraction failed (%s)", e)
            return {}
        return parse_guidelines(res[0].text, roles, max_per_role)


def judge_agreement(
    rewards: Sequence[float], judge_scores: Sequence[float], max_reward: float, bins: int = 5
) -> dict[str, float]:
    """How well the judge's ``combined`` score (0-10) agrees with the executable reward R (0..``max_reward``).

    - ``spearman``: Spearman's rank correlation of R and J (``scipy.stats.spearmanr``, ties averaged);
    - ``kappa``: Cohen's quadratic-weighted kappa (Cohen 1968; ``sklearn.metrics.cohen_kappa_score``) of the
      two scores as ordinal ratings: ``R / max_reward`` and ``J / 10`` each cut into ``bins`` equal-width bins
      of [0, 1] (the top edge in the last bin). 1: same ratings; 0: chance-level agreement.

    Both are NaN when there are fewer than two pairs or a side is constant (undefined, not "no agreement").

    Returns:
        ``{"pairs": n, "spearman": rho, "kappa": kappa}``.

    Raises:
        ValueError: the sequences differ in length, ``max_reward <= 0`` or ``bins < 2``.
    """
    if len(rewards) != len(judge_scores):
        raise ValueError(f"{len(rewards)} rewards for {len(judge_scores)} judge scores")
    if max_reward <= 0 or bins < 2:
        raise ValueError(f"need max_reward > 0 and bins >= 2, got max_reward={max_reward}, bins={bins}")
    n = len(rewards)
    nan = float("nan")
    if n < 2 or len(set(rewards)) < 2 or len(set(judge_scores)) < 2:
        return {"pairs": n, "spearman": nan, "kappa": nan}
    import numpy as np
    from scipy.stats import spearmanr
    from sklearn.metrics import cohen_kappa_score

    def rating(x: Sequence[float], top: float) -> np.ndarray:
        return np.minimum((np.clip(np.asarray(x, float) / top, 0.0, 1.0) * bins).astype(int), bins - 1)

    rho = float(spearmanr(rewards, judge_scores).statistic)
    a, b = rating(rewards, max_reward), rating(judge_scores, 10.0)
    if (
        len(set(a.tolist()) | set(b.tolist())) == 1
    ):  # every rating the same bin: chance agreement is 1, kappa 0/0
        return {"pairs": n, "spearman": rho, "kappa": nan}
    kappa = float(cohen_kappa_score(a, b, labels=list(range(bins)), weights="quadratic"))
    return {"pairs": n, "spearman": rho, "kappa": kappa}


def parse_guidelines(text: str, roles: Sequence[str], max_per_role: int) -> dict[str, list[str]]:
    """``{role: [guideline, ...]}`` from lines ``[-*] <role>: <text>`` (case-insensitive role, deduplicated)."""
    pattern = re.compile(r"^\s*(?:[-*\d.)]+\s*)?\**\s*(" + "|".join(map(re.escape, roles)) + r")\s*\**\s*:\s*(.+?)\s*$",
                         re.IGNORECASE | re.MULTILINE)  # fmt: skip
    out: dict[str, list[str]] = {}
    for m in pattern.finditer(text or ""):
        role, line = m.group(1).lower(), m.group(2).strip()
        bucket = out.setdefault(role, [])
        if line and line not in bucket and len(bucket) < max_per_role:
            bucket.append(line[:300])
    return out
