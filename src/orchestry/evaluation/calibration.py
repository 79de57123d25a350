"""Difficulty calibration of the generated problems: how the base model fares at each difficulty.

For each difficulty, :func:`calibrate` generates problems with
:func:`orchestry.generators.compositional.generate` (at most the pool of valid compositions), samples the base
pair (``concat``: helper and main written independently, no adapters) and the single agent (one model writes
the entry point) with :func:`orchestry.evaluation.baselines.run_method`, and summarises each with
:func:`orchestry.analysis.metrics.summarize`. One row per difficulty: pass@1 of the pair with its percentile-bootstrap
interval over problems, the single agent's pass@1, the pair's mean reward (max 4.0), truncation rate, tokens
per completion and aux-call rate. ``orchestry calibrate`` writes the rows to ``reports/calibration.json`` and a
markdown table to ``reports/calibration.md`` (:func:`write_reports`). Documented in docs/problems.md.

A useful difficulty is neither solved nor hopeless for the base model: pass@1 well inside (0, 1) leaves the
group-relative advantages of MAGRPO something to compare.
"""

from __future__ import annotations

import datetime as _dt
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from orchestry.config import IntervalsParams, SamplingParams
from orchestry.generators.compositional import generate
from orchestry.numerics import cpu_model
from orchestry.problems import Problem, make_problem

#: The markdown table's columns, in order (``{level}`` is the interval's level, e.g. ``95%``).
COLUMNS = (
    "difficulty",
    "problems (pool)",
    "pair pass@1 [{level} CI]",
    "single pass@1",
    "pair reward (max 4.0)",
    "truncated",
    "tokens / completion",
    "aux called",
)
POOL_CAP = 10**6  # asks generate() for every valid composition (allow_fewer)


def select_problems(
    difficulty: int,
    count: int,
    seed: int = 0,
    types: Sequence[str] = ("ints", "str"),
    num_tests: int = 4,
) -> tuple[list[Problem], int]:
    """``min(count, pool)`` generated problems of one difficulty and the pool size (valid compositions).

    The problems are ``generate(n, difficulty, seed, types, num_tests)``, task ids ``Calibration/d<difficulty>/<i>``.

    Raises:
        orchestry.generators.compositional.GeneratorError: a parameter is out of range.
    """
    prefix = f"Calibration/d{difficulty}"
    pool = len(generate(POOL_CAP, difficulty, seed, types, num_tests, prefix, allow_fewer=True))
    n = min(count, pool)
    records = [g.record for g in generate(n, difficulty, seed, types, num_tests, prefix)]
    return [make_problem(r, r["task_id"]) for r in records], pool


def row_of(
    difficulty: int,
    pool: int,
    pair: Sequence[dict],
    single: Sequence[dict],
    intervals: IntervalsParams | None = None,
) -> tuple[dict, dict]:
    """One table row from the pair's and the single agent's per-sample records (``run_method``'s).

    Returns:
        ``(row, summaries)``: the row's values (rates in 0..1; ``pair_pass@1_ci_low/high`` the bootstrap
        interval over problems of the per-problem pass@1) and ``{"pair": ..., "single": ...}``, the
        :func:`orchestry.analysis.metrics.summarize` dict of each method.
    """
    from orchestry.analysis.metrics import summarize

    iv = intervals or IntervalsParams()
    ps = summarize(pair, [1], iv.confidence, iv.resamples)
    ss = summarize(single, [1], iv.confidence, iv.resamples)
    pair_completions = 2 * len(pair)  # a helper and a main completion per sample
    row = {
        "difficulty": difficulty,
        "problems": ps["n_problems"],
        "pool": pool,
        "samples_per_problem": len(pair) // max(1, ps["n_problems"]),
        # pass@1 per problem is its share of passing samples, so pass_rate_ci is pass@1's interval over problems
        "pair_pass@1": ps.get("pass@1", 0.0),
        "pair_pass@1_ci_low": ps.get("pass_rate_ci_low"),
        "pair_pass@1_ci_high": ps.get("pass_rate_ci_high"),
        "single_pass@1": ss.get("pass@1", 0.0),
        "single_pass@1_ci_low": ss.get("pass_rate_ci_low"),
        "single_pass@1_ci_high": ss.get("pass_rate_ci_high"),
        "pair_reward": ps.get("reward", 0.0),
        "pair_reward_ci_low": ps.get("reward_ci_low"),
        "pair_reward_ci_high": ps.get("reward_ci_high"),
        "single_reward": ss.get("reward", 0.0),
        # share of completions (helper and main counted separately) that hit max_completion_length
        "pair_truncation_rate": sum(
            bool(r.get("helper_truncated")) + bool(r.get("main_truncated")) for r in pair
        )
        / max(1, pair_completions),
        "pair_tokens_per_completion": sum(r.get("completion_tokens", 0) for r in pair)
        / max(1, pair_completions),
        "single_truncation_rate": sum(bool(r.get("main_truncated")) for r in single) / max(1, len(single)),
        "single_tokens_per_completion": sum(r.get("completion_tokens", 0) for r in single)
        / max(1, len(single)),
        # share of pair samples whose main calls aux (ungated: counted whether or not the tests pass)
        "pair_aux_called_rate": ps.get("aux_called_rate", 0.0),
    }
    return row, {"pair": ps, "single": ss}


