"""``params.yaml`` from a careless user's side: duplicate keys, out-of-range values, defaults that drift; and how a
stage ends (exit code 2 on bad params, its MLflow run KILLED on SIGTERM)."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel

from orchestry.config import Params
from orchestry.params_file import ParamsError, load_params, parse_params

REPO = Path(__file__).resolve().parents[1]
PARAMS_TEXT = (REPO / "params.yaml").read_text()


def load_text(tmp_path: Path, text: str) -> Params:
    path = tmp_path / "params.yaml"
    path.write_text(text)
    return load_params(path)


# --- duplicate keys ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "key", "line"),
    [
        (PARAMS_TEXT + "\ntrain_magrpo:\n  num_steps: 3\n", "train_magrpo", PARAMS_TEXT.count("\n") + 2),
        ("sampling:\n  top_p: 0.9\n  temperature: 0.5\n  top_p: 0.8\n", "sampling.top_p", 4),
        (
            "api_grpo:\n  judge:\n    weight: 0.1\n    enabled: true\n    weight: 0.2\n",
            "api_grpo.judge.weight",
            5,
        ),
        (
            "api_grpo: {prices: {m: {input_usd_per_mtok: 1, output_usd_per_mtok: 1, input_usd_per_mtok: 2}}}\n",
            "api_grpo.prices.m.input_usd_per_mtok",
            1,
        ),
        ("model: {}\nmodel: {}\n", "model", 2),
    ],
)
def test_duplicate_keys_are_rejected_naming_key_and_line(
    tmp_path: Path, text: str, key: str, line: int
) -> None:
    with pytest.raises(ParamsError) as e:
        load_text(tmp_path, text)
    msg = str(e.value)
    assert f"duplicate key '{key}'" in msg and f"line {line}" in msg, msg


def test_committed_params_and_yaml_merge_keys_still_load(tmp_path: Path) -> None:
    assert load_text(tmp_path, PARAMS_TEXT) == load_params(REPO / "params.yaml")
    p = load_text(tmp_path, "baselines: &b {num_samples: 3, seed: 5}\nevaluate: {<<: *b, seed: 7}\n")
    assert (p.evaluate.num_samples, p.evaluate.seed) == (3, 7)


@pytest.mark.parametrize("content", [None, b"\xff\xfe\x00bad", b"- a\n- b\n", b"a: [unclosed\n"])
def test_unreadable_params_file_is_a_params_error(tmp_path: Path, content: bytes | None) -> None:
    path = tmp_path / "params.yaml"
    path.mkdir() if content is None else path.write_bytes(content)
    with pytest.raises(ParamsError, match="params.yaml"):
        load_params(path)


# --- ranges -----------------------------------------------------------------------------------------------------


def _numeric_fields(model: type[BaseModel] = Params, prefix: str = ""):
    """(dotted key, int or float) of every numeric field, nested sections included."""
    for name, field in model.model_fields.items():
        ann = field.annotation
        key = f"{prefix}{name}"
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            yield from _numeric_fields(ann, key + ".")
        elif ann in (int, int | None):
            yield key, int
        elif ann in (float, float | None):
            yield key, float


NUMERIC = list(_numeric_fields())


def _section_with(key: str, value) -> dict:
    data: dict = {}
    cur = data
    parts = key.split(".")
    for part in parts[:-1]:
        cur = cur.setdefault(part, {})
    cur[parts[-1]] = value
    return data


def _assert_rejected(data: dict, key: str) -> None:
    with pytest.raises(ParamsError) as e:
        parse_params(data)
    lines = str(e.value).splitlines()
    assert any(line.strip().startswith((f"{key}:", f"{key}.")) for line in lines[1:]), str(e.value)


@pytest.mark.parametrize("key", [k for k, kind in NUMERIC if kind is float])
@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan])
def test_non_finite_floats_are_rejected(key: str, value: float) -> None:
    _assert_rejected(_section_with(key, value), key)


@pytest.mark.parametrize("key", [k for k, _ in NUMERIC])
@pytest.mark.parametrize("value", [True, False, "3", "0.5"], ids=["true", "false", "str_int", "str_float"])
def test_numbers_are_strict_no_bool_or_string(key: str, value) -> None:
    """``num_samples: true`` was read as 1 and ``num_samples: '3'`` as 3: every number refuses both."""
    _assert_rejected(_section_with(key, value), key)


@pytest.mark.parametrize("key", [k for k, kind in NUMERIC if kind is int])
def test_counts_are_whole_numbers_not_floats(key: str) -> None:
    _assert_rejected(_section_with(key, 3.0), key)


def test_a_check_across_keys_is_one_short_line_not_the_section() -> None:
    """A cross-field error used to echo the whole section (1,253 characters for the committed train_magrpo)."""
    section = {
        **yaml.safe_load(PARAMS_TEXT)["train_magrpo"],
        "credit": "counterfactual",
        "workflow": "writer_tester_fixer",
    }
    with pytest.raises(ParamsError) as e:
        parse_params({"train_magrpo": section})
    line = str(e.value).splitlines()[1].strip()
    assert line == "train_magrpo: credit counterfactual is defined for workflow helper_main only"
    with pytest.raises(ParamsError) as e:
        parse_params({"api_grpo": {"budget_usd": "x" * 500}})
    assert max(len(x) for x in str(e.value).splitlines()) < 200


def test_strict_types_keep_what_is_valid_and_name_the_key() -> None:
    p = parse_params(
        {"evaluate": {"num_samples": 3}, "sampling": {"temperature": 1}, "api_grpo": {"max_tokens": None}}
    )
    assert (p.evaluate.num_samples, p.sampling.temperature, p.api_grpo.max_tokens) == (3, 1.0, None)
    with pytest.raises(
        ParamsError, match=r"evaluate.num_samples: .*expected an integer, not bool \(got True\)"
    ):
        parse_params({"evaluate": {"num_samples": True}})
    for data, key in (
        ({"evaluate": {"val": "yes"}}, "evaluate.val"),  # a flag is true/false, not a string
        ({"train_magrpo": {"turn_weights": [1.0, True]}}, "train_magrpo.turn_weights"),  # items of a list too
        (
            {"train_orchestrator": {"call_costs": {"tester": "10"}}},
            "train_orchestrator.call_costs",
        ),  # dict values
        ({"prepare": {"compositional": {"difficulty": [1, "2"]}}}, "prepare.compositional.difficulty"),
    ):
        _assert_rejected(data, key)


@pytest.mark.parametrize("key", [k for k, _ in NUMERIC])
def test_every_numeric_param_has_a_range(key: str) -> None:
    _assert_rejected(_section_with(key, 10**30), key)
    _assert_rejected(_section_with(key, -(10**30)), key)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("prepare.fractions", [0.5, 0.6, 0.2]),
        ("prepare.fractions", [-0.2, 1.0, 0.2]),
        ("prepare.fractions", [0.0, 0.0, 0.0]),
        ("prepare.fractions", [math.nan, 0.5, 0.5]),
        ("train_magrpo.target_modules", []),
        ("train_magrpo.target_modules", [""]),
        ("baselines.methods", []),
        ("baselines.methods", ["single", "single"]),
        ("detect_schemes.methods", []),
        ("model.path", ""),
        ("mlflow.experiment", ""),
        ("train_magrpo.seed", -1),
        ("api_grpo.prices", {"m": {"input_usd_per_mtok": math.inf, "output_usd_per_mtok": 1.0}}),
    ],
)
def test_bad_values_are_rejected_naming_the_key(key: str, value) -> None:
    _assert_rejected(_section_with(key, value), key)


def test_fractions_summing_to_one_within_rounding_are_accepted() -> None:
    assert parse_params({"prepare": {"fractions": [0.1, 0.7, 0.2]}}).prepare.fractions == (0.1, 0.7, 0.2)


# --- one source of truth ----------------------------------------------------------------------------------------


def _keys(model: type[BaseModel], raw: dict, prefix: str = "") -> list[str]:
    """Fields of ``model`` that ``raw`` leaves out (nested sections included)."""
    missing = []
    for name, field in model.model_fields.items():
        if name not in raw:
            missing.append(prefix + name)
        elif isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            missing += _keys(field.annotation, raw[name], f"{prefix}{name}.")
    return missing


def test_params_yaml_spells_out_every_default_of_the_models() -> None:
    raw = yaml.safe_load(PARAMS_TEXT)
    committed, defaults = load_params(REPO / "params.yaml"), Params()
    assert _keys(Params, raw) == []
    for section in Params.model_fields:
        assert getattr(committed, section) == getattr(defaults, section), section


def test_allowed_values_are_defined_once() -> None:
    from orchestry.algorithms import magrpo
    from orchestry.config import ADVANTAGE_MODES, BASELINE_METHODS
    from orchestry.evaluation.baselines import METHODS

    assert tuple(magrpo.ADVANTAGE_MODES) == ADVANTAGE_MODES
    assert tuple(m for m in METHODS if m != "magrpo") == BASELINE_METHODS
    assert tuple(Params().baselines.methods) == BASELINE_METHODS
    assert '["single", "concat"' not in (REPO / "stages" / "baselines.py").read_text()
    for mode in ADVANTAGE_MODES:
        assert mode in Params.model_fields["train_magrpo"].annotation.model_fields["advantage"].description


# --- how a stage ends -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text", ["", "\n\n", "# only comments\n# train_magrpo:\n#   num_steps: 3\n", "{}\n", "---\n"]
)
def test_empty_or_comment_only_params_file_is_refused_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture, text: str
) -> None:
    """Not every default, silently: the stages (start_stage) exit 2 with one line naming the file."""
    from orchestry.runtime import start_stage

    path = tmp_path / "my_params.yaml"
    path.write_text(text)
    with pytest.raises(ParamsError, match="my_params.yaml is empty"):
        load_params(path)
    with pytest.raises(SystemExit) as e:
        start_stage("t", str(path))
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and "my_params.yaml is empty" in err and len(err.splitlines()) == 1


def test_stage_start_exits_2_naming_the_key(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from orchestry.runtime import start_stage

    path = tmp_path / "params.yaml"
    path.write_text("train_magrpo:\n  learning_rate: .inf\n")
    with pytest.raises(SystemExit) as e:
        start_stage("t", str(path))
    assert e.value.code == 2
    assert "train_magrpo.learning_rate" in capsys.readouterr().err


def test_stage_start_exits_2_when_the_cpu_cannot_run_the_decode_dtype(
    tmp_path: Path, monkeypatch, capsys: pytest.CaptureFixture
) -> None:
    from orchestry import numerics
    from orchestry.llm import decoding
    from orchestry.runtime import start_stage

    monkeypatch.setattr(decoding, "DECODE_BF16", False)
    monkeypatch.setattr(numerics, "cpu_bf16_supported", lambda: False)
    path = tmp_path / "params.yaml"
    path.write_text("model:\n  decode_dtype: bfloat16\n")
    with pytest.raises(SystemExit) as e:
        start_stage("t", str(path))
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert (
        err.startswith("error: model.decode_dtype bfloat16 needs a CPU with native bf16")
        and "Traceback" not in err
    )
    assert decoding.DECODE_BF16 is False


def test_stage_start_puts_decode_products_into_effect(tmp_path: Path, monkeypatch) -> None:
    from orchestry.llm import decoding
    from orchestry.numerics import NUMERICS_ENV
    from orchestry.runtime import start_stage

    monkeypatch.setattr(decoding, "PRODUCTS", "onednn")
    monkeypatch.delenv(NUMERICS_ENV, raising=False)
    path = tmp_path / "params.yaml"
    path.write_text("model:\n  decode_products: mkl\n")
    assert start_stage("t", str(path)).model.decode_products == "mkl"
    assert decoding.PRODUCTS == "mkl"


VICTIM = """
import signal, sys, time
from orchestry.tracking.runs import stage_run
before = signal.getsignal(signal.SIGTERM)
with stage_run("victim", {"a": 1}, experiment="t", uri=sys.argv[1]) as run:
    print(run.info.run_id, signal.getsignal(signal.SIGTERM) is not before, flush=True)
    if sys.argv[2] == "wait":
        time.sleep(120)
print(signal.getsignal(signal.SIGTERM) is before, flush=True)
"""


def _victim(tmp_path: Path, mode: str) -> subprocess.Popen:
    env = {**os.environ, "DVC_ROOT": str(tmp_path)}
    env.pop("DVC_EXP_NAME", None)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(VICTIM), uri, mode],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _run_status(tmp_path: Path, run_id: str) -> tuple[str, dict]:
    from mlflow.tracking import MlflowClient

    run = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}").get_run(run_id)
    return run.info.status, run.data.metrics


def test_sigterm_marks_the_stage_run_killed(tmp_path: Path) -> None:
    with _victim(tmp_path, "wait") as proc:
        try:
            run_id = proc.stdout.readline().split()[0]
            time.sleep(0.5)
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=60)
        finally:
            proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "Traceback" not in err
    status, metrics = _run_status(tmp_path, run_id)
    assert status == "KILLED" and "cost/wall_seconds" in metrics


def test_a_finished_stage_run_restores_the_sigterm_handler(tmp_path: Path) -> None:
    with _victim(tmp_path, "finish") as proc:
        out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    run_id, installed, restored = out.split()
    assert installed == "True" and restored == "True"
    assert _run_status(tmp_path, run_id)[0] == "FINISHED"
