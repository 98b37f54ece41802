"""gateway serve | check-config"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from pathlib import Path

from aiohttp import web

from gateway.config import ConfigError, LoadedConfig, load_config

log = logging.getLogger("gateway")


def _load(path: str | None) -> LoadedConfig:
    loaded = load_config(Path(path) if path else None)
    for warning in loaded.warnings:
        log.warning("%s", warning)
    return loaded


async def _serve(loaded: LoadedConfig, host: str, port: int) -> None:
    from gateway.app import create_app
    from gateway.context import GATEWAY

    config = loaded.config
    app = create_app(config)
    # handler_cancellation: a client that leaves cancels its handler at once, wherever it waits,
    # so the upstream is closed and the delivered prefix recorded within milliseconds.
    runner = web.AppRunner(
        app,
        handler_cancellation=True,
        access_log=None,
        shutdown_timeout=config.server.shutdown_grace_s,
    )
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = runner.addresses[0] if runner.addresses else (host, port)
    log.info(
        "gateway listening on http://%s:%s (config %s, store %s)",
        bound[0],
        bound[1],
        loaded.path,
        config.store.url,
    )
    log.info("model aliases: %s", ", ".join(m.name for m in config.models) or "(none)")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("shutting down")
    app[GATEWAY].state["shutting_down"] = True
    await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="gateway", description="An OpenAI-compatible LLM gateway."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="Start the gateway.")
    serve.add_argument(
        "--config", help="Config file (default: $GATEWAY_CONFIG or config/gateway.yaml)."
    )
    serve.add_argument("--host", help="Override server.host.")
    serve.add_argument("--port", type=int, help="Override server.port.")
    check = sub.add_parser("check-config", help="Validate a config file without serving.")
    check.add_argument(
        "--config", help="Config file (default: $GATEWAY_CONFIG or config/gateway.yaml)."
    )
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        loaded = _load(args.config)
    except ConfigError as exc:
        print(f"config error:\n{exc}", file=sys.stderr)
        return 2
    if args.command == "check-config":
        names = ", ".join(m.name for m in loaded.config.models) or "(none)"
        print(f"{loaded.path}: OK ({len(loaded.config.models)} model aliases: {names})")
        return 0
    host = args.host or loaded.config.server.host
    port = args.port if args.port is not None else loaded.config.server.port
    try:
        import uvloop

        uvloop.run(_serve(loaded, host, port))
    except ImportError:  # pragma: no cover - platforms without uvloop
        asyncio.run(_serve(loaded, host, port))
    except OSError as exc:
        print(f"cannot start: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
