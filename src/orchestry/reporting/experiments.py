"""DVC experiments gathered into one table: per-seed values of a metric and an interval over seeds.

``dvc exp run --queue -S train_magrpo.seed=1 ...`` then ``dvc exp run --run-all`` leaves one experiment per
seed; :func:`collect` reads them from ``dvc exp show --json`` (the real DVC output, no private API), plus the
summaries that are plain outputs, not DVC metrics (``reports/metrics.json``, ...), from each revision's git commit,
and :func:`seed_table` aggregates one metric over them: mean over seeds with a percentile bootstrap interval over
seeds (the seeds are the resampled unit; with 3 seeds the interval is coarse and says so by its width).
"""

from __future__ import annotations

import copy
import json
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path

import pandas as pd

from orchestry.analysis.metrics import bootstrap_ci
from orchestry.tracking.execution import _flatten


def _runs(nodes: list) -> Iterator[dict]:
    """Every finished revision in ``dvc exp show --json`` (workspace, baseline commits and their experiments).

    Queued, running and failed experiments are skipped: while an experiment runs, DVC shows its baseline's
    metrics files under its name, which would count a stale result as a new seed."""
    for node in nodes or ():
        if isinstance(node, dict) and isinstance(node.get("data"), dict):
            yield node
        for exp in (node or {}).get("experiments") or ():
            state = ((exp or {}).get("executor") or {}).get("state")
            if state in (None, "success"):
                yield from _runs(exp.get("revs") or [])


def parse_exp_show(payload: list) -> pd.DataFrame:
    """One row per revision of ``dvc exp show --json``: ``name``, ``rev``, then ``param:<file>:<key>`` and
    ``metric:<file>:<key>`` columns (nested keys joined by dots). Metrics files that failed to load are
    left out of that row."""
    rows = []
    for run in _runs(payload):
        data = run["data"]
        row = {"name": run.get("name") or run.get("rev"), "rev": run.get("rev")}
        for kind in ("params", "metrics"):
            for fname, content in (data.get(kind) or {}).items():
                if isinstance(content, dict) and isinstance(content.get("data"), dict):
                    for k, v in _flatten(content["data"]).items():
                        row[f"{kind[:-1]}:{fname}:{k}"] = v
        rows.append(row)
    return pd.DataFrame(rows)


#: Summaries that are ``cache: false`` outputs, not DVC metrics (only ``reports/key_metrics.json`` is, so that
#: ``dvc exp show`` stays readable): git commits them with each experiment, :func:`collect` reads them from there.
SUMMARIES = ("reports/metrics.json", "reports/train/magrpo.json")


def output_at(repo: str | Path, rev: str | None, path: str, env: dict | None = None) -> dict | None:
    """The JSON file ``path`` of revision ``rev`` of ``repo`` (a commit or an experiment's commit, as ``dvc exp
    show --json`` names it; ``workspace`` or ``None``: the file on disk); ``None`` when it is absent or not a
    JSON object."""
    if rev in (None, "workspace"):
        f = Path(repo) / path
        text = f.read_text() if f.is_file() else None
    else:
        cp = subprocess.run(["git", "show", f"{rev}:{path}"], cwd=repo, env=env, capture_output=True, text=True,
                            check=False)  # fmt: skip
        text = cp.stdout if cp.returncode == 0 else None
    try:
        data = json.loads(text) if text else None
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def with_outputs(
    payload: list, repo: str | Path, files: Sequence[str] = SUMMARIES, env: dict | None = None
) -> list:
    """``payload`` (``dvc exp show --json``) with each of ``files`` that a finished revision lacks among its
    metrics read from that revision's commit (:func:`output_at`), so :func:`parse_exp_show` makes ``metric:``
    columns of them as of the DVC metrics. Changes ``payload`` in place and returns it."""
    for node in _runs(payload):
        metrics = node["data"].get("metrics")
        if not isinstance(metrics, dict):
            metrics = node["data"]["metrics"] = {}
        for path in files:
            if path not in metrics and (data := output_at(repo, node.get("rev"), path, env)) is not None:
                metrics[path] = {"data": data}
    return payload


def collect(repo: str | Path = ".", dvc: str = "dvc", outputs: Sequence[str] = SUMMARIES) -> pd.DataFrame:
    """Run ``dvc exp show --json --all-commits`` in ``repo`` and parse it (see :func:`parse_exp_show`), with the
    JSON ``outputs`` of each revision that are not DVC metrics (:func:`with_outputs`).

    Raises:
        RuntimeError: DVC failed (message is DVC's stderr).
    """
    cp = subprocess.run(
        [dvc, "exp", "show", "--json", "--all-commits"], cwd=repo, capture_output=True, text=True, check=False
    )
    if cp.returncode != 0:
        raise RuntimeError(f"dvc exp show failed: {cp.stderr.strip()[:500]}")
    return parse_exp_show(with_outputs(json.loads(cp.stdout), repo, outputs))


def _is_missing(value: object) -> bool:
    return value is None or (isinstance(value, float) and value != value)


def _same_param(a: object, b: object) -> bool:
    """Equality of two params values as DVC reports them: scalars, lists (e.g. per-turn weights) or missing."""
    if _is_missing(a) or _is_missing(b):
        return _is_missing(a) and _is_missing(b)
    return bool(a == b)


