"""gateway serve | check-config | migrate | prices | teams | keys | usage | spool | --version"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

# aiohttp, asyncio, pydantic and the rest load inside main(), once the collector is off (below).
if TYPE_CHECKING:
    from collections.abc import Callable

    from gateway.config import LoadedConfig

log = logging.getLogger("gateway")
_YOUNG_COLLECTION_AT = 10_000  # objects; see settle_collector()
# After the shutdown grace: how long streams have to end with their shutdown event before
# those still writing are cancelled, and what aiohttp gives any other request still running.
_SHUTDOWN_CUT_S = 0.3
_LAST_CUT_S = 0.05
_SHUTDOWN_POLL_S = 0.02

# New connections the kernel holds for the gateway to accept (capped by net.core.somaxconn):
# past aiohttp's default of 128, a burst of new clients has the rest dropped, each client then
# trying again a second later, then two, then four.
_BACKLOG = 1024


def settle_collector() -> None:
    """The cyclic garbage collector, once the process has started and before it serves."""
    # Everything made so far lives as long as the process: out of every later collection's way.
    gc.freeze()
    # A request makes no reference cycles (tests/pipeline/test_relay_cycles.py holds the relay
    # to that), so young collections find nothing; at the default threshold (700 objects) the
    # requests in flight alone cross it every few requests, and each time the collector walks
    # live objects for nothing. Ten thousand is above what dozens of requests in flight hold,
    # and still bounds any cyclic garbage.
    gc.set_threshold(_YOUNG_COLLECTION_AT, *gc.get_threshold()[1:])
    gc.enable()


class CannotStart(Exception):
    """`serve` failed before it listened: said in one line of the log, without a traceback."""


def _one_line(exc: BaseException) -> str:
    """What went wrong, as one line: a library's multi-line message joined, its type named
    when its message alone would not say (a bare `KeyError('x')`)."""
    text = " ".join(str(exc).split())
    if isinstance(exc, OSError | CannotStart) or type(exc).__module__.startswith("gateway."):
        return text or type(exc).__name__
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _asks_for_json_logs(path: str | None) -> bool:
    """Whether a config that failed validation still says `logging.format: json` (read as
    plain YAML; any doubt is no)."""
    import yaml

    from gateway.config import DEFAULT_CONFIG_PATH

    try:
        file = Path(path or os.environ.get("GATEWAY_CONFIG") or DEFAULT_CONFIG_PATH)
        raw = yaml.safe_load(file.read_text(encoding="utf-8"))
        return bool(raw["logging"]["format"] == "json")
    except Exception:
        return False


def _load(path: str | None) -> LoadedConfig:
    from gateway.config import load_config

    loaded = load_config(Path(path) if path else None)
    for warning in loaded.warnings:
        log.warning("%s", warning)
    return loaded


async def _serve(loaded: LoadedConfig, host: str, port: int, reuse_port: bool = False) -> None:
    import asyncio

    from aiohttp import web

    from gateway.app import create_app
    from gateway.context import GATEWAY
    from gateway.downstream.aiohttp_internals import awaiting_request
    from gateway.downstream.slow_clients import guarded_runner
    from gateway.metering import tokens
    from gateway.reload import Reloader
    from gateway.storage.backends import instance_id

    config = loaded.config
    try:
        app = create_app(config, instance=instance_id(port))
    except Exception as exc:
        log.debug("create_app failed", exc_info=True)
        raise CannotStart(_one_line(exc)) from exc
    shared = os.environ.get("GATEWAY_LIMITS_SOCKET")
    if shared and config.limits.redis_url is None:
        from gateway.metering.shared_limits import SharedLimiter

        # A worker of `serve --workers N`: its limits are the supervisor's, shared by all.
        gateway = app[GATEWAY]
        gateway.limiter = SharedLimiter(shared, gateway.usage.spent, gateway.limiter.watch)
    # handler_cancellation: a client that leaves cancels its handler at once, wherever it waits,
    # so the upstream is closed and the delivered prefix recorded within milliseconds.
    # guarded_runner: a request head must arrive within server.header_timeout_s (slowloris).
    # shutdown_timeout: by the time the runner is cleaned up, requests have had their grace
    # (below); aiohttp gives what still runs this long, twice, then cancels it.
    runner = guarded_runner(
        app,
        config.server,
        handler_cancellation=True,
        access_log=None,
        shutdown_timeout=_LAST_CUT_S,
    )
    # Before anything is served: a SIGTERM from then on always drains gracefully, and a
    # SIGHUP reloads the config (once serving; one sent before is served by the file as read).
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    signalled: list[float] = []  # when: the grace runs from the signal, not from the wake-up

    def stopping() -> None:
        signalled.append(loop.time())
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stopping)
    reloader = Reloader(app, loaded.path)
    loop.add_signal_handler(signal.SIGHUP, reloader.request)
    try:
        await runner.setup()  # the store, its schema and the upstream pool start here
        site = web.TCPSite(runner, host, port, reuse_port=reuse_port or None, backlog=_BACKLOG)
        await site.start()
    except Exception as exc:
        log.debug("start failed", exc_info=True)  # the whole story, for a bug report
        try:
            await runner.cleanup()
        except Exception:
            log.debug("cleanup after a failed start failed", exc_info=True)
        raise CannotStart(_one_line(exc)) from exc
    settle_collector()
    bound = runner.addresses[0] if runner.addresses else (host, port)
    log.info(
        "gateway listening on http://%s:%s (config %s, store %s)",
        bound[0],
        bound[1],
        loaded.path,
        app[GATEWAY].store.backend.where,  # a PostgreSQL URL without its password
    )
    log.info("model aliases: %s", ", ".join(m.name for m in config.models) or "(none)")
    if config.auth.master_key is None:
        log.warning(
            "RUNNING OPEN: no auth.master_key is configured, so no API key is checked and every"
            " caller is admin. Fine on a laptop; set GATEWAY_MASTER_KEY anywhere else."
            " Requests addressed to any name but localhost (and server.allowed_hosts) are"
            " refused."
        )
        if config.server.cors_origins:
            log.warning(
                "server.cors_origins lets the pages of %s call this open gateway, as admin:"
                " set a master key before exposing it to browsers",
                "any site" if config.server.cors_origins == "*" else "the listed origins",
            )
    reloading = asyncio.create_task(reloader.run(), name="config-reload")
    await stop.wait()
    reloading.cancel()  # a SIGHUP from now on changes nothing: the config served is kept
    # Out within server.shutdown_grace_s and a second: requests run until the deadline, the
    # streams still open then end with their dialect's shutdown event, every turn is
    # recorded and the store flushed.
    deadline = signalled[0] + config.server.shutdown_grace_s
    log.info("shutting down")
    gateway = app[GATEWAY]
    if not gateway.running:
        tokens.skip_warm()
    # Else the tokenizer loads during the grace, if it has not yet: recording the streams cut
    # at the deadline estimates their tokens, and would load it then, past the deadline.
    gateway.state["shutting_down"] = True

    async def settled(done: Callable[[], bool], until: float) -> None:
        # Looked at, not awaited: aiohttp signals no connection's end.
        while not done() and (left := until - loop.time()) > 0:  # noqa: ASYNC110
            await asyncio.sleep(min(left, _SHUTDOWN_POLL_S))

    # No new connection; a busy one is closed once the request it carries is answered. An
    # idle one stays open until the process ends: a request its client sends meanwhile gets
    # a 503 saying `Connection: close` (gateway.http.middleware), where closing it now would
    # race that request and reset it.
    for listening in list(runner.sites):
        await listening.stop()
    server = runner.server
    assert server is not None, "set up above"
    busy = [c for c in server.connections if not awaiting_request(c)]
    for connection in busy:
        connection.close()

    def idle() -> bool:
        # A connection made a moment before, its first wait not begun, counted as busy: it
        # begins that wait now and counts as done.
        still = set(server.connections)
        requests = any(c in still and not awaiting_request(c) for c in busy)
        return not requests and not gateway.background

    await settled(idle, deadline)
    for turn in list(gateway.running):
        turn.shut_down()
    for task in gateway.background:  # an upstream drained for its usage: recorded as is
        task.cancel()
    await settled(lambda: not gateway.running, deadline + _SHUTDOWN_CUT_S)
    for turn in list(gateway.running):  # a write waiting on a client that stopped reading
        turn.shut_down(now=True)
    await settled(lambda: not gateway.running, deadline + _SHUTDOWN_CUT_S + _LAST_CUT_S)
    await runner.cleanup()  # idle connections closed; then the store flushed and closed


async def _connect(loaded: LoadedConfig) -> int:
    from gateway.connect_check import check

    reached = await check(loaded.config)
    for one in reached:
        if one.error is None:
            print(f"reached {one.what}: {one.where}")
        else:
            print(f"cannot reach {one.what} ({one.where}): {one.error}", file=sys.stderr)
    return 1 if any(one.error is not None for one in reached) else 0


def _print_table(table: list[tuple[str, ...]], numbers: range) -> None:
    """Columns padded to their widest cell; those in `numbers` right-aligned."""
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    for row in table:
        cells = [
            cell.rjust(w) if i in numbers else cell.ljust(w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        ]
        print("  ".join(cells).rstrip())


def _unpriced(loaded: LoadedConfig) -> list[str]:
    """A line for each deployment without a price, as check-config prints them."""
    from gateway.routing.router import price_list

    return [
        f"unpriced: deployment {d.name} (alias {d.alias}, model {d.model}): {d.priced.why}."
        " A hard budget refuses its requests (price_unknown) and its usage has no cost: price"
        " it in the price file (`prices:`), with `price` on the deployment, or `price: free`"
        for d in price_list(loaded.config)
        if d.priced.price is None
    ]


def _prices(loaded: LoadedConfig) -> int:
    from gateway.metering.prices import map_version
    from gateway.routing.router import price_list

    def mtok(value: float | None, otherwise: str) -> str:
        return otherwise if value is None else f"{value * 1e6:.6g}"

    config = loaded.config
    print(
        f"USD per million tokens; from the config, the price file ({config.prices or 'none'}),"
        f" then the bundled map ({map_version()})"
    )
    header = ("alias", "deployment", "model", "input", "output", "cache read", "cache write 5m",
              "cache write 1h", "max output", "source")  # fmt: skip
    table: list[tuple[str, ...]] = [header]
    for d in price_list(config):
        price = d.priced.price
        if price is None:
            table.append((d.alias, d.name, d.model, *["-"] * 6, f"unpriced: {d.priced.why}"))
            continue
        write = mtok(price.cache_write, "=input")
        table.append(
            (
                d.alias,
                d.name,
                d.model,
                mtok(price.input, "-"),
                mtok(price.output, "-"),
                mtok(price.cache_read, "=input"),
                write,
                mtok(price.cache_write_1h, "=5m" if price.cache_write is not None else "=input"),
                str(price.max_output_tokens or "-"),
                d.priced.why,
            )
        )
    _print_table(table, range(3, 9))
    return 0


def _cli_store(loaded: LoadedConfig) -> Any:
    from gateway.storage.backends import make_store

    return make_store(loaded.config.store, f"cli-{os.getpid()}")


async def _applied(db: Any) -> list[tuple[int, str, float]]:
    """The migrations a store has applied (none before its first): nothing is changed."""
    if db.dialect == "postgresql":
        exists = await db.fetchval("SELECT to_regclass('schema_migrations') IS NOT NULL")
    else:
        exists = await db.fetchval(
            "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?",
            "schema_migrations",
        )
    if not exists:
        return []
    rows = await db.fetch("SELECT version, name, applied_at FROM schema_migrations ORDER BY 1")
    return [(int(v), str(n), float(a)) for v, n, a in rows]


async def _migrate(loaded: LoadedConfig, *, status: bool = False, dry_run: bool = False) -> int:
    """Apply the pending migrations; or (`status`) list applied and pending ones; or
    (`dry_run`) list what would be applied, changing nothing."""
    from datetime import UTC, datetime

    from gateway.storage import schema
    from gateway.storage.backends import make_backend
    from gateway.storage.db import StoreUnavailable

    backend = make_backend(loaded.config.store)
    try:
        await backend.start()
        if status or dry_run:
            applied_rows = await backend.run(_applied)
        else:
            applied = await backend.transact(schema.migrate)
            version = await backend.run(schema.current_version)
    except StoreUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except schema.SchemaAhead as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        await backend.close()
    if status or dry_run:
        version = max((v for v, _, _ in applied_rows), default=0)
        known = schema.MIGRATIONS[backend.dialect]
        pending = [m for m in known if m.version > version]
        print(f"{backend.where}: schema version {version}, this gateway knows {known[-1].version}")
        if status:
            for v, name, at in applied_rows:
                when = datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
                print(f"applied  {v:>3}  {name}  ({when})")
        verb = "would apply" if dry_run else "pending"
        for migration in pending:
            print(f"{verb:<8} {migration.version:>3}  {migration.name}")
        if not pending:
            print("nothing to apply")
        if version > known[-1].version:
            print(
                f"error: the store is at version {version}, newer than this gateway: run a"
                " release at least as new as the one that migrated it",
                file=sys.stderr,
            )
            return 1
        return 0
    done = ", ".join(map(str, applied)) if applied else "nothing to apply"
    print(f"{backend.where}: schema version {version} ({done})")
    return 0


def _spool_status(loaded: LoadedConfig) -> int:
    """What waits in the spool directory for the store: each instance's spooled writes not yet
    replayed, and journals left for an instance's next start. Reads only."""
    directory = Path(loaded.config.store.spool_path)
    logs = sorted(directory.glob("*.log")) if directory.is_dir() else []
    journals = sorted(directory.glob("*.journal.*")) if directory.is_dir() else []
    total = 0
    for log_path in logs:
        pos_path = log_path.with_suffix(".pos")
        try:
            pos = int(pos_path.read_text() or 0) if pos_path.exists() else 0
            with open(log_path, "rb") as file:
                file.seek(pos)
                pending = file.read()
        except (OSError, ValueError) as exc:
            print(f"{log_path}: cannot be read: {exc}", file=sys.stderr)
            return 1
        writes = pending.count(b"\n")
        total += writes
        print(f"spool    {log_path.stem}: {writes} writes, {len(pending)} bytes")
    for journal in journals:
        print(f"journal  {journal.name}: {journal.stat().st_size} bytes (its instance's)")
    print(f"{directory}: {total} spooled writes wait for the store")
    return 0


