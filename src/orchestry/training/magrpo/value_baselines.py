"""The baselines of ``train_magrpo.advantage`` remax and critic: what the trainer computes for them each step.

* ``remax`` (:func:`attach_greedy`, :func:`remax_baselines`): after the step's sampled episode, one greedy joint
  rollout per problem (both agents at temperature 0, the same prompts; in a multi-turn run as many turns as the
  sampled episode ran, each later turn on the greedy pair's own feedback), scored with the same reward (level
  reward, credit, coach). Its reward at turn t is the baseline of turn t's samples
  (:func:`orchestry.algorithms.magrpo.remax_advantages`); it is never trained, and its tokens and seconds count in
  the step's cost (``tokens/prompt`` and ``tokens/completion`` include them; ``tokens/prompt/greedy``,
  ``tokens/completion/greedy``, ``seconds/greedy`` and ``remax/greedy_reward`` single them out).
* ``critic`` (:func:`new_critic`, :func:`critic_baselines`): the state of a sample at a turn is the MiniLM
  embedding (:class:`orchestry.llm.encoder.SentenceEncoder`, 384-d, cached by text) of each agent's prompt of that
  turn (the user message: the problem, and in later turns the previous code and the sandbox's feedback). The values
  V(s) of every sample are computed first, then the critic is fitted on the step's returns
  (:class:`orchestry.algorithms.critic.Critic`), so the advantages ``R - V(s)`` use the critic from before this
  step's data.

Nothing here runs unless ``advantage`` is remax or critic: the default path never loads the encoder nor touches a
random stream.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from orchestry.algorithms.critic import JOINT, Critic, critic_advantages, critic_input
from orchestry.algorithms.magrpo import remax_advantages
from orchestry.problems import Problem
from orchestry.tasks.multi_turn import feedback_text, next_turn_prompts
from orchestry.training.magrpo.common import AGENTS, Rollout, Trainer
from orchestry.training.magrpo.rollouts import rollout
from orchestry.training.magrpo.turns import next_turn

# tokens per embedded prompt: MiniLM's position limit (the sentence-transformers default is 256, which would cut
# a later turn's feedback off the end of the prompt)
ENCODER_MAX_LENGTH = 512


class _Greedy:
    """The trainer seen with one generation per problem at temperature 0: :func:`orchestry.training.magrpo.rollouts.rollout`
    and :func:`orchestry.training.magrpo.turns.next_turn` on it decode and score the greedy pair exactly as they do the
    sampled ones (prompts, scoring, credit, coach)."""

    def __init__(self, tr: Trainer):
        self._tr = tr
        self.cfg = tr.cfg.model_copy(update={"num_generations": 1})
        self.sampling = tr.sampling.model_copy(update={"temperature": 0.0})

    def __getattr__(self, name: str):
        return getattr(self._tr, name)


def greedy_episode(tr: Trainer, problems: Sequence[Problem], step: int, turns: int) -> list[Rollout]:
    """The greedy joint rollout of ``problems`` (G = 1), for at most ``turns`` turns (it stops when its pair
    passed every assert, as a sampled episode does)."""
    view = _Greedy(tr)
    out = [rollout(view, problems, step)]
    for t in range(1, turns):
        nxt = next_turn(view, out[-1], step, t)
        if nxt is None:
            break
        out.append(nxt)
    return out


def attach_greedy(tr: Trainer, episode: list[Rollout], step: int) -> list[Rollout]:
    """``advantage: remax``: decode and score the greedy joint rollout of the episode's problems, attach turn t's to
    turn t's rollout (``greedy``; a turn the greedy pair did not reach gets its last one, whose reward is carried),
    and add its cost and reward to the first rollout's step metrics and token count. Returns ``episode``."""
    t0 = time.time()
    first = episode[0]
    greedy = greedy_episode(tr, first.problems, step, len(episode))
    for t, ro in enumerate(episode):
        g = greedy[min(t, len(greedy) - 1)]
        ro.greedy = g
        ro.metrics["remax/greedy_reward"] = float(g.rewards.mean())
    prompt = sum(i.prompt_tokens for g in greedy for i in g.batch.items)
    completion = sum(i.completion_tokens for g in greedy for i in g.batch.items)
    p0, c0 = first.tokens or (
        sum(i.prompt_tokens for i in first.batch.items),
        sum(i.completion_tokens for i in first.batch.items),
    )
    first.tokens = (p0 + prompt, c0 + completion)
    det = greedy[0].details
    first.metrics.update(
        {
            "remax/greedy_pass_rate": sum(
                d["total_asserts"] > 0 and d["passed"] == d["total_asserts"] for d in det
            )
            / len(det),
            "remax/greedy_turns": len(greedy),
            "tokens/prompt/greedy": prompt,
            "tokens/completion/greedy": completion,
            "seconds/greedy": time.time() - t0,
        }
    )
    return episode


