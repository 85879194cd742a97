"""The model registry: aliases to providers, model ids, key variables and settings.

The package ships `registry.toml`; a user file (ini `commbench_models_file`, environment
COMMBENCH_MODELS_FILE) adds entries or replaces fields of shipped ones. Besides aliases,
`openai:<model-id>` and `anthropic:<model-id>` name any model of a compatible server (a
local vLLM or llama.cpp server, a gateway), with `--commbench-base-url` for its endpoint."""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

SHIPPED = Path(__file__).with_name("registry.toml")
PROVIDERS = ("openai", "anthropic")
KEY_ENV = {"openai": "OPENAI_API_KEY", "anthropic": "ANTHROPIC_API_KEY"}
# the most output tokens a models file may ask one request for (the largest any provider
# serves is far below)
MAX_OUTPUT_TOKENS = 1 << 20
FIELDS = {"provider": str, "model": str, "key_env": str, "base_url": str,
          "reasoning_effort": str, "thinking": str, "max_tokens": int, "temperature": float,
          "price_in": float, "price_out": float, "price_ref": str, "open_weights": bool,
          "paper_price": float, "extra_body": dict}


class RegistryError(ValueError):
    """A registry file or entry that cannot be used (the message names file and key)."""


@dataclass(frozen=True)
class ModelSpec:
    alias: str
    provider: str
    model: str
    key_env: str
    base_url: str | None = None
    reasoning_effort: str | None = None
    thinking: str | None = None
    max_tokens: int = 32768
    temperature: float | None = None
    price_in: float | None = None
    price_out: float | None = None
    # genai-prices' "provider:model" for this model (prices.py); absent: found from the
    # endpoint and the model id
    price_ref: str | None = None
    open_weights: bool | None = None
    paper_price: float | None = None
    extra_body: dict[str, Any] = field(default_factory=dict)

    def cost(self, tokens_in: int, tokens_out: int) -> float | None:
        """US dollars for these tokens at the models file's prices (price_in, price_out),
        None where it sets none; `prices.cost` adds genai-prices' as the default."""
        if self.price_in is None or self.price_out is None:
            return None
        return (tokens_in * self.price_in + tokens_out * self.price_out) / 1e6


def _entries(path: Path) -> dict[str, dict[str, Any]]:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise RegistryError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    except tomllib.TOMLDecodeError as exc:
        raise RegistryError(f"{path}: not valid TOML ({exc})") from None
    unknown = sorted(set(data) - {"models"})
    if unknown:  # a misspelt [model.kimi] would be ignored without a word
        raise RegistryError(f"{path}: unknown table or key {unknown[0]!r} (a models file has "
                            "[models.ALIAS] tables only)")
    models = data.get("models", {})
    if not isinstance(models, dict):
        raise RegistryError(f"{path}: 'models' must be a table of tables")
    out = {}
    for alias, entry in models.items():
        if not isinstance(entry, dict):
            raise RegistryError(f"{path}: models.{alias} must be a table")
        for key, value in entry.items():
            want = FIELDS.get(key)
            if want is None:
                raise RegistryError(f"{path}: models.{alias}.{key}: unknown key "
                                    f"(known: {', '.join(FIELDS)})")
            ok = isinstance(value, want) or (want is float and isinstance(value, int)
                                             and not isinstance(value, bool))
            if not ok or (want is int and isinstance(value, bool)):
                raise RegistryError(f"{path}: models.{alias}.{key}: expected {want.__name__}, "
                                    f"got {value!r}")
        out[alias] = entry
    return out


def load(user_file: Path | None = None) -> dict[str, ModelSpec]:
    """Every alias: the shipped registry, overlaid with the user's file field by field."""
    merged = _entries(SHIPPED)
    where = {alias: SHIPPED for alias in merged}
    if user_file is not None:
        for alias, entry in _entries(user_file).items():
            merged[alias] = {**merged.get(alias, {}), **entry}
            where[alias] = user_file
    specs = {}
    for alias, entry in merged.items():
        specs[alias] = _spec(alias, entry, where[alias])
    return specs


def _spec(alias: str, entry: dict[str, Any], path: Path) -> ModelSpec:
    for key in ("provider", "model"):
        if key not in entry:
            raise RegistryError(f"{path}: models.{alias}: '{key}' is missing")
    if entry["provider"] not in PROVIDERS:
        raise RegistryError(f"{path}: models.{alias}.provider: {entry['provider']!r} is not one "
                            f"of {', '.join(PROVIDERS)}")
    values = {k: v for k, v in entry.items() if k in FIELDS}
    values.setdefault("key_env", KEY_ENV[entry["provider"]])
    if ("price_in" in values) != ("price_out" in values):  # half a price is no price
        raise RegistryError(f"{path}: models.{alias}: set both price_in and price_out "
                            "(US dollars per million tokens), or neither")
    ref = values.get("price_ref")
    if ref is not None and not all(part.strip() for part in ref.partition(":")[::2]):
        raise RegistryError(f"{path}: models.{alias}.price_ref: expected "
                            f"\"PROVIDER:MODEL\" of genai-prices, got {ref!r}")
    for key in ("temperature", "price_in", "price_out", "paper_price"):
        if key in values:
            values[key] = float(values[key])
            if not math.isfinite(values[key]) or values[key] < 0:
                raise RegistryError(f"{path}: models.{alias}.{key}: must be a finite number "
                                    f">= 0, got {values[key]}")
    if "max_tokens" in values and not 1 <= values["max_tokens"] <= MAX_OUTPUT_TOKENS:
        raise RegistryError(f"{path}: models.{alias}.max_tokens: must be 1 to "
                            f"{MAX_OUTPUT_TOKENS}, got {values['max_tokens']}")
    return ModelSpec(alias=alias, **values)


def resolve(name: str, user_file: Path | None = None) -> ModelSpec | None:
    """The spec of `--commbench-model=name`; None when the name is no registry model."""
    provider, sep, model_id = name.partition(":")
    if sep and provider in PROVIDERS:
        if not model_id.strip():
            raise RegistryError(f"{name!r}: {provider}: needs a model id, as {provider}:MODEL")
        return ModelSpec(alias=name, provider=provider, model=model_id.strip(),
                         key_env=KEY_ENV[provider])
    return load(user_file).get(name)


def names(user_file: Path | None = None) -> list[str]:
    return [*load(user_file), "openai:MODEL", "anthropic:MODEL"]