def _admin_commands(sub: Any) -> None:
    config_help = "Config file (default: $GATEWAY_CONFIG or config/gateway.yaml)."
    teams = sub.add_parser("teams", help="Create and list teams (in the store of the config).")
    teams_sub = teams.add_subparsers(dest="action", required=True)
    create_team = teams_sub.add_parser("create", help="Create a team.")
    create_team.add_argument("name")
    create_team.add_argument("--id", help="The team id (default: generated).")
    list_teams = teams_sub.add_parser("list", help="List teams.")
    update_team = teams_sub.add_parser("update", help="Rename a team or change its limits.")
    update_team.add_argument("team_id")
    update_team.add_argument("--name", help="Its new name.")
    update_team.add_argument(
        "--limits", help='Its limits as JSON (`{"rpm": 60}`); `null` removes them.'
    )
    delete_team = teams_sub.add_parser(
        "delete", help="Delete a team (its conversations and usage stay)."
    )
    delete_team.add_argument("team_id")
    delete_team.add_argument(
        "--revoke-keys", action="store_true", help="Revoke its usable keys first (else refused)."
    )
    keys = sub.add_parser("keys", help="Create, list and revoke virtual keys.")
    keys_sub = keys.add_subparsers(dest="action", required=True)
    create_key = keys_sub.add_parser("create", help="Create a key; its secret is printed once.")
    create_key.add_argument("--team", required=True, help="The team id.")
    create_key.add_argument("--name")
    create_key.add_argument("--user")
    create_key.add_argument("--models", help="Comma-separated allowed aliases (default: all).")
    create_key.add_argument("--expires-in", type=float, help="Seconds until it expires.")
    list_keys = keys_sub.add_parser("list", help="List keys (secrets are never shown).")
    list_keys.add_argument("--team")
    revoke = keys_sub.add_parser("revoke", help="Revoke a key by id.")
    revoke.add_argument("key_id")
    rotate = keys_sub.add_parser(
        "rotate", help="A new key like this one; the old one keeps working for the overlap."
    )
    rotate.add_argument("key_id")
    rotate.add_argument(
        "--overlap-s",
        type=float,
        default=3600.0,
        help="Seconds the old key keeps working (default 3600; 0: expires now).",
    )
    spool = sub.add_parser("spool", help="What waits in the spool for the store.")
    spool_sub = spool.add_subparsers(dest="action", required=True)
    spool_status = spool_sub.add_parser("status", help="Spooled writes not yet replayed.")
    usage = sub.add_parser("usage", help="Usage and cost from the store, as a table.")
    usage.add_argument(
        "--group-by",
        default="team",
        help="team, key, user, model, deployment, or tag:KEY (a metadata tag's values).",
    )
    usage.add_argument("--granularity", default="day", help="hour or day.")
    usage.add_argument(
        "--from", dest="start", help="Unix seconds or ISO date (default: 31 days ago)."
    )
    usage.add_argument("--to", dest="end", help="Unix seconds or ISO date (default: now).")
    usage.add_argument("--team", help="Only this team.")
    commands = (create_team, list_teams, update_team, delete_team, create_key, list_keys, revoke)
    for command in (*commands, rotate, usage, spool_status):
        command.add_argument("--config", help=config_help)


