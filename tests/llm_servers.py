"""A scripted loopback HTTP server that speaks enough of the OpenAI Chat Completions API and the
Anthropic Messages API for the official SDKs to talk to it in tests.

    with ScriptedServer("openai", [{"status": 429}, {"text": "hi"}]) as srv:
        client = openai.OpenAI(api_key="test", base_url=srv.base_url)
        ...
        assert len(srv.requests) == 2

Each request to the provider's endpoint takes the next step of the script (the last step repeats
forever). A step is a dict with optional keys: "status" (int, 200), "text" (str, the reply),
"delay_s" (float, sleep before answering), "usage" ({"in": int, "out": int}) and "headers" (extra
response headers, which override the defaults, e.g. {"retry-after-ms": "1"} on a 500).
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ENDPOINTS = {"openai": "/v1/chat/completions", "anthropic": "/v1/messages"}
OPENAI_ERRORS = {400: "invalid_request_error", 401: "invalid_request_error",
                 404: "invalid_request_error", 429: "rate_limit_exceeded"}
ANTHROPIC_ERRORS = {400: "invalid_request_error", 401: "authentication_error",
                    403: "permission_error", 404: "not_found_error", 413: "request_too_large",
                    429: "rate_limit_error", 529: "overloaded_error"}
# Both SDKs read retry-after-ms before retry-after and ignore a delay of 0 (they fall back to their
# own back-off, 0.375 to 0.5 s for the first retry), so a 1 ms delay is what makes retries quick.
RETRY_NOW = {"retry-after": "0", "retry-after-ms": "1", "x-should-retry": "true"}


class ScriptedServer:
    def __init__(self, kind: str, script: list[dict]) -> None:
        if kind not in ENDPOINTS:
            raise ValueError(f"kind must be one of {sorted(ENDPOINTS)}, not {kind!r}")
        self.kind = kind
        self.script = list(script) or [{}]
        self.requests: list[dict] = []
        self.base_url = ""
        self._served = 0  # requests to the endpoint so far: the index of the next step
        self._lock = threading.Lock()
        self._stopping = threading.Event()  # wakes delayed answers on exit

    def __enter__(self) -> ScriptedServer:
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self._httpd.scripted = self
        port = self._httpd.server_address[1]
        self.base_url = f"http://127.0.0.1:{port}" + ("/v1" if self.kind == "openai" else "")
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.05,),
                                        daemon=True, name=f"scripted-{self.kind}-{port}")
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stopping.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    def _next_step(self) -> dict:
        with self._lock:
            step = self.script[min(self._served, len(self.script) - 1)]
            self._served += 1
        return step

    def _reply(self, method: str, path: str, body: object) -> tuple[int, dict, dict]:
        """(status, JSON body, extra headers) for a request: the next step, or a 404."""
        if method != "POST" or path.split("?")[0] != ENDPOINTS[self.kind]:
            return 404, self._error(404, f"Unknown path {method} {path}"), {}
        step = self._next_step()
        if step.get("delay_s"):
            self._stopping.wait(step["delay_s"])
        status = step.get("status", 200)
        headers = dict(RETRY_NOW) if status == 429 else {}
        headers.update(step.get("headers", {}))
        if status != 200:
            return status, self._error(status, f"Scripted error {status}"), headers
        model = body.get("model", "") if isinstance(body, dict) else ""
        return 200, self._message(model, step.get("text", ""), step.get("usage", {})), headers

    def _error(self, status: int, message: str) -> dict:
        if self.kind == "openai":
            kind = OPENAI_ERRORS.get(status, "server_error" if status >= 500 else "api_error")
            code = kind if status == 429 else None
            return {"error": {"message": message, "type": kind, "param": None, "code": code}}
        kind = ANTHROPIC_ERRORS.get(status, "api_error")
        return {"type": "error", "error": {"type": kind, "message": message}}

    def _message(self, model: str, text: str, usage: dict) -> dict:
        n_in, n_out = usage.get("in", 100), usage.get("out", 200)
        if self.kind == "openai":
            return {
                "id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "object": "chat.completion",
                "created": int(time.time()), "model": model,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                             "logprobs": None, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": n_in, "completion_tokens": n_out,
                          "total_tokens": n_in + n_out},
            }
        return {
            "id": f"msg_{uuid.uuid4().hex[:24]}", "type": "message", "role": "assistant",
            "model": model, "content": [{"type": "text", "text": text}],
            "stop_reason": "end_turn", "stop_sequence": None,
            "usage": {"input_tokens": n_in, "output_tokens": n_out},
        }


class _Handler(BaseHTTPRequestHandler):
    # HTTP/1.0: one request per connection, so no handler thread lingers on an idle keep-alive
    server: ThreadingHTTPServer

    def do_POST(self) -> None:
        owner: ScriptedServer = self.server.scripted
        raw = self.rfile.read(int(self.headers.get("content-length") or 0))
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode("utf-8", "replace")
        with owner._lock:
            owner.requests.append({"path": self.path,
                                   "headers": {k.lower(): v for k, v in self.headers.items()},
                                   "body": body})
        status, payload, headers = owner._reply(self.command, self.path, body)
        data = json.dumps(payload).encode()
        try:
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.send_header("x-request-id" if owner.kind == "openai" else "request-id",
                             f"req_{uuid.uuid4().hex[:24]}")
            for name, value in headers.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)
        except OSError:  # the client gave up (e.g. its timeout) and closed the connection
            self.close_connection = True

    do_GET = do_POST

    def log_message(self, format: str, *args: object) -> None:
        pass
