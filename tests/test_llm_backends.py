"""Chat backends, response cache, cost and budget -- against local servers that speak the real APIs.

The Anthropic backend runs through the real ``anthropic`` SDK (its retries and timeouts) against a stdlib
HTTP server answering ``POST /v1/messages`` with the Messages API's JSON; the OpenAI-compatible backend through
the real ``openai`` SDK against a server answering ``POST /v1/chat/completions``. The local backend uses a tiny
random llama.
"""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from fake_llm_servers import FakeAnthropic, FakeOpenAI, anthropic_error, openai_error

from orchestry.config import ApiGrpoParams, SamplingParams
from orchestry.llm.backends import (
    AnthropicChat,
    BackendConfigError,
    ChatRequest,
    LocalChat,
    OpenAICompatibleChat,
    make_backend,
)
from orchestry.llm.cache import CachedChat, ResponseCache, cache_key
from orchestry.llm.cost import BudgetExceeded, CostTracker, Price, PriceError, price_for, require_price
from orchestry.problems import make_problem
from orchestry.runtime import write_jsonl
from orchestry.training.api_grpo import open_clients

REPO = Path(__file__).resolve().parents[1]
HAIKU = price_for("claude-haiku-4-5")


@pytest.fixture
def key(monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key-123")


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


# ---- Anthropic through the real SDK ---------------------------------------------------------------------------
def test_anthropic_sdk_retries_429_and_500_and_usage_becomes_cost(key) -> None:
    srv = FakeAnthropic(
        reply=lambda b: "def f():\n    return 1", usage={"input_tokens": 1200, "output_tokens": 345}
    )
    srv.script = [anthropic_error(429, "rate_limit_error"), anthropic_error(500, "api_error")]
    with srv.running():
        chat = AnthropicChat("claude-haiku-4-5", base_url=srv.url, max_retries=3, timeout_s=10, price=HAIKU)
        res = chat.complete([{"role": "user", "content": "write f"}], system="be brief", max_tokens=50)
    assert [r["path"] for r in srv.posts] == [
        "/v1/messages"
    ] * 3  # 429, 500, then success: retried by the SDK
    assert [r["headers"].get("x-stainless-retry-count") for r in srv.posts] == ["0", "1", "2"]
    sent_keys = {
        r["headers"].get("x-api-key") or r["headers"].get("authorization", "").removeprefix("Bearer ")
        for r in srv.posts
    }
    assert sent_keys == {"test-key-123"}  # SDK 2.x sends it as a bearer token
    body = srv.posts[-1]["body"]
    assert body["model"] == "claude-haiku-4-5" and body["system"] == "be brief" and body["max_tokens"] == 50
    assert body["messages"] == [{"role": "user", "content": "write f"}]
    assert "temperature" not in body and "top_p" not in body  # only sent when set explicitly
    assert res.text == "def f():\n    return 1"
    assert (res.prompt_tokens, res.completion_tokens) == (1200, 345)
    assert res.usd == pytest.approx(1200 * 1.0 / 1e6 + 345 * 5.0 / 1e6)


def test_anthropic_sdk_gives_up_after_max_retries(key) -> None:
    import anthropic

    srv = FakeAnthropic()
    srv.script = [anthropic_error(500, "api_error")] * 5
    with srv.running():
        chat = AnthropicChat("claude-haiku-4-5", base_url=srv.url, max_retries=1, price=HAIKU)
        with pytest.raises(anthropic.InternalServerError):
            chat.complete("hi", max_tokens=5)
    assert len(srv.posts) == 2  # one try + max_retries=1


def test_anthropic_prompt_cache_tokens_are_priced(key) -> None:
    usage = {
        "input_tokens": 100,
        "output_tokens": 10,
        "cache_creation_input_tokens": 1000,
        "cache_read_input_tokens": 2000,
    }
    srv = FakeAnthropic(usage=usage)
    with srv.running():
        res = AnthropicChat("claude-haiku-4-5", base_url=srv.url, price=HAIKU).complete(
            "hi", max_tokens=5, temperature=0.3
        )
    assert srv.posts[0]["body"]["temperature"] == 0.3  # explicit sampling parameters go in the body
    assert res.prompt_tokens == 3100
    assert res.usd == pytest.approx((100 + 1000 * 1.25 + 2000 * 0.1) * 1e-6 + 10 * 5e-6)


def test_missing_anthropic_key_fails_before_any_work(monkeypatch, tmp_path) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    srv = FakeAnthropic()
    cache = tmp_path / "cache.sqlite"
    with srv.running():
        cfg = ApiGrpoParams(
            backend="anthropic", model="claude-haiku-4-5", base_url=srv.url, cache_path=str(cache)
        )
        with pytest.raises(BackendConfigError, match="ANTHROPIC_API_KEY") as err:
            open_clients(cfg, SamplingParams())
        assert "api_grpo.api_key_env" in str(err.value)
        cfg2 = cfg.model_copy(update={"api_key_env": "MY_TEAM_KEY"})
        with pytest.raises(BackendConfigError, match="MY_TEAM_KEY"):
            open_clients(cfg2, SamplingParams())
    assert srv.requests == [] and not cache.exists()


def test_stage_without_key_exits_before_mlflow_model_or_sandbox(monkeypatch, tmp_path) -> None:
    """The stage script itself: exit code != 0, the message names the variable, no MLflow store written."""
    problem = make_problem(
        {"task_id": "T/0", "entry_point": "inc", "prompt": "def inc(x):\n    \"\"\"x + 1\"\"\"\n",
         "test": "def check(candidate):\n    assert candidate(1) == 2\n"}
    )  # fmt: skip
    for split in ("train", "test"):
        write_jsonl(tmp_path / "data" / "problems" / f"{split}.jsonl", [problem.to_dict()])
    (tmp_path / "params.yaml").write_text("api_grpo:\n  backend: anthropic\n  model: claude-haiku-4-5\n")
    env = {k: v for k, v in __import__("os").environ.items() if k != "ANTHROPIC_API_KEY"}
    proc = subprocess.run(
        [sys.executable, str(REPO / "stages" / "train_api_grpo.py")], cwd=tmp_path, env=env,
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode != 0
    assert "ANTHROPIC_API_KEY" in proc.stderr
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / ".orchestry").exists()
    assert not (tmp_path / "reports").exists()


def test_unreachable_server_fails_in_preflight_naming_base_url(key) -> None:
    url = f"http://127.0.0.1:{_closed_port()}"
    with pytest.raises(BackendConfigError, match="api_grpo.base_url"):
        AnthropicChat("claude-haiku-4-5", base_url=url, max_retries=0).preflight()
    with pytest.raises(BackendConfigError, match="api_grpo.base_url"):
        OpenAICompatibleChat("m", url + "/v1", timeout_s=2).preflight()
    with pytest.raises(BackendConfigError, match="api_grpo.base_url"):
        make_backend("openai_compatible", "m", base_url=None)
    with pytest.raises(BackendConfigError, match="api_grpo.model"):
        make_backend("anthropic", None)
    with pytest.raises(BackendConfigError, match="model.path"):
        make_backend("local", None, local_model_path="/nonexistent/model")


# ---- OpenAI-compatible ------------------------------------------------------------------------------------------
def test_openai_compatible_retries_and_usage() -> None:
    srv = FakeOpenAI(reply=lambda b: "ok", usage={"prompt_tokens": 40, "completion_tokens": 7})
    srv.script = [openai_error(429), openai_error(503, retry_after=None)]
    with srv.running():
        chat = OpenAICompatibleChat("qwen", srv.url + "/v1", max_retries=3, price=Price(2.0, 8.0), seed=7)
        chat.preflight()
        res = chat.complete("hi", system="sys", sample_index=2, max_tokens=9, temperature=0.5, top_p=0.9)
    assert [r["path"] for r in srv.posts] == ["/v1/chat/completions"] * 3
    body = srv.posts[-1]["body"]
    assert body["messages"][0] == {"role": "system", "content": "sys"}
    assert (body["seed"], body["temperature"], body["top_p"], body["max_tokens"]) == (
        7 * 1_000_003 + 2,
        0.5,
        0.9,
        9,
    )
    assert (res.text, res.prompt_tokens, res.completion_tokens) == ("ok", 40, 7)
    assert res.usd == pytest.approx(40 * 2e-6 + 7 * 8e-6)


def test_openai_compatible_client_errors_are_not_retried() -> None:
    srv = FakeOpenAI()
    srv.script = [openai_error(400)]
    with srv.running(), pytest.raises(RuntimeError, match="HTTP 400"):
        OpenAICompatibleChat("m", srv.url + "/v1", max_retries=3).complete("x")
    assert len(srv.posts) == 1


def test_openai_sdk_retries_429_and_503_then_succeeds_without_sending_a_key(monkeypatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-never-sent")  # the SDK's own variable is not read
    srv = FakeOpenAI(reply=lambda b: "fine", usage={"prompt_tokens": 12, "completion_tokens": 3})
    srv.script = [openai_error(429, retry_after="0.05"), openai_error(503, retry_after=None)]
    with srv.running():
        chat = OpenAICompatibleChat("m", srv.url + "/v1", max_retries=2, timeout_s=10, price=Price(1.0, 1.0))
        res = chat.complete("hi", max_tokens=4)
    assert [r["path"] for r in srv.posts] == ["/v1/chat/completions"] * 3  # 429, 503, then success
    assert [r["headers"].get("x-stainless-retry-count") for r in srv.posts] == ["0", "1", "2"]  # the SDK's
    assert all("authorization" not in r["headers"] for r in srv.requests)  # api_key_env: null sends no key
    assert (res.text, res.prompt_tokens, res.completion_tokens, res.stop_reason) == ("fine", 12, 3, "stop")
    assert res.usd == pytest.approx(15e-6)


def test_openai_sdk_gives_up_after_max_retries_and_sends_the_named_key(monkeypatch) -> None:
    monkeypatch.setenv("MY_SERVER_KEY", "secret-1")
    srv = FakeOpenAI()
    srv.script = [openai_error(503)] * 5
    with srv.running():
        chat = OpenAICompatibleChat("m", srv.url + "/v1", api_key_env="MY_SERVER_KEY", max_retries=1)
        with pytest.raises(RuntimeError, match="after 1 retries: HTTP 503") as err:
            chat.complete("x")
    assert len(srv.posts) == 2  # one try + max_retries=1
    assert {r["headers"].get("authorization") for r in srv.posts} == {"Bearer secret-1"}
    assert "injected 503" in str(err.value)  # the server's own message, for the user
    srv.script = [openai_error(401)]
    with srv.running(), pytest.raises(BackendConfigError, match="api_grpo.api_key_env"):
        OpenAICompatibleChat("m", srv.url + "/v1", api_key_env="MY_SERVER_KEY", max_retries=3).complete("x")
    assert len(srv.posts) == 3  # a refused key is not retried


def test_openai_sdk_unreachable_or_silent_server_names_the_url() -> None:
    url = f"http://127.0.0.1:{_closed_port()}/v1"
    with pytest.raises(RuntimeError, match="cannot reach the server") as err:
        OpenAICompatibleChat("m", url, max_retries=1, timeout_s=2).complete("x")
    assert f"api_grpo.base_url = {url}" in str(err.value) and "after 1 retries" in str(err.value)
    with socket.socket() as silent:  # accepts connections (in the backlog) but never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        url = f"http://127.0.0.1:{silent.getsockname()[1]}/v1"
        with pytest.raises(RuntimeError, match="timed out") as err:
            OpenAICompatibleChat("m", url, max_retries=0, timeout_s=0.5).complete("x")
        assert url in str(err.value)
        with pytest.raises(BackendConfigError, match="api_grpo.base_url"):
            OpenAICompatibleChat("m", url, timeout_s=0.5).preflight()


# ---- cache ------------------------------------------------------------------------------------------------------
def _reqs() -> list[ChatRequest]:
    a = (("user", "prompt A"),)
    return [
        ChatRequest(a, "s", 0, 16, 0.7),
        ChatRequest(a, "s", 1, 16, 0.7),
        ChatRequest((("user", "B"),), "s", 0, 16, 0.7),
    ]


def test_cache_second_run_makes_no_server_calls(tmp_path) -> None:
    replies = iter(f"answer {i}" for i in range(100))
    srv = FakeOpenAI(reply=lambda b: next(replies))
    path = tmp_path / "c.sqlite"
    with srv.running():
        backend = OpenAICompatibleChat("m", srv.url + "/v1", price=Price(1, 1))
        first = CachedChat(backend, ResponseCache(path)).complete_batch(_reqs())
        assert (
            len(srv.posts) == 3 and len({r.text for r in first}) == 3
        )  # sample index makes distinct samples
        cache2 = ResponseCache(path)  # a new process would reopen the file the same way
        tracker = CostTracker()
        second = CachedChat(backend, cache2, tracker).complete_batch(_reqs())
        assert len(srv.posts) == 3  # zero new calls
        assert [r.text for r in second] == [r.text for r in first] and all(r.cached for r in second)
        assert cache2.hit_rate == 1.0 and tracker.total.calls == 0 and tracker.total.cached == 3
        assert tracker.total.usd == 0.0 and tracker.total.cached_usd == pytest.approx(
            sum(r.usd for r in first)
        )
        changed = ChatRequest((("user", "prompt A"),), "s", 0, 16, 0.9)  # other temperature: a miss
        CachedChat(backend, cache2).complete_batch([changed])
        assert len(srv.posts) == 4


def test_cache_key_depends_on_every_sampling_field() -> None:
    base = ChatRequest((("user", "x"),), "s", 0, 16, 0.7, 0.9)
    ident = {"backend": "b", "model": "m"}
    variants = [
        ChatRequest((("user", "y"),), "s", 0, 16, 0.7, 0.9),
        ChatRequest((("user", "x"),), "t", 0, 16, 0.7, 0.9),
        ChatRequest((("user", "x"),), "s", 1, 16, 0.7, 0.9),
        ChatRequest((("user", "x"),), "s", 0, 17, 0.7, 0.9),
        ChatRequest((("user", "x"),), "s", 0, 16, 0.8, 0.9),
        ChatRequest((("user", "x"),), "s", 0, 16, 0.7, 1.0),
    ]
    keys = (
        {cache_key(ident, base)}
        | {cache_key(ident, v) for v in variants}
        | {cache_key({"backend": "b", "model": "n"}, base)}
    )
    assert len(keys) == 8
    assert cache_key(ident, ChatRequest((("user", "x"),), "s", 0, 16, 0.7, 0.9, tags=("t",))) == cache_key(
        ident, base
    )


def test_cache_identity_has_everything_that_changes_the_sample(key, tmp_path, monkeypatch) -> None:
    """A sweep over seeds must not replay one seed's responses: seed, server and weights are in the identity."""
    req = ChatRequest((("user", "x"),), "s", 0, 16, 0.7, 0.9)

    def k(backend, model, **kw) -> str:
        return cache_key(make_backend(backend, model, **kw).identity(), req)

    url = "http://127.0.0.1:1"
    for backend in ("anthropic", "openai_compatible"):
        same = k(backend, "claude-haiku-4-5", base_url=url + "/v1", seed=0)
        assert k(backend, "claude-haiku-4-5", base_url=url + "/v1", seed=0) == same
        assert k(backend, "claude-haiku-4-5", base_url=url + "/v1", seed=1) != same, backend
        assert k(backend, "claude-haiku-4-5", base_url="http://127.0.0.1:2/v1", seed=0) != same, backend
        assert k(backend, "claude-sonnet-4-5", base_url=url + "/v1", seed=0) != same, backend
    # Anthropic's default server, whether named by the SDK default or by ANTHROPIC_BASE_URL
    default = k("anthropic", "claude-haiku-4-5")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "http://127.0.0.1:3")
    assert k("anthropic", "claude-haiku-4-5") != default
    monkeypatch.delenv("ANTHROPIC_BASE_URL")
    # local: the weights, their dtype and the seed
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "llama"}')
    (folder / "model.safetensors").write_bytes(b"\x01" * 4096)
    local = k("local", str(folder), seed=0)
    assert k("local", str(folder), seed=0) == local
    assert k("local", str(folder), seed=1) != local
    assert k("local", str(folder), seed=0, local_dtype="bfloat16") != local
    assert (
        k("local", str(folder), seed=0, local_batch_size=8) != local
    )  # a generate call's seed: its requests
    # the decoder's numerics (model.decode_dtype resolved, model.decode_products): bf16 operands sample other tokens
    from orchestry.llm import decoding

    monkeypatch.setattr(decoding, "DECODE_BF16", True)
    assert k("local", str(folder), seed=0) != local
    monkeypatch.setattr(decoding, "DECODE_BF16", False)
    monkeypatch.setattr(decoding, "PRODUCTS", "mkl")
    assert k("local", str(folder), seed=0) != local
    monkeypatch.setattr(decoding, "PRODUCTS", "onednn")
    assert k("local", str(folder), seed=0) == local  # the default adds nothing: earlier caches stay valid
    (folder / "model.safetensors").write_bytes(b"\x02" * 4096)
    assert k("local", str(folder), seed=0) != local
    # an OpenAI-compatible server gets a seed per sample: seed 1's samples are not seed 0's later ones
    sent = {
        OpenAICompatibleChat("m", url + "/v1", seed=seed).request_seed(i)
        for seed in range(3)
        for i in range(4)
    }
    assert len(sent) == 12 and OpenAICompatibleChat("m", url + "/v1").request_seed(3) == 3


