"""The API-GRPO loop: episodes of beam search, value estimation, behaviour library, with/without evaluation.

``run_api_grpo`` is what the ``train_api_grpo`` stage calls:

1. **clients** (:func:`orchestry.llm.clients.open_clients`, before any other work):
   backend from ``api_grpo.backend`` (a missing key, ``base_url`` or price, or an unreachable server raises
   here), behind the sqlite response cache and the cost tracker with the hard budget (training may spend
   ``1 - eval_budget_fraction`` of it; the rest is kept for the evaluation);
2. **training**: ``num_episodes`` episodes over the seeded-shuffled train problems, ``behavior_every`` (m)
   at a time in lockstep (:func:`orchestry.algorithms.api_grpo.beam_search`); the value of a trajectory is
   the task's executable reward R, mixed with the LLM judge when enabled:
   ``V = (1 - w) R + w R_max J / 10`` (J: the judge's weighted 0-10 score); after each block the behaviour
   library is re-extracted from all episodes so far (:mod:`orchestry.algorithms.behaviors`) and injected
   into the next episodes' prompts;
3. **evaluation**: on ``max_problems_eval`` test problems, ``eval_samples`` plain episodes (k = 1, beam
   width 1: the policy's own answers) per problem WITH the final guidelines and WITHOUT any, scored by the
   executable reward only; means with percentile-bootstrap CIs (``intervals`` params) and the paired difference;
4. **outputs** under ``out_dir``: ``episodes.jsonl``, ``rewards.csv``, ``learned_behaviors.json``,
   ``summary.json`` (tables: :mod:`orchestry.training.api_grpo.outputs`) -- rewritten after every block, so a
   budget stop or a crash keeps everything finished.

Transfer (``api_grpo.init_behaviors``: a ``learned_behaviors.json`` of another run, of any task): training starts
from that library instead of an empty one (a role this task lacks hands its guidelines to the role at the same
position in the turn order, see :meth:`orchestry.algorithms.behaviors.TransferredLibrary.mapped`) until a refresh
finds guidelines of its own; the evaluation adds a third arm, the transferred library as loaded, on the same
problems and sample numbers, and ``summary.json`` gets ``transfer`` (where the library came from, how its roles
were placed) and ``eval.transfer`` (none vs transferred vs learned here, paired differences). With the key null
every output is as before.

Human overrides (:mod:`orchestry.overrides`, ``data/overrides.jsonl``): a complete trajectory whose id has one
gets the person's score as its reward and its value (training and evaluation alike), so the advantages, the
behaviour library and the reported rewards use it; ``rewards.csv`` marks the row (``overridden``, with the
``automatic_reward`` beside it) and ``summary.json`` lists the applied overrides.

A budget stop (:class:`orchestry.llm.cost.BudgetExceeded`) ends the phase cleanly: the unfinished block is
dropped (its paid responses are in the cache, so a re-run with a larger budget replays them for free), the
outputs are written and ``summary.json`` says ``budget_status: exhausted``.

With the judge on, its agreement with the executable reward over the judged training trajectories
(:func:`orchestry.rewards.judge.judge_agreement`: Spearman's rho, quadratic-weighted Cohen's kappa) is logged
after every block (``train/judge/spearman``, ``train/judge/kappa``) and reported in ``summary.json`` (``judge.agreement``).
Progress bars (:mod:`orchestry.progress`): training per episode (live mean selected reward, best value, USD),
evaluation per turn (live mean reward of the turn's answers).
"""

from __future__ import annotations

import json
import logging
import math
import random
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from orchestry.algorithms.api_grpo import EpisodeSearch, Trajectory, beam_search
from orchestry.algorithms.behaviors import (
    Guideline,
    LibraryError,
    LibraryUpdate,
    TransferredLibrary,
    extract_behaviors,
)
from orchestry.llm.backends import ChatRequest
from orchestry.llm.clients import Clients, open_clients
from orchestry.llm.cost import BudgetExceeded
from orchestry.overrides import Override, apply_override, trajectory_id
from orchestry.paths import repo_relative
from orchestry.problems import Problem
from orchestry.progress import progress_bar
from orchestry.rewards.judge import Judge, judge_agreement, judge_prompt
from orchestry.runtime import OutputNotWritable, check_writable
from orchestry.tasks.common import Turn
from orchestry.training.api_grpo.outputs import (
    compare_arms,
    compare_transfer,
    cost_summary,
    override_summary,
    write_run_files,
)
from orchestry.training.api_grpo.setup import TASK_ROLES, make_task, read_transfer

