"""MAGRPO training loop: rollout -> joint level reward -> group advantage -> one update per agent.

One shared frozen base with one LoRA adapter per agent (peft); both agents' completions of all problems of a
step are sampled in ONE batched ``generate`` call (per-row adapters). Checkpoints every
``checkpoint_every`` steps hold both adapters, both AdamW states and the step log, so an interrupted run
resumes where it stopped and reproduces the uninterrupted one (sampling is seeded per step).
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from orchestry.algorithms.magrpo import group_advantages, k3_kl, policy_loss
from orchestry.config import SamplingParams, TrainMagrpoParams
from orchestry.llm.local import (
    GenerationBatch,
    adapter_parameters,
    bf16_autocast,
    chat_prompt,
    completion_logprobs,
    generate,
)
from orchestry.problems import HELPER_SYSTEM, MAIN_SYSTEM, Problem
from orchestry.rewards.code import level_rewards

log = logging.getLogger("orchestry.magrpo")

AGENTS = ("helper", "main")
ACTIVATION_BYTES_PER_TOKEN = 3_500_000  # fp32 forward+backward, 135M model (measured: benchmarks/README.md)
MAX_MICRO_BATCH_TOKENS = 1024  # larger micro-batches were slower on CPU (measured: benchmarks/README.md)


def _process_group() -> tuple[int, int]:
    """``(rank, world size)``. Processes started by ``accelerate launch`` (or ``torchrun``) train one model data-
    parallel through accelerate's process group (gloo on CPU, NCCL on GPUs); a lone process is ``(0, 1)``."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return 0, 1
    from accelerate import PartialState

    state = PartialState(cpu=not torch.cuda.is_available())  # without GPUs: gloo over CPU processes
    return state.process_index, state.num_processes


def _model_scale(model) -> float:
    """Activation memory relative to the embedded 135M model (30 layers x 576 hidden), from the config."""
    cfg = getattr(model, "config", None)
    layers, hidden = getattr(cfg, "num_hidden_layers", 30), getattr(cfg, "hidden_size", 576)
    return max(0.01, layers * hidden / (30 * 576))


