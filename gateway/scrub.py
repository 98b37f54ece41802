"""Secrets out of every text the gateway stores, logs or answers (docs/security.md).

Two kinds of secret are taken out, each replaced by `[redacted]`:

- **the configured ones**: each deployment's `api_key`, its cloud credentials (AWS keys and
  session token, Azure AD token and client secret, an inline Vertex key: gateway.providers.cloud),
  the credentials among its `extra_headers` (the whole value, and its token after a scheme:
  `Bearer sk-...`), the password of its `proxy`, the master key, and the passwords in
  `store.url` and `limits.redis_url`.
  `learn(config)` adds a config's; they are kept for the life of the process (a secret learned
  once is never let through again). Shorter than `MIN_LENGTH` characters they would match
  ordinary words, and are left out (the relay still takes a deployment's own key of 4 or more
  characters out of that deployment's errors);
- **anything shaped like a key**: `sk-...` and `gw-...` tokens (OpenAI, Anthropic, the
  gateway's own virtual keys), Google's `AIza...` keys, AWS access key ids (`AKIA...`,
  `ASIA...`), and whatever follows `Bearer `.

`scrub(text)` does it to a text, `scrub_json` to every string in a JSON value, `scrub_error` to
an error in place. Where they are called, so that no text escapes them:

- errors: `gateway.pipeline.relay` scrubs every upstream error when its attempt fails, before
  it is recorded, logged, retried or rendered into the client's stream; the error middleware
  (`gateway.http.middleware.error_response`) scrubs every error body it answers;
- the store: the recorder scrubs the in-stream error events of each recorded stream and each
  `request/error` (`gateway.conversations.recorder`); a data migration scrubs the rows stored
  before (`gateway.storage.schema`, `scrub_stored`);
- logs: from the first `learn()`, every log record of the process (any logger) is scrubbed when
  it is made, its message and its traceback (a record factory: `logging.setLogRecordFactory`).

User content (messages, answers, tool calls) is never rewritten: only configured secrets are
taken out of stored rows of any kind, the key-shaped patterns only out of error records.
"""

from __future__ import annotations

import logging
import re
import threading
import traceback
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from gateway.config import GatewayConfig
    from gateway.errors import GatewayError

REDACTED = "[redacted]"
# Request headers whose values are credentials (`credentials`).
_CREDENTIAL_HEADER = re.compile(r"auth|key|token|secret|cookie|password", re.IGNORECASE)
MIN_LENGTH = 8  # a configured secret shorter than this is not taken out of every text

# Key-shaped tokens. The look-behind keeps `sk-` inside a word (`task-...`) out; `[redacted]`
# itself never matches, so scrubbing twice changes nothing.
_TOKEN = re.compile(
    r"(?<![A-Za-z0-9_-])(?:sk|gw)-[A-Za-z0-9_-]{16,}"  # sk-proj-..., sk-ant-..., gw-...
    r"|(?<![A-Za-z0-9_-])AIza[A-Za-z0-9_-]{30,}"  # Google API keys
    r"|(?<![A-Za-z0-9])(?:AKIA|ASIA)[A-Z0-9]{16}(?![A-Za-z0-9])"  # AWS access key ids
    r"|(?i:(?<![A-Za-z0-9_-])(bearer)\s+)[A-Za-z0-9._~+/=-]{8,}"  # Bearer xyz
)


def _replace(match: re.Match[str]) -> str:
    scheme = match.group(1)
    return f"{scheme} {REDACTED}" if scheme else REDACTED


class _Secrets:
    """The configured secrets, longest first (a secret that contains another goes first)."""

    def __init__(self) -> None:
        self.values: tuple[str, ...] = ()
        self.last: object = None  # the config learned last: the usual call learns nothing new
        self.lock = threading.Lock()

    def add(self, found: Iterable[str | None]) -> None:
        fresh = {s for s in found if s and len(s) >= MIN_LENGTH} - set(self.values)
        if not fresh:
            return
        with self.lock:
            merged = set(self.values) | fresh
            self.values = tuple(sorted(merged, key=lambda s: (-len(s), s)))


_SECRETS = _Secrets()


