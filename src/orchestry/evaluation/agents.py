"""Base agents vs MAGRPO-trained adapters on a set of problems: what the ``evaluate`` stage computes.

:func:`evaluate_agents` samples both agent pairs from one peft model (the base pair with the adapters disabled,
as the naive ``concat`` method; the trained pair with the ``helper``/``main`` adapters, as ``magrpo``), scores
every sample with the level reward in the sandbox and summarises each pair with
:func:`orchestry.analysis.metrics.summarize` (pass@k, accuracy@k, mean reward with its bootstrap interval over problems,
each level, cooperation rate, tokens). ``orchestry evaluate`` runs it on any HumanEval-format file.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from orchestry.config import IntervalsParams, SamplingParams
from orchestry.problems import AGENTS, HELPER_SYSTEM, MAIN_SYSTEM, Problem
from orchestry.rewards.code import level_rewards
from orchestry.tasks.multi_turn import feedback_text, next_turn_prompts

#: Per-sample metrics of the trained-minus-base comparison (:func:`trained_minus_base`).
PAIRED_METRICS = ("pass", "total", "coop_rate", "aux_called", "truncated")

#: The evaluated agent pairs, in order: ``(name, uses the trained adapters)``.
PAIRS: tuple[tuple[str, bool], ...] = (("base", False), ("magrpo", True))
PAIR_NAMES: tuple[str, ...] = tuple(name for name, _ in PAIRS)


def entry_points(problems: Sequence[Problem]) -> dict[str, str]:
    """``task_id -> entry point`` of ``problems``: where :func:`orchestry.analysis.metrics.summarize` judges the
    chain form of main's code."""
    return {p.task_id: p.entry_point for p in problems}


def _selected(pairs: Sequence[str], model) -> list[tuple[str, bool]]:
    """The entries of :data:`PAIRS` named in ``pairs``, in :data:`PAIRS` order.

    Raises:
        ValueError: a name is not a pair's, or a pair with adapters is asked of a model without peft adapters
            (its samples would be the base model's under the trained pair's name).
    """
    from orchestry.llm.loading import has_adapters

    unknown = sorted(set(pairs) - set(PAIR_NAMES))
    if unknown:
        raise ValueError(f"unknown pair(s) {unknown}: the pairs are {list(PAIR_NAMES)}")
    chosen = [(name, adapters) for name, adapters in PAIRS if name in pairs]
    if any(adapters for _, adapters in chosen) and not has_adapters(model):
        raise ValueError("the trained pair needs a peft model with the agents' adapters; this model has none")
    return chosen


class AdaptersError(ValueError):
    """An adapters folder lacks a ``helper``/``main`` peft adapter; the message names the folder."""


