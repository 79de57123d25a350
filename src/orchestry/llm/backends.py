"""Chat backends behind one interface: Anthropic (official SDK), any OpenAI-compatible server, the local model.

A backend turns :class:`ChatRequest` s (messages, system prompt, sampling parameters, sample index) into
:class:`ChatResult` s (text, tokens from the API's usage fields, USD from :mod:`orchestry.llm.cost`).
``complete_batch`` is the entry point the search uses: the local backend renders every pending prompt and
samples them in as few batched ``generate`` calls as possible; the API backends send them concurrently.

* ``anthropic``: the Messages API (``POST /v1/messages``) through ``anthropic.Anthropic``; retries (429, 5xx,
  connection errors, with the server's ``retry-after``) and timeouts are the SDK's, configured with
  ``max_retries`` and ``timeout``. The SDK (>= 2) has no sampling arguments and recent Claude models reject
  them, so temperature/top_p are only sent (as ``extra_body``) when set explicitly. Inside a stage's MLflow run
  every call is traced by MLflow's Anthropic autologging (:func:`enable_mlflow_tracing`; the OpenAI-compatible
  backend's by its OpenAI autologging).
* ``openai_compatible``: ``POST {base_url}/chat/completions`` (vLLM, Ollama, llama.cpp server, OpenAI, ...)
  through ``openai.OpenAI``; retries (408/409/429/5xx, connection errors and timeouts, ``max_retries`` times:
  ``Retry-After`` honoured, else 0.5 s x 2^attempt, at most 8 s) and timeouts are the SDK's. A key is sent
  only when ``api_key_env`` names one (never the SDK's ``OPENAI_API_KEY``); the SDK's errors become
  :class:`BackendConfigError` (refused key) or a ``RuntimeError`` naming the HTTP status or the server URL.
* ``local``: the transformers model of the pipeline (:mod:`orchestry.llm.local`); free, offline, seeded.

A 200 answer that cannot be used (a body that is not JSON, e.g. a proxy's HTML page or a cut-off stream; an
OpenAI-compatible answer without ``choices``) is a fault like a 5xx: retried ``max_retries`` times (0.5 s x
2^attempt, at most 8 s), never returned, so never cached or charged; after the last try it raises
:class:`BackendError`, one line naming the server and what it sent. Every request that fails for good raises a
:class:`BackendError` (a ``RuntimeError``), which the stages print as one line.

Misconfiguration (missing key, missing ``base_url``, unreachable server, rejected key) raises
:class:`BackendConfigError` from the constructor or :meth:`preflight`, before any work, naming the parameter
or environment variable to set.

The interface itself (:class:`ChatRequest`, :class:`ChatResult`, :class:`ChatModel`, :class:`BackendConfigError`)
is :mod:`orchestry.llm.chat`; this module re-exports its names.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from orchestry.fingerprint import folder_fingerprint
from orchestry.llm.chat import (  # BackendError: importable from here as before
    BackendConfigError,
    BackendError,
    ChatModel,
    ChatRequest,
    ChatResult,
    _Base,
    known_context,
)
from orchestry.llm.cost import FREE, Price

log = logging.getLogger("orchestry.llm.backends")

FAULT_RETRY_BASE_S = (
    0.5  # wait before retrying an unusable 200 answer: base x 2^attempt (the SDKs' own backoff)
)
FAULT_RETRY_MAX_S = 8.0


class _Unusable(Exception):
    """A 200 answer that cannot be used (not JSON, no choices): retried like a 5xx (see :func:`_retry_unusable`)."""


def _snippet(text: object, n: int = 80) -> str:
    """At most ``n`` characters of a body, on one line."""
    one = " ".join(str(text).split())
    return repr(one[:n] + ("..." if len(one) > n else ""))


def _retry_unusable(attempt_once, max_retries: int, what: str):
    """``attempt_once()``, tried again (``max_retries`` times, with the SDKs' backoff) while it raises
    :class:`_Unusable`; then :class:`BackendError` ``"<what> failed after N retries: <cause>"``."""
    for attempt in range(max_retries + 1):
        try:
            return attempt_once()
        except _Unusable as e:
            if attempt >= max_retries:
                retries = f" after {max_retries} retries" if max_retries else ""
                raise BackendError(f"{what} failed{retries}: {e}") from None
            wait = min(FAULT_RETRY_MAX_S, FAULT_RETRY_BASE_S * 2**attempt)
            log.warning("%s: %s; retrying in %.1f s", what, e, wait)
            time.sleep(wait)
    raise AssertionError("unreachable")  # pragma: no cover


_TRACING_LOCK = threading.Lock()


def enable_mlflow_tracing(sdk: str) -> bool:
    """Trace the calls of an API ``sdk`` (``"anthropic"``, ``"openai"``) with MLflow's autologging
    (``mlflow.<sdk>.autolog()``) when an MLflow run is active in any thread (a stage's
    :func:`orchestry.tracking.runs.stage_run`); each call becomes a trace (request, response, tokens, latency) linked
    to the run, shown in the run's Traces tab.

    No network access of its own: MLflow's download of its model price catalog is turned off
    (``MLFLOW_MODEL_CATALOG_URI`` set empty unless already set). Never raises: without an active run, or if this
    MLflow cannot trace the SDK, returns False (logged as a warning in the second case) and the calls run
    untraced.
    """
    try:
        import importlib

        import mlflow

        # the run of the stage's main thread; the response cache sends requests from worker threads, where
        # mlflow.active_run() (thread-local) is None: MLflow's own tracing looks the run up the same way
        latest = getattr(mlflow.tracking.fluent, "_get_latest_active_run", lambda: None)
        if mlflow.active_run() is None and latest() is None:
            return False
        # MLflow's tracing prices calls from a model catalog it downloads from GitHub: the run stays offline
        # (its costs come from orchestry.llm.cost) unless the user sets MLFLOW_MODEL_CATALOG_URI
        os.environ.setdefault("MLFLOW_MODEL_CATALOG_URI", "")
        importlib.import_module(f"mlflow.{sdk}").autolog(log_traces=True, silent=True)
        return True
    except Exception as e:  # tracing is an extra: it must never stop a stage
        log.warning("MLflow tracing of %s calls is off (%s: %s)", sdk, type(e).__name__, e)
        return False


class _SDKChat(_Base):
    """An API backend whose vendor SDK MLflow can trace (``sdk``: ``"anthropic"``, ``"openai"``)."""

    sdk = "none"
    traced = False  # MLflow tracing of the SDK's calls is on (see complete_batch)

    def complete_batch(self, requests: Sequence[ChatRequest]) -> list[ChatResult]:
        """As :meth:`_Base.complete_batch`; the first call made while an MLflow run is active (a stage's run:
        the stages open their clients before it) turns on tracing of the SDK's calls
        (:func:`enable_mlflow_tracing`), so each request becomes a trace linked to that run."""
        if not self.traced:
            with _TRACING_LOCK:  # the response cache calls this from several threads at once
                self.traced = self.traced or enable_mlflow_tracing(self.sdk)
        return super().complete_batch(requests)


# -------------------------------------------------------------------------------------------------------------
# Anthropic
# -------------------------------------------------------------------------------------------------------------
class AnthropicChat(_SDKChat):
    """Claude through the official SDK's Messages API.

    Args:
        model: e.g. ``"claude-haiku-4-5"``.
        api_key_env: environment variable holding the key (``ANTHROPIC_API_KEY``).
        base_url: API root (``None``: the SDK's default or ``ANTHROPIC_BASE_URL``).
        timeout_s: seconds per request attempt; max_retries: SDK retries (429, 5xx, connection errors).
        price: USD per million tokens (see :func:`orchestry.llm.cost.require_price`).
        seed: the run's seed (``api_grpo.seed``). The Messages API takes no seed, so it is only part of the
            cache identity: each seed of a sweep gets its own samples instead of replaying another seed's.

    Raises:
        BackendConfigError: the key variable is unset or empty (before any request).
    """

    backend = "anthropic"
    sdk = "anthropic"

    def __init__(
        self,
        model: str,
        api_key_env: str = "ANTHROPIC_API_KEY",
        base_url: str | None = None,
        timeout_s: float = 60.0,
        max_retries: int = 4,
        concurrency: int = 4,
        price: Price = FREE,
        seed: int = 0,
    ):
        import anthropic

        key = os.environ.get(api_key_env, "")
        if not key.strip():
            raise BackendConfigError(
                f"the anthropic backend needs an API key: set the environment variable {api_key_env} "
                "(or name another variable in api_grpo.api_key_env); to run offline set api_grpo.backend: local"
            )
        self.model, self.price, self.concurrency = model, price, concurrency
        self.api_key_env, self.base_url, self.seed = api_key_env, base_url, seed
        self.max_retries = max_retries
        self.context_tokens = known_context(model)
        self._anthropic = anthropic
        self.client = anthropic.Anthropic(
            api_key=key, base_url=base_url, max_retries=max_retries, timeout=timeout_s
        )

    def identity(self) -> dict:
        """Backend, model, the server actually used (``base_url``, ``ANTHROPIC_BASE_URL`` or the SDK's default)
        and the seed; the request key adds messages, system prompt, sampling parameters and sample index."""
        server = str(self.client.base_url).rstrip("/")
        return {"backend": self.backend, "model": self.model, "base_url": server, "seed": self.seed}

    def preflight(self) -> None:
        """List models once (free, no retries): unreachable server or rejected key fail here.

        Raises:
            BackendConfigError: connection failure (names ``api_grpo.base_url``/``ANTHROPIC_BASE_URL``) or a
                401/403 (names the key variable).
        """
        a = self._anthropic
        try:
            self.client.with_options(max_retries=0, timeout=15.0).models.list(limit=1)
        except a.APIConnectionError as e:
            where = self.base_url or os.environ.get("ANTHROPIC_BASE_URL") or "https://api.anthropic.com"
            raise BackendConfigError(
                f"cannot reach the Anthropic API at {where} ({e}); check the network or set api_grpo.base_url"
            ) from None
        except (a.AuthenticationError, a.PermissionDeniedError) as e:
            raise BackendConfigError(
                f"the Anthropic API rejected the key in {self.api_key_env} ({e.status_code}); set a valid key"
            ) from None
        except a.APIStatusError as e:  # e.g. a proxy without /v1/models: not fatal
            log.warning("preflight: GET /v1/models answered %s; continuing", e.status_code)

    def _one(self, request: ChatRequest) -> ChatResult:
        return _retry_unusable(lambda: self._attempt(request), self.max_retries, "anthropic request")

    def _attempt(self, request: ChatRequest) -> ChatResult:
        t0 = time.time()
        extra = {
            k: v for k, v in (("temperature", request.temperature), ("top_p", request.top_p)) if v is not None
        }
        kwargs: dict = {
            "model": self.model,
            "max_tokens": request.max_tokens,
            "messages": [{"role": r, "content": c} for r, c in request.messages],
        }
        if request.system:
            kwargs["system"] = request.system
        if extra:
            kwargs["extra_body"] = extra
        where = str(self.client.base_url).rstrip("/")
        a = self._anthropic
        try:
            msg = self.client.messages.create(**kwargs)
        except json.JSONDecodeError as e:  # a 200 whose body is not JSON: the SDK does not retry it
            raise _Unusable(f"{where} answered with a body that is not JSON ({_snippet(e.doc)})") from None
        except a.APIConnectionError as e:  # refused, reset or timed out, after the SDK's retries
            raise BackendError(
                f"{_failed('anthropic', e)}: cannot reach the Anthropic API at {where} ({_cause(e)})"
            ) from e
        except (a.AuthenticationError, a.PermissionDeniedError) as e:
            raise BackendConfigError(
                f"the Anthropic API rejected the key in {self.api_key_env} ({e.status_code}); set a valid key"
            ) from e
        except a.APIStatusError as e:  # 400, 404, ... at once; 408/409/429/5xx after the SDK's retries
            raise BackendError(f"{_failed('anthropic', e)}: HTTP {e.status_code}: {_body(e)}") from e
        if isinstance(msg, str) or not hasattr(msg, "content") or not hasattr(msg, "usage"):
            raise _Unusable(f"{where} answered with a body that is not a message ({_snippet(msg)})")
        text = "".join(getattr(b, "text", "") for b in msg.content if getattr(b, "type", "") == "text")
        u = msg.usage
        fresh, out = int(u.input_tokens or 0), int(u.output_tokens or 0)
        write = int(getattr(u, "cache_creation_input_tokens", 0) or 0)
        read = int(getattr(u, "cache_read_input_tokens", 0) or 0)
        return ChatResult(
            text=text,
            prompt_tokens=fresh + write + read,
            completion_tokens=out,
            usd=self.price.usd(fresh, out, write, read),
            seconds=time.time() - t0,
            stop_reason=str(msg.stop_reason or ""),
        )

    def close(self) -> None:
        self.client.close()


# -------------------------------------------------------------------------------------------------------------
# OpenAI-compatible servers
# -------------------------------------------------------------------------------------------------------------
_NO_KEY = "no-key"  # the SDK wants a key; without api_key_env this one is never sent (see _auth)


class OpenAICompatibleChat(_SDKChat):
    """Any server speaking ``POST /v1/chat/completions`` (vLLM, Ollama, llama.cpp, OpenAI, ...) through the
    official ``openai`` SDK (``openai.OpenAI`` with ``base_url``, ``timeout`` and ``max_retries``).

    Args:
        model: the server's model name.
        base_url: API root including the version, e.g. ``http://localhost:8000/v1``.
        api_key_env: variable holding a bearer key (``None``: send none; most local servers need none). The
            SDK's own ``OPENAI_API_KEY`` is never read: a key goes to a server only when named here.
        timeout_s: seconds per request attempt; max_retries: SDK retries (408, 409, 429, 5xx, connection
            errors and timeouts; ``retry-after``/``retry-after-ms`` honoured, else 0.5 s x 2^attempt, at most
            8 s).
        seed: sent mixed with the sample index (:meth:`request_seed`; servers that support it then answer
            reproducibly, and two seeds of a sweep never share a sample).

    Inside a stage's MLflow run every call is traced by MLflow's OpenAI autologging, as for Anthropic.

    Raises:
        BackendConfigError: ``base_url`` missing, or ``api_key_env`` named but unset.
    """

    backend = "openai_compatible"
    sdk = "openai"

    def __init__(
        self,
        model: str,
        base_url: str | None,
        api_key_env: str | None = None,
        timeout_s: float = 60.0,
        max_retries: int = 4,
        concurrency: int = 4,
        price: Price = FREE,
        seed: int = 0,
    ):
        import openai

        if not base_url:
            raise BackendConfigError(
                "the openai_compatible backend needs a server: set api_grpo.base_url "
                "(e.g. http://localhost:8000/v1 for vLLM, http://localhost:11434/v1 for Ollama)"
            )
        self.key = ""
        if api_key_env:
            self.key = os.environ.get(api_key_env, "")
            if not self.key.strip():
                raise BackendConfigError(
                    f"api_grpo.api_key_env names {api_key_env}, which is not set: export it, "
                    "or set api_grpo.api_key_env: null for a server without authentication"
                )
        self.model, self.base_url, self.api_key_env = model, base_url.rstrip("/"), api_key_env
        self.timeout_s, self.max_retries, self.concurrency = timeout_s, max_retries, concurrency
        self.price, self.seed = price, seed
        self._warned_usage = False
        self._openai = openai
        self.client = openai.OpenAI(
            api_key=self.key or _NO_KEY, base_url=self.base_url, max_retries=max_retries, timeout=timeout_s
        )
        # no key: every request explicitly drops the Authorization header (the SDK insists on one otherwise)
        self._auth: dict = {} if self.key else {"Authorization": openai.Omit()}

    def identity(self) -> dict:
        return {"backend": self.backend, "model": self.model, "base_url": self.base_url, "seed": self.seed}

    def request_seed(self, sample_index: int) -> int:
        """The server seed of sample ``sample_index``: ``seed * 1000003 + sample_index`` (mod 2^31), so seed 0
        sends the sample index itself and seed 1's samples are not seed 0's next ones."""
        return (self.seed * 1_000_003 + sample_index) % (2**31)

    def preflight(self) -> None:
        """``GET {base_url}/models`` once (no retries, at most 15 s).

        Raises:
            BackendConfigError: unreachable (names ``api_grpo.base_url``) or 401/403 (names the key variable).
        """
        o = self._openai
        try:
            listed = self.client.with_options(max_retries=0, timeout=min(self.timeout_s, 15.0)).models.list(
                extra_headers=self._auth
            )
            self.context_tokens = self._listed_context(listed) or known_context(self.model)
        except o.APIConnectionError as e:  # also APITimeoutError
            raise BackendConfigError(
                f"cannot reach the server at api_grpo.base_url = {self.base_url} ({_cause(e)}); "
                "start it or fix the URL"
            ) from None
        except (o.AuthenticationError, o.PermissionDeniedError) as e:
            raise BackendConfigError(
                f"the server at {self.base_url} refused the request ({e.status_code}): set a key in an "
                "environment variable and name it in api_grpo.api_key_env"
            ) from None
        except o.APIStatusError as e:  # e.g. a server without /models: not fatal
            log.warning("preflight: GET %s/models answered %s; continuing", self.base_url, e.status_code)
        except o.APIError as e:  # an answer the SDK cannot read as a model list: not fatal either
            log.warning("preflight: GET %s/models: %s; continuing", self.base_url, e)

    def _listed_context(self, listed) -> int | None:
        """This model's context from the server's model list: ``max_model_len`` (vLLM), ``context_length``
        (llama.cpp, OpenRouter) or ``context_window``; ``None`` when the list does not say."""
        for m in getattr(listed, "data", None) or []:
            if getattr(m, "id", None) != self.model:
                continue
            extra = dict(getattr(m, "model_extra", None) or {})
            if isinstance(extra.get("meta"), dict):  # llama.cpp's server nests it
                extra.update(extra["meta"])
            for key in ("max_model_len", "context_length", "context_window", "n_ctx_train"):
                value = extra.get(key)
                if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                    return value
        return None

    def _one(self, request: ChatRequest) -> ChatResult:
        msgs = ([{"role": "system", "content": request.system}] if request.system else []) + [
            {"role": r, "content": c} for r, c in request.messages
        ]
        kwargs: dict = {
            "model": self.model,
            "messages": msgs,
            "max_tokens": request.max_tokens,
            "seed": self.request_seed(request.sample_index),
            "extra_headers": self._auth,
        }
        if request.temperature is not None:
            kwargs["temperature"] = request.temperature
        if request.top_p is not None:
            kwargs["top_p"] = request.top_p
        return _retry_unusable(
            lambda: self._attempt(kwargs, request), self.max_retries, "openai_compatible request"
        )

    def _attempt(self, kwargs: dict, request: ChatRequest) -> ChatResult:
        o = self._openai
        t0 = time.time()
        try:
            completion = self.client.chat.completions.create(**kwargs)
        except json.JSONDecodeError as e:  # a 200 whose body is not JSON: the SDK does not retry it
            raise _Unusable(
                f"{self.base_url} answered with a body that is not JSON ({_snippet(e.doc)})"
            ) from None
        except o.APIConnectionError as e:  # refused, reset or timed out, after the SDK's retries
            raise BackendError(
                f"{_failed(e)}: cannot reach the server at api_grpo.base_url = {self.base_url} ({_cause(e)})"
            ) from e
        except (o.AuthenticationError, o.PermissionDeniedError) as e:
            raise BackendConfigError(
                f"{self.base_url} refused the key ({e.status_code}); check api_grpo.api_key_env"
            ) from e
        except o.APIStatusError as e:  # 400, 404, ... at once; 408/409/429/5xx after the SDK's retries
            raise BackendError(f"{_failed(e)}: HTTP {e.status_code}: {_body(e)}") from e
        return self._result(completion, request, time.time() - t0)

    def _result(self, completion, request: ChatRequest, seconds: float) -> ChatResult:
        """The result of a completion; an answer that is not a completion (a body the SDK returned as text) or has
        no choices raises :class:`_Unusable` (retried, never cached or charged)."""
        if isinstance(completion, str | bytes) or not hasattr(completion, "choices"):
            raise _Unusable(
                f"{self.base_url} answered with a body that is not a completion ({_snippet(completion)})"
            )
        choices = getattr(completion, "choices", None) or []
        if not choices:
            raise _Unusable(f"{self.base_url} answered without choices (an empty 'choices' list)")
        choice = choices[0]
        message = getattr(choice, "message", None)
        text = getattr(message, "content", None) or ""
        usage = getattr(completion, "usage", None)
        if getattr(usage, "prompt_tokens", None) is not None:
            pin, pout = int(usage.prompt_tokens or 0), int(getattr(usage, "completion_tokens", 0) or 0)
        else:  # some servers omit usage: estimate (and say so once)
            from orchestry.llm.cost import estimate_tokens

            if not self._warned_usage:
                log.warning("%s returns no usage fields: tokens are estimated from characters", self.base_url)
                self._warned_usage = True
            pin, pout = estimate_tokens(request.chars()), estimate_tokens(len(text))
        return ChatResult(
            text=text,
            prompt_tokens=pin,
            completion_tokens=pout,
            usd=self.price.usd(pin, pout),
            seconds=seconds,
            stop_reason=str(getattr(choice, "finish_reason", None) or ""),
        )

    def close(self) -> None:
        self.client.close()


def _failed(backend_or_e, e=None) -> str:
    """``<backend> request failed`` (``openai_compatible`` unless named) and, if the SDK retried, after how many
    retries (the count it sent with its last attempt in ``x-stainless-retry-count``)."""
    backend, e = ("openai_compatible", backend_or_e) if e is None else (backend_or_e, e)
    try:
        retries = int(e.request.headers.get("x-stainless-retry-count", 0))
    except (AttributeError, TypeError, ValueError):
        retries = 0
    return f"{backend} request failed" + (f" after {retries} retries" if retries else "")


def _cause(e: BaseException) -> str:
    """The SDK's connection error with the reason underneath (``Connection error.`` alone says little)."""
    inner = e.__cause__ or e.__context__
    if inner is None or not str(inner):
        return str(e)
    return f"{str(e).rstrip('.')}: {type(inner).__name__}: {inner}"


def _body(e) -> str:
    """At most 300 characters of an error response's body (JSON when it is JSON)."""
    try:
        return json.dumps(e.response.json())[:300]
    except Exception:
        return (getattr(e.response, "text", "") or str(e))[:300]


# -------------------------------------------------------------------------------------------------------------
# Local transformers model
# -------------------------------------------------------------------------------------------------------------
@dataclass
class LocalChat(_Base):
    """The pipeline's local transformers model as a chat backend (free, offline).

    ``complete_batch`` renders all requests with the tokenizer's chat template and samples them in batched
    ``generate`` calls (one per distinct (max_tokens, temperature, top_p), ``batch_size`` rows at most).
    Each call is seeded from ``seed`` and the requests it holds, so a run with the same requests gives the
    same responses on CPU.

    Attributes:
        model_path: folder with the safetensors model (``models/base``), loaded on the first request that
            the cache cannot answer; or pass ``hf_model``/``tokenizer``.
        stop_at_code_end: stop a row once it closes a fenced code block (see :mod:`orchestry.llm.local`).
    """

    model_path: str = "models/base"
    dtype: str = "float32"
    seed: int = 0
    batch_size: int = 32
    stop_at_code_end: bool = True
    hf_model: object = None
    tokenizer: object = None
    name: str | None = None
    backend: str = field(default="local", init=False)
    batched: bool = field(default=True, init=False)
    price: Price = field(default=FREE, init=False)

    def __post_init__(self) -> None:
        self.model = self.name or str(self.model_path)
        if self.hf_model is None:  # loaded on the first cache miss: a fully cached re-run never loads it
            if not (Path(self.model_path) / "config.json").exists():
                raise BackendConfigError(
                    f"no model at {self.model_path}: run `dvc repro prepare`, or set model.path / api_grpo.model"
                )
            self._fingerprint = folder_fingerprint(self.model_path)  # the response cache's key of this model
        else:
            params_sum = sum(float(p.detach().double().sum()) for p in self.hf_model.parameters())
            self._fingerprint = "in-memory:" + hashlib.sha256(str(params_sum).encode()).hexdigest()[:16]
            self.hf_model.eval()

    def _ensure_loaded(self) -> None:
        if self.hf_model is None:
            from orchestry.llm.loading import load_model

            self.hf_model, self.tokenizer = load_model(self.model_path, self.dtype)
            self.hf_model.eval()

    def identity(self) -> dict:
        """Model, weights, dtype, seed, ``batch_size`` (a generate call is seeded from the requests it holds),
        ``stop_at_code_end`` and, where not the default (oneDNN products on fp32 operands), the decoder's
        products and operand dtype (``model.decode_products``, ``model.decode_dtype`` as resolved): everything
        besides the request that changes a sample. (The default adds no key, so caches written before the
        setting existed stay valid.)"""
        from orchestry.llm import decoding

        identity = {
            "backend": self.backend,
            "model": self.model,
            "weights": self._fingerprint,
            "dtype": None if self._fingerprint.startswith("in-memory:") else self.dtype,
            "seed": self.seed,
            "batch_size": self.batch_size,
            "stop_at_code_end": self.stop_at_code_end,
        }
        decode = decoding.decode_numerics()
        if decode != decoding.DEFAULT_NUMERICS:
            identity["decoding"] = "/".join(decode)
        return identity

    def render(self, request: ChatRequest) -> str:
        """The prompt text for ``request`` (chat template, generation prompt appended)."""
        msgs = ([{"role": "system", "content": request.system}] if request.system else []) + [
            {"role": r, "content": c} for r, c in request.messages
        ]
        if getattr(self.tokenizer, "chat_template", None):
            return self.tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        return "\n\n".join(m["content"] for m in msgs) + "\n"

    def complete_batch(self, requests: Sequence[ChatRequest]) -> list[ChatResult]:
        """Sample all ``requests`` in batched ``generate`` calls; results in input order, 0 USD."""
        from orchestry.llm.local import generate

        self._ensure_loaded()
        results: list[ChatResult | None] = [None] * len(requests)
        groups: dict[tuple, list[int]] = {}
        for i, r in enumerate(requests):
            groups.setdefault((r.max_tokens, r.temperature, r.top_p), []).append(i)
        for (max_tokens, temperature, top_p), idx in groups.items():
            for start in range(0, len(idx), self.batch_size):
                chunk = idx[start : start + self.batch_size]
                prompts = [self.render(requests[i]) for i in chunk]
                keys = json.dumps([requests[i].key_fields() for i in chunk], sort_keys=True)
                seed = (self.seed * 1_000_003 + zlib.crc32(keys.encode())) % (2**31)
                t0 = time.time()
                batch = generate(
                    self.hf_model,
                    self.tokenizer,
                    prompts,
                    max_new_tokens=max_tokens,
                    temperature=1.0 if temperature is None else temperature,
                    top_p=1.0 if top_p is None else top_p,
                    seed=seed,
                    stop_at_code_end=self.stop_at_code_end,
                )
                seconds = (time.time() - t0) / max(1, len(chunk))
                for i, g in zip(chunk, batch.items, strict=True):
                    results[i] = ChatResult(
                        text=g.text,
                        prompt_tokens=g.prompt_tokens,
                        completion_tokens=g.completion_tokens,
                        usd=0.0,
                        seconds=seconds,
                        stop_reason="length" if g.truncated else "stop",
                    )
        return results  # type: ignore[return-value]


# -------------------------------------------------------------------------------------------------------------
# factory
# -------------------------------------------------------------------------------------------------------------
def default_key_env(backend: str, api_key_env: str | None) -> str | None:
    """``api_key_env`` or the backend's default (``ANTHROPIC_API_KEY`` for anthropic, none otherwise)."""
    if api_key_env:
        return api_key_env
    return "ANTHROPIC_API_KEY" if backend == "anthropic" else None


def make_backend(
    backend: str,
    model: str | None,
    *,
    base_url: str | None = None,
    api_key_env: str | None = None,
    timeout_s: float = 60.0,
    max_retries: int = 4,
    concurrency: int = 4,
    price: Price = FREE,
    seed: int = 0,
    local_model_path: str = "models/base",
    local_dtype: str = "float32",
    local_batch_size: int = 32,
    shared_local: LocalChat | None = None,
) -> ChatModel:
    """Build the backend named in params (``api_grpo.backend``).

    ``shared_local`` lets a second local backend (e.g. the judge) reuse an already loaded model.

    Raises:
        BackendConfigError: unknown backend, missing model name, key or base_url (see each backend).
    """
    if backend == "local":
        path = model or local_model_path
        if shared_local is not None and str(shared_local.model_path) == str(path):
            return shared_local
        return LocalChat(model_path=path, dtype=local_dtype, seed=seed, batch_size=local_batch_size)
    if not model:
        raise BackendConfigError(f"the {backend} backend needs a model name: set api_grpo.model")
    if backend == "anthropic":
        return AnthropicChat(
            model,
            api_key_env=default_key_env(backend, api_key_env) or "ANTHROPIC_API_KEY",
            base_url=base_url,
            timeout_s=timeout_s,
            max_retries=max_retries,
            concurrency=concurrency,
            price=price,
            seed=seed,
        )
    if backend == "openai_compatible":
        return OpenAICompatibleChat(
            model,
            base_url,
            api_key_env=api_key_env,
            timeout_s=timeout_s,
            max_retries=max_retries,
            concurrency=concurrency,
            price=price,
            seed=seed,
        )
    raise BackendConfigError(
        f"unknown api_grpo.backend {backend!r} (allowed: local, anthropic, openai_compatible)"
    )