@dataclass
class Rollout:
    """One step's samples. Rows of ``batch`` are ordered [problem n][agent a][generation g]."""

    problems: list[Problem]
    batch: GenerationBatch
    rewards: torch.Tensor  # [N, G] joint rewards
    details: list[dict]  # N*G reward breakdowns (LevelReward.to_dict()) + texts
    G: int
    reward_seconds: float = 0.0

    def rows(self, agent_index: int) -> list[int]:
        n_agents = len(AGENTS)
        return [
            (n * n_agents + agent_index) * self.G + g
            for n in range(len(self.problems))
            for g in range(self.G)
        ]


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
        micro_batch_tokens_limit: tokens per training micro-batch (None: sized to the memory available).
        resume_key: fingerprint of the run's other inputs (code, data, params beyond ``cfg``); a checkpoint is
            resumed only when its key and ``cfg`` (except ``num_steps``) are the same, so an interrupted run
            resumes while a run whose inputs changed starts afresh.
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

    def __post_init__(self):
        self.checkpoint_dir = Path(self.checkpoint_dir)
        self.optimizers = {
            a: torch.optim.AdamW(
                adapter_parameters(self.model, a),
                lr=self.cfg.learning_rate,
                weight_decay=self.cfg.weight_decay,
            )
            for a in AGENTS
        }
        for a in AGENTS:
            if not self.optimizers[a].param_groups[0]["params"]:
                raise ValueError(f"model has no LoRA parameters for agent {a!r}")
        order = list(range(len(self.problems)))
        random.Random(self.cfg.seed).shuffle(order)
        self.order = order
        self.rank, self.world_size = _process_group()

    # ------------------------------------------------------------------ rollout
    def problems_for_step(self, step: int) -> list[Problem]:
        """This process's ``problems_per_step`` problems of ``step`` (processes take consecutive slices)."""
        P = self.cfg.problems_per_step
        start = (step * self.world_size + self.rank) * P
        idx = [self.order[(start + j) % len(self.order)] for j in range(P)]
        return [self.problems[i] for i in idx]

    def rollout(self, problems: Sequence[Problem], step: int) -> Rollout:
        G = self.cfg.num_generations
        prompts, adapters = [], []
        for p in problems:
            hp = chat_prompt(self.tokenizer, p.helper_prompt(), HELPER_SYSTEM)
            mp = chat_prompt(self.tokenizer, p.main_prompt(), MAIN_SYSTEM)
            for agent, prompt in zip(AGENTS, (hp, mp), strict=True):
                prompts += [prompt] * G
                adapters += [agent] * G
        batch = generate(
            self.model,
            self.tokenizer,
            prompts,
            adapters,
            max_new_tokens=self.sampling.max_completion_length,
            temperature=self.sampling.temperature,
            top_p=self.sampling.top_p,
            seed=self.cfg.seed * 1_000_003 + step + 7919 * self.rank,
        )
        t0 = time.time()
        probs, helpers, mains = [], [], []
        for n, p in enumerate(problems):
            for g in range(G):
                probs.append(p)
                helpers.append(batch.items[(n * 2 + 0) * G + g].text)
                mains.append(batch.items[(n * 2 + 1) * G + g].text)
        if self.reward_fn is not None:
            results = self.reward_fn(probs, helpers, mains)
        else:
            results = level_rewards(probs, helpers, mains, self.sandbox)
        rewards = torch.tensor([r.total for r in results], dtype=torch.float32).view(len(problems), G)
        details = []
        for i, r in enumerate(results):
            d = r.to_dict()
            d.update(task_id=probs[i].task_id, generation=i % G, helper=helpers[i], main=mains[i])
            details.append(d)
        return Rollout(list(problems), batch, rewards, details, G, time.time() - t0)

    # ------------------------------------------------------------------ update
    def update(self, ro: Rollout) -> dict:
        """One AdamW step per agent on the MAGRPO loss; rows with zero advantage are skipped when beta = 0.

        An agent's rows go through the model in micro-batches of whole problems (prompt + kept completions) of at
        most :meth:`micro_batch_tokens` tokens, one backward each; the loss is a sum over rows, so the accumulated
        gradient equals the one-batch gradient while peak memory stays bounded.
        """
        adv = group_advantages(ro.rewards, self.cfg.advantage)
        flat_adv = adv.flatten()
        out = {}
        self.model.train()
        for a_idx, agent in enumerate(AGENTS):
            rows = ro.rows(a_idx)
            keep = [j for j, r in enumerate(rows) if self.cfg.beta > 0 or float(flat_adv[j]) != 0.0]
            opt = self.optimizers[agent]
            opt.zero_grad(set_to_none=True)
            if not keep and self.world_size == 1:
                out[f"loss/{agent}"] = 0.0
                continue
            self.model.set_adapter(agent)
            loss_value = 0.0
            for chunk in self._micro_batches(ro, rows, keep):
                sel = torch.tensor([rows[j] for j in chunk])
                seqs, mask = ro.batch.sequences[sel], ro.batch.attention_mask[sel]
                # trim columns that are padding in every row of the micro-batch
                width = ro.batch.prompt_width
                first = int((mask[:, :width].sum(dim=0) > 0).float().argmax())
                last = int(mask.sum(dim=0).nonzero().max()) + 1
                seqs, mask, width = seqs[:, first:last], mask[:, first:last], width - first
                with bf16_autocast(self.model, self.cfg.bf16_update):
                    seq_lp, tok_lp, tmask = completion_logprobs(self.model, seqs, mask, width)
                    kl = None
                    if self.cfg.beta > 0:
                        with torch.no_grad(), self.model.disable_adapter():
                            _, ref_lp, _ = completion_logprobs(self.model, seqs, mask, width)
                        kl = k3_kl(tok_lp, ref_lp, tmask)
                # loss over the full [N, G] grid: rows outside this micro-batch (or skipped, A = 0) add nothing
                dev = seq_lp.device
                idx = torch.tensor(chunk, device=dev)
                full = torch.zeros(len(rows), device=dev).index_put((idx,), seq_lp.float())
                kl_full = None
                if kl is not None:
                    kl_full = torch.zeros(len(rows), device=dev).index_put((idx,), kl.float()).view_as(adv)
                loss = policy_loss(full.view_as(adv), adv.to(dev), kl_full, self.cfg.beta)
                loss.backward()
                loss_value += float(loss.detach())
            if self.world_size > 1 and not self._average_gradients(agent, len(keep)):
                out[f"loss/{agent}"] = 0.0  # no process had a row with a non-zero advantage
                continue
            torch.nn.utils.clip_grad_norm_(adapter_parameters(self.model, agent), self.cfg.max_grad_norm)
            opt.step()
            opt.zero_grad(set_to_none=True)
            out[f"loss/{agent}"] = loss_value
            out[f"rows_updated/{agent}"] = len(keep)
        return out

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
        """Token budget of one training micro-batch: ``self.micro_batch_tokens_limit`` if set, else sized to memory.

        A token held for the backward pass costs about ``ACTIVATION_BYTES_PER_TOKEN`` (measured on the embedded
        135M model, fp32; scaled by layers x hidden size for other models); the budget is an eighth of the memory
        available now, at most ``MAX_MICRO_BATCH_TOKENS`` and at least 128 tokens.
        """
        if self.micro_batch_tokens_limit:
            return int(self.micro_batch_tokens_limit)
        try:
            available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            available = 8 << 30
        per_token = ACTIVATION_BYTES_PER_TOKEN * _model_scale(self.model)
        return int(min(MAX_MICRO_BATCH_TOKENS, max(128, available / 8 / per_token)))

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
            lengths = [int(mask[rows[j], P:].sum()) for j in members]
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
        steps = range(start, self.cfg.num_steps)
        bar = None
        if progress and self.rank == 0:
            from tqdm import tqdm

            bar = tqdm(total=self.cfg.num_steps, initial=start, desc="MAGRPO", unit="step")
        for step in steps:
            t0 = time.time()
            problems = self.problems_for_step(step)
            ro = self.rollout(problems, step)
            t1 = time.time()
            upd = self.update(ro)
            t2 = time.time()
            rec = self._step_record(step, ro, upd, gen_s=ro.batch.seconds, upd_s=t2 - t1, total_s=t2 - t0)
            self.history.append(rec)
            for d in ro.details:
                self.samples.append({"step": step, **d})
            if self.on_step and self.rank == 0:  # one log per run, from the main process
                self.on_step(rec)
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

    def _step_record(self, step, ro: Rollout, upd: dict, gen_s: float, upd_s: float, total_s: float) -> dict:
        det = ro.details
        n = len(det)
        items = ro.batch.items
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
            "tokens/prompt": sum(i.prompt_tokens for i in items),
            "tokens/completion": sum(i.completion_tokens for i in items),
            "seconds/generate": gen_s,
            "seconds/reward": ro.reward_seconds,
            "seconds/update": upd_s,
            "seconds": total_s,
            "problems": [p.task_id for p in ro.problems],
        }
        rec.update(upd)
        return rec

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(self, next_step: int) -> None:
        """Atomically write adapters, optimizer states and logs; ``next_step`` is where a resume starts."""
        tmp = self.checkpoint_dir.with_name(self.checkpoint_dir.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        state = {
            "adapters": {
                a: {
                    n: p.detach().clone()
                    for n, p in self.model.named_parameters()
                    if "lora_" in n and f".{a}." in n
                }
                for a in AGENTS
            },
            "optimizers": {a: o.state_dict() for a, o in self.optimizers.items()},
        }
        torch.save(state, tmp / "state.pt")
        (tmp / "trainer.json").write_text(
            json.dumps(
                {
                    "next_step": next_step,
                    "config": self.cfg.model_dump(),
                    "resume_key": self.resume_key,
                    "history": self.history,
                }
            )
        )
        with open(tmp / "samples.jsonl", "w") as f:
            for s in self.samples:
                f.write(json.dumps(s) + "\n")
        shutil.rmtree(self.checkpoint_dir, ignore_errors=True)
        tmp.rename(self.checkpoint_dir)

    def load_checkpoint(self) -> int:
        """Restore from ``checkpoint_dir`` if it holds a checkpoint of the same config; returns the next step."""
        meta = self.checkpoint_dir / "trainer.json"
        if not meta.exists():
            return 0
        info = json.loads(meta.read_text())
        same = {k: v for k, v in info["config"].items() if k != "num_steps"} == {
            k: v for k, v in self.cfg.model_dump().items() if k != "num_steps"
        }
        if not same or info.get("resume_key", "") != self.resume_key:
            log.warning(
                "checkpoint in %s was made with other params, code or data; starting from scratch",
                self.checkpoint_dir,
            )
            return 0
        state = torch.load(self.checkpoint_dir / "state.pt", weights_only=False)
        params = dict(self.model.named_parameters())
        with torch.no_grad():
            for a in AGENTS:
                for n, t in state["adapters"][a].items():
                    params[n].copy_(t)
                self.optimizers[a].load_state_dict(state["optimizers"][a])
        self.history = info["history"]
        with open(self.checkpoint_dir / "samples.jsonl") as f:
            self.samples = [json.loads(line) for line in f if line.strip()]
        return min(int(info["next_step"]), self.cfg.num_steps)

    def save_adapters(self, out_dir: str | Path) -> list[Path]:
        """Save each agent's adapter as a standard peft folder ``out_dir/<agent>``."""
        out_dir = Path(out_dir)
        paths = []
        for a in AGENTS:
            shutil.rmtree(out_dir / a, ignore_errors=True)
            self.model.save_pretrained(str(out_dir / "_tmp"), selected_adapters=[a])
            src = out_dir / "_tmp" / a if (out_dir / "_tmp" / a).exists() else out_dir / "_tmp"
            shutil.move(str(src), str(out_dir / a))
            shutil.rmtree(out_dir / "_tmp", ignore_errors=True)
            paths.append(out_dir / a)
        return paths