# ---- budget ------------------------------------------------------------------------------------------------------
def test_budget_refuses_before_sending_and_warns_at_80_percent(tmp_path, caplog) -> None:
    srv = FakeOpenAI(usage={"prompt_tokens": 10, "completion_tokens": 90})
    price = Price(1000.0, 1000.0)  # 0.1 USD per call as charged; worst case ~0.11
    tracker = CostTracker(budget_usd=0.35)
    with srv.running(), caplog.at_level(logging.WARNING, logger="orchestry.llm.cost"):
        chat = CachedChat(
            OpenAICompatibleChat("m", srv.url + "/v1", price=price), ResponseCache(":memory:"), tracker
        )
        for i in range(3):
            chat.complete(f"q{i}", max_tokens=100)
        assert tracker.status == "warned" and "of the budget" in caplog.text
        with pytest.raises(BudgetExceeded, match="api_grpo.budget_usd"):
            chat.complete("q3", max_tokens=100)
    assert len(srv.posts) == 3  # the refused call was never sent
    assert tracker.total.usd == pytest.approx(0.3) and tracker.status == "exhausted"


def test_prices_and_overrides() -> None:
    assert price_for("claude-haiku-4-5-20251001") == Price(1.0, 5.0)
    assert price_for("claude-opus-4-7") is None  # unknown: never guessed from a prefix
    assert price_for("my-model", {"my-model": {"input_usd_per_mtok": 0, "output_usd_per_mtok": 0}}) == Price(
        0, 0
    )
    with pytest.raises(PriceError, match="api_grpo.prices"):
        require_price("my-model", {}, free=False, budget_usd=1.0)
    assert require_price("anything", {}, free=True, budget_usd=1.0) == Price(0, 0)


