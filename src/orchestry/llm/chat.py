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
