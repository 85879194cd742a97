"""Asking models as real endpoints answer: `providers.ask` through the official SDKs against the
loopback servers of llm_servers.py, streaming as the providers stream (server-sent events)."""

from __future__ import annotations

import dataclasses
import math
import sys
import time
from pathlib import Path

import pytest

from pytest_commbench.models import providers
from pytest_commbench.models.registry import resolve

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from llm_servers import ScriptedServer  # noqa: E402

KINDS = ["openai", "anthropic"]
# what each SDK calls a reply cut at the output limit, and one that ended by itself
CUT = {"openai": "length", "anthropic": "max_tokens"}
DONE = {"openai": "stop", "anthropic": "end_turn"}


@pytest.fixture(autouse=True)
def keys(monkeypatch):
    pytest.importorskip("openai")
    pytest.importorskip("anthropic")
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")


def spec(kind: str, **fields):
    return dataclasses.replace(resolve(f"{kind}:coder"), **fields)


def body(srv: ScriptedServer, n: int = 0) -> dict:
    return srv.requests[n]["body"]


def sent_limit(kind: str, sent: dict) -> int:
    return sent["max_completion_tokens"] if kind == "openai" else sent["max_tokens"]


def prompt_bytes(sent: dict) -> int:
    """The UTF-8 bytes of everything the request asks the model to read."""
    texts = [m["content"] for m in sent["messages"]] + ([sent["system"]] if "system" in sent
                                                        else [])
    return sum(len(t.encode()) for t in texts)


# -- the context a server lists -----------------------------------------------------------------

def test_a_server_that_lists_a_32k_context_is_asked_for_what_fits():
    """vLLM's GET /v1/models says max_model_len 32768: a model allowed 65536 output tokens is
    asked for at most what the context leaves after the prompt (estimated as bytes / 3), the
    list is asked once for two requests, and both requests fit."""
    prompt = "Write the ring all-reduce.\n" + "x = 1  # padding\n" * 2000  # ~34 kB
    with ScriptedServer("openai", [{"text": "ok"}], models={"coder": 32768}) as srv:
        first = providers.ask(spec("openai", max_tokens=65536), prompt, srv.base_url, 5)
        second = providers.ask(spec("openai", max_tokens=65536), prompt, srv.base_url, 5)
    assert first.error is None and second.error is None
    listed = [r for r in srv.all_requests if r["path"].startswith("/v1/models")]
    assert len(listed) == 1 and len(srv.requests) == 2  # the context is kept for the session
    for n in range(2):
        sent = body(srv, n)
        asked = sent["max_completion_tokens"]
        assert 0 < asked < 65536
        assert asked + math.ceil(prompt_bytes(sent) / 3) <= 32768
        assert asked == 32768 - math.ceil(prompt_bytes(sent) / 3) \
            - providers.CONTEXT_MARGIN
    assert first.request["max_tokens"] == body(srv)["max_completion_tokens"]


def test_a_smaller_limit_than_the_context_leaves_is_asked_as_it_is():
    with ScriptedServer("openai", [{"text": "ok"}], models={"coder": 32768}) as srv:
        got = providers.ask(spec("openai"), "short prompt", srv.base_url, 5, max_tokens=1234)
    assert got.error is None and body(srv)["max_completion_tokens"] == 1234


def test_a_prompt_the_context_cannot_hold_is_an_outage_and_is_not_sent():
    with ScriptedServer("openai", [{"text": "never"}], models={"coder": 1000}) as srv:
        got = providers.ask(spec("openai"), "y" * 6000, srv.base_url, 5)
    assert got.text is None and "does not fit the context of coder" in got.error
    assert "1000 tokens" in got.error and srv.requests == []
    assert [r["path"] for r in srv.all_requests] == ["/v1/models"]


def test_a_server_that_lists_other_models_or_none_leaves_the_limit_alone():
    with ScriptedServer("openai", [{"text": "ok"}], models={"other": 4096}) as srv:
        providers.ask(spec("openai", max_tokens=50000), "p", srv.base_url, 5)
    with ScriptedServer("openai", [{"text": "ok"}]) as bare:  # GET /v1/models is a 404
        providers.ask(spec("openai", max_tokens=50000), "p", bare.base_url, 5)
    assert body(srv)["max_completion_tokens"] == body(bare)["max_completion_tokens"] == 50000


@pytest.mark.parametrize("kind", KINDS)
def test_the_max_tokens_override_is_what_is_asked(kind):
    with ScriptedServer(kind, [{"text": "ok"}]) as srv:
        got = providers.ask(spec(kind, max_tokens=64000), "p", srv.base_url, 5, max_tokens=777)
    assert sent_limit(kind, body(srv)) == 777 and got.request["max_tokens"] == 777