def calibrate(
    difficulties: Sequence[int],
    count: int,
    num_samples: int,
    seed: int,
    model,
    tokenizer,
    sandbox,
    sampling: SamplingParams,
    batch_size: int = 64,
    intervals: IntervalsParams | None = None,
    types: Sequence[str] = ("ints", "str"),
    num_tests: int = 4,
    on_row: Callable[[dict], None] | None = None,
) -> tuple[list[dict], dict[int, dict]]:
    """Sample and score the base pair and the single agent on each difficulty's problems.

    Args:
        count: problems per difficulty (capped at its pool of valid compositions).
        num_samples: samples per problem and method.
        seed: the problems' generator seed and the sampling seed (both methods use the same one).
        on_row: called with each difficulty's row as soon as it is done (the command's progress line).

    Returns:
        ``(rows, summaries)``: one :func:`row_of` row per difficulty (plus ``seconds``) and, per difficulty,
        each method's full summary.
    """
    from orchestry.evaluation.baselines import run_method

    rows: list[dict] = []
    summaries: dict[int, dict] = {}
    for d in difficulties:
        t0 = time.time()
        problems, pool = select_problems(d, count, seed, types, num_tests)
        common = (problems, model, tokenizer, sandbox, sampling, num_samples, seed, batch_size)
        pair = run_method("concat", *common, progress=False)
        single = run_method("single", *common, progress=False)
        row, summaries[d] = row_of(d, pool, pair, single, intervals)
        row["seconds"] = round(time.time() - t0, 1)
        rows.append(row)
        if on_row is not None:
            on_row(row)
    return rows, summaries


def progress_line(row: dict) -> str:
    """The command's line after each difficulty."""
    return (
        f"difficulty {row['difficulty']}: {row['problems']} problems (pool {row['pool']}) x "
        f"{row['samples_per_problem']} samples: pair pass@1 {_ci(row, 'pair_pass@1')}, single pass@1 "
        f"{row['single_pass@1']:.3f}, pair reward {row['pair_reward']:.3f}, {row.get('seconds', 0):.0f} s"
    )


def _ci(row: dict, key: str) -> str:
    lo, hi = row.get(f"{key}_ci_low"), row.get(f"{key}_ci_high")
    return f"{row[key]:.3f}" + (f" [{lo:.3f}, {hi:.3f}]" if lo is not None and hi is not None else "")


def markdown_table(rows: Sequence[dict], confidence: float = 0.95) -> str:
    """The rows as a markdown table (:data:`COLUMNS`)."""
    head = [c.format(level=f"{confidence:.0%}") for c in COLUMNS]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---:" for _ in head) + "|"]
    for r in rows:
        cells = [
            str(r["difficulty"]),
            f"{r['problems']} ({r['pool']})",
            _ci(r, "pair_pass@1"),
            f"{r['single_pass@1']:.3f}",
            f"{r['pair_reward']:.3f}",
            f"{r['pair_truncation_rate']:.3f}",
            f"{r['pair_tokens_per_completion']:.1f}",
            f"{r['pair_aux_called_rate']:.3f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_reports(
    rows: Sequence[dict],
    summaries: dict[int, dict],
    out_dir: str | Path,
    command: str,
    meta: dict,
    confidence: float = 0.95,
) -> tuple[Path, Path]:
    """Write ``calibration.json`` (command, date, CPU, ``meta``, rows, each method's summary per difficulty) and
    ``calibration.md`` (the command, CPU, date and the table) to ``out_dir``.

    Args:
        meta: the run's settings (model, sampling, samples, seed, types, ...), stored as they are.

    Returns:
        the two paths.
    """
    from orchestry.runtime import write_json

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    date = _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC")

    cpu = cpu_model()
    cores = os.cpu_count() or 1
    report = {
        "command": command,
        "date": date,
        "cpu": cpu,
        "cpu_count": cores,
        **meta,
        "rows": list(rows),
        "summaries": {str(d): s for d, s in summaries.items()},
    }
    json_path, md_path = out / "calibration.json", out / "calibration.md"
    write_json(json_path, report)
    s = meta.get("sampling", {})
    seconds = sum(r.get("seconds", 0) for r in rows)
    text = (
        "# Calibration: the base model on generated problems, by difficulty\n\n"
        f"Made by `{command}` on {date}, CPU: {cpu} ({cores} cores), {seconds:.0f} s.\n\n"
        f"Model `{meta.get('model', '?')}`; sampling: at most {s.get('max_completion_length', '?')} new tokens, "
        f"temperature {s.get('temperature', '?')}, top_p {s.get('top_p', '?')}; "
        f"{meta.get('samples', '?')} samples per problem and method, sampling seed {meta.get('seed', '?')}. "
        f"Problems: `orchestry.generators.compositional.generate(n, difficulty, seed={meta.get('seed', '?')})`, "
        f"input types {', '.join(meta.get('types', []))}, {meta.get('num_tests', '?')} asserts each; "
        "n is the `--problems` asked, capped at the pool of valid compositions (in brackets).\n\n"
        + markdown_table(rows, confidence)
        + "\n"
        "- *pair*: the base helper and main sampled independently (`concat`, no adapters); *single*: one agent "
        "writes the entry point alone.\n"
        f"- pass@1 with its {confidence:.0%} percentile-bootstrap interval over problems "
        f"({meta.get('resamples', '?')} resamples); reward: the level reward (structure, syntax, tests, "
        "cooperation; max 4.0) of the pair.\n"
        "- truncated: share of the pair's completions (helper and main counted separately) that hit the token "
        "limit; tokens / completion: their mean completion tokens; aux called: share of pair samples whose "
        "main calls `aux`.\n"
        "- Every metric of both methods (orchestry.analysis.metrics.summarize) is in "
        "[calibration.json](calibration.json); the problems are described in "
        "[docs/problems.md](../docs/problems.md).\n"
    )
    md_path.write_text(text)
    return json_path, md_path