def check_adapters(folder: str | Path) -> Path:
    """``folder`` if it holds ``helper/adapter_config.json`` and ``main/adapter_config.json`` (peft adapters,
    ``train_magrpo``'s output layout).

    Raises:
        AdaptersError: the folder is missing, or an agent's adapter is.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise AdaptersError(f"{folder} is not a folder (train the adapters with `dvc repro train_magrpo`)")
    missing = [a for a in AGENTS if not (folder / a / "adapter_config.json").is_file()]
    if missing:
        raise AdaptersError(
            f"{folder} has no peft adapter for {' and '.join(missing)} "
            f"(expected {', '.join(f'{a}/adapter_config.json' for a in AGENTS)})"
        )
    return folder


def evaluate_agents(
    problems: Sequence[Problem],
    model,
    tokenizer,
    sandbox,
    sampling: SamplingParams,
    num_samples: int,
    seed: int,
    batch_size: int,
    intervals: IntervalsParams,
    progress: bool = True,
    turns: int = 1,
    pairs: Sequence[str] = PAIR_NAMES,
) -> Iterator[tuple[str, list[dict], dict]]:
    """Sample and score the base pair, then the trained pair; yield ``(name, records, summary)`` for each.

    With ``turns > 1`` each pair runs the episode it was trained in (:func:`later_turns`): a sample that did not
    pass every assert gets turn t+1 with the sandbox's feedback on turn t; its record is the last turn's.

    Args:
        model: a peft model with adapters named ``helper`` and ``main`` (:func:`orchestry.runtime.load_policy`);
            for the base pair alone also the bare base model (the same samples: the adapters are off).
        num_samples: samples per problem (the k of pass@k; pass@1 is always reported).
        seed: sampling seed; both pairs use the same one, so they differ only by the adapters.
        intervals: level and bootstrap resamples of the confidence intervals.
        pairs: the pairs to run, in :data:`PAIRS` order (the ``evaluate_base`` stage runs ``("base",)``, the
            ``evaluate`` stage ``("magrpo",)``).

    Yields:
        ``("base", records, summary)`` then ``("magrpo", records, summary)``: one record per (problem, sample)
        (:func:`orchestry.evaluation.baselines.run_method`; base records carry ``method="base"``) and the
        :func:`orchestry.analysis.metrics.summarize` dict plus ``seconds`` (wall seconds of the pair).

    Raises:
        ValueError: ``pairs`` names a pair not in :data:`PAIRS`.
    """
    from orchestry.analysis.metrics import summarize
    from orchestry.evaluation.baselines import run_method
    from orchestry.llm.loading import has_adapters

    ks = sorted({1, num_samples})
    for name, use_adapters in _selected(pairs, model):
        t0 = time.time()
        if use_adapters:
            recs = run_method("magrpo", problems, model, tokenizer, sandbox, sampling, num_samples, seed,
                              batch_size, adapters=True, progress=progress)  # fmt: skip
            recs = later_turns(
                recs, problems, model, tokenizer, sandbox, sampling, seed, batch_size, turns, True
            )
        else:
            with model.disable_adapter() if has_adapters(model) else contextlib.nullcontext():
                recs = run_method("concat", problems, model, tokenizer, sandbox, sampling, num_samples, seed,
                                  batch_size, progress=progress)  # fmt: skip
                recs = later_turns(recs, problems, model, tokenizer, sandbox, sampling, seed, batch_size, turns,
                                   False)  # fmt: skip
            for r in recs:
                r["method"] = "base"
        summary = summarize(recs, ks, intervals.confidence, intervals.resamples, entry_points(problems))
        summary["seconds"] = time.time() - t0
        yield name, recs, summary


def later_turns(
    records: list[dict],
    problems: Sequence[Problem],
    model,
    tokenizer,
    sandbox,
    sampling: SamplingParams,
    seed: int,
    batch_size: int,
    turns: int,
    adapters: bool,
) -> list[dict]:
    """Turns 2..``turns`` of the helper/main episode for the records of turn 1 (``run_method``'s).

    As in training (``train_magrpo.turns``, :mod:`orchestry.tasks.multi_turn`): a sample that did not pass every
    assert gets new prompts with the sandbox's feedback on its last turn (each failing assert with its error)
    and main sees the helper's last ``aux``; samples that passed stop. Tokens and seconds add up over the turns;
    ``turns_run`` counts them. The feedback quotes the failing asserts, so a multi-turn pass@1 is "with execution
    feedback" (the MAGRPO paper's multi-turn setting) and not comparable to a one-turn figure.

    Returns:
        the records, each replaced by its last turn's (same order).
    """
    from orchestry.llm.local import chat_prompt
    from orchestry.llm.sampling import sample_texts

    by_id = {p.task_id: p for p in problems}
    records = [dict(r, turns_run=1) for r in records]
    for t in range(1, turns):
        todo = [i for i, r in enumerate(records) if not r.get("pass")]
        if not todo:
            break
        pairs = []
        for i in todo:
            r = records[i]
            p = by_id[r["task_id"]]
            pairs.append(next_turn_prompts(p, r["helper"], r["main"], feedback_text(p, r)))
        prompts = [chat_prompt(tokenizer, h, HELPER_SYSTEM) for h, _ in pairs]
        prompts += [chat_prompt(tokenizer, m, MAIN_SYSTEM) for _, m in pairs]
        agents = ["helper"] * len(todo) + ["main"] * len(todo) if adapters else None
        gens = sample_texts(model, tokenizer, prompts, agents, sampling, seed + 300_000 * t, batch_size)
        hs, ms = gens[: len(todo)], gens[len(todo) :]
        rewards = level_rewards([by_id[records[i]["task_id"]] for i in todo], [h.text for h in hs],
                                [m.text for m in ms], sandbox,
                                truncated=[h.truncated or m.truncated for h, m in zip(hs, ms, strict=True)])  # fmt: skip
        for i, h, m, rw in zip(todo, hs, ms, rewards, strict=True):
            old = records[i]
            records[i] = {
                **old,
                "helper": h.text,
                "main": m.text,
                **rw.to_dict(),
                "pass": rw.all_passed,
                "helper_truncated": h.truncated,
                "main_truncated": m.truncated,
                "prompt_tokens": old["prompt_tokens"] + h.prompt_tokens + m.prompt_tokens,
                "completion_tokens": old["completion_tokens"] + h.completion_tokens + m.completion_tokens,
                "seconds": old["seconds"] + h.seconds + m.seconds,
                "turns_run": t + 1,
            }
    return records


def evaluate_workflow(
    problems: Sequence[Problem],
    model,
    tokenizer,
    sandbox,
    sampling: SamplingParams,
    num_samples: int,
    seed: int,
    intervals: IntervalsParams,
    pairs: Sequence[str] = PAIR_NAMES,
) -> Iterator[tuple[str, list[dict], dict]]:
    """The writer -> tester -> fixer workflow (``train_magrpo.workflow: writer_tester_fixer``) without and with
    its trained adapters: yields ``("base", records, summary)`` then ``("magrpo", records, summary)`` (those of
    them named in ``pairs``, as :func:`evaluate_agents`).

    Each record is one episode (:func:`orchestry.training.magrpo.workflow_rollout`, ``num_samples`` per
    problem, the same seed for both): the single-agent level reward of the fixer's final code (0..2.1; no
    cooperation level), ``main`` = the fixer's code, ``helper`` empty, plus the writer's and tester's texts and
    the tester's report; tokens are the three agents' together.

    Args:
        model: a peft model with adapters ``writer``, ``tester``, ``fixer``; for the base episodes alone also the
            bare base model.

    Raises:
        ValueError: ``pairs`` names a pair not in :data:`PAIRS`.
    """
    from orchestry.analysis.metrics import summarize
    from orchestry.llm.loading import has_adapters
    from orchestry.training.magrpo.common import BASE, WORKFLOW_AGENTS
    from orchestry.training.magrpo.workflows import workflow_rollout

    agents = WORKFLOW_AGENTS["writer_tester_fixer"]
    ks = sorted({1, num_samples})
    bare = BASE if has_adapters(model) else None  # peft's per-row name of the bare model
    for name, use_adapters in _selected(pairs, model):
        adapters = agents if use_adapters else (bare,) * len(agents)
        t0 = time.time()
        batches, details, _ = workflow_rollout(
            model, tokenizer, problems, num_samples, sandbox, sampling, seed, adapters
        )
        recs = []
        for i, d in enumerate(details):
            items = [batches[a].items[i] for a in agents]
            recs.append({**d, "method": name, "sample": d["generation"],
                         "prompt_tokens": sum(it.prompt_tokens for it in items),
                         "completion_tokens": sum(it.completion_tokens for it in items)})  # fmt: skip
        summary = summarize(recs, ks, intervals.confidence, intervals.resamples, entry_points(problems))
        summary["seconds"] = time.time() - t0
        yield name, recs, summary


def evaluated_turns(params) -> int:
    """The turns an evaluated episode runs: ``evaluate.turns``, or when null ``train_magrpo.turns`` (the episode
    the policy was trained in)."""
    return params.evaluate.turns or params.train_magrpo.turns


def score_pairs(problems: Sequence[Problem], model, tokenizer, sandbox, params,
                pairs: Sequence[str] = PAIR_NAMES) -> list[tuple[str, list[dict], dict]]:  # fmt: skip
    """The pairs named in ``pairs`` on ``problems`` with the ``evaluate`` settings of ``params`` (a
    :class:`orchestry.config.Params`): the writer -> tester -> fixer episodes (:func:`evaluate_workflow`) when
    ``train_magrpo.workflow`` is ``writer_tester_fixer``, else the helper/main pairs (:func:`evaluate_agents`),
    :func:`evaluated_turns` turns each. Returns ``[(name, records, summary), ...]`` in :data:`PAIRS` order."""
    cfg, iv = params.evaluate, params.intervals
    if params.train_magrpo.workflow == "writer_tester_fixer":
        return list(evaluate_workflow(problems, model, tokenizer, sandbox, params.sampling, cfg.num_samples,
                                      cfg.seed, iv, pairs=pairs))  # fmt: skip
    return list(evaluate_agents(problems, model, tokenizer, sandbox, params.sampling, cfg.num_samples, cfg.seed,
                                cfg.batch_size, iv, turns=evaluated_turns(params), pairs=pairs))  # fmt: skip


def problems_fingerprint(problems: Sequence[Problem]) -> str:
    """16 hex digits of SHA-256 over ``problems``' records in order (prompt, tests, everything ``to_dict`` holds):
    what ``evaluate`` compares to tell that ``evaluate_base``'s samples are of the same problems."""
    h = hashlib.sha256()
    for p in problems:
        h.update(json.dumps(p.to_dict(), sort_keys=True).encode() + b"\n")
    return h.hexdigest()[:16]


