"""Coach process rewards: after each agent action a coach LLM scores it 0-10 and writes short feedback.

Source: MAPPA (arXiv 2601.23228), the coach workflow: a coach reads the task, the agent's role and its
output (and optionally the feedback it gave before) and answers ``FEEDBACK: ...`` and ``PROCESS_SCORE: n``.
Parsing (same recipe as :mod:`orchestry.rewards.judge`): the regex ``PROCESS_SCORE: n``, clamped to
[0, 10]; on a bad format the coach is asked once more; still bad: the first number of its answers
(clamped); no number at all, or a failed call: the neutral 5.0, counted in ``failures`` and logged (never
silent). Coach calls go through the same cached, costed, budgeted client as the agents
(:class:`orchestry.llm.cache.CachedChat`, tag ``coach``), so a budget stop propagates. The feedback text can
be shown to the next agent (:func:`coach_prompt` ``previous_feedback``). The process score is mixed with
the outcome reward by :func:`mix_rewards`.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from orchestry.llm.backends import ChatRequest, make_backend
from orchestry.llm.cache import CachedChat, ResponseCache
from orchestry.llm.clients import backend_options
from orchestry.llm.cost import BudgetExceeded, CostTracker, require_price
from orchestry.paths import repo_root

log = logging.getLogger("orchestry.rewards.coach")

NEUTRAL = 5.0
COACH_SYSTEM = "You are a coach of programming agents. You judge one step of one agent, briefly and fairly."
FORMAT = (
    "Answer with exactly two lines and nothing else:\nFEEDBACK: <one or two sentences>\nPROCESS_SCORE: <0-10>"
)
_SCORE = re.compile(r"PROCESS[_ ]SCORE\s*[:=]\s*\**\s*(-?\d+(?:\.\d+)?)", re.IGNORECASE)
_FEEDBACK = re.compile(r"FEEDBACK\s*[:=]\s*(.+?)\s*(?=PROCESS[_ ]SCORE|\Z)", re.IGNORECASE | re.DOTALL)
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
MAX_OUTPUT_CHARS = 4000


def _clamp(x: float) -> float:
    return min(10.0, max(0.0, x))


def parse_process_score(text: str | None) -> float | None:
    """The score of a ``PROCESS_SCORE: n`` line clamped to [0, 10], or ``None`` when there is none."""
    m = _SCORE.search(text or "")
    return None if m is None else _clamp(float(m.group(1)))


def first_number(text: str | None) -> float | None:
    """Fallback: the first number of ``text`` clamped to [0, 10] (``None`` when there is none)."""
    m = _NUMBER.search(text or "")
    return None if m is None else _clamp(float(m.group(0)))


def parse_feedback(text: str | None) -> str:
    """The ``FEEDBACK:`` text, else the answer without its score line (stripped; ``""`` for no answer)."""
    m = _FEEDBACK.search(text or "")
    if m is not None:
        return m.group(1).strip()
    return _SCORE.sub("", text or "").strip()


def coach_prompt(task: str, role: str, output: str, previous_feedback: str | None = None) -> str:
    """The coach's user message: the task, the agent's role, its output (cut to 4000 characters) and,
    optionally, the coach's earlier feedback, then the answer format (``FEEDBACK``/``PROCESS_SCORE``)."""
    parts = [f"Task given to the agents:\n{task.strip()}\n", f"--- output of the {role} agent ---\n"
             f"{output.strip()[:MAX_OUTPUT_CHARS]}\n"]  # fmt: skip
    if previous_feedback:
        parts.append(f"--- your earlier feedback to the agents ---\n{previous_feedback.strip()}\n")
    parts.append(
        f"Judge this step of the {role} agent: does it move the team towards a correct, complete solution, "
        "and does it fit its role? Score from 0 (harmful or useless) to 10 (exactly right).\n" + FORMAT
    )
    return "\n".join(parts)


