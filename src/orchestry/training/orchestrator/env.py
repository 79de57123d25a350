"""The learned orchestrator's world on the code task: the environment (:class:`OrchestratorEnv`: states, masks,
steps, costs and task rewards), the controllers (the learned policy or a :class:`FixedPipeline`), the finished
:class:`Episode`, :func:`rollout` of episodes in lockstep, and the statistics over episodes
(:func:`method_summary`). :mod:`orchestry.training.orchestrator` trains and evaluates with them."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from orchestry.algorithms.orchestrator import (
    Reinforce,
    Trajectory,
    action_mask,
    discounted_returns,
    step_rewards,
)
from orchestry.analysis.metrics import mean_ci
from orchestry.llm.backends import ChatRequest
from orchestry.problems import Problem
from orchestry.tasks.agent_pool import (
    TERMINATE,
    Agent,
    EpisodeState,
    LevelScorer,
    ModelAgent,
    Step,
    ToolAgent,
)

if TYPE_CHECKING:
    from orchestry.llm.clients import Clients
    from orchestry.llm.encoder import SentenceEncoder

N_SCALARS = 10  # numeric state features besides the embeddings and the one-hot/count blocks


# ---- the environment -------------------------------------------------------------------------------------------
class OrchestratorEnv:
    """Episodes of the agent pool on problems, stepped in lockstep (one batched model call per step).

    Args:
        agents: the pool (``terminate`` is added as the last action). clients: from :func:`orchestry.llm.clients.open_clients`.
        scorer: the memoised level reward (tester and final reward). encoder: the state encoder (``None``:
            :meth:`observe` unavailable -- fixed pipelines need none).
        cost_unit: ``tokens`` (c_t = prompt + completion tokens + call_cost) or ``usd`` (c_t = USD + call_cost).
        cost_lambda: lambda (for the cost feature). min_steps / max_steps: the masking bounds.
        task_reward: ``level`` (r = level reward, max 4.0) or ``binary`` (``success_bonus`` if every assert
            passes, else ``failure_penalty``).
    """

    def __init__(
        self,
        agents: Sequence[Agent],
        clients: Clients,
        scorer: LevelScorer,
        encoder: SentenceEncoder | None,
        cost_unit: str = "tokens",
        cost_lambda: float = 0.0,
        min_steps: int = 1,
        max_steps: int = 5,
        task_reward: str = "level",
        success_bonus: float = 1.0,
        failure_penalty: float = -1.0,
    ):
        self.agents = list(agents)
        self.names = [a.name for a in self.agents] + [TERMINATE]
        self.index = {n: i for i, n in enumerate(self.names)}
        self.c, self.scorer, self.encoder = clients, scorer, encoder
        self.cost_unit, self.cost_lambda = cost_unit, cost_lambda
        self.min_steps, self.max_steps = min_steps, max_steps
        self.task_reward, self.success_bonus, self.failure_penalty = (
            task_reward,
            success_bonus,
            failure_penalty,
        )

    @property
    def n_actions(self) -> int:
        return len(self.names)

    @property
    def obs_dim(self) -> int:
        dim = self.encoder.dim if self.encoder is not None else 0
        return 2 * dim + N_SCALARS + (len(self.agents) + 1) + len(self.agents)

    # -- S_t --
    def mask(self, state: EpisodeState) -> torch.Tensor:
        """Allowed actions in ``state``: bool ``[n_actions]`` (:func:`orchestry.algorithms.orchestrator.action_mask`);
        an agent is masked when it cannot act or acting could not change the state (``Agent.is_noop``)."""
        avail = [a.available(state) and not a.is_noop(state) for a in self.agents]
        return action_mask(len(state.agents), len(self.agents), self.min_steps, self.max_steps, avail)

    def features(self, state: EpisodeState) -> list[float]:
        """The numeric part of S_t: step, cost so far, the tester's last report, which artefacts exist, the last
        agent (one-hot, "none" first) and how often each agent acted (divided by ``max_steps``)."""
        n = len(state.agents)
        test = state.test or {}
        total = test.get("total_asserts", 0) or 0
        scalars = [
            n / self.max_steps,
            float(n >= self.min_steps),
            self.cost_lambda * state.cost,
            math.log1p(state.cost) / 10.0,
            test.get("total", 0.0) / 4.0,
            (test.get("passed", 0) / total) if total else 0.0,
            float(state.test_is_current),
            float(bool(state.helper)),
            float(bool(state.main)),
            float(bool(state.review)),
        ]
        last = [0.0] * (len(self.agents) + 1)
        last[self.index[state.agents[-1]] + 1 if state.agents else 0] = 1.0
        counts = Counter(state.agents)
        return scalars + last + [counts[a.name] / self.max_steps for a in self.agents]

    def observe(self, states: Sequence[EpisodeState]) -> torch.Tensor:
        """S_t of each state: ``[B, obs_dim]`` = [embedding(task) | embedding(history) | features]."""
        if self.encoder is None:
            raise ValueError("observe needs a state encoder")
        texts = [s.problem.prompt for s in states] + [s.history_text() for s in states]
        emb = self.encoder.encode(texts)
        task, hist = emb[: len(states)], emb[len(states) :]
        feats = torch.tensor([self.features(s) for s in states], dtype=torch.float32)
        return torch.cat([task, hist, feats], dim=1)

    # -- acting --
    def step_cost(self, agent: Agent, prompt_tokens: int, completion_tokens: int, usd: float) -> float:
        """c_t: tokens (prompt + completion) or USD of the call, plus the agent's fixed ``call_cost``."""
        base = float(prompt_tokens + completion_tokens) if self.cost_unit == "tokens" else float(usd)
        return base + float(agent.call_cost)

    def act(self, states: Sequence[EpisodeState], actions: Sequence[str], tag: str = "") -> None:
        """Apply one action per state (all states in one step): model agents in one ``complete_batch``, each tool
        agent once over its states, ``terminate`` ends the episode.

        Raises:
            BudgetExceeded: the model calls of this step do not fit in the budget (nothing was changed).
        """
        model_idx = [
            i for i, a in enumerate(actions) if a != TERMINATE and isinstance(self._agent(a), ModelAgent)
        ]
        requests = []
        for i in model_idx:
            agent = self._agent(actions[i])
            assert isinstance(agent, ModelAgent)
            prompt = agent.user_prompt(states[i])
            states[i].last_prompts[agent.name] = prompt
            requests.append(
                ChatRequest(
                    (("user", prompt),), agent.system, 0, self.c.max_tokens,
                    self.c.temperature, self.c.top_p, (agent.name, tag) if tag else (agent.name,),
                )
            )  # fmt: skip
        results = self.c.chat.complete_batch(requests) if requests else []
        for i, r in zip(model_idx, results, strict=True):
            agent = self._agent(actions[i])
            assert isinstance(agent, ModelAgent)
            agent.apply(states[i], r.text)
            cost = self.step_cost(agent, r.prompt_tokens, r.completion_tokens, r.usd)
            self._push(
                states[i],
                Step(agent.name, r.text, r.prompt_tokens, r.completion_tokens, r.usd, r.cached, cost),
            )
        for agent in self.agents:
            if not isinstance(agent, ToolAgent):
                continue
            idx = [i for i, a in enumerate(actions) if a == agent.name]
            if idx:
                reports = agent.run([states[i] for i in idx], self.scorer)
                for i, rep in zip(idx, reports, strict=True):
                    self._push(states[i], Step(agent.name, rep, cost=self.step_cost(agent, 0, 0, 0.0)))
        for i, a in enumerate(actions):
            if a == TERMINATE:
                states[i].steps.append(Step(TERMINATE))
                states[i].done = True

    def _agent(self, name: str) -> Agent:
        return self.agents[self.index[name]]

    @staticmethod
    def _push(state: EpisodeState, step: Step) -> None:
        state.steps.append(step)
        state.cost += step.cost

    def task_rewards(self, states: Sequence[EpisodeState]) -> list[tuple[float, dict]]:
        """``(r, level reward dict)`` of each finished state's final code (one sandbox batch for the new ones)."""
        rewards = self.scorer.score([(s.problem, s.helper, s.main) for s in states])
        out = []
        for rew in rewards:
            success = rew.get("total_asserts", 0) > 0 and rew.get("passed", 0) == rew.get("total_asserts", 0)
            if self.task_reward == "binary":
                r = self.success_bonus if success else self.failure_penalty
            else:
                r = float(rew.get("total", 0.0))
            out.append((r, rew))
        return out


