"""Asking a model: the official SDKs (`openai`, `anthropic`; optional extras), one request per
generation, with the SDKs' own retries and back-off on 429 and 5xx, a timeout per request,
and every failure turned into an outage message (the item's `infra_error`), never an
exception out of the session."""

from __future__ import annotations

import os
from dataclasses import dataclass

from .registry import ModelSpec

SYSTEM = ("You are an expert in GPU communication (MPI, NCCL, NVSHMEM, CUDA). You complete "
          "benchmark tasks by editing only the marked regions of the file you are given.")


@dataclass
class Generation:
    text: str | None
    tokens_in: int = 0
    tokens_out: int = 0
    error: str | None = None  # the model could not be asked (no key, SDK missing, outage)


def ask(spec: ModelSpec, prompt: str, base_url: str | None, timeout_s: float,
        retries: int = 3, temperature: float | None = None) -> Generation:
    key = os.environ.get(spec.key_env, "")
    if not key:
        return Generation(None, error=f"no API key: set {spec.key_env} for {spec.alias}")
    url = base_url or spec.base_url
    try:
        if spec.provider == "anthropic":
            return _anthropic(spec, prompt, key, url, timeout_s, retries, temperature)
        return _openai(spec, prompt, key, url, timeout_s, retries, temperature)
    except ImportError as exc:
        extra = "anthropic" if spec.provider == "anthropic" else "openai"
        return Generation(None, error=f"the {extra} SDK is not installed "
                                      f"(pip install 'pytest-commbench[{extra}]'): {exc}")
    except Exception as exc:  # noqa: BLE001 - whatever the SDK raises is an outage
        return Generation(None, error=f"{type(exc).__name__}: {str(exc)[:500]}")


def _openai(spec, prompt, key, url, timeout_s, retries, temperature) -> Generation:
    import openai

    client = openai.OpenAI(api_key=key, base_url=url, timeout=timeout_s, max_retries=retries)
    args = {"model": spec.model, "max_completion_tokens": spec.max_tokens,
            "messages": [{"role": "system", "content": SYSTEM},
                         {"role": "user", "content": prompt}]}
    if spec.reasoning_effort:
        args["reasoning_effort"] = spec.reasoning_effort
    if temperature is not None:
        args["temperature"] = temperature
    if spec.extra_body:
        args["extra_body"] = dict(spec.extra_body)
    with client:
        done = client.chat.completions.create(**args)
    text = done.choices[0].message.content if done.choices else None
    usage = done.usage
    return Generation(text, getattr(usage, "prompt_tokens", 0) or 0,
                      getattr(usage, "completion_tokens", 0) or 0)


def _anthropic(spec, prompt, key, url, timeout_s, retries, temperature) -> Generation:
    import anthropic

    client = anthropic.Anthropic(api_key=key, base_url=url, timeout=timeout_s,
                                 max_retries=retries)
    args = {"model": spec.model, "max_tokens": spec.max_tokens, "system": SYSTEM,
            "messages": [{"role": "user", "content": prompt}]}
    if spec.thinking == "adaptive":
        args["thinking"] = {"type": "adaptive"}
    elif temperature is not None:  # thinking and a temperature do not go together
        args["temperature"] = temperature
    if spec.extra_body:
        args["extra_body"] = dict(spec.extra_body)
    with client:
        done = client.messages.create(**args)
    text = "".join(block.text for block in done.content if getattr(block, "type", "") == "text")
    usage = done.usage
    return Generation(text or None, getattr(usage, "input_tokens", 0) or 0,
                      getattr(usage, "output_tokens", 0) or 0)