async def _admin(args: argparse.Namespace, loaded: LoadedConfig) -> int:
    import json

    from pydantic import ValidationError

    from gateway.errors import GatewayError
    from gateway.metering.admin import Admin, NewKey, NewTeam, TeamChanges
    from gateway.metering.auth import Authenticator
    from gateway.metering.key_store import KeyStore
    from gateway.routing.router import serves

    config = loaded.config
    store = _cli_store(loaded)
    await store.start()
    keys = KeyStore(store)
    aliases = [m.name for m in config.models]
    admin = Admin(keys, Authenticator(None, keys, 0), lambda model: serves(aliases, model))
    try:
        if args.command == "teams" and args.action == "create":
            team = await admin.create_team(NewTeam(name=args.name, id=args.id))
            print(f"created team {team.id} ({team.name})")
        elif args.command == "teams" and args.action == "update":
            changes: dict[str, Any] = {}
            if args.name is not None:
                changes["name"] = args.name
            if args.limits is not None:
                changes["limits"] = json.loads(args.limits)
            team = await admin.update_team(args.team_id, TeamChanges.model_validate(changes))
            print(f"updated team {team.id} ({team.name}): limits {json.dumps(team.limits)}")
        elif args.command == "teams" and args.action == "delete":
            revoked = await admin.delete_team(args.team_id, revoke_keys=args.revoke_keys)
            print(f"deleted team {args.team_id} ({len(revoked)} keys revoked)")
        elif args.command == "teams":
            for team in await keys.teams():
                print(f"{team.id}\t{team.name}")
        elif args.action == "create":
            models = args.models.split(",") if args.models else None
            request = NewKey(
                team_id=args.team,
                name=args.name,
                user=args.user,
                models=models,
                expires_in_s=args.expires_in,
            )
            record, secret = await admin.create_key(request)
            print(f"created key {record.id} for team {record.team_id}")
            print(f"secret (shown once, store it now): {secret}")
        elif args.action == "list":
            for record in await keys.keys(args.team):
                state = record.unusable_because() or "active"
                name = record.name or ""
                print(f"{record.id}\t{record.prefix}...\t{record.team_id}\t{state}\t{name}")
        elif args.action == "rotate":
            rotated = await admin.rotate_key(args.key_id, args.overlap_s)
            until = rotated.old.expires_at
            print(f"created key {rotated.key.id} for team {rotated.key.team_id}")
            print(f"secret (shown once, store it now): {rotated.secret}")
            print(f"the old key {rotated.old.id} works until {until:.0f} (Unix time)")
        else:
            record = await admin.revoke_key(args.key_id)
            print(f"revoked key {record.id}")
    except GatewayError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 2
    except (ValueError, ValidationError) as exc:  # --limits that is not JSON, or not limits
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finally:
        await store.close()
    return 0


