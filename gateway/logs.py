"""The process's log: its format and level (`logging` in the config), the request id on every
record made while serving a request, and the access log (docs/operations.md, "Logs").

- **Where**: stderr, one record per line. `text` is a readable line (a traceback follows on its
  own lines, as Python prints it); `json` is one JSON object per line, the traceback inside it
  as one string (`exception`).
- **Request id**: `begin_request` sets it in a `ContextVar` where the request's id is assigned
  (gateway.http.middleware); tasks created while serving inherit it, and a filter on the
  handler stamps it onto every record (`request_id`).
- **Access log**: one record per request on the `gateway.access` logger (the middleware writes
  it, `access_log`); what only the pipeline knows (the alias, the tokens) it leaves with
  `annotate`, in a dict that lives as long as the request. With this module's own handler in
  place (`configure`), an access record is formatted straight into its line, without a
  `LogRecord`, and the lines are written in batches: through `logging`, each request's record
  took a record, the record factory's scrub, a formatter, a write and a flush, a large share of
  a short request's whole cost. A batch is written within
  `ACCESS_FLUSH_S`, at 64 lines, before any other record (so the log keeps its order) and at
  exit.
- **One record, one line**: in `text`, a control character in a record's message or an access
  field (a path a client sent with `%0a` in it) is written escaped (`\\n`, `\\x1b`), so no
  client can forge a line; `json` escapes them as JSON does. A traceback alone follows on
  lines of its own.
- **Secrets**: every record is scrubbed when it is made (gateway.scrub, a record factory): its
  message and its traceback, whatever the format. The formatters scrub a traceback again (one
  formatted here, not by the factory), and the access fields a client chose (the path) are
  scrubbed when the record is made.

`hold` (before the config is read) keeps records in memory; `configure` then writes them, and
everything after, the config's way: the config's own warnings come out in its format too.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Protocol

import orjson

from gateway.scrub import scrub

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from gateway.config import LoggingConfig

ACCESS = logging.getLogger("gateway.access")

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
TEXT_FORMAT_WITH_ID = "%(asctime)s %(levelname)s %(name)s [%(request_id)s]: %(message)s"

# The request being served, for every record made while serving it (and in tasks it starts).
_REQUEST_ID: ContextVar[str | None] = ContextVar("gateway_request_id", default=None)
# What the pipeline tells the access log about the request (`annotate`).
_NOTES: ContextVar[dict[str, Any] | None] = ContextVar("gateway_request_notes", default=None)


# -- the request scope ---------------------------------------------------------------------------


def begin_request(request_id: str) -> dict[str, Any]:
    """The request being served from here on in this task (and the tasks it creates): its id,
    and its notes for the access log, returned."""
    _REQUEST_ID.set(request_id)
    notes: dict[str, Any] = {}
    _NOTES.set(notes)
    return notes


def request_id() -> str | None:
    """The id of the request being served (its X-Request-Id); None outside a request."""
    return _REQUEST_ID.get()


def annotate(**fields: Any) -> None:
    """Tell the access log of the request being served (nothing outside a request)."""
    notes = _NOTES.get()
    if notes is not None:
        notes.update(fields)


class _Attempt(Protocol):
    @property
    def route(self) -> Mapping[str, Any]: ...

    @property
    def usage(self) -> dict[str, Any] | None: ...


class _Turn(Protocol):
    @property
    def alias(self) -> str | None: ...

    @property
    def conversation_id(self) -> str: ...

    @property
    def turn_id(self) -> str: ...

    @property
    def ended(self) -> bool: ...

    @property
    def attempts(self) -> Sequence[_Attempt]: ...


def annotate_turn(turn: _Turn) -> None:
    """A completion's turn (gateway.conversations.recorder.TurnRecorder) for the access log:
    its alias, ids and last deployment, and once it has ended the tokens its providers
    reported."""
    notes = _NOTES.get()
    if notes is None:
        return
    notes["alias"] = turn.alias
    notes["conversation_id"] = turn.conversation_id
    notes["turn_id"] = turn.turn_id
    if turn.attempts:
        notes["deployment"] = turn.attempts[-1].route.get("deployment")
    if not turn.ended:  # its end comes later (a drain after a disconnect): no count yet
        return
    prompt = completion = None
    for attempt in turn.attempts:
        usage = attempt.usage
        if not usage:
            continue
        if isinstance(p := usage.get("prompt_tokens"), int):
            prompt = (prompt or 0) + p
        if isinstance(c := usage.get("completion_tokens"), int):
            completion = (completion or 0) + c
    notes["prompt_tokens"] = prompt
    notes["completion_tokens"] = completion


# -- the access log ------------------------------------------------------------------------------

# Every access record has these fields, null where unknown (`interrupted` is a bool).
ACCESS_FIELDS = (
    "method",
    "path",
    "status",
    "duration_ms",
    "alias",
    "deployment",
    "key_prefix",
    "team_id",
    "prompt_tokens",
    "completion_tokens",
    "conversation_id",
    "turn_id",
    "interrupted",
    "error",
)


def access_level(path: str) -> int:
    """Probes and scrapes at DEBUG, so that they do not flood the log; the rest at INFO."""
    if path == "/metrics" or path.startswith("/health/"):
        return logging.DEBUG
    return logging.INFO


def log_access(level: int, fields: dict[str, Any], *, path_is_route: bool = False) -> None:
    """One access record: `fields` are ACCESS_FIELDS (the caller checks the level first).
    `path_is_route`: the path is a route's own, fixed in the code, so it holds no secret."""
    path = fields["path"]
    if not path_is_route:
        fields["path"] = path = scrub(path)
    handler = _handler
    if (
        handler.__class__ is _Stderr
        and not ACCESS.handlers
        and logging.root.handlers == [handler]
        and level >= handler.level
    ):
        handler.access(level, fields)
        return
    ACCESS.log(
        level,
        "%s %s %s",
        fields["method"],
        path,
        fields["status"],
        extra={"access": fields},
    )


