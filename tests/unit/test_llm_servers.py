"""The scripted LLM servers of llm_servers.py against the real OpenAI and Anthropic SDKs."""

from __future__ import annotations

import time

import pytest
from llm_servers import ScriptedServer

MESSAGES = [{"role": "user", "content": "Say hi"}]


class OpenAIChat:
    kind = "openai"

    def __init__(self, srv: ScriptedServer, **options) -> None:
        self.sdk = pytest.importorskip("openai")
        self.client = self.sdk.OpenAI(api_key="test", base_url=srv.base_url, **options)

    def ask(self) -> tuple[str, int, int]:
        r = self.client.chat.completions.create(model="gpt-test", messages=MESSAGES)
        assert r.object == "chat.completion" and r.model == "gpt-test"
        assert r.choices[0].finish_reason == "stop" and r.choices[0].message.role == "assistant"
        assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
        return r.choices[0].message.content, r.usage.prompt_tokens, r.usage.completion_tokens

    @staticmethod
    def has_key(headers: dict) -> bool:
        return headers.get("authorization") == "Bearer test"


class AnthropicMessages:
    kind = "anthropic"

    def __init__(self, srv: ScriptedServer, **options) -> None:
        self.sdk = pytest.importorskip("anthropic")
        self.client = self.sdk.Anthropic(api_key="test", base_url=srv.base_url, **options)

    def ask(self) -> tuple[str, int, int]:
        r = self.client.messages.create(model="claude-test", max_tokens=64, messages=MESSAGES)
        assert r.type == "message" and r.role == "assistant" and r.model == "claude-test"
        assert r.stop_reason == "end_turn" and r.stop_sequence is None
        return r.content[0].text, r.usage.input_tokens, r.usage.output_tokens

    @staticmethod
    def has_key(headers: dict) -> bool:
        # anthropic 2.x sends api_key as `Authorization: Bearer`; older releases as x-api-key
        return headers.get("x-api-key") == "test" or headers.get("authorization") == "Bearer test"


@pytest.fixture(params=[OpenAIChat, AnthropicMessages], ids=["openai", "anthropic"])
def sdk(request):
    return request.param


def test_plain_reply(sdk):
    script = [{"text": "hello there", "usage": {"in": 7, "out": 3}}]
    with ScriptedServer(sdk.kind, script) as srv:
        assert sdk(srv, max_retries=0, timeout=5).ask() == ("hello there", 7, 3)
    [req] = srv.requests
    assert req["path"] == ("/v1/chat/completions" if sdk.kind == "openai" else "/v1/messages")
    assert req["body"]["model"] in ("gpt-test", "claude-test")
    assert req["body"]["messages"] == MESSAGES
    assert sdk.has_key(req["headers"])
    if sdk.kind == "anthropic":
        assert req["headers"]["anthropic-version"]


def test_default_usage_and_last_step_repeats(sdk):
    with ScriptedServer(sdk.kind, [{"text": "one"}, {"text": "two"}]) as srv:
        client = sdk(srv, max_retries=0, timeout=5)
        assert [client.ask() for _ in range(3)] == [("one", 100, 200), ("two", 100, 200)] + [
            ("two", 100, 200)]
    assert len(srv.requests) == 3


def test_rate_limit_then_success_is_retried_quickly(sdk):
    with ScriptedServer(sdk.kind, [{"status": 429}, {"text": "after the limit"}]) as srv:
        start = time.monotonic()
        assert sdk(srv, max_retries=1, timeout=5).ask()[0] == "after the limit"
        assert time.monotonic() - start < 0.3  # retry-after-ms beats the SDKs' 0.375 s back-off
    assert len(srv.requests) == 2
    assert srv.requests[1]["headers"]["x-stainless-retry-count"] == "1"


def test_server_error_forever_raises_after_all_retries(sdk):
    with ScriptedServer(sdk.kind, [{"status": 500}]) as srv:
        client = sdk(srv, max_retries=2, timeout=5)
        with pytest.raises(client.sdk.InternalServerError) as err:
            client.ask()
    assert err.value.status_code == 500
    assert len(srv.requests) == 3


def test_client_timeout_leaves_the_server_serving(sdk):
    with ScriptedServer(sdk.kind, [{"delay_s": 3, "text": "too late"}, {"text": "on time"}]) as srv:
        client = sdk(srv, max_retries=0, timeout=0.3)
        start = time.monotonic()
        with pytest.raises(client.sdk.APITimeoutError):
            client.ask()
        assert time.monotonic() - start < 2
        assert client.ask()[0] == "on time"
    assert len(srv.requests) == 2