async def _usage(args: argparse.Namespace, loaded: LoadedConfig) -> int:
    import time

    from gateway.metering.reports import (
        GRANULARITY,
        GROUPS,
        TAG_KEY,
        TAG_PREFIX,
        UsageStore,
        parse_time,
    )

    group, tag = args.group_by, args.group_by.removeprefix(TAG_PREFIX)
    grouped = group in GROUPS or (tag != group and TAG_KEY.match(tag) is not None)
    if not grouped or args.granularity not in GRANULARITY:
        print(
            f"error: --group-by takes {', '.join(GROUPS)} or tag:KEY (a metadata key: letters,"
            " digits, '_', '.', ':', '-', at most 64); --granularity hour or day",
            file=sys.stderr,
        )
        return 2
    end = parse_time(args.end, time.time())
    start = parse_time(args.start, end - 31 * 86400)
    store = _cli_store(loaded)
    await store.start()
    try:
        rows = await UsageStore(store).report(
            group_by=args.group_by,
            start=start,
            end=end,
            granularity=args.granularity,
            team_id=args.team,
        )
    finally:
        await store.close()
    header = ("period", args.group_by, "requests", "attempts", "failed", "interrupted", "errors",
              "prompt", "completion", "delivered", "unpriced", "cost USD")  # fmt: skip
    counts = ("requests", "attempts", "failed_attempts", "interrupted", "errors",
              "prompt_tokens", "completion_tokens", "completion_delivered",
              "unpriced_requests")  # fmt: skip
    table = [header] + [
        (
            r["period_start"][: 13 if args.granularity == "hour" else 10],
            "-" if r["group"] is None else str(r["group"]),  # no such tag, or no user
            *(str(r[k]) for k in counts),
            "-" if r["cost_usd"] is None else f"{r['cost_usd']:.6f}",
        )
        for r in rows
    ]
    _print_table(table, range(2, len(header)))
    if not rows:
        print("(no usage in that period)")
    return 0


