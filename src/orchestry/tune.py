"""Hyper-parameter search on Optuna where every trial is a DVC experiment (``orchestry tune``, docs/tuning.md).

A space file (:func:`load_space`) names the objective (a dotted key of ``reports/metrics.json`` and a
direction), the searched params keys with their ranges, params fixed for every trial, and the sampler's seed.
:func:`tune` asks Optuna's TPE sampler for values and runs each trial as ``dvc exp run --temp -n NAME -S key=value
...`` in the repository, so each trial is an ordinary DVC experiment (reproducible, listed by ``dvc exp show``,
``dvc exp apply``-able), whose stage runs land in MLflow tagged ``optuna_study`` and ``optuna_trial`` (the
stages read :data:`orchestry.tracking.execution.TUNE_STUDY_ENV` / :data:`~orchestry.tracking.execution.TUNE_TRIAL_ENV`); the
objective is read back from the experiment's ``reports/metrics.json``: its commit, named by ``dvc exp show --json``
(the file is a plain output, not a DVC metric, so that ``dvc exp show`` stays readable).

The study lives in an Optuna storage: by default ``sqlite:///<repo>/.orchestry/optuna.db`` (git-ignored, outside
DVC's outputs), or any database URL Optuna's RDB storage takes (``postgresql://...``, ``mysql+pymysql://...``), so
several machines can work on one study. Re-running with the same study name continues it.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import os
import re
import subprocess
import sys
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union, get_args, get_origin

import yaml

from orchestry.tracking.execution import TUNE_STUDY_ENV, TUNE_TRIAL_ENV

#: Default storage file, relative to the repository root (``/.orchestry/`` is git-ignored).
DEFAULT_STORAGE_FILE = ".orchestry/optuna.db"
#: The metrics file the objective is read from.
METRICS_FILE = "reports/metrics.json"
#: Top-level sections of ``reports/metrics.json`` measured on the validation split: the only objectives allowed
#: without ``--allow-test``.
VAL_SECTIONS = ("val",)
#: Top-level sections of ``reports/metrics.json`` measured on test problems (the test split, HumanEval's test
#: split as a transfer set, API-GRPO's with/without comparison on test problems).
TEST_SECTIONS = ("methods", "trained_minus_base", "transfer", "api_grpo", "test_problems")
#: Heartbeat of a running trial in the storage (seconds) and how long without one makes a trial stale (failed,
#: then re-queued once with the same params by the next worker).
HEARTBEAT_S = 60
GRACE_S = 180
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")


class SpaceError(ValueError):
    """The space file (or a tune option) is unusable; the message is one line naming the file and the key."""


class TrialFailed(RuntimeError):
    """A trial's ``dvc exp run`` failed, or its experiment has no objective value."""


@dataclass(frozen=True)
class Dimension:
    """One searched params key: ``kind`` ``float``/``int`` with ``low``..``high`` (``log``, ``step``), or
    ``categorical`` with ``choices``."""

    key: str
    kind: str
    low: float | int | None = None
    high: float | int | None = None
    log: bool = False
    step: float | int | None = None
    choices: tuple = ()


@dataclass(frozen=True)
class Space:
    """A parsed space file (:func:`load_space`)."""

    objective: str
    direction: str
    dimensions: tuple[Dimension, ...]
    fixed: dict[str, Any] = field(default_factory=dict)
    seed: int = 0
    startup_trials: int = 10
    study: str | None = None
    path: str = ""


# ---------------------------------------------------------------- the space file


def _params_field(key: str):
    """The pydantic field of dotted params key ``key`` (a leaf of :class:`orchestry.config.Params`).

    Raises:
        SpaceError: no such key, or the key is a section (naming the allowed keys).
    """
    from pydantic import BaseModel

    from orchestry.config import Params

    model: Any = Params
    parts = key.split(".")
    for i, part in enumerate(parts):
        fields = model.model_fields
        if part not in fields:
            where = ".".join(parts[:i]) or "params.yaml"
            raise SpaceError(f"{key}: unknown params key ({where} has: {', '.join(fields)})")
        info = fields[part]
        ann = info.annotation
        if i < len(parts) - 1:
            if not (isinstance(ann, type) and issubclass(ann, BaseModel)):
                raise SpaceError(f"{key}: {'.'.join(parts[: i + 1])} is not a section")
            model = ann
        elif isinstance(ann, type) and issubclass(ann, BaseModel):
            raise SpaceError(f"{key}: is a section; name one of its keys ({', '.join(ann.model_fields)})")
    return info