def seed_table(
    df: pd.DataFrame,
    seed_param: str,
    metrics: Sequence[str],
    confidence: float = 0.95,
    resamples: int = 10_000,
    vary: Sequence[str] | None = ("param:params.yaml:evaluate.seed",),
    like: str | None = None,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per-seed values of ``metrics`` (column names of ``df``; ``A - B`` means the difference of two columns)
    and their mean over seeds with a bootstrap interval over seeds.

    Only one configuration is aggregated: the reference is the first row (in ``df``'s order: workspace, then
    newest commits with their experiments) that has any of the metrics, and a row counts only if every other
    ``param:`` column equals the reference's, except ``seed_param`` and the columns in ``vary`` (default: the
    evaluation seed). So variants swept in the same repository (``-S train_magrpo.turns=2``) never mix into the
    default's seeds. ``vary=None`` turns the check off. ``like`` names the reference row instead (an
    experiment's name, e.g. ``turns2``): the seeds of that variant are aggregated. Experiments with the same seed
    (e.g. the workspace and the commit or experiment it came from) count once: the first such row per seed. Rows
    lacking a metric are dropped for that metric.

    Returns:
        (per_seed, summary): ``per_seed`` indexed by seed with one column per metric, its
        ``attrs["left_out"]`` the names of the rows with metrics left out for other params; ``summary`` with rows
        per metric and columns ``n_seeds, mean, ci_low, ci_high, excludes_zero``.

    Raises:
        KeyError: ``seed_param`` or a metric column is not in ``df``, or no row is named ``like``.
    """
    if seed_param not in df.columns:
        raise KeyError(
            f"no column {seed_param!r}; params columns: {[c for c in df.columns if c.startswith('param:')]}"
        )
    values = pd.DataFrame(index=df.index)
    for m in metrics:
        if m in df.columns:
            values[m] = pd.to_numeric(df[m], errors="coerce")
        elif " - " in m and all(p in df.columns for p in m.split(" - ", 1)):
            a, b = m.split(" - ", 1)
            values[m] = pd.to_numeric(df[a], errors="coerce") - pd.to_numeric(df[b], errors="coerce")
        else:
            raise KeyError(f"no metric column {m!r}")
    values[seed_param] = df[seed_param]
    # Rows without any of the metrics (e.g. an old commit whose reports predate them) never stand for a seed;
    # of the rest, the first per seed wins: the workspace, then the newest commit and its experiments.
    values = values.dropna(subset=[seed_param]).dropna(subset=list(metrics), how="all")
    left_out: list[str] = []
    names = df["name"] if "name" in df.columns else pd.Series(df.index.astype(str), index=df.index)
    reference = values.index[0] if len(values) else None
    if like is not None:
        named = [i for i in values.index if names.loc[i] == like]
        if not named:
            raise KeyError(
                f"no experiment named {like!r} with the metrics; named ones: {sorted(set(names))[:20]}"
            )
        reference = named[0]
    if vary is not None and reference is not None:
        free = {seed_param, *vary}
        fixed = [c for c in df.columns if c.startswith("param:") and c not in free]
        ref = df.loc[reference, fixed]
        same = df.loc[values.index, fixed].apply(
            lambda row: all(_same_param(a, b) for a, b in zip(row, ref, strict=True)), axis=1
        )
        left_out = [str(n) for n in names.loc[same.index[~same]]]
        values = values[same]
    per_seed = values.groupby(seed_param, sort=True).head(1).set_index(seed_param).sort_index()
    per_seed.attrs["left_out"] = left_out
    rows = []
    for m in metrics:
        vals = [float(v) for v in per_seed[m].dropna()]
        lo, hi = bootstrap_ci(vals, confidence, resamples) if vals else (float("nan"), float("nan"))
        mean = sum(vals) / len(vals) if vals else float("nan")
        rows.append({"metric": m, "n_seeds": len(vals), "mean": mean, "ci_low": lo, "ci_high": hi,
                     "excludes_zero": bool(vals) and (lo > 0 or hi < 0)})  # fmt: skip
    return per_seed, pd.DataFrame(rows).set_index("metric")


def preset_overrides(preset: str | Path, params: str | Path = "params.yaml") -> list[str]:
    """The ``key=value`` overrides of an experiment preset, for ``dvc exp run -S``.

    A preset (``configs/experiments/*.yaml``) maps dotted params keys to values. The overrides are checked
    against the params schema first (applied to ``params`` in memory), so a misspelt key or a bad value fails
    here with the params error, before any experiment is queued.

    Raises:
        orchestry.params_file.ParamsError: the preset is not a mapping, or the patched params are invalid.
    """
    import yaml

    from orchestry.params_file import ParamsError, UniqueKeyLoader, parse_params, read_params_mapping

    text = Path(preset).read_text()
    try:
        data = yaml.load(text, Loader=UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as e:
        raise ParamsError(f"{preset}: {e}") from e
    if not isinstance(data, dict) or not data:
        raise ParamsError(f"{preset}: expected a mapping of dotted params keys to values")
    base = read_params_mapping(params)
    patched = copy.deepcopy(base)
    for key, value in data.items():
        node = patched
        *parents, leaf = str(key).split(".")
        for p in parents:
            if not isinstance(node.get(p), dict):
                raise ParamsError(f"{preset}: {key}: no section {p!r} in {params}")
            node = node[p]
        if leaf not in node:
            raise ParamsError(f"{preset}: {key}: no such key in {params}")
        node[leaf] = value
    parse_params(patched, source=f"{params} + {preset}")
    return [
        f"{k}={yaml.safe_dump(v, default_flow_style=True).strip().removesuffix('...').strip()}"
        for k, v in data.items()
    ]


# python -m orchestry.reporting.experiments overrides PRESET: the -S arguments of a preset
if __name__ == "__main__":
    import sys

    if len(sys.argv) != 3 or sys.argv[1] != "overrides":
        sys.exit("usage: python -m orchestry.reporting.experiments overrides configs/experiments/NAME.yaml")
    print(" ".join(f"-S {o}" for o in preset_overrides(sys.argv[2])))
