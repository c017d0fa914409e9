"""A tiny scripted OpenAI-compatible server for tests: real HTTP on 127.0.0.1.

    with FakeOpenAI() as server:
        server.push(429, {"error": {"message": "slow down"}})
        server.push_answer('{"re-ranked_page_numbers": [2, 1]}')
        reranker = LLMReranker(base_url=server.base_url, api_key="test", ...)

Each POST to ``/v1/chat/completions`` takes the next scripted response; when the
queue is empty, ``handler`` (a callable that sees the request JSON) answers, and
without one the server answers 500.  A scripted response is ``(status, body)``
(body: dict -> JSON, str -> sent as is), or a callable returning one of those, a
plain string (the assistant's message content, status 200), or a dict (a JSON
body, status 200).  Every request body is recorded in ``requests``.
"""

from __future__ import annotations

import json
import select
import socket
import threading
import time
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

Response = Any  # (status, body) | str | dict | Callable[[dict], ...] | HANG | Drip


class _Hang:
    """Never answer (until the server stops)."""


HANG = _Hang()


class Drip:
    """Answer 200 with a Content-Length of ``size`` bytes, then send one byte every
    ``interval_s`` (a server that is alive but never finishes)."""

    def __init__(self, interval_s: float = 1.0, size: int = 100_000) -> None:
        self.interval_s = interval_s
        self.size = size


def completion(content: str | None, model: str = "fake-model") -> dict:
    """A chat-completion body whose assistant message is ``content``."""
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": 0,
        "model": model,
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": content}}],
        "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
    }


def error(status: int, message: str = "error") -> tuple[int, dict]:
    return status, {"error": {"message": message, "type": "fake_error", "code": None}}


def _closed_by_client(connection: socket.socket) -> bool:
    """Whether the client has closed this connection (without waiting or reading)."""
    try:
        return not connection.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except BlockingIOError:
        return False
    except OSError:
        return True


class FakeOpenAI:
    def __init__(self, handler: Callable[[dict], Response] | None = None) -> None:
        self.requests: list[dict] = []
        self.handler = handler
        self.delay_s = 0.0  # sleep before answering (to provoke client timeouts)
        # llama.cpp's POST /tokenize and /detokenize when set: one token per word here
        self.tokenizer = False
        self.tokenize_calls = 0
        self._script: deque = deque()
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self.in_flight = 0  # requests being answered now
        # the most connections the client held at once: counted when a request arrives,
        # less the hanging ones the client has already closed (their handler may not
        # have run yet to notice: on a busy machine that lag is not the client's)
        self.max_in_flight = 0
        self._hanging: set[socket.socket] = set()
        self.request_times: list[float] = []  # time.monotonic() of each request
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._make_handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.01},
                                        daemon=True)

    # -------------------------------------------------------------- scripting

    def push(self, status: int, body: dict | str) -> "FakeOpenAI":
        self._script.append((status, body))
        return self

    def push_answer(self, content: str | None) -> "FakeOpenAI":
        return self.push(200, completion(content))

    def push_behaviour(self, behaviour: "_Hang | Drip") -> "FakeOpenAI":
        """HANG or a Drip for the next request."""
        self._script.append(behaviour)
        return self

    def push_callable(self, fn: Callable[[dict], Response]) -> "FakeOpenAI":
        self._script.append(fn)
        return self

    # -------------------------------------------------------------- lifecycle

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> "FakeOpenAI":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()  # hung and dripping answers end
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> "FakeOpenAI":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -------------------------------------------------------------- serving

    def _respond(self, request: dict) -> tuple[int, dict | str]:
        with self._lock:
            self.requests.append(request)
            self.request_times.append(time.monotonic())
            item = self._script.popleft() if self._script else self.handler
        if item is None:
            return error(500, "fake server: no scripted response left")
        if item is HANG or isinstance(item, Drip):
            return item
        if callable(item) and not isinstance(item, Drip):
            item = item(request)
            if item is HANG or isinstance(item, Drip):
                return item
        if isinstance(item, str) or item is None:
            return 200, completion(item)
        if isinstance(item, dict):
            return 200, item
        return item

    def _make_handler(self):
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # keep test output quiet
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                if fake.tokenizer and self.path in ("/tokenize", "/detokenize"):
                    body = json.loads(raw)
                    fake.tokenize_calls += 1
                    if self.path == "/tokenize":
                        self._send(200, {"tokens": [hash(w) % 50000 for w in body["content"].split(" ")]})
                    else:  # tokens are not reversible here: words of the right count
                        self._send(200, {"content": " ".join("w" for _ in body["tokens"])})
                    return
                if self.path.rstrip("/") != "/v1/chat/completions":
                    self._send(*error(404, f"no route {self.path}"))
                    return
                try:
                    request = json.loads(raw)
                except ValueError:
                    self._send(*error(400, "request body is not JSON"))
                    return
                with fake._lock:
                    fake.in_flight += 1
                    closed = sum(1 for c in fake._hanging if _closed_by_client(c))
                    fake.max_in_flight = max(fake.max_in_flight, fake.in_flight - closed)
                try:
                    answer = fake._respond(request)
                    if answer is HANG:
                        self._hang()
                        return
                    if isinstance(answer, Drip):
                        self._drip(answer)
                        return
                    if fake.delay_s:
                        time.sleep(fake.delay_s)
                    self._send(*answer)
                finally:
                    with fake._lock:
                        fake.in_flight -= 1

            def _hang(self) -> None:
                """Answer nothing until the client closes the connection (so that
                ``in_flight`` counts the connections the client still holds)."""
                with fake._lock:
                    fake._hanging.add(self.connection)
                try:
                    while not fake._stopping.is_set():
                        readable, _, _ = select.select([self.connection], [], [], 0.2)
                        if readable and _closed_by_client(self.connection):
                            return
                finally:
                    with fake._lock:
                        fake._hanging.discard(self.connection)

            def _drip(self, drip: Drip) -> None:
                try:
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(drip.size))
                    self.end_headers()
                    self.wfile.flush()
                    for _ in range(drip.size):
                        if fake._stopping.wait(drip.interval_s):
                            return
                        self.wfile.write(b" ")
                        self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError, OSError):  # the client gave up
                    pass

            def _send(self, status: int, body: dict | str) -> None:
                data = (json.dumps(body) if isinstance(body, dict) else body).encode("utf-8")
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout)
                    pass

        return Handler


# -- pytest fixtures shared by the LLM test modules (import them by name) --------
import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def char_token_estimate(monkeypatch):
    """Pin the 4-characters-a-token estimate, so budgets and batch sizes do not depend on tiktoken."""
    from evidentia.reranker import llm

    estimate = (lambda t: -(-len(t) // 4), lambda t, n: t[: max(0, n) * 4])
    monkeypatch.setattr(llm, "_tokenizer", lambda: estimate)


@pytest.fixture
def server():
    with FakeOpenAI() as s:
        yield s


@pytest.fixture
def sleeps():
    return []