def main(argv: list[str] | None = None) -> int:
    # Starting up allocates tens of thousands of objects that live as long as the process
    # (modules, classes, pydantic schemas, aiohttp's tables) and almost no garbage; the cyclic
    # collector would walk them again and again while they load, a good part of the time to
    # the first answer. Off until `serve` listens (it then freezes them) or the command ends.
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _main(argv)
    finally:
        if collecting:
            gc.enable()


def _main(argv: list[str] | None) -> int:
    import asyncio

    from gateway.config import ConfigError

    parser = argparse.ArgumentParser(
        prog="gateway", description="An OpenAI-compatible LLM gateway."
    )
    from gateway import __version__

    parser.add_argument("--version", action="version", version=f"gateway {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="Start the gateway.")
    serve.add_argument(
        "--config", help="Config file (default: $GATEWAY_CONFIG or config/gateway.yaml)."
    )
    serve.add_argument("--host", help="Override server.host.")
    serve.add_argument("--port", type=int, help="Override server.port.")
    serve.add_argument(
        "--workers",
        type=int,
        default=1,
        help="Processes sharing the port (SO_REUSEPORT), to use every core (default 1).",
    )
    migrate = sub.add_parser("migrate", help="Apply pending store schema migrations.")
    migrate.add_argument(
        "--config", help="Config file (default: $GATEWAY_CONFIG or config/gateway.yaml)."
    )
    shown = migrate.add_mutually_exclusive_group()
    shown.add_argument(
        "--status", action="store_true", help="List applied and pending migrations; apply none."
    )
    shown.add_argument(
        "--dry-run", action="store_true", help="List what would be applied; apply nothing."
    )
    check = sub.add_parser("check-config", help="Validate a config file without serving.")
    check.add_argument(
        "--config", help="Config file (default: $GATEWAY_CONFIG or config/gateway.yaml)."
    )
    check.add_argument(
        "--connect",
        action="store_true",
        help="Also reach the store, Redis, each upstream's host and the trace collector"
        " (exit 1 if one cannot be reached).",
    )
    prices = sub.add_parser(
        "prices", help="Each alias and deployment with its price and where it came from."
    )
    prices.add_argument(
        "--config", help="Config file (default: $GATEWAY_CONFIG or config/gateway.yaml)."
    )
    convert = sub.add_parser(
        "import-litellm", help="Write a LiteLLM proxy config as this gateway's config."
    )
    convert.add_argument("file", help="The LiteLLM config.yaml.")
    convert.add_argument("-o", "--output", help="Write the config here (default: stdout).")
    _admin_commands(sub)
    args = parser.parse_args(argv)
    if args.command == "import-litellm":  # reads no config of this gateway's
        from gateway import litellm_import

        return litellm_import.main(args)
    if args.command == "serve":
        # Until serve listens, and in a supervisor: a SIGHUP (a reload) must not end it.
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
    from gateway import logs

    # Records wait until the config says how to write them (`logging`, docs/operations.md,
    # "Logs"): its own warnings come out in its format too. Other commands log as text.
    logs.hold()
    try:
        loaded = _load(args.config)
    except ConfigError as exc:
        if args.command == "serve" and _asks_for_json_logs(args.config):
            # A log collector reads this process's stderr: one JSON record, not lines of text.
            from gateway.config import LoggingConfig

            logs.configure(LoggingConfig(format="json"))
            log.critical("cannot start: config error: %s", "; ".join(str(exc).splitlines()))
            return 2
        logs.configure(None)
        print(f"config error:\n{exc}", file=sys.stderr)
        return 2
    logs.configure(loaded.config.logging if args.command == "serve" else None)
    if args.command in ("keys", "teams"):
        return asyncio.run(_admin(args, loaded))
    if args.command == "usage":
        return asyncio.run(_usage(args, loaded))
    if args.command == "spool":
        return _spool_status(loaded)
    if args.command == "migrate":
        return asyncio.run(_migrate(loaded, status=args.status, dry_run=args.dry_run))
    if args.command == "check-config":
        names = ", ".join(m.name for m in loaded.config.models) or "(none)"
        print(f"{loaded.path}: OK ({len(loaded.config.models)} model aliases: {names})")
        for line in _unpriced(loaded):
            print(line)
        return asyncio.run(_connect(loaded)) if args.connect else 0
    if args.command == "prices":
        return _prices(loaded)
    host = args.host or loaded.config.server.host
    port = args.port if args.port is not None else loaded.config.server.port
    if args.workers > 1:
        from gateway.workers import supervise

        gc.freeze()  # the supervisor runs for as long as its workers
        gc.enable()
        share_limits = loaded.config.limits.redis_url is None  # else Redis shares them
        return supervise(args.workers, host, port, args.config, share_limits=share_limits)
    reuse_port = os.environ.get("GATEWAY_WORKER") is not None
    try:
        import uvloop

        run: Callable[[Any], None] = uvloop.run
    except ImportError:  # pragma: no cover - platforms without uvloop
        run = asyncio.run
    try:
        run(_serve(loaded, host, port, reuse_port))
    except CannotStart as exc:
        # In the log's format: one JSON object when the config asks for JSON.
        log.critical("cannot start: %s", exc)
        return 1
    # Every turn is recorded and the store, the pool and the tracer are closed: the process
    # leaves without the interpreter tearing down each module and object of a large heap,
    # which on a busy machine takes a good part of the second `serve` has past its grace.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
