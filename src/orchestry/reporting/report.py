"""``reports/index.html``: one self-contained page with every result of the pipeline.

Sections: the metrics table of all methods with bootstrap confidence intervals, MAGRPO's training gain, API-GRPO
with vs without its learned behaviours, the learned orchestrator vs fixed pipelines, cost per method (tokens,
wall seconds, USD), every figure under ``reports/figures/``, one example of each cooperation scheme, and the best
and worst transcript of each evaluated method.
Reading the inputs and formatting values: :mod:`orchestry.reporting.report_format`; the scheme and transcript sections:
:mod:`orchestry.reporting.report_samples`.

Inputs, all under ``<root>/reports/`` (the committed outputs of the DVC stages): ``metrics.json`` (evaluate),
``baselines/*.json(l)`` (baselines), ``eval/*.jsonl`` (evaluate), ``schemes.json`` and ``schemes_samples.jsonl``
(detect_schemes), ``train/magrpo.json`` (train_magrpo), ``api_grpo/summary.json`` (train_api_grpo),
``orchestrator/summary.json`` (train_orchestrator) and ``figures/*.png`` (plot). Tables are made with pandas
(``DataFrame.to_html``); model-written text is escaped (``html.escape``). Links are relative, the CSS is inline
and there is no script, so the page works from a copy of ``reports/`` opened as a file, offline.

The page states its provenance (:func:`provenance`): when it was made (UTC), the git revision, the SHA-256 of
``params.yaml``, the DVC experiment and, when it is built inside an MLflow stage run (the ``plot`` stage), links to
the pipeline execution's parent run, to each stage run of that execution and, per figure, to the figure logged
in the ``plot`` run. Those are the only absolute links: they point at the MLflow UI that ``orchestry ui`` serves
(:func:`ui_address`: the environment variable ``MLFLOW_UI_URL`` when set, e.g. ``http://127.0.0.1:5001``, which
``orchestry ui`` also serves on; else ``http://127.0.0.1:5000``) and work while it runs. They open MLflow's runs
view ("Model training", ``?workflowType=machine_learning``), not its GenAI pages.
"""

from __future__ import annotations

import datetime
import html
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from orchestry.reporting.report_format import (
    ReportError,
    _ci,
    _ci_dict,
    _ci_of,
    _code,
    _get,
    _json,
    _jsonl,
    _k_keys,
    _label,
    _num,
    _table,
    _usd,
)
from orchestry.reporting.report_samples import _records, _schemes_section, _transcripts_section
from orchestry.reporting.results import results_note, results_rows
from orchestry.tracking.execution import git_revision, params_hash
from orchestry.tracking.ui import run_url, ui_base

#: Figures in page order, with their captions; any other ``figures/*.png`` follows under its file name.
FIGURES = {
    "learning_curves.png": "MAGRPO training: mean joint reward per policy update, and each reward level "
    "(structure, syntax, tests, cooperation) as a moving average.",
    "scheme_evolution.png": "MAGRPO training: cooperation scheme of main's code per step (with the step each "
    "scheme first appears), the ungated aux-call rates and the share of zero-variance groups.",
    "methods.png": "Test split: mean joint reward and pass rate per method, with bootstrap confidence intervals "
    "over problems.",
    "collaboration.png": "Test split: how often main calls aux, uses its value, and reaches the gated "
    "cooperation level.",
    "schemes.png": "Test split: cooperation scheme of main's code per method (AST analysis).",
    "api_grpo.png": "API-GRPO: reward of each trajectory against cumulative tokens, and test reward with vs "
    "without the learned behaviours.",
    "orchestrator_pareto.png": "Learned orchestrator vs fixed pipelines: task reward against cost.",
    "orchestrator_agents.png": "Learned orchestrator: share of turns given to each agent.",
    "orchestrator_transitions.png": "Learned orchestrator: transitions between agents (which agent acts next).",
}

#: One line per scheme of :data:`orchestry.analysis.schemes.SCHEMES` (the module docstring has the exact rules).

#: Column of the orchestrator tables: the summary's ``objective``, the undiscounted return of Puppeteer's rewards
#: (R_t = -lambda c_t, then R_T = r - lambda C_T): r - 2 lambda C, each cost counted once while running and once at
#: the end (docs/orchestrator.md; orchestry.algorithms.orchestrator.step_rewards).
OBJECTIVE_LABEL = "objective = reward − 2λ·cost"

