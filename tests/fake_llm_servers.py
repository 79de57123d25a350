"""Local HTTP servers that speak the Anthropic Messages API and the OpenAI chat-completions API (tests only).

Stdlib ``http.server`` in a thread. Every request is recorded (method, path, headers, JSON body); a
``script`` of ``(status, headers, body)`` answers is served first (to inject 429/500, a 200 whose body is not JSON
when ``body`` is bytes, an answer without choices), then ``reply(body)`` gives the text of a normal answer. Usage fields follow the real response shapes:
Anthropic ``usage.input_tokens/output_tokens`` (plus optional cache fields), OpenAI
``usage.prompt_tokens/completion_tokens/total_tokens``.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def _tokens(text: str) -> int:
    return max(1, len(text) // 4)


class _Server:
    kind = "base"

    def __init__(self, reply: Callable[[dict], str] | None = None, usage: dict | None = None):
        self.requests: list[dict] = []
        self.script: list[tuple[int, dict, dict | bytes]] = []
        self.reply = reply or (lambda body: "hello")
        self.usage = usage  # fixed usage override (else derived from the text lengths)
        self.lock = threading.Lock()
        self.httpd: ThreadingHTTPServer | None = None

    @property
    def posts(self) -> list[dict]:
        return [r for r in self.requests if r["method"] == "POST"]

    def _handler(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def _send(self, status: int, headers: dict, body: dict | bytes) -> None:
                # bytes: sent as they are (a body that is not JSON, e.g. a proxy's HTML page or a cut-off answer)
                data = body if isinstance(body, bytes) else json.dumps(body).encode()
                self.send_response(status)
                if "Content-Type" not in headers:
                    self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for k, v in headers.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                with server.lock:
                    server.requests.append(
                        {
                            "method": "GET",
                            "path": self.path,
                            "headers": {k.lower(): v for k, v in self.headers.items()},
                            "body": None,
                        }
                    )
                self._send(200, {}, server.models_body())

            def do_POST(self):
                n = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(n) or b"{}")
                with server.lock:
                    server.requests.append(
                        {
                            "method": "POST",
                            "path": self.path,
                            "headers": {k.lower(): v for k, v in self.headers.items()},
                            "body": body,
                        }
                    )
                    scripted = server.script.pop(0) if server.script else None
                if scripted is not None:
                    self._send(*scripted)
                    return
                self._send(200, {}, server.answer(body))

        return Handler

    def models_body(self) -> dict:
        return {"data": [], "has_more": False, "first_id": None, "last_id": None, "object": "list"}

    def answer(self, body: dict) -> dict:  # pragma: no cover - overridden
        raise NotImplementedError

    @property
    def url(self) -> str:
        assert self.httpd is not None
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}"

    @contextlib.contextmanager
    def running(self) -> Iterator[_Server]:
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self.httpd.shutdown()
            self.httpd.server_close()
            thread.join(5)


class FakeAnthropic(_Server):
    """``POST /v1/messages`` and ``GET /v1/models`` with the Messages API's response shapes."""

    kind = "anthropic"

    def answer(self, body: dict) -> dict:
        text = self.reply(body)
        prompt = (body.get("system") or "") + "".join(
            m["content"] if isinstance(m["content"], str) else json.dumps(m["content"])
            for m in body["messages"]
        )
        usage = self.usage or {"input_tokens": _tokens(prompt), "output_tokens": _tokens(text)}
        return {
            "id": f"msg_{len(self.requests):04d}",
            "type": "message",
            "role": "assistant",
            "model": body["model"],
            "content": [{"type": "text", "text": text}],
            "stop_reason": "end_turn",
            "stop_sequence": None,
            "usage": dict(usage),
        }


def anthropic_error(status: int, kind: str, retry_after_ms: int | None = 10) -> tuple[int, dict, dict]:
    """A scripted Anthropic error answer (``{"type": "error", "error": {...}}``)."""
    headers = {"retry-after-ms": str(retry_after_ms)} if retry_after_ms is not None else {}
    return status, headers, {"type": "error", "error": {"type": kind, "message": f"injected {status}"}}


class FakeOpenAI(_Server):
    """``POST /v1/chat/completions`` and ``GET /v1/models`` with OpenAI's response shapes (what the ``openai``
    SDK parses into ``ChatCompletion`` and a page of ``Model``)."""

    kind = "openai"
    #: extra fields of the listed model "m" (vLLM adds ``max_model_len``, llama.cpp ``meta.n_ctx_train``)
    model_fields: dict = {}

    def models_body(self) -> dict:
        model = {"id": "m", "object": "model", "created": 0, "owned_by": "fake", **self.model_fields}
        return {"object": "list", "data": [model]}

    def answer(self, body: dict) -> dict:
        text = self.reply(body)
        prompt = "".join(m["content"] for m in body["messages"])
        usage = self.usage or {"prompt_tokens": _tokens(prompt), "completion_tokens": _tokens(text)}
        usage = {**usage, "total_tokens": usage["prompt_tokens"] + usage["completion_tokens"]}
        return {
            "id": f"chatcmpl-{len(self.requests)}",
            "object": "chat.completion",
            "created": 0,
            "model": body["model"],
            "choices": [
                {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
            ],
            "usage": usage,
        }


def openai_error(status: int, retry_after: str | None = "0.01") -> tuple[int, dict, dict]:
    """A scripted OpenAI error answer (``{"error": {...}}``), with ``Retry-After`` in seconds unless None."""
    headers = {"Retry-After": retry_after} if retry_after is not None else {}
    return status, headers, {"error": {"message": f"injected {status}", "type": "server_error"}}