def config_secrets(config: GatewayConfig) -> list[str]:
    """Every secret a config holds (of any length)."""
    from gateway.providers.cloud import secrets as cloud_secrets

    found = [config.auth.master_key or ""]
    found += [_url_password(config.store.url), _url_password(config.limits.redis_url)]
    for model in config.models:
        for deployment in model.deployments:
            found.append(deployment.api_key or "")
            found += cloud_secrets(deployment.__dict__)
            found += credentials(deployment.extra_headers)
            found.append(_url_password(deployment.proxy))
    return [s for s in found if s]


def credentials(headers: Mapping[str, str]) -> list[str]:
    """The secrets among request headers: each credential header's value, and its token after
    a scheme (`Bearer sk-...`), longest first."""
    found: set[str] = set()
    for name, value in headers.items():
        if value and _CREDENTIAL_HEADER.search(name):
            found.update((value, value.rpartition(" ")[2]))
    return sorted((s for s in found if len(s) >= 4), key=len, reverse=True)


def _url_password(url: str | None) -> str:
    if not url or "@" not in url:
        return ""
    try:
        return urlsplit(url).password or ""
    except ValueError:
        return ""


def learn(config: GatewayConfig) -> None:
    """Take `config`'s secrets out of every text from now on, and start scrubbing log records.
    Cheap when called again with the same config (the error middleware calls it on every
    request, for apps served some other way than `gateway serve`)."""
    if config is _SECRETS.last:
        return
    _SECRETS.add(config_secrets(config))
    _SECRETS.last = config
    install_log_scrubbing()


def add(*secrets: str) -> None:
    """Take these out of every text from now on (tests; a secret learned some other way)."""
    _SECRETS.add(secrets)


def configured() -> tuple[str, ...]:
    """The configured secrets learned so far, longest first."""
    return _SECRETS.values


def scrub(text: str, extra: Iterable[str] = ()) -> str:
    """`text` without any configured secret, any key-shaped token, or any of `extra` (of 4
    characters or more)."""
    for secret in _SECRETS.values:
        if secret in text:
            text = text.replace(secret, REDACTED)
    for secret in extra:
        if len(secret) >= 4 and secret in text:
            text = text.replace(secret, REDACTED)
    return _TOKEN.sub(_replace, text)


def scrub_json(value: Any, extra: Iterable[str] = ()) -> Any:
    """A JSON value (dicts, lists, strings, numbers) with every string scrubbed, keys too; the
    same object when nothing changed."""
    if isinstance(value, str):
        return scrub(value, extra)
    if isinstance(value, dict):
        items = [(scrub_json(k, extra), scrub_json(v, extra)) for k, v in value.items()]
        if all(a is k and b is v for (a, b), (k, v) in zip(items, value.items(), strict=True)):
            return value
        return dict(items)
    if isinstance(value, list | tuple):
        cleaned = [scrub_json(v, extra) for v in value]
        if all(a is b for a, b in zip(cleaned, value, strict=True)):
            return value
        return cleaned
    return value


def scrub_error(error: GatewayError, extra: Iterable[str] = ()) -> None:
    """Scrub an error in place before it is logged, recorded or answered: its message, and the
    provider's error body it carries (`body`, passed through to clients)."""
    extra = [s for s in extra if s and len(s) >= 4]
    message = scrub(error.message, extra)
    if message != error.message:
        error.message = message
        error.args = (message,)
    body = getattr(error, "body", None)
    if isinstance(body, dict):
        cleaned = scrub_json(body, extra)
        if cleaned is not body:
            error.body = cleaned  # type: ignore[attr-defined]


# -- log records ---------------------------------------------------------------------------------

_installed = False


def install_log_scrubbing() -> None:
    """Scrub every log record of the process when it is made (idempotent)."""
    global _installed
    if _installed:
        return
    _installed = True
    make = logging.getLogRecordFactory()

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = make(*args, **kwargs)
        try:
            scrub_record(record)
        except Exception:  # a record whose arguments do not fit its format: left to logging
            pass
        return record

    logging.setLogRecordFactory(factory)


def scrub_record(record: logging.LogRecord) -> None:
    """Scrub a log record in place: its message (formatted, when a secret was in it) and its
    traceback (formatted into `exc_text`, when a secret was in it)."""
    message = record.getMessage()
    cleaned = scrub(message)
    if cleaned != message:
        record.msg, record.args = cleaned, None
    if record.exc_info and record.exc_info[1] is not None:
        text = "".join(traceback.format_exception(*record.exc_info)).rstrip("\n")
        cleaned = scrub(text)
        if cleaned != text:
            record.exc_text, record.exc_info = cleaned, None