@dataclass
class CoachScore:
    """One coach verdict.

    Attributes:
        score: 0-10 process score.
        feedback: the coach's feedback text (``""`` when the call failed).
        how: ``"format"`` (regex), ``"retry"`` (regex after asking again), ``"number"`` (first number of the
            answers), ``"neutral"`` (no number: 5.0) or ``"error"`` (the call failed: 5.0).
        raw: the coach's answer(s).
    """

    score: float
    feedback: str
    how: str
    raw: str = ""


# two worked examples put before the real question (``few_shot``): a small coach model copies their answer format
# (the embedded 135M model answers none of the bare prompts in the format, but nearly all after these)
FEW_SHOT: tuple[tuple[str, str], ...] = (
    ("user", coach_prompt("Write inc(x) that returns x + 1.", "main", "def inc(x):\n    return x - 1")),
    ("assistant", "FEEDBACK: inc subtracts 1 instead of adding it.\nPROCESS_SCORE: 2"),
    ("user", coach_prompt("Write double(x) that returns 2 * x.", "main", "def double(x):\n    return 2 * x")),
    ("assistant", "FEEDBACK: correct and simple.\nPROCESS_SCORE: 9"),
)


class Coach:
    """Score agent steps with an LLM through a cached, costed client.

    Args:
        client: object with ``complete_batch([ChatRequest]) -> [ChatResult]`` (e.g. a
            :class:`~orchestry.llm.cache.CachedChat` around any backend of :mod:`orchestry.llm.backends`).
        max_tokens: tokens per coach answer; temperature: sampling temperature (``None``: backend default).
        few_shot: put two worked examples (:data:`FEW_SHOT`, a bad step scored 2, a good one 9) before each
            question, so that small coach models answer in the format.

    Attributes (counters since creation): ``calls`` (requests answered), ``reasks`` (second requests after a
    bad format), ``fallbacks`` (scores taken from the first number), ``failures`` (neutral 5.0: no number or a
    failed call).
    """

    def __init__(
        self, client, max_tokens: int = 128, temperature: float | None = 0.0, few_shot: bool = False
    ):
        self.client, self.max_tokens, self.temperature = client, max_tokens, temperature
        self.few_shot = few_shot
        self.calls = self.reasks = self.fallbacks = self.failures = 0

    def counters(self) -> dict[str, int]:
        """``{"calls", "reasks", "fallbacks", "failures"}`` (for MLflow metrics ``coach/<name>``)."""
        return {
            "calls": self.calls,
            "reasks": self.reasks,
            "fallbacks": self.fallbacks,
            "failures": self.failures,
        }

    def _request(self, prompt: str, tags: tuple[str, ...], retry_of: str | None = None) -> ChatRequest:
        msgs: tuple = (*(FEW_SHOT if self.few_shot else ()), ("user", prompt))
        if retry_of is not None:
            msgs += (("assistant", retry_of or "(no answer)"), ("user", FORMAT))
        return ChatRequest(msgs, COACH_SYSTEM, 0, self.max_tokens, self.temperature, None, tags)

    def _batch(self, requests: list[ChatRequest], what: str) -> list | None:
        try:
            out = self.client.complete_batch(requests)
        except BudgetExceeded:
            raise
        except Exception as e:  # API failure: the caller falls back
            log.warning("coach %s failed for %d steps (%s: %s)", what, len(requests), type(e).__name__, e)
            return None
        self.calls += len(requests)
        return out

    def score(
        self, prompts: Sequence[str], tags: Sequence[tuple[str, ...]] | None = None
    ) -> list[CoachScore]:
        """Score each prompt (see :func:`coach_prompt`): one batched call, plus one for the re-asks.

        Returns:
            one :class:`CoachScore` per prompt, in order.

        Raises:
            BudgetExceeded: from the client (other API errors give neutral 5.0 scores, counted in ``failures``).
            ValueError: ``tags`` and ``prompts`` differ in length.
        """
        tags = list(tags) if tags is not None else [("coach",)] * len(prompts)
        if len(tags) != len(prompts):
            raise ValueError(f"{len(tags)} tags for {len(prompts)} prompts")
        first = self._batch([self._request(p, t) for p, t in zip(prompts, tags, strict=True)], "call")
        if first is None:
            self.failures += len(prompts)
            return [CoachScore(NEUTRAL, "", "error") for _ in prompts]
        out: list[CoachScore | None] = [None] * len(prompts)
        retry = []
        for i, res in enumerate(first):
            s = parse_process_score(res.text)
            if s is None:
                retry.append(i)
            else:
                out[i] = CoachScore(s, parse_feedback(res.text), "format", res.text)
        if retry:
            self.reasks += len(retry)
            second = self._batch([self._request(prompts[i], tags[i], first[i].text) for i in retry], "re-ask")
            for j, i in enumerate(retry):
                text2 = second[j].text if second is not None else ""
                s = parse_process_score(text2)
                if s is not None:
                    out[i] = CoachScore(s, parse_feedback(text2), "retry", text2)
                    continue
                raw = first[i].text + ("\n" + text2 if text2 else "")
                n = first_number(raw)
                if n is not None:
                    self.fallbacks += 1
                    out[i] = CoachScore(n, parse_feedback(first[i].text), "number", raw)
                else:
                    self.failures += 1
                    out[i] = CoachScore(NEUTRAL, parse_feedback(first[i].text), "neutral", raw)
            bad = sum(out[i].how == "neutral" for i in retry)  # type: ignore[union-attr]
            if bad:
                log.warning(
                    "coach gave no score for %d of %d steps: neutral %.1f used", bad, len(prompts), NEUTRAL
                )
        return out  # type: ignore[return-value]