# -- formats ---------------------------------------------------------------------------------


class RequestIdFilter(logging.Filter):
    """Stamps the id of the request being served (or None) onto each record."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "request_id", None) is None:
            record.request_id = _REQUEST_ID.get()
        return True


_IN_MESSAGE = frozenset({"method", "path", "status"})  # an access record's message says these


# Every character a terminal or a log shipper may take for a line's end or a control sequence:
# C0 and C1 controls, DEL and the Unicode line and paragraph separators.
_ESCAPES = {
    **{c: f"\\x{c:02x}" for c in (*range(0x20), *range(0x7F, 0xA0))},
    **{c: f"\\u{c:04x}" for c in (0x2028, 0x2029)},
    ord("\n"): "\\n",
    ord("\r"): "\\r",
    ord("\t"): "\\t",
}


def escape(text: str) -> str:
    """`text` with its control characters written as escapes. `isprintable` is one pass in C
    over text that almost never holds one; only text that fails it is translated."""
    return text if text.isprintable() else text.translate(_ESCAPES)


class _ScrubbedTraceback(logging.Formatter):
    def formatMessage(self, record: logging.LogRecord) -> str:
        # The record's own line: whatever a message quotes stays on it.
        return escape(super().formatMessage(record))

    def formatException(self, ei: Any) -> str:
        return scrub(super().formatException(ei))


class TextFormatter(logging.Formatter):
    """`time LEVEL logger: message`, with `[request id]` after the logger while serving one,
    and an access record's fields after its message as `name=value`; a traceback follows on
    its own lines."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)
        self.plain = _ScrubbedTraceback(TEXT_FORMAT)
        self.with_id = _ScrubbedTraceback(TEXT_FORMAT_WITH_ID)

    def format(self, record: logging.LogRecord) -> str:
        chosen = self.with_id if getattr(record, "request_id", None) else self.plain
        line = chosen.format(record)
        access = getattr(record, "access", None)
        if not access:
            return line
        head, newline, rest = line.partition("\n")
        return f"{head} {escape(_text_fields(access))}{newline}{rest}"

    def access_line(self, level: int, fields: dict[str, Any], request: str | None) -> str:
        """The line `format` makes of an access record, made without one."""
        now = time.time()
        stamp = _local_second(int(now))
        name = logging.getLevelName(level)
        where = f" [{request}]" if request else ""
        message = f"{fields['method']} {fields['path']} {fields['status']}"
        line = (
            f"{stamp},{int((now % 1) * 1000):03d} {name} {ACCESS.name}{where}: {message}"
            f" {_text_fields(fields)}"
        )
        return escape(line) + "\n"


def _text_fields(access: dict[str, Any]) -> str:
    # Escaped with the line they go on (`format` escapes its head, `access_line` its line).
    # A value that is empty or holds a space is quoted.
    parts = []
    for name, value in access.items():
        if value is None or value is False or name in _IN_MESSAGE:
            continue
        text = str(value)
        parts.append(f'{name}="{text}"' if not text or " " in text else f"{name}={text}")
    return " ".join(parts)


_second: tuple[int, str] = (0, "")


def _local_second(second: int) -> str:
    """`logging`'s default asctime to the second (local time), made once a second."""
    global _second
    if _second[0] != second:
        _second = (second, time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(second)))
    return _second[1]


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time (ISO 8601, UTC), level, logger, message, request_id
    when serving one, an access record's fields, and `exception`: the whole traceback."""

    def format(self, record: logging.LogRecord) -> str:
        seconds = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        out: dict[str, Any] = {
            "time": f"{seconds}.{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        request_id = getattr(record, "request_id", None)
        if request_id:
            out["request_id"] = request_id
        access = getattr(record, "access", None)
        if access:
            out.update(access)
        if record.exc_info and record.exc_info[1] is not None and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            out["exception"] = scrub(record.exc_text)
        if record.stack_info:
            out["stack"] = scrub(self.formatStack(record.stack_info))
        return _json_line(out)

    def access_line(self, level: int, fields: dict[str, Any], request: str | None) -> str:
        """The line `format` makes of an access record, made without one."""
        now = time.time()
        seconds = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now))
        out: dict[str, Any] = {
            "time": f"{seconds}.{int((now % 1) * 1000):03d}Z",
            "level": logging.getLevelName(level),
            "logger": ACCESS.name,
            "message": f"{fields['method']} {fields['path']} {fields['status']}",
        }
        if request:
            out["request_id"] = request
        out.update(fields)
        return _json_line(out) + "\n"