# -- streaming ----------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", KINDS)
def test_a_64k_token_reply_streams_whole_with_its_usage(kind):
    """65536 tokens' worth of text in 8192 chunks: every byte arrives, in order, and the usage
    the stream ends with is counted."""
    text = "".join(f"tok{i % 10} " for i in range(65536))
    script = [{"text": text, "chunks": 8192, "usage": {"in": 900, "out": 65536}}]
    with ScriptedServer(kind, script) as srv:
        got = providers.ask(spec(kind, max_tokens=65536), "p", srv.base_url, 5)
    assert got.error is None and got.text == text
    assert (got.tokens_in, got.tokens_out, got.truncated) == (900, 65536, False)
    sent = body(srv)
    assert sent["stream"] is True
    if kind == "openai":
        assert sent["stream_options"] == {"include_usage": True}
    assert got.request["finish_reason"] == DONE[kind]


@pytest.mark.parametrize("kind", KINDS)
def test_reasoning_deltas_are_not_the_reply(kind):
    script = [{"text": "the answer", "reasoning": "SECRET-THOUGHT " * 40, "chunks": 4,
               "usage": {"in": 10, "out": 300, "reasoning": 250}}]
    with ScriptedServer(kind, script) as srv:
        got = providers.ask(spec(kind), "p", srv.base_url, 5)
    assert got.text == "the answer"
    assert got.request["reasoning_tokens"] == 250 and got.tokens_out == 300


@pytest.mark.parametrize("kind", KINDS)
def test_a_stall_between_chunks_longer_than_the_idle_limit_is_an_outage(kind):
    script = [{"text": "abcdefghij", "chunks": 10, "stall_s": 4}]
    with ScriptedServer(kind, script) as srv:
        start = time.monotonic()
        got = providers.ask(spec(kind), "p", srv.base_url, 1.0)
        took = time.monotonic() - start
    # the SDK's read timeout or the watchdog, whichever is first
    assert got.text is None and "next chunk" in got.error
    assert took < 3.5  # given up at the idle limit, not at the end of the stall
    assert len(srv.requests) == 1  # a stream that started is not asked again


@pytest.mark.parametrize("kind", KINDS)
def test_a_slow_but_steady_stream_passes_the_idle_limit(kind):
    """Six reasoning chunks, then six of the reply, 0.25 s apart: 1.5 s of reasoning before
    the first byte of the reply and three seconds in all, past the one-second idle limit,
    yet never a second without a chunk (reasoning is activity, though not the reply)."""
    script = [{"text": "abcdef", "reasoning": "hmmhmm", "chunks": 6, "gap_s": 0.25}]
    with ScriptedServer(kind, script) as srv:
        start = time.monotonic()
        got = providers.ask(spec(kind), "p", srv.base_url, 1.0)
        took = time.monotonic() - start
    assert got.error is None and got.text == "abcdef"
    assert took > 2.5 and got.request["seconds"] > 2.5


@pytest.mark.parametrize("kind", KINDS)
def test_a_stream_past_the_whole_request_cap_is_given_up(kind):
    script = [{"text": "abcdefghij", "chunks": 10, "gap_s": 0.25}]
    with ScriptedServer(kind, script) as srv:
        got = providers.ask(spec(kind), "p", srv.base_url, 1.0, whole_s=1.2)
    assert got.text is None and "the cap on a whole request" in got.error


@pytest.mark.parametrize("kind", KINDS)
def test_a_stream_of_keep_alives_alone_ends_at_the_idle_limit(kind):
    """A gateway that sends SSE comments every 0.2 s while nothing else comes: the bytes keep
    the SDK's read timeout from firing; the watchdog ends it at the idle limit."""
    script = [{"text": "never", "keepalive_s": 0.2}]
    with ScriptedServer(kind, script) as srv:
        start = time.monotonic()
        # (the whole-request cap, far above the idle limit, bounds the test were it to fail)
        got = providers.ask(spec(kind), "p", srv.base_url, 1.0, whole_s=20.0)
        took = time.monotonic() - start
    assert got.text is None and "keep-alives do not count" in got.error, got.error
    assert took < 10
    assert len(srv.requests) == 1


