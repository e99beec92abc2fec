"""A small OpenAI-compatible chat-completions server for tests (stdlib only).

Serves a script of replies to POST /v1/chat/completions, one per request, in order, and
records every request body. A script item is a dict:

    {"content": "text"}                                   a plain text reply
    {"tool_calls": [{"name": "compile", "arguments": "{...}"}], "content": ""}
                                                          tool-call reply; arguments is the
                                                          raw string sent (may be bad JSON)
    {"status": 429, "headers": {"Retry-After": "0"}}      an error response (any status)
    {"delay": 2.0, ...}                                   sleep first (client timeouts), then
                                                          answer as the rest of the item says
    {"hang": True}                                        accept the request and never answer
                                                          (until the server stops)
    {"usage": {"prompt_tokens": 10, "completion_tokens": 5}}  optional, on any reply

Running out of script answers 400, so a test that under-scripts fails loudly.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def text(content: str, **extra: Any) -> dict:
    return {"content": content, **extra}


def tool(name: str, arguments: dict | str | None = None, content: str = "", **extra: Any) -> dict:
    args = arguments if isinstance(arguments, str) else json.dumps(arguments or {})
    return {"content": content, "tool_calls": [{"name": name, "arguments": args}], **extra}


def hang() -> dict:
    """A request the server accepts and never answers."""
    return {"hang": True}


def error(status: int, retry_after: str | None = None, message: str = "injected fault") -> dict:
    item: dict[str, Any] = {"status": status, "message": message}
    if retry_after is not None:
        item["headers"] = {"Retry-After": retry_after}
    return item


class FakeOpenAIServer:
    def __init__(self, script: list[dict] | None = None) -> None:
        self.script: list[dict] = list(script or [])
        self.requests: list[dict] = []  # JSON bodies, in arrival order
        self.lock = threading.Lock()
        self.counter = 0
        self.stopped = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # keep test output clean
                pass

            def _send(self, status: int, body: dict, headers: dict | None = None) -> None:
                data = json.dumps(body).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    for key, value in (headers or {}).items():
                        self.send_header(key, value)
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (timeout test)

            def do_GET(self) -> None:  # noqa: N802
                if self.path.rstrip("/").endswith("/models"):
                    self._send(200, {"object": "list", "data": [{"id": "fake", "object": "model"}]})
                else:
                    self._send(404, {"error": {"message": "not found"}})

            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body = json.loads(raw or b"{}")
                except json.JSONDecodeError:
                    body = {"_unparsed": raw.decode(errors="replace")}
                if not self.path.rstrip("/").endswith("/chat/completions"):
                    self._send(404, {"error": {"message": f"no route {self.path}"}})
                    return
                with server.lock:
                    server.requests.append(body)
                    item = server.script.pop(0) if server.script else None
                    server.counter += 1
                    n = server.counter
                if item is None:
                    self._send(400, {"error": {"message": "fake server: script exhausted",
                                               "type": "invalid_request_error"}})
                    return
                if item.get("hang"):
                    server.stopped.wait()
                    return
                if item.get("delay"):
                    time.sleep(item["delay"])
                if item.get("status", 200) != 200:
                    self._send(item["status"], {"error": {"message": item.get("message", "fault"),
                                                          "type": "server_error"}},
                               item.get("headers"))
                    return
                self._send(200, server.completion(body, item, n))

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @staticmethod
    def completion(body: dict, item: dict, n: int) -> dict:
        message: dict[str, Any] = {"role": "assistant", "content": item.get("content") or None}
        calls = item.get("tool_calls") or []
        if calls:
            message["tool_calls"] = [
                {"id": c.get("id", f"call_{n}_{i}"), "type": "function",
                 "function": {"name": c["name"], "arguments": c.get("arguments", "{}")}}
                for i, c in enumerate(calls)]
        usage = item.get("usage") or {"prompt_tokens": 100, "completion_tokens": 20}
        usage = {**usage, "total_tokens": usage["prompt_tokens"] + usage["completion_tokens"]}
        return {"id": f"chatcmpl-fake-{n}", "object": "chat.completion",
                "created": int(time.time()), "model": body.get("model", "fake"),
                "choices": [{"index": 0, "message": message,
                             "finish_reason": "tool_calls" if calls else "stop"}],
                "usage": usage}

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}/v1"

    def add(self, *items: dict) -> None:
        with self.lock:
            self.script.extend(items)

    def start(self) -> "FakeOpenAIServer":
        self.thread.start()
        return self

    def stop(self) -> None:
        self.stopped.set()
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self) -> "FakeOpenAIServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
