"""The chat interface every backend (:mod:`orchestry.llm.backends`) implements: :class:`ChatRequest` in,
:class:`ChatResult` out, the :class:`ChatModel` protocol with its shared batching (``_Base``), and
:class:`BackendConfigError` for a backend that cannot work as configured."""

from __future__ import annotations

import concurrent.futures as cf
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from orchestry.llm.cost import Price

Message = tuple[str, str]  # (role, content), role "user" or "assistant"


class BackendConfigError(RuntimeError):
    """A backend cannot work as configured; the message names the parameter or environment variable to set."""


class BackendError(RuntimeError):
    """A request failed for good (after the retries): an HTTP error, an unreachable server, or an answer that
    cannot be used; the message is one line naming the server and the cause."""


class PromptTooLong(BackendError):
    """A request whose prompt (counted low: :func:`min_prompt_tokens`) plus ``max_tokens`` cannot fit the model's
    context (``context_tokens``): refused before anything of its batch is sent or charged."""


#: Context sizes (tokens) of model families whose server does not report one: id prefix -> tokens.
KNOWN_CONTEXT = {"claude-": 200_000}

#: Characters per token of the lower-side token count used to refuse a prompt (:func:`min_prompt_tokens`): few
#: texts pack more than this many characters into one token, so a refused prompt is certainly too long.
MAX_CHARS_PER_TOKEN = 6.0


def min_prompt_tokens(chars: int) -> int:
    """A lower-side token count of ``chars`` characters of prompt (:data:`MAX_CHARS_PER_TOKEN`)."""
    return int(chars / MAX_CHARS_PER_TOKEN)


def known_context(model: str) -> int | None:
    """The context of ``model`` from :data:`KNOWN_CONTEXT` (``None`` when its family is not listed)."""
    return next((n for prefix, n in KNOWN_CONTEXT.items() if model.startswith(prefix)), None)


@dataclass(frozen=True)
class ChatRequest:
    """One chat completion to sample.

    Attributes:
        messages: ``((role, content), ...)`` alternating user/assistant, ending with a user turn.
        system: system prompt (``None``: none).
        sample_index: which of the k samples of this prompt (part of the cache key, so k samples of one
            prompt are k distinct cached responses).
        max_tokens: cap on completion tokens.
        temperature / top_p: ``None`` leaves the backend's default.
        tags: cost attribution labels (e.g. ``("helper", "episode:3")``); not part of the cache key.
    """

    messages: tuple[Message, ...]
    system: str | None = None
    sample_index: int = 0
    max_tokens: int = 256
    temperature: float | None = None
    top_p: float | None = None
    tags: tuple[str, ...] = ()

    def key_fields(self) -> dict:
        """Everything that determines the response (for the cache key)."""
        return {
            "messages": [list(m) for m in self.messages],
            "system": self.system,
            "sample_index": self.sample_index,
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
        }

    def chars(self) -> int:
        return len(self.system or "") + sum(len(c) for _, c in self.messages)


@dataclass
class ChatResult:
    """One response: ``text``, tokens (from the API's usage fields), ``usd``, and whether the cache served it.

    Attributes:
        prompt_tokens / completion_tokens: tokens (prompt includes cache-write/read tokens for Anthropic).
        usd: what the call cost when it was made (a cache hit costs nothing now: see ``cached``).
        seconds: wall time of the call (0 for a cache hit).
        stop_reason: the API's stop/finish reason (``"length"``/``"max_tokens"`` when cut).
    """

    text: str
    prompt_tokens: int
    completion_tokens: int
    usd: float
    cached: bool = False
    seconds: float = 0.0
    stop_reason: str = ""


def as_messages(messages: Iterable[Mapping[str, str] | Sequence[str]] | str) -> tuple[Message, ...]:
    """Normalise ``"text"``, ``[{"role", "content"}]`` or ``[(role, content)]`` to ``((role, content), ...)``."""
    if isinstance(messages, str):
        return (("user", messages),)
    out = []
    for m in messages:
        if isinstance(m, Mapping):
            out.append((str(m["role"]), str(m["content"])))
        else:
            role, content = m
            out.append((str(role), str(content)))
    return tuple(out)


@runtime_checkable
class ChatModel(Protocol):
    """What the search needs from a chat backend."""

    backend: str
    model: str
    price: Price
    batched: bool  # True: complete_batch samples many prompts in one model call (local)

    def identity(self) -> dict:
        """What besides the request determines a response (backend, model, ...): part of the cache key."""
        ...

    def preflight(self) -> None:
        """Check key and server before any work. Raises :class:`BackendConfigError`."""
        ...

    def complete(
        self,
        messages,
        system: str | None = None,
        sample_index: int = 0,
        max_tokens: int = 256,
        temperature: float | None = None,
        top_p: float | None = None,
    ) -> ChatResult:
        """Sample one response. ``messages``: text, ``[{"role", "content"}]`` or ``[(role, content)]``."""
        req = ChatRequest(as_messages(messages), system, sample_index, max_tokens, temperature, top_p)
        return self.complete_batch([req])[0]

    def complete_batch(self, requests: Sequence[ChatRequest]) -> list[ChatResult]: ...


class _Base(ChatModel):
    """The backends' common part: :meth:`ChatModel.complete` on top of a concurrent :meth:`complete_batch`."""

    backend = "base"
    batched = False
    concurrency = 1
    #: The model's context in tokens (prompt + completion) when known (the server's model list, or
    #: :data:`KNOWN_CONTEXT`), else ``None``: :class:`orchestry.llm.cache.CachedChat` refuses requests that
    #: cannot fit before sending them.
    context_tokens: int | None = None

    def complete_batch(self, requests: Sequence[ChatRequest]) -> list[ChatResult]:
        """Sample every request (concurrently, ``concurrency`` at a time); results in input order."""
        if len(requests) <= 1 or self.concurrency <= 1:
            return [self._one(r) for r in requests]
        with cf.ThreadPoolExecutor(min(self.concurrency, len(requests))) as pool:
            return list(pool.map(self._one, requests))

    def _one(self, request: ChatRequest) -> ChatResult:  # pragma: no cover - abstract
        raise NotImplementedError

    def preflight(self) -> None:
        return None

    def close(self) -> None:
        return None
