"""MAGRPO training loop: rollout -> joint level reward -> group advantage -> loss -> one AdamW step per agent.

One shared frozen base with one LoRA adapter per agent (peft); both agents' completions of all problems of a
step are sampled in ONE batched ``generate`` call (per-row adapters). The loop reads top to bottom in
:meth:`MAGRPOTrainer.train` (one step: :meth:`~MAGRPOTrainer.episode`, :meth:`~MAGRPOTrainer.update`, the step
record, a checkpoint); the math is in :mod:`orchestry.algorithms.magrpo` (advantages, the loss each micro-batch
back-propagates) and :mod:`orchestry.algorithms.reinforce_pp`; the parts of the loop live in

* :mod:`orchestry.training.magrpo.rollouts`: sampling the helper/main pairs and scoring them with the level reward;
* :mod:`orchestry.training.magrpo.turns`: later turns of a multi-turn episode, with the sandbox's feedback;
* :mod:`orchestry.training.magrpo.agent_rewards`: each agent's own reward (counterfactual credit, the coach's scores);
* :mod:`orchestry.training.magrpo.workflows`: the writer -> tester -> fixer workflow;
* :mod:`orchestry.training.magrpo.sampling`: dynamic sampling (DAPO) and the curriculum;
* :mod:`orchestry.training.magrpo.batching`: micro-batches and the data-parallel gradient average;
* :mod:`orchestry.training.magrpo.checkpoints`: crash-safe checkpoints and resuming;
* :mod:`orchestry.training.magrpo.step_log`: the step's metrics and samples table;
* :mod:`orchestry.training.magrpo.common`: what they share (agents, seed offsets, :class:`Rollout`).

Checkpoints every ``checkpoint_every`` steps hold both adapters, both AdamW states and the step log, so an
interrupted run resumes where it stopped and reproduces the uninterrupted one (sampling is seeded per step).
Nothing depends on the machine's state: the training micro-batch is a parameter (``micro_batch_tokens``), not
sized to free memory.

Optional, off by default (``train_magrpo`` params): *dynamic sampling* (DAPO, arXiv 2503.14476) for the groups
whose G joint rewards are all equal (:func:`flat_groups`: zero advantage, no gradient, yet they count in the loss's
mean over problems): ``skip`` leaves them out of the loss, so the update equals the one of the other groups alone;
``resample`` samples them again (up to ``max_resample`` extra rollouts per step) and skips those still flat.
A *curriculum* (``base_reward``) orders the training problems by the base policy's own mean group reward, easiest
first, from one rollout of the base model (``__base__`` rows, adapters off) at the start of a run; the order is
logged and kept in the checkpoint.

Each step's record also holds the ungated collaboration rates of the step's samples (``aux_defined_rate``,
``aux_called_rate``, ``aux_used_rate``; see :class:`orchestry.rewards.code.LevelReward`), ``truncation_rate`` (a
completion hit ``max_completion_length``), main's scheme distribution (``scheme/<name>``) and
``zero_variance_groups`` (share of the step's groups whose rewards are all equal, as first sampled).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from orchestry.algorithms.magrpo import (
    agent_turn_advantages,
    group_advantages,
    k3_kl,
    micro_batch_loss,
    reinforce_advantages,
    reward_sum_count,
    running_baseline,
)
from orchestry.algorithms.reinforce_pp import reinforce_pp_advantages, token_policy_loss
from orchestry.config import SamplingParams, TrainMagrpoParams
from orchestry.llm.loading import adapter_parameters
from orchestry.llm.logprobs import completion_logprobs
from orchestry.numerics import bf16_autocast, update_dtype_decision
from orchestry.problems import Problem
from orchestry.rewards.coach import Coach
from orchestry.training.magrpo import batching, checkpoints, sampling, step_log, value_baselines
from orchestry.training.magrpo.common import (
    AGENTS,
    BASE,
    WORKFLOW_AGENTS,
    Rollout,
    agent_names,
    flat_groups,
    new_optimizers,
)
from orchestry.training.magrpo.rollouts import rollout
from orchestry.training.magrpo.turns import next_turn
from orchestry.training.magrpo.warm_start import resolved_epochs
from orchestry.training.magrpo.warm_start import warm_start as run_warm_start
from orchestry.training.magrpo.workflows import workflow_episode, workflow_rollout

# importable from here, where stages, benchmarks and tests have always found them
__all__ = [
    "AGENTS",
    "BASE",
    "WORKFLOW_AGENTS",
    "MAGRPOTrainer",
    "Rollout",
    "agent_names",
    "flat_groups",
    "workflow_rollout",
]

log = logging.getLogger("orchestry.magrpo")


@dataclass
class MAGRPOTrainer:
    """Train one LoRA adapter per agent with MAGRPO (see :mod:`orchestry.algorithms.magrpo`).

    Args:
        model: a peft model with adapters named as ``AGENTS`` (see ``orchestry.llm.loading.attach_adapters``).
        problems: training problems; each step takes ``problems_per_step`` of them in a seeded order.
        sandbox: an ``orchestry.sandbox.Sandbox`` used by the level reward.
        checkpoint_dir: where checkpoints live (resume happens automatically if one is there).
        on_step: called with each step's log dict (e.g. to log to MLflow).
        reward_fn: ``(problems, helper_texts, main_texts) -> list[LevelReward]``; default: the level reward
            (:func:`orchestry.rewards.code.level_rewards`) run in ``sandbox``.
        micro_batch_tokens_limit: overrides ``cfg.micro_batch_tokens`` (tests, benchmarks); None: the param.
        resume_key: fingerprint of the run's other inputs (code, data, params beyond ``cfg``); a checkpoint is
            resumed only when its key and ``cfg`` (except ``num_steps``) are the same and its ``next_step`` is
            at most ``cfg.num_steps``, so an interrupted run (or a longer one) resumes while a run whose inputs
            changed, or a shorter one, starts afresh.
    """

    model: object
    tokenizer: object
    problems: Sequence[Problem]
    sandbox: object
    cfg: TrainMagrpoParams
    sampling: SamplingParams
    checkpoint_dir: Path
    on_step: Callable[[dict], None] | None = None
    reward_fn: Callable[[list[Problem], list[str], list[str]], list] | None = None
    history: list[dict] = field(default_factory=list)
    samples: list[dict] = field(default_factory=list)
    micro_batch_tokens_limit: int | None = None
    resume_key: str = ""
    # curriculum=base_reward: {"order": [task ids, easiest first], "base_reward": {task id: mean}, "seconds",
    # "tokens/prompt", "tokens/completion"}; None without a curriculum
    curriculum: dict | None = None
    coach: Coach | None = None  # coach.enabled: scores each agent action (rewards.coach.open_coach)
    # warm_start_epochs > 0: the warm start's losses and seconds (training.warm_start.warm_start); None: none ran
    warm_start: dict | None = None
    # advantage reinforce: the running reward baseline's state per "<agent>/turn_<t>" (kept in checkpoints)
    reward_baseline: dict[str, float] = field(default_factory=dict)
    # advantage critic: the state encoder (None: the MiniLM one, loaded then) and the value critic (kept in
    # checkpoints); both stay None under any other estimator (training.value_baselines)
    encoder: object | None = None
    critic: object | None = None

    def __post_init__(self):
        self.checkpoint_dir = Path(self.checkpoint_dir)
        self.agents = agent_names(self.cfg)
        if self.cfg.coach.enabled and self.coach is None:
            raise ValueError("train_magrpo.coach.enabled needs a Coach (orchestry.rewards.coach.open_coach)")
        self.optimizers = new_optimizers(self.model, self.agents, self.cfg)
        for a in self.agents:
            if not self.optimizers[a].param_groups[0]["params"]:
                raise ValueError(f"model has no LoRA parameters for agent {a!r}")
        order = list(range(len(self.problems)))
        random.Random(self.cfg.seed).shuffle(order)
        self.order = order
        self.rank, self.world_size = batching.process_group()
        if self.cfg.advantage == "critic":
            if self.encoder is None:
                self.encoder = value_baselines.default_encoder()
            self.critic = value_baselines.new_critic(self, self.encoder)
        # bf16_update resolved once for the model's device: True = bf16 autocast in the update, False = fp32
        # update_dtype, reason[, fp32_ms, bf16_ms]
        self.update_decision = update_dtype_decision(
            self.cfg.bf16_update, next(self.model.parameters()).device
        )
        self.bf16 = self.update_decision["update_dtype"] == "bf16"
        log.info(
            "train_magrpo.bf16_update %s: the update runs in %s (%s)",
            self.cfg.bf16_update,
            "bf16" if self.bf16 else "fp32",
            self.update_decision.get("reason", ""),
        )

    # ------------------------------------------------------------------ the loop
    def train(self, progress: bool = True) -> list[dict]:
        """Train from the last fitting checkpoint (or from scratch) to ``num_steps``; returns the step records.

        Each step: the step's problems -> :meth:`episode` (rollouts, rewards) -> :meth:`update` (advantages, loss,
        one AdamW step per agent) -> the step record (``on_step``, the samples table) -> a checkpoint every
        ``checkpoint_every`` steps and at the end.
        """
        start = self.load_checkpoint()
        batching.barrier()  # every process has read the checkpoint before the main one may write or remove it
        if start:
            log.info("resuming MAGRPO from step %d (%s)", start, self.checkpoint_dir)
            for rec in self.history:
                if self.on_step and self.rank == 0:
                    self.on_step(rec)
                if self.rank == 0:
                    step_log.log_samples_table(self.samples, rec["step"])
        else:
            epochs = resolved_epochs(self.cfg, list(self.problems))
            if self.cfg.init_adapters:  # saved adapters instead of the warm start (arms sharing one)
                self.warm_start = checkpoints.load_init_adapters(self, self.cfg.init_adapters)
                log.info("MAGRPO starts from %s", self.warm_start)
                if self.rank == 0:
                    self.save_adapters(self.warm_start_dir)
            if epochs:  # supervised warm start (training.warm_start), then MAGRPO
                self.warm_start = run_warm_start(self, self.bf16, epochs)
                log.info("warm start: %s", self.warm_start)
                if self.rank == 0:
                    self.save_adapters(self.warm_start_dir)
            if self.cfg.curriculum == "base_reward":
                self.build_curriculum()
        steps = range(start, self.cfg.num_steps)
        bar = None
        if progress and self.rank == 0:
            from orchestry.progress import progress_bar

            bar = progress_bar(self.cfg.num_steps, "MAGRPO", "step", initial=start)
        for step in steps:
            t0 = time.time()
            problems = self.problems_for_step(step)
            episode = self.episode(problems, step)
            t1 = time.time()
            upd = self.update(episode)
            t2 = time.time()
            gen_s = sum(r.batch.seconds for r in episode)
            rec = self._step_record(step, episode, upd, gen_s=gen_s, upd_s=t2 - t1, total_s=t2 - t0)
            # a later turn's records of samples that stopped early are not repeated
            new = [{"step": step, **d} for ro in episode for d in ro.details if not d.get("carried")]
            if self.world_size > 1:  # the whole step's record and samples, on every process
                rec, new = batching.gather_step(rec, new)
            self.history.append(rec)
            self.samples.extend(new)
            if self.on_step and self.rank == 0:  # one log per run, from the main process
                self.on_step(rec)
            if self.rank == 0:
                step_log.log_samples_table(self.samples, step)
            if bar:
                bar.update(1)
                bar.set_postfix(reward=f"{rec['reward']:.2f}", s=f"{rec['seconds']:.0f}")
            if (step + 1) % self.cfg.checkpoint_every == 0 or step + 1 == self.cfg.num_steps:
                if self.rank == 0:  # adapters are identical on every process; the main one writes them
                    self.save_checkpoint(step + 1)
                batching.barrier()
        if bar:
            bar.close()
        batching.barrier()  # the main process may now write the outputs and remove the checkpoint
        return self.history

    # ------------------------------------------------------------------ rollout -> reward
    @property
    def warm_start_dir(self) -> Path:
        """Where the adapters after the warm start (before any MAGRPO step) are saved: ``<checkpoint>.warm_start``."""
        return self.checkpoint_dir.with_name(self.checkpoint_dir.name + ".warm_start")

    def problems_for_step(self, step: int) -> list[Problem]:
        """This process's ``problems_per_step`` problems of ``step`` (processes take consecutive slices)."""
        P = self.cfg.problems_per_step
        start = (step * self.world_size + self.rank) * P
        idx = [self.order[(start + j) % len(self.order)] for j in range(P)]
        return [self.problems[i] for i in idx]

    def episode(self, problems: Sequence[Problem], step: int) -> list[Rollout]:
        """One step's rollouts: the turns of the helper/main episode (``turns``; turn 1 dynamically resampled
        when asked; stops early when every sample passed), or the writer/tester/fixer phases. Each rollout's
        ``weight`` is its turn's loss weight."""
        if self.cfg.workflow == "writer_tester_fixer":
            return self.workflow_episode(problems, step)
        ro = self.rollout(problems, step)
        if self.cfg.dynamic_sampling == "resample":
            ro = self.resample(ro, step)
        turns = [ro]
        for t in range(1, self.cfg.turns):
            nxt = self.next_turn(turns[-1], step, t)
            if nxt is None:
                break
            turns.append(nxt)
        weights = self.cfg.turn_weights or [1.0] * self.cfg.turns
        for t, r in enumerate(turns):
            r.turn, r.weight = t, float(weights[t])
        if self.cfg.advantage == "remax":  # the greedy joint rollout: the baseline, never trained
            value_baselines.attach_greedy(self, turns, step)
        return turns

    # ------------------------------------------------------------------ advantage -> loss -> step
    def update(self, episode: Rollout | Sequence[Rollout]) -> dict:
        """One AdamW step per agent on the loss summed over the episode's rollouts (turns or phases), each
        weighted by its ``weight``; with beta = 0 the group estimators skip rows with zero advantage.

        Group estimators (``advantage``: mean, mean_std, rloo, max, raw, reinforce, agent_turn; see
        :meth:`advantages`): the MAGRPO loss
        (:func:`orchestry.algorithms.magrpo.policy_loss`, back-propagated one
        :func:`~orchestry.algorithms.magrpo.micro_batch_loss` at a time) on each agent's advantages, from its own
        rewards (:meth:`~orchestry.training.magrpo.common.Rollout.reward_of`: the joint reward unless per-agent credit or
        the coach is on). With ``dynamic_sampling`` skip or resample, the flat groups
        (:func:`~orchestry.training.magrpo.common.flat_groups`) are left out of the loss (their rows, KL terms included,
        and their share of the mean over problems): the update is the one the other groups give alone.
        ``skipped_groups`` in the result is their share in the first rollout.

        ``reinforce_pp``: per-token advantages (:func:`orchestry.algorithms.reinforce_pp.reinforce_pp_advantages`:
        -beta * KL per token in the reward, discounted returns, whitened over all valid tokens of the agent's
        rows of the rollout), loss = -sum_t A_t log pi(y_t) / (number of those tokens)
        (:func:`~orchestry.algorithms.reinforce_pp.token_policy_loss`). The policy's and the
        base's log-probs for the KL come from a no-grad pass before the first backward.

        An agent's rows go through the model in micro-batches of whole problems (prompt + kept completions) of at
        most :meth:`micro_batch_tokens` tokens, one backward each; the loss is a sum over rows, so the accumulated
        gradient equals the one-batch gradient while peak memory stays bounded. Rows of samples a later turn did
        not continue (``active`` False) are never trained.
        """
        rollouts = [episode] if isinstance(episode, Rollout) else list(episode)
        first = rollouts[0]
        out: dict = {
            "skipped_groups": float(flat_groups(first.rewards).float().mean())
            if self.cfg.dynamic_sampling != "none"
            else 0.0
        }
        baselines = self.reinforce_baselines(rollouts) if self.cfg.advantage == "reinforce" else None
        if self.cfg.advantage in ("remax", "critic"):  # greedy rewards; critic values (then its fit)
            baselines = value_baselines.step_baselines(self, rollouts, out)
        self.model.train()
        for agent in self.agents:
            opt = self.optimizers[agent]
            opt.zero_grad(set_to_none=True)
            loss_value, n_rows, abs_adv = 0.0, 0, []
            for ro in rollouts:
                if agent not in ro.agents:
                    continue
                if self.cfg.advantage == "reinforce_pp":
                    lv, nr, aa = self._accumulate_tokens(agent, ro)
                else:
                    lv, nr, aa = self._accumulate_groups(agent, ro, baselines)
                loss_value, n_rows = loss_value + lv, n_rows + nr
                if aa is not None:
                    abs_adv.append(aa)
            if abs_adv:
                out[f"advantage_abs/{agent}"] = sum(abs_adv) / len(abs_adv)
            if not n_rows and self.world_size == 1:
                out[f"loss/{agent}"] = 0.0
                continue
            if self.world_size > 1 and not batching.average_gradients(
                self.model, agent, n_rows, self.world_size
            ):
                out[f"loss/{agent}"] = 0.0  # no process had a row with a non-zero advantage
                continue
            torch.nn.utils.clip_grad_norm_(adapter_parameters(self.model, agent), self.cfg.max_grad_norm)
            opt.step()
            opt.zero_grad(set_to_none=True)
            out[f"loss/{agent}"] = loss_value
            out[f"rows_updated/{agent}"] = n_rows
        return out

    def _accumulate_groups(
        self, agent: str, ro: Rollout, baselines: dict | None = None
    ) -> tuple[float, int, float | None]:
        """Backward the group-estimator loss of ``agent``'s rows of ``ro`` (times ``ro.weight``); returns (loss,
        rows trained, mean |advantage| of the active rows). ``baselines``: :meth:`reinforce_baselines`."""
        rewards = ro.reward_of(agent)
        adv = self.advantages(agent, ro, rewards, baselines)
        flat_adv = adv.flatten()
        active = batching.active_rows(ro)
        # dynamic sampling (skip / resample): the loss is the mean over the groups with unequal rewards only, so
        # the update is the one those groups would give alone; None: every group counts (the paper's loss)
        groups = None
        if self.cfg.dynamic_sampling != "none":
            groups = [n for n, f in enumerate(flat_groups(rewards).tolist()) if not f]
        in_loss = set(range(len(ro.problems))) if groups is None else set(groups)
        rows = ro.rows(agent)
        keep = [
            j
            for j in range(len(rows))
            if active[j] and (self.cfg.beta > 0 or float(flat_adv[j]) != 0.0) and j // ro.G in in_loss
        ]
        act = [float(flat_adv[j].abs()) for j in range(len(rows)) if active[j]]
        mean_abs = sum(act) / len(act) if act else None
        if not keep:
            return 0.0, 0, mean_abs
        self.model.set_adapter(agent)
        loss_value = 0.0
        for chunk in self._micro_batches(ro, rows, keep):
            seqs, mask, width = batching.chunk_inputs(ro, rows, chunk)
            with bf16_autocast(self.model, self.bf16):
                seq_lp, tok_lp, tmask = completion_logprobs(self.model, seqs, mask, width)
                kl = None
                if self.cfg.beta > 0:
                    with torch.no_grad(), self.model.disable_adapter():
                        _, ref_lp, _ = completion_logprobs(self.model, seqs, mask, width)
                    kl = k3_kl(tok_lp, ref_lp, tmask)
            # the loss over the full [N, G] grid: rows outside this micro-batch (or skipped, A = 0) add nothing
            dev = seq_lp.device
            g_idx = None if groups is None else torch.tensor(groups, device=dev)
            loss = micro_batch_loss(seq_lp, torch.tensor(chunk, device=dev), adv, kl, self.cfg.beta, g_idx)
            loss = loss * ro.weight
            loss.backward()
            loss_value += float(loss.detach())
        return loss_value, len(keep), mean_abs

    def advantages(
        self, agent: str, ro: Rollout, rewards: torch.Tensor, baselines: dict | None = None
    ) -> torch.Tensor:
        """``[N, G]`` advantages of ``agent``'s rows of ``ro`` from its ``rewards`` (the group estimators).

        * mean, mean_std, rloo, max, raw: :func:`~orchestry.algorithms.magrpo.group_advantages`;
        * agent_turn: :func:`~orchestry.algorithms.magrpo.agent_turn_advantages` (this agent's rewards, this
          turn's rollout, over the samples active in it);
        * reinforce: R - b (:func:`~orchestry.algorithms.magrpo.reinforce_advantages`), b this step's baseline of
          the agent and turn from ``baselines`` (:meth:`reinforce_baselines`); none (no sample acted): 0;
        * remax, critic: R - the greedy rollout's reward, R - V(s) (:mod:`orchestry.training.magrpo.value_baselines`).
        """
        if self.cfg.advantage in ("remax", "critic"):
            b = (baselines or {}).get(f"{agent}/turn_{ro.turn}")
            return value_baselines.advantages(self.cfg.advantage, rewards, b)
        if self.cfg.advantage == "agent_turn":
            return agent_turn_advantages(rewards, ro.active)
        if self.cfg.advantage != "reinforce":
            return group_advantages(rewards, self.cfg.advantage)
        b = (baselines or {}).get(f"{agent}/turn_{ro.turn}")
        return torch.zeros_like(rewards) if b is None else reinforce_advantages(rewards, b)

    def reinforce_baselines(self, rollouts: Sequence[Rollout]) -> dict[str, float]:
        """``advantage: reinforce``: this step's baseline b per ``"<agent>/turn_<t>"``, and the running state after
        the step (``reward_baseline``, kept in checkpoints) updated.

        Each key's step mean is the mean reward of its agent's active samples at that turn over every process
        (one all-reduce per step, the same on every process however many turns each ran), fed to
        :func:`~orchestry.algorithms.magrpo.running_baseline` with ``baseline_decay``. A key without any active
        sample this step keeps its state and gets no baseline.
        """
        keys = [f"{a}/turn_{t}" for a in self.agents for t in range(self.cfg.turns)]
        sums = torch.zeros(len(keys), 2, dtype=torch.float64)
        for ro in rollouts:
            if ro.turn >= self.cfg.turns:
                raise ValueError(
                    f"a rollout of turn {ro.turn} in a run of train_magrpo.turns={self.cfg.turns}"
                )
            for a in ro.agents:
                total, count = reward_sum_count(ro.reward_of(a), ro.active)
                sums[keys.index(f"{a}/turn_{ro.turn}")] += torch.tensor([total, count], dtype=torch.float64)
        if self.world_size > 1:
            sums = batching.sum_over_processes(sums, next(self.model.parameters()).device)
        out = {}
        for key, (total, count) in zip(keys, sums.tolist(), strict=True):
            if count > 0:
                out[key], self.reward_baseline[key] = running_baseline(
                    self.reward_baseline.get(key), total / count, self.cfg.baseline_decay
                )
        return out

    def _accumulate_tokens(self, agent: str, ro: Rollout) -> tuple[float, int, float | None]:
        """Backward the REINFORCE++ loss of ``agent``'s active rows of ``ro`` (times ``ro.weight``); returns (loss,
        rows trained, mean |advantage| over their tokens)."""
        rows = ro.rows(agent)
        active = batching.active_rows(ro)
        keep = [j for j in range(len(rows)) if active[j] and int(ro.batch.completion_mask[rows[j]].sum()) > 0]
        if not keep:
            return 0.0, 0, None
        pos = {j: i for i, j in enumerate(keep)}
        cmask = ro.batch.completion_mask[torch.tensor([rows[j] for j in keep])].float()  # [K, T]
        logp, ref = torch.zeros_like(cmask), torch.zeros_like(cmask)
        chunks = self._micro_batches(ro, rows, keep)
        self.model.set_adapter(agent)
        if self.cfg.beta > 0:  # the sampling policy's and the base's log-probs, before any update
            with torch.no_grad():
                for chunk in chunks:
                    seqs, mask, width = batching.chunk_inputs(ro, rows, chunk)
                    at = torch.tensor([pos[j] for j in chunk])
                    with bf16_autocast(self.model, self.bf16):
                        _, lp, _ = completion_logprobs(self.model, seqs, mask, width)
                        with self.model.disable_adapter():
                            _, rl, _ = completion_logprobs(self.model, seqs, mask, width)
                    logp[at, : lp.shape[1]], ref[at, : rl.shape[1]] = lp.float().cpu(), rl.float().cpu()
        rewards = ro.reward_of(agent).flatten()[torch.tensor(keep)]
        adv = reinforce_pp_advantages(rewards, logp, ref, cmask, beta=self.cfg.beta, gamma=self.cfg.gamma,
                                      kl_estimator=self.cfg.kl_estimator)  # fmt: skip
        n_tokens = float(cmask.sum())
        loss_value = 0.0
        for chunk in chunks:
            seqs, mask, width = batching.chunk_inputs(ro, rows, chunk)
            at = torch.tensor([pos[j] for j in chunk])
            with bf16_autocast(self.model, self.bf16):
                _, tok_lp, tmask = completion_logprobs(self.model, seqs, mask, width)
            a = adv[at, : tok_lp.shape[1]].to(tok_lp.device)
            loss = token_policy_loss(a, tok_lp, tmask, n_tokens) * ro.weight
            loss.backward()
            loss_value += float(loss.detach())
        return loss_value, len(keep), float((adv.abs() * cmask).sum() / n_tokens)

    def micro_batch_tokens(self) -> int:
        """Token budget of one training micro-batch: ``cfg.micro_batch_tokens`` (or ``micro_batch_tokens_limit``).

        A fixed number, never sized to the memory free at run time: the split into micro-batches sets the order
        of the floating-point gradient sums, so the trained adapters must not depend on what else the machine
        was doing.
        """
        return int(self.micro_batch_tokens_limit or self.cfg.micro_batch_tokens)

    def _micro_batches(self, ro: Rollout, rows: list[int], keep: list[int]) -> list[list[int]]:
        """Kept row indices (into ``rows``) in micro-batches of :meth:`micro_batch_tokens` tokens
        (:func:`orchestry.training.magrpo.batching.micro_batches`)."""
        return batching.micro_batches(ro, rows, keep, self.micro_batch_tokens())

    # ------------------------------------------------------------------ the step's parts, each in its own module
    def rollout(
        self, problems: Sequence[Problem], step: int, attempt: int = 0, base: bool = False
    ) -> Rollout:
        """:func:`orchestry.training.magrpo.rollouts.rollout`."""
        return rollout(self, problems, step, attempt, base)

    def workflow_episode(self, problems: Sequence[Problem], step: int) -> list[Rollout]:
        """:func:`orchestry.training.magrpo.workflows.workflow_episode`."""
        return workflow_episode(self, problems, step)

    def next_turn(self, prev: Rollout, step: int, turn: int) -> Rollout | None:
        """:func:`orchestry.training.magrpo.turns.next_turn`."""
        return next_turn(self, prev, step, turn)

    def resample(self, ro: Rollout, step: int) -> Rollout:
        """:func:`orchestry.training.magrpo.sampling.resample`."""
        return sampling.resample(self, ro, step)

    def build_curriculum(self) -> dict:
        """:func:`orchestry.training.magrpo.sampling.build_curriculum`."""
        return sampling.build_curriculum(self)

    def _step_record(self, step, episode, upd: dict, gen_s: float, upd_s: float, total_s: float) -> dict:
        """:func:`orchestry.training.magrpo.step_log.step_record`."""
        return step_log.step_record(self.cfg, step, episode, upd, gen_s, upd_s, total_s)

    def save_checkpoint(self, next_step: int) -> None:
        """:func:`orchestry.training.magrpo.checkpoints.save_checkpoint`."""
        checkpoints.save_checkpoint(self, next_step)

    def load_checkpoint(self) -> int:
        """:func:`orchestry.training.magrpo.checkpoints.load_checkpoint`."""
        return checkpoints.load_checkpoint(self)

    def save_adapters(self, out_dir: str | Path) -> list[Path]:
        """:func:`orchestry.training.magrpo.checkpoints.save_adapters`."""
        return checkpoints.save_adapters(self, out_dir)