def _json_line(out: dict[str, Any]) -> str:
    try:
        line = orjson.dumps(out, default=str).decode()
    except (orjson.JSONEncodeError, TypeError):  # text with lone surrogates (bad UTF-8)
        import json

        return json.dumps(out, default=str)  # ASCII: every separator escaped
    # JSON allows NEL and the Unicode line separators raw, and many readers end a line at
    # them. `isascii` is a flag lookup: the common line is not searched at all.
    if not line.isascii() and any(c in line for c in _JSON_BREAKS):
        for c, escaped in _JSON_BREAKS.items():
            line = line.replace(c, escaped)
    return line


_JSON_BREAKS = {"\x85": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"}


def formatter(config: LoggingConfig | None) -> TextFormatter | JsonFormatter:
    return JsonFormatter() if config is not None and config.format == "json" else TextFormatter()


# -- set up ----------------------------------------------------------------------------------


class _Held(logging.Handler):
    """Records kept until the config says how to write them (`configure`); written as text at
    exit if it never does (the process failed before)."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def close(self) -> None:
        records, self.records = self.records, []
        if records:
            fallback = _stderr_handler(None)
            for record in records:
                fallback.handle(record)
        super().close()


_handler: logging.Handler | None = None  # the root handler this module installed

# How long an access line may wait to be written with others.
ACCESS_FLUSH_S = 0.1
_ACCESS_BATCH = 64


class _Stderr(logging.StreamHandler):  # type: ignore[type-arg]
    """Records to stderr as they come; access lines (`access`) in batches, written before the
    next record, within ACCESS_FLUSH_S, at _ACCESS_BATCH lines, and at exit (`flush`)."""

    def __init__(self, config: LoggingConfig | None) -> None:
        super().__init__(sys.stderr)
        chosen = formatter(config)
        self.setFormatter(chosen)
        self.addFilter(RequestIdFilter())
        self._access_line = chosen.access_line
        self._lines: list[str] = []
        self._lines_lock = threading.Lock()  # records may come from the store's thread
        self._timer: asyncio.TimerHandle | None = None

    def access(self, level: int, fields: dict[str, Any]) -> None:
        line = self._access_line(level, fields, _REQUEST_ID.get())
        with self._lines_lock:
            self._lines.append(line)
            waiting = len(self._lines)
        if waiting >= _ACCESS_BATCH:
            self.write_access()
        elif self._timer is None:
            try:
                self._timer = asyncio.get_running_loop().call_later(
                    ACCESS_FLUSH_S, self.write_access
                )
            except RuntimeError:  # no loop: nothing would come back to write it
                self.write_access()

    def write_access(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        with self._lines_lock:
            lines, self._lines = self._lines, []
        if lines:
            self.acquire()
            try:
                self.stream.write("".join(lines))
                self.stream.flush()
            except Exception:  # stderr gone: as logging does, never fail the caller
                pass
            finally:
                self.release()

    def emit(self, record: logging.LogRecord) -> None:
        if self._lines:
            self.write_access()
        super().emit(record)

    def flush(self) -> None:
        if self._lines:
            self.write_access()
        super().flush()


def _stderr_handler(config: LoggingConfig | None) -> logging.Handler:
    return _Stderr(config)


def hold() -> None:
    """Before the config is read: keep records (INFO and up) until `configure`. Nothing when
    logging is set up already (by whoever runs this process: a test, an embedding program)."""
    global _handler
    root = logging.getLogger()
    if root.handlers:
        return
    _handler = _Held()
    root.addHandler(_handler)
    root.setLevel(logging.INFO)


def configure(config: LoggingConfig | None) -> None:
    """Write records to stderr in the config's format from its level (None: text, INFO); the
    records `hold` kept are written first. Nothing when logging was set up by someone else."""
    global _handler
    root = logging.getLogger()
    if _handler is None:
        if root.handlers:
            return
    else:
        root.removeHandler(_handler)
    held = _handler.records if isinstance(_handler, _Held) else []
    level = logging.getLevelName(config.level) if config is not None else logging.INFO
    handler = _stderr_handler(config)
    handler.setLevel(level)  # a logger set lower than the root still writes nothing below it
    root.addHandler(handler)
    root.setLevel(level)
    previous, _handler = _handler, handler
    for record in held:
        if record.levelno >= level:
            handler.handle(record)
    if previous is not None:
        if isinstance(previous, _Held):
            previous.records = []
        previous.close()
