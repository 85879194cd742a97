"""Prices: genai-prices' bundled data by default, a models file's price_in/price_out over it."""

from __future__ import annotations

from datetime import datetime, timezone
from decimal import Decimal

import pytest

from pytest_commbench.models import prices
from pytest_commbench.models.registry import RegistryError, load, resolve

WHEN = datetime(2026, 11, 1, tzinfo=timezone.utc)  # prices as genai-prices had them then
TOKENS_IN, TOKENS_OUT = 123_456, 7_890


def listed_per_million(provider: str, model: str) -> tuple[Decimal, Decimal]:
    """The per-million prices as genai-prices' data file writes them (not through its
    calculation, which `prices` uses)."""
    from genai_prices.data import providers

    (entry,) = [m for p in providers if p.id == provider for m in p.models if m.id == model]
    assert not isinstance(entry.prices, list), "a dated price: the stated numbers need a date"
    return entry.prices.input_mtok, entry.prices.output_mtok


def test_kimi_and_claude_opus_cost_what_genai_prices_lists():
    """genai-prices 0.2.3 lists Kimi K2.6 (moonshotai) at $0.95 in / $4.00 out per million
    tokens and Claude Opus 4.7 (anthropic) at $5 / $25. For 123,456 tokens in and 7,890 out:
    Kimi 123456 * 0.95e-6 + 7890 * 4e-6 = 0.1172832 + 0.03156 = $0.1488432, Claude
    123456 * 5e-6 + 7890 * 25e-6 = 0.61728 + 0.19725 = $0.81453."""
    assert listed_per_million("moonshotai", "kimi-k2.6") == (Decimal("0.95"), Decimal("4"))
    assert listed_per_million("anthropic", "claude-opus-4-7") == (Decimal("5"), Decimal("25"))
    specs = load()
    kimi, kimi_source = prices.cost(specs["kimi"], TOKENS_IN, TOKENS_OUT, when=WHEN)
    opus, opus_source = prices.cost(specs["claude-opus-4.7"], TOKENS_IN, TOKENS_OUT, when=WHEN)
    assert kimi == pytest.approx(0.1488432, abs=1e-12)
    assert opus == pytest.approx(0.81453, abs=1e-12)
    assert kimi_source == {"source": "genai-prices", "version": "0.2.3",
                           "data_date": "2026-11-01", "provider": "moonshotai",
                           "model": "kimi-k2.6"}
    assert opus_source["provider"] == "anthropic" and opus_source["model"] == "claude-opus-4-7"
    assert prices.genai_cost("moonshotai", "kimi-k2.6", TOKENS_IN, TOKENS_OUT, WHEN) == kimi


def test_the_version_is_genai_prices_own():
    import genai_prices

    assert prices.version() == genai_prices.__version__ == "0.2.3"  # the pyproject's pin


def test_the_papers_seven_models_are_matched_to_genai_prices_where_it_lists_them():
    """Six have their provider's own entry; Qwen3.7-Max (Alibaba Cloud's DashScope) has none
    (only resellers' entries), so its cost is unknown."""
    specs = load()
    matched = {alias: prices.reference(specs[alias]) for alias in (
        "gpt-5.5", "gemini-3.1-pro", "claude-opus-4.7", "glm-5.1", "kimi", "deepseek-v4-pro",
        "qwen-3.7-max")}
    assert matched == {
        "gpt-5.5": ("openai", "gpt-5.5"),
        "gemini-3.1-pro": ("google", "gemini-3.1-pro-preview"),
        "claude-opus-4.7": ("anthropic", "claude-opus-4-7"),
        "glm-5.1": ("zai", "GLM-5.1"),
        "kimi": ("moonshotai", "kimi-k2.6"),
        "deepseek-v4-pro": ("deepseek", "deepseek-v4-pro"),
        "qwen-3.7-max": None,
    }
    assert prices.cost(specs["qwen-3.7-max"], 1000, 1000, when=WHEN) == (None, None)
    assert not prices.price_known(specs["qwen-3.7-max"])


def test_without_a_price_ref_the_endpoint_and_model_id_find_the_entry():
    """The SDK's default endpoint is OpenAI's own; a local server has no price."""
    assert prices.reference(resolve("openai:gpt-5.5")) == ("openai", "gpt-5.5")
    assert prices.reference(resolve("anthropic:claude-opus-4-7")) == ("anthropic",
                                                                      "claude-opus-4-7")
    local = resolve("openai:gpt-5.5")
    assert prices.reference(local, "http://127.0.0.1:8000/v1") is None
    assert not prices.price_known(resolve("openai:coder"), "http://127.0.0.1:8000/v1")
    assert prices.price_known(resolve("anthropic:claude-opus-4-7"))


def test_a_models_file_overrides_genai_prices(tmp_path):
    user = tmp_path / "models.toml"
    user.write_text('[models.kimi]\nprice_in = 0.6\nprice_out = 2.5\n')
    kimi = load(user)["kimi"]
    dollars, source = prices.cost(kimi, 1_000_000, 2_000_000, when=WHEN)
    assert dollars == pytest.approx(0.6 + 5.0)  # not genai-prices' 0.95 + 8.0
    assert source == {"source": "models file", "price_in": 0.6, "price_out": 2.5}
    assert prices.per_million(kimi) == (0.6, 2.5)
    assert prices.per_million(load()["kimi"], when=WHEN) == pytest.approx((0.95, 4.0))


def test_a_models_file_may_name_a_genai_prices_entry(tmp_path):
    user = tmp_path / "models.toml"
    user.write_text('[models."qwen-3.7-max"]\nprice_ref = "openrouter:qwen/qwen3.7-max"\n')
    qwen = load(user)["qwen-3.7-max"]
    assert prices.reference(qwen) == ("openrouter", "qwen/qwen3.7-max")
    dollars, source = prices.cost(qwen, 1000, 1000, when=WHEN)
    assert dollars is not None and dollars > 0 and source["provider"] == "openrouter"


@pytest.mark.parametrize("text, needle", [
    ('[models.kimi]\nprice_in = 0.6\n', "set both price_in and price_out"),
    ('[models.kimi]\nprice_ref = "kimi-k2.6"\n', "price_ref: expected"),
])
def test_half_a_price_or_a_bad_reference_is_a_registry_error(tmp_path, text, needle):
    user = tmp_path / "models.toml"
    user.write_text(text)
    with pytest.raises(RegistryError, match=needle):
        load(user)


def test_an_unknown_reference_has_no_price(tmp_path):
    user = tmp_path / "models.toml"
    user.write_text('[models.kimi]\nprice_ref = "moonshotai:kimi-k99"\n')
    kimi = load(user)["kimi"]
    assert prices.reference(kimi) is None and not prices.price_known(kimi)