#: Environment variable naming the MLflow UI's address (``http://<host>:<port>``, optionally with a path) that the
#: report's MLflow links point at and that ``orchestry ui`` serves on by default.
UI_URL_ENV = "MLFLOW_UI_URL"
#: Query that opens MLflow 3's runs view ("Model training") instead of its GenAI navigation.
RUNS_VIEW_QUERY = "?workflowType=machine_learning"


def ui_address() -> str:
    """Address of the MLflow UI the report links to: ``$MLFLOW_UI_URL`` (without a trailing ``/``) when set, else
    :func:`orchestry.tracking.ui.ui_base` (``http://127.0.0.1:5000``, ``orchestry ui``'s default)."""
    return (os.environ.get(UI_URL_ENV) or "").strip().rstrip("/") or ui_base()


def mlflow_link(experiment_id: str, run_id: str, base: str, path: str = "") -> str:
    """A run's page (``path``: a sub-page, e.g. ``/artifacts/figures/x.png``) in the MLflow UI at ``base``, in the
    runs view (:data:`RUNS_VIEW_QUERY`)."""
    return run_url(experiment_id, run_id, base) + path + RUNS_VIEW_QUERY


ORCHESTRATOR_LABELS = {
    "learned": "learned orchestrator",
    "helper_main": "fixed: helper → main",
    "all_in_order": "fixed: every agent in order",
    "test_fix_loop": "fixed: test-fix loop",
}

CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0 auto; max-width: 1200px;
       padding: 1em 2em; color: #222; line-height: 1.45; }
