"""``orchestry compare``: one row per pipeline execution from the MLflow store, with its key metrics;
``orchestry times``: the seconds of each stage in the newest executions (:func:`stage_times`).

Runs are read with ``mlflow.search_runs`` (a pandas DataFrame: ``metrics.*``, ``params.*``, ``tags.*`` columns).
A pipeline execution is

* a parent run and its child stage runs (``tags.mlflow.parentRunId``), when the pipeline logs one parent run per
  execution (tags ``dvc_experiment``, ``git_revision``, ``params_hash``; children tagged ``stage``);
* otherwise, for flat stage runs (one run per stage execution, tagged ``stage``), every run with the same
  ``dvc_experiment`` tag (``workspace`` when unset: a plain ``dvc repro``) and ``git_revision``.

A metric is named ``stage:metric`` (the newest run of that stage in the execution that logged it, e.g.
``evaluate:test/magrpo/reward``) or ``metric`` (the newest run of any stage that logged it). ``@`` is written as MLflow
stores it (``pass@1`` is ``pass_at_1``); either spelling is accepted.

A stage DVC did not run in an execution (its outputs unchanged or restored from DVC's cache) has no run there; its
metrics come from the run that the parent run links (tag ``cached_run.<stage>``,
:func:`orchestry.tracking.stage_cache.link_cached_stages`): the run that made the outputs the execution used.

Metric names are those of ``docs/metrics.md`` (:mod:`orchestry.tracking.metric_names`). Stage runs logged before that
vocabulary (no tag ``metric_vocabulary``) are read under the new names too (:func:`upgrade_legacy_metrics`), and a
``stage:metric`` written with an old name (``evaluate:magrpo/reward``) reads the new one (``test/magrpo/reward``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from orchestry.tracking.metric_names import PREFIXES, VOCABULARY_TAG, legacy_name, metric_name
from orchestry.tracking.stage_cache import CACHED_RUN_PREFIX, cached_run_tag

#: Evaluate's trained and base pass@1 and rewards on the test split (max 4.0), the trained pair's cooperation rate,
#: and MAGRPO's training reward (last quarter of the steps, and last minus first quarter): in the order
#: ``orchestry compare`` shows them, trained beside base.
DEFAULT_METRICS = (
    "evaluate:test/magrpo/pass_at_1",
    "evaluate:test/base/pass_at_1",
    "evaluate:test/magrpo/reward",
    "evaluate:test/base/reward",
    "evaluate:test/magrpo/cooperation_rate",
    "train_magrpo:train/summary/last_quarter_reward",
    "train_magrpo:train/summary/difference",
)
#: The bookkeeping columns of :func:`executions` (before the metrics); ``orchestry compare`` shows them after.
BOOKKEEPING = ("execution", "git_revision", "params_hash", "started", "stages", "status", "seconds", "cached")
#: Method names of ``test/<method>/...`` as ``orchestry compare``'s headers say them.
_HEADER_METHODS = {"magrpo": "trained", "base": "base"}
#: Metric names that ``orchestry compare``'s headers shorten (each word fits a narrow column).
_HEADER_METRICS = {
    "cooperation_rate": "coop. rate",
    "last_quarter_reward": "reward last quarter",
    "difference": "gain last − first",
}


def metric_header(spec: str) -> str:
    """A short column header for metric ``spec`` (``stage:name``; :func:`executions`): ``pass@1`` over
    ``trained`` for ``evaluate:test/magrpo/pass_at_1``, ``train last quarter reward`` for
    ``train_magrpo:train/summary/last_quarter_reward``; other names as they are, wrapped after their first ``/``."""
    name = spec.split(":", 1)[-1]
    parts = name.split("/")
    if len(parts) == 3 and parts[0] == "test":
        metric = _HEADER_METRICS.get(parts[2], parts[2].replace("_at_", "@").replace("_", " "))
        return f"{metric}\n{_HEADER_METHODS.get(parts[1], parts[1])}"
    if name.startswith("train/summary/"):
        rest = name.removeprefix("train/summary/")
        return "train " + _HEADER_METRICS.get(rest, rest.replace("_", " "))
    return name.replace("/", "/\n", 1)


PARENT = "tags.mlflow.parentRunId"
_TAGS = ("tags.stage", PARENT, "tags.dvc_experiment", "tags.git_revision", "tags.params_hash")
_STATUS_ORDER = ("FAILED", "KILLED", "RUNNING", "SCHEDULED", "FINISHED")  # an execution shows its worst stage


class CompareError(ValueError):
    """The store, experiment or a requested metric does not exist; the message says which."""


def load_runs(experiment: str, tracking_uri: str) -> pd.DataFrame:
    """Every run of ``experiment`` in the store at ``tracking_uri`` (``mlflow.search_runs``' DataFrame).

    Raises:
        CompareError: a ``sqlite:///`` store file that does not exist (it is not created), or no such experiment.
    """
    import mlflow

    if tracking_uri.startswith("sqlite:///"):
        db = Path(tracking_uri.removeprefix("sqlite:///"))
        if not db.is_file():
            raise CompareError(f"no MLflow store at {db} (run the pipeline first, or pass --tracking-uri)")
    client = mlflow.MlflowClient(tracking_uri)
    if client.get_experiment_by_name(experiment) is None:
        names = sorted(e.name for e in client.search_experiments())
        raise CompareError(
            f"no MLflow experiment {experiment!r} in {tracking_uri} (experiments: {', '.join(names) or 'none'})"
        )
    was_set = mlflow.tracking.is_tracking_uri_set()
    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(tracking_uri)
    try:
        return mlflow.search_runs(experiment_names=[experiment], output_format="pandas")
    finally:
        mlflow.set_tracking_uri(previous if was_set else None)


def _split(spec: str) -> tuple[str | None, str]:
    """``"stage:metric"`` -> ``(stage, MLflow metric name)``; ``"metric"`` -> ``(None, name)``. An old name of a
    stage (no prefix of the current vocabulary, e.g. ``evaluate:magrpo/reward``) becomes its current one."""
    stage, sep, name = spec.rpartition(":")
    name = metric_name(name)
    if sep and not name.startswith(PREFIXES):
        name = legacy_name(stage, name)
    return (stage if sep else None), name


def upgrade_legacy_metrics(runs: pd.DataFrame) -> pd.DataFrame:
    """``runs`` (``mlflow.search_runs``' frame) with each stage run logged before the current vocabulary (no tag
    ``metric_vocabulary``) also holding its metrics under their current names (:func:`legacy_name`; a renamed
    old metric wins over an old one that had the new name with another meaning, e.g. API-GRPO's per-episode
    ``cost/usd``). The old columns stay, so a bare old name still reads old runs."""
    tag = f"tags.{VOCABULARY_TAG}"
    if runs.empty or "tags.stage" not in runs:
        return runs
    legacy = runs["tags.stage"].notna() & (runs[tag].isna() if tag in runs else True)
    if not legacy.any():
        return runs
    df = runs.copy()
    cols = [c for c in df if c.startswith("metrics.")]
    new_cols: dict[str, pd.Series] = {}
    for stage in df.loc[legacy, "tags.stage"].unique():
        rows = legacy & (df["tags.stage"] == stage)
        for c in cols:
            old = c.removeprefix("metrics.")
            new = legacy_name(stage, old)
            if new == old:
                continue
            values = df.loc[rows, c].dropna()
            if values.empty:
                continue
            target = new_cols.setdefault(
                f"metrics.{new}",
                df[f"metrics.{new}"].copy()
                if f"metrics.{new}" in df
                else pd.Series(float("nan"), index=df.index),
            )
            target.loc[values.index] = values
    for c, s in new_cols.items():
        df[c] = s
    return df


def _grouped(runs: pd.DataFrame) -> pd.DataFrame:
    """``runs`` under the current metric names, oldest first, with column ``_group``: the key of the pipeline
    execution each run belongs to (its parent run's id, the parent's own id, or ``<dvc_experiment>@<git_revision>``
    for flat stage runs; module docstring)."""
    df = upgrade_legacy_metrics(runs).copy()
    for c in _TAGS:
        if c not in df:
            df[c] = None
    df = df.sort_values("start_time", kind="stable")
    parents = set(df[PARENT].dropna())
    flat_key = df["tags.dvc_experiment"].fillna("workspace") + "@" + df["tags.git_revision"].fillna("unknown")
    df["_group"] = df[PARENT].where(
        df[PARENT].notna(), df["run_id"].where(df["run_id"].isin(parents), flat_key)
    )
    return df


def _execution_head(
    g: pd.DataFrame, key: str, by_id: pd.DataFrame, link_cols: Sequence[str]
) -> tuple[str, str, dict[str, str]]:
    """``(name, git_revision, linked)`` of one pipeline execution: its DVC experiment (``workspace`` for a plain
    ``dvc repro``), its newest run's git revision (``""`` if none has one) and its cached-stage links
    ``{cached_run.<stage>: run id}`` (the parent run's tags whose runs are still in the store; module docstring).

    Args:
        g: the execution's runs (its parent run included), oldest first; key: its ``_group`` (:func:`_grouped`).
        by_id: every run, indexed by ``run_id``; link_cols: the ``tags.cached_run.*`` columns.
    """
    head = g[g["run_id"] == key]  # the parent run, when there is one
    info = head.iloc[0] if len(head) else g.iloc[-1]
    name = info["tags.dvc_experiment"]
    revisions = g["tags.git_revision"].dropna()
    linked = {
        c.removeprefix("tags."): info[c]
        for c in link_cols
        if len(head) and isinstance(info[c], str) and info[c] in by_id.index
    }
    return (
        (name if isinstance(name, str) and name else "workspace"),
        (revisions.iloc[-1] if len(revisions) else ""),
        linked,
    )


def executions(
    runs: pd.DataFrame, metrics: Sequence[str] = DEFAULT_METRICS, strict: bool = False
) -> pd.DataFrame:
    """One row per pipeline execution (module docstring), newest first.

    Columns: ``execution`` (the DVC experiment name, ``workspace`` for a plain ``dvc repro``), ``git_revision``,
    ``params_hash`` (empty for flat runs), ``started`` (earliest run start, a UTC timestamp), ``stages`` (distinct
    stage tags of the runs it made), ``status`` (the worst status of its runs: FAILED, KILLED, RUNNING, FINISHED),
    ``seconds`` (sum of its stages' ``cost/wall_seconds``), ``cached`` (stages it took from DVC's cache, linked to
    the runs that made them: tags ``cached_run.<stage>`` of the parent run), then one column per entry of
    ``metrics`` (NaN where not logged): a stage with no run in the execution is read from its linked run.

    Raises:
        CompareError: ``strict`` and a metric that no run (of the named stage) logged.
    """
    cols = [*BOOKKEEPING, *metrics]
    if runs.empty:
        return pd.DataFrame(columns=cols)
    df = _grouped(runs)
    if strict:
        for spec in metrics:
            stage, name = _split(spec)
            rows = df if stage is None else df[df["tags.stage"] == stage]
            if f"metrics.{name}" not in df or rows[f"metrics.{name}"].isna().all():
                where = f"stage {stage!r}" if stage else "any stage"
                known = sorted(c.removeprefix("metrics.") for c in df if c.startswith("metrics."))
                raise CompareError(
                    f"metric {name!r} was not logged by {where} (logged: {', '.join(known[:20]) or 'none'})"
                )
    by_id = df.set_index("run_id", drop=False)
    link_cols = [c for c in df if c.startswith(f"tags.{CACHED_RUN_PREFIX}")]
    out = []
    for key, g in df.groupby("_group", sort=False):
        # cached stages: tag cached_run.<stage> -> the run that made the outputs (when it is still in the store)
        name, revision, linked = _execution_head(g, key, by_id, link_cols)
        stages = g["tags.stage"].dropna()
        statuses = set(g["status"])
        row = {
            "execution": name,
            "git_revision": revision,
            "params_hash": g["tags.params_hash"].dropna().iloc[-1]
            if g["tags.params_hash"].notna().any()
            else "",
            "started": g["start_time"].min(),
            "stages": stages.nunique(),
            "status": next((s for s in _STATUS_ORDER if s in statuses), sorted(statuses)[0]),
            "seconds": g[g["tags.stage"].notna()]
            .get("metrics.cost/wall_seconds", pd.Series(dtype=float))
            .sum(),
            "cached": len(linked),
        }
        cached = by_id.loc[list(linked.values())].sort_values("start_time", kind="stable")
        for spec in metrics:
            stage, name = _split(spec)
            if stage is None:  # the newest run of this execution that logged it; cached stages' runs first
                rows = pd.concat([cached, g]) if len(cached) else g
            else:
                rows = g[g["tags.stage"] == stage]
                if rows.empty and cached_run_tag(stage) in linked:
                    rows = by_id.loc[[linked[cached_run_tag(stage)]]]
            values = rows[f"metrics.{name}"].dropna() if f"metrics.{name}" in rows else pd.Series(dtype=float)
            row[spec] = values.iloc[-1] if len(values) else float("nan")
        out.append(row)
    table = pd.DataFrame(out, columns=cols)
    return table.sort_values("started", ascending=False, kind="stable").reset_index(drop=True)


# -- seconds per stage ----------------------------------------------------------------------------------------------

#: Columns of :func:`stage_times`' table, one row per stage of an execution.
STAGE_TIME_COLUMNS = (
    "execution",
    "git_revision",
    "started",
    "wall_seconds",
    "cpu",
    "stage",
    "seconds",
    "cached",
    "warm_start_seconds",
)


def _machine(run: pd.Series) -> str:
    """``"<cpu> (<flags>, <n> threads)"`` from a stage run's ``machine.*`` tags (``""`` when it has none)."""
    cpu = run.get("tags.machine.cpu")
    if not isinstance(cpu, str):
        return ""
    flags, threads = run.get("tags.machine.cpu_flags"), run.get("tags.machine.threads")
    extra = [flags] if isinstance(flags, str) and flags else []
    if isinstance(threads, str) and threads:
        extra.append(f"{threads} threads")
    return f"{cpu} ({', '.join(extra)})" if extra else cpu


def stage_times(runs: pd.DataFrame, last: int = 3) -> pd.DataFrame:
    """Seconds of each stage in the newest ``last`` pipeline executions (module docstring), from MLflow.

    One row per (execution, stage), executions newest first, stages in the order the newest execution ran them
    (others after, in their first run's order). ``seconds`` is the stage run's ``cost/wall_seconds`` (its process
    from start to end, model loading included); a stage the execution took from DVC's cache has no run there:
    ``cached`` True and ``seconds`` NaN. A stage run twice in one execution (flat runs of one git revision)
    counts its newest run. ``wall_seconds`` is the execution's span, from its first stage run's start to its last
    one's end (NaN while one runs), so ``wall_seconds`` minus the sum of ``seconds`` is what DVC and the stage
    processes spent outside the stages' own timing. ``cpu`` names the machine of the execution's newest stage run
    (tags ``machine.*``: model, flags, threads); ``warm_start_seconds``: the MAGRPO stage's supervised warm start
    (``train/summary/warm_start_seconds``), NaN for other stages.

    Returns:
        a DataFrame with :data:`STAGE_TIME_COLUMNS`; empty when no run is tagged with a stage.

    Raises:
        ValueError: ``last`` < 1.
    """
    if last < 1:
        raise ValueError(f"last must be at least 1, got {last}")
    if runs.empty or "tags.stage" not in runs or runs["tags.stage"].isna().all():
        return pd.DataFrame(columns=STAGE_TIME_COLUMNS)
    df = _grouped(runs)
    by_id = df.set_index("run_id", drop=False)
    staged = df[df["tags.stage"].notna()]
    order = staged.groupby("_group", sort=False)["start_time"].min().sort_values(ascending=False)
    link_cols = [c for c in df if c.startswith(f"tags.{CACHED_RUN_PREFIX}")]
    warm = "metrics.train/summary/warm_start_seconds"
    rows: list[dict] = []
    stage_order: list[str] = []
    for i, key in enumerate(order.index[:last]):
        name, revision, linked = _execution_head(df[df["_group"] == key], key, by_id, link_cols)
        g = staged[staged["_group"] == key].drop_duplicates("tags.stage", keep="last")
        ended = g["end_time"] if "end_time" in g else pd.Series(float("nan"), index=g.index)
        running = bool(ended.isna().any() or (g["status"] == "RUNNING").any())
        common = {
            "execution": name,
            "git_revision": revision,
            "started": g["start_time"].min(),
            "wall_seconds": float("nan")
            if running
            else (ended.max() - g["start_time"].min()).total_seconds(),
            "cpu": _machine(g.iloc[-1]),
            "_exec": i,
        }
        ran = [
            {**common, "stage": run["tags.stage"], "seconds": float(run.get("metrics.cost/wall_seconds", float("nan"))),
             "cached": False, "warm_start_seconds": float(run[warm]) if warm in run else float("nan"),
             "_at": run["start_time"]}
            for _, run in g.iterrows()
        ]  # fmt: skip
        # stages taken from DVC's cache (the runs the parent links), placed by their own start
        names = set(g["tags.stage"])
        cached = [
            {**common, "stage": by_id.at[r, "tags.stage"], "seconds": float("nan"), "cached": True,
             "warm_start_seconds": float("nan"), "_at": by_id.at[r, "start_time"]}
            for r in linked.values()
            if isinstance(by_id.at[r, "tags.stage"], str) and by_id.at[r, "tags.stage"] not in names
        ]  # fmt: skip
        mine = sorted(ran + cached, key=lambda r: r["_at"])
        stage_order += [r["stage"] for r in mine if r["stage"] not in stage_order]
        rows += mine
    table = pd.DataFrame(rows, columns=[*STAGE_TIME_COLUMNS, "_exec", "_at"])
    table["_stage"] = table["stage"].map({s: i for i, s in enumerate(stage_order)})
    table = table.sort_values(["_exec", "_stage"], kind="stable")
    return table.drop(columns=["_exec", "_at", "_stage"]).reset_index(drop=True)


# -- paired comparison of two methods' evaluation samples ---------------------------------------------------------

#: Per-sample quantities compared by :func:`paired_comparison`: the level reward (total, max 4.0, and each level),
#: the pass flag, the gated cooperation flag (cooperation points > 0), the ungated ``aux`` facts and truncation.
SAMPLE_METRICS = (
    "total",
    "structure",
    "syntax",
    "tests",
    "cooperation",
    "pass",
    "coop_rate",
    "aux_defined",
    "aux_called",
    "aux_used",
    "truncated",
)


def _sample_value(r: dict, key: str) -> float | None:
    from orchestry.analysis.metrics import is_pass

    if key == "pass":
        return float(is_pass(r))
    if key == "coop_rate":
        return float(r.get("cooperation", 0) > 0)
    v = r.get(key)
    return None if v is None else float(v)


def read_samples(path: str | Path) -> list[dict]:
    """The records of a JSONL sample file (one JSON object per line, each with a ``task_id``).

    Raises:
        CompareError: the file is missing or unreadable, a line is not a JSON object, or lacks ``task_id``.
    """
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise CompareError(f"{path}: cannot read ({e.strerror or e})") from None
    out = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            r = json.loads(line)
        except json.JSONDecodeError as e:
            raise CompareError(f"{path}:{n}: not JSON ({e.msg})") from None
        if not isinstance(r, dict) or "task_id" not in r:
            raise CompareError(f"{path}:{n}: a sample record needs a task_id")
        out.append(r)
    return out


def per_problem_means(records: Sequence[dict], key: str) -> dict[str, float]:
    """``task_id`` -> mean of ``key`` over that problem's samples (samples that lack ``key`` are left out)."""
    sums: dict[str, list[float]] = {}
    for r in records:
        v = _sample_value(r, key)
        if v is not None:
            sums.setdefault(r["task_id"], []).append(v)
    return {t: sum(v) / len(v) for t, v in sums.items()}


def paired_comparison(
    reference: Sequence[dict],
    other: Sequence[dict],
    metrics: Sequence[str] = SAMPLE_METRICS,
    confidence: float = 0.95,
    n_boot: int = 10_000,
    seed: int = 0,
) -> pd.DataFrame:
    """``other`` minus ``reference``, paired by problem, for each per-sample metric.

    Each method's value on a problem is the mean over its samples of that problem; the table's means are over the
    problems both methods were evaluated on, and each interval is a percentile bootstrap over those problems
    (``n_boot`` resamples; the difference's resamples whole problems, so it is paired). Records are the
    ``evaluate`` stage's (``reports/eval/*.jsonl``) or a baseline's (``reports/baselines/*.jsonl``).

    Returns:
        one row per metric that both inputs record: ``metric``, ``n_problems``, ``reference``, ``reference_low``,
        ``reference_high``, ``other``, ``other_low``, ``other_high``, ``diff``, ``diff_low``, ``diff_high``,
        ``excludes_zero`` (the difference's interval lies on one side of 0).

    Raises:
        CompareError: an empty input, an unknown metric, or no problem in common.
    """
    from orchestry.analysis.metrics import bootstrap_ci

    if not reference or not other:
        raise CompareError("both sample files need at least one record")
    unknown = [m for m in metrics if m not in SAMPLE_METRICS]
    if unknown:
        raise CompareError(f"unknown metric(s) {', '.join(unknown)} (known: {', '.join(SAMPLE_METRICS)})")
    ref_tasks = {r["task_id"] for r in reference}
    shared = sorted(ref_tasks & {r["task_id"] for r in other})
    if not shared:
        raise CompareError("the two sample files have no problem (task_id) in common")
    rows = []
    for m in metrics:
        a, b = per_problem_means(reference, m), per_problem_means(other, m)
        tasks = [t for t in shared if t in a and t in b]
        if not tasks:
            continue  # e.g. truncation not recorded by an older run
        xa, xb = [a[t] for t in tasks], [b[t] for t in tasks]
        d = [y - x for x, y in zip(xa, xb, strict=True)]
        ci = [bootstrap_ci(v, confidence, n_boot, seed) for v in (xa, xb, d)]
        rows.append(
            {
                "metric": m,
                "n_problems": len(tasks),
                "reference": sum(xa) / len(xa),
                "reference_low": ci[0][0],
                "reference_high": ci[0][1],
                "other": sum(xb) / len(xb),
                "other_low": ci[1][0],
                "other_high": ci[1][1],
                "diff": sum(d) / len(d),
                "diff_low": ci[2][0],
                "diff_high": ci[2][1],
                "excludes_zero": ci[2][0] > 0 or ci[2][1] < 0,
            }
        )
    return pd.DataFrame(rows)


def plot_paired(
    tables: Sequence[pd.DataFrame], labels: Sequence[str], out_png: str | Path, dpi: int = 120
) -> None:
    """One panel per metric: each compared method's difference to the reference (a dot) with its interval (a bar),
    from :func:`paired_comparison` tables; a dashed line at 0. The reward levels share one panel scale each."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = [m for m in SAMPLE_METRICS if any(m in set(t["metric"]) for t in tables)]
    if not metrics:
        raise CompareError("nothing to plot: the tables have no metric")
    cols = min(4, len(metrics))
    rows = (len(metrics) + cols - 1) // cols
    fig, axes = plt.subplots(
        rows, cols, figsize=(3.2 * cols, 0.5 * len(labels) * rows + 1.6 * rows), squeeze=False
    )
    for ax, m in zip(axes.flat, metrics, strict=False):
        if len(tables) != len(labels):
            raise CompareError(f"{len(labels)} labels for {len(tables)} tables")
        for i, t in enumerate(tables):
            r = t[t["metric"] == m]
            if r.empty:
                continue
            r = r.iloc[0]
            ax.errorbar(r["diff"], i, xerr=[[r["diff"] - r["diff_low"]], [r["diff_high"] - r["diff"]]], fmt="o",
                        color="C3" if r["excludes_zero"] else "C0", capsize=3)  # fmt: skip
        ax.axvline(0, color="grey", ls="--", lw=1)
        ax.set_yticks(range(len(labels)), labels)
        ax.set_ylim(-0.6, len(labels) - 0.4)
        ax.set_title(m, fontsize=9)
        ax.tick_params(labelsize=8)
    for ax in list(axes.flat)[len(metrics) :]:
        ax.axis("off")
    fig.suptitle("difference to the reference, paired by problem (red: interval excludes 0)", fontsize=10)
    fig.tight_layout()
    Path(out_png).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png, dpi=dpi)
    plt.close(fig)