def base_pair_settings(params) -> dict:
    """What the base pair's samples depend on besides the problems: the ``evaluate``, ``sampling``, ``model`` and
    ``sandbox`` sections of ``params`` (a :class:`orchestry.config.Params`), the workflow and the turns run.
    ``evaluate_base`` records it beside the samples; ``evaluate`` refuses samples made with other settings."""
    return {
        "evaluate": params.evaluate.model_dump(mode="json"),
        "sampling": params.sampling.model_dump(mode="json"),
        "model": params.model.model_dump(mode="json"),
        "sandbox": params.sandbox.model_dump(mode="json"),
        "workflow": params.train_magrpo.workflow,
        "turns": evaluated_turns(params),
    }


def trained_minus_base(base: Sequence[dict], trained: Sequence[dict], intervals: IntervalsParams) -> dict:
    """Trained pair minus base pair on the same problems, paired by problem, with percentile bootstrap intervals
    over problems (:func:`orchestry.reporting.compare.paired_comparison`, ``intervals.resamples`` resamples).

    Metrics (:data:`PAIRED_METRICS`): ``pass`` (pass@1: share of samples passing every assert), ``total`` (level
    reward, 0-4), ``coop_rate`` (gated cooperation rate: cooperation bonus > 0), ``aux_called`` (ungated: main
    calls the helper's aux), ``truncated`` (a completion hit the token limit).

    Returns:
        ``{metric: {"base", "trained", "diff", "diff_ci_low", "diff_ci_high", "excludes_zero", "n_problems"}}``.
    """
    from orchestry.reporting.compare import paired_comparison

    df = paired_comparison(base, trained, PAIRED_METRICS, intervals.confidence, intervals.resamples)
    return {
        row.metric: {
            "base": float(row.reference),
            "trained": float(row.other),
            "diff": float(row.diff),
            "diff_ci_low": float(row.diff_low),
            "diff_ci_high": float(row.diff_high),
            "excludes_zero": bool(row.excludes_zero),
            "n_problems": int(row.n_problems),
        }
        for row in df.itertuples()
    }