def open_coach(cfg, model_path: str = "models/base", model_dtype: str = "float32", cache_path=None) -> Coach:
    """The coach of ``train_magrpo.coach`` params: its backend (the local base model by default, loaded on the
    first uncached call) behind the response cache, a cost tracker and the coach's own USD budget.

    Misconfiguration (model name, API key, price for a budget, server down) raises here, before any training.

    Args:
        cfg: :class:`orchestry.config.CoachParams`. cache_path: ``None``: ``cfg.cache_path`` under the repo root.

    Raises:
        BackendConfigError, PriceError: see :func:`orchestry.llm.clients.open_clients`.
    """
    local = cfg.backend == "local"
    backend = make_backend(cfg.backend, cfg.model, **backend_options(cfg, model_path, model_dtype))
    backend.price = require_price(backend.model, cfg.prices, local, cfg.budget_usd)
    if not local:
        backend.preflight()
    path = cache_path or (repo_root() / cfg.cache_path)
    chat = CachedChat(backend, ResponseCache(path), CostTracker(budget_usd=cfg.budget_usd))
    # local: greedy (0.0) makes the coach deterministic; API models take their default temperature
    return Coach(chat, max_tokens=cfg.max_tokens, temperature=0.0 if local else None, few_shot=cfg.few_shot)


def mix_rewards(process, outcome, w_process: float, w_outcome: float):
    """``w_process * process + w_outcome * outcome``, element-wise (scalars or same-shape arrays).

    ``process`` is the coach's 0-10 score, ``outcome`` the executable reward (0-4 level reward by default);
    the weights carry the scales (e.g. ``w_process = 0.1`` puts the process score on 0-1).

    Returns:
        a float for scalar inputs, else a numpy array of the broadcast shape.

    Raises:
        ValueError: a negative weight, both weights 0, or shapes that do not broadcast.
    """
    if w_process < 0 or w_outcome < 0 or w_process + w_outcome == 0:
        raise ValueError(
            f"weights must be >= 0 and not both 0, got w_process={w_process}, w_outcome={w_outcome}"
        )
    p, o = np.asarray(process, dtype=float), np.asarray(outcome, dtype=float)
    try:
        mixed = w_process * p + w_outcome * o
    except ValueError:
        raise ValueError(f"process {p.shape} and outcome {o.shape} do not broadcast") from None
    return float(mixed) if mixed.ndim == 0 else mixed


__all__ = [
    "NEUTRAL",
    "Coach",
    "CoachScore",
    "coach_prompt",
    "first_number",
    "mix_rewards",
    "open_coach",
    "parse_feedback",
    "parse_process_score",
]
