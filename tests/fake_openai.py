"""A fault-injecting OpenAI-compatible server on 127.0.0.1, for the endpoint clients' tests.

Each POST takes the next :class:`Fault` of ``server.script`` (the last one repeats) and records the
request (``path``, ``headers`` with lower-case names, ``body``) in ``server.requests``::

    with FakeOpenAI([status(500), answer("hello")]) as server:
        ...  # a client pointed at server.base_url (http://127.0.0.1:<port>/v1)
    assert len(server.requests) == 2

Faults: :func:`answer` (a chat completion), :func:`refuse` (``message.refusal``), :func:`status` (an HTTP
error), :func:`raw` (a 200 with any body), :func:`slow` (wait, then another fault: a client timeout),
:func:`drop` (close the connection without answering: a transport error).

For concurrent clients, where the order of requests is not fixed, ``FakeOpenAI(choose=f)`` answers
``f(request, n)`` instead: ``n`` counts the earlier requests with the same body (0 on a first attempt,
1 on its first retry), so each conversation gets its own fault whatever the order.
"""
from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable


@dataclass(frozen=True)
class Fault:
    code: int = 200
    body: str = ""
    delay_s: float = 0.0
    drop: bool = False


def answer(content: str | None) -> Fault:
    return Fault(200, json.dumps({"id": "x", "object": "chat.completion", "choices": [
        {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": content}}]}))


def refuse(reason: str = "I can't help with that.") -> Fault:
    return Fault(200, json.dumps({"choices": [{"index": 0, "message": {"role": "assistant", "content": None,
                                                                        "refusal": reason}}]}))


def status(code: int, text: str = '{"error": "boom"}') -> Fault:
    return Fault(code, text)


def raw(text: str) -> Fault:
    return Fault(200, text)


def slow(seconds: float, then: Fault | None = None) -> Fault:
    then = then or answer("late")
    return Fault(then.code, then.body, delay_s=seconds, drop=then.drop)


def drop() -> Fault:
    return Fault(drop=True)


class _Handler(BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802
        srv: FakeOpenAI = self.server.owner
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"null")
        fault = srv.next_fault({"path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()},
                                "body": body})
        if fault.delay_s:
            time.sleep(fault.delay_s)
        if fault.drop:
            self.close_connection = True
            return
        data = fault.body.encode()
        try:
            self.send_response(fault.code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except OSError:          # the client timed out and hung up: expected in the timeout tests
            self.close_connection = True

    def log_message(self, *args: Any) -> None:
        pass


class FakeOpenAI:
    """The server (module docstring); ``base_url`` is ``http://127.0.0.1:<port>/v1``."""

    def __init__(self, script: list[Fault] | None = None, choose: Callable[[dict[str, Any], int], Fault] | None = None):
        self.script = list(script or [answer("ok")])
        self.choose = choose
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self._httpd.owner = self
        self._httpd.handle_error = lambda request, client_address: None
        self._httpd.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.01},
                                        daemon=True)

    def next_fault(self, request: dict[str, Any]) -> Fault:
        with self._lock:
            seen = sum(r["body"] == request["body"] for r in self.requests)
            self.requests.append(request)
            if self.choose is not None:
                return self.choose(request, seen)
            return self.script.pop(0) if len(self.script) > 1 else self.script[0]

    def __enter__(self) -> "FakeOpenAI":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