def _kind(info) -> str:
    """``int``, ``float`` or ``other`` for a params field (``X | None`` counts as ``X``)."""
    ann = info.annotation
    args = (
        [a for a in get_args(ann) if a is not type(None)]
        if get_origin(ann) in (Union, type(int | None))
        else []
    )
    if len(args) == 1:
        ann = args[0]
    if ann is bool:
        return "other"
    if ann is int:
        return "int"
    if ann is float:
        return "float"
    return "other"


def _number(value: Any, what: str) -> float | int:
    """A finite int or float (YAML 1.1 reads ``1e-4`` as a string: such strings are parsed too)."""
    if isinstance(value, bool):
        raise SpaceError(f"{what}: expected a number, got {value!r}")
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise SpaceError(f"{what}: expected a number, got {value!r}") from None
    if not isinstance(value, int | float) or not math.isfinite(value):
        raise SpaceError(f"{what}: expected a finite number, got {value!r}")
    return value


def _dimension(key: str, spec: Any) -> Dimension:
    info = _params_field(key)
    kind = _kind(info)
    if isinstance(spec, list):
        spec = {"choices": spec}
    if not isinstance(spec, Mapping):
        raise SpaceError(f"{key}: expected {{low, high[, log, step]}} or {{choices: [...]}}, got {spec!r}")
    extra = set(spec) - {"low", "high", "log", "step", "choices"}
    if extra:
        raise SpaceError(f"{key}: unknown range key(s) {', '.join(sorted(map(str, extra)))} "
                         "(allowed: low, high, log, step, choices)")  # fmt: skip
    if "choices" in spec:
        if set(spec) != {"choices"}:
            raise SpaceError(f"{key}: choices cannot be combined with low/high/log/step")
        choices = spec["choices"]
        if not isinstance(choices, list) or not choices:
            raise SpaceError(f"{key}: empty range (choices must be a non-empty list)")
        if len({json.dumps(c, sort_keys=True) for c in choices}) != len(choices):
            raise SpaceError(f"{key}: a choice is listed twice")
        if any(not isinstance(c, (str, int, float, bool)) and c is not None for c in choices):
            raise SpaceError(f"{key}: choices must be scalars (str, number, bool, null)")
        return Dimension(key, "categorical", choices=tuple(choices))
    if "low" not in spec or "high" not in spec:
        raise SpaceError(f"{key}: a range needs both low and high (or choices)")
    if kind == "other":
        raise SpaceError(f"{key}: not a number ({info.annotation}); give choices: [...]")
    low, high = _number(spec["low"], f"{key}.low"), _number(spec["high"], f"{key}.high")
    log = spec.get("log", False)
    if not isinstance(log, bool):
        raise SpaceError(f"{key}.log: expected true or false, got {log!r}")
    step = None if spec.get("step") is None else _number(spec["step"], f"{key}.step")
    if kind == "int":
        for name, v in (("low", low), ("high", high), ("step", step)):
            if v is not None and float(v) != int(v):
                raise SpaceError(f"{key}.{name}: {key} is an integer, got {v!r}")
        low, high = int(low), int(high)
        step = None if step is None else int(step)
    else:
        low, high = float(low), float(high)
        step = None if step is None else float(step)
    if low >= high:
        raise SpaceError(f"{key}: empty range (low {low!r} must be below high {high!r}; a fixed value goes "
                         "under fixed:)")  # fmt: skip
    if step is not None and (step <= 0 or step > high - low):
        raise SpaceError(f"{key}.step: must be in (0, high - low], got {step!r}")
    if log and step is not None:
        raise SpaceError(f"{key}: log and step cannot be combined")
    if log and low <= 0:
        raise SpaceError(f"{key}: a log range needs low > 0, got {low!r}")
    return Dimension(key, kind, low=low, high=high, log=log, step=step)


def check_objective(name: str, allow_test: bool = False) -> str:
    """``name`` if it may be optimised: a dotted key under ``val.`` of ``reports/metrics.json``; any other key
    only with ``allow_test`` (every other result in that file is measured on test problems).

    Raises:
        SpaceError: an empty name, or a non-validation metric without ``allow_test``.
    """
    if not isinstance(name, str) or not name.strip() or any(not p for p in name.split(".")):
        raise SpaceError(f"objective: expected a dotted key of {METRICS_FILE}, got {name!r}")
    top = name.split(".", 1)[0]
    if top in VAL_SECTIONS or allow_test:
        return name
    where = "is measured on test problems" if top in TEST_SECTIONS else "is not a validation-split metric"
    raise SpaceError(
        f"objective {name!r} {where}: choosing hyper-parameters on the test split makes its results optimistic "
        "(the test problems would select the model); optimise a val.* metric (evaluate.val: true) or pass "
        "--allow-test"
    )