def remax_baselines(rollouts: Sequence[Rollout]) -> dict[str, torch.Tensor]:
    """``{"<agent>/turn_<t>": [N]}``: each turn's greedy reward per problem, from that agent's reward (the joint
    one unless credit or the coach give each agent its own)."""
    out = {}
    for ro in rollouts:
        if ro.greedy is None:
            raise ValueError(
                "advantage remax needs the step's greedy rollout (attach_greedy) on every rollout"
            )
        for a in ro.agents:
            out[f"{a}/turn_{ro.turn}"] = ro.greedy.reward_of(a).reshape(-1)
    return out


def advantages(estimator: str, rewards: torch.Tensor, baseline: torch.Tensor | None) -> torch.Tensor:
    """``[N, G]`` advantages of remax (``baseline`` ``[N]``) or critic (``baseline`` ``[N, G]`` values); no
    baseline (no greedy rollout or value for this agent and turn): 0."""
    if baseline is None:
        return torch.zeros_like(rewards)
    if estimator == "remax":
        return remax_advantages(rewards, baseline)
    if estimator == "critic":
        return critic_advantages(rewards, baseline)
    raise ValueError(f"no baseline estimator {estimator!r}")


# ------------------------------------------------------------------------------------------------ the critic
def default_encoder():
    """The offline MiniLM sentence encoder (:class:`orchestry.llm.encoder.SentenceEncoder`), in-memory cache."""
    from orchestry.llm.encoder import SentenceEncoder

    return SentenceEncoder(max_length=ENCODER_MAX_LENGTH)


def new_critic(tr: Trainer, encoder) -> Critic:
    """The run's :class:`~orchestry.algorithms.critic.Critic` (``train_magrpo.critic``, ``critic_hidden``,
    ``critic_lr``, ``critic_steps``) on ``encoder``'s embeddings; weights seeded from ``seed``."""
    cfg = tr.cfg
    return Critic(
        tr.agents,
        int(encoder.dim),
        mode=cfg.critic,
        hidden=cfg.critic_hidden,
        lr=cfg.critic_lr,
        steps=cfg.critic_steps,
        per_agent_rewards=cfg.credit == "counterfactual" or cfg.coach.enabled,
        seed=cfg.seed,
    )


def prompt_texts(tr: Trainer, ro: Rollout, prev: Rollout | None) -> dict[str, list[str]]:
    """Each agent's prompt (user message) of every sample of ``ro``, ``{agent: [N*G]}`` ordered [n][g]: turn 1 the
    problem's own prompts; a later turn the prompts :func:`orchestry.training.magrpo.turns.next_turn` built from the
    sample's previous pair and its feedback (``prev``: the turn before). Samples that did not act at this turn
    get their problem's first prompts (they are neither trained nor fitted)."""
    G = ro.G
    out: dict[str, list[str]] = {a: [] for a in AGENTS}
    for n, p in enumerate(ro.problems):
        for g in range(G):
            acted = ro.turn > 0 and prev is not None and (ro.active is None or bool(ro.active[n, g]))
            if acted:
                d = prev.details[n * G + g]
                notes = None
                if tr.cfg.coach.show_feedback:
                    notes = {a: d.get(f"coach_{a}_feedback", "") for a in AGENTS}
                hp, mp = next_turn_prompts(p, d["helper"], d["main"], feedback_text(p, d), notes)
            else:
                hp, mp = p.helper_prompt(), p.main_prompt()
            out["helper"].append(hp)
            out["main"].append(mp)
    return out


