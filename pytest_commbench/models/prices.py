"""What a model's tokens cost, in US dollars.

The default for every model is genai-prices (pydantic's maintained price list of model APIs,
a pinned dependency whose data is bundled with the package: it is read offline, no request is
made). A registry entry names its genai-prices entry (`price_ref = "PROVIDER:MODEL"`); without
one the entry is found from the endpoint (genai-prices knows providers by their API's URL) and
the model id, so a local server has no price. A user's models file setting `price_in` and
`price_out` (US dollars per million tokens) overrides genai-prices.

Every cost says where it came from: {"source": "genai-prices", "version", "data_date",
"provider", "model"} or {"source": "models file", ...}. genai-prices ships no date for its
data: its version pins the data, and of the dated price changes it holds it gives the ones in
force on the request's date, which `data_date` records."""

from __future__ import annotations

import os
from datetime import datetime, timezone
from typing import Any

from .registry import ModelSpec

GENAI_PRICES = "genai-prices"
MODELS_FILE = "models file"
# where the SDKs send requests when no endpoint is named (their environment variables first)
SDK_DEFAULTS = {"openai": ("OPENAI_BASE_URL", "https://api.openai.com/v1"),
                "anthropic": ("ANTHROPIC_BASE_URL", "https://api.anthropic.com")}


def version() -> str:
    """genai-prices' version: its data's too (the data is bundled with each release)."""
    from genai_prices import __version__

    return __version__


def _lookup(model_ref: str, provider_id: str | None = None, url: str | None = None,
            tokens_in: int = 0, tokens_out: int = 0, when: datetime | None = None):
    """genai-prices' calculation for these tokens, None where it lists no such model."""
    from genai_prices import Usage, calc_price

    kwargs: dict[str, Any] = ({"provider_id": provider_id} if provider_id is not None
                              else {"provider_api_url": url})
    try:
        return calc_price(Usage(input_tokens=tokens_in, output_tokens=tokens_out), model_ref,
                          genai_request_timestamp=when or datetime.now(timezone.utc), **kwargs)
    except (LookupError, ValueError):  # no such provider or model
        return None


def genai_cost(provider_id: str, model_ref: str, tokens_in: int, tokens_out: int,
               when: datetime | None = None) -> float | None:
    """US dollars for `tokens_in` and `tokens_out` of genai-prices' (provider, model) at the
    prices in force at `when` (default: now); None where genai-prices does not list it."""
    got = _lookup(model_ref, provider_id, tokens_in=tokens_in, tokens_out=tokens_out,
                  when=when)
    return None if got is None else float(got.total_price)


def endpoint(spec: ModelSpec, base_url: str | None = None) -> str:
    """The URL a request for `spec` goes to: --commbench-base-url, the registry's, else the
    SDK's default."""
    var, default = SDK_DEFAULTS[spec.provider]
    return base_url or spec.base_url or os.environ.get(var) or default


def reference(spec: ModelSpec, base_url: str | None = None) -> tuple[str, str] | None:
    """genai-prices' (provider id, model id) of a model: its `price_ref`, else the provider
    whose API the endpoint is and the model id; None where genai-prices lists neither."""
    if spec.price_ref:
        provider, _, model = spec.price_ref.partition(":")
        got = _lookup(model.strip(), provider.strip())
    else:
        got = _lookup(spec.model, url=endpoint(spec, base_url))
    return None if got is None else (got.provider.id, got.model.id)


def _from_file(spec: ModelSpec) -> bool:
    return spec.price_in is not None and spec.price_out is not None


def price_known(spec: ModelSpec, base_url: str | None = None) -> bool:
    """Whether a request's cost can be told (a budget needs it)."""
    return _from_file(spec) or reference(spec, base_url) is not None


def cost(spec: ModelSpec, tokens_in: int, tokens_out: int, base_url: str | None = None,
         when: datetime | None = None) -> tuple[float | None, dict[str, Any] | None]:
    """(US dollars, price source) of one request's tokens; (None, None) where no price is
    known. The models file's prices win over genai-prices'."""
    if _from_file(spec):
        return spec.cost(tokens_in, tokens_out), {
            "source": MODELS_FILE, "price_in": spec.price_in, "price_out": spec.price_out}
    ref = reference(spec, base_url)
    if ref is None:
        return None, None
    when = when or datetime.now(timezone.utc)
    dollars = genai_cost(ref[0], ref[1], tokens_in, tokens_out, when)
    if dollars is None:
        return None, None
    return dollars, {"source": GENAI_PRICES, "version": version(),
                     "data_date": when.date().isoformat(), "provider": ref[0], "model": ref[1]}


def per_million(spec: ModelSpec, base_url: str | None = None,
                when: datetime | None = None) -> tuple[float, float] | None:
    """US dollars per million input and output tokens (a request of a thousand of each, so
    long-context tiers do not show), for listings; None where unknown."""
    if _from_file(spec):
        return spec.price_in, spec.price_out
    ref = reference(spec, base_url)
    if ref is None:
        return None
    dollars_in = genai_cost(*ref, 1000, 0, when)
    dollars_out = genai_cost(*ref, 0, 1000, when)
    if dollars_in is None or dollars_out is None:
        return None
    return dollars_in * 1000, dollars_out * 1000
