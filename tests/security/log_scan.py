"""A pytest plugin: no secret the test suite creates or uses appears in any log it produces.

Loaded for the whole session (`pytest_plugins` in tests/conftest.py). It keeps the text of

- every log record emitted in the test process, from any logger, at INFO and above (the level
  `gateway serve` logs at) or lower where a test asks for it: `Logger.callHandlers` is wrapped,
  so records of loggers that do not propagate to the root are kept too;
- everything each Python subprocess the tests start (`gateway serve`, the CLI, workers) writes
  to its stderr: a `sitecustomize` put on the subprocesses' PYTHONPATH tees their `sys.stderr`
  into a file of this session (stdout is not a log: `gateway keys create` prints the new key
  there on purpose);

and the secrets the suite uses: master keys and provider keys of every gateway built in
process (and the store's and Redis's passwords), every virtual key the admin API or the CLI
generates, every key a client presents that looks like one (`gw-`, `sk-`, `AIza` or 12+
characters), and the string constants named like secrets (`MASTER`, `*KEY`, `*SECRET`,
`*PASSWORD`) of the test modules. Any virtual key (`gw-` + 43 characters) in a log is a leak
whether or not it was seen made.

The test `test_no_secret_in_any_log_of_the_session` (tests/security/test_secrets.py) is moved
to the end of the run and fails on a leak; the check runs again when the session finishes
(teardown logs too) and, on a leak, prints the report and makes the run exit non-zero.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import sys
import tempfile
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

FINAL_TEST = "test_no_secret_in_any_log_of_the_session"
STDERR_DIR_ENV = "GATEWAY_TEST_STDERR_DIR"
VIRTUAL_KEY = re.compile(r"(?<![A-Za-z0-9_-])gw-[A-Za-z0-9_-]{43}(?![A-Za-z0-9_-])")
SECRET_NAME = re.compile(r"MASTER|SECRET|PASSWORD|(^|_)(API_)?KEYS?$")
KEY_PREFIXES = ("gw-", "sk-", "AIza")
MAX_TEXT = 512 * 1024 * 1024  # kept log text; past this the oldest half is dropped

SITECUSTOMIZE = f'''\
"""Written by tests/security/log_scan.py: tee this process's stderr into the test session's
log scan. Only active while {STDERR_DIR_ENV} is set (by the test session)."""
import os
import sys

_directory = os.environ.get("{STDERR_DIR_ENV}")


class _Tee:
    def __init__(self, inner, fd):
        self._inner = inner
        self._fd = fd

    def write(self, text):
        written = self._inner.write(text)
        try:
            os.write(self._fd, str(text).encode("utf-8", "replace"))
        except OSError:
            pass
        return written

    def __getattr__(self, name):
        return getattr(self._inner, name)


if _directory and sys.stderr is not None:
    try:
        _fd = os.open(
            os.path.join(_directory, f"{{os.getpid()}}.log"),
            os.O_WRONLY | os.O_CREAT | os.O_APPEND,
            0o600,
        )
    except OSError:
        pass
    else:
        sys.stderr = _Tee(sys.stderr, _fd)
'''


def worth_scanning(secret: object) -> bool:
    """Long enough, or shaped like a key, to mean something when it shows up in a log."""
    if not isinstance(secret, str) or not secret or any(c.isspace() for c in secret):
        return False
    return len(secret) >= 12 or (secret.startswith(KEY_PREFIXES) and len(secret) >= 5)


@dataclass
class Leak:
    secret: str
    where: str
    excerpt: str

    def __str__(self) -> str:
        shown = self.secret[:6] + "..." if len(self.secret) > 6 else self.secret
        return f"{shown} (from {self.where}): ...{self.excerpt}..."


@dataclass
class LogScan:
    stderr_dir: Path
    texts: list[str] = field(default_factory=list)
    size: int = 0
    secrets: dict[str, str] = field(default_factory=dict)  # secret -> where it came from
    _restore: list[Callable[[], None]] = field(default_factory=list)

    # -- what is kept ----------------------------------------------------------------------------

    def keep(self, record: logging.LogRecord) -> None:
        try:
            text = f"{record.name} {record.levelname} {record.getMessage()}"
        except Exception:  # a record whose args do not fit its format: keep both raw
            text = f"{record.name} {record.levelname} {record.msg!r} {record.args!r}"
        if record.exc_info and record.exc_info[1] is not None:
            text += "\n" + "".join(traceback.format_exception(*record.exc_info))
        elif record.exc_text:
            text += "\n" + record.exc_text
        if record.stack_info:
            text += "\n" + record.stack_info
        self.texts.append(text)
        self.size += len(text)
        if self.size > MAX_TEXT:
            del self.texts[: len(self.texts) // 2]
            self.size = sum(map(len, self.texts))

    def secret(self, value: object, where: str) -> None:
        if worth_scanning(value):
            assert isinstance(value, str)
            self.secrets.setdefault(value, where)

    def url_password(self, url: object, where: str) -> None:
        if isinstance(url, str) and "@" in url:
            try:
                self.secret(urlsplit(url).password, where)
            except ValueError:
                pass

    def config(self, config: Any) -> None:
        """The secrets of a gateway's config."""
        self.secret(config.auth.master_key, "auth.master_key")
        self.url_password(config.store.url, "store.url")
        self.url_password(config.limits.redis_url, "limits.redis_url")
        for model in config.models:
            for deployment in model.deployments:
                where = f"models[{model.name}].api_key"
                self.secret(deployment.api_key, where)
                for name, value in deployment.extra_headers.items():
                    self.secret(value, f"models[{model.name}].extra_headers.{name}")
                    self.secret(value.rpartition(" ")[2], f"extra_headers.{name}")

    def module_constants(self, module: Any) -> None:
        for name, value in vars(module).items():
            if name.isupper() and SECRET_NAME.search(name):
                self.secret(value, f"{module.__name__}.{name}")

    # -- the check ---------------------------------------------------------------------------

    def sources(self) -> Iterator[tuple[str, str]]:
        yield "log records of the test process", "\n".join(self.texts)
        for path in sorted(self.stderr_dir.glob("*.log")):
            yield f"stderr of subprocess {path.stem}", path.read_text("utf-8", "replace")

    def leaks(self) -> list[Leak]:
        found: list[Leak] = []
        for where, text in self.sources():
            for secret, origin in self.secrets.items():
                at = _find(text, secret)
                if at >= 0:
                    excerpt = text[max(0, at - 80) : at + len(secret) + 40]
                    found.append(Leak(secret, f"{origin}, in the {where}", excerpt))
            for match in VIRTUAL_KEY.finditer(text):
                excerpt = text[max(0, match.start() - 80) : match.end() + 40]
                found.append(Leak(match.group(), f"a virtual key, in the {where}", excerpt))
        return found

    # -- installing and removing ---------------------------------------------------------------

    def install(self) -> None:
        self._wrap_call_handlers()
        root = logging.getLogger()
        if root.level > logging.INFO or root.level == logging.NOTSET:
            level = root.level
            root.setLevel(logging.INFO)
            self._restore.append(lambda: root.setLevel(level))
        self._observe_gateway()
        self._tee_subprocesses()

    def uninstall(self) -> None:
        while self._restore:
            self._restore.pop()()

    def _patch(self, owner: Any, name: str, replacement: Any) -> None:
        original = getattr(owner, name)
        setattr(owner, name, replacement)
        self._restore.append(lambda: setattr(owner, name, original))

    def _wrap_call_handlers(self) -> None:
        original = logging.Logger.callHandlers
        scan = self

        def call_handlers(logger: logging.Logger, record: logging.LogRecord) -> None:
            scan.keep(record)
            original(logger, record)

        self._patch(logging.Logger, "callHandlers", call_handlers)

    def _observe_gateway(self) -> None:
        """Learn the secrets where the gateway takes them in: its config, new keys, presented
        keys. Module-level names are looked up at call time, so wrapping them here works for
        modules imported before this plugin."""
        from gateway.context import Gateway
        from gateway.metering import admin, auth

        scan = self
        gateway_init = Gateway.__init__

        def init(gateway: Gateway, *args: Any, **kwargs: Any) -> None:
            gateway_init(gateway, *args, **kwargs)
            scan.config(gateway.config)

        self._patch(Gateway, "__init__", init)
        generate = vars(admin)["generate_key"]

        def generate_key() -> str:
            made: str = generate()
            scan.secret(made, "a virtual key made by the admin API")
            return made

        self._patch(admin, "generate_key", generate_key)
        presented = auth.presented_key

        def presented_key(headers: Any) -> str | None:
            key = presented(headers)
            scan.secret(key, "a key a client presented")
            return key

        self._patch(auth, "presented_key", presented_key)

    def _tee_subprocesses(self) -> None:
        site = self.stderr_dir / "site"
        site.mkdir()
        (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
        saved = {name: os.environ.get(name) for name in ("PYTHONPATH", STDERR_DIR_ENV)}
        path = os.environ.get("PYTHONPATH")
        os.environ["PYTHONPATH"] = str(site) + (os.pathsep + path if path else "")
        os.environ[STDERR_DIR_ENV] = str(self.stderr_dir)

        def restore() -> None:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value

        self._restore.append(restore)


def _find(text: str, secret: str) -> int:
    """Where `secret` stands in `text` as a token of its own (-1: nowhere). Long secrets match
    anywhere; short ones (`sk-up`) only between non-key characters."""
    if len(secret) >= 16:
        return text.find(secret)
    match = re.search(r"(?<![A-Za-z0-9_-])" + re.escape(secret) + r"(?![A-Za-z0-9_-])", text)
    return match.start() if match else -1


SCAN = pytest.StashKey[LogScan]()


def active(config: pytest.Config) -> LogScan | None:
    return config.stash.get(SCAN, None)


def pytest_configure(config: pytest.Config) -> None:
    scan = LogScan(Path(tempfile.mkdtemp(prefix="gw-log-scan-")))
    scan.install()
    config.stash[SCAN] = scan


def pytest_unconfigure(config: pytest.Config) -> None:
    scan = config.stash.get(SCAN, None)
    if scan is not None:
        scan.uninstall()
        shutil.rmtree(scan.stderr_dir, ignore_errors=True)


def pytest_collection_modifyitems(
    session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
) -> None:
    scan = config.stash.get(SCAN, None)
    if scan is None:
        return
    for name, module in list(sys.modules.items()):
        if name == "tests" or name.startswith("tests."):
            scan.module_constants(module)
    last = [item for item in items if item.name == FINAL_TEST]
    items[:] = [item for item in items if item.name != FINAL_TEST] + last


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    scan = session.config.stash.get(SCAN, None)
    if scan is None:
        return
    leaks = scan.leaks()
    if not leaks:
        return
    session.config.stash[LEAKS] = leaks
    if session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


LEAKS = pytest.StashKey[list[Leak]]()


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    scan = config.stash.get(SCAN, None)
    leaks = config.stash.get(LEAKS, None)
    if scan is None:
        return
    if not leaks:
        subprocesses = len(list(scan.stderr_dir.glob("*.log")))
        terminalreporter.write_line(
            f"log scan: {len(scan.texts)} log records and the stderr of {subprocesses}"
            f" subprocesses, no trace of {len(scan.secrets)} secrets"
        )
        return
    terminalreporter.section("secrets in logs", sep="=", red=True, bold=True)
    for leak in leaks[:50]:
        terminalreporter.line(str(leak), red=True)
    terminalreporter.line(
        f"{len(leaks)} secret(s) appeared in the logs of this session (tests/security/log_scan.py)"
    )