# ---- local backend ----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_llama():
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from orchestry.llm.local import load_tokenizer

    if not (REPO / "models" / "base" / "tokenizer.json").exists():
        pytest.skip("models/base (tokenizer) not prepared")
    tok = load_tokenizer(REPO / "models" / "base")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the CPU is shared: one thread avoids OpenMP spin-waiting against other jobs
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=2, max_position_embeddings=1024, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
    )  # fmt: skip
    yield LlamaForCausalLM(cfg), tok
    torch.set_num_threads(threads)


def test_local_backend_batches_prompts_into_one_generate_call(tiny_llama, monkeypatch) -> None:
    import orchestry.llm.local as local

    model, tok = tiny_llama
    calls = []
    real = local.generate

    def counting(m, t, prompts, **kw):
        calls.append(len(prompts))
        return real(m, t, prompts, **kw)

    monkeypatch.setattr(local, "generate", counting)
    reqs = [ChatRequest((("user", f"problem {i}"),), "sys", i % 2, 8, 0.8, 0.95) for i in range(5)]
    chat = LocalChat(hf_model=model, tokenizer=tok, name="tiny", seed=3)
    out = chat.complete_batch(reqs)
    assert calls == [5] and len(out) == 5
    assert all(r.prompt_tokens > 5 and 0 < r.completion_tokens <= 8 and r.usd == 0 for r in out)
    again = LocalChat(hf_model=model, tokenizer=tok, name="tiny", seed=3).complete_batch(reqs)
    assert [r.text for r in again] == [r.text for r in out]  # seeded: same requests, same samples
    calls.clear()
    LocalChat(hf_model=model, tokenizer=tok, name="tiny", batch_size=2).complete_batch(reqs)
    assert calls == [2, 2, 1]