# ---- controllers: the learned policy or a fixed pipeline ------------------------------------------------------
@dataclass(frozen=True)
class FixedPipeline:
    """A fixed order of agents, then ``terminate`` (``stop_when_passed``: terminate as soon as the tester's current
    report says every assert passed)."""

    name: str
    agents: tuple[str, ...]
    stop_when_passed: bool = False

    def next(self, state: EpisodeState) -> str:
        if self.stop_when_passed and state.test_is_current:
            t = state.test or {}
            if t.get("total_asserts", 0) and t.get("passed") == t.get("total_asserts"):
                return TERMINATE
        n = len(state.agents)
        return self.agents[n] if n < len(self.agents) else TERMINATE


def fixed_pipelines(pool: Sequence[str]) -> list[FixedPipeline]:
    """The baselines the learned orchestrator is compared with (those whose agents are all in ``pool``):
    ``helper_main`` (helper, main); ``all_in_order`` (every agent of the pool once, in order); ``test_fix_loop``
    (helper, main, then tester and fixer twice; stops as soon as the tester sees every assert pass)."""
    out = [
        FixedPipeline("helper_main", ("helper", "main")),
        FixedPipeline("all_in_order", tuple(pool)),
        FixedPipeline("test_fix_loop", ("helper", "main", "tester", "fixer", "tester", "fixer"), True),
    ]
    return [p for p in out if set(p.agents) <= set(pool)]


