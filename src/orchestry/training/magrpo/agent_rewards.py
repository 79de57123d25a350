"""Each agent's own reward, when it is not the joint one: counterfactual credit (difference rewards) and the coach's
process scores mixed into the outcome.
"""

from __future__ import annotations

import torch

from orchestry.problems import Problem
from orchestry.rewards.coach import coach_prompt, mix_rewards
from orchestry.rewards.credit import counterfactual_credit
from orchestry.training.magrpo.common import ROLES, Trainer


def agent_rewards(
    tr: Trainer,
    probs: list[Problem],
    texts: dict[str, list[str]],
    details: list[dict],
    coach: bool = True,
    previous: list[dict] | None = None,
) -> tuple[dict[str, torch.Tensor] | None, dict]:
    """Per-agent rewards ``{agent: [B]}`` of B scored samples (``details[i]["total"]``: the joint reward),
    or None when every agent gets the joint reward; and the step metrics they add.

    - ``credit: counterfactual`` (helper/main): each agent's difference reward
      (:func:`orchestry.rewards.credit.counterfactual_credit`) replaces the joint reward as its outcome.
    - coach enabled: each agent's outcome becomes ``w_outcome * outcome + w_process * score``, the score the
      coach gave that agent's action (0-10; :class:`orchestry.rewards.coach.Coach`); score, how it was
      parsed and the feedback go into the records (``coach_<agent>``, ``coach_<agent>_how``,
      ``coach_<agent>_feedback``).
    """
    joint = [float(d["total"]) for d in details]
    outcome = {a: torch.tensor(joint, dtype=torch.float32) for a in texts}
    metrics: dict = {}
    per_agent = False
    if tr.cfg.credit == "counterfactual":
        credits = counterfactual_credit(probs, texts["helper"], texts["main"], tr.sandbox, joint=joint)
        for d, c in zip(details, credits, strict=True):
            d["credit_helper"], d["credit_main"] = c.helper, c.main
        outcome = {
            "helper": torch.tensor([c.helper for c in credits], dtype=torch.float32),
            "main": torch.tensor([c.main for c in credits], dtype=torch.float32),
        }
        metrics.update({f"credit/{a}": float(outcome[a].mean()) for a in outcome})
        per_agent = True
    if coach and tr.coach is not None:
        c = tr.cfg.coach
        names, B = list(texts), len(probs)
        before = tr.coach.counters()
        prompts = [
            coach_prompt(probs[i].prompt, ROLES.get(a, a), texts[a][i],
                         (previous[i].get(f"coach_{a}_feedback") if previous else None))
            for a in names
            for i in range(B)
        ]  # fmt: skip
        scores = tr.coach.score(prompts, [("coach", a) for a in names for _ in range(B)])
        for k, a in enumerate(names):
            mine = scores[k * B : (k + 1) * B]
            process = torch.tensor([s.score for s in mine], dtype=torch.float32)
            outcome[a] = torch.as_tensor(
                mix_rewards(process.numpy(), outcome[a].numpy(), c.w_process, c.w_outcome),
                dtype=torch.float32,
            ).reshape(B)
            for d, s in zip(details, mine, strict=True):
                d[f"coach_{a}"], d[f"coach_{a}_how"], d[f"coach_{a}_feedback"] = (
                    s.score,
                    s.how,
                    s.feedback,
                )
            metrics[f"coach/score/{a}"] = float(process.mean())
        after = tr.coach.counters()
        metrics.update({f"coach/{k}": after[k] - before[k] for k in after})
        per_agent = True
    return (outcome if per_agent else None), metrics
