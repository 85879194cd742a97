"""Asking a model: the official SDKs (`openai`, `anthropic`; optional extras), one request per
generation, with the SDKs' own retries and back-off on 429 and 5xx, and every failure turned
into an outage message (the item's `infra_error`), never an exception out of the session.

Replies are streamed (a whole source file and the reasoning before it can take many minutes),
so the request timeout is an idle limit: the longest wait for the next content or reasoning
delta (reasoning is activity, though not the reply; keep-alive comments and pings a gateway
sends while a model thinks are not), with one generous cap on the whole request besides. Both
are kept by a watchdog thread that closes the stream, not by the arrival of chunks: a stream
of keep-alives alone, or one that stalls, ends at its limit. The reply's text is held up to
one character past what a solution may have (`regions.MAX_REPLY_CHARS`; the longer reply is
the model's own failure, as before). A stream that ends without a finish reason (cut by the
provider or a proxy), or a plain body where a stream was asked for, is the provider's fault:
an outage, never the model's reply. With the SDK's retries (`retries`, on 429, 5xx and
timeouts) one generation waits at most about (retries + 1) x the idle limit on an endpoint
that accepts and never answers. An OpenAI-compatible server that says how
long its context is (vLLM and SGLang list `max_model_len` under GET /v1/models) is asked for
no more output tokens than fit after the prompt."""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from typing import Any

from ..regions import MAX_REPLY_CHARS
from .registry import ModelSpec

SYSTEM = ("You are an expert in GPU communication (MPI, NCCL, NVSHMEM, CUDA). You complete "
          "benchmark tasks by editing only the marked regions of the file you are given.")


# the whole of one streamed request at most, however steadily it streams: 64k output tokens
# at 10 tokens/s (a slow reasoning model) take under two hours
WHOLE_REQUEST_S = 4 * 3600.0
# a prompt's tokens, estimated from its UTF-8 bytes without the model's tokenizer: BPE
# tokenizers average about 4 bytes a token on English and code, and CJK text is 3 bytes a
# character and seldom less than a token each; bytes / 3 over-counts both, so what is left
# for the reply is under-estimated and the request fits
BYTES_PER_TOKEN = 3
# tokens kept free besides: the chat template's role markers and special tokens
CONTEXT_MARGIN = 512
# the context length of (endpoint, model) as its server lists it (None: it does not say),
# asked once a session (a process: each xdist worker asks once)
_CONTEXTS: dict[tuple[str, str], int | None] = {}


@dataclass
class Generation:
    text: str | None
    tokens_in: int = 0
    tokens_out: int = 0
    error: str | None = None  # the model could not be asked (no key, SDK missing, outage)
    truncated: bool = False  # cut at the output-token limit
    # what was asked and what came back: endpoint, model, settings, usage, finish reason
    request: dict[str, Any] = field(default_factory=dict)


class _Unasked(Exception):
    """The request was not sent, or was given up: its message is the outage's."""


class _Watchdog:
    """The limits of one streamed request, kept by a thread: the idle limit (since the last
    content or reasoning delta, `active()`) and the whole request's cap. At either, the stream
    is closed (`close`, set once the stream is open), which ends its iteration in the asking
    thread; `reason` says why."""

    POLL_S = 0.05

    def __init__(self, idle_s: float, cap_s: float) -> None:
        import threading

        self.idle_s, self.cap_s = idle_s, cap_s
        self.started = self.last = time.monotonic()
        self.close = None
        self.reason: str | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="commbench-stream-watchdog",
                                        daemon=True)

    def __enter__(self) -> _Watchdog:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._done.set()
        self._thread.join(5)

    def active(self) -> None:
        self.last = time.monotonic()

    def check(self) -> None:
        if self.reason:
            raise _Unasked(self.reason)

    def _watch(self) -> None:
        while not self._done.wait(self.POLL_S):
            now = time.monotonic()
            if self.reason is None and now - self.started > self.cap_s:
                self.reason = (f"the reply was still streaming after {self.cap_s:g} s, the "
                               "cap on a whole request; given up")
            elif self.reason is None and self.close is not None and now - self.last > self.idle_s:
                self.reason = (f"no content or reasoning came for {self.idle_s:g} s "
                               "(--commbench-request-timeout is the longest wait for the next "
                               "chunk of a reply; keep-alives do not count)")
            close = self.close
            if self.reason and close is not None:  # (not open yet: closed once it is)
                try:
                    close()
                except Exception:  # noqa: BLE001 - the asking thread reports the reason
                    pass
                return


