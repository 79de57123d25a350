"""Base agents vs MAGRPO-trained adapters on a set of problems: what the ``evaluate`` stage computes.

:func:`evaluate_agents` samples both agent pairs from one peft model (the base pair with the adapters disabled,
as the naive ``concat`` method; the trained pair with the ``helper``/``main`` adapters, as ``magrpo``), scores
every sample with the level reward in the sandbox and summarises each pair with
:func:`orchestry.metrics.summarize` (pass@k, accuracy@k, mean reward with its bootstrap interval over problems,
each level, cooperation rate, tokens). ``orchestry evaluate`` runs it on any HumanEval-format file.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from orchestry.config import IntervalsParams, SamplingParams
from orchestry.problems import Problem

#: Per-sample metrics of the trained-minus-base comparison (:func:`trained_minus_base`).
PAIRED_METRICS = ("pass", "total", "coop_rate", "aux_called", "truncated")

#: The evaluated agent pairs, in order: ``(name, uses the trained adapters)``.
PAIRS: tuple[tuple[str, bool], ...] = (("base", False), ("magrpo", True))
AGENTS = ("helper", "main")


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
) -> Iterator[tuple[str, list[dict], dict]]:
    """Sample and score the base pair, then the trained pair; yield ``(name, records, summary)`` for each.

    Args:
        model: a peft model with adapters named ``helper`` and ``main`` (:func:`orchestry.runtime.load_policy`).
        num_samples: samples per problem (the k of pass@k; pass@1 is always reported).
        seed: sampling seed; both pairs use the same one, so they differ only by the adapters.
        intervals: level and bootstrap resamples of the confidence intervals.

    Yields:
        ``("base", records, summary)`` then ``("magrpo", records, summary)``: one record per (problem, sample)
        (:func:`orchestry.baselines.run_method`; base records carry ``method="base"``) and the
        :func:`orchestry.metrics.summarize` dict plus ``seconds`` (wall seconds of the pair).
    """
    from orchestry.baselines import run_method
    from orchestry.metrics import summarize

    ks = sorted({1, num_samples})
    for name, use_adapters in PAIRS:
        t0 = time.time()
        if use_adapters:
            recs = run_method("magrpo", problems, model, tokenizer, sandbox, sampling, num_samples, seed,
                              batch_size, adapters=True, progress=progress)  # fmt: skip
        else:
            with model.disable_adapter():
                recs = run_method("concat", problems, model, tokenizer, sandbox, sampling, num_samples, seed,
                                  batch_size, progress=progress)  # fmt: skip
            for r in recs:
                r["method"] = "base"
        summary = summarize(recs, ks, intervals.confidence, intervals.resamples)
        summary["seconds"] = time.time() - t0
        yield name, recs, summary


def evaluate_workflow(
    problems: Sequence[Problem],
    model,
    tokenizer,
    sandbox,
    sampling: SamplingParams,
    num_samples: int,
    seed: int,
    intervals: IntervalsParams,
) -> Iterator[tuple[str, list[dict], dict]]:
    """The writer -> tester -> fixer workflow (``train_magrpo.workflow: writer_tester_fixer``) without and with
    its trained adapters: yields ``("base", records, summary)`` then ``("magrpo", records, summary)``.

    Each record is one episode (:func:`orchestry.training.magrpo.workflow_rollout`, ``num_samples`` per
    problem, the same seed for both): the single-agent level reward of the fixer's final code (0..2.1; no
    cooperation level), ``main`` = the fixer's code, ``helper`` empty, plus the writer's and tester's texts and
    the tester's report; tokens are the three agents' together.

    Args:
        model: a peft model with adapters ``writer``, ``tester``, ``fixer``.
    """
    from orchestry.metrics import summarize
    from orchestry.training.magrpo import BASE, WORKFLOW_AGENTS, workflow_rollout

    agents = WORKFLOW_AGENTS["writer_tester_fixer"]
    ks = sorted({1, num_samples})
    for name, adapters in (("base", (BASE,) * len(agents)), ("magrpo", agents)):
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
        summary = summarize(recs, ks, intervals.confidence, intervals.resamples)
        summary["seconds"] = time.time() - t0
        yield name, recs, summary


def trained_minus_base(base: Sequence[dict], trained: Sequence[dict], intervals: IntervalsParams) -> dict:
    """Trained pair minus base pair on the same problems, paired by problem, with percentile bootstrap intervals
    over problems (:func:`orchestry.compare.paired_comparison`, ``intervals.resamples`` resamples).

    Metrics (:data:`PAIRED_METRICS`): ``pass`` (pass@1: share of samples passing every assert), ``total`` (level
    reward, 0-4), ``coop_rate`` (gated cooperation rate: cooperation bonus > 0), ``aux_called`` (ungated: main
    calls the helper's aux), ``truncated`` (a completion hit the token limit).

    Returns:
        ``{metric: {"base", "trained", "diff", "diff_ci_low", "diff_ci_high", "excludes_zero", "n_problems"}}``.
    """
    from orchestry.compare import paired_comparison

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