def load_space(path: str | Path, params: str | Path = "params.yaml", allow_test: bool = False) -> Space:
    """Read and check a space file against the params schema (:mod:`orchestry.config`) and ``params``.

    The file::

        objective: val.methods.magrpo.reward   # dotted key of reports/metrics.json
        direction: maximize                    # or minimize
        seed: 0                                # TPE sampler seed (default 0)
        startup_trials: 10                     # random trials before TPE models the results (default 10)
        study: lr-search                       # default study name (else the file's stem)
        fixed:                                 # set in every trial (-S), e.g. the validation evaluation
          evaluate.val: true
        params:                                # searched keys
          train_magrpo.learning_rate: {low: 1.0e-4, high: 1.0e-2, log: true}
          train_magrpo.num_generations: {low: 2, high: 8, step: 2}
          train_magrpo.advantage: {choices: [mean, rloo]}

    Every key must be a params key (its type decides an int or a float range); the range's ends, each choice
    and each fixed value are applied to ``params`` in memory and validated by the params schema, so a value
    the stages would refuse fails here.

    Raises:
        SpaceError: one line naming the file and what is wrong (unknown key, empty range, bad value, ...).
    """
    from orchestry.params_file import ParamsError, UniqueKeyLoader, parse_params

    path = Path(path)
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=UniqueKeyLoader)  # noqa: S506 - SafeLoader
    except (OSError, UnicodeDecodeError) as e:
        raise SpaceError(f"{path}: cannot be read: {e}") from None
    except yaml.YAMLError as e:
        raise SpaceError(f"{path}: not valid YAML: {' '.join(str(e).split())}") from None
    try:
        if not isinstance(data, dict):
            raise SpaceError("expected a mapping with objective, direction and params")
        unknown = set(data) - {"objective", "direction", "seed", "startup_trials", "study", "fixed", "params"}
        if unknown:
            raise SpaceError(f"unknown key(s) {', '.join(sorted(map(str, unknown)))} (allowed: objective, "
                             "direction, seed, startup_trials, study, fixed, params)")  # fmt: skip
        objective = check_objective(data.get("objective"), allow_test)
        direction = data.get("direction", "maximize")
        if direction not in ("maximize", "minimize"):
            raise SpaceError(f"direction: expected maximize or minimize, got {direction!r}")
        seed = data.get("seed", 0)
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**32:
            raise SpaceError(f"seed: expected an integer in [0, 2**32), got {seed!r}")
        startup = data.get("startup_trials", 10)
        if isinstance(startup, bool) or not isinstance(startup, int) or not 0 <= startup <= 10_000:
            raise SpaceError(f"startup_trials: expected an integer in [0, 10000], got {startup!r}")
        study = data.get("study")
        if study is not None:
            check_study_name(study)
        searched = data.get("params")
        if not isinstance(searched, dict) or not searched:
            raise SpaceError("params: expected a non-empty mapping of params keys to ranges")
        fixed = data.get("fixed") or {}
        if not isinstance(fixed, dict):
            raise SpaceError("fixed: expected a mapping of params keys to values")
        dims = tuple(_dimension(str(k), v) for k, v in searched.items())
        for k in fixed:
            _params_field(str(k))
            if k in searched:
                raise SpaceError(f"{k}: both searched and fixed")
        _check_values(dims, {str(k): v for k, v in fixed.items()}, params, parse_params)
    except SpaceError as e:
        raise SpaceError(f"{path}: {e}") from None
    except ParamsError as e:
        raise SpaceError(f"{path}: {' '.join(str(e).split())}") from None
    return Space(objective, direction, dims, {str(k): v for k, v in fixed.items()}, seed, startup, study,
                 str(path))  # fmt: skip


def _set(tree: dict, key: str, value: Any) -> None:
    node = tree
    *parents, leaf = key.split(".")
    for p in parents:
        if not isinstance(node.get(p), dict):
            node[p] = {}
        node = node[p]
    node[leaf] = value