def ask(spec: ModelSpec, prompt: str, base_url: str | None, timeout_s: float,
        retries: int = 3, temperature: float | None = None, max_tokens: int | None = None,
        whole_s: float = WHOLE_REQUEST_S) -> Generation:
    """One streamed request. `timeout_s` is the idle limit between chunks, `whole_s` the
    cap on the whole request, `max_tokens` overrides the registry's output limit."""
    request: dict[str, Any] = {
        "provider": spec.provider, "endpoint": base_url or spec.base_url, "model": spec.model,
        "max_tokens": max_tokens or spec.max_tokens, "reasoning_effort": spec.reasoning_effort,
        "thinking": spec.thinking, "temperature": temperature, "stream": True}
    key = os.environ.get(spec.key_env, "")
    if not key:
        return Generation(None, error=f"no API key: set {spec.key_env} for {spec.alias}",
                          request=request)
    url = base_url or spec.base_url
    started = time.monotonic()
    cap = max(whole_s, timeout_s)
    try:
        with _Watchdog(timeout_s, cap) as dog:
            try:
                if spec.provider == "anthropic":
                    got = _anthropic(spec, prompt, key, url, timeout_s, retries, request, dog)
                else:
                    got = _openai(spec, prompt, key, url, timeout_s, retries, request, dog)
            except Exception:
                dog.check()  # the watchdog closed the stream: its reason, not the SDK's error
                raise
            dog.check()
    except ImportError as exc:
        got = Generation(None, error=sdk_missing(spec.provider, exc))
    except _Unasked as exc:
        got = Generation(None, error=str(exc))
    except Exception as exc:  # noqa: BLE001 - whatever the SDK raises is an outage
        status = refused(exc)
        if status is not None:  # the key (or its rights) refused: no later request will do
            request["refused"] = status
            got = Generation(None, error=f"the endpoint refused the request ({status}): check "
                                         f"{spec.key_env} and the endpoint; "
                                         f"{_outage(exc, timeout_s)}")
        else:
            got = Generation(None, error=_outage(exc, timeout_s))
    request["seconds"] = round(time.monotonic() - started, 3)
    got.request = request
    return got


#: the install command of the providers' SDKs, as the README gives it (the `models` extra)
SDK_INSTALL = 'pip install -e ".[models]"'
#: the HTTP statuses of a refused key: unauthenticated, or without the rights asked for
REFUSED = (401, 403)


def sdk_missing(provider: str, exc: BaseException) -> str:
    """Why a provider's SDK cannot be used, and the command that installs it."""
    return (f"the {provider} SDK cannot be imported ({exc}); install the providers' SDKs with "
            f"{SDK_INSTALL}")


def refused(exc: BaseException) -> int | None:
    """The status of an SDK error that refused the key (401, 403), else None: a wrong or
    revoked key fails every request alike, so the session stops at the first (plugin)."""
    status = getattr(exc, "status_code", None)
    return status if status in REFUSED else None


def _outage(exc: Exception, timeout_s: float) -> str:
    """The provider's message; a timeout says which limit it was."""
    text = f"{type(exc).__name__}: {str(exc)[:500]}"
    if "Timeout" in type(exc).__name__:
        text += (f" (nothing came for {timeout_s:g} s: --commbench-request-timeout is the "
                 "longest wait for the next chunk of a reply)")
    return text


def _field(obj: Any, name: str) -> Any:
    """A field of an SDK object, or of a server's extra (untyped) member, or of a dict."""
    if isinstance(obj, dict):
        return obj.get(name)
    return getattr(obj, name, None)


def _estimate(*texts: str) -> int:
    return math.ceil(sum(len(t.encode("utf-8", "surrogateescape")) for t in texts)
                     / BYTES_PER_TOKEN)


def _context(client, endpoint: str, model: str, timeout_s: float) -> int | None:
    """The model's context length as its server lists it (vLLM and SGLang: `max_model_len`;
    others: `context_length` or `context_window`), None where it does not say or the list
    cannot be had. Asked once per (endpoint, model) a session."""
    key = (endpoint, model)
    if key not in _CONTEXTS:
        length = None
        try:
            listed = client.with_options(timeout=min(timeout_s, 30.0), max_retries=1)
            for entry in listed.models.list().data:
                if entry.id == model:
                    for name in ("max_model_len", "context_length", "context_window"):
                        value = _field(entry, name)
                        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                            length = value
                            break
                    break
        except Exception:  # noqa: BLE001 - no list (a 404, a refusal): no limit known
            length = None
        _CONTEXTS[key] = length
    return _CONTEXTS[key]


def _fit(client, endpoint: str, model: str, prompt: str, limit: int, timeout_s: float) -> int:
    """The output tokens to ask for: the limit, or less where the server's context leaves
    less after the prompt; a prompt that leaves nothing is not sent."""
    context = _context(client, endpoint, model, timeout_s)
    if context is None:
        return limit
    estimate = _estimate(SYSTEM, prompt)
    room = context - estimate - CONTEXT_MARGIN
    if room < 1:
        raise _Unasked(f"the prompt does not fit the context of {model} at {endpoint}: about "
                       f"{estimate} tokens (its bytes / {BYTES_PER_TOKEN}) and a margin of "
                       f"{CONTEXT_MARGIN} against the {context} tokens the server lists; not "
                       "sent")
    return min(limit, room)


