"""MAGRPO training loop: rollout -> joint level reward -> group advantage -> one update per agent.

One shared frozen base with one LoRA adapter per agent (peft); both agents' completions of all problems of a
step are sampled in ONE batched ``generate`` call (per-row adapters). Checkpoints every
``checkpoint_every`` steps hold both adapters, both AdamW states and the step log, so an interrupted run
resumes where it stopped and reproduces the uninterrupted one (sampling is seeded per step). Nothing depends on
the machine's state: the training micro-batch is a parameter (``micro_batch_tokens``), not sized to free memory.

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

A checkpoint is written crash-safely (:meth:`MAGRPOTrainer.save_checkpoint`): files go to ``<dir>.new``, are
fsynced, ``manifest.json`` (size and SHA-256 of every file) is written last, then ``<dir>`` is renamed to
``<dir>.old``, ``<dir>.new`` to ``<dir>``, and ``<dir>.old`` is removed. A kill at any point leaves a complete
checkpoint in one of the three directories; loading takes the newest complete one that fits the run and
ignores an incomplete one with a log line.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import random
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from orchestry.algorithms.magrpo import group_advantages, k3_kl, micro_batch_loss
from orchestry.algorithms.reinforce_pp import reinforce_pp_advantages, token_policy_loss
from orchestry.config import SamplingParams, TrainMagrpoParams
from orchestry.llm.local import (
    Generation,
    GenerationBatch,
    adapter_parameters,
    bf16_autocast,
    chat_prompt,
    completion_logprobs,
    generate,
    resolve_bf16,
)
from orchestry.problems import HELPER_SYSTEM, MAIN_SYSTEM, Problem
from orchestry.rewards.coach import Coach, coach_prompt, mix_rewards
from orchestry.rewards.code import level_rewards
from orchestry.rewards.credit import counterfactual_credit
from orchestry.schemes import scheme_distribution
from orchestry.tasks.multi_turn import feedback_text, next_turn_prompts

log = logging.getLogger("orchestry.magrpo")

AGENTS = ("helper", "main")
WORKFLOW_AGENTS = {"helper_main": AGENTS, "writer_tester_fixer": ("writer", "tester", "fixer")}
# the coach's description of each role
ROLES = {
    "helper": "helper (writes the helper function `aux` the main agent may call)",
    "main": "main (writes the task's function, calling the helper's `aux` where useful)",
    "writer": "writer (writes the first version of the function)",
    "tester": "tester (writes asserts that are run on the writer's function)",
    "fixer": "fixer (writes the final function from the writer's code and the test report)",
}
CHECKPOINT_FILES = ("state.pt", "trainer.json", "samples.jsonl")
# written last: a checkpoint without it, or with a file that differs from it, is incomplete
MANIFEST = "manifest.json"
BASE = "__base__"  # peft's per-row adapter name for the bare base model
FLAT_ATOL = 1e-6  # joint rewards closer than this count as equal (sums of the same levels in another order)
# seed offsets of the extra rollouts (resamples, the curriculum's base rollout), far from the steps' own seeds
_RESAMPLE_SEED = 1_000_000_007
_CURRICULUM_SEED = 1 << 40
_TURN_SEED = 1 << 36  # seed offset of turn t (and of the workflow's phases)


def agent_names(cfg: TrainMagrpoParams) -> tuple[str, ...]:
    """The adapters (agents) a ``train_magrpo`` config trains, in row order."""
    return WORKFLOW_AGENTS[cfg.workflow]


def flat_groups(rewards: torch.Tensor, atol: float = FLAT_ATOL) -> torch.Tensor:
    """``[N]`` bool: the groups of ``rewards [N, G]`` whose G joint rewards are all equal (within ``atol``).

    Their group-relative advantages are zero: they give no gradient (DAPO's "zero-variance" groups)."""
    return (rewards.max(dim=1).values - rewards.min(dim=1).values) <= atol


def _process_group() -> tuple[int, int]:
    """``(rank, world size)``. Processes started by ``accelerate launch`` (or ``torchrun``) train one model data-
    parallel through accelerate's process group (gloo on CPU, NCCL on GPUs); a lone process is ``(0, 1)``."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return 0, 1
    from accelerate import PartialState

    state = PartialState(cpu=not torch.cuda.is_available())  # without GPUs: gloo over CPU processes
    return state.process_index, state.num_processes


def _fsync_dir(path: Path) -> None:
    """Make a directory's entries (created, renamed files) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_synced(path: Path, data: bytes) -> dict:
    """Write ``data`` to ``path`` and fsync it; returns its manifest entry (bytes, sha256)."""
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def checkpoint_problem(folder: Path) -> str | None:
    """Why ``folder`` is not a complete checkpoint (``None``: it is): a missing or unreadable manifest, a
    missing file, or a file whose size or SHA-256 differs from the manifest's."""
    manifest = folder / MANIFEST
    if not manifest.is_file():
        return f"no {MANIFEST} (the save was cut short, or an older format)"
    try:
        files = json.loads(manifest.read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"unreadable {MANIFEST} ({e})"
    for name in CHECKPOINT_FILES:
        if name not in files:
            return f"{MANIFEST} does not list {name}"
    for name, entry in files.items():
        f = folder / name
        if not f.is_file():
            return f"{name} is missing"
        if f.stat().st_size != entry.get("bytes") or _sha256_file(f) != entry.get("sha256"):
            return f"{name} differs from {MANIFEST} (truncated or changed)"
    return None


@dataclass
class Rollout:
    """One step's samples. Rows of ``batch`` are ordered [problem n][agent a][generation g]."""

    problems: list[Problem]
    batch: GenerationBatch
    rewards: torch.Tensor  # [N, G] joint rewards
    details: list[dict]  # N*G reward breakdowns (LevelReward.to_dict()) + texts
    G: int
    reward_seconds: float = 0.0
    # dynamic_sampling=resample: share of flat groups when first sampled (None: as in ``rewards``), extra
    # rollouts made, groups replaced, and tokens of every row generated this step (None: ``batch.items``'s)
    zero_variance_groups: float | None = None
    resample_rollouts: int = 0
    resampled_groups: int = 0
    tokens: tuple[int, int] | None = None
    # agents whose rows ``batch`` holds, in row order (a phase of the writer/tester/fixer workflow holds one)
    agents: tuple[str, ...] = AGENTS
    # per-agent [N, G] rewards the advantage is computed from (counterfactual credit, coach mix); None: ``rewards``
    agent_rewards: dict[str, torch.Tensor] | None = None
    # [N, G] bool: samples generated in this turn (later turns skip the samples that passed every assert); None: all
    active: torch.Tensor | None = None
    turn: int = 0
    weight: float = 1.0  # loss weight of this turn (``turn_weights``)
    shared_prompt: bool = True  # the G rows of a problem share one prompt (turn 1); later turns: one per row
    metrics: dict = field(default_factory=dict)  # this rollout's step metrics (coach, credit)

    def rows(self, agent: str | int) -> list[int]:
        """Batch rows of ``agent`` (its name, or its index in ``agents``), ordered [problem n][generation g]."""
        a = agent if isinstance(agent, int) else self.agents.index(agent)
        k = len(self.agents)
        return [(n * k + a) * self.G + g for n in range(len(self.problems)) for g in range(self.G)]

    def reward_of(self, agent: str) -> torch.Tensor:
        """``[N, G]`` rewards that ``agent``'s advantage comes from."""
        if self.agent_rewards is not None and agent in self.agent_rewards:
            return self.agent_rewards[agent]
        return self.rewards


def _padded(batch: GenerationBatch, P: int, T: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``batch``'s sequences and attention mask laid out as ``[B, P + T]``: prompts left-padded to width ``P``,
    completions right-padded to ``T`` (padding: id 0 under mask 0, as :func:`generate`'s own padding)."""
    B, width = batch.sequences.shape[0], batch.prompt_width
    t = batch.sequences.shape[1] - width
    seqs = torch.zeros(B, P + T, dtype=batch.sequences.dtype)
    mask = torch.zeros(B, P + T, dtype=batch.attention_mask.dtype)
    seqs[:, P - width : P + t] = batch.sequences
    mask[:, P - width : P + t] = batch.attention_mask
    return seqs, mask


def _replace_groups(ro: Rollout, new: Rollout, pairs: list[tuple[int, int]]) -> Rollout:
    """``ro`` with its group ``n`` replaced by group ``j`` of ``new`` for each ``(n, j)`` of ``pairs`` (same G,
    same problem): rows, rewards and records; the two batches are re-padded to one layout."""
    G, n_agents = ro.G, len(ro.agents)
    P = max(ro.batch.prompt_width, new.batch.prompt_width)
    T = max(
        ro.batch.sequences.shape[1] - ro.batch.prompt_width,
        new.batch.sequences.shape[1] - new.batch.prompt_width,
    )
    seqs_a, mask_a = _padded(ro.batch, P, T)
    seqs_b, mask_b = _padded(new.batch, P, T)
    offset = seqs_a.shape[0]
    source = list(range(offset))  # row of the merged batch -> row of cat(ro, new)
    rewards = ro.rewards.clone()
    agent_rewards = {a: r.clone() for a, r in ro.agent_rewards.items()} if ro.agent_rewards else None
    details = list(ro.details)
    for n, j in pairs:
        if new.problems[j].task_id != ro.problems[n].task_id:
            raise ValueError(f"group {n} ({ro.problems[n].task_id}) replaced by another problem")
        for a in range(n_agents):
            for g in range(G):
                source[(n * n_agents + a) * G + g] = offset + (j * n_agents + a) * G + g
        rewards[n] = new.rewards[j]
        if agent_rewards is not None:
            for a in agent_rewards:
                agent_rewards[a][n] = new.agent_rewards[a][j]
        details[n * G : (n + 1) * G] = new.details[j * G : (j + 1) * G]
    index = torch.tensor(source)
    seqs, mask = torch.cat([seqs_a, seqs_b])[index], torch.cat([mask_a, mask_b])[index]
    all_items = [*ro.batch.items, *new.batch.items]
    items = [replace(all_items[src], row=i) for i, src in enumerate(source)]
    batch = GenerationBatch(seqs, mask, P, items, ro.batch.seconds)
    return Rollout(list(ro.problems), batch, rewards, details, G, ro.reward_seconds, agents=ro.agents,
                   agent_rewards=agent_rewards, metrics=dict(ro.metrics))  # fmt: skip


def workflow_rollout(
    model,
    tokenizer,
    problems: Sequence[Problem],
    G: int,
    sandbox,
    sampling: SamplingParams,
    seed: int,
    adapters: Sequence[str] = WORKFLOW_AGENTS["writer_tester_fixer"],
) -> tuple[dict[str, GenerationBatch], list[dict], list]:
    """G writer -> tester -> fixer episodes per problem: three batched ``generate`` calls and two sandbox batches.

    The writer writes the function; the tester writes asserts, which run on the writer's code in the sandbox
    (:func:`orchestry.tasks.writer_tester_fixer.tester_reports`); the fixer reads the writer's code and that
    report and writes the final function, scored on the problem's hidden asserts
    (:func:`~orchestry.tasks.writer_tester_fixer.workflow_rewards`: the joint reward, 0..2.1).

    Args:
        problems: N problems; G: episodes per problem. seed: the writer's sampling seed (tester, fixer: offsets).
        adapters: the peft adapter of (writer, tester, fixer) rows (``"__base__"``: the bare base model).

    Returns:
        ``({"writer"|"tester"|"fixer": GenerationBatch of N*G rows}, N*G records, N*G tester reports)``; a record
        is the level reward's dict plus task_id, generation, the three texts, ``report``, token counts,
        truncation flags, ``reward_seconds`` (sandbox seconds), and, for the shared record format, ``helper``
        (empty: no aux) and ``main`` (the fixer's final code).
    """
    from orchestry.tasks import writer_tester_fixer as wtf

    names = WORKFLOW_AGENTS["writer_tester_fixer"]
    limit = sampling.max_completion_length
    probs = [p for p in problems for _ in range(G)]

    def sample(prompts: list[str], adapter: str, offset: int) -> GenerationBatch:
        return generate(model, tokenizer, prompts, [adapter] * len(prompts), max_new_tokens=limit,
                        temperature=sampling.temperature, top_p=sampling.top_p, seed=seed + offset)  # fmt: skip

    writer = sample(
        [chat_prompt(tokenizer, wtf.writer_prompt(p), wtf.WRITER_SYSTEM) for p in probs], adapters[0], 0
    )
    w_texts = [i.text for i in writer.items]
    tester = sample([chat_prompt(tokenizer, wtf.tester_prompt(p, w), wtf.TESTER_SYSTEM)
                     for p, w in zip(probs, w_texts, strict=True)], adapters[1], _TURN_SEED)  # fmt: skip
    t_texts = [i.text for i in tester.items]
    t0 = time.time()
    reports = wtf.tester_reports(probs, w_texts, t_texts, sandbox)
    seconds = time.time() - t0
    fixer = sample([chat_prompt(tokenizer, wtf.fixer_prompt(p, w, r.text), wtf.FIXER_SYSTEM)
                    for p, w, r in zip(probs, w_texts, reports, strict=True)], adapters[2], 2 * _TURN_SEED)  # fmt: skip
    f_texts = [i.text for i in fixer.items]
    batches = dict(zip(names, (writer, tester, fixer), strict=True))
    cut = [[b.items[i].completion_tokens >= limit for b in batches.values()] for i in range(len(probs))]
    t0 = time.time()
    results = wtf.workflow_rewards(probs, f_texts, sandbox, truncated=[any(c) for c in cut])
    seconds += time.time() - t0
    details = []
    for i, r in enumerate(results):
        d = r.to_dict()
        d.update(task_id=probs[i].task_id, generation=i % G, writer=w_texts[i], tester=t_texts[i],
                 fixer=f_texts[i], report=reports[i].text, tester_passed=reports[i].passed,
                 tester_total=reports[i].total, helper="", main=f_texts[i], truncated=any(cut[i]), attempt=0,
                 turn=0, reward_seconds=seconds)  # fmt: skip
        for a, b in batches.items():
            d[f"{a}_tokens"] = b.items[i].completion_tokens
            d[f"{a}_truncated"] = b.items[i].completion_tokens >= limit
        details.append(d)
    return batches, details, reports


@dataclass
class MAGRPOTrainer:
    """Train one LoRA adapter per agent with MAGRPO (see :mod:`orchestry.algorithms.magrpo`).

    Args:
        model: a peft model with adapters named as ``AGENTS`` (see ``orchestry.llm.local.attach_adapters``).
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

    def __post_init__(self):
        self.checkpoint_dir = Path(self.checkpoint_dir)
        self.agents = agent_names(self.cfg)
        if self.cfg.coach.enabled and self.coach is None:
            raise ValueError("train_magrpo.coach.enabled needs a Coach (orchestry.rewards.coach.open_coach)")
        self.optimizers = self._new_optimizers()
        for a in self.agents:
            if not self.optimizers[a].param_groups[0]["params"]:
                raise ValueError(f"model has no LoRA parameters for agent {a!r}")
        order = list(range(len(self.problems)))
        random.Random(self.cfg.seed).shuffle(order)
        self.order = order
        self.rank, self.world_size = _process_group()
        # bf16_update resolved once for the model's device: True = bf16 autocast in the update, False = fp32
        self.bf16 = resolve_bf16(self.cfg.bf16_update, next(self.model.parameters()).device)
        log.info(
            "train_magrpo.bf16_update %s: the update runs in %s",
            self.cfg.bf16_update,
            "bf16" if self.bf16 else "fp32",
        )

    def build_curriculum(self) -> dict:
        """Order the training problems by the base policy's mean group reward, easiest first (ties keep the
        seeded order), from one rollout of the bare base model (``problems_per_step`` problems per batch).

        Every process computes the same order (seeds without the rank; the main process's order is broadcast
        when several train together). Sets ``self.order`` and ``self.curriculum`` and returns the latter.
        """
        t0 = time.time()
        P = self.cfg.problems_per_step
        means: list[float] = []
        tokens = [0, 0]
        for k, start in enumerate(range(0, len(self.problems), P)):
            ro = self.rollout(self.problems[start : start + P], k, base=True)
            means += ro.rewards.mean(dim=1).tolist()
            tokens[0] += sum(i.prompt_tokens for i in ro.batch.items)
            tokens[1] += sum(i.completion_tokens for i in ro.batch.items)
        order = sorted(self.order, key=lambda i: -means[i])  # stable: ties keep the seeded shuffle's order
        if self.world_size > 1:
            from accelerate.utils import broadcast_object_list

            order = broadcast_object_list([order], from_process=0)[0]
        self.order = order
        self.curriculum = {
            "order": [self.problems[i].task_id for i in order],
            "base_reward": {self.problems[i].task_id: means[i] for i in order},
            "seconds": time.time() - t0,
            "tokens/prompt": tokens[0],
            "tokens/completion": tokens[1],
        }
        log.info(
            "curriculum (base policy's mean group reward, easiest first): %s",
            ", ".join(f"{t} {r:.3f}" for t, r in self.curriculum["base_reward"].items()),
        )
        return self.curriculum

    def _curriculum_order(self, curriculum: dict | None) -> list[int] | None:
        """A checkpoint's curriculum as an order of ``self.problems`` (None: no curriculum); raises if it does not
        name each of this run's problems exactly once."""
        if not curriculum:
            return None
        index = {p.task_id: i for i, p in enumerate(self.problems)}
        order = [index[t] for t in curriculum["order"]]
        if sorted(order) != list(range(len(self.problems))):
            raise ValueError("the checkpoint's curriculum does not list this run's problems")
        return order

    def _new_optimizers(self) -> dict[str, torch.optim.AdamW]:
        return {
            a: torch.optim.AdamW(
                adapter_parameters(self.model, a),
                lr=self.cfg.learning_rate,
                weight_decay=self.cfg.weight_decay,
            )
            for a in self.agents
        }

    # ------------------------------------------------------------------ rollout
    def problems_for_step(self, step: int) -> list[Problem]:
        """This process's ``problems_per_step`` problems of ``step`` (processes take consecutive slices)."""
        P = self.cfg.problems_per_step
        start = (step * self.world_size + self.rank) * P
        idx = [self.order[(start + j) % len(self.order)] for j in range(P)]
        return [self.problems[i] for i in idx]

    def _generate(self, prompts: list[str], adapters: list[str], seed: int) -> GenerationBatch:
        return generate(
            self.model,
            self.tokenizer,
            prompts,
            adapters,
            max_new_tokens=self.sampling.max_completion_length,
            temperature=self.sampling.temperature,
            top_p=self.sampling.top_p,
            seed=seed,
        )

    def _seed(self, step: int, offset: int = 0) -> int:
        return self.cfg.seed * 1_000_003 + step + 7919 * self.rank + offset

    def rollout(
        self, problems: Sequence[Problem], step: int, attempt: int = 0, base: bool = False
    ) -> Rollout:
        """Sample G completions per agent for each problem (one batched ``generate``) and score the pairs.

        ``attempt`` > 0: a resample of ``step`` (dynamic sampling), with its own seed. ``base``: the bare base
        model writes both agents' completions (the curriculum's rollout), seeded alike on every process.
        Each sample's record holds its completion token counts and whether each hit ``max_completion_length``;
        with ``credit: counterfactual`` or the coach, also each agent's reward (:meth:`_agent_rewards`).
        """
        G = self.cfg.num_generations
        prompts, adapters = [], []
        for p in problems:
            hp = chat_prompt(self.tokenizer, p.helper_prompt(), HELPER_SYSTEM)
            mp = chat_prompt(self.tokenizer, p.main_prompt(), MAIN_SYSTEM)
            for agent, prompt in zip(AGENTS, (hp, mp), strict=True):
                prompts += [prompt] * G
                adapters += [BASE if base else agent] * G
        if base:
            seed = self.cfg.seed * 1_000_003 + step + _CURRICULUM_SEED
        else:
            seed = self._seed(step, _RESAMPLE_SEED * attempt)
        batch = self._generate(prompts, adapters, seed)
        t0 = time.time()
        samples = [
            (p, batch.items[(n * 2 + 0) * G + g], batch.items[(n * 2 + 1) * G + g])
            for n, p in enumerate(problems)
            for g in range(G)
        ]
        details, flat, metrics = self._score_pairs(samples, [g for _ in problems for g in range(G)], attempt,
                                                   coach=not base)  # fmt: skip
        N = len(problems)
        rewards = torch.tensor([d["total"] for d in details], dtype=torch.float32).view(N, G)
        agent_rewards = {a: r.view(N, G) for a, r in flat.items()} if flat else None
        return Rollout(list(problems), batch, rewards, details, G, time.time() - t0,
                       agent_rewards=agent_rewards, metrics=metrics)  # fmt: skip

    def _score_pairs(
        self,
        samples: list[tuple[Problem, Generation, Generation]],
        generations: list[int],
        attempt: int = 0,
        turn: int = 0,
        coach: bool = True,
        previous: list[dict] | None = None,
    ) -> tuple[list[dict], dict[str, torch.Tensor] | None, dict]:
        """Score B (problem, helper, main) samples: their records (level reward, texts, token counts,
        truncation), the per-agent rewards ``{agent: [B]}`` (None: shared) and the metrics of
        :meth:`_agent_rewards`. ``previous``: the samples' records of the turn before (the coach's earlier
        feedback)."""
        limit = self.sampling.max_completion_length
        probs = [s[0] for s in samples]
        helpers, mains = [s[1].text for s in samples], [s[2].text for s in samples]
        if self.reward_fn is not None:
            results = self.reward_fn(probs, helpers, mains)
        else:
            truncated = [h.completion_tokens >= limit or m.completion_tokens >= limit for _, h, m in samples]
            results = level_rewards(probs, helpers, mains, self.sandbox, truncated=truncated)
        details = []
        for i, r in enumerate(results):
            _, h, m = samples[i]
            d = r.to_dict()
            d.update(task_id=probs[i].task_id, generation=generations[i], helper=helpers[i], main=mains[i])
            d.update(
                helper_tokens=h.completion_tokens,
                main_tokens=m.completion_tokens,
                helper_truncated=h.completion_tokens >= limit,
                main_truncated=m.completion_tokens >= limit,
                truncated=h.completion_tokens >= limit or m.completion_tokens >= limit,
                attempt=attempt,
                turn=turn,
            )
            details.append(d)
        flat, metrics = self._agent_rewards(
            probs, {"helper": helpers, "main": mains}, details, coach, previous
        )
        return details, flat, metrics

    def _agent_rewards(
        self,
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
        if self.cfg.credit == "counterfactual":
            credits = counterfactual_credit(probs, texts["helper"], texts["main"], self.sandbox, joint=joint)
            for d, c in zip(details, credits, strict=True):
                d["credit_helper"], d["credit_main"] = c.helper, c.main
            outcome = {
                "helper": torch.tensor([c.helper for c in credits], dtype=torch.float32),
                "main": torch.tensor([c.main for c in credits], dtype=torch.float32),
            }
            metrics.update({f"credit/{a}": float(outcome[a].mean()) for a in outcome})
            per_agent = True
        if coach and self.coach is not None:
            c = self.cfg.coach
            names, B = list(texts), len(probs)
            before = self.coach.counters()
            prompts = [
                coach_prompt(probs[i].prompt, ROLES.get(a, a), texts[a][i],
                             (previous[i].get(f"coach_{a}_feedback") if previous else None))
                for a in names
                for i in range(B)
            ]  # fmt: skip
            scores = self.coach.score(prompts, [("coach", a) for a in names for _ in range(B)])
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
            after = self.coach.counters()
            metrics.update({f"coach/{k}": after[k] - before[k] for k in after})
            per_agent = True
        return (outcome if per_agent else None), metrics

    def next_turn(self, prev: Rollout, step: int, turn: int) -> Rollout | None:
        """Turn ``turn`` (>= 1) of the helper/main episode whose last turn is ``prev``.

        Each sample that did not pass every assert is continued by one new (helper, main) pair whose prompts
        carry the sandbox's feedback on its previous pair, main seeing the helper's previous ``aux``
        (:func:`orchestry.tasks.multi_turn.next_turn_prompts`; plus the coach's comments with
        ``coach.show_feedback``). All continued samples are sampled in one batched ``generate``. A sample that
        passed stops early: its reward is carried over, its rows are empty placeholders that are never trained
        (``active`` False). Returns None when every sample has stopped.
        """
        G, N = prev.G, len(prev.problems)
        todo = [
            (n, g)
            for n in range(N)
            for g in range(G)
            if not (prev.details[n * G + g]["total_asserts"] > 0
                    and prev.details[n * G + g]["passed"] == prev.details[n * G + g]["total_asserts"])
        ]  # fmt: skip
        if not todo:
            return None
        prompts, adapters = [], []
        for n, g in todo:
            d, p = prev.details[n * G + g], prev.problems[n]
            notes = None
            if self.cfg.coach.show_feedback:
                notes = {a: d.get(f"coach_{a}_feedback", "") for a in AGENTS}
            hp, mp = next_turn_prompts(p, d["helper"], d["main"], feedback_text(p, d), notes)
            prompts += [
                chat_prompt(self.tokenizer, hp, HELPER_SYSTEM),
                chat_prompt(self.tokenizer, mp, MAIN_SYSTEM),
            ]
            adapters += list(AGENTS)
        sub = self._generate(prompts, adapters, self._seed(step, _TURN_SEED * turn))
        # the full [n][agent][g] layout; rows of stopped samples stay empty (mask 0) and are never trained
        B, k = N * len(AGENTS) * G, len(AGENTS)
        seqs = torch.zeros(B, sub.sequences.shape[1], dtype=sub.sequences.dtype)
        mask = torch.zeros(B, sub.sequences.shape[1], dtype=sub.attention_mask.dtype)
        items = [Generation("", 0, 0, i) for i in range(B)]
        for j, (n, g) in enumerate(todo):
            for a in range(k):
                src, dst = j * k + a, (n * k + a) * G + g
                seqs[dst], mask[dst] = sub.sequences[src], sub.attention_mask[src]
                items[dst] = replace(sub.items[src], row=dst)
        batch = GenerationBatch(seqs, mask, sub.prompt_width, items, sub.seconds)
        t0 = time.time()
        samples = [(prev.problems[n], items[(n * k) * G + g], items[(n * k + 1) * G + g]) for n, g in todo]
        previous = [prev.details[n * G + g] for n, g in todo]
        details_new, flat, metrics = self._score_pairs(
            samples, [g for _, g in todo], turn=turn, previous=previous
        )
        rewards = prev.rewards.clone()
        details = [dict(d, turn=turn, carried=True) for d in prev.details]
        active = torch.zeros(N, G, dtype=torch.bool)
        agent_rewards = None
        if flat is not None or prev.agent_rewards is not None:
            agent_rewards = {a: prev.reward_of(a).clone() for a in AGENTS}
        for j, (n, g) in enumerate(todo):
            rewards[n, g] = details_new[j]["total"]
            details[n * G + g] = details_new[j]
            active[n, g] = True
            if agent_rewards is not None:
                for a in AGENTS:
                    agent_rewards[a][n, g] = flat[a][j] if flat is not None else details_new[j]["total"]
        return Rollout(list(prev.problems), batch, rewards, details, G, time.time() - t0,
                       agent_rewards=agent_rewards, active=active, turn=turn, shared_prompt=False,
                       metrics=metrics)  # fmt: skip

    def workflow_episode(self, problems: Sequence[Problem], step: int) -> list[Rollout]:
        """One writer -> tester -> fixer episode per (problem, generation) (:func:`workflow_rollout`), as one
        :class:`Rollout` per agent (phase), all with the episode's joint rewards (the coach's mix per agent when
        enabled); the records (texts, report, tokens) are on the writer's."""
        G, N = self.cfg.num_generations, len(problems)
        batches, details, reports = workflow_rollout(
            self.model,
            self.tokenizer,
            problems,
            G,
            self.sandbox,
            self.sampling,
            self._seed(step),
            self.agents,
        )
        t0 = time.time()
        probs = [p for p in problems for _ in range(G)]
        texts = {a: [d[a] for d in details] for a in self.agents}
        flat, metrics = self._agent_rewards(probs, texts, details)
        metrics["tester_pass_rate"] = sum(r.total > 0 and r.passed == r.total for r in reports) / len(reports)
        rewards = torch.tensor([d["total"] for d in details], dtype=torch.float32).view(N, G)
        seconds = details[0].get("reward_seconds", 0.0) + time.time() - t0
        out = []
        for k, a in enumerate(self.agents):
            ar = {a: flat[a].view(N, G)} if flat is not None else None
            out.append(Rollout(list(problems), batches[a], rewards, details if k == 0 else [], G,
                               seconds if k == 0 else 0.0, agents=(a,), agent_rewards=ar,
                               shared_prompt=k == 0, metrics=metrics if k == 0 else {}))  # fmt: skip
        return out

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
        return turns

    def resample(self, ro: Rollout, step: int) -> Rollout:
        """Dynamic sampling (DAPO): roll the flat groups of ``ro`` out again, at most ``max_resample`` times.

        Each extra rollout takes the problems whose group is still flat (one batched ``generate``); a group
        that comes back with unequal rewards replaces the flat one. Groups still flat after the last attempt
        stay (and :meth:`update` leaves them out of the loss). Time and tokens of every rollout are counted.
        """
        G, N = ro.G, len(ro.problems)
        ro.zero_variance_groups = float(flat_groups(ro.rewards).float().mean())
        tokens = [
            sum(i.prompt_tokens for i in ro.batch.items),
            sum(i.completion_tokens for i in ro.batch.items),
        ]
        todo = [n for n, f in enumerate(flat_groups(ro.rewards).tolist()) if f]
        attempt = 0
        while todo and attempt < self.cfg.max_resample:
            attempt += 1
            new = self.rollout([ro.problems[n] for n in todo], step, attempt=attempt)
            tokens[0] += sum(i.prompt_tokens for i in new.batch.items)
            tokens[1] += sum(i.completion_tokens for i in new.batch.items)
            still = flat_groups(new.rewards).tolist()
            fixed = [(n, j) for j, n in enumerate(todo) if not still[j]]
            merged = _replace_groups(ro, new, fixed) if fixed else ro
            merged.reward_seconds = ro.reward_seconds + new.reward_seconds
            merged.batch.seconds = ro.batch.seconds + new.batch.seconds
            merged.zero_variance_groups = ro.zero_variance_groups
            merged.resample_rollouts = ro.resample_rollouts + 1
            merged.resampled_groups = ro.resampled_groups + len(fixed)
            ro = merged
            todo = [n for j, n in enumerate(todo) if still[j]]
            log.debug("step %d resample %d: %d of %d groups still flat", step, attempt, len(todo), N)
        ro.tokens = (tokens[0], tokens[1])
        assert ro.rewards.shape == (N, G)
        return ro

    # ------------------------------------------------------------------ update
    def update(self, episode: Rollout | Sequence[Rollout]) -> dict:
        """One AdamW step per agent on the loss summed over the episode's rollouts (turns or phases), each
        weighted by its ``weight``; with beta = 0 the group estimators skip rows with zero advantage.

        Group estimators (``advantage``: mean, mean_std, rloo, max, raw): the MAGRPO loss
        (:func:`orchestry.algorithms.magrpo.policy_loss`, back-propagated one
        :func:`~orchestry.algorithms.magrpo.micro_batch_loss` at a time) on each agent's advantages, from its own rewards
        (:meth:`Rollout.reward_of`: the joint reward unless per-agent credit or the coach is on). With
        ``dynamic_sampling`` skip or resample, the flat groups (:func:`flat_groups`) are left out of the loss
        (their rows, KL terms included, and their share of the mean over problems): the update is the one the
        other groups give alone. ``skipped_groups`` in the result is their share in the first rollout.

        ``reinforce_pp``: per-token advantages (:func:`orchestry.algorithms.reinforce_pp.reinforce_pp_advantages`:
        -beta * KL per token in the reward, discounted returns, whitened over all valid tokens of the agent's
        rows of the rollout), loss = -sum_t A_t log pi(y_t) / (number of those tokens). The policy's and the
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
                    lv, nr, aa = self._accumulate_groups(agent, ro)
                loss_value, n_rows = loss_value + lv, n_rows + nr
                if aa is not None:
                    abs_adv.append(aa)
            if abs_adv:
                out[f"advantage_abs/{agent}"] = sum(abs_adv) / len(abs_adv)
            if not n_rows and self.world_size == 1:
                out[f"loss/{agent}"] = 0.0
                continue
            if self.world_size > 1 and not self._average_gradients(agent, n_rows):
                out[f"loss/{agent}"] = 0.0  # no process had a row with a non-zero advantage
                continue
            torch.nn.utils.clip_grad_norm_(adapter_parameters(self.model, agent), self.cfg.max_grad_norm)
            opt.step()
            opt.zero_grad(set_to_none=True)
            out[f"loss/{agent}"] = loss_value
            out[f"rows_updated/{agent}"] = n_rows
        return out

    def _chunk_inputs(self, ro: Rollout, rows: list[int], chunk: list[int]):
        """Sequences and mask of the rows ``chunk`` (indices into ``rows``), without the columns that are padding
        in every one of them; returns ``(seqs, mask, prompt_width)``."""
        sel = torch.tensor([rows[j] for j in chunk])
        seqs, mask = ro.batch.sequences[sel], ro.batch.attention_mask[sel]
        width = ro.batch.prompt_width
        first = int((mask[:, :width].sum(dim=0) > 0).float().argmax())
        last = int(mask.sum(dim=0).nonzero().max()) + 1
        return seqs[:, first:last], mask[:, first:last], width - first

    def _active(self, ro: Rollout) -> list[bool]:
        return [True] * (len(ro.problems) * ro.G) if ro.active is None else ro.active.flatten().tolist()

    def _accumulate_groups(self, agent: str, ro: Rollout) -> tuple[float, int, float | None]:
        """Backward the group-estimator loss of ``agent``'s rows of ``ro`` (times ``ro.weight``); returns (loss,
        rows trained, mean |advantage| of the active rows)."""
        rewards = ro.reward_of(agent)
        adv = group_advantages(rewards, self.cfg.advantage)
        flat_adv = adv.flatten()
        active = self._active(ro)
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
            seqs, mask, width = self._chunk_inputs(ro, rows, chunk)
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

    def _accumulate_tokens(self, agent: str, ro: Rollout) -> tuple[float, int, float | None]:
        """Backward the REINFORCE++ loss of ``agent``'s active rows of ``ro`` (times ``ro.weight``); returns (loss,
        rows trained, mean |advantage| over their tokens)."""
        rows = ro.rows(agent)
        active = self._active(ro)
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
                    seqs, mask, width = self._chunk_inputs(ro, rows, chunk)
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
            seqs, mask, width = self._chunk_inputs(ro, rows, chunk)
            at = torch.tensor([pos[j] for j in chunk])
            with bf16_autocast(self.model, self.bf16):
                _, tok_lp, tmask = completion_logprobs(self.model, seqs, mask, width)
            a = adv[at, : tok_lp.shape[1]].to(tok_lp.device)
            loss = token_policy_loss(a, tok_lp, tmask, n_tokens) * ro.weight
            loss.backward()
            loss_value += float(loss.detach())
        return loss_value, len(keep), float((adv.abs() * cmask).sum() / n_tokens)

    def _average_gradients(self, agent: str, n_rows: int) -> int:
        """Average this agent's LoRA gradients over the processes with accelerate's ``reduce`` (one all-reduce).

        Each process's loss is the mean over its own problems, so the average is the loss of all processes'
        problems together, as one process with ``world_size`` times the problems would compute it. Returns
        the number of rows trained on by all processes together (0: every process skips the step).
        """
        from accelerate.utils import reduce

        params = adapter_parameters(self.model, agent)
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        count = torch.tensor([float(n_rows)], device=grads[0].device)
        flat = reduce(torch.cat([g.reshape(-1).float() for g in grads] + [count]), reduction="sum")
        total = int(flat[-1].item())
        offset = 0
        for p in params:
            p.grad = (flat[offset : offset + p.numel()] / self.world_size).view_as(p).to(p.dtype)
            offset += p.numel()
        return total

    def micro_batch_tokens(self) -> int:
        """Token budget of one training micro-batch: ``cfg.micro_batch_tokens`` (or ``micro_batch_tokens_limit``).

        A fixed number, never sized to the memory free at run time: the split into micro-batches sets the order
        of the floating-point gradient sums, so the trained adapters must not depend on what else the machine
        was doing.
        """
        return int(self.micro_batch_tokens_limit or self.cfg.micro_batch_tokens)

    def _micro_batches(self, ro: Rollout, rows: list[int], keep: list[int]) -> list[list[int]]:
        """Split kept row indices (into ``rows``) into micro-batches within the token budget.

        A problem's rows stay together (its prompt is computed once) unless they alone exceed the budget.
        """
        budget = self.micro_batch_tokens()
        mask = ro.batch.attention_mask
        P = ro.batch.prompt_width
        by_problem: dict[int, list[int]] = {}
        for j in keep:
            by_problem.setdefault(j // ro.G, []).append(j)
        chunks: list[list[int]] = []
        current: list[int] = []
        used = 0
        for members in by_problem.values():
            prompt = int(mask[rows[members[0]], :P].sum())
            # later turns: each row has its own prompt (counted per row, as a prompt of its own)
            lengths = [int(mask[rows[j], P:].sum()) + (0 if ro.shared_prompt else int(mask[rows[j], :P].sum()))
                       for j in members]  # fmt: skip
            if not ro.shared_prompt:
                prompt = 0
            if current and used + prompt + sum(lengths) > budget:
                chunks.append(current)
                current, used = [], 0
            new_problem = True
            for j, n in zip(members, lengths, strict=True):
                cost = n + (prompt if new_problem else 0)
                if current and used + cost > budget:  # this problem alone exceeds the budget: split it
                    chunks.append(current)
                    current, used, cost = [], 0, n + prompt
                current.append(j)
                used += cost
                new_problem = False
        if current:
            chunks.append(current)
        return chunks

    # ------------------------------------------------------------------ loop
    def train(self, progress: bool = True) -> list[dict]:
        start = self.load_checkpoint()
        if start:
            log.info("resuming MAGRPO from step %d (%s)", start, self.checkpoint_dir)
            for rec in self.history:
                if self.on_step and self.rank == 0:
                    self.on_step(rec)
                if self.rank == 0:
                    self._log_samples_table(rec["step"])
        elif self.cfg.curriculum == "base_reward":
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
            self.history.append(rec)
            for ro in episode:  # a later turn's records of samples that stopped early are not repeated
                for d in ro.details:
                    if not d.get("carried"):
                        self.samples.append({"step": step, **d})
            if self.on_step and self.rank == 0:  # one log per run, from the main process
                self.on_step(rec)
            if self.rank == 0:
                self._log_samples_table(step)
            if bar:
                bar.update(1)
                bar.set_postfix(reward=f"{rec['reward']:.2f}", s=f"{rec['seconds']:.0f}")
            if (step + 1) % self.cfg.checkpoint_every == 0 or step + 1 == self.cfg.num_steps:
                if self.rank == 0:  # adapters are identical on every process; the main one writes them
                    self.save_checkpoint(step + 1)
                if self.world_size > 1:
                    from accelerate import PartialState

                    PartialState().wait_for_everyone()
        if bar:
            bar.close()
        return self.history

    def _log_samples_table(self, step: int) -> None:
        """Step ``step``'s samples (as in ``reports/train/magrpo_samples.jsonl``, with a ``step`` column) as the
        MLflow table ``samples/train_step_<NNNN>.json`` of the active run; nothing without an active run."""
        from orchestry.mlflow_models import log_samples_table

        log_samples_table(
            [s for s in self.samples if s["step"] == step], f"samples/train_step_{step:04d}.json"
        )

    def _step_record(
        self,
        step,
        episode: Rollout | Sequence[Rollout],
        upd: dict,
        gen_s: float,
        upd_s: float,
        total_s: float,
    ) -> dict:
        """The step's metrics. Rewards, levels and rates are those of the first turn (comparable whatever
        ``turns`` is; the workflow's first phase holds the episode's records); ``reward/turn_<t>`` is each turn's
        mean reward (samples that stopped early count with their carried reward) and ``reward/<agent>`` each
        agent's own reward when credit or the coach make them differ; tokens and seconds are the whole step's."""
        rollouts = [episode] if isinstance(episode, Rollout) else list(episode)
        ro = rollouts[0]
        det = ro.details
        n = len(det)
        prompt_tokens = completion_tokens = 0
        for r in rollouts:
            p_tok, c_tok = r.tokens or (
                sum(i.prompt_tokens for i in r.batch.items),
                sum(i.completion_tokens for i in r.batch.items),
            )
            prompt_tokens, completion_tokens = prompt_tokens + p_tok, completion_tokens + c_tok
        flat = float(flat_groups(ro.rewards).float().mean())
        rec = {
            "step": step,
            "reward": float(ro.rewards.mean()),
            "structure": sum(d["structure"] for d in det) / n,
            "syntax": sum(d["syntax"] for d in det) / n,
            "tests": sum(d["tests"] for d in det) / n,
            "cooperation": sum(d["cooperation"] for d in det) / n,
            "cooperation_rate": sum(d["cooperation"] > 0 for d in det) / n,
            "pass_rate": sum(d["total_asserts"] > 0 and d["passed"] == d["total_asserts"] for d in det) / n,
            "reward_std_in_group": float(ro.rewards.std(dim=1, unbiased=False).mean()),
            # ungated collaboration evidence (move before any assert passes) and truncation
            "aux_defined_rate": sum(bool(d.get("aux_defined")) for d in det) / n,
            "aux_called_rate": sum(bool(d.get("aux_called")) for d in det) / n,
            "aux_used_rate": sum(bool(d.get("aux_used")) for d in det) / n,
            "truncation_rate": sum(bool(d.get("truncated")) for d in det) / n,
            "truncation_rate/helper": sum(bool(d.get("helper_truncated")) for d in det) / n,
            "truncation_rate/main": sum(bool(d.get("main_truncated")) for d in det) / n,
            **{
                f"scheme/{k}": v for k, v in scheme_distribution(d.get("scheme", "none") for d in det).items()
            },
            # signal: groups whose G rewards are all equal give no gradient (as first sampled, before resampling)
            "zero_variance_groups": flat if ro.zero_variance_groups is None else ro.zero_variance_groups,
            "resample_rollouts": ro.resample_rollouts,
            "resampled_groups": ro.resampled_groups,
            "tokens/prompt": prompt_tokens,
            "tokens/completion": completion_tokens,
            "seconds/generate": gen_s,
            "seconds/reward": sum(r.reward_seconds for r in rollouts),
            "seconds/update": upd_s,
            "seconds": total_s,
            "problems": [p.task_id for p in ro.problems],
        }
        if self.cfg.turns > 1:
            for t in range(
                self.cfg.turns
            ):  # a turn not reached (everything passed before) keeps the last one's
                r = rollouts[min(t, len(rollouts) - 1)]
                rec[f"reward/turn_{t + 1}"] = float(r.rewards.mean())
            rec["turns_run"] = len(rollouts)
        for r in rollouts:
            for a in r.agents:
                if r.agent_rewards is not None and a in r.agent_rewards and r.turn == 0:
                    rec[f"reward/{a}"] = float(r.agent_rewards[a].mean())
            for k, v in r.metrics.items():
                key = k if r.turn == 0 else f"{k}/turn_{r.turn + 1}"
                rec[key] = v
        rec.update(upd)
        return rec

    # ------------------------------------------------------------------ checkpoints
    def _sibling(self, suffix: str) -> Path:
        return self.checkpoint_dir.with_name(self.checkpoint_dir.name + suffix)

    def _swap_in(self, new: Path) -> None:
        """Make the complete checkpoint ``new`` the checkpoint: ``dir`` -> ``dir.old``, ``new`` -> ``dir``,
        then remove ``dir.old``. Until the second rename the previous checkpoint stays whole in ``dir`` or
        ``dir.old``; after it, ``dir`` is the new one."""
        ckpt, old = self.checkpoint_dir, self._sibling(".old")
        if ckpt.exists() or ckpt.is_symlink():
            if old.exists():
                shutil.rmtree(old)  # left by a killed save; ``dir`` is at least as new
            os.rename(ckpt, old)
        os.rename(new, ckpt)
        _fsync_dir(ckpt.parent)
        if old.exists():
            shutil.rmtree(old)

    def _finish_interrupted_save(self) -> None:
        """Complete what a killed save left half done, so that its checkpoint is not lost by this save.

        A complete ``dir.new`` is newer than ``dir`` (it is swapped in); ``dir`` missing with a complete
        ``dir.old`` is put back.
        """
        new, old = self._sibling(".new"), self._sibling(".old")
        if new.is_dir() and checkpoint_problem(new) is None:
            self._swap_in(new)
        elif not self.checkpoint_dir.exists() and old.is_dir() and checkpoint_problem(old) is None:
            os.rename(old, self.checkpoint_dir)
            _fsync_dir(self.checkpoint_dir.parent)

    def save_checkpoint(self, next_step: int) -> None:
        """Write adapters, optimizer states and logs crash-safely; ``next_step`` is where a resume starts.

        The files go to ``<dir>.new`` and are fsynced, ``manifest.json`` last; then the new directory is swapped
        in (:meth:`_swap_in`). The previous checkpoint is kept until the new one is complete, so a kill at any
        point leaves the last complete checkpoint for :meth:`load_checkpoint`.
        """
        self.checkpoint_dir.parent.mkdir(parents=True, exist_ok=True)
        self._finish_interrupted_save()
        tmp = self._sibling(".new")
        if tmp.exists():
            shutil.rmtree(tmp)  # an incomplete leftover of a killed save
        tmp.mkdir()
        state = {
            "adapters": {
                a: {
                    n: p.detach().clone()
                    for n, p in self.model.named_parameters()
                    if "lora_" in n and f".{a}." in n
                }
                for a in self.agents
            },
            "optimizers": {a: o.state_dict() for a, o in self.optimizers.items()},
        }
        buf = io.BytesIO()
        torch.save(state, buf)
        meta = {
            "next_step": next_step,
            "config": self.cfg.model_dump(),
            "resume_key": self.resume_key,
            "history": self.history,
            "curriculum": self.curriculum,
        }
        files = {
            "state.pt": _write_synced(tmp / "state.pt", buf.getvalue()),
            "trainer.json": _write_synced(tmp / "trainer.json", json.dumps(meta).encode()),
            "samples.jsonl": _write_synced(
                tmp / "samples.jsonl", "".join(json.dumps(x) + "\n" for x in self.samples).encode()
            ),
        }
        _write_synced(tmp / MANIFEST, json.dumps({"next_step": next_step, "files": files}).encode())
        _fsync_dir(tmp)
        self._swap_in(tmp)

    def _unfit(self, info: dict) -> str | None:
        """Why a complete checkpoint's ``trainer.json`` cannot be resumed by this run (``None``: it can)."""
        mine = {k: v for k, v in self.cfg.model_dump().items() if k != "num_steps"}
        theirs = {k: v for k, v in info.get("config", {}).items() if k != "num_steps"}
        if theirs != mine:
            changed = sorted(
                k for k in set(mine) | set(theirs) if mine.get(k, "<unset>") != theirs.get(k, "<unset>")
            )
            return f"made with other train_magrpo params ({', '.join(changed)})"
        if info.get("resume_key", "") != self.resume_key:
            return "made with other code, data or params of the stage's other sections"
        if self.cfg.curriculum != "none" and not info.get("curriculum"):
            return "without the curriculum this run needs"
        next_step = int(info["next_step"])
        if next_step > self.cfg.num_steps:
            return (
                f"a longer run's (next_step {next_step} > num_steps {self.cfg.num_steps}); a shorter run is "
                "trained afresh, never cut from a longer one"
            )
        return None

    def _restore(self, folder: Path) -> tuple[list[dict], list[dict]]:
        """Copy ``folder``'s adapters and optimizer states into the trainer; returns (history, samples).

        Raises whatever reading or applying fails with, leaving the model and optimizers as they were.
        """
        state = torch.load(folder / "state.pt", weights_only=False, map_location="cpu")
        params = dict(self.model.named_parameters())
        for a in self.agents:
            for n, t in state["adapters"][a].items():
                if n not in params or params[n].shape != t.shape:
                    raise ValueError(f"adapter weight {n} does not fit the model")
        before = {n: p.detach().clone() for n, p in params.items() if "lora_" in n}
        try:
            with torch.no_grad():
                for a in self.agents:
                    for n, t in state["adapters"][a].items():
                        params[n].copy_(t)
                    self.optimizers[a].load_state_dict(state["optimizers"][a])
        except BaseException:
            with torch.no_grad():
                for n, t in before.items():
                    params[n].copy_(t)
            self.optimizers = self._new_optimizers()
            raise
        history = json.loads((folder / "trainer.json").read_text())["history"]
        with open(folder / "samples.jsonl") as f:
            samples = [json.loads(line) for line in f if line.strip()]
        return history, samples

    def load_checkpoint(self) -> int:
        """Restore the newest complete checkpoint that fits this run; returns the step to start from (0: none).

        Candidates, newest first: ``<dir>.new`` (complete only when a save was killed just before its swap),
        ``<dir>``, ``<dir>.old`` (a save killed during its swap). An incomplete one, or one of other params,
        code or data, or of a longer run (``next_step > num_steps``), is skipped with a log line saying why.
        """
        for folder in (self._sibling(".new"), self.checkpoint_dir, self._sibling(".old")):
            if not folder.is_dir():
                continue
            problem = checkpoint_problem(folder)
            if problem is not None:
                log.warning("ignoring incomplete checkpoint %s: %s", folder, problem)
                continue
            info = json.loads((folder / "trainer.json").read_text())
            unfit = self._unfit(info)
            if unfit is not None:
                log.warning("checkpoint in %s is %s; not resuming it", folder, unfit)
                continue
            try:
                order = self._curriculum_order(info.get("curriculum"))  # before any state is restored
                self.history, self.samples = self._restore(folder)
            except Exception as e:
                log.warning(
                    "checkpoint in %s could not be loaded (%s: %s); not resuming it",
                    folder,
                    type(e).__name__,
                    e,
                )
                continue
            if order is not None:
                self.order, self.curriculum = order, info["curriculum"]
            return int(info["next_step"])
        if any(f.exists() for f in (self._sibling(".new"), self.checkpoint_dir, self._sibling(".old"))):
            log.warning(
                "no checkpoint in %s fits this run (see above); starting from scratch (num_steps %d)",
                self.checkpoint_dir,
                self.cfg.num_steps,
            )
        return 0

    def save_adapters(self, out_dir: str | Path) -> list[Path]:
        """Save each agent's adapter as a standard peft folder ``out_dir/<agent>``."""
        out_dir = Path(out_dir)
        paths = []
        for a in self.agents:
            shutil.rmtree(out_dir / a, ignore_errors=True)
            self.model.save_pretrained(str(out_dir / "_tmp"), selected_adapters=[a])
            src = out_dir / "_tmp" / a if (out_dir / "_tmp" / a).exists() else out_dir / "_tmp"
            shutil.move(str(src), str(out_dir / a))
            shutil.rmtree(out_dir / "_tmp", ignore_errors=True)
            paths.append(out_dir / a)
        return paths