def _check_values(dims: Sequence[Dimension], fixed: Mapping[str, Any], params: str | Path, parse) -> None:
    """Each range end and choice (with the fixed values) applied to ``params`` must pass the params schema."""
    from orchestry.params_file import ParamsError, read_params_mapping

    p = Path(params)
    base = read_params_mapping(p) if p.is_file() else {}
    with_fixed = copy.deepcopy(base)
    for k, v in fixed.items():
        _set(with_fixed, k, v)
    parse(with_fixed, source=f"{params} + fixed")
    for d in dims:
        values = d.choices if d.kind == "categorical" else (d.low, d.high)
        for v in values:
            patched = copy.deepcopy(with_fixed)
            _set(patched, d.key, v)
            try:
                parse(patched, source=f"{params} + {d.key}={v!r}")
            except ParamsError as e:
                msg = " ".join(str(e).split())
                raise SpaceError(f"{d.key}: the value {v!r} is refused by the params schema: {msg}") from None


def check_study_name(name: Any) -> str:
    """A study name usable in DVC experiment names: letters, digits, ``-``, ``_`` (at most 64).

    Raises:
        SpaceError: otherwise.
    """
    if not isinstance(name, str) or not _NAME.match(name):
        raise SpaceError(f"study: {name!r} is not a usable name (letters, digits, '-', '_'; at most 64)")
    return name


# ---------------------------------------------------------------- running trials


def storage_url(repo: str | Path, storage: str | None = None) -> str:
    """``storage`` if given, else ``sqlite:///<repo>/.orchestry/optuna.db`` (its folder is created)."""
    if storage:
        return storage
    path = Path(repo).resolve() / DEFAULT_STORAGE_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{path}"


def open_storage(url: str):
    """Optuna's RDB storage at ``url`` with a heartbeat: a trial whose worker died (no heartbeat for
    :data:`GRACE_S` s) is marked failed and re-queued once with the same params."""
    import optuna

    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    kwargs = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {}
    return optuna.storages.RDBStorage(
        url,
        engine_kwargs=kwargs,
        heartbeat_interval=HEARTBEAT_S,
        grace_period=GRACE_S,
        heartbeat_stale_trial_callback=optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=1),
    )


def override(key: str, value: Any) -> str:
    """``key=value`` for ``dvc exp run -S`` (the value as flow-style YAML, as the presets write it)."""
    text = yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()
    return f"{key}={text}"


def experiment_name(study: str, number: int) -> str:
    """The DVC experiment of trial ``number``: ``<study>-t<number>``."""
    return f"{study}-t{number}"


def _lookup(data: Mapping, dotted: str) -> Any:
    """``data``'s value at ``dotted``: keys may themselves hold dots (``pass@1`` does not, but be safe)."""
    if dotted in data:
        return data[dotted]
    head, _, rest = dotted.partition(".")
    while rest:
        if head in data and isinstance(data[head], Mapping):
            found = _lookup(data[head], rest)
            if found is not None:
                return found
        nxt, _, rest = rest.partition(".")
        head = f"{head}.{nxt}"
    return data.get(head)


def experiment_metric(repo: Path, name: str, objective: str, env: Mapping[str, str]) -> float:
    """The objective of experiment ``name``: its ``reports/metrics.json`` (in ``dvc exp show --json`` if it is a
    DVC metric, else in the experiment's commit that ``dvc exp show --json`` names).

    Raises:
        TrialFailed: the experiment is not listed, or its metrics file lacks the objective.
    """
    from orchestry.reporting.experiments import output_at

    cp = subprocess.run([sys.executable, "-m", "dvc", "exp", "show", "--json"], cwd=repo, env=dict(env),
                        capture_output=True, text=True, check=False)  # fmt: skip
    if cp.returncode != 0:
        raise TrialFailed(f"dvc exp show failed: {cp.stderr.strip()[-500:]}")
    for baseline in json.loads(cp.stdout):
        for exp in baseline.get("experiments") or ():
            for rev in exp.get("revs") or ():
                if rev.get("name") != name:
                    continue
                metrics = ((rev.get("data") or {}).get("metrics") or {}).get(METRICS_FILE) or {}
                data = metrics.get("data") or output_at(repo, rev.get("rev"), METRICS_FILE, dict(env)) or {}
                value = _lookup(data, objective)
                if isinstance(value, Mapping):  # a {mean, ci_low, ci_high} value
                    value = value.get("mean")
                if isinstance(value, bool) or not isinstance(value, int | float):
                    raise TrialFailed(f"experiment {name}: {METRICS_FILE} has no number at {objective!r} "
                                      f"(got {value!r})")  # fmt: skip
                return float(value)
    raise TrialFailed(f"experiment {name} is not in `dvc exp show`")