def test_unknown_path_is_a_404_in_the_provider_shape(sdk):
    with ScriptedServer(sdk.kind, [{"text": "unused"}]) as srv:
        client = sdk(srv, max_retries=0, timeout=5)
        with pytest.raises(client.sdk.NotFoundError) as err:
            client.client.models.list()
    body = err.value.body
    if sdk.kind == "openai":  # the SDK keeps only the "error" member
        assert body["type"] == "invalid_request_error" and body["message"]
    else:
        assert body["type"] == "error" and body["error"]["type"] == "not_found_error"
    assert srv.requests == [] and srv.all_requests[0]["path"].startswith("/v1/models")


def test_streams_arrive_as_the_sdks_parse_them(sdk):
    """`stream: true`: as many content deltas as the step's chunks, reasoning (or thinking)
    deltas apart from them, then the finish reason and the usage."""
    script = [{"text": "one two three four", "chunks": 4, "reasoning": "mulling",
               "usage": {"in": 9, "out": 12, "reasoning": 5}}]
    with ScriptedServer(sdk.kind, script) as srv:
        client = sdk(srv, max_retries=0, timeout=5).client
        if sdk.kind == "openai":
            chunks = list(client.chat.completions.create(
                model="gpt-test", messages=MESSAGES, stream=True,
                stream_options={"include_usage": True}))
            pieces = [c.choices[0].delta.content for c in chunks
                      if c.choices and c.choices[0].delta.content]
            thought = "".join(c.choices[0].delta.model_extra.get("reasoning_content") or ""
                              for c in chunks if c.choices)
            finish = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
            usage = chunks[-1].usage
            assert chunks[-1].choices == [] and chunks[0].usage is None
            assert (usage.prompt_tokens, usage.completion_tokens) == (9, 12)
            assert usage.completion_tokens_details.reasoning_tokens == 5
        else:
            with client.messages.stream(model="claude-test", max_tokens=64,
                                        messages=MESSAGES) as stream:
                pieces = list(stream.text_stream)
                final = stream.get_final_message()
            thought = "".join(b.thinking for b in final.content if b.type == "thinking")
            finish = final.stop_reason
            assert (final.usage.input_tokens, final.usage.output_tokens) == (9, 12)
            assert final.usage.output_tokens_details.thinking_tokens == 5
    assert "".join(pieces) == "one two three four" and len(pieces) == 4
    assert thought == "mulling"
    assert finish == ("stop" if sdk.kind == "openai" else "end_turn")
    assert srv.requests[0]["body"]["stream"] is True


def test_a_step_names_its_finish_reason(sdk):
    finish = "length" if sdk.kind == "openai" else "max_tokens"
    with ScriptedServer(sdk.kind, [{"text": "cut", "finish": finish}]) as srv:
        client = sdk(srv, max_retries=0, timeout=5).client
        if sdk.kind == "openai":
            r = client.chat.completions.create(model="gpt-test", messages=MESSAGES)
            assert r.choices[0].finish_reason == "length"
        else:
            r = client.messages.create(model="claude-test", max_tokens=64, messages=MESSAGES)
            assert r.stop_reason == "max_tokens"


def test_a_stream_paces_its_chunks():
    """gap_s before every chunk, stall_s once half-way: what the idle limit is tested with."""
    openai = pytest.importorskip("openai")
    script = [{"text": "abcd", "chunks": 4, "gap_s": 0.1, "stall_s": 0.5}]
    with ScriptedServer("openai", script) as srv:
        client = openai.OpenAI(api_key="test", base_url=srv.base_url, max_retries=0, timeout=5)
        arrivals = []
        start = time.monotonic()
        for chunk in client.chat.completions.create(model="m", messages=MESSAGES, stream=True):
            if chunk.choices and chunk.choices[0].delta.content:
                arrivals.append(time.monotonic() - start)
    gaps = [b - a for a, b in zip(arrivals, arrivals[1:])]
    assert len(arrivals) == 4 and max(gaps) >= 0.5 and sorted(gaps)[0] >= 0.08


def test_the_model_list_says_each_models_context_as_vllm_does():
    openai = pytest.importorskip("openai")
    with ScriptedServer("openai", [{}], models={"coder": 32768, "small": 4096}) as srv:
        client = openai.OpenAI(api_key="test", base_url=srv.base_url, max_retries=0, timeout=5)
        listed = {m.id: m.max_model_len for m in client.models.list().data}
        one = client.models.retrieve("small")
        with pytest.raises(openai.NotFoundError):
            client.models.retrieve("absent")
    assert listed == {"coder": 32768, "small": 4096} and one.max_model_len == 4096
    assert srv.requests == [] and len(srv.all_requests) == 3  # lists: not the endpoint's
