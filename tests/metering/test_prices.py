"""Every deployment has a price or says why not: the bundled map, the operator's price file, the
config; `gateway prices`; and a hard budget that never admits a request it could not meter."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest

from gateway.config import ConfigError, parse_config
from gateway.metering.prices import lookup, price_map, resolve
from gateway.routing.router import price_list
from tests.conftest import GatewayUnderTest, MakeGateway
from tests.fakes import FakeUpstream

MASTER = "master-key-for-tests-0123456789"
HELLO = [{"role": "user", "content": "Hello"}]
GATEWAY = [sys.executable, "-m", "gateway"]


# -- resolution -------------------------------------------------------------------------------


def test_the_ids_the_issue_names_are_not_in_the_bundled_map_and_stay_unpriced() -> None:
    # What litellm's bundled map holds for them: nothing under these ids, their provider's
    # prefix or their undated family; Bedrock's and Vertex's entries of the same models
    # (`anthropic.claude-sonnet-4-20250514-v1:0`, `vertex_ai/gemini-2.0-flash`) are other
    # providers' prices, which are never taken.
    table = price_map()
    assert "anthropic.claude-sonnet-4-20250514-v1:0" in table
    assert "vertex_ai/gemini-2.0-flash" in table
    for model, provider in [
        ("claude-sonnet-4-20250514", "anthropic"),
        ("anthropic/claude-3-5-sonnet-20241022", "litellm"),
        ("claude-3-5-sonnet-20241022", "anthropic"),
        ("gemini/gemini-2.0-flash", "litellm"),
    ]:
        resolved = resolve(model, provider)
        assert resolved.price is None, (model, resolved)
        assert model in resolved.why and "no price file" in resolved.why


def test_exact_ids_prefixes_and_dated_families_resolve_to_their_own_entry() -> None:
    table = price_map()
    # Exact: a dated Anthropic id the map holds, with every cache price.
    price = lookup("claude-sonnet-4-5-20250929", "anthropic", table)
    assert price is not None and price.entry == "claude-sonnet-4-5-20250929"
    assert (price.input, price.output) == (3e-06, 1.5e-05)
    assert (price.cache_read, price.cache_write, price.cache_write_1h) == (3e-07, 3.75e-06, 6e-06)
    assert price.max_output_tokens == 64000
    # A provider prefix taken off (litellm's id) or put on (Azure's entries are its own).
    assert lookup("anthropic/claude-sonnet-4-5", "litellm", table).entry == "claude-sonnet-4-5"  # type: ignore[union-attr]
    assert lookup("gpt-4o", "azure", table).entry == "azure/gpt-4o"  # type: ignore[union-attr]
    assert lookup("gemini/gemini-2.5-flash", "litellm", table).entry == "gemini/gemini-2.5-flash"  # type: ignore[union-attr]
    # A dated id the map does not hold: its undated family, only because the map has it.
    assert "claude-sonnet-4-5-20991231" not in table
    family = lookup("claude-sonnet-4-5-20991231", "anthropic", table)
    assert family is not None and family.entry == "claude-sonnet-4-5"
    assert lookup("gpt-4o-mini-2099-12-31", "openai", table).entry == "gpt-4o-mini"  # type: ignore[union-attr]
    # Another provider's entry is never taken: `azure/x` stripped to an OpenAI entry.
    assert lookup("azure/gpt-4o-mini-nonexistent", "litellm", table) is None
    assert lookup("gpt-4o-mini", "anthropic", table) is None  # an OpenAI entry, not Anthropic's


def test_the_price_file_and_the_config_come_before_the_map(tmp_path: Path) -> None:
    prices = tmp_path / "prices.yaml"
    prices.write_text(
        "claude-sonnet-4-20250514:\n"
        "  input_cost_per_token: 3.0e-6\n"
        "  output_cost_per_token: 1.5e-5\n"
        "  cache_read_input_token_cost: 3.0e-7\n"
        "  cache_creation_input_token_cost: 3.75e-6\n"
        "  cache_creation_input_token_cost_above_1hr: 6.0e-6\n"
        "gpt-4o-mini: {input_cost_per_token: 1.0e-7, output_cost_per_token: 4.0e-7}\n"
    )
    config = parse_config(
        {
            "prices": str(prices),
            "models": [
                {
                    "name": "sonnet",
                    "deployments": [
                        {"provider": "anthropic", "model": "claude-sonnet-4-20250514"},
                        {
                            "provider": "anthropic",
                            "model": "claude-sonnet-4-20250514",
                            "price": {"input_cost_per_token": 1e-6, "output_cost_per_token": 2e-6},
                        },
                    ],
                },
                {
                    "name": "mini",
                    "deployments": [
                        {"provider": "openai", "api_base": "http://x", "model": "gpt-4o-mini"},
                        {
                            "provider": "openai",
                            "api_base": "http://x",
                            "model": "gpt-4o-mini",
                            "input_cost_per_mtok": 0.5,
                            "output_cost_per_mtok": 1.5,
                        },
                        {"provider": "openai", "api_base": "http://x", "model": "gpt-4o"},
                    ],
                },
                {
                    "name": "local",
                    "deployments": [
                        {"provider": "openai", "api_base": "http://x", "model": "llama-local"},
                        {
                            "provider": "openai",
                            "api_base": "http://x",
                            "model": "llama-local",
                            "price": "free",
                        },
                    ],
                },
            ],
        }
    ).config
    got = {d.name: d.priced for d in price_list(config)}
    file_sonnet = got["sonnet/0-anthropic"].price
    assert file_sonnet is not None and file_sonnet.where == "price file (claude-sonnet-4-20250514)"
    assert file_sonnet.cache_write_1h == 6e-6
    assert got["sonnet/1-anthropic"].price.source == "config"  # type: ignore[union-attr]
    assert got["mini/0-openai"].price.where == "price file (gpt-4o-mini)"  # type: ignore[union-attr]
    assert got["mini/0-openai"].price.input == 1e-7  # type: ignore[union-attr]
    per_mtok = got["mini/1-openai"].price
    assert per_mtok is not None and (per_mtok.input, per_mtok.output) == (0.5e-6, 1.5e-6)
    assert got["mini/2-openai"].price.where == "bundled map (gpt-4o)"  # type: ignore[union-attr]
    assert got["local/0-openai"].price is None
    assert got["local/0-openai"].why.startswith("neither the price file nor the bundled map")
    assert got["local/1-openai"].price.source == "free"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        ("m: {output_cost_per_token: 1.0e-6}", "'m' has no input_cost_per_token"),
        ("m: {input_cost_per_token: -1, output_cost_per_token: 0}", "must be a number >= 0"),
        ("m: {input_cost_per_token: x, output_cost_per_token: 0}", "must be a number >= 0"),
        ("m: 0.1", "'m' must be a mapping"),
        ("[1, 2]", "must map model ids to prices"),
        ("m: {input_cost_per_token: 0, output_cost_per_token: 0, max_output_tokens: 0}", "max_"),
    ],
)
def test_a_bad_price_file_is_a_config_error(tmp_path: Path, content: str, reason: str) -> None:
    prices = tmp_path / "prices.yaml"
    prices.write_text(content)
    with pytest.raises(ConfigError) as caught:
        parse_config({"prices": str(prices)})
    assert f"prices: Value error, the price file {prices}" in str(caught.value)
    assert reason in str(caught.value)
    with pytest.raises(ConfigError, match="cannot read the price file"):
        parse_config({"prices": str(tmp_path / "missing.json")})


def test_half_a_per_mtok_price_is_a_config_error() -> None:
    deployment = {"provider": "demo", "input_cost_per_mtok": 1.0}
    with pytest.raises(ConfigError, match="set both input_cost_per_mtok and output_cost_per_mtok"):
        parse_config({"models": [{"name": "m", "deployments": [deployment]}]})
    both = {**deployment, "output_cost_per_mtok": 2.0, "price": "free"}
    with pytest.raises(ConfigError, match="not both"):
        parse_config({"models": [{"name": "m", "deployments": [both]}]})


# -- the CLI ----------------------------------------------------------------------------------


def write_config(tmp_path: Path) -> Path:
    prices = tmp_path / "prices.json"
    prices.write_text(
        '{"claude-sonnet-4-20250514": {"input_cost_per_token": 3e-06,'
        ' "output_cost_per_token": 1.5e-05, "cache_read_input_token_cost": 3e-07}}'
    )
    config = tmp_path / "gw.yaml"
    config.write_text(
        f"store: {{url: 'sqlite:///{tmp_path}/gw.db'}}\n"
        f"prices: {prices}\n"
        "models:\n"
        "  - name: demo\n"
        "    deployments: [{provider: demo}, {provider: demo, price: free}]\n"
        "  - name: sonnet\n"
        "    deployments:\n"
        "      - {provider: anthropic, model: claude-sonnet-4-20250514, api_key: k}\n"
        "      - {provider: anthropic, model: claude-sonnet-4-5-20250929, api_key: k}\n"
        "  - name: gemini\n"
        "    deployments:\n"
        "      - {provider: litellm, model: gemini/gemini-2.0-flash, name: flash}\n"
        "      - {provider: litellm, model: gemini/gemini-2.0-flash, price: free, name: free}\n"
        "      - {provider: litellm, model: gemini/gemini-2.0-flash, name: mine,"
        " input_cost_per_mtok: 0.1, output_cost_per_mtok: 0.4}\n"
    )
    return config


def test_gateway_prices_says_each_price_and_where_it_came_from(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    result = subprocess.run(
        [*GATEWAY, "prices", "--config", str(config)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "USD per million tokens" in lines[0] and "litellm " in lines[0]
    assert lines[1].split()[:5] == ["alias", "deployment", "model", "input", "output"]
    rows = {line.split()[1]: line for line in lines[2:]}
    assert "unpriced: no" not in rows["demo/0-demo"]  # a price file is set
    assert rows["demo/0-demo"].split()[3:9] == ["-"] * 6 and "for demo" in rows["demo/0-demo"]
    assert rows["demo/1-demo"].split()[3:9] == ["0"] * 5 + ["-"]
    file_row = rows["sonnet/0-anthropic"].split()
    # input 3, output 15, cache read 0.3, no cache write price: billed as input.
    assert file_row[3:8] == ["3", "15", "0.3", "=input", "=input"]
    assert file_row[-2:] == ["file", "(claude-sonnet-4-20250514)"]
    map_row = rows["sonnet/1-anthropic"].split()
    assert map_row[3:9] == ["3", "15", "0.3", "3.75", "6", "64000"]
    assert map_row[-3:] == ["bundled", "map", "(claude-sonnet-4-5-20250929)"]
    assert "unpriced: neither the price file nor the bundled map" in rows["flash"]
    assert "gemini/gemini-2.0-flash, gemini-2.0-flash" in rows["flash"]
    assert rows["free"].split()[3:5] == ["0", "0"] and "marked `price: free`" in rows["free"]
    assert rows["mine"].split()[3:5] == ["0.1", "0.4"] and rows["mine"].endswith("config")


def test_check_config_lists_the_unpriced_deployments(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    result = subprocess.run(
        [*GATEWAY, "check-config", "--config", str(config)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    unpriced = [line for line in result.stdout.splitlines() if line.startswith("unpriced:")]
    assert len(unpriced) == 2
    assert "deployment demo/0-demo (alias demo, model demo)" in unpriced[0]
    assert "deployment flash (alias gemini, model gemini/gemini-2.0-flash)" in unpriced[1]
    assert "price_unknown" in unpriced[1] and "`price: free`" in unpriced[1]


# -- admission --------------------------------------------------------------------------------


async def gateway_with_budget(
    make_gateway: MakeGateway, upstream: FakeUpstream, deployment: dict[str, Any], mode: str
) -> tuple[GatewayUnderTest, str]:
    gw = await make_gateway(
        models=[
            {"name": "m", "retry": {"max_attempts": 1}, "deployments": [deployment]},
            {
                "name": "demo",
                "deployments": [{"provider": "demo", "chunk_delay_ms": 0, "price": "free"}],
            },
        ],
        auth={"master_key": MASTER},
    )
    headers = {"Authorization": f"Bearer {MASTER}"}
    budget = {"budget": {"usd": 5, "period": "month", "mode": mode}}
    async with aiohttp.ClientSession(headers=headers) as session:
        team = {"id": "t", "name": "T", "limits": budget}
        async with session.post(gw.url + "/v1/gateway/teams", json=team) as r:
            assert r.status == 201, await r.text()
        async with session.post(gw.url + "/v1/gateway/keys", json={"team_id": "t"}) as r:
            assert r.status == 201, await r.text()
            secret: str = (await r.json())["key"]
    return gw, secret


async def ask(gw: GatewayUnderTest, key: str) -> None:
    """A streamed question to alias `m`, read to its end and recorded."""
    stream = await gw.client(api_key=key).chat.completions.create(
        model="m", messages=HELLO, stream=True
    )
    async for _ in stream:
        pass
    await gw.flush()


async def test_a_hard_budget_refuses_an_unpriced_deployment(
    make_gateway: MakeGateway, upstream: FakeUpstream, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "gateway.routing.router")
    deployment = {"provider": "openai", "api_base": upstream.url, "name": "d", "model": "mystery"}
    gw, key = await gateway_with_budget(make_gateway, upstream, deployment, "hard")
    # The startup log names it.
    [warning] = [r.getMessage() for r in caplog.records if "has no price" in r.getMessage()]
    assert warning.startswith("deployment d (model mystery) has no price")
    with pytest.raises(openai.PermissionDeniedError) as caught:
        await gw.client(api_key=key).chat.completions.create(model="m", messages=HELLO)
    error = caught.value
    assert error.status_code == 403 and error.code == "price_unknown"
    assert "'d' (model 'mystery')" in error.message and "hard budget" in error.message
    assert "price file" in error.message and "price: free" in error.message
    await gw.flush()
    assert not upstream.requests  # no upstream call
    assert gw.query("SELECT count(*) FROM turns") == [(0,)]  # nothing recorded
    assert gw.query("SELECT count(*) FROM usage") == [(0,)]
    # A priced deployment (this demo is `price: free`) under the same budget is served.
    await gw.client(api_key=key).chat.completions.create(model="demo", messages=HELLO)


async def test_price_free_is_admitted_under_a_hard_budget_and_costs_nothing(
    make_gateway: MakeGateway, upstream: FakeUpstream
) -> None:
    deployment = {
        "provider": "openai",
        "api_base": upstream.url,
        "name": "d",
        "model": "mystery",
        "price": "free",
    }
    gw, key = await gateway_with_budget(make_gateway, upstream, deployment, "hard")
    upstream.text(["Hi", " there"])
    await ask(gw, key)
    [(status, cost)] = gw.query("SELECT status, cost_usd FROM usage WHERE deployment = 'd'")
    assert (status, cost) == ("completed", 0.0)


async def test_a_soft_budget_lets_an_unpriced_deployment_through_unpriced(
    make_gateway: MakeGateway, upstream: FakeUpstream
) -> None:
    deployment = {"provider": "openai", "api_base": upstream.url, "name": "d", "model": "mystery"}
    gw, key = await gateway_with_budget(make_gateway, upstream, deployment, "soft")
    upstream.text(["Hi"])
    await ask(gw, key)
    assert gw.query("SELECT cost_usd FROM usage WHERE deployment = 'd'") == [(None,)]