def trial_env(study: str, number: int) -> dict[str, str]:
    """The environment of a trial's ``dvc exp run``: this one (no ``DVC_ROOT``/``DVC_EXP_NAME`` of an outer
    run) plus the study and trial the stages tag their MLflow runs with."""
    env = {k: v for k, v in os.environ.items() if k not in ("DVC_ROOT", "DVC_EXP_NAME")}
    env.update({TUNE_STUDY_ENV: study, TUNE_TRIAL_ENV: str(number)})
    return env


def _stderr():
    """This process's stderr when it is a real file (not under a test runner's capture), else ``None``."""
    try:
        sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        return None
    return sys.stderr


def run_trial(
    repo: Path, name: str, overrides: Sequence[str], env: Mapping[str, str], objective: str, capture: bool
) -> float:
    """``dvc exp run --temp -n name -S ++key=value ...`` in ``repo``, then the objective of that experiment.

    Raises:
        TrialFailed: DVC exited non-zero (the tail of its output when captured), or no objective value.
    """
    cmd = [sys.executable, "-m", "dvc", "exp", "run", "--temp", "-n", name]
    for o in overrides:  # `++`: Hydra's add-or-override, for a key params.yaml leaves to its default
        cmd += ["-S", f"++{o}"]
    if capture:
        cp = subprocess.run(cmd, cwd=repo, env=dict(env), capture_output=True, text=True, check=False)
    else:  # DVC's and the stages' output on stderr: stdout carries only tune's results
        cp = subprocess.run(cmd, cwd=repo, env=dict(env), stdout=_stderr(), text=True, check=False)
    if cp.returncode != 0:
        tail = " ".join(((cp.stderr or "") + (cp.stdout or "")).split())[-600:] if capture else ""
        raise TrialFailed(
            f"`dvc exp run -n {name}` exited with code {cp.returncode}" + (f": {tail}" if tail else "")
        )
    return experiment_metric(repo, name, objective, env)


def _sampler_seed(seed: int, n_trials: int) -> int:
    """The sampler's seed for an invocation that starts with ``n_trials`` trials in the study: a re-run (or a
    second machine) draws other random start-up points than the first run, and is still reproducible."""
    digest = hashlib.sha256(f"{seed}:{n_trials}".encode()).digest()
    return int.from_bytes(digest[:4], "big")


def load_study(space: Space, study_name: str, storage: str):
    """The study ``study_name`` in ``storage`` (created with ``space``'s direction if new), its sampler
    TPE seeded from ``space.seed`` and the number of trials it holds (:func:`_sampler_seed`).

    Raises:
        SpaceError: the stored study optimises in the other direction.
    """
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(study_name=study_name, storage=open_storage(storage), direction=space.direction,
                                load_if_exists=True)  # fmt: skip
    if study.direction.name.lower() != space.direction:
        raise SpaceError(f"study {study_name!r} in {storage} optimises {study.direction.name.lower()}, the space "
                         f"says {space.direction}")  # fmt: skip
    stored = study.user_attrs.get("objective")
    if stored is None:
        study.set_user_attr("objective", space.objective)
    elif stored != space.objective:
        raise SpaceError(f"study {study_name!r} in {storage} optimises {stored!r}, the space says "
                         f"{space.objective!r}; use another --study")  # fmt: skip
    study.sampler = optuna.samplers.TPESampler(
        seed=_sampler_seed(space.seed, len(study.trials)), n_startup_trials=space.startup_trials
    )
    return study