@dataclass
class Episode:
    """A finished episode: its state, trajectory (policy episodes) and outcome."""

    method: str
    state: EpisodeState
    task_reward: float
    reward: dict
    rewards: list[float]
    trajectory: Trajectory | None = None
    meta: dict = field(default_factory=dict)

    @property
    def success(self) -> bool:
        r = self.reward
        return r.get("total_asserts", 0) > 0 and r.get("passed", 0) == r.get("total_asserts", 0)

    @property
    def agents(self) -> list[str]:
        return self.state.agents

    @property
    def has_cycle(self) -> bool:
        """Some agent acted twice: the episode's agent-transition graph contains a cycle."""
        return len(set(self.agents)) < len(self.agents)

    @property
    def tokens(self) -> int:
        return sum(s.prompt_tokens + s.completion_tokens for s in self.state.steps)

    @property
    def usd(self) -> float:
        return sum(s.usd for s in self.state.steps)

    def row(self, gamma: float) -> dict:
        """One CSV row (``TRAIN_FIELDS`` / ``EVAL_FIELDS`` keys)."""
        return {
            "method": self.method,
            "episode": self.meta.get("episode", ""),
            "update": self.meta.get("update", ""),
            "task_id": self.state.problem.task_id,
            "agents": ">".join(self.agents),
            "length": len(self.agents),
            "cost": round(self.state.cost, 6),
            "tokens": self.tokens,
            "usd": self.usd,
            "reward": self.reward.get("total", 0.0),
            "task_reward": self.task_reward,
            "objective": round(sum(self.rewards), 6),
            "return": round(discounted_returns(self.rewards, gamma)[0], 6),
            "success": int(self.success),
            "passed": self.reward.get("passed", 0),
            "total_asserts": self.reward.get("total_asserts", 0),
            "has_cycle": int(self.has_cycle),
        }


