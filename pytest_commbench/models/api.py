"""Models asked over their providers' APIs (the registry's aliases, `openai:ID`,
`anthropic:ID`): one request per prompt, priced by genai-prices. Their conversations (kept
replies, replay, refinement rounds, agent steps) are the harness's: models.conversation."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from . import prices
from .base import Reply
from .conversation import AskableModel
from .providers import ask
from .registry import ModelSpec


class ApiModel(AskableModel):
    def __init__(self, spec: ModelSpec, config) -> None:
        super().__init__(config)
        self.spec = spec
        self.name = spec.alias

    def card(self) -> dict[str, Any]:
        return asdict(self.spec)

    def answer(self, prompt: str) -> Reply:
        place = self.place()
        temperature = place.get("temperature")
        if temperature is None and int(place.get("samples") or 1) > 1:
            temperature = self.spec.temperature  # independent samples: the registry's
        got = ask(self.spec, prompt, place.get("base_url"), float(place.get("timeout_s") or 600),
                  temperature=temperature, max_tokens=place.get("max_tokens"))
        request = dict(got.request)
        if got.error:
            return Reply(None, infra_error=got.error, request=request)
        cost, source = prices.cost(self.spec, got.tokens_in, got.tokens_out,
                                   place.get("base_url"))
        request.update(cost=cost, price=source)
        return Reply(got.text, got.tokens_in, got.tokens_out, cost or 0.0,
                     truncated=got.truncated, request=request)


def _user_file(config) -> Path | None:
    from ..option_sources import setting

    value = setting(config, "models_file")
    if not value:
        return None
    path = Path(value).expanduser()
    return path if path.is_absolute() else config.invocation_params.dir / path


def make_api_model(config, name: str) -> ApiModel | None:
    """The registry's model called `name` (None: not a registry name). A broken registry
    file or a bad `openai:` name is a ValueError (a usage error naming it)."""
    from ..option_sources import lookup, setting
    from .registry import resolve

    spec = resolve(name, _user_file(config))
    if spec is None:
        return None
    budget, given = lookup(config, "budget_usd")
    base_url = setting(config, "base_url")
    if budget is not None and not prices.price_known(spec, base_url):
        # a budget of unknown spend would never stop a round: refused before any item runs
        raise ValueError(
            f"{given} ({budget:g} US dollars) needs the price of model {name}, which is not "
            f"known: genai-prices {prices.version()} lists no "
            + (f"{spec.price_ref!r}" if spec.price_ref else
               f"{spec.model!r} at {prices.endpoint(spec, base_url)}")
            + "; set price_in and price_out (US dollars per million tokens), or a "
            "genai-prices price_ref, for it in a models file (--commbench-models-file)")

    return ApiModel(spec, config)


def api_model_names(config) -> list[str]:
    from .registry import RegistryError, names

    try:
        return names(_user_file(config))
    except RegistryError:
        return ["openai:MODEL", "anthropic:MODEL"]