if TYPE_CHECKING:
    from orchestry.config import ApiGrpoParams, SamplingParams
    from orchestry.sandbox import Sandbox

log = logging.getLogger("orchestry.training.api_grpo")

EVAL_SAMPLE_STRIDE = (
    1000  # visit/sample v of a problem uses sample indices v * 1000 + j (distinct cache entries)
)


def _render(turns: Sequence[Turn]) -> str:
    return "\n".join(f"[{t.role}]\n{t.text.strip()}" for t in turns)


def _result_line(reward: Mapping) -> str:
    reasons = "; ".join(reward.get("reasons", [])[:3])
    return (
        f"reward {reward.get('total', 0):.2f}, tests passed {reward.get('passed', 0)}/{reward.get('total_asserts', 0)}"
        + (f" ({reasons})" if reasons else "")
    )


class ApiGrpoRun:
    """One run of the loop (see the module docstring); :meth:`run` returns the summary dict.

    Args:
        cfg: the ``api_grpo`` params section; clients: from :func:`open_clients`.
        train_problems / test_problems: problem records (``data/problems/{train,test}.jsonl``).
        sandbox: an open :class:`orchestry.sandbox.Sandbox`.
        out_dir: where the four outputs go.
        on_metrics: ``(metrics, step)`` callback (the stage logs them to MLflow).
        confidence / n_boot: level and resamples of the evaluation's bootstrap CIs (``intervals`` params).
        progress: allow the progress bars (module docstring); ``False`` never draws them.
        overrides: human scores by trajectory id (:mod:`orchestry.overrides`, ``data/overrides.jsonl``): a
            complete trajectory with one gets the human score as its reward and value.
        transfer: the library to start from (:func:`orchestry.training.api_grpo.setup.read_transfer`); None
            reads ``cfg.init_behaviors`` (null: start empty, no transfer arm).
    """

    def __init__(
        self,
        cfg: ApiGrpoParams,
        clients: Clients,
        train_problems: Sequence[Problem],
        test_problems: Sequence[Problem],
        sandbox: Sandbox,
        out_dir: str | Path,
        on_metrics: Callable[[dict, int | None], None] | None = None,
        confidence: float = 0.95,
        n_boot: int = 1000,
        progress: bool = True,
        overrides: Mapping[str, Override] | None = None,
        transfer: TransferredLibrary | None = None,
    ):
        self.cfg, self.c, self.sandbox = cfg, clients, sandbox
        self.task = make_task(cfg)
        # tasks with their own items (the story specs) or a subset of the problems (documentation)
        if hasattr(self.task, "items"):
            train_problems, test_problems = self.task.items(train_problems, test_problems)
        if not train_problems:
            raise ValueError("api_grpo needs at least one train problem (data/problems/train.jsonl is empty)")
        self.parts: tuple[str, ...] = tuple(getattr(self.task, "reward_parts", ()))
        self.out = Path(out_dir)
        self.on_metrics = on_metrics or (lambda m, s: None)
        self.confidence, self.n_boot = confidence, n_boot
        self.progress = progress
        self.overrides = dict(overrides or {})
        order = list(train_problems)
        random.Random(cfg.seed).shuffle(order)
        self.train_order = order
        self.test_problems = list(test_problems)[: cfg.max_problems_eval]
        self.judge = None
        if clients.judge_chat is not None:
            j = cfg.judge
            self.judge = Judge(
                clients.judge_chat,
                {
                    "quality": j.quality_weight,
                    "collaboration": j.collaboration_weight,
                    "efficiency": j.efficiency_weight,
                },
                max_tokens=j.max_tokens,
                temperature=None if cfg.backend == "anthropic" else 0.0,
            )
        self.episodes: list[dict] = []  # completed episode records (train then eval)
        self.train_pool: list[tuple[Problem, Trajectory, float]] = []  # (problem, trajectory, advantage)
        self.updates: list[LibraryUpdate] = []
        self.behaviors: dict[str, str] = {}
        self.behaviors_version = 0
        # transfer: the starting library (version 0) and where it came from; None without api_grpo.init_behaviors
        self.transferred: dict[str, str] | None = None
        self.transfer_info: dict = {}
        transfer = transfer or read_transfer(cfg)
        if transfer is not None:
            placed, how = transfer.mapped(self.task.roles, TASK_ROLES.get(transfer.task, ()))
            self.transferred = placed
            self.behaviors = dict(placed)
            self.transfer_info = {
                "path": transfer.path,
                "task": transfer.task or None,  # None: the file does not say
                "version": transfer.version,
                **how,
                "behaviors": placed,
            }
            if how["unused_roles"] or not placed:
                log.warning(
                    "transferred library %s (task %s): guidelines of %s reach no agent of %s (roles %s)",
                    transfer.path, transfer.task or "not stated", how["unused_roles"] or "every role",
                    self.task.name, ", ".join(self.task.roles),
                )  # fmt: skip
        self.stop_reason = ""
        self.eval_summary: dict = {"status": "not run"}
        self.seconds: dict[str, float] = {}

    # ---- one block of episodes in lockstep ------------------------------------------------------------------
    def _search(
        self,
        phase: str,
        episode_ids: Sequence[str],
        problems: Sequence[Problem],
        behaviors: Sequence[Mapping[str, str]],
        sample_base: Sequence[int],
        k: int,
        beam_width: int,
        use_judge: bool,
        on_turn: Callable[[list[tuple[float, dict]]], None] | None = None,
    ) -> list[EpisodeSearch]:
        """One block of episodes in lockstep; ``on_turn(scored)`` is called after each turn's values."""
        c, task = self.c, self.task

        def sample(requests: list[tuple[int, Trajectory, int]]) -> list[Turn]:
            reqs, meta = [], []
            for e, traj, s in requests:
                role = task.roles[len(traj.turns)]
                system, user = task.messages(problems[e], traj.turns, behaviors[e])
                tags = (role, "agents", f"{phase}:{episode_ids[e]}")
                reqs.append(
                    ChatRequest(
                        (("user", user),),
                        system,
                        sample_base[e] + s,
                        c.max_tokens,
                        c.temperature,
                        c.top_p,
                        tags,
                    )
                )
                meta.append((role, system, user, sample_base[e] + s))
            results = c.chat.complete_batch(reqs)
            return [
                Turn(
                    role,
                    system,
                    user,
                    r.text,
                    s,
                    r.prompt_tokens,
                    r.completion_tokens,
                    r.usd,
                    r.cached,
                    r.stop_reason,
                )
                for (role, system, user, s), r in zip(meta, results, strict=True)
            ]

        def value(items: list[tuple[int, Trajectory]], final: bool) -> list[tuple[float, dict]]:
            probs = [problems[e] for e, _ in items]
            rewards = task.score(probs, [t.turns for _, t in items], self.sandbox)
            judged = [None] * len(items)
            if use_judge and self.judge is not None and (final or self.cfg.judge.on_partial):
                line = getattr(task, "result_line", _result_line)
                criteria = getattr(task, "judge_criteria", None)
                prompts = [
                    judge_prompt(
                        p.prompt, [(x.role, x.text, x.completion_tokens) for x in t.turns], line(r), criteria
                    )
                    for p, (_, t), r in zip(probs, items, rewards, strict=True)
                ]
                tags = [("judge", f"{phase}:{episode_ids[e]}") for e, _ in items]
                judged = self.judge.score(prompts, tags)
            out = []
            w = self.cfg.judge.weight
            for p, (_, t), r, j in zip(probs, items, rewards, judged, strict=True):
                human = None
                if len(t.turns) == len(task.roles) and self.overrides:
                    tid = trajectory_id(task.name, p.task_id, [(x.role, x.text) for x in t.turns])
                    human = self.overrides.get(tid)
                if human is not None:  # the person's score is the reward and the value (no judge mixed in)
                    r = apply_override(r, human)
                    v = human.score
                else:
                    v = (
                        r["total"]
                        if j is None
                        else (1 - w) * r["total"] + w * task.max_reward * j.combined / 10
                    )
                out.append((v, {"reward": r, "judge": j.to_dict() if j else None}))
            if on_turn is not None:
                on_turn(out)
            return out

        return beam_search(
            len(problems),
            len(task.roles),
            k,
            beam_width,
            sample,
            value,
            key=lambda t: tuple(x.text for x in t.turns),
        )

    def _record(self, phase: str, arm: str, ep_id: str, problem: Problem, res: EpisodeSearch, version: int,
                behaviors: Mapping[str, str]) -> dict:  # fmt: skip
        usage = self.c.tracker.by_tag[f"{phase}:{ep_id}"]
        trajs = []
        for i, (t, a) in enumerate(zip(res.group, res.advantages, strict=True)):
            trajs.append(
                {
                    "index": i,
                    "id": trajectory_id(self.task.name, problem.task_id, [(x.role, x.text) for x in t.turns]),
                    "value": t.value,
                    "advantage": a,
                    "selected": i == res.selected,
                    "in_final_beam": i in res.beam,
                    "reward": t.info.get("reward", {}),
                    "judge": t.info.get("judge"),
                    "turns": [x.to_dict() for x in t.turns],
                }
            )
        return {
            "phase": phase,
            "arm": arm,
            "episode": ep_id,
            "task": self.task.name,
            "task_id": problem.task_id,
            "max_reward": self.task.max_reward,
            "behaviors_version": version,
            "behaviors": dict(behaviors),
            "selected": res.selected,
            "history": res.history,
            "cost": {  # usd/tokens: what the episode's responses cost (cached ones at their first price)
                "usd": usage.consumed_usd,
                "tokens": usage.consumed_tokens,
                "spent_usd": usage.usd,  # sent in this run
                "new_tokens": usage.prompt_tokens + usage.completion_tokens,
                "calls": usage.calls,
                "cached_calls": usage.cached,
            },
            "trajectories": trajs,
        }

    # ---- training ---------------------------------------------------------------------------------------------
    def train(self) -> None:
        """Run the training episodes block by block, refreshing the library after each block."""
        cfg, t0 = self.cfg, time.time()
        m = cfg.behavior_every
        done = 0
        bar = progress_bar(cfg.num_episodes, "api_grpo: train", "episode", enable=self.progress)
        best = float("-inf")
        while done < cfg.num_episodes:
            ids = list(range(done, min(done + m, cfg.num_episodes)))
            problems = [self.train_order[e % len(self.train_order)] for e in ids]
            # a problem visited again (more episodes than problems) gets fresh sample indices, not cache hits
            base = [(e // len(self.train_order)) * EVAL_SAMPLE_STRIDE for e in ids]
            behaviors = dict(self.behaviors)
            try:
                results = self._search(
                    "train", [str(e) for e in ids], problems, [behaviors] * len(ids), base,
                    cfg.k_samples, cfg.beam_width, use_judge=True,
                )  # fmt: skip
            except BudgetExceeded as e:
                self.stop_reason = f"training stopped by the budget after {done} episodes: {e}"
                log.warning(self.stop_reason)
                break
            for e, p, res in zip(ids, problems, results, strict=True):
                rec = self._record("train", "train", str(e), p, res, self.behaviors_version, behaviors)
                self.episodes.append(rec)
                self.train_pool.extend((p, t, a) for t, a in zip(res.group, res.advantages, strict=True))
                self._log_episode(rec, e)
                best = max([best] + [t["value"] for t in rec["trajectories"]])
            done += len(ids)
            bar.update(len(ids))
            bar.set_postfix(
                reward=f"{self._mean_selected('train'):.3f}",
                best=f"{best:.3f}",
                usd=f"{self.c.tracker.total.usd:.4f}",
            )
            if self.judge is not None:
                agree = self.judge_agreement()
                self.on_metrics({f"train/judge/{k}": v for k, v in agree.items() if math.isfinite(v)}, done)
            try:
                self._refresh_library(done)
            except BudgetExceeded as e:
                self.stop_reason = f"training stopped by the budget while extracting behaviours: {e}"
                log.warning(self.stop_reason)
                break
            self.write_outputs()
            log.info(
                "episodes %d/%d: mean selected reward %.3f, spent %.4f USD, %d tokens, cache hit rate %.2f",
                done, cfg.num_episodes, self._mean_selected("train"), self.c.tracker.total.usd,
                self.c.tracker.total.prompt_tokens + self.c.tracker.total.completion_tokens,
                self.c.tracker.total.to_dict()["cache_hit_rate"],
            )  # fmt: skip
        bar.close()
        self.seconds["train"] = time.time() - t0

    def judge_agreement(self) -> dict[str, float]:
        """Agreement of the judge with the executable reward over the judged training trajectories so far
        (:func:`orchestry.rewards.judge.judge_agreement`); neutral fallbacks (no real judgment) are left out."""
        pairs = [
            (t["reward"].get("total", 0.0), t["judge"]["combined"])
            for r in self.episodes
            if r["phase"] == "train"
            for t in r["trajectories"]
            if t["judge"] and t["judge"]["how"] not in ("neutral", "error")
        ]
        return judge_agreement([a for a, _ in pairs], [b for _, b in pairs], self.task.max_reward)

    def _refresh_library(self, after_episode: int) -> None:
        feats, advs = [], []
        for p, t, a in self.train_pool:
            feats.append(self.task.features(p, t.turns, t.info.get("reward", {})))
            advs.append(a)
        update = extract_behaviors(
            feats,
            advs,
            self.task.feature_guides,
            after_episode,
            self.cfg.top_fraction,
            self.cfg.max_behaviors,
        )
        if self.judge is not None and self.cfg.judge.extract_behaviors and update.top and update.bottom:
            from orchestry.algorithms.behaviors import split_top_bottom

            top, bottom = split_top_bottom(advs, self.cfg.top_fraction)
            proposals = self.judge.guidelines(
                self.task.roles,
                [_render(self.train_pool[i][1].turns) for i in top[:3]],
                [_render(self.train_pool[i][1].turns) for i in bottom[:3]],
                self.cfg.max_behaviors,
                tags=("judge", "library"),
            )
            for role, lines in proposals.items():
                update.guidelines.extend(Guideline(role, line, "judge") for line in lines)
        self.updates.append(update)
        if update.guidelines:
            self.behaviors = update.behaviors()
            self.behaviors_version += 1
            log.info("behaviour library v%d: %s", self.behaviors_version, json.dumps(self.behaviors))
        else:
            log.info("behaviour library unchanged after episode %d: %s", after_episode, update.note)

    def _mean_selected(self, phase: str, part: str = "total") -> float:
        """Mean over ``phase``'s episodes of the selected trajectory's reward ``part`` (NaN without episodes)."""
        vals = [
            r["trajectories"][r["selected"]]["reward"].get(part, 0.0)
            for r in self.episodes
            if r["phase"] == phase
        ]
        return sum(vals) / len(vals) if vals else float("nan")

    def _log_episode(self, rec: dict, step: int) -> None:
        sel = rec["trajectories"][rec["selected"]]
        group = [t["value"] for t in rec["trajectories"]]
        snap = self.c.tracker.snapshot()
        self.on_metrics(
            {
                **{f"train/part/{k}": float(sel["reward"].get(k, 0.0)) for k in self.parts},
                "train/selected_reward": sel["reward"].get("total", 0.0),
                "train/selected_value": sel["value"],
                "train/group_mean_value": sum(group) / len(group),
                "train/group_max_value": max(group),
                "train/behaviors_version": rec["behaviors_version"],
                # spend per episode and so far (the run's totals are cost/... in the stage's summary)
                "train/episode_usd": rec["cost"]["usd"],
                "train/episode_tokens": rec["cost"]["tokens"],
                "train/usd": snap["usd"],
                "train/tokens": snap["tokens"],
                "train/calls": snap["calls"],
                "train/cached_calls": snap["cached_calls"],
                "train/budget_fraction": snap["budget_fraction"],
                "train/cache_hit_rate": snap["cache_hit_rate"],
            },
            step,
        )

    # ---- evaluation -------------------------------------------------------------------------------------------
    def evaluate(self) -> None:
        """Plain episodes on the test problems WITH the final guidelines and WITHOUT (see module docstring); with
        a transferred library also with that library as loaded (arm ``transferred``)."""
        t0 = time.time()
        if self.c.tracker.budget_usd is not None:
            self.c.tracker.limit_usd = self.c.tracker.budget_usd
        problems, base, ids, arms, behaviors = [], [], [], [], []
        arm_behaviors = [("with", self.behaviors), ("without", {})]
        if self.transferred is not None:
            arm_behaviors.append(("transferred", self.transferred))
        for arm, beh in arm_behaviors:
            for p in self.test_problems:
                for s in range(self.cfg.eval_samples):
                    problems.append(p)
                    base.append(s * EVAL_SAMPLE_STRIDE)
                    ids.append(f"{arm}:{p.task_id}:{s}")
                    arms.append(arm)
                    behaviors.append(beh)
        if not problems:
            self.eval_summary = {"status": "skipped: no test problems"}
            return
        bar = progress_bar(
            len(self.task.roles), f"api_grpo: eval {len(ids)} episodes", "turn", enable=self.progress
        )

        def on_turn(scored: list[tuple[float, dict]]) -> None:
            bar.update(1)
            bar.set_postfix(
                reward=f"{sum(info['reward'].get('total', 0.0) for _, info in scored) / len(scored):.3f}"
            )

        try:
            results = self._search(
                "eval", ids, problems, behaviors, base, 1, 1, use_judge=False, on_turn=on_turn
            )
        except BudgetExceeded as e:
            self.eval_summary = {"status": f"skipped: budget exhausted ({e})"}
            log.warning("evaluation skipped: %s", e)
            return
        finally:
            bar.close()
        rewards: dict[str, list[float]] = {a: [] for a, _ in arm_behaviors}
        parts: dict[str, dict[str, list[float]]] = {k: {a: [] for a, _ in arm_behaviors} for k in self.parts}
        for ep, p, arm, beh, res in zip(ids, problems, arms, behaviors, results, strict=True):
            rec = self._record("eval", arm, ep, p, res, self.behaviors_version if arm == "with" else 0, beh)
            self.episodes.append(rec)
            sel = rec["trajectories"][res.selected]["reward"]
            rewards[arm].append(sel.get("total", 0.0))
            for k in self.parts:
                parts[k][arm].append(float(sel.get(k, 0.0)))
        self.eval_summary = compare_arms(
            rewards["with"], rewards["without"], self.confidence, seed=self.cfg.seed, n_boot=self.n_boot
        )
        self.eval_summary.update(
            status="done",
            problems=len(self.test_problems),
            samples_per_problem=self.cfg.eval_samples,
            behaviors_learned=bool(self.behaviors),
            max_reward=self.task.max_reward,
        )
        if self.parts:  # each reward part (unweighted, 0-1) with vs without, same intervals
            self.eval_summary["parts"] = {
                k: compare_arms(
                    v["with"], v["without"], self.confidence, seed=self.cfg.seed, n_boot=self.n_boot
                )
                for k, v in parts.items()
            }
        if self.transferred is not None:  # none vs transferred vs learned here, same problems and samples
            conf, seed, n_boot = self.confidence, self.cfg.seed, self.n_boot
            self.eval_summary["transfer"] = {
                **compare_transfer(
                    rewards["without"], rewards["transferred"], rewards["with"], conf, seed, n_boot
                ),
                "learned_equals_transferred": self.behaviors == self.transferred,
                **(
                    {
                        "parts": {
                            k: compare_transfer(v["without"], v["transferred"], v["with"], conf, seed, n_boot)
                            for k, v in parts.items()
                        }
                    }
                    if self.parts
                    else {}
                ),
            }
        self.seconds["eval"] = time.time() - t0

    # ---- outputs ----------------------------------------------------------------------------------------------
    def summary(self) -> dict:
        """``summary.json``: eval comparison, training rewards, cost, cache, budget.

        Cost fields: ``usd_total``/``tokens_total``/``calls`` were spent in this run; ``consumed_*`` include
        the responses the cache served (at their original cost); ``usd_per_episode``/``tokens_per_episode``/
        ``calls_per_episode`` are consumed per training episode -- the price of an episode without a cache.
        """
        tr = self.c.tracker
        train_eps = [r for r in self.episodes if r["phase"] == "train"]
        n = len(train_eps)
        groups = [t["value"] for r in train_eps for t in r["trajectories"]]
        total = tr.total.to_dict()
        by_tag = {tag: u.to_dict() for tag, u in sorted(tr.by_tag.items()) if ":" not in tag}
        return {
            "task": self.task.name,
            "backend": self.c.chat.backend,
            "model": self.c.chat.model,
            "max_reward": self.task.max_reward,
            "episodes_planned": self.cfg.num_episodes,
            "episodes_completed": n,
            "stopped_early": bool(self.stop_reason),
            "stop_reason": self.stop_reason,
            "train": {
                "mean_selected_reward": self._mean_selected("train"),
                "mean_group_value": sum(groups) / len(groups) if groups else float("nan"),
                "trajectories": len(groups),
                **(
                    {"mean_selected_parts": {k: self._mean_selected("train", k) for k in self.parts}}
                    if self.parts
                    else {}
                ),
            },
            "eval": self.eval_summary,
            "behaviors": {"version": self.behaviors_version, "final": self.behaviors},
            "cost": cost_summary(total, by_tag, train_eps, self.c.chat.inner.price),
            "cache": {
                "hit_rate": total["cache_hit_rate"],
                "entries": len(self.c.cache),
                "path": repo_relative(self.c.cache.path),
            },
            "budget": {  # the budget covers the experiment (scope) across runs: earlier runs' spend counts
                "budget_usd": tr.budget_usd,
                "spent_usd": tr.spent_total_usd,
                "spent_this_run_usd": tr.total.usd,
                "spent_before_usd": tr.earlier_usd,
                "scope": tr.scope,
                "fraction": tr.budget_fraction(),
                "status": tr.status,
                "eval_budget_fraction": self.cfg.eval_budget_fraction,
            },
            "judge": {
                "enabled": self.judge is not None,
                "calls": self.judge.calls if self.judge else 0,
                "neutral_fallbacks": self.judge.failures if self.judge else 0,
                **({"agreement": self.judge_agreement()} if self.judge else {}),
            },
            "overrides": override_summary(self.episodes, len(self.overrides), self.overrides),
            **({"transfer": self.transfer_info} if self.transferred is not None else {}),
            "seconds": self.seconds,
        }

    def write_outputs(self) -> dict:
        """Write the four outputs (atomically per file) and return the summary."""
        summary = self.summary()
        library = {
            "task": self.task.name,
            "version": self.behaviors_version,
            "behaviors": self.behaviors,
            "top_fraction": self.cfg.top_fraction,
            "behavior_every": self.cfg.behavior_every,
            "updates": [u.to_dict() for u in self.updates],
            **({"transferred_from": self.transfer_info} if self.transferred is not None else {}),
        }
        write_run_files(self.out, self.episodes, self.parts, library, summary)
        return summary

    def run(self) -> dict:
        """Train, evaluate, write the outputs; returns the summary. Budget stops end cleanly (see module)."""
        self.train()
        self.evaluate()
        return self.write_outputs()


def run_api_grpo(
    cfg: ApiGrpoParams,
    sampling: SamplingParams,
    train_problems: Sequence[Problem],
    test_problems: Sequence[Problem],
    sandbox_factory: Callable[[], Sandbox],
    out_dir: str | Path = "reports/api_grpo",
    model_path: str = "models/base",
    model_dtype: str = "float32",
    on_metrics: Callable[[dict, int | None], None] | None = None,
    cache_path: str | Path | None = None,
    clients: Clients | None = None,
    confidence: float = 0.95,
    n_boot: int = 1000,
    progress: bool = True,
    overrides: Mapping[str, Override] | None = None,
) -> dict:
    """Open the clients (all checks first), then the sandbox, and run (see the module docstring).

    Args:
        sandbox_factory: returns a :class:`orchestry.sandbox.Sandbox` context manager (opened only after
            the clients passed their checks).
        clients: already opened clients (from :func:`open_clients`); closed at the end either way.
        confidence / n_boot: level and resamples of the evaluation's bootstrap CIs (``intervals`` params).
        progress: allow the progress bars (:mod:`orchestry.progress`).
        overrides: human scores by trajectory id (:func:`orchestry.overrides.read_overrides`).

    Returns:
        The summary dict (also written to ``out_dir/summary.json``).

    Raises:
        LibraryError: ``api_grpo.init_behaviors`` names a missing or malformed library (before the clients).
        OutputNotWritable: ``out_dir`` cannot be written (before the sandbox or any request).
        BackendConfigError, PriceError: before any work (see :func:`open_clients`).
    """
    try:
        transfer = read_transfer(cfg)
        check_writable(out_dir, "api_grpo's outputs")  # before the sandbox and any paid request
    except (LibraryError, OutputNotWritable):
        if clients is not None:
            clients.close()
        raise
    clients = clients or open_clients(cfg, sampling, model_path, model_dtype, cache_path)
    try:
        with sandbox_factory() as sandbox:
            run = ApiGrpoRun(
                cfg, clients, train_problems, test_problems, sandbox, out_dir, on_metrics, confidence, n_boot,
                progress, overrides, transfer,
            )  # fmt: skip
            summary = run.run()
    finally:
        clients.close()
    return summary