def rollout(
    env: OrchestratorEnv,
    problems: Sequence[Problem],
    controllers: Sequence[FixedPipeline | None],
    learner: Reinforce | None = None,
    generator: torch.Generator | None = None,
    greedy: bool = False,
    tag: str = "",
    on_step: Callable[[int], None] | None = None,
) -> list[Episode]:
    """Run one episode per problem in lockstep; ``controllers[i]`` is a pipeline or ``None`` (the learned policy,
    sampled with ``generator``, or its argmax with ``greedy``). ``on_step(finished)`` is called after every
    lockstep step with the number of episodes finished so far (progress display).

    Returns:
        Episodes in input order; policy episodes carry their :class:`Trajectory` (S_t, masks, a_t, R_t).

    Raises:
        BudgetExceeded: a step's model calls do not fit in the budget.
    """
    states = [EpisodeState(p) for p in problems]
    obs: list[list[torch.Tensor]] = [[] for _ in problems]
    masks: list[list[torch.Tensor]] = [[] for _ in problems]
    acts: list[list[int]] = [[] for _ in problems]
    while True:
        active = [i for i, s in enumerate(states) if not s.done]
        if not active:
            break
        names: dict[int, str] = {}
        policy_idx = [i for i in active if controllers[i] is None]
        if policy_idx:
            if learner is None:
                raise ValueError("policy episodes need a learner")
            o = env.observe([states[i] for i in policy_idx])
            m = torch.stack([env.mask(states[i]) for i in policy_idx])
            a = learner.act(o, m, generator, greedy)
            for k, i in enumerate(policy_idx):
                obs[i].append(o[k])
                masks[i].append(m[k])
                acts[i].append(int(a[k]))
                names[i] = env.names[int(a[k])]
        for i in active:
            ctrl = controllers[i]
            if ctrl is not None:
                names[i] = ctrl.next(states[i])
        env.act([states[i] for i in active], [names[i] for i in active], tag)
        if on_step is not None:
            on_step(sum(s.done for s in states))
    out = []
    for i, (s, (r, rew)) in enumerate(zip(states, env.task_rewards(states), strict=True)):
        costs = [st.cost for st in s.steps if st.agent != TERMINATE]
        rewards = step_rewards(costs, r, env.cost_lambda)
        traj = None
        if controllers[i] is None:
            traj = Trajectory(torch.stack(obs[i]), torch.stack(masks[i]), torch.tensor(acts[i]), rewards)
        name = controllers[i].name if controllers[i] is not None else "learned"
        out.append(Episode(name, s, r, rew, rewards, traj))
    return out


# ---- statistics ------------------------------------------------------------------------------------------------
def agent_shares(episodes: Sequence[Episode], names: Sequence[str]) -> dict[str, float]:
    """Share of all agent actions taken by each agent (``terminate`` excluded); 0 for every agent when none acted."""
    counts = Counter(a for e in episodes for a in e.agents)
    total = sum(counts.values())
    return {n: (counts[n] / total if total else 0.0) for n in names}


def transition_counts(episodes: Sequence[Episode], names: Sequence[str]) -> dict[str, dict[str, int]]:
    """``{from: {to: count}}`` over consecutive actions, ``start`` before the first and ``terminate`` after the last."""
    rows = ["start", *names]
    cols = [*names, TERMINATE]
    out = {r: dict.fromkeys(cols, 0) for r in rows}
    for e in episodes:
        seq = ["start", *e.agents, TERMINATE]
        for a, b in zip(seq, seq[1:], strict=False):
            out[a][b] += 1
    return out


def method_summary(
    episodes: Sequence[Episode], names: Sequence[str], confidence: float, n_boot: int, seed: int
) -> dict:
    """Reward, cost (cost unit and tokens), objective and success with CIs over problems; length, agent shares,
    cycle share. One episode per problem, so the bootstrap resamples problems (the same resamples for every
    quantity: one seed)."""
    return {
        "reward": mean_ci([e.reward.get("total", 0.0) for e in episodes], confidence, n_boot, seed),
        "task_reward": mean_ci([e.task_reward for e in episodes], confidence, n_boot, seed),
        "cost": mean_ci([e.state.cost for e in episodes], confidence, n_boot, seed),
        "tokens": mean_ci([float(e.tokens) for e in episodes], confidence, n_boot, seed),
        "objective": mean_ci([sum(e.rewards) for e in episodes], confidence, n_boot, seed),
        "success_rate": mean_ci([float(e.success) for e in episodes], confidence, n_boot, seed),
        "length": sum(len(e.agents) for e in episodes) / max(1, len(episodes)),
        "usd": sum(e.usd for e in episodes),
        "agent_share": agent_shares(episodes, names),
        "cycle_share": sum(e.has_cycle for e in episodes) / max(1, len(episodes)),
    }
