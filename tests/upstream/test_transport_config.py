"""Deployment settings for the upstream transport (`proxy`, `tls`) and how a proxy is chosen
from the environment (gateway.upstream.proxy), without a network."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trustme

from gateway.config import ConfigError, DeploymentConfig, parse_config
from gateway.upstream.proxy import Proxy, bypassed, resolve
from gateway.upstream.tls import deployment_context


def deployment(**fields: Any) -> dict[str, Any]:
    return {
        "name": "m",
        "deployments": [{"provider": "openai", "api_base": "https://api.example.com/v1", **fields}],
    }


def load(**fields: Any) -> DeploymentConfig:
    return parse_config({"models": [deployment(**fields)]}).config.models[0].deployments[0]


def config_error(**fields: Any) -> str:
    with pytest.raises(ConfigError) as caught:
        parse_config({"models": [deployment(**fields)]}, "gateway.yaml")
    return str(caught.value)


@pytest.fixture
def ca_file(tmp_path: Path) -> Path:
    path = tmp_path / "corp-ca.pem"
    trustme.CA().cert_pem.write_to_path(str(path))
    return path


# -- proxy ----------------------------------------------------------------------------------------


def test_proxy_unset_is_the_environments_and_none_or_null_is_direct() -> None:
    assert load().proxy is None  # the environment decides, when the endpoint is built
    env = {"HTTPS_PROXY": "http://proxy.corp:3128"}
    assert resolve("https", "api.example.com", 443, load().proxy, env) is not None
    for direct in ("none", "None", None, ""):
        setting = load(proxy=direct).proxy
        assert setting is not None  # null and "" say "none", as `none` does
        assert resolve("https", "api.example.com", 443, setting, env) is None
    assert load(proxy="http://proxy.corp:3128").proxy == "http://proxy.corp:3128"


def test_a_bad_proxy_is_a_config_error_naming_the_field_not_the_password() -> None:
    message = config_error(proxy="socks5://user:hunter22@proxy.corp:1080")
    assert "gateway.yaml: models[0].deployments[0].proxy:" in message
    assert "socks5:// proxy is not supported" in message
    assert "hunter22" not in message
    assert "no host" in config_error(proxy="http://:3128")
    assert "host:port only" in config_error(proxy="http://proxy.corp:3128/path")
    assert "not a proxy URL" in config_error(proxy="http://user:hunter22@proxy.corp:port")
    assert "hunter22" not in config_error(proxy="http://user:hunter22@proxy.corp:port")


def test_proxy_urls() -> None:
    plain = Proxy("proxy.corp:3128")  # no scheme: http, as curl takes it
    assert (plain.host, plain.port, plain.authorization) == ("proxy.corp", 3128, None)
    assert plain.display == plain.key == "http://proxy.corp:3128"
    assert Proxy("http://proxy.corp").port == 80
    secret = Proxy("http://al%40ice:p%3Ass@[::1]:8080")
    assert secret.display == "http://[::1]:8080"
    assert secret.authorization == "Basic YWxAaWNlOnA6c3M="  # al@ice:p:ss
    assert secret.key.startswith("http://[::1]:8080#") and "p:ss" not in secret.key
    assert Proxy("http://bob:other@[::1]:8080").key != secret.key  # never shared
    assert "p:ss" not in repr(secret)


# -- tls ------------------------------------------------------------------------------------------


def test_tls_defaults_verify_with_the_default_cas() -> None:
    tls = load().tls
    assert tls.ca_bundle is None and tls.verify is True
    assert deployment_context(tls.ca_bundle, tls.verify) is None


def test_a_ca_bundle_must_be_a_pem_file(tmp_path: Path, ca_file: Path) -> None:
    assert load(tls={"ca_bundle": str(ca_file)}).tls.ca_bundle == str(ca_file)
    missing = tmp_path / "missing.pem"
    message = config_error(tls={"ca_bundle": str(missing)})
    assert f"models[0].deployments[0].tls.ca_bundle: Value error, {missing}: no such file" in (
        message
    )
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    message = config_error(tls={"ca_bundle": str(junk)})
    assert "tls.ca_bundle" in message and str(junk) in message
    assert "unknown field" in config_error(tls={"cafile": str(ca_file)})


def test_litellm_deployments_take_neither_proxy_nor_tls(ca_file: Path) -> None:
    # litellm's own HTTP client (httpx) reads the proxy and CA variables itself.
    litellm = {"provider": "litellm", "model": "gemini/gemini-2.0-flash"}
    for fields in (
        {"proxy": "http://proxy.corp:3128"},
        {"proxy": "none"},
        {"tls": {"verify": False}},
        {"tls": {"ca_bundle": str(ca_file)}},
    ):
        model = {"name": "g", "deployments": [{**litellm, **fields}]}
        with pytest.raises(ConfigError, match="not supported for provider 'litellm'"):
            parse_config({"models": [model]})


# -- which proxy the environment names ---------------------------------------------------------


def test_the_scheme_picks_the_variable() -> None:
    env = {"HTTPS_PROXY": "http://tls-proxy:3128", "HTTP_PROXY": "http://plain-proxy:3128"}
    assert repr(resolve("https", "a.test", 443, None, env)) == "Proxy(http://tls-proxy:3128)"
    assert repr(resolve("http", "a.test", 80, None, env)) == "Proxy(http://plain-proxy:3128)"
    assert resolve("https", "a.test", 443, None, {"HTTP_PROXY": "http://p:1"}) is None
    assert resolve("https", "a.test", 443, None, {"HTTPS_PROXY": " "}) is None
    # A deployment's setting wins over the environment, and its NO_PROXY.
    own = resolve("https", "a.test", 443, "http://own:8080", {**env, "NO_PROXY": "*"})
    assert own is not None and own.host == "own"


def test_an_unsupported_proxy_in_the_environment_names_the_variable() -> None:
    with pytest.raises(ValueError, match=r"^HTTPS_PROXY: a socks5:// proxy") as caught:
        resolve("https", "a.test", 443, None, {"HTTPS_PROXY": "socks5://u:hunter22@p:1080"})
    assert "hunter22" not in str(caught.value)


@pytest.mark.parametrize(
    ("host", "port", "no_proxy", "expected"),
    [
        ("api.openai.com", 443, "*", True),
        ("api.openai.com", 443, "openai.com", True),
        ("api.openai.com", 443, ".openai.com", True),
        ("api.openai.com", 443, "*.openai.com", True),
        ("openai.com", 443, ".openai.com", True),
        ("notopenai.com", 443, "openai.com", False),
        ("API.OpenAI.com", 443, "api.openai.COM", True),
        ("api.openai.com", 443, "other.test, api.openai.com", True),
        ("api.openai.com", 443, "other.test api.openai.com", True),
        ("api.openai.com", 443, "api.openai.com:443", True),
        ("api.openai.com", 443, "api.openai.com:8443", False),
        ("10.1.2.3", 80, "10.0.0.0/8", True),
        ("10.1.2.3", 80, "10.1.2.3", True),
        ("11.1.2.3", 80, "10.0.0.0/8", False),
        ("::1", 80, "::1", True),
        ("::1", 8080, "[::1]:8080", True),
        ("::1", 80, "[::1]:8080", False),
        ("fd00::5", 443, "fd00::/8", True),
        ("api.openai.com", 443, "", False),
        ("api.openai.com", 443, ",,", False),
        ("10.1.2.3", 80, "localhost", False),
    ],
)
def test_no_proxy(host: str, port: int, no_proxy: str, expected: bool) -> None:
    assert bypassed(host, port, no_proxy) is expected
