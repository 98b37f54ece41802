"""`gateway serve --workers N`: N processes on one port, so one host uses all its cores.

Each worker is a plain `gateway serve` with `GATEWAY_WORKER=i`, which binds with SO_REUSEPORT;
the kernel spreads new connections across them. The supervisor forwards SIGHUP (each worker
reloads its config, gateway.reload) and SIGTERM/SIGINT (each worker drains its own streams and
is out within `server.shutdown_grace_s` and a second; one still running past that is killed,
so the supervisor keeps the same bound) and restarts a worker that dies on its own; that
worker's restart keeps its instance id, so it closes the turns its previous life left open (as
it does a killed one's).

Without `limits.redis_url` the supervisor also runs the one limiter every worker admits through
(gateway.metering.shared_limits), on a Unix socket in a private temporary directory named to
the workers by `GATEWAY_LIMITS_SOCKET`: rate limits, concurrency and budgets hold for the host
as they would for one process, never N times over.
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

log = logging.getLogger("gateway.workers")

_RESTART_BACKOFF_S = (0.5, 1, 2, 5)
_POLL_S = 0.1  # how often the workers are looked at
_STOPPING_POLL_S = 0.01  # ... once they are stopping: the supervisor exits right after them
# A stopping worker is out within its grace and a second; one still running after its grace
# and this long is killed, so that the supervisor is out within that second too.
_OVERRUN_S = 0.9


def supervise(
    count: int, host: str, port: int, config: str | None, *, share_limits: bool = True
) -> int:
    if port == 0:
        log.critical("cannot start: --workers needs a fixed port (server.port or --port)")
        return 2
    from gateway.config import load_config

    grace_s = load_config(Path(config) if config else None).config.server.shutdown_grace_s
    stopping = False
    kill_at = 0.0  # once stopping: when a worker still running is killed
    extra_env = {}
    if share_limits:
        from gateway.metering.shared_limits import SOCKET_ENV, serve_in_thread

        private = tempfile.mkdtemp(prefix="gateway-limits-")  # mode 0700: this user's only
        socket_path = os.path.join(private, "limits.sock")
        serve_in_thread(socket_path)
        atexit.register(shutil.rmtree, private, True)
        extra_env[SOCKET_ENV] = socket_path
        log.info("rate limits and budgets are shared by the workers through %s", socket_path)

    def spawn(index: int) -> subprocess.Popen[bytes]:
        command = [sys.executable, "-m", "gateway", "serve", "--host", host, "--port", str(port)]
        if config:
            command += ["--config", config]
        env = {**os.environ, **extra_env, "GATEWAY_WORKER": str(index)}
        return subprocess.Popen(command, env=env)

    def stop(signum: int, _frame: object) -> None:
        nonlocal stopping, kill_at
        if not stopping:
            kill_at = time.monotonic() + grace_s + _OVERRUN_S
        stopping = True
        for worker in workers.values():
            if worker.poll() is None:
                worker.send_signal(signum)

    def reload(signum: int, _frame: object) -> None:
        # Each worker reads the file itself; one restarted later reads it as it is then.
        for worker in workers.values():
            if worker.poll() is None:
                worker.send_signal(signum)

    workers = {i: spawn(i) for i in range(count)}
    restarts = dict.fromkeys(workers, 0)
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGHUP, reload)
    log.info(
        "supervising %d workers on port %d (pids %s)",
        count,
        port,
        ", ".join(str(w.pid) for w in workers.values()),
    )
    worst = 0
    while workers:
        for index, worker in list(workers.items()):
            code = worker.poll()
            if code is None:
                if stopping and time.monotonic() >= kill_at:
                    log.error("worker %d still running past its shutdown grace: killed", index)
                    worker.kill()
                continue
            if stopping:
                del workers[index]
                worst = max(worst, abs(code))
                continue
            delay = _RESTART_BACKOFF_S[min(restarts[index], len(_RESTART_BACKOFF_S) - 1)]
            log.error("worker %d exited with %s; restarting in %.1fs", index, code, delay)
            restarts[index] += 1
            time.sleep(delay)
            if stopping:  # the signal came during the wait: no new worker
                del workers[index]
                continue
            workers[index] = spawn(index)
        time.sleep(_STOPPING_POLL_S if stopping else _POLL_S)
    return worst
