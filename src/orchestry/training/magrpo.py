"""MAGRPO training loop: rollout -> joint level reward -> group advantage -> one update per agent.

One shared frozen base with one LoRA adapter per agent (peft); both agents' completions of all problems of a
step are sampled in ONE batched ``generate`` call (per-row adapters). Checkpoints every
``checkpoint_every`` steps hold both adapters, both AdamW states and the step log, so an interrupted run
resumes where it stopped and reproduces the uninterrupted one (sampling is seeded per step).
"""

from __future__ import annotations

import json
import logging
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
    chat_prompt,
    completion_logprobs,
    generate,
)
from orchestry.problems import HELPER_SYSTEM, MAIN_SYSTEM, Problem
from orchestry.rewards.code import level_rewards

log = logging.getLogger("orchestry.magrpo")

AGENTS = ("helper", "main")


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

    # ------------------------------------------------------------------ rollout
    def problems_for_step(self, step: int) -> list[Problem]:
        P = self.cfg.problems_per_step
        idx = [self.order[(step * P + j) % len(self.order)] for j in range(P)]
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
            seed=self.cfg.seed * 1_000_003 + step,
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
        """One AdamW step per agent on the MAGRPO loss; rows with zero advantage are skipped when beta = 0."""
        adv = group_advantages(ro.rewards, self.cfg.advantage)
        flat_adv = adv.flatten()
        out = {}
        self.model.train()
        for a_idx, agent in enumerate(AGENTS):
            rows = ro.rows(a_idx)
            keep = [j for j, r in enumerate(rows) if self.cfg.beta > 0 or float(flat_adv[j]) != 0.0]
            opt = self.optimizers[agent]
            opt.zero_grad(set_to_none=True)
            if not keep:
                out[f"loss/{agent}"] = 0.0
                continue
            sel = torch.tensor([rows[j] for j in keep])
            seqs, mask = ro.batch.sequences[sel], ro.batch.attention_mask[sel]
            # trim columns that are padding in every kept row
            width = ro.batch.prompt_width
            first = int((mask[:, :width].sum(dim=0) > 0).float().argmax())
            last = int(mask.sum(dim=0).nonzero().max()) + 1
            seqs, mask, width = seqs[:, first:last], mask[:, first:last], width - first
            self.model.set_adapter(agent)
            ctx = torch.autocast("cpu", dtype=torch.bfloat16) if self.cfg.bf16_update else _nullctx()
            with ctx:
                seq_lp, tok_lp, tmask = completion_logprobs(self.model, seqs, mask, width)
                kl = None
                if self.cfg.beta > 0:
                    with torch.no_grad(), self.model.disable_adapter():
                        _, ref_lp, _ = completion_logprobs(self.model, seqs, mask, width)
                    kl = k3_kl(tok_lp, ref_lp, tmask)
            # loss over the full [N, G] grid: rows skipped have A = 0 and contribute nothing
            full = torch.zeros(len(rows))
            full = full.index_put((torch.tensor(keep),), seq_lp.float())
            kl_full = None
            if kl is not None:
                kl_full = torch.zeros(len(rows)).index_put((torch.tensor(keep),), kl.float()).view_as(adv)
            loss = policy_loss(full.view_as(adv), adv, kl_full, self.cfg.beta)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(adapter_parameters(self.model, agent), self.cfg.max_grad_norm)
            opt.step()
            opt.zero_grad(set_to_none=True)
            out[f"loss/{agent}"] = float(loss.detach())
            out[f"rows_updated/{agent}"] = len(keep)
        return out

    # ------------------------------------------------------------------ loop
    def train(self, progress: bool = True) -> list[dict]:
        start = self.load_checkpoint()
        if start:
            log.info("resuming MAGRPO from step %d (%s)", start, self.checkpoint_dir)
            for rec in self.history:
                if self.on_step:
                    self.on_step(rec)
        steps = range(start, self.cfg.num_steps)
        bar = None
        if progress:
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
            if self.on_step:
                self.on_step(rec)
            if bar:
                bar.update(1)
                bar.set_postfix(reward=f"{rec['reward']:.2f}", s=f"{rec['seconds']:.0f}")
            if (step + 1) % self.cfg.checkpoint_every == 0 or step + 1 == self.cfg.num_steps:
                self.save_checkpoint(step + 1)
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
            json.dumps({"next_step": next_step, "config": self.cfg.model_dump(), "history": self.history})
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
        if not same:
            log.warning(
                "checkpoint in %s was made with other params; starting from scratch", self.checkpoint_dir
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


class _nullctx:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False
