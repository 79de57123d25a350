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
    BackendError,
    ChatRequest,
    LocalChat,
    OpenAICompatibleChat,
    make_backend,
)
from orchestry.llm.cache import CachedChat, ResponseCache, cache_key
from orchestry.llm.chat import PromptTooLong
from orchestry.llm.clients import open_clients
from orchestry.llm.cost import (
    BudgetExceeded,
    CostTracker,
    Price,
    PriceError,
    UsageOverrun,
    price_for,
    require_price,
)
from orchestry.problems import make_problem
from orchestry.runtime import write_jsonl

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
    srv = FakeAnthropic()
    srv.script = [anthropic_error(500, "api_error")] * 5
    with srv.running():
        chat = AnthropicChat("claude-haiku-4-5", base_url=srv.url, max_retries=1, price=HAIKU)
        with pytest.raises(BackendError, match="anthropic request failed after 1 retries: HTTP 500") as err:
            chat.complete("hi", max_tokens=5)
    assert len(srv.posts) == 2  # one try + max_retries=1
    assert "injected 500" in str(err.value) and "\n" not in str(err.value)  # the server's message, one line


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


@pytest.mark.parametrize(
    ("params", "needle"),
    [
        ("api_grpo:\n  backend: openai_compatible\n  model: m\n", "api_grpo.base_url"),
        ("api_grpo:\n  backend: openai_compatible\n  model: m\n  base_url: http://127.0.0.1:9/v1\n"
         "  preflight: false\n", "api_grpo.prices"),
    ],
    ids=["no_base_url", "no_price"],
)  # fmt: skip
def test_stage_setting_errors_exit_2_in_one_line(tmp_path, params, needle) -> None:
    """A setting to fix (no server URL, no price for a budgeted model) is bad input: exit 2, like a bad params.yaml."""
    problem = make_problem(
        {"task_id": "T/0", "entry_point": "inc", "prompt": "def inc(x):\n    \"\"\"x + 1\"\"\"\n",
         "test": "def check(candidate):\n    assert candidate(1) == 2\n"}
    )  # fmt: skip
    for split in ("train", "test"):
        write_jsonl(tmp_path / "data" / "problems" / f"{split}.jsonl", [problem.to_dict()])
    (tmp_path / "params.yaml").write_text(params)
    proc = subprocess.run(
        [sys.executable, str(REPO / "stages" / "train_api_grpo.py")], cwd=tmp_path,
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    errors = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(errors) == 1 and needle in errors[0], proc.stderr[-2000:]


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


# ---- a hard budget across processes (the spend ledger) --------------------------------------------------------
_KILLED_RUN = """
import sys
from orchestry.llm.backends import ChatRequest, OpenAICompatibleChat
from orchestry.llm.cache import CachedChat, ResponseCache
from orchestry.llm.cost import CostTracker, Price

path, url = sys.argv[1], sys.argv[2]
cache = ResponseCache(path)
earlier, _ = cache.open_spend("train_api_grpo:test")
tracker = CostTracker(budget_usd=1.0, scope="train_api_grpo:test", earlier_usd=earlier)
chat = CachedChat(OpenAICompatibleChat("m", url, price=Price(1000.0, 1000.0), concurrency=4), cache, tracker)
reqs = [ChatRequest((("user", f"{kind} {i}"),), None, 0, 100) for i, kind in enumerate(["fast", "fast", "slow", "slow"])]
chat.complete_batch(reqs)
"""


def _ledger_row(path: Path, scope: str) -> dict | None:
    """The spend ledger's row of ``scope``, read as another process would (a connection of its own)."""
    import sqlite3

    con = sqlite3.connect(path, timeout=5)
    try:
        con.row_factory = sqlite3.Row
        row = con.execute("SELECT * FROM spend WHERE scope = ?", (scope,)).fetchone()
        return dict(row) if row else None
    except sqlite3.OperationalError:  # the other process created the file but not its tables yet
        return None
    finally:
        con.close()


def test_spend_of_a_killed_run_counts_against_the_next_run(tmp_path) -> None:
    """SIGKILL with two requests paid and two in flight: the next run starts from the paid ones plus the in-flight
    ones' worst case (the ledger may overstate, never understate), and its budget is what is left."""
    import signal
    import threading
    import time

    release = threading.Event()

    def reply(body: dict) -> str:
        if body["messages"][-1]["content"].startswith("slow"):
            release.wait(60)  # in flight when the client is killed
        return "ok"

    srv = FakeOpenAI(reply=reply, usage={"prompt_tokens": 10, "completion_tokens": 90})  # 0.1 USD a call
    path = tmp_path / "cache.sqlite"
    with srv.running():
        proc = subprocess.Popen([sys.executable, "-c", _KILLED_RUN, str(path), srv.url + "/v1"])
        try:
            deadline = time.time() + 60
            while time.time() < deadline:  # both fast responses paid and in the ledger, both slow ones sent
                row = _ledger_row(path, "train_api_grpo:test") if path.exists() else None
                if row and row["calls"] == 2 and len(srv.posts) == 4:
                    break
                time.sleep(0.05)
            else:
                pytest.fail(f"the run did not get going: {row}, {len(srv.posts)} posts")
            proc.send_signal(signal.SIGKILL)
            proc.wait(30)
        finally:
            release.set()
            if proc.poll() is None:
                proc.kill()
    paid = _ledger_row(path, "train_api_grpo:test")
    assert paid["usd"] == pytest.approx(0.2) and paid["pending_usd"] > 0  # the killed batch's reservation
    cache = ResponseCache(path)
    earlier, orphaned = cache.open_spend("train_api_grpo:test")
    worst = CachedChat(
        OpenAICompatibleChat("m", "http://x/v1", price=Price(1000.0, 1000.0)), cache
    ).worst_case_usd(ChatRequest((("user", "slow 2"),), None, 0, 100))
    # the in-flight requests count at their worst case: 2 x ~0.11 USD, so the next run starts at >= 0.4 USD
    assert orphaned == pytest.approx(2 * worst) and earlier == pytest.approx(0.2 + 2 * worst)
    assert earlier >= 0.4
    assert _ledger_row(path, "train_api_grpo:test")["pending_usd"] == 0  # counted once, not at every start


def test_budget_scope_ignores_the_budget_and_the_retries_but_not_the_experiment() -> None:
    from orchestry.llm.cache import budget_scope

    cfg = ApiGrpoParams(backend="openai_compatible", model="m", base_url="http://x/v1")
    scope = budget_scope("train_api_grpo", cfg.model_dump(mode="json"))[0]
    assert scope.startswith("train_api_grpo:")
    same = cfg.model_copy(update={"budget_usd": 5.0, "timeout_s": 9.0, "max_retries": 1, "concurrency": 1})
    assert budget_scope("train_api_grpo", same.model_dump(mode="json"))[0] == scope
    for other in ({"seed": 1}, {"model": "m2"}, {"num_episodes": 3}):
        assert (
            budget_scope("train_api_grpo", cfg.model_copy(update=other).model_dump(mode="json"))[0] != scope
        )
    assert budget_scope("train_orchestrator", cfg.model_dump(mode="json"))[0] != scope


def test_open_clients_continues_the_budget_of_earlier_runs(tmp_path, caplog) -> None:
    """Two processes' worth of clients on one experiment: the second starts from the first one's spend, says so,
    and refuses what no longer fits; a raised budget is the way to spend more."""
    srv = FakeOpenAI(usage={"prompt_tokens": 10, "completion_tokens": 90})
    prices = {"m": {"input_usd_per_mtok": 1000.0, "output_usd_per_mtok": 1000.0}}  # 0.1 USD a call
    req = lambda i: ChatRequest((("user", f"q{i}"),), None, 0, 100)  # noqa: E731
    with srv.running():
        cfg = ApiGrpoParams(backend="openai_compatible", model="m", base_url=srv.url + "/v1", prices=prices,
                            budget_usd=0.35, eval_budget_fraction=0.0, cache_path=str(tmp_path / "c.sqlite"))  # fmt: skip
        first = open_clients(cfg, SamplingParams())
        for i in range(3):
            first.chat.complete_batch([req(i)])
        first.close()  # the process ends: 0.3 USD spent
        with caplog.at_level(logging.WARNING):
            second = open_clients(cfg.model_copy(update={"timeout_s": 5.0}), SamplingParams())
        assert second.tracker.earlier_usd == pytest.approx(0.3)
        assert "earlier runs of this experiment spent 0.3000 USD" in caplog.text
        assert [r.cached for r in second.chat.complete_batch([req(0), req(1)])] == [True, True]  # free
        with pytest.raises(BudgetExceeded, match="0.3000 USD of it by earlier runs") as err:
            second.chat.complete_batch([req(3)])
        assert "orchestry budget --reset train_api_grpo:" in str(err.value)
        assert "api_grpo.budget_usd" in str(err.value)
        second.close()
        assert len(srv.posts) == 3  # before the ledger, this second process spent a fresh 0.35 USD
        third = open_clients(cfg.model_copy(update={"budget_usd": 0.45}), SamplingParams())
        third.chat.complete_batch([req(3)])
        assert third.tracker.spent_total_usd == pytest.approx(0.4) and len(srv.posts) == 4
        third.close()


# ---- usage above max_tokens ---------------------------------------------------------------------------------
def test_usage_above_max_tokens_is_charged_and_stops_at_once(tmp_path) -> None:
    srv = FakeOpenAI(usage={"prompt_tokens": 10, "completion_tokens": 5000})  # a server that ignores the cap
    tracker = CostTracker(budget_usd=0.2)
    with srv.running():
        backend = OpenAICompatibleChat("m", srv.url + "/v1", price=Price(100.0, 100.0), concurrency=2)
        chat = CachedChat(backend, ResponseCache(tmp_path / "c.sqlite"), tracker)
        reqs = [ChatRequest((("user", f"q{i}"),), None, 0, 16) for i in range(8)]
        with pytest.raises(
            UsageOverrun, match="5000 completion tokens to a request capped at max_tokens=16"
        ) as err:
            chat.complete_batch(reqs)
        sent = len(srv.posts)
        assert 1 <= sent <= 2  # the overrun and at most the one already in flight; the other 6 never sent
        assert tracker.total.calls == sent and tracker.total.usd == pytest.approx(
            sent * 5010 * 1e-4
        )  # as reported
        assert tracker.status == "exhausted" and "budget stays hard" in str(err.value)
        with pytest.raises(UsageOverrun):  # the run is over: nothing more is sent
            chat.complete_batch([ChatRequest((("user", "later"),), None, 0, 16)])
        assert len(srv.posts) == sent
        assert len(chat.cache) == sent  # paid for: replayed free by a re-run


# ---- 200 answers that cannot be used --------------------------------------------------------------------------
_NOT_JSON = (200, {}, b"<html><body>502 Bad Gateway</body></html>")
_HTML = (200, {"Content-Type": "text/html"}, b"<html><body>maintenance</body></html>")
_NO_CHOICES = (200, {}, {"id": "x", "object": "chat.completion", "created": 0, "model": "m", "choices": [],
                         "usage": {"prompt_tokens": 5, "completion_tokens": 0, "total_tokens": 5}})  # fmt: skip


@pytest.mark.parametrize("fault", [_NOT_JSON, _HTML, _NO_CHOICES], ids=["not_json", "html", "no_choices"])
def test_openai_unusable_200_is_retried_never_cached_then_one_line(tmp_path, fault) -> None:
    srv = FakeOpenAI(reply=lambda b: "real answer", usage={"prompt_tokens": 10, "completion_tokens": 5})
    srv.script = [fault]
    tracker = CostTracker(budget_usd=1.0)
    with srv.running():
        chat = CachedChat(
            OpenAICompatibleChat("m", srv.url + "/v1", max_retries=2, price=Price(1.0, 1.0)),
            ResponseCache(tmp_path / "c.sqlite"),
            tracker,
        )
        res = chat.complete("q", max_tokens=8)
        assert res.text == "real answer" and len(srv.posts) == 2  # retried like a 5xx
        assert tracker.total.calls == 1 and tracker.total.usd == pytest.approx(15e-6)  # charged once
        srv.script = [fault] * 3
        with pytest.raises(BackendError, match="failed after 2 retries") as err:
            chat.complete("another", max_tokens=8)
        assert len(srv.posts) == 5 and "\n" not in str(err.value) and srv.url in str(err.value)
        assert tracker.total.calls == 1 and len(chat.cache) == 1  # the fault is neither charged nor cached
        again = chat.complete("another", max_tokens=8)  # so a re-run asks again instead of replaying it
        assert again.text == "real answer" and not again.cached


def test_anthropic_body_that_is_not_json_is_retried_then_one_line(key, tmp_path) -> None:
    srv = FakeAnthropic(reply=lambda b: "fine", usage={"input_tokens": 10, "output_tokens": 3})
    srv.script = [_NOT_JSON, _HTML]
    with srv.running():
        chat = AnthropicChat("claude-haiku-4-5", base_url=srv.url, max_retries=2, price=HAIKU)
        assert chat.complete("hi", max_tokens=5).text == "fine" and len(srv.posts) == 3
        srv.script = [_NOT_JSON] * 2
        with pytest.raises(BackendError, match="anthropic request failed after 1 retries: .* not JSON"):
            AnthropicChat("claude-haiku-4-5", base_url=srv.url, max_retries=1, price=HAIKU).complete("x")
        assert len(srv.posts) == 5


def test_stage_prints_one_line_when_the_server_keeps_answering_garbage(tmp_path) -> None:
    """The API stage against a server whose every 200 answer is HTML: retried, then one `error:` line, exit 1."""
    problem = make_problem(
        {"task_id": "T/0", "entry_point": "inc", "prompt": "def inc(x):\n    \"\"\"x + 1\"\"\"\n",
         "test": "def check(candidate):\n    assert candidate(1) == 2\n"}
    )  # fmt: skip
    for split in ("train", "test"):
        write_jsonl(tmp_path / "data" / "problems" / f"{split}.jsonl", [problem.to_dict()])
    srv = FakeOpenAI()
    srv.script = [_NOT_JSON] * 100
    with srv.running():
        (tmp_path / "params.yaml").write_text(
            f"api_grpo:\n  backend: openai_compatible\n  model: m\n  base_url: {srv.url}/v1\n  max_retries: 1\n"
            "  concurrency: 1\n  num_episodes: 1\n  prices: {m: {input_usd_per_mtok: 1, output_usd_per_mtok: 1}}\n"
            "sandbox:\n  workers: 1\n"
        )
        proc = subprocess.run(
            [sys.executable, str(REPO / "stages" / "train_api_grpo.py")], cwd=tmp_path,
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "not JSON" in errors[0] and "after 1 retries" in errors[0], proc.stderr[
        -2000:
    ]


# ---- local backend ----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_llama():
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from orchestry.llm.loading import load_tokenizer

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


@pytest.mark.parametrize("fields", [{"max_model_len": 300}, {"meta": {"n_ctx_train": 300}}, {}])
def test_a_prompt_that_cannot_fit_the_context_is_refused_before_anything_is_sent(tmp_path, fields) -> None:
    """The server's model list says the context (vLLM, llama.cpp); a batch with one request that cannot fit it is
    refused whole: no request sent, nothing charged or reserved; one that fits goes through. A server that does
    not say (and a model family not in KNOWN_CONTEXT) leaves the check to the server."""
    srv = FakeOpenAI(reply=lambda b: "ok")
    srv.model_fields = fields
    long_prompt = "x = 1\n" * 400  # 2,400 characters: at least 400 tokens counted low
    with srv.running():
        chat = OpenAICompatibleChat("m", srv.url + "/v1", price=Price(1.0, 1.0))
        chat.preflight()
        tracker = CostTracker(limit_usd=1.0)
        cached = CachedChat(chat, ResponseCache(tmp_path / "c.sqlite"), tracker)
        fits = ChatRequest((("user", "short"),), None, 0, 16)
        too_long = ChatRequest((("user", long_prompt),), None, 0, 16)
        if not fields:
            assert chat.context_tokens is None
            cached.complete_batch([fits, too_long])
            assert len(srv.posts) == 2
            return
        assert chat.context_tokens == 300
        with pytest.raises(PromptTooLong, match=r"1 of 2 request\(s\) cannot fit .* context of 300 tokens"):
            cached.complete_batch([fits, too_long])
        assert srv.posts == [] and tracker.total.calls == 0 and tracker.spent_total_usd == 0.0
        assert cached.complete_batch([fits])[0].text == "ok" and len(srv.posts) == 1
        near = ChatRequest(
            (("user", "y" * 1700),), None, 0, 16
        )  # >= 283 tokens counted low, + 16 < 300: sent
        cached.complete_batch([near])
        assert len(srv.posts) == 2


def test_claude_models_have_a_known_context(key) -> None:
    assert AnthropicChat("claude-haiku-4-5").context_tokens == 200_000
    assert AnthropicChat("some-proxy-model").context_tokens is None