def critic_baselines(tr: Trainer, rollouts: Sequence[Rollout], out: dict) -> dict[str, torch.Tensor]:
    """``advantage: critic``: ``{"<agent>/turn_<t>": [N, G]}`` the critic's values of every sample's state, computed
    BEFORE the critic is fitted on this step's returns; then the fit (``critic_steps`` Adam steps per network on
    the active samples of every turn: the joint reward, or each agent's own). Adds ``critic/value_loss`` (the
    values' MSE on this step's returns, before the fit), ``critic/value_loss_after`` and ``critic/value_mean``
    to ``out``."""
    critic: Critic = tr.critic
    values: dict[str, torch.Tensor] = {}
    data = []  # (embeddings {agent: [N*G, D]}, rollout, active [N*G])
    for i, ro in enumerate(rollouts):
        texts = prompt_texts(tr, ro, rollouts[i - 1] if i > 0 else None)
        emb = {a: tr.encoder.encode(texts[a]).float() for a in tr.agents}
        N, G = len(ro.problems), ro.G
        for a in ro.agents:
            x = critic_input(emb, tr.agents, critic.mode, a)
            values[f"{a}/turn_{ro.turn}"] = critic.values(a, x).view(N, G)
        active = torch.ones(N * G, dtype=torch.bool) if ro.active is None else ro.active.reshape(-1)
        data.append((emb, ro, active))
    # the fit, per network, on the active rows of every turn (after every value above is computed)
    rows: dict[str, tuple[list, list]] = {}
    for emb, ro, active in data:
        if critic.mode == "per_agent":
            for a in ro.agents:
                xs, ys = rows.setdefault(a, ([], []))
                xs.append(emb[a][active])
                ys.append(ro.reward_of(a).reshape(-1, 1)[active])
        else:  # one network on the joint state: the joint reward, or (per-agent rewards) each agent's on its head
            xs, ys = rows.setdefault(JOINT, ([], []))
            xs.append(critic_input(emb, tr.agents, "centralized", tr.agents[0])[active])
            if critic.heads > 1:
                ys.append(torch.stack([ro.reward_of(b).reshape(-1) for b in tr.agents], dim=-1)[active])
            else:
                ys.append(ro.rewards.reshape(-1, 1)[active])
    before, after = [], []
    for key, (xs, ys) in rows.items():
        if not xs or sum(len(x) for x in xs) == 0:
            continue
        b, a = critic.fit(key, torch.cat(xs), torch.cat(ys))
        before.append(b)
        after.append(a)
    if before:
        out["critic/value_loss"] = sum(before) / len(before)
        out["critic/value_loss_after"] = sum(after) / len(after)
    act = [values[f"{a}/turn_{ro.turn}"].reshape(-1)[active] for _, ro, active in data for a in ro.agents]
    act = [v for v in act if v.numel()]
    if act:
        out["critic/value_mean"] = float(torch.cat(act).mean())
    return values


def step_baselines(tr: Trainer, rollouts: Sequence[Rollout], out: dict) -> dict[str, torch.Tensor]:
    """This step's baselines of ``tr.cfg.advantage`` remax or critic, per ``"<agent>/turn_<t>"``."""
    if tr.cfg.advantage == "remax":
        return remax_baselines(rollouts)
    if tr.cfg.advantage == "critic":
        return critic_baselines(tr, rollouts, out)
    raise ValueError(f"advantage {tr.cfg.advantage!r} has no baseline here")