def tune(
    space: Space,
    trials: int,
    repo: str | Path = ".",
    study_name: str | None = None,
    storage: str | None = None,
    capture: bool = False,
    echo: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Run the study until it holds ``trials`` finished trials (at most ``trials`` new ones in this call).

    Each trial: values from TPE, ``dvc exp run --temp -n <study>-t<number> -S <fixed> -S <sampled>`` with
    the study and trial in the environment (MLflow tags), then the objective from the experiment's
    ``reports/metrics.json``. A failed trial is recorded FAIL and the search goes on; a trial whose worker died
    is re-queued once (:func:`open_storage`).

    Returns:
        ``{"study", "storage", "ran", "failed", "complete", "best"}`` (``best``: number, value, params, experiment
        of the best finished trial, or ``None``).
    """
    import optuna

    repo = Path(repo).resolve()
    name = check_study_name(study_name or space.study or Path(space.path).stem)
    url = storage_url(repo, storage)
    study = load_study(space, name, url)
    fixed = [override(k, v) for k, v in space.fixed.items()]
    ran = failed = 0

    def complete() -> int:
        return len(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)))

    def objective(trial: optuna.trial.Trial) -> float:
        values = {}
        for d in space.dimensions:
            if d.kind == "categorical":
                values[d.key] = trial.suggest_categorical(d.key, list(d.choices))
            elif d.kind == "int":
                values[d.key] = trial.suggest_int(d.key, d.low, d.high, step=d.step or 1, log=d.log)
            else:
                values[d.key] = trial.suggest_float(d.key, d.low, d.high, step=d.step, log=d.log)
        exp = experiment_name(name, trial.number)
        trial.set_user_attr("dvc_experiment", exp)
        shown = " ".join(override(k, v) for k, v in values.items())
        echo(f"trial {trial.number} ({exp}): {shown}")
        try:
            value = run_trial(repo, exp, [*fixed, *(override(k, v) for k, v in values.items())],
                              trial_env(name, trial.number), space.objective, capture)  # fmt: skip
        except TrialFailed as e:  # Optuna records the trial FAIL (catch=); the reason stays in the study
            nonlocal failed
            failed += 1
            trial.set_user_attr("fail_reason", str(e)[:1000])
            echo(f"trial {trial.number} failed: {e}")
            raise
        echo(f"trial {trial.number}: {space.objective} = {value:.6g}")
        return value

    while complete() < trials and ran < trials:
        study.optimize(objective, n_trials=1, catch=(TrialFailed,))
        ran += 1
    best = best_trials(study, 1)
    return {"study": name, "storage": url, "ran": ran, "failed": failed, "complete": complete(),
            "best": best[0] if best else None}  # fmt: skip


# ---------------------------------------------------------------- the results


def best_trials(study, top: int = 5) -> list[dict[str, Any]]:
    """The ``top`` finished trials, best first: ``number``, ``value``, ``params``, ``experiment``."""
    import optuna

    done = [t for t in study.get_trials(deepcopy=False) if t.state == optuna.trial.TrialState.COMPLETE]
    sign = -1.0 if study.direction == optuna.study.StudyDirection.MAXIMIZE else 1.0
    done.sort(key=lambda t: (sign * t.value, t.number))
    return [{"number": t.number, "value": t.value, "params": dict(t.params),
             "experiment": t.user_attrs.get("dvc_experiment")} for t in done[:top]]  # fmt: skip


def importances(study) -> dict[str, float] | str:
    """Optuna's parameter importances (its default evaluator, normalised to sum 1), or why there are none."""
    import optuna

    done = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    if len(done) < 2:
        return f"need at least 2 finished trials (the study has {len(done)})"
    try:
        return dict(optuna.importance.get_param_importances(study))
    except (RuntimeError, ValueError) as e:
        return f"not computable: {e}"


def study_names(storage: str) -> list[str]:
    """Names of the studies in ``storage``."""
    import optuna

    return list(optuna.study.get_all_study_names(storage=open_storage(storage)))


def show(storage: str, study_name: str | None = None, top: int = 5) -> dict[str, Any]:
    """The best trials and parameter importances of study ``study_name`` (the only study in ``storage`` when
    ``None``).

    Raises:
        SpaceError: no such study, or several and none named.
    """
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    names = study_names(storage)
    if study_name is None:
        if len(names) != 1:
            raise SpaceError(f"--study: name one of the studies in {storage}: {', '.join(names) or '(none)'}")
        study_name = names[0]
    if study_name not in names:
        raise SpaceError(
            f"--study: no study {study_name!r} in {storage} (studies: {', '.join(names) or 'none'})"
        )
    study = optuna.load_study(study_name=study_name, storage=open_storage(storage))
    states: dict[str, int] = {}
    for t in study.get_trials(deepcopy=False):
        states[t.state.name.lower()] = states.get(t.state.name.lower(), 0) + 1
    return {"study": study_name, "objective": study.user_attrs.get("objective"),
            "direction": study.direction.name.lower(), "states": states, "best": best_trials(study, top),
            "importances": importances(study)}  # fmt: skip