def _openai(spec, prompt, key, url, timeout_s, retries, request, dog) -> Generation:
    import openai

    client = openai.OpenAI(api_key=key, base_url=url, timeout=timeout_s, max_retries=retries)
    with client:
        request["endpoint"] = str(client.base_url)  # the SDK's default where none was named
        request["max_tokens"] = _fit(client, request["endpoint"], spec.model, prompt,
                                     request["max_tokens"], timeout_s)
        args = {"model": spec.model, "max_completion_tokens": request["max_tokens"],
                "messages": [{"role": "system", "content": SYSTEM},
                             {"role": "user", "content": prompt}],
                "stream": True, "stream_options": {"include_usage": True}}
        if spec.reasoning_effort:
            args["reasoning_effort"] = spec.reasoning_effort
        if request["temperature"] is not None:
            args["temperature"] = request["temperature"]
        if spec.extra_body:
            args["extra_body"] = dict(spec.extra_body)
        parts: list[str] = []
        held = 0  # characters of the reply held
        usage = finish = served = None
        with client.chat.completions.create(**args) as stream:
            dog.close = stream.close
            for chunk in stream:  # reasoning deltas (reasoning_content) are not kept
                dog.check()
                served = chunk.model or served
                usage = chunk.usage or usage
                for choice in chunk.choices or ():
                    delta = choice.delta
                    if delta is not None and (delta.content or _field(delta, "reasoning_content")
                                              or _field(delta, "reasoning")):
                        dog.active()
                    if delta is not None and delta.content and held <= MAX_REPLY_CHARS:
                        parts.append(delta.content)
                        held += len(delta.content)
                    finish = choice.finish_reason or finish
                    usage = usage or _field(choice, "usage")  # Moonshot puts it there
                if held > MAX_REPLY_CHARS:
                    break  # longer than any solution may be: the rest is not read
    if finish is None and held <= MAX_REPLY_CHARS:
        raise _Unasked("the stream ended without a finish reason (cut by the provider or a "
                       "proxy, or not a stream): not the model's reply")
    n_in, n_out = _field(usage, "prompt_tokens"), _field(usage, "completion_tokens")
    details = _field(usage, "completion_tokens_details")
    request.update(served_model=served, tokens_in=n_in, tokens_out=n_out,
                   reasoning_tokens=_field(details, "reasoning_tokens"), finish_reason=finish)
    return Generation("".join(parts) or None, n_in or 0, n_out or 0,
                      truncated=finish == "length")


def _anthropic(spec, prompt, key, url, timeout_s, retries, request, dog) -> Generation:
    import anthropic

    client = anthropic.Anthropic(api_key=key, base_url=url, timeout=timeout_s,
                                 max_retries=retries)
    args = {"model": spec.model, "max_tokens": request["max_tokens"], "system": SYSTEM,
            "messages": [{"role": "user", "content": prompt}]}
    if spec.thinking == "adaptive":
        args["thinking"] = {"type": "adaptive"}
        request["temperature"] = None  # thinking and a temperature do not go together
    elif request["temperature"] is not None:
        args["temperature"] = request["temperature"]
    if spec.extra_body:
        args["extra_body"] = dict(spec.extra_body)
    with client:
        request["endpoint"] = str(client.base_url)
        parts: list[str] = []
        held = 0
        stopped = False
        with client.messages.stream(**args) as stream:
            dog.close = stream.close
            for event in stream:  # thinking deltas are activity; only text deltas are kept
                dog.check()
                kind = getattr(event, "type", "")
                if kind in ("content_block_delta", "message_delta", "message_start"):
                    dog.active()
                if kind == "message_stop":
                    stopped = True
                if kind == "content_block_delta" and \
                        getattr(event.delta, "type", "") == "text_delta":
                    parts.append(event.delta.text)
                    held += len(event.delta.text)
                    if held > MAX_REPLY_CHARS:
                        break  # longer than any solution may be: the rest is not read
            if held > MAX_REPLY_CHARS:
                request.update(served_model=spec.model, finish_reason="cut: too long")
                return Generation("".join(parts), 0, 0)
            if not stopped:
                raise _Unasked("the stream ended without a finish reason (cut by the provider "
                               "or a proxy, or not a stream): not the model's reply")
            done = stream.get_final_message()
    text = "".join(parts)
    usage = done.usage
    request.update(served_model=done.model, tokens_in=_field(usage, "input_tokens"),
                   tokens_out=_field(usage, "output_tokens"),
                   reasoning_tokens=_field(_field(usage, "output_tokens_details"),
                                           "thinking_tokens"),
                   finish_reason=done.stop_reason)
    return Generation(text or None, getattr(usage, "input_tokens", 0) or 0,
                      getattr(usage, "output_tokens", 0) or 0,
                      truncated=done.stop_reason == "max_tokens")