@pytest.mark.parametrize("kind", KINDS)
def test_keep_alives_before_a_reply_within_the_cap_are_waited_through(kind):
    """Keep-alives for a while (shorter than the idle limit), then the reply: it is read."""
    script = [{"text": "the answer", "keepalive_s": 0.1, "keepalive_for_s": 0.5}]
    with ScriptedServer(kind, script) as srv:
        got = providers.ask(spec(kind), "p", srv.base_url, 2.0)
    assert got.error is None and got.text == "the answer"


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("fault", ["cut", "unstreamed"])
def test_a_stream_without_a_finish_reason_is_an_outage_not_the_models_reply(kind, fault):
    """A stream a proxy cut (the text came, the finish never did), or a server that ignored
    `stream: true`: the provider's fault, never kept or judged as the model's answer."""
    script = [{"text": "half of a sol", "chunks": 3, fault: True}]
    with ScriptedServer(kind, script) as srv:
        got = providers.ask(spec(kind), "p", srv.base_url, 5.0)
    assert got.text is None and got.error, got
    if fault == "cut":
        assert "without a finish reason" in got.error, got.error


@pytest.mark.parametrize("kind", KINDS)
def test_a_reply_longer_than_any_solution_is_not_held_whole(kind):
    """5 MB of reply: reading stops one character past what a solution may have, and that
    text goes on (the over-long reply is the model's own failure)."""
    from pytest_commbench.regions import MAX_REPLY_CHARS

    text = "x" * (5 * MAX_REPLY_CHARS)
    script = [{"text": text, "chunks": 500}]
    with ScriptedServer(kind, script) as srv:
        got = providers.ask(spec(kind), "p", srv.base_url, 10.0)
    assert got.error is None
    assert MAX_REPLY_CHARS < len(got.text) <= MAX_REPLY_CHARS + len(text) // 500


# -- retries, outages, the limit ------------------------------------------------------------------

@pytest.mark.parametrize("kind", KINDS)
def test_a_rate_limit_then_a_success_gives_the_success(kind):
    script = [{"status": 429}, {"text": "after the limit", "chunks": 3,
                                "usage": {"in": 5, "out": 6}}]
    with ScriptedServer(kind, script) as srv:
        got = providers.ask(spec(kind), "p", srv.base_url, 5)
    assert (got.text, got.error, got.tokens_in, got.tokens_out) == ("after the limit", None, 5, 6)
    assert len(srv.requests) == 2


@pytest.mark.parametrize("kind", KINDS)
def test_server_errors_past_the_retries_are_an_outage_with_the_providers_message(kind):
    headers = {"retry-after-ms": "1"}
    with ScriptedServer(kind, [{"status": 503, "headers": headers}]) as srv:
        got = providers.ask(spec(kind), "p", srv.base_url, 5, retries=2)
    assert got.text is None and "Scripted error 503" in got.error
    assert len(srv.requests) == 3  # the first try and two retries


@pytest.mark.parametrize("kind", KINDS)
def test_a_reply_cut_at_the_limit_is_truncated(kind):
    with ScriptedServer(kind, [{"text": "def f(:", "finish": CUT[kind]},
                               {"text": "def f(): pass"}]) as srv:
        cut = providers.ask(spec(kind), "p", srv.base_url, 5)
        whole = providers.ask(spec(kind), "p", srv.base_url, 5)
    assert cut.truncated and cut.text == "def f(:" and cut.request["finish_reason"] == CUT[kind]
    assert not whole.truncated and whole.request["finish_reason"] == DONE[kind]


@pytest.mark.parametrize("kind", KINDS)
def test_every_request_says_where_it_went_what_it_asked_and_what_it_used(kind):
    model = spec(kind, reasoning_effort="medium" if kind == "openai" else None,
                 thinking="adaptive" if kind == "anthropic" else None, max_tokens=4096)
    script = [{"text": "x", "usage": {"in": 11, "out": 22}}]
    with ScriptedServer(kind, script) as srv:
        got = providers.ask(model, "p", srv.base_url, 5, temperature=0.5)
    req = got.request
    assert req["endpoint"].rstrip("/") == srv.base_url and req["model"] == "coder"
    assert req["provider"] == kind and req["stream"] is True and req["max_tokens"] == 4096
    assert (req["tokens_in"], req["tokens_out"], req["finish_reason"]) == (11, 22, DONE[kind])
    assert req["seconds"] >= 0 and req["served_model"] == "coder"
    if kind == "openai":
        assert req["reasoning_effort"] == "medium" and req["temperature"] == 0.5
        assert body(srv)["reasoning_effort"] == "medium" and body(srv)["temperature"] == 0.5
    else:  # adaptive thinking goes without a temperature
        assert req["thinking"] == "adaptive" and req["temperature"] is None
        assert body(srv)["thinking"] == {"type": "adaptive"} and "temperature" not in body(srv)


def test_without_a_key_nothing_is_sent_and_the_request_is_still_described(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY")
    with ScriptedServer("openai", [{"text": "x"}]) as srv:
        got = providers.ask(spec("openai"), "p", srv.base_url, 5)
    assert "OPENAI_API_KEY" in got.error and srv.all_requests == []
    assert got.request["model"] == "coder" and got.request["endpoint"] == srv.base_url