h1 { border-bottom: 2px solid #444; padding-bottom: .2em; }
h2 { border-bottom: 1px solid #bbb; margin-top: 2em; }
nav ul { columns: 2; }
table.data { border-collapse: collapse; margin: .6em 0 1.2em; font-size: 0.88em; }
table.data th, table.data td { border: 1px solid #ccc; padding: .25em .55em; text-align: right; }
table.data th { background: #f0f0f0; }
table.data td { overflow-wrap: break-word; }
table.data .ci { white-space: nowrap; }
table.data.kv td, table.data.kv th { text-align: left; }
.table { overflow-x: auto; }
table.data td:first-child, table.data th:first-child { text-align: left; }
table.data td:first-child { font-weight: 600; }
table.data tbody tr:nth-child(even) { background: #fafafa; }
figure { margin: 1.2em 0; }
figure img { max-width: 100%; border: 1px solid #ddd; }
figcaption { font-size: .9em; color: #444; }
pre { background: #f6f8fa; border: 1px solid #ddd; padding: .6em; overflow-x: auto; font-size: .82em;
      white-space: pre-wrap; word-break: break-word; }
.sample { border-left: 4px solid #4c72b0; padding-left: 1em; margin: 1.2em 0; }
.sample.worst { border-left-color: #c44e52; }
.note { color: #555; font-size: .9em; }
"""


# ---------------------------------------------------------------- sections


def _metrics_section(metrics: dict, src: Path) -> str:
    methods = _get(metrics, "methods", source=src)
    level = _get(metrics, "intervals", "confidence", source=src)
    if not isinstance(level, int | float) or not 0 < level < 1:
        raise ReportError(f"{src}: intervals.confidence must be a number in (0, 1), got {level!r}")
    k_cols = _k_keys(methods, "pass") + _k_keys(methods, "accuracy")
    rewards, passes, collab = [], [], []
    for name, s in methods.items():
        rewards.append(
            {
                "method": _label(name),
                "problems": _num(s.get("n_problems")),
                "samples": _num(s.get("n_samples")),
                "mean joint reward (max 4.0)": _ci_of(s, "reward"),
                **{lv: _num(s.get(lv)) for lv in ("structure", "syntax", "tests", "cooperation")},
            }
        )
        passes.append(
            {
                "method": _label(name),
                "pass rate": _ci_of(s, "pass_rate"),
                **{k: _num(s.get(k)) for k in k_cols},
            }
        )
        collab.append(
            {
                "method": _label(name),
                "aux defined": _ci_of(s, "aux_defined_rate"),
                "main calls aux": _ci_of(s, "aux_called_rate"),
                "main uses aux's value": _ci_of(s, "aux_used_rate"),
                "cooperation rate (gated)": _num(s.get("cooperation_rate")),
                "truncated": _num(s.get("truncation_rate")),
            }
        )
    return (
        f"<p>Test split: {_num(metrics.get('test_problems'))} problems, "
        f"{_num(metrics.get('samples_per_problem'))} samples per problem for the trained and base agents. "
        f"Brackets: {level:.0%} bootstrap confidence interval over problems "
        f"({_num(metrics.get('intervals', {}).get('resamples'))} resamples).</p>"
        "<h3>Reward</h3><p>Mean joint reward and the mean of each level (structure max 1.0, syntax 0.5, "
        "tests 1.0, cooperation 1.5; each level gates the next).</p>"
        + _table(rewards)
        + "<h3>Passing</h3><p>Pass rate: share of samples passing every assert; pass@k and accuracy@k as "
        "defined in <code>docs/algorithms.md</code>.</p>"
        + _table(passes)
        + "<h3>Collaboration (share of samples)</h3>"
        + _table(collab)
    )


def _magrpo_section(train: dict, src: Path) -> str:
    # magrpo.json names the quarters' intervals first_quarter_ci_low (not first_quarter_reward_ci_low)
    quarter = {
        f"{q} quarter mean reward": _ci(
            train.get(f"{q}_quarter_reward"),
            train.get(f"{q}_quarter_ci_low"),
            train.get(f"{q}_quarter_ci_high"),
        )
        for q in ("first", "last")
    }
    row = {
        "phase": "MAGRPO training",
        "steps": _num(_get(train, "steps", source=src)),
        **quarter,
        "difference (last − first)": _ci_of(train, "difference"),
    }
    return (
        f"<p>Mean joint reward of the training samples in the first and last quarter of the run "
        f"({_num(train.get('quarter_steps'))} steps each), with bootstrap confidence intervals.</p>"
        + _table([row])
    )


def _api_grpo_section(summary: dict, src: Path) -> str:
    ev = _get(summary, "eval", source=src)
    top = summary.get("max_reward", 4.0)
    top = f"{top:.1f}" if isinstance(top, int | float) else "4.0"
    rows = [
        {
            "policy": label,
            f"mean test reward (max {top})": _ci_dict(ev.get(key)),
            "problems": _num(ev.get("problems")),
        }
        for key, label in (
            ("with", "with learned behaviours"),
            ("without", "without behaviours"),
            ("difference", "difference (with − without)"),
        )
    ]
    part_rows = [
        {
            "reward part (0–1)": name,
            "with learned behaviours": _ci_dict(v.get("with")),
            "without behaviours": _ci_dict(v.get("without")),
            "difference (with − without)": _ci_dict(v.get("difference")),
        }
        for name, v in (ev.get("parts") or {}).items()
        if isinstance(v, dict)
    ]
    behaviours = summary.get("behaviors", {}).get("final") or {}
    parts = "".join(f"<p><b>{html.escape(agent)}</b></p>{_code(text)}" for agent, text in behaviours.items())
    level = ev.get("confidence")
    over = summary.get("overrides") or {}
    over_rows = [
        {
            "id": str(o.get("id")),
            "phase": str(o.get("phase")),
            "problem": str(o.get("task_id")),
            "automatic reward": _num(o.get("automatic")),
            "human reward": _num(o.get("human")),
            "note": str(o.get("note", "")),
            "by": str(o.get("who", "")),
        }
        for o in over.get("rows") or []
    ]
    overridden = (
        f"<h3>Human overrides ({len(over_rows)} trajectories; <code>data/overrides.jsonl</code>)</h3>"
        "<p>These rows use the person's score as their reward in training, the behaviour library and the "
        "evaluation.</p>" + _table(over_rows)
        if over_rows
        else ""
    )
    tr, src_lib = ev.get("transfer") or {}, summary.get("transfer") or {}
    transfer = ""
    if isinstance(tr, dict) and tr.get("arms"):
        labels = (("arms", "none", "no behaviours"), ("arms", "transferred", "transferred library, as loaded"),
                  ("arms", "learned", "learned here (started from the transferred one)"),
                  ("difference", "transferred_minus_none", "difference (transferred − none)"),
                  ("difference", "learned_minus_none", "difference (learned − none)"),
                  ("difference", "learned_minus_transferred", "difference (learned − transferred)"))  # fmt: skip
        transfer = (
            f"<h3>Transfer from <code>{html.escape(str(src_lib.get('path')))}</code> (task "
            f"<code>{html.escape(str(src_lib.get('task') or 'not stated'))}</code>, roles "
            f"{html.escape(', '.join(f'{a} → {b}' for a, b in (src_lib.get('roles') or {}).items()) or 'none')})"
            "</h3><p>The same test problems and samples in each arm; differences are paired.</p>"
            + _table(
                [
                    {
                        "policy": label,
                        f"mean test reward (max {top})": _ci_dict((tr.get(group) or {}).get(key)),
                    }
                    for group, key, label in labels
                ]
            )
        )
    return (
        f"<p>Backend <code>{html.escape(str(summary.get('backend')))}</code>, task "
        f"<code>{html.escape(str(summary.get('task', 'code_collaboration')))}</code>, model "
        f"<code>{html.escape(str(summary.get('model')))}</code>, "
        f"{_num(summary.get('episodes_completed'))} training episodes; evaluation status "
        f"<code>{html.escape(str(ev.get('status')))}</code>"
        + (f", {level:.0%} bootstrap intervals over problems" if isinstance(level, int | float) else "")
        + ".</p>"
        + _table(rows)
        + transfer
        + ("<h3>Each reward part, test problems</h3>" + _table(part_rows) if part_rows else "")
        + ("<h3>Learned behaviours (injected into the prompts)</h3>" + parts if parts else "")
        + overridden
    )


def _orchestrator_section(summary: dict, src: Path) -> str:
    ev = _get(summary, "eval", source=src)
    rows = []
    for name, s in (ev.get("methods") or {}).items():
        rows.append(
            {
                "policy": ORCHESTRATOR_LABELS.get(name, name),
                "task reward": _ci_dict(s.get("task_reward") or s.get("reward")),
                f"cost ({summary.get('cost_unit', 'tokens')})": _ci_dict(s.get("cost"), 0),
                "tokens": _ci_dict(s.get("tokens"), 0),
                OBJECTIVE_LABEL: _ci_dict(s.get("objective"), 3),
                "success rate": _ci_dict(s.get("success_rate")),
                "turns": _num(s.get("length")),
                "USD": _usd(s.get("usd")),
            }
        )
    diffs = [
        {
            "learned − fixed": ORCHESTRATOR_LABELS.get(name, name),
            "task reward": _ci_dict(d.get("reward")),
            "cost": _ci_dict(d.get("cost"), 0),
            OBJECTIVE_LABEL: _ci_dict(d.get("objective"), 3),
        }
        for name, d in (ev.get("learned_minus") or {}).items()
    ]
    if not rows:
        return f"<p>No evaluation (status <code>{html.escape(str(ev.get('status')))}</code>).</p>"
    level = summary.get("confidence")
    return (
        f"<p>Test problems: {_num(ev.get('problems'))}; λ = {html.escape(str(summary.get('cost_lambda')))}; "
        + (f"{level:.0%} bootstrap intervals over problems." if isinstance(level, int | float) else "")
        + " The objective is the undiscounted return of the rewards the policy is trained on: each call's cost "
        "is charged once when it is made (−λ·c) and the total once more at the end (r − λ·C), so r − 2λ·C "
        "(<code>docs/orchestrator.md</code>).</p>"
        + _table(rows)
        + ("<h3>Paired differences</h3>" + _table(diffs) if diffs else "")
    )


def _total(per_sample: float | None, n: int | None) -> int | None:
    return None if per_sample is None or n is None else round(per_sample * n)


def _cost_section(metrics: dict, reports: Path, train: dict, api: dict, orch: dict) -> str:
    rows = []
    for name, s in metrics["methods"].items():
        n = s.get("n_samples")
        p, c = s.get("prompt_tokens"), s.get("completion_tokens")
        seconds = s.get("seconds")
        baseline = reports / "baselines" / f"{name.removeprefix('baseline_')}.json"
        if seconds is None and name.startswith("baseline_") and baseline.is_file():
            seconds = _json(baseline).get("seconds")  # evaluate's gathered copy leaves it out
        rows.append(
            {
                "method": _label(name),
                "phase": "test split (local model)",
                "samples or calls": _num(n),
                "prompt tokens": _num(_total(p, n)),
                "completion tokens": _num(_total(c, n)),
                "tokens per sample": _num(None if p is None or c is None else p + c, 1),
                "wall seconds": _num(seconds, 1),
                "USD": "$0 (local)",
            }
        )
    steps, sps = train.get("steps"), train.get("seconds_per_step")
    p, c = train.get("prompt_tokens"), train.get("completion_tokens")
    rows.append(
        {
            "method": "MAGRPO",
            "phase": f"training ({_num(steps)} steps, local model)",
            "samples or calls": "—",
            "prompt tokens": _num(p),
            "completion tokens": _num(c),
            "tokens per sample": "—",
            "wall seconds": _num(None if steps is None or sps is None else steps * sps, 1),
            "USD": "$0 (local)",
        }
    )
    for label, s in (("API-GRPO", api), ("learned orchestrator", orch)):
        cost = s.get("cost") or {}
        seconds = s.get("seconds") or {}
        calls, cached = cost.get("calls"), cost.get("cached_calls")
        rows.append(
            {
                "method": label,
                "phase": f"training + evaluation (backend {s.get('backend')})",
                "samples or calls": f"{_num(calls)} calls + {_num(cached)} cached",
                "prompt tokens": _num(cost.get("prompt_tokens")),
                "completion tokens": _num(cost.get("completion_tokens")),
                "tokens per sample": _num(cost.get("tokens_per_episode"), 1)
                + (" per episode" if cost.get("tokens_per_episode") is not None else ""),
                "wall seconds": _num(sum(v for v in seconds.values() if isinstance(v, int | float)), 1),
                "USD": _usd(cost.get("usd_total", cost.get("usd"))),
            }
        )
    return (
        "<p>Tokens are totals over the run (prompt tokens of every call, completion tokens generated); API "
        "methods count only uncached calls (cached answers are free). Wall seconds include the sandbox. "
        "Local-model methods cost no USD; the API methods' USD comes from their price table.</p>"
        + _table(rows)
    )


def _figures_section(
    figures: list[Path], out_dir: Path, figure_url: Callable[[str], str] | None = None
) -> str:
    """Every figure with its caption; ``figure_url(name)``, when given, links the figure logged in MLflow."""
    order = {name: i for i, name in enumerate(FIGURES)}
    figures = sorted(figures, key=lambda f: (order.get(f.name, len(order)), f.name))
    parts = []
    for f in figures:
        src = Path(os.path.relpath(f, out_dir)).as_posix()
        caption = FIGURES.get(f.name, f.stem.replace("_", " "))
        logged = (
            f' (<a class="mlflow" href="{html.escape(figure_url(f.name))}">in MLflow</a>)'
            if figure_url
            else ""
        )
        parts.append(
            f'<figure id="fig-{html.escape(f.stem)}"><a href="{html.escape(src)}">'
            f'<img src="{html.escape(src)}" alt="{html.escape(caption)}"></a>'
            f"<figcaption><b>{html.escape(f.name)}</b>: {html.escape(caption)}{logged}</figcaption></figure>"
        )
    return "".join(parts)


# ---------------------------------------------------------------- provenance


def provenance(root: Path = Path(".")) -> dict[str, Any]:
    """Where a page built now comes from.

    Returns:
        ``date`` (UTC, ISO 8601 to the second), ``git_revision`` (a commit, ``+dirty`` when the work tree has
        changes, or ``unknown``), ``params_hash`` (SHA-256 of ``root/params.yaml``), ``dvc_experiment`` (or None)
        and ``mlflow``: None, or, inside an active MLflow run (a stage run of :func:`orchestry.tracking.runs.stage_run`),
        ``{"ui", "experiment_id", "run_id", "parent_id", "stages": {stage: run_id}}`` with the newest run of each
        stage of the same pipeline execution (children of ``parent_id``). Inside a stage run, the git revision,
        params hash and DVC experiment are the run's tags (what MLflow shows).
    """
    info: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "git_revision": git_revision(root),
        "params_hash": params_hash(Path(root) / "params.yaml"),
        "dvc_experiment": os.environ.get("DVC_EXP_NAME") or None,
        "mlflow": None,
    }
    mlflow = sys.modules.get("mlflow")  # not imported: no run can be active
    active = mlflow.active_run() if mlflow is not None else None
    if active is None:
        return info
    client = mlflow.MlflowClient()
    run = client.get_run(active.info.run_id)
    tags = run.data.tags
    for key in ("git_revision", "params_hash", "dvc_experiment"):
        if tags.get(key):
            info[key] = tags[key]
    parent = tags.get("mlflow.parentRunId")
    stages: dict[str, str] = {}
    if parent:
        children = client.search_runs(
            [run.info.experiment_id],
            filter_string=f"tags.`mlflow.parentRunId` = '{parent}'",
            order_by=["attributes.start_time ASC"],
            max_results=1000,
        )
        for child in children:  # oldest first: the newest run of a stage wins
            if child.data.tags.get("stage"):
                stages[child.data.tags["stage"]] = child.info.run_id
    info["mlflow"] = {
        "ui": ui_address(),
        "experiment_id": run.info.experiment_id,
        "run_id": run.info.run_id,
        "parent_id": parent,
        "stages": stages,
    }
    return info


def _training_machine(summary: Mapping[str, Any]) -> str | None:
    """One line from the MAGRPO report's ``machine`` (:func:`orchestry.runtime.machine_info`) and
    ``update_dtype``: what trained the adapters; None for a report written before the machine was recorded."""
    m = summary.get("machine")
    if not isinstance(m, dict):
        return None
    return (
        f"{m.get('cpu')} ({m.get('cpu_flags')}), {m.get('threads')} threads, torch {m.get('torch')} "
        f"{m.get('kernels')} kernels, MKL branch {m.get('mkl_cbwr')}, numerics {m.get('numerics')}, "
        f"update {summary.get('update_dtype', '?')}, GPU {m.get('gpu')}"
    )


def _provenance_section(info: Mapping[str, Any], machine: str | None = None) -> str:
    rows = [
        {"": "made (UTC)", "value": info.get("date")},
        {"": "git revision", "value": info.get("git_revision")},
        {"": "params.yaml SHA-256", "value": info.get("params_hash")},
        {"": "DVC experiment", "value": info.get("dvc_experiment") or "none (the workspace)"},
        {"": "machine that trained (numbers depend on it: docs/reproducibility.md)",
         "value": machine or "not recorded"},
    ]  # fmt: skip
    table = _table(rows, kind="kv")
    ml = info.get("mlflow")
    if not ml:
        return table + (
            '<p class="note">No MLflow run links: the page was not built inside an MLflow run (the '
            "<code>plot</code> stage builds it inside one).</p>"
        )
    eid, base = ml["experiment_id"], ml["ui"]

    def link(run_id: str, text: str) -> str:
        return (
            f'<a class="mlflow" href="{html.escape(mlflow_link(eid, run_id, base))}">{html.escape(text)}</a>'
        )

    items = []
    if ml.get("parent_id"):
        items.append(f"<li>{link(ml['parent_id'], 'pipeline execution (parent run)')}</li>")
    for stage, run_id in ml.get("stages", {}).items():
        items.append(f"<li>{link(run_id, stage)}</li>")
    return table + (
        f"<p>MLflow runs of this pipeline execution (open while <code>orchestry ui</code> serves {html.escape(base)}; "
        f"another address: set <code>{UI_URL_ENV}</code> before <code>dvc repro</code>; stages whose outputs came "
        "from the DVC cache ran in an earlier execution):</p>"
        f"<ul>{''.join(items)}</ul>"
    )


# ---------------------------------------------------------------- the page


def write_report(
    root: Path = Path("."), out: Path = Path("reports/index.html"), source: Mapping[str, Any] | None = None
) -> Path:
    """Write the HTML report of ``root/reports/`` to ``out`` (relative to ``root`` unless absolute).

    ``source`` is the page's provenance (:func:`provenance`; by default that of ``root`` now).

    Returns the path written. Links to figures and data files are relative to ``out``'s folder, so ``out``
    belongs inside ``root/reports/`` (or a copy of it) for them to resolve.

    The per-sample files (``eval/*.jsonl``, ``baselines/*.jsonl``, ``schemes_samples.jsonl``) are DVC outputs
    kept out of git: in a checkout without them the scheme examples and transcripts are replaced by a note
    saying so (the ``plot`` stage always has them: they are its deps). Every other input is required.

    Raises:
        ReportError: an input is missing or malformed (one line naming the file, or key), a sample of
            ``schemes_samples.jsonl`` is not in its method's file, or there is no figure under
            ``reports/figures/``.
    """
    root = Path(root)
    out = out if out.is_absolute() else root / out
    reports = root / "reports"
    src = {
        "metrics": reports / "metrics.json",
        "schemes": reports / "schemes.json",
        "schemes_samples": reports / "schemes_samples.jsonl",
        "magrpo": reports / "train" / "magrpo.json",
        "api_grpo": reports / "api_grpo" / "summary.json",
        "orchestrator": reports / "orchestrator" / "summary.json",
    }
    metrics = _json(src["metrics"])
    _get(metrics, "methods", source=src["metrics"])
    schemes = _json(src["schemes"])
    # per-sample files are DVC-cached, not in git: the page says so when a checkout lacks them
    samples = _jsonl(src["schemes_samples"]) if src["schemes_samples"].exists() else None
    train, api, orch = _json(src["magrpo"]), _json(src["api_grpo"]), _json(src["orchestrator"])
    figures = sorted((reports / "figures").glob("*.png"))
    if not figures:
        raise ReportError(f"no figure in {reports / 'figures'} (run the plot stage)")
    records = _records(reports)

    source = provenance(root) if source is None else source
    ml = source.get("mlflow") or {}
    figure_url = None
    if ml.get("run_id"):

        def figure_url(name: str) -> str:
            return mlflow_link(ml["experiment_id"], ml["run_id"], ml["ui"], f"/artifacts/figures/{name}")

    header, rows = results_rows(metrics)
    shows = (
        _table([dict(zip(header, r, strict=True)) for r in rows])
        + f"<p>{html.escape(results_note(metrics))}</p>"
    )
    sections = [
        ("provenance", "Where this page comes from", _provenance_section(source, _training_machine(train))),
        ("shows", "What this run shows: base, best baseline and trained pair on each test set", shows),
        ("metrics", "Methods on the test split", _metrics_section(metrics, src["metrics"])),
        ("magrpo", "MAGRPO: training gain", _magrpo_section(train, src["magrpo"])),
        ("api-grpo", "API-GRPO: with vs without learned behaviours", _api_grpo_section(api, src["api_grpo"])),
        (
            "orchestrator",
            "Learned orchestrator vs fixed pipelines",
            _orchestrator_section(orch, src["orchestrator"]),
        ),
        ("cost", "Cost per method", _cost_section(metrics, reports, train, api, orch)),
        ("figures", "Figures", _figures_section(figures, out.parent, figure_url)),
        ("schemes", "Cooperation schemes", _schemes_section(schemes, samples, records, src["schemes"])),
        ("transcripts", "Best and worst transcripts", _transcripts_section(reports, records)),
    ]
    links = "".join(
        f'<li><a href="{html.escape(Path(os.path.relpath(p, out.parent)).as_posix())}">'
        f"{html.escape(p.relative_to(reports).as_posix())}</a></li>"
        for p in [*src.values(), *sorted((reports / "eval").glob("*.jsonl"))]
        if p.exists()
    )
    nav = "".join(f'<li><a href="#{sid}">{html.escape(title)}</a></li>' for sid, title, _ in sections)
    body = "".join(f'<section id="{sid}"><h2>{html.escape(t)}</h2>{s}</section>' for sid, t, s in sections)
    page = (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>Orchestry report</title><style>{CSS}</style></head><body>"
        "<h1>Orchestry report</h1>"
        '<p class="note">Made by the <code>plot</code> stage (<code>orchestry.reporting.report.write_report</code>) from '
        "the pipeline's outputs under <code>reports/</code>; re-made by <code>dvc repro</code>.</p>"
        f"<nav><ul>{nav}</ul></nav>{body}"
        f'<section id="sources"><h2>Source files</h2><ul>{links}</ul></section>'
        "</body></html>\n"
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(page, encoding="utf-8")
    return out
