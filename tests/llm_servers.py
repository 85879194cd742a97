"""A scripted loopback HTTP server that speaks enough of the OpenAI Chat Completions API and the
Anthropic Messages API for the official SDKs to talk to it in tests.

    with ScriptedServer("openai", [{"status": 429}, {"text": "hi"}]) as srv:
        client = openai.OpenAI(api_key="test", base_url=srv.base_url)
        ...
        assert len(srv.requests) == 2

Each request to the provider's endpoint takes the next step of the script (the last step repeats
forever) and is kept in `srv.requests` (path, method, lower-cased headers, JSON body);
`srv.all_requests` keeps every request, model lists and unknown paths too. A step is a dict with optional keys: "status" (int, 200), "text" (str, the reply),
"delay_s" (float, sleep before answering), "usage" ({"in": int, "out": int, and optionally
"reasoning": int, the reasoning tokens among "out"}), "headers" (extra
response headers, which override the defaults, e.g. {"retry-after-ms": "1"} on a 500) and
"finish" (the finish reason: OpenAI's "stop" or "length", Anthropic's "end_turn" or
"max_tokens"; default the first).

A request with `"stream": true` is answered as the providers stream, server-sent events over a
response that ends when the connection closes: OpenAI's `chat.completion.chunk`s (a role chunk,
reasoning deltas as vLLM and DeepSeek send them, `delta.reasoning_content`, content deltas, a
chunk with the finish reason, with `stream_options.include_usage` a last chunk of no choices and
the usage, then `data: [DONE]`), Anthropic's `message_start`, `ping`, a `thinking` block,
a `text` block of `text_delta`s, `message_delta` (stop reason, output tokens), `message_stop`.
Streaming keys of a step: "chunks" (int, how many content deltas the text is cut into, 1),
"reasoning" (str, sent as reasoning or thinking deltas before the text, in as many chunks),
"gap_s" (float, the pause before each chunk) and "stall_s" (float, one pause half-way through).
Misbehaving streams: "keepalive_s" (float: before the reply, SSE comment lines `: keep-alive`
that often, as gateways send while a model thinks, for "keepalive_for_s" seconds, default
until the client goes away), "cut" (true: the stream ends without a finish reason, as a proxy
that drops the connection leaves it) and "unstreamed" (true: a JSON body although a stream was
asked for).

`ScriptedServer("openai", script, route=fn)`: `fn(body)` picks the step for a request by what it
asks (None: the script's next step), so each item of a session can get its own answer.

`ScriptedServer("openai", script, models={"coder": 32768})` also lists those models under GET
/v1/models (and /v1/models/ID), each with its `max_model_len` as vLLM and SGLang do; without
`models` those paths are a 404, as they are on servers that do not list their models.
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
    def __init__(self, kind: str, script: list[dict], models: dict[str, int] | None = None,
                 route=None) -> None:
        if kind not in ENDPOINTS:
            raise ValueError(f"kind must be one of {sorted(ENDPOINTS)}, not {kind!r}")
        self.kind = kind
        self.script = list(script) or [{}]
        self.models = dict(models or {})  # id -> max_model_len, listed under GET /v1/models
        # route(body) -> a step, or None for the script's next: answers chosen by what is
        # asked (an item's prompt), whatever the order the requests come in
        self.route = route
        self.requests: list[dict] = []  # POSTs to the provider's endpoint: the asking
        self.all_requests: list[dict] = []  # every request (model lists, unknown paths too)
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

    def _reply(self, method: str, path: str, body: object) -> tuple[int, object, dict]:
        """(status, JSON body or an iterator of server-sent events, extra headers) for a
        request: the next step, a model list, or a 404."""
        if method == "GET" and self.kind == "openai" and self.models:
            listed = self._model_list(path.split("?")[0])
            if listed is not None:
                return 200, listed, {}
        if method != "POST" or path.split("?")[0] != ENDPOINTS[self.kind]:
            return 404, self._error(404, f"Unknown path {method} {path}"), {}
        step = self.route(body) if self.route is not None else None
        if step is None:
            step = self._next_step()
        if step.get("delay_s"):
            self._stopping.wait(step["delay_s"])
        status = step.get("status", 200)
        headers = dict(RETRY_NOW) if status == 429 else {}
        headers.update(step.get("headers", {}))
        if status != 200:
            return status, self._error(status, f"Scripted error {status}"), headers
        model = body.get("model", "") if isinstance(body, dict) else ""
        if isinstance(body, dict) and body.get("stream") and not step.get("unstreamed"):
            usage = (self.kind == "anthropic"
                     or bool((body.get("stream_options") or {}).get("include_usage")))
            return 200, self._events(model, step, usage), headers
        return 200, self._message(model, step.get("text", ""), step.get("usage", {}),
                                  step.get("finish")), headers

    def _model_list(self, path: str) -> dict | None:
        entries = {name: {"id": name, "object": "model", "created": 1700000000,
                          "owned_by": "vllm", "root": name, "parent": None,
                          "max_model_len": length} for name, length in self.models.items()}
        if path == "/v1/models":
            return {"object": "list", "data": list(entries.values())}
        return entries.get(path.removeprefix("/v1/models/"))

    def _pause(self, seconds: float) -> None:
        if seconds:
            self._stopping.wait(seconds)

    def _events(self, model: str, step: dict, usage: bool):
        """The stream of one step, as the provider sends it (pauses between the events)."""
        text, thought = step.get("text", ""), step.get("reasoning", "")
        n = max(1, int(step.get("chunks", 1)))
        pieces = [text[len(text) * i // n:len(text) * (i + 1) // n] for i in range(n)]
        thoughts = [thought[len(thought) * i // n:len(thought) * (i + 1) // n]
                    for i in range(n)] if thought else []
        n_in, n_out = step.get("usage", {}).get("in", 100), step.get("usage", {}).get("out", 200)
        n_think = step.get("usage", {}).get("reasoning")
        gap, stall = float(step.get("gap_s", 0)), float(step.get("stall_s", 0))
        if step.get("keepalive_s"):
            every = float(step["keepalive_s"])
            until = time.monotonic() + float(step.get("keepalive_for_s", 1e9))
            while time.monotonic() < until and not self._stopping.is_set():
                yield b": keep-alive\n\n"
                self._pause(every)
        if step.get("cut"):
            events = list(self._openai_events(model, pieces, thoughts, None, (n_in, n_out, n_think),
                                              False, gap, stall) if self.kind == "openai" else
                          self._anthropic_events(model, pieces, thoughts, None,
                                                 (n_in, n_out, n_think), gap, stall))
            # the content, then nothing: no finish reason, no [DONE] / message_stop
            yield from events[:-2]
            return
        if self.kind == "openai":
            yield from self._openai_events(model, pieces, thoughts, step.get("finish") or "stop",
                                           (n_in, n_out, n_think), usage, gap, stall)
        else:
            yield from self._anthropic_events(model, pieces, thoughts,
                                              step.get("finish") or "end_turn",
                                              (n_in, n_out, n_think), gap, stall)

    def _openai_events(self, model, pieces, thoughts, finish, counts, usage, gap, stall):
        n_in, n_out, n_think = counts
        ident, created = f"chatcmpl-{uuid.uuid4().hex[:24]}", int(time.time())

        def chunk(delta: dict, reason: str | None = None, choices: bool = True,
                  counted: dict | None = None) -> bytes:
            data = {"id": ident, "object": "chat.completion.chunk", "created": created,
                    "model": model, "system_fingerprint": None,
                    "choices": [{"index": 0, "delta": delta, "logprobs": None,
                                 "finish_reason": reason}] if choices else []}
            if usage:
                data["usage"] = counted
            return f"data: {json.dumps(data)}\n\n".encode()

        yield chunk({"role": "assistant", "content": ""})
        for piece in thoughts:
            self._pause(gap)
            yield chunk({"reasoning_content": piece})
        for i, piece in enumerate(pieces):
            self._pause(gap + (stall if i == len(pieces) // 2 else 0))
            yield chunk({"content": piece})
        yield chunk({}, finish)
        if usage:
            counted = {"prompt_tokens": n_in, "completion_tokens": n_out,
                       "total_tokens": n_in + n_out}
            if n_think is not None:
                counted["completion_tokens_details"] = {"reasoning_tokens": n_think}
            yield chunk({}, choices=False, counted=counted)
        yield b"data: [DONE]\n\n"

    def _anthropic_events(self, model, pieces, thoughts, finish, counts, gap, stall):
        n_in, n_out, n_think = counts
        def event(name: str, data: dict) -> bytes:
            return f"event: {name}\ndata: {json.dumps({'type': name, **data})}\n\n".encode()

        yield event("message_start", {"message": {
            "id": f"msg_{uuid.uuid4().hex[:24]}", "type": "message", "role": "assistant",
            "model": model, "content": [], "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": n_in, "output_tokens": 1}}})
        yield event("ping", {})
        index = 0
        if thoughts:
            yield event("content_block_start", {"index": 0, "content_block": {
                "type": "thinking", "thinking": "", "signature": ""}})
            for piece in thoughts:
                self._pause(gap)
                yield event("content_block_delta", {"index": 0, "delta": {
                    "type": "thinking_delta", "thinking": piece}})
            yield event("content_block_delta", {"index": 0, "delta": {
                "type": "signature_delta", "signature": "c2lnbmVk"}})
            yield event("content_block_stop", {"index": 0})
            index = 1
        yield event("content_block_start", {"index": index, "content_block": {
            "type": "text", "text": ""}})
        for i, piece in enumerate(pieces):
            self._pause(gap + (stall if i == len(pieces) // 2 else 0))
            yield event("content_block_delta", {"index": index, "delta": {
                "type": "text_delta", "text": piece}})
        yield event("content_block_stop", {"index": index})
        counted: dict = {"output_tokens": n_out}
        if n_think is not None:
            counted["output_tokens_details"] = {"thinking_tokens": n_think}
        yield event("message_delta", {"delta": {"stop_reason": finish, "stop_sequence": None},
                                      "usage": counted})
        yield event("message_stop", {})

    def _error(self, status: int, message: str) -> dict:
        if self.kind == "openai":
            kind = OPENAI_ERRORS.get(status, "server_error" if status >= 500 else "api_error")
            code = kind if status == 429 else None
            return {"error": {"message": message, "type": kind, "param": None, "code": code}}
        kind = ANTHROPIC_ERRORS.get(status, "api_error")
        return {"type": "error", "error": {"type": kind, "message": message}}

    def _message(self, model: str, text: str, usage: dict, finish: str | None = None) -> dict:
        n_in, n_out = usage.get("in", 100), usage.get("out", 200)
        if self.kind == "openai":
            return {
                "id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "object": "chat.completion",
                "created": int(time.time()), "model": model,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                             "logprobs": None, "finish_reason": finish or "stop"}],
                "usage": {"prompt_tokens": n_in, "completion_tokens": n_out,
                          "total_tokens": n_in + n_out},
            }
        return {
            "id": f"msg_{uuid.uuid4().hex[:24]}", "type": "message", "role": "assistant",
            "model": model, "content": [{"type": "text", "text": text}],
            "stop_reason": finish or "end_turn", "stop_sequence": None,
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
            seen = {"path": self.path, "method": self.command,
                    "headers": {k.lower(): v for k, v in self.headers.items()}, "body": body}
            owner.all_requests.append(seen)
            if self.command == "POST" and self.path.split("?")[0] == ENDPOINTS[owner.kind]:
                owner.requests.append(seen)
        status, payload, headers = owner._reply(self.command, self.path, body)
        streamed = not isinstance(payload, dict)
        data = b"" if streamed else json.dumps(payload).encode()
        try:
            self.send_response(status)
            if streamed:  # no length: the events end where the connection closes (HTTP/1.0)
                self.send_header("content-type", "text/event-stream; charset=utf-8")
                self.send_header("cache-control", "no-cache")
            else:
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
            self.send_header("x-request-id" if owner.kind == "openai" else "request-id",
                             f"req_{uuid.uuid4().hex[:24]}")
            for name, value in headers.items():
                self.send_header(name, value)
            self.end_headers()
            if not streamed:
                self.wfile.write(data)
                return
            for event in payload:
                self.wfile.write(event)
                self.wfile.flush()
        except OSError:  # the client gave up (e.g. its timeout) and closed the connection
            self.close_connection = True

    do_GET = do_POST

    def log_message(self, format: str, *args: object) -> None:
        pass
